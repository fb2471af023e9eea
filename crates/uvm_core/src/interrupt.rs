//! Cancel and `statement_timeout` for the long loops of the plain-Rust layers.
//!
//! The GpuJoin probe, the table build, the checksum and fill loops and the migration copy run
//! in plain Rust that never calls into PostgreSQL. Yet each must answer a cancel within
//! 100 ms. So they call [`check`] every few thousand iterations (see [`EVERY`]), and the SQL
//! layer installs, in `_PG_init`, a hook that runs `CHECK_FOR_INTERRUPTS()`.
//!
//! # How an interrupt leaves the loop
//!
//! In PostgreSQL a pending cancel makes `CHECK_FOR_INTERRUPTS()` raise an ERROR. pgrx turns
//! it into a Rust unwind, so the loop's guards (pins, locks, mappings) drop on the way out,
//! as on any other error. A hook may also return `Err` (the unit tests' hooks do, with
//! [`Code::QueryCanceled`](crate::error::Code::QueryCanceled)); callers propagate it with `?`.
//! The extension's hook does so for a pending exit (`pg_terminate_backend`), with
//! [`Code::AdminShutdown`](crate::error::Code::AdminShutdown): a FATAL raised inside the loop
//! would end the process without unwinding it, and its exit callbacks would find the
//! operation's state still in use; the exit stays pending for PostgreSQL's next check.
//!
//! # Threads
//!
//! PostgreSQL may only be called from a process's main thread. The hook runs only on the
//! thread that installed it: `_PG_init` runs in the postmaster, and every backend and worker
//! is forked from it, so their main threads inherit the mark. Any other thread (the CUDA
//! start-up helper) gets a no-op.
//!
//! # Requests run for another process
//!
//! The GPU service runs requests for client processes, on its main thread and on executor
//! threads. There a "cancel" is the client giving up (`service::channel`): the service marks
//! the thread with [`watch`] (a flag in shared memory and the value that means "stop"), and
//! [`check`] returns [`Code::QueryCanceled`](crate::error::Code::QueryCanceled) once the flag
//! holds it, on any thread, so the same loops stop early for an abandoned request.
//!
//! # Lifecycle
//!
//! `_PG_init` calls [`install`] once; without it (plain `cargo test`) [`check`] does nothing.

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use crate::error::{Code, Result, UvmError};

/// How many iterations of a cheap loop (a hash probe, a word of a checksum) may pass between
/// two checks. At the slowest loop here (host-tier probes, about 0.5 G keys/s) this is far
/// below a millisecond; a check costs one load and a branch in PostgreSQL.
pub const EVERY: u64 = 1 << 16;

/// The hook: a plain `fn`, stored as a pointer (null: none).
static HOOK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    /// Whether this thread may run the hook (set where it was installed, kept across fork).
    static HOOK_THREAD: Cell<bool> = const { Cell::new(false) };
    /// The flag [`watch`] set for this thread, and the value that means "stop".
    static WATCHED: Cell<Option<(*const AtomicU32, u32)>> = const { Cell::new(None) };
}

/// Makes [`check`] on this thread fail with 57014 while `flag` holds `stop`, until the
/// returned guard drops.
///
/// # Safety
/// `flag` must stay valid until the guard drops (a slot state in shared memory, which lives as
/// long as the process).
pub unsafe fn watch(flag: &AtomicU32, stop: u32) -> Watch {
    let prev = WATCHED.with(|w| w.replace(Some((flag as *const AtomicU32, stop))));
    Watch { prev }
}

/// Undoes [`watch`] when dropped.
pub struct Watch {
    prev: Option<(*const AtomicU32, u32)>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        WATCHED.with(|w| w.set(self.prev));
    }
}

fn watched_stop() -> Result<()> {
    match WATCHED.with(|w| w.get()) {
        // SAFETY: `watch`'s contract keeps the flag valid while it is set.
        Some((flag, stop)) if unsafe { &*flag }.load(Ordering::Relaxed) == stop => {
            Err(UvmError::new(Code::QueryCanceled, "canceling the request: its client gave up on it"))
        }
        _ => Ok(()),
    }
}

/// Installs `hook` for this thread (and, through `fork`, for the main thread of every child).
pub fn install(hook: fn() -> Result<()>) {
    HOOK.store(hook as *mut (), Ordering::Release);
    HOOK_THREAD.with(|t| t.set(true));
}

/// Serves a pending interrupt: an ERROR raised by PostgreSQL (an unwind) or an `Err`.
#[inline]
pub fn check() -> Result<()> {
    watched_stop()?;
    let p = HOOK.load(Ordering::Acquire);
    if p.is_null() || !HOOK_THREAD.with(|t| t.get()) {
        return Ok(());
    }
    // SAFETY: `p` was stored by `install` from a `fn() -> Result<()>`, and function pointers
    // and data pointers have the same size and representation on every platform Rust and
    // PostgreSQL support here.
    let hook: fn() -> Result<()> = unsafe { std::mem::transmute::<*mut (), fn() -> Result<()>>(p) };
    hook()
}

/// Spawns a thread that never takes PostgreSQL's signals: every signal is blocked while it is
/// spawned, so it inherits a full mask and the kernel delivers the process's signals (latch
/// wake-ups, cancels, SIGTERM) to the main thread only. Such threads must never call
/// PostgreSQL (the CUDA start-up helper, the GPU service's executors).
pub fn spawn_without_signals<F: FnOnce() + Send + 'static>(name: String, f: F) -> std::io::Result<std::thread::JoinHandle<()>> {
    // SAFETY: sigset operations on local sets; pthread_sigmask on the calling thread, restored
    // below.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    let spawned = std::thread::Builder::new().name(name).spawn(f);
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
}

/// [`check`] every [`EVERY`] iterations of a loop counted by `i`.
#[inline]
pub fn check_every(i: u64) -> Result<()> {
    if i.is_multiple_of(EVERY) {
        check()
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cancel() -> Result<()> {
        Err(UvmError::new(Code::QueryCanceled, "canceling statement due to user request"))
    }

    #[test]
    fn hook_runs_only_on_the_installing_thread() {
        // Unit tests share one process: install on a thread of our own, so that no other
        // test's loop sees the hook.
        std::thread::spawn(|| {
            assert!(check().is_ok());
            install(cancel);
            assert_eq!(check().unwrap_err().code, Code::QueryCanceled);
            assert!(check_every(1).is_ok());
            assert!(check_every(EVERY).is_err());
            assert!(std::thread::spawn(check).join().unwrap().is_ok(), "another thread runs no hook");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_watched_flag_stops_checks_on_any_thread() {
        static FLAG: AtomicU32 = AtomicU32::new(0);
        std::thread::spawn(|| {
            // SAFETY: a static flag.
            let g = unsafe { watch(&FLAG, 5) };
            assert!(check().is_ok());
            FLAG.store(5, Ordering::Relaxed);
            assert_eq!(check().unwrap_err().code, Code::QueryCanceled);
            drop(g);
            assert!(check().is_ok(), "unwatched again");
        })
        .join()
        .unwrap();
    }
}
