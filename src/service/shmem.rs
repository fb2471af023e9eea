//! The request channel's home in PostgreSQL main shared memory.
//!
//! As the registry's (`registry::shmem`, whose pattern this follows): `_PG_init` calls
//! [`install`], which asks for the channel's bytes (from `shmem_request_hook` on PostgreSQL 15
//! and later, directly on 14) and chains a `shmem_startup_hook` that formats the block the first
//! time (and again after every crash-restart), holding `AddinShmemInitLock`. Every process then
//! reaches it through [`channel`]. The block starts in the mode `gpu_execution` fixes
//! (`process`), or undecided until the service decides.

use std::ptr::null_mut;

use pgrx::pg_sys;

use super::channel::{Channel, Mode};
use crate::error::{Code, Result, UvmError};

const CHANNEL_NAME: &std::ffi::CStr = c"pg_uvm_share service channel";

/// The request channel's shape, fixed at postmaster start (`pg_uvm_share.service_slots`,
/// `service_staging`), and the mode shared memory starts in: `Process` when
/// `gpu_execution = process`, else `Undecided` until the service decides.
#[derive(Clone, Copy, Debug)]
pub struct ChannelSpec {
    pub slots: u32,
    pub staging_bytes: u32,
    pub mode: Mode,
}

static mut SPEC: ChannelSpec = ChannelSpec { slots: 0, staging_bytes: 0, mode: Mode::Undecided };
static mut BASE: *mut u8 = null_mut();
#[cfg(not(feature = "pg14"))]
static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

/// Installs the channel's shared memory hooks. Called once from `_PG_init` in the postmaster.
pub fn install(spec: ChannelSpec) {
    // SAFETY: _PG_init runs single-threaded in the postmaster, before any hook can fire.
    unsafe {
        SPEC = spec;
        #[cfg(not(feature = "pg14"))]
        {
            PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
            pg_sys::shmem_request_hook = Some(request_hook);
        }
        #[cfg(feature = "pg14")]
        request_shmem();
        PREV_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(startup_hook);
    }
}

#[cfg(not(feature = "pg14"))]
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_hook() {
    // SAFETY: called by the postmaster in its request phase, after install().
    unsafe {
        if let Some(prev) = PREV_REQUEST_HOOK {
            prev();
        }
    }
    request_shmem();
}

fn request_shmem() {
    // SAFETY: called in the postmaster during shared memory sizing; SPEC was set by install().
    unsafe { pg_sys::RequestAddinShmemSpace(Channel::size_for(SPEC.slots, SPEC.staging_bytes)) };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup_hook() {
    // SAFETY: called in the postmaster (and again after a crash) with shared memory attached;
    // AddinShmemInitLock serializes initialization as PostgreSQL's own modules do.
    unsafe {
        if let Some(prev) = PREV_STARTUP_HOOK {
            prev();
        }
        let init_lock = crate::registry::shmem::addin_shmem_init_lock();
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let spec = SPEC;
        let mut found = false;
        let base = pg_sys::ShmemInitStruct(CHANNEL_NAME.as_ptr(), Channel::size_for(spec.slots, spec.staging_bytes), &mut found)
            as *mut u8;
        if !found {
            Channel::init(base, spec.slots, spec.staging_bytes, spec.mode);
        }
        BASE = base;
        pg_sys::LWLockRelease(init_lock);
    }
}

/// The GPU service's request channel.
pub fn channel() -> Result<Channel> {
    // SAFETY: written once by the startup hook before any backend runs (inherited through
    // fork); the block was formatted there and lives as long as the process.
    let base = unsafe { BASE };
    if base.is_null() {
        return Err(UvmError::new(
            Code::ObjectNotInPrerequisiteState,
            "pg_uvm_share is not loaded through shared_preload_libraries",
        )
        .hint("Add pg_uvm_share to shared_preload_libraries in postgresql.conf and restart the server."));
    }
    // SAFETY: formatted by Channel::init in the startup hook (see above).
    Ok(unsafe { Channel::from_raw(base) })
}
