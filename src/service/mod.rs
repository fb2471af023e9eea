//! The GPU service: one process that runs every segment operation of the cluster, so that one
//! CUDA context per GPU serves every backend and parallel worker.
//!
//! # Why
//!
//! A CUDA context costs each process about 260 ms to create (serialised by the driver: 525 ms
//! each when five parallel workers start at once) and about 520 MiB of GPU memory
//! (`bench/probes/cuda_process_cost.py`). With a context per process, every parallel worker of
//! every query pays that, and a hundred connections that touched the GPU hold 52 GB of it.
//! PG-Strom (since v5) answers with one multi-threaded GPU service process; so do we, keeping
//! what PG-Strom lacks: segments shared at one address by every process.
//!
//! # What runs where
//!
//! ```text
//!  backend / parallel worker                  GPU service (background worker)
//!  ─────────────────────────                  ───────────────────────────────
//!  resolve + authorize the segment            main thread: latch, interrupts, postmaster
//!  claim a slot (shared memory)                 death; takes requests, pins and maps the
//!  write request + staging bytes                segments (`exec::local::prepare`), runs the
//!  submit, SetLatch(service)      ───────▶      registry-changing operations itself
//!  wait on own latch, serving                 executor threads (a pool, `service_threads`):
//!    CHECK_FOR_INTERRUPTS()                     run the work (`exec::local::Work::run`):
//!  read reply + staging bytes     ◀───────      kernels on the CUDA context, or CPU loops;
//!  free the slot                                write the reply, set the client's latch
//! ```
//!
//! - [`channel`] is the shared-memory request channel (plain Rust): fixed slots, each with a
//!   staging area, a compare-and-swap state machine, and a ticket queue for when they run out.
//! - `crate::exec::request` is what a slot carries: an operation, segment references, scalars,
//!   a reply (the execution seam's vocabulary, which the service shares with the local executor).
//! - `worker` is the background worker; `client` is the backend side (both pgrx).
//!
//! In service mode no backend maps a device chunk or loads libcuda: backends keep a segment
//! manager whose provider maps only host-tier memfds ([`crate::provider::remote`]), for session
//! pins, lookups and the reads, writes, checksums and fills of bytes it maps
//! (`crate::exec::local::run_here`), and send every other operation on segment memory to the
//! service. The service runs the same code a process-mode backend runs
//! ([`crate::exec::local`]), on its own mappings.
//!
//! # Faults
//!
//! - A client that is cancelled (or times out, or raises an ERROR, or exits) abandons its
//!   slot; the service stops the work at its next interrupt check (`interrupt::watch`) or
//!   finishes it, and frees the slot only then, so staging memory is never reused early. A
//!   client that exits on a FATAL error (`pg_terminate_backend`) unwinds nothing: its exit
//!   callback (registered before its first request) abandons its slots and gives up its place
//!   in the queue for slots. The client has its ERROR before the abandoned work has stopped:
//!   a drop, growth or migration of that segment (the client's next statement, say) waits in
//!   the service until it has, rather than finding the segment pinned.
//! - A client SIGKILLed mid-request makes the postmaster restart the cluster, as any backend
//!   crash does: shared memory, the broker and the service start afresh.
//! - The service killed by a signal is a crash too (the cluster restarts, and with it every
//!   chunk is freed, as for the broker). Terminated (SIGTERM), it finishes the requests its
//!   threads run, leaves those not yet taken for its successor (restarted after 1 s), and
//!   releases its pins at exit; a request it had taken and never answered is failed by the
//!   successor, so no client waits forever.
//! - An error in one request is that request's reply: the client raises it as an ERROR with its
//!   SQLSTATE; the service and the other requests go on.

pub use uvm_core::channel;

pub mod client;
pub mod shmem;
pub mod worker;

/// Sets a latch owned by another process, from any thread: PostgreSQL's `SetLatch` protocol
/// for a foreign latch (latch.c), without calling into PostgreSQL, so that the service's
/// executor threads may wake their clients. Setting a latch is async-signal-safe by design:
/// two stores, barriers, and a `kill(SIGURG)` when the owner may be sleeping.
///
/// # Safety
/// `latch` must be the address of a `Latch` in PostgreSQL shared memory (a `PGPROC`'s
/// `procLatch`), which stays mapped for the life of every process of the cluster.
pub unsafe fn set_latch_from_any_thread(latch: u64) {
    use std::sync::atomic::{fence, Ordering};
    let l = latch as *mut pgrx::pg_sys::Latch;
    if l.is_null() {
        return;
    }
    // SAFETY: a shared-memory latch (contract); the fields are sig_atomic_t and int, read and
    // written with volatile accesses between full fences, as SetLatch does.
    unsafe {
        fence(Ordering::SeqCst);
        if std::ptr::read_volatile(&raw const (*l).is_set) != 0 {
            return;
        }
        std::ptr::write_volatile(&raw mut (*l).is_set, 1);
        fence(Ordering::SeqCst);
        if std::ptr::read_volatile(&raw const (*l).maybe_sleeping) == 0 {
            return;
        }
        let owner = std::ptr::read_volatile(&raw const (*l).owner_pid);
        if owner != 0 {
            libc::kill(owner, libc::SIGURG);
        }
    }
}
