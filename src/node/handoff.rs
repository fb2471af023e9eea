//! Leader probes: a parallel GpuJoin whose workers hand their outer keys to the leader, so that
//! one process of the query runs every probe (issue 24, point 5). GpuGroupAgg over the heap in
//! parallel hands its batches of column blocks to its runner through the same exchange, as
//! 8-byte words (`super::groupagg`'s `parallel.rs`).
//!
//! # Why
//!
//! In the `process` execution mode under CUDA every process runs its kernels itself, so each
//! parallel worker that probes starts a CUDA context of its own: 150-170 ms of its time and
//! about 500 MiB of GPU memory, serialised by the driver. The planner must charge that per
//! worker, and a partial GpuJoin then loses to PostgreSQL's parallel hash join at sizes
//! where the node run serially is faster (2 M outer rows: 158 ms serially against PostgreSQL's
//! 264 ms, the serial plan priced above PostgreSQL's because its heap scan is serial). Yet the
//! probe mode (`count(*)`, and `count`/`sum` of one inner column) needs nothing of an outer
//! row but its key, and the GPU probes a batch of keys in a fraction of the time the scan
//! takes to read them: one process can probe for all. So here the workers scan their share
//! of the outer side and hand each batch of keys to the leader, which probes it between its own
//! batches and folds the matches into its own aggregates; the workers touch no GPU and start
//! no context. The plan is PG-Strom's in spirit (its GPU service, in one process, serves every
//! worker), within the query: the leader is the only process of it with a context.
//!
//! # The exchange
//!
//! [`Handoff`], in the node's shared state (`super::shared::Shared`), in the parallel query's
//! DSM:
//!
//! - a ring of [`RING`] entries, of which at most `capacity` are in use (the batches' keys
//!   are bounded by half the hash memory, as the probe mode's read-ahead is: `spill::
//!   pending_batches`), each naming an allocation of the query's DSA area that holds one
//!   batch's keys. A worker reserves the entry at `tail` with one compare-and-swap (so several
//!   workers push at once), copies the keys, and marks the entry ready; the leader alone takes
//!   entries at `head`, in order, and frees each allocation once probed.
//! - a producers word: the count of workers that hand keys over, and a closed bit. A worker
//!   registers at its first call, before it reads an outer tuple, unless the word is closed
//!   (it then probes on its own, as every worker did before: a worker that starts after the
//!   leader has finished). The leader closes the word once its own share of the outer side is
//!   done and no worker is registered; a worker unregisters when it has pushed its last batch.
//!   So the leader never stops while a worker may still push, and a late worker never pushes
//!   where nobody takes.
//! - two condition variables: the leader sleeps on `items` (a worker pushed, or unregistered),
//!   a worker on `space` (the ring is full; the leader took an entry). Both sleeps answer
//!   interrupts, so a cancel or a worker's ERROR (which reaches the leader as an interrupt)
//!   ends the wait, and the leader's abort stops every worker.
//!
//! Used only where the leader runs the plan below the Gather (`parallel_leader_participation`,
//! read when the leader sets up the DSM): otherwise nobody would take the keys. The leader
//! also builds the table (no worker needs a context for the build either): the last
//! participant to finish its share of the inner side wakes it (`super::shared`).
//!
//! Nothing here trusts more than it must: an entry's length is checked against the batch size
//! before its keys are read, and the leader's wait is bounded by the workers' progress, which
//! PostgreSQL supervises.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;

use crate::error::{Code, Result, UvmError};

/// Entries of the ring (batches of keys in flight at once, at most).
pub const RING: usize = 32;

/// The producers word's closed bit: no worker may register any more.
const CLOSED: u64 = 1 << 63;

const EMPTY: u32 = 0;
const READY: u32 = 1;

/// One batch of keys: an allocation of the query's DSA area.
#[repr(C)]
struct Entry {
    state: AtomicU32,
    _pad: u32,
    keys: pg_sys::dsa_pointer,
    len: u64,
}

/// The exchange of one parallel GpuJoin (see the module documentation).
#[repr(C)]
pub struct Handoff {
    /// The workers hand their keys to the leader (set by the leader, before workers start).
    on: bool,
    capacity: u32,
    /// The most keys one entry may hold.
    most_keys: u64,
    producers: AtomicU64,
    head: AtomicU64,
    tail: AtomicU64,
    /// Batches and keys handed over, over the query (EXPLAIN ANALYZE).
    pub batches: AtomicU64,
    pub keys: AtomicU64,
    items: pg_sys::ConditionVariable,
    space: pg_sys::ConditionVariable,
    ring: [Entry; RING],
}

