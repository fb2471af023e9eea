//! The GpuJoin node's memory, bounded by PostgreSQL's hash memory: past it, the inner side
//! spills to a segment of the `cpu` tier (host memory every process maps).
//!
//! # Design
//!
//! PostgreSQL's hash join keeps its table within `work_mem` × `hash_mem_multiplier` (its
//! "hash memory", `get_hash_memory_limit`), a parallel hash join its shared table within that
//! times the participants; past it, the join is split into batches kept in temporary files.
//! The GpuJoin node holds, per query: the inner rows (the columns the join uses), their (key,
//! payload) pairs until the table is built from them, a batch's matches read back from the
//! result buffer, and in the probe mode batches of outer keys read ahead while another
//! participant builds. The table and the result buffer are segments already (the device tier,
//! spilling to the host tier under the device budget): the GPU reads them where they are.
//!
//! - **The inner rows and pairs** go to the node's own memory (its memory context, or the
//!   parallel query's DSA area: `super::shared::Arena`) while the bytes allocated there stay
//!   within a [`Budget`] (the hash memory; in a parallel query one budget for all the
//!   participants, the hash memory times their number, as PostgreSQL's parallel hash join
//!   has), and past it to a **spill segment** ([`Spill`]): a temporary segment of the `cpu`
//!   tier (memfds under every provider, never read by a kernel: `TierPref::Cpu`), which the
//!   process maps at one address. A handle with [`SPILL_BIT`] set is an
//!   offset into it; the others are addresses or DSA pointers. Rows are found by handle
//!   wherever they are, so the answer is the same and nothing is read twice: unlike
//!   PostgreSQL's batches on disk, the spilled rows stay memory the CPU reads in place, and the
//!   GPU never reads them (it reads the table, built from the pairs).
//! - **A batch's matches** are read from the result buffer a window at a time
//!   ([`match_window`] pairs: a quarter of the hash memory), and **outer keys read ahead**
//!   stop at half of it ([`pending_batches`]).
//! - The batch of outer tuples being joined is a fixed number of tuples
//!   (`super::gpujoin::BATCH_TUPLES`), each with the outer columns the join uses, as
//!   PostgreSQL's own nodes hold a tuple or a page at a time.
//!
//! A process maps `cpu` segments in process mode, and in service mode with
//! `pg_uvm_share.map_host_tier` on, under either provider ([`can_spill`]). Elsewhere (a session
//! with `map_host_tier` off) nothing can spill: the planner does not offer the node for an inner side it estimates past the hash memory
//! (`Decline::InnerOverMemory`), and an inner side that grows past it all the same ends the
//! query with 53200 and a hint, before more memory is taken.
//!
//! # Lifecycle
//!
//! The spill segment is created at the first allocation past the budget, so a join that fits
//! creates none. Serially the node drops it with its table (End, a rebuild). In a parallel
//! query ([`SharedSpill`], in the node's shared state) the first participant past the budget
//! creates it while the others wait for it, and hands it to the leader, which drops it at End
//! as it does the table (a worker may exit while others still read the rows); a creator that
//! fails leaves a dead pid in the segment's name, which the leader's abort sweeps
//! (`super::cleanup::sweep_orphans`). The participants take its space through one shared
//! cursor, each growing it to cover what it took and mapping it, and after the build map it as
//! far as everyone wrote.
//!
//! A process maps a segment while it pins it, and a pinned segment cannot be dropped. The
//! node's pin on a spill segment is therefore held here, in a table of the process, not in the
//! node: `super::cleanup` gives back the pins of an aborted (sub)transaction before it drops
//! that transaction's segments, and a node gives back its own at End ([`Spill::finish`]).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;

use crate::error::{Code, Result, UvmError};
use crate::exec::{self, SegRef};
use crate::registry::TierPref;
use crate::runtime::{self, PgEnv};
use crate::segment::Pin;

/// Set in a handle that is an offset into the spill segment (addresses and DSA pointers never
/// have it).
pub const SPILL_BIT: u64 = 1 << 63;

/// A spill segment grows by at least this much at a time (and at least doubles).
const MIN_GROW: u64 = 8 << 20;

/// PostgreSQL's hash memory in bytes: `work_mem` × `hash_mem_multiplier`
/// (`get_hash_memory_limit`, which PostgreSQL 14 lacks).
pub fn hash_memory() -> u64 {
    // SAFETY: reads two settings of this process.
    let (kb, multiplier) = unsafe { (pg_sys::work_mem, pg_sys::hash_mem_multiplier) };
    let bytes = f64::from(kb.max(64)) * 1024.0 * multiplier.max(1.0);
    bytes.min((i64::MAX / 2) as f64) as u64
}

