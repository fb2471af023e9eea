//! The registry's home in PostgreSQL main shared memory, and its LWLock as RAII guards.
//!
//! `_PG_init` (in the postmaster, under `shared_preload_libraries`) calls [`install`], which asks
//! for `Registry::size_for(capacity)` bytes and one named LWLock tranche, and installs
//! `shmem_startup_hook`. How the request is made depends on the PostgreSQL version: from 15 on it
//! must happen in `shmem_request_hook` (PostgreSQL 15 moved it there and rejects requests made
//! elsewhere), on 14, which has no such hook, directly in `_PG_init`. The startup hook formats the
//! block with a fresh random epoch the first time (`found == false`), which also happens again
//! after every crash-restart, holding `AddinShmemInitLock` as PostgreSQL's own modules do; that
//! lock is the version's `MainLWLockArray` slot read from its `storage/lwlocknames.h` by build.rs.
//! Every process then reaches the registry through [`shared`] or [`exclusive`], which return
//! guards that release the lock when dropped (unless PostgreSQL's error recovery already released
//! all LWLocks).
//! There is no unlocked view of the registry: a pin is released through its `HeldPin` (atomics
//! only), and main shared memory stays mapped for the life of the process, as `HeldPin` needs.

use std::ops::{Deref, DerefMut};
use std::ptr::null_mut;

use pgrx::pg_sys;

use super::{Arena, Capacity, Registry};
use crate::error::{Code, Result, UvmError};

// ADDIN_SHMEM_INIT_LOCK_INDEX, from the target version's headers (build.rs).
include!(concat!(env!("OUT_DIR"), "/pg_version_consts.rs"));

const SHMEM_NAME: &std::ffi::CStr = c"pg_uvm_share registry";
const TRANCHE: &std::ffi::CStr = c"pg_uvm_share";

static mut CAPACITY: Capacity = Capacity { max_segments: 0, max_chunks: 0, max_attachments: 0 };
static mut ARENA: Arena = Arena { base: 0, size: 0 };
static mut BASE: *mut u8 = null_mut();
static mut LOCK: *mut pg_sys::LWLock = null_mut();
#[cfg(not(feature = "pg14"))]
static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

/// Another block of main shared memory, set up with the registry's by the same hooks (the GPU
/// service's request channel, `service::shmem`): its name, its size, the function that formats
/// it the first time (and after every crash-restart), and where its address is published.
#[derive(Clone, Copy)]
pub struct Block {
    pub name: &'static std::ffi::CStr,
    pub size: usize,
    /// # Safety
    /// Called with `size` fresh bytes of shared memory, under `AddinShmemInitLock`.
    pub init: unsafe fn(*mut u8),
    pub base: &'static std::sync::atomic::AtomicPtr<u8>,
}

/// The other blocks (set once by `install`).
static mut BLOCKS: [Option<Block>; 2] = [None; 2];