/// A batch the leader took ([`Handoff::take`]); give it back with [`Handoff::release`].
pub struct Taken {
    at: u64,
    keys: pg_sys::dsa_pointer,
    len: usize,
}

/// Whether the ring has room for one more entry, with `tail` reserved and `head` taken.
fn has_room(head: u64, tail: u64, capacity: u32) -> bool {
    tail.wrapping_sub(head) < u64::from(capacity)
}

/// The producers word after a worker registers at `v`, if it may.
fn registered(v: u64) -> Option<u64> {
    (v & CLOSED == 0).then_some(v + 1)
}

impl Handoff {
    /// Sets up `h` (zeroed DSM bytes): `on` where the workers will hand their keys over, with
    /// at most `capacity` batches of at most `most_keys` keys in flight.
    ///
    /// # Safety
    /// `h` points at zeroed, writable bytes of the DSM; called by the leader before workers
    /// start.
    pub unsafe fn init(h: *mut Handoff, on: bool, capacity: usize, most_keys: usize) {
        // SAFETY: forwarded contract; the condition variables are initialized in place.
        unsafe {
            (*h).on = on;
            (*h).capacity = capacity.clamp(1, RING) as u32;
            (*h).most_keys = most_keys as u64;
            pg_sys::ConditionVariableInit(&mut (*h).items);
            pg_sys::ConditionVariableInit(&mut (*h).space);
        }
    }

    /// Whether this query's workers hand their keys over.
    ///
    /// # Safety
    /// `h` was set up by [`Handoff::init`].
    pub unsafe fn is_on(h: *const Handoff) -> bool {
        // SAFETY: forwarded contract; written before any worker started.
        unsafe { (*h).on }
    }

    /// Registers a worker as a producer: false once the leader has closed the exchange (the
    /// worker then probes on its own).
    ///
    /// # Safety
    /// As for [`Handoff::is_on`].
    pub unsafe fn register(h: *mut Handoff) -> bool {
        // SAFETY: forwarded contract.
        let word = unsafe { &(*h).producers };
        let mut v = word.load(Ordering::Acquire);
        loop {
            let Some(next) = registered(v) else { return false };
            match word.compare_exchange(v, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => v = now,
            }
        }
    }

    /// Hands one batch of keys to the leader, waiting (answering interrupts) while the ring is
    /// full.
    ///
    /// # Safety
    /// As for [`Handoff::is_on`]; this worker registered; `area` is the query's DSA area.
    pub unsafe fn push(h: *mut Handoff, area: *mut pg_sys::dsa_area, keys: &[i64]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        // SAFETY: forwarded contract; the allocation is ours until the entry is ready, then
        // the leader's; the condition variable lives in the DSM.
        unsafe {
            if keys.len() as u64 > (*h).most_keys {
                return Err(UvmError::new(Code::ProgramLimitExceeded, "a batch larger than the leader takes"));
            }
            let bytes = std::mem::size_of_val(keys);
            let dp = pg_sys::dsa_allocate_extended(area, bytes, 0);
            let dst = pg_sys::dsa_get_address(area, dp) as *mut i64;
            std::ptr::copy_nonoverlapping(keys.as_ptr(), dst, keys.len());
            let at = loop {
                let tail = (*h).tail.load(Ordering::Acquire);
                let head = (*h).head.load(Ordering::Acquire);
                if has_room(head, tail, (*h).capacity) {
                    if (*h).tail.compare_exchange(tail, tail + 1, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                        break tail;
                    }
                    continue;
                }
                // The first call prepares to sleep and returns at once; the loop checks again.
                pg_sys::ConditionVariableSleep(&mut (*h).space, pg_sys::PG_WAIT_EXTENSION);
            };
            crate::pgwait::cancel_sleep();
            let e = &mut (*h).ring[(at % RING as u64) as usize];
            e.keys = dp;
            e.len = keys.len() as u64;
            e.state.store(READY, Ordering::Release);
            (*h).batches.fetch_add(1, Ordering::Relaxed);
            (*h).keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
            pg_sys::ConditionVariableSignal(&mut (*h).items);
        }
        Ok(())
    }

    /// Unregisters a worker that pushed its last batch, and wakes the leader.
    ///
    /// # Safety
    /// As for [`Handoff::push`].
    pub unsafe fn finish(h: *mut Handoff) {
        // SAFETY: forwarded contract.
        unsafe {
            (*h).producers.fetch_sub(1, Ordering::AcqRel);
            pg_sys::ConditionVariableSignal(&mut (*h).items);
        }
    }