/// Pairs of a batch's matches read back at a time: a quarter of the hash memory.
pub fn match_window() -> usize {
    ((hash_memory() / 4 / 16) as usize).clamp(1024, 1 << 24)
}

/// Batches of outer keys (`keys` each) read ahead at most: half of the hash memory, at least one.
pub fn pending_batches(keys: usize, most: usize) -> usize {
    ((hash_memory() / 2) as usize / (keys.max(1) * 8)).clamp(1, most)
}

/// Whether this process maps `cpu` segments (and so may spill): see the module comment.
pub fn can_spill() -> bool {
    runtime::maps_cpu_segments()
}

fn cannot_spill(limit: u64) -> UvmError {
    UvmError::new(
        Code::OutOfMemory,
        format!("GpuJoin: the inner side needs more than its hash memory ({} kB) and cannot spill in this process", limit / 1024),
    )
    .detail(concat!(
        "Past work_mem × hash_mem_multiplier the node keeps the inner side in a segment of the cpu tier, which a ",
        "backend maps in process mode, and in service mode with pg_uvm_share.map_host_tier on."
    ))
    .hint("Raise work_mem for this query, or set pg_uvm_share.enable_gpujoin = off.")
}

/// A count of bytes: this process's, or one in shared memory that every participant adds to.
pub enum Counter {
    Own(u64),
    Shared(*const AtomicU64),
}

impl Counter {
    pub fn get(&self) -> u64 {
        match *self {
            Counter::Own(v) => v,
            // SAFETY: a shared counter lives in the query's DSM while its participants run.
            Counter::Shared(a) => unsafe { (*a).load(Ordering::Relaxed) },
        }
    }

    /// Adds `n`, if the sum stays within `limit`: the value before.
    fn take(&mut self, n: u64, limit: u64) -> Option<u64> {
        match self {
            Counter::Own(v) => {
                let before = *v;
                (before.checked_add(n)? <= limit).then(|| {
                    *v += n;
                    before
                })
            }
            // SAFETY: as in `get`; an atomic update.
            Counter::Shared(a) => unsafe { &**a }
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_add(n).filter(|s| *s <= limit))
                .ok(),
        }
    }
}

/// The bytes the node may allocate in its own memory.
pub struct Budget {
    used: Counter,
    limit: u64,
}

impl Budget {
    /// A serial execution's: the hash memory.
    pub fn own() -> Budget {
        Budget { used: Counter::Own(0), limit: hash_memory() }
    }

    /// A parallel query's, shared by its participants through `used`.
    pub fn shared(used: *const AtomicU64, limit: u64) -> Budget {
        Budget { used: Counter::Shared(used), limit }
    }

    /// Takes `n` bytes if they fit (nothing taken if not).
    pub fn try_take(&mut self, n: u64) -> bool {
        self.used.take(n, self.limit).is_some()
    }

