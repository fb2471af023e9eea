//! The request channel's home in PostgreSQL main shared memory: a block that the registry's
//! shared memory hooks (`registry::shmem`) request and format along with the registry's (the
//! first time, and again after every crash-restart). Every process then reaches it through
//! [`channel`]. The block starts in the mode `gpu_execution` fixes (`process`), or undecided
//! until the service decides.

use std::sync::atomic::{AtomicPtr, Ordering};

use super::channel::Channel;
use crate::error::{Code, Result, UvmError};
use crate::exec::Mode;
use crate::registry::shmem::Block;

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
static BASE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

/// The channel's block, for `registry::shmem::install` (from `_PG_init` in the postmaster).
pub fn block(spec: ChannelSpec) -> Block {
    // SAFETY: _PG_init runs single-threaded in the postmaster, before any hook can fire; the
    // hooks and every later process only read it.
    unsafe { SPEC = spec };
    Block { name: c"pg_uvm_share service channel", size: Channel::size_for(spec.slots, spec.staging_bytes), init, base: &BASE }
}

/// Formats the channel (the registry's startup hook calls it, under `AddinShmemInitLock`).
///
/// # Safety
/// `base` points to the block's `Channel::size_for(..)` fresh bytes of shared memory.
unsafe fn init(base: *mut u8) {
    // SAFETY: SPEC was set in _PG_init (single-threaded) before any hook ran; the block is
    // ours to format (contract).
    unsafe {
        let spec = SPEC;
        Channel::init(base, spec.slots, spec.staging_bytes, spec.mode);
    }
}

/// The GPU service's request channel.
pub fn channel() -> Result<Channel> {
    let base = BASE.load(Ordering::Acquire);
    if base.is_null() {
        return Err(UvmError::new(
            Code::ObjectNotInPrerequisiteState,
            "pg_uvm_share is not loaded through shared_preload_libraries",
        )
        .hint("Add pg_uvm_share to shared_preload_libraries in postgresql.conf and restart the server."));
    }
    // SAFETY: formatted by `init` in the startup hook, before any backend ran (inherited
    // through fork); main shared memory lives as long as the process.
    Ok(unsafe { Channel::from_raw(base) })
}