/// Installs the shared memory hooks, for the registry and `blocks` (at most 2). Called once
/// from `_PG_init` in the postmaster.
pub fn install(cap: Capacity, arena: Arena, blocks: &[Block]) {
    assert!(blocks.len() <= 2, "room for two other shared memory blocks");
    // SAFETY: _PG_init runs single-threaded in the postmaster, before any hook can fire.
    unsafe {
        CAPACITY = cap;
        ARENA = arena;
        let mut all = [None; 2];
        for (slot, b) in all.iter_mut().zip(blocks) {
            *slot = Some(*b);
        }
        BLOCKS = all;
        #[cfg(not(feature = "pg14"))]
        {
            PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
            pg_sys::shmem_request_hook = Some(request_hook);
        }
        // PostgreSQL 14 has no request hook: requests are made from _PG_init itself, which runs
        // while process_shared_preload_libraries_in_progress (the only time they are accepted).
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

/// Asks for the registry's bytes and its LWLock tranche (in the request phase: see the top).
fn request_shmem() {
    // SAFETY: called in the postmaster during shared memory sizing (request hook, or _PG_init on
    // 14); CAPACITY was set by install() before.
    unsafe {
        pg_sys::RequestAddinShmemSpace(Registry::size_for(CAPACITY));
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 1);
        let blocks = BLOCKS;
        for b in blocks.iter().flatten() {
            pg_sys::RequestAddinShmemSpace(b.size);
        }
    }
}

/// PostgreSQL's `AddinShmemInitLock`.
fn addin_shmem_init_lock() -> *mut pg_sys::LWLock {
    // SAFETY: MainLWLockArray is set up before any shmem_startup_hook runs and has more than
    // ADDIN_SHMEM_INIT_LOCK_INDEX entries (it is one of the version's individual LWLocks).
    unsafe { &raw mut (*pg_sys::MainLWLockArray.add(ADDIN_SHMEM_INIT_LOCK_INDEX)).lock }
}

fn random_epoch() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into `v`.
    let n = unsafe { libc::getrandom(&mut v as *mut u64 as *mut libc::c_void, 8, 0) };
    if n != 8 || v == 0 {
        // fall back on time and pid: only uniqueness across restarts matters
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        v = t ^ ((std::process::id() as u64) << 48) | 1;
    }
    v
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup_hook() {
    // SAFETY: called in the postmaster (and, after a crash, again) with shared memory attached;
    // AddinShmemInitLock serializes initialization as PostgreSQL's own modules do.
    unsafe {
        if let Some(prev) = PREV_STARTUP_HOOK {
            prev();
        }
        let init_lock = addin_shmem_init_lock();
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let base = pg_sys::ShmemInitStruct(SHMEM_NAME.as_ptr(), Registry::size_for(CAPACITY), &mut found);
        if !found {
            Registry::init(base as *mut u8, CAPACITY, random_epoch(), ARENA);
        }
        BASE = base as *mut u8;
        LOCK = &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock;
        let blocks = BLOCKS;
        for b in blocks.iter().flatten() {
            let mut found = false;
            let p = pg_sys::ShmemInitStruct(b.name.as_ptr(), b.size, &mut found) as *mut u8;
            if !found {
                (b.init)(p);
            }
            b.base.store(p, std::sync::atomic::Ordering::Release);
        }
        pg_sys::LWLockRelease(init_lock);
    }
}

fn attached() -> Result<(*mut u8, *mut pg_sys::LWLock)> {
    // SAFETY: the statics are written once by the startup hook before any backend runs (and
    // inherited through fork); reading them is race-free.
    let (base, lock) = unsafe { (BASE, LOCK) };
    if base.is_null() || lock.is_null() {
        return Err(UvmError::new(
            Code::ObjectNotInPrerequisiteState,
            "pg_uvm_share is not loaded through shared_preload_libraries",
        )
        .hint("Add pg_uvm_share to shared_preload_libraries in postgresql.conf and restart the server."));
    }
    Ok((base, lock))
}

/// Whether the registry exists in this process (the library was preloaded).
pub fn available() -> bool {
    attached().is_ok()
}

/// The registry under a shared lock.
pub struct SharedGuard {
    reg: Registry,
    lock: *mut pg_sys::LWLock,
}

/// The registry under the exclusive lock.
pub struct ExclusiveGuard {
    reg: Registry,
    lock: *mut pg_sys::LWLock,
}

fn acquire(mode: pg_sys::LWLockMode::Type) -> Result<(Registry, *mut pg_sys::LWLock)> {
    let (base, lock) = attached()?;
    // SAFETY: `lock` is the registry's LWLock in shared memory; `base` was formatted by the
    // startup hook. LWLockAcquire does not return until the lock is held.
    unsafe {
        pg_sys::LWLockAcquire(lock, mode);
        Ok((Registry::from_raw(base), lock))
    }
}

/// Takes the registry lock in shared mode.
pub fn shared() -> Result<SharedGuard> {
    let (reg, lock) = acquire(pg_sys::LWLockMode::LW_SHARED)?;
    Ok(SharedGuard { reg, lock })
}

/// Takes the registry lock in exclusive mode.
pub fn exclusive() -> Result<ExclusiveGuard> {
    let (reg, lock) = acquire(pg_sys::LWLockMode::LW_EXCLUSIVE)?;
    Ok(ExclusiveGuard { reg, lock })
}

/// Releases `lock` unless an `elog(ERROR)` is unwinding: then PostgreSQL's abort processing
/// (`LWLockReleaseAll`) releases it, and releasing twice would fail.
fn release(lock: *mut pg_sys::LWLock) {
    // SAFETY: `lock` is the registry lock, held by this process; InterruptHoldoffCount is a
    // process-local counter read from the main thread.
    unsafe {
        if pg_sys::InterruptHoldoffCount > 0 && pg_sys::LWLockHeldByMe(lock) {
            pg_sys::LWLockRelease(lock);
        }
    }
}

/// Releases the registry lock if this process holds it (used by exit callbacks that may run
/// after a FATAL error raised while the lock was held).
pub fn release_if_held() {
    if let Ok((_, lock)) = attached() {
        // SAFETY: LWLockHeldByMe only reads this process's held-lock list.
        if unsafe { pg_sys::LWLockHeldByMe(lock) } {
            // SAFETY: held by this process, checked above.
            unsafe { pg_sys::LWLockRelease(lock) };
        }
    }
}

impl Drop for SharedGuard {
    fn drop(&mut self) {
        release(self.lock)
    }
}
impl Drop for ExclusiveGuard {
    fn drop(&mut self) {
        release(self.lock)
    }
}
impl Deref for SharedGuard {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        &self.reg
    }
}
impl Deref for ExclusiveGuard {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        &self.reg
    }
}
impl DerefMut for ExclusiveGuard {
    fn deref_mut(&mut self) -> &mut Registry {
        &mut self.reg
    }
}

// Only with `cargo pgrx test` (feature pg_test): the lock's name needs a running server.
#[cfg(feature = "pg_test")]
#[pgrx::pg_schema]
mod tests {
    use pgrx::pg_sys;
    use pgrx::prelude::*;

    /// build.rs read ADDIN_SHMEM_INIT_LOCK_INDEX from the target version's lwlocknames.h; the
    /// server's own name for that MainLWLockArray slot must be "AddinShmemInit".
    #[pg_test]
    fn addin_shmem_init_lock_index_names_that_lock() {
        // SAFETY: GetLWLockIdentifier returns a static C string for an individual LWLock.
        let name = unsafe {
            std::ffi::CStr::from_ptr(pg_sys::GetLWLockIdentifier(
                pg_sys::PG_WAIT_LWLOCK,
                super::ADDIN_SHMEM_INIT_LOCK_INDEX as u16,
            ))
        };
        assert_eq!(name.to_str(), Ok("AddinShmemInit"));
    }

    /// The registry was set up by the startup hook (through the version's request path).
    #[pg_test]
    fn registry_is_attached_in_shared_memory() {
        assert!(super::available());
    }
}