    pub fn used(&self) -> u64 {
        self.used.get()
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// A parallel query's spill segment, in the node's shared state (zeroed: none yet).
#[repr(C)]
pub struct SharedSpill {
    state: AtomicU32,
    /// Written once, by the participant that creates the segment, before `state` becomes
    /// [`READY`]; read only after that.
    seg: std::cell::UnsafeCell<SegRef>,
    /// The cursor the participants take its space with.
    pub used: AtomicU64,
}

const NONE: u32 = 0;
const CREATING: u32 = 1;
const READY: u32 = 2;
const FAILED: u32 = 3;

impl SharedSpill {
    /// The cursor back at 0 (a rescan: the segment, if any, is used again).
    pub fn reset(&mut self) {
        self.used.store(0, Ordering::Relaxed);
    }

    /// The segment, if one was created.
    pub fn get(&self) -> Option<SegRef> {
        // SAFETY: READY (acquired) publishes the one write of `seg`.
        (self.state.load(Ordering::Acquire) == READY).then(|| unsafe { *self.seg.get() })
    }

    /// The segment, created by this participant if it is the first to need it; the others wait
    /// (answering interrupts) while it is created.
    fn get_or_create(&self) -> Result<SegRef> {
        loop {
            match self.state.compare_exchange(NONE, CREATING, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let made = super::cleanup::try_create("spill", |name| {
                        runtime::try_executor(|ex| {
                            exec::create(ex, name, 1, None, TierPref::Cpu, runtime::current_user(), runtime::now())
                        })
                    });
                    return match made {
                        Ok(seg) => {
                            // The leader drops it (`Spill::finish`), not a worker's cleanup.
                            // SAFETY: a plain global of the backend.
                            if unsafe { pg_sys::ParallelWorkerNumber } >= 0 {
                                super::cleanup::disown(&seg);
                            }
                            // SAFETY: only the participant that won the exchange writes it, and
                            // no one reads it before READY is published.
                            unsafe { *self.seg.get() = seg };
                            self.state.store(READY, Ordering::Release);
                            Ok(seg)
                        }
                        Err(e) => {
                            self.state.store(FAILED, Ordering::Release);
                            Err(e)
                        }
                    };
                }
                // SAFETY: as in `get`.
                Err(READY) => return Ok(unsafe { *self.seg.get() }),
                Err(FAILED) => {
                    return Err(UvmError::new(
                        Code::ObjectNotInPrerequisiteState,
                        "GpuJoin: another participant failed to create the spill segment",
                    ))
                }
                Err(_) => {
                    runtime::check_for_interrupts()?;
                    // SAFETY: a plain sleep of the main thread.
                    unsafe { pg_sys::pg_usleep(1_000) };
                }
            }
        }
    }
}

/// A spill segment as this process sees it: where the next allocation goes, and how much of it
/// this process maps.
pub struct Spill {
    /// `None` until created, or known to this process (at its first allocation).
    seg: Option<SegRef>,
    /// A parallel query's, where it is found or created (null serially).
    shared: *const SharedSpill,
    /// This process drops it: a serial execution, or a parallel query's leader.
    owned: bool,
    cursor: Counter,
    base: *mut u8,
    mapped: u64,
    /// Bytes this process allocated in it (EXPLAIN ANALYZE).
    bytes: u64,
    /// The hash memory, for the error that says nothing can spill.
    limit: u64,
}

impl Default for Spill {
    /// A serial execution's (created when first needed).
    fn default() -> Spill {
        Spill {
            seg: None,
            shared: std::ptr::null(),
            owned: true,
            cursor: Counter::Own(0),
            base: std::ptr::null_mut(),
            mapped: 0,
            bytes: 0,
            limit: hash_memory(),
        }
    }
}

impl Spill {
    /// A parallel query's (`shared` lives in its DSM while this process runs it, until
    /// [`Spill::leave_shared`]); `owned` by the leader.
    pub fn shared(shared: &SharedSpill, owned: bool, limit: u64) -> Spill {
        let cursor: *const AtomicU64 = &shared.used;
        Spill { shared, owned, cursor: Counter::Shared(cursor), limit, ..Spill::default() }
    }

    /// The segment, found or created.
    fn segment(&mut self) -> Result<SegRef> {
        if let Some(seg) = self.seg {
            return Ok(seg);
        }
        let seg = if self.shared.is_null() {
            super::cleanup::try_create("spill", |name| {
                runtime::try_executor(|ex| {
                    exec::create(ex, name, 1, None, TierPref::Cpu, runtime::current_user(), runtime::now())
                })
            })?
        } else {
            // SAFETY: the shared state outlives the query's participants.
            unsafe { &*self.shared }.get_or_create()?
        };
        self.seg = Some(seg);
        Ok(seg)
    }

    /// Allocates `bytes` (MAXALIGNed): its handle ([`SPILL_BIT`] set) and address.
    pub fn alloc(&mut self, bytes: usize) -> Result<(u64, *mut u8)> {
        if !can_spill() {
            return Err(cannot_spill(self.limit));
        }
        self.segment()?;
        let need = (bytes as u64 + 7) & !7;
        let off = self
            .cursor
            .take(need, u64::MAX >> 2)
            .ok_or_else(|| UvmError::new(Code::ProgramLimitExceeded, "GpuJoin: the spill segment is full"))?;
        let end = off + need;
        if end > self.mapped {
            self.map(end, true)?;
        }
        self.bytes += need;
        // SAFETY: [off, end) lies inside the mapped bytes.
        Ok((SPILL_BIT | off, unsafe { self.base.add(off as usize) }))
    }