    /// The next batch handed over, if one is ready (the leader only).
    ///
    /// # Safety
    /// As for [`Handoff::is_on`]; only the leader takes; every taken batch is released before
    /// the next take.
    pub unsafe fn take(h: *mut Handoff) -> Option<Taken> {
        // SAFETY: forwarded contract.
        unsafe {
            let head = (*h).head.load(Ordering::Acquire);
            if head == (*h).tail.load(Ordering::Acquire) {
                return None;
            }
            let e = &(*h).ring[(head % RING as u64) as usize];
            if e.state.load(Ordering::Acquire) != READY {
                return None; // reserved, its keys still being copied: the push signals
            }
            Some(Taken { at: head, keys: e.keys, len: e.len.min((*h).most_keys) as usize })
        }
    }

    /// The keys of a taken batch.
    ///
    /// # Safety
    /// `t` was taken from the exchange of the query whose DSA area is `area`, not released.
    pub unsafe fn keys(area: *mut pg_sys::dsa_area, t: &Taken) -> &[i64] {
        // SAFETY: forwarded contract; the worker wrote `len` keys there (at most `most_keys`).
        unsafe { std::slice::from_raw_parts(pg_sys::dsa_get_address(area, t.keys) as *const i64, t.len) }
    }

    /// Frees a taken batch and makes its entry free for the workers.
    ///
    /// # Safety
    /// As for [`Handoff::keys`].
    pub unsafe fn release(h: *mut Handoff, area: *mut pg_sys::dsa_area, t: Taken) {
        // SAFETY: forwarded contract.
        unsafe {
            pg_sys::dsa_free(area, t.keys);
            let e = &mut (*h).ring[(t.at % RING as u64) as usize];
            e.keys = 0;
            e.state.store(EMPTY, Ordering::Release);
            (*h).head.store(t.at + 1, Ordering::Release);
            pg_sys::ConditionVariableBroadcast(&mut (*h).space);
        }
    }

    /// Closes the exchange if no worker is registered (the leader, once its own share is done):
    /// true when closed. Every batch pushed before is ready then.
    ///
    /// # Safety
    /// As for [`Handoff::is_on`].
    pub unsafe fn try_close(h: *mut Handoff) -> bool {
        // SAFETY: forwarded contract.
        let word = unsafe { &(*h).producers };
        word.compare_exchange(0, CLOSED, Ordering::AcqRel, Ordering::Acquire).is_ok() || word.load(Ordering::Acquire) == CLOSED
    }

    /// Sleeps (answering interrupts) until a worker pushes or unregisters; call in a loop that
    /// checks first, and `crate::pgwait::cancel_sleep` after it.
    ///
    /// # Safety
    /// As for [`Handoff::is_on`]; the leader.
    pub unsafe fn wait(h: *mut Handoff) {
        // SAFETY: forwarded contract.
        unsafe { pg_sys::ConditionVariableSleep(&mut (*h).items, pg_sys::PG_WAIT_EXTENSION) }
    }

    /// Sets the exchange back for a rescan, freeing any batch left (an ERROR never reaches
    /// this: the DSM goes with the query).
    ///
    /// # Safety
    /// As for [`Handoff::is_on`]; no participant runs; `area` is the query's DSA area or null.
    pub unsafe fn reset(h: *mut Handoff, area: *mut pg_sys::dsa_area) {
        // SAFETY: forwarded contract.
        unsafe {
            for e in (*h).ring.iter_mut() {
                if e.state.load(Ordering::Acquire) == READY && e.keys != 0 && !area.is_null() {
                    pg_sys::dsa_free(area, e.keys);
                }
                e.keys = 0;
                e.len = 0;
                e.state.store(EMPTY, Ordering::Release);
            }
            (*h).producers.store(0, Ordering::Release);
            (*h).batches.store(0, Ordering::Relaxed);
            (*h).keys.store(0, Ordering::Relaxed);
            (*h).head.store(0, Ordering::Release);
            (*h).tail.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_holds_at_most_its_capacity_across_wrapping() {
        assert!(has_room(0, 0, 4));
        assert!(has_room(0, 3, 4));
        assert!(!has_room(0, 4, 4));
        assert!(has_room(5, 8, 4));
        assert!(!has_room(5, 9, 4));
        assert!(has_room(u64::MAX - 1, 1, 4)); // 3 in use across the wrap
        assert!(!has_room(u64::MAX - 1, 2, 4));
    }

    #[test]
    fn a_closed_exchange_takes_no_producer() {
        assert_eq!(registered(0), Some(1));
        assert_eq!(registered(3), Some(4));
        assert_eq!(registered(CLOSED), None);
    }
}