    /// Maps the first `upto` bytes in this process (after growing the segment to cover them, when
    /// `grow`); its base address, which stays the same while this process is attached.
    pub fn map(&mut self, upto: u64, grow: bool) -> Result<*mut u8> {
        if upto <= self.mapped && !self.base.is_null() {
            return Ok(self.base);
        }
        if !can_spill() {
            return Err(cannot_spill(self.limit));
        }
        let seg = self.segment()?;
        if grow {
            let target = upto.max(self.mapped.saturating_mul(2)).max(MIN_GROW);
            runtime::try_executor(|ex| exec::grow_at_least(ex, &seg, target))?;
        }
        // The node's own segment, in the reserved namespace: pinned by name and checked by id.
        let pin = runtime::try_with_segments(|s| s.pin(seg.name(), |_| Ok(())))?;
        if pin.info().id != seg.id {
            return Err(UvmError::new(Code::UndefinedObject, format!("GpuJoin: spill segment \"{}\" was dropped", seg.name())));
        }
        if !pin.cpu_mapped_range(0, upto.min(i64::MAX as u64) as i64)? {
            return Err(cannot_spill(self.limit));
        }
        if !self.base.is_null() && pin.base() != self.base {
            return Err(UvmError::new(
                Code::SystemError,
                format!("GpuJoin: spill segment \"{}\" moved in this process", seg.name()),
            ));
        }
        self.base = pin.base();
        self.mapped = pin.info().size;
        hold(seg, pin);
        Ok(self.base)
    }

    /// The address handles are offsets from (null while nothing is mapped).
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Bytes this process allocated in it.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Before the parallel query's shared state goes away (the node's Shutdown): keeps the
    /// segment, if any was created, and the leader lists it to drop it however the query ends.
    pub fn leave_shared(&mut self) {
        // SAFETY: as in `segment`: called while the shared state is mapped.
        if let Some(seg) = self.seg.or_else(|| unsafe { self.shared.as_ref() }.and_then(SharedSpill::get)) {
            self.seg = Some(seg);
            if self.owned {
                super::cleanup::adopt(seg);
            }
        }
        self.shared = std::ptr::null();
    }

    /// Gives this process's pin back and, if it created the segment, drops it (End, a rebuild).
    /// Nothing may read what it held afterwards.
    pub fn finish(&mut self) {
        // SAFETY: as in `segment`.
        let seg = self.seg.or_else(|| unsafe { self.shared.as_ref() }.and_then(SharedSpill::get));
        if let Some(seg) = seg {
            release(&seg);
            if self.owned {
                self.seg = None;
                super::cleanup::drop_now(&seg);
            }
        }
        self.base = std::ptr::null_mut();
        self.mapped = 0;
        self.bytes = 0;
        if let Counter::Own(v) = &mut self.cursor {
            *v = 0;
        }
    }
}

/// A pin this process holds on a spill segment, and the subtransaction that took it.
struct Held {
    seg: SegRef,
    _pin: Pin<PgEnv>,
    subxact: pg_sys::SubTransactionId,
}

thread_local! {
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

/// Holds `pin` on `seg`, in place of any this process held on it (the new one maps more).
fn hold(seg: SegRef, pin: Pin<PgEnv>) {
    // SAFETY: reads the current subtransaction's id.
    let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
    let old = HELD.with(|h| {
        let mut h = h.borrow_mut();
        let old = h.iter().position(|x| x.seg == seg).map(|i| h.swap_remove(i));
        h.push(Held { seg, _pin: pin, subxact });
        old
    });
    drop(old);
}

/// Gives back this process's pin on `seg`.
pub fn release(seg: &SegRef) {
    release_where(|h| h.seg == *seg);
}

/// Gives back the pins of subtransaction `subxact` and its children (an abort: before the
/// cleanup drops their segments).
pub fn release_from(subxact: pg_sys::SubTransactionId) {
    release_where(|h| h.subxact >= subxact);
}

fn release_where(which: impl Fn(&Held) -> bool) {
    let gone: Vec<Held> = HELD.with(|h| match h.try_borrow_mut() {
        Ok(mut h) => {
            let (gone, keep) = std::mem::take(&mut *h).into_iter().partition(|x| which(x));
            *h = keep;
            gone
        }
        Err(_) => Vec::new(),
    });
    drop(gone);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget takes what fits and nothing past its limit, in this process and shared.
    #[test]
    fn a_counter_takes_what_fits_and_nothing_past_the_limit() {
        let mut own = Counter::Own(0);
        assert_eq!(own.take(6, 10), Some(0));
        assert_eq!(own.take(5, 10), None, "past the limit: nothing taken");
        assert_eq!(own.take(4, 10), Some(6));
        assert_eq!(own.get(), 10);
        let a = AtomicU64::new(0);
        let mut shared = Counter::Shared(&a);
        assert_eq!(shared.take(u64::MAX, 10), None);
        assert_eq!(shared.take(10, 10), Some(0));
        assert_eq!(shared.take(1, 10), None);
        assert_eq!(a.load(Ordering::Relaxed), 10);
        let mut huge = Counter::Own(u64::MAX - 1);
        assert_eq!(huge.take(2, u64::MAX), None, "no overflow");
    }
}
