//! What the participants of a parallel GpuJoin share: one inner side per query.
//!
//! # Design
//!
//! PostgreSQL's parallel hash join has every participant help build one hash table in the
//! query's dynamic shared memory. GpuJoin's table is built by the executor (this process or the
//! GPU service, on the CPU or the GPU) from (key, row id) rows, so one participant builds it
//! and the others wait: the first participant to reach the node claims the build (an atomic
//! state), drains the inner child, and publishes; the others sleep on a condition variable
//! until it has. The pieces:
//!
//! - [`Shared`], in the node's piece of the parallel query's DSM: the build state, the
//!   condition variable, the table segment (created by the leader when it sets up the DSM, so
//!   that the leader owns it: a worker that built it may exit while others still probe), the
//!   inner row directory, and counters the participants add their statistics to.
//! - The inner tuples, written by the builder as `MinimalTuple`s into pages of the query's DSA
//!   area (`es_query_dsa`, which every participant maps), with a directory (row id → DSA
//!   pointer) in the same area. They are CPU data (the GPU only sees keys and row ids), so
//!   they live where PostgreSQL keeps a parallel hash join's tuples. The directory is trusted
//!   (only the builder writes it); row ids come from a segment another process could
//!   overwrite, so [`InnerRows::get`] checks each against the row count.
//! - [`InnerRows`] reads a row either from the backend's own memory (a serial execution) or
//!   from the DSA (a parallel one), so the executor code above does not care which.
//!
//! # Lifecycle
//!
//! `Shared::init` (leader, InitializeDSM) → a participant claims the build, the others wait →
//! [`RowWriter`] writes the rows, `Shared::publish` wakes the others → everyone probes →
//! `Shared::reset` (leader, ReInitializeDSM, before a rescan's workers start) frees the pages
//! and the directory and sets the state back, so the inner side is built again (its parameters
//! may have changed). The DSA area itself goes away with the parallel query.
//!
//! A builder that fails raises its ERROR in its own process; a worker's ERROR reaches the leader
//! (waiting on the condition variable, which checks for interrupts and so for worker messages),
//! whose abort stops every worker. Nobody waits for a build that will not come.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;

use crate::exec::SegRef;

const UNBUILT: u32 = 0;
const BUILDING: u32 = 1;
const BUILT: u32 = 2;

/// Bytes of a DSA page of inner tuples (a larger tuple gets an allocation of its own).
const PAGE_BYTES: usize = 1 << 20;

/// The node's shared state, in the parallel query's DSM.
#[repr(C)]
pub struct Shared {
    state: AtomicU32,
    cv: pg_sys::ConditionVariable,
    /// The table segment the leader created.
    pub table: SegRef,
    /// Inner rows with a non-NULL key (row ids are 0..rows).
    pub rows: u64,
    /// DSA array of `rows` DSA pointers, one per inner tuple.
    dir: pg_sys::dsa_pointer,
    /// DSA array of `npages` DSA pointers: every allocation holding tuples (freed by `reset`).
    pages: pg_sys::dsa_pointer,
    npages: u64,
    /// The table's bytes and tier (EXPLAIN ANALYZE).
    pub table_bytes: u64,
    pub tier: u32,
    /// Batches probed and executor time, summed over the participants.
    pub batches: AtomicU64,
    pub gpu_ns: AtomicU64,
}

/// Tier codes for [`Shared::tier`] (EXPLAIN's "Inner Table Tier").
pub const TIERS: [&str; 4] = ["", "device", "host", "device+host"];

/// A participant's part of the build.
pub enum Role {
    /// This participant builds the inner side, then calls [`Shared::publish`].
    Build,
    /// The inner side is built.
    Built,
}

/// PostgreSQL's MaxAllocSize (a macro the bindings lack): larger allocations need DSA_ALLOC_HUGE.
const MAX_ALLOC_SIZE: usize = 0x3fff_ffff;

/// MAXALIGN.
fn maxalign(n: usize) -> usize {
    (n + 7) & !7
}

/// DSA allocation flags for `bytes` (allowing more than 1 GB).
fn alloc_flags(bytes: usize) -> i32 {
    if bytes > MAX_ALLOC_SIZE {
        pg_sys::DSA_ALLOC_HUGE as i32
    } else {
        0
    }
}

impl Shared {
    /// Sets up `p` (uninitialized DSM bytes) for a query whose table segment is `table`.
    ///
    /// # Safety
    /// `p` points at `size_of::<Shared>()` writable bytes of the DSM, suitably aligned.
    pub unsafe fn init(p: *mut Shared, table: SegRef) {
        // SAFETY: forwarded contract; the condition variable is initialized in place.
        unsafe {
            std::ptr::write_bytes(p as *mut u8, 0, std::mem::size_of::<Shared>());
            (*p).table = table;
            pg_sys::ConditionVariableInit(&mut (*p).cv);
        }
    }

    /// Claims the build, or waits (answering interrupts) until another participant has built.
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`]; called on the main thread.
    pub unsafe fn claim_or_wait(p: *mut Shared) -> Role {
        // SAFETY: forwarded contract; the condition variable lives in the DSM.
        unsafe {
            let role = loop {
                match (*p).state.load(Ordering::Acquire) {
                    BUILT => break Role::Built,
                    UNBUILT if (*p).state.compare_exchange(UNBUILT, BUILDING, Ordering::AcqRel, Ordering::Acquire).is_ok() => {
                        break Role::Build
                    }
                    // The first call prepares to sleep and returns at once; the loop checks again.
                    _ => pg_sys::ConditionVariableSleep(&mut (*p).cv, pg_sys::PG_WAIT_EXTENSION),
                }
            };
            #[allow(clippy::let_unit_value)]
            let _ = pg_sys::ConditionVariableCancelSleep();
            role
        }
    }

    /// Makes the built inner side visible and wakes the waiting participants.
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`]; this participant claimed the build.
    pub unsafe fn publish(p: *mut Shared) {
        // SAFETY: forwarded contract.
        unsafe {
            (*p).state.store(BUILT, Ordering::Release);
            pg_sys::ConditionVariableBroadcast(&mut (*p).cv);
        }
    }

    /// Frees the inner side in `area` and sets the state back to unbuilt (a rescan).
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`] in `area`'s query; no participant is running.
    pub unsafe fn reset(p: *mut Shared, area: *mut pg_sys::dsa_area) {
        // SAFETY: forwarded contract; the pages and the directory were allocated in `area` by
        // the builder and are referenced by nothing once the participants stopped.
        unsafe {
            if !area.is_null() {
                if (*p).pages != 0 {
                    let pages = pg_sys::dsa_get_address(area, (*p).pages) as *const pg_sys::dsa_pointer;
                    for i in 0..(*p).npages as usize {
                        pg_sys::dsa_free(area, *pages.add(i));
                    }
                    pg_sys::dsa_free(area, (*p).pages);
                }
                if (*p).dir != 0 {
                    pg_sys::dsa_free(area, (*p).dir);
                }
            }
            (*p).dir = 0;
            (*p).pages = 0;
            (*p).npages = 0;
            (*p).rows = 0;
            (*p).table_bytes = 0;
            (*p).tier = 0;
            (*p).batches.store(0, Ordering::Relaxed);
            (*p).gpu_ns.store(0, Ordering::Relaxed);
            (*p).state.store(UNBUILT, Ordering::Release);
        }
    }
}

/// Writes inner tuples into DSA pages (the builder).
pub struct RowWriter {
    area: *mut pg_sys::dsa_area,
    allocations: Vec<pg_sys::dsa_pointer>,
    dir: Vec<pg_sys::dsa_pointer>,
    page: pg_sys::dsa_pointer,
    base: *mut u8,
    used: usize,
}

impl RowWriter {
    pub fn new(area: *mut pg_sys::dsa_area) -> RowWriter {
        RowWriter { area, allocations: Vec::new(), dir: Vec::new(), page: 0, base: std::ptr::null_mut(), used: PAGE_BYTES }
    }

    /// Copies `mt` into the area; returns its row id.
    ///
    /// # Safety
    /// `mt` is a valid minimal tuple; the area is attached.
    pub unsafe fn push(&mut self, mt: pg_sys::MinimalTuple) -> i64 {
        // SAFETY: forwarded contract; every copy stays inside the allocation it was given.
        unsafe {
            let len = (*mt).t_len as usize;
            let need = maxalign(len);
            let dp = if need > PAGE_BYTES / 4 {
                let dp = pg_sys::dsa_allocate_extended(self.area, need, alloc_flags(need));
                self.allocations.push(dp);
                std::ptr::copy_nonoverlapping(mt as *const u8, pg_sys::dsa_get_address(self.area, dp) as *mut u8, len);
                dp
            } else {
                if self.used + need > PAGE_BYTES {
                    self.page = pg_sys::dsa_allocate_extended(self.area, PAGE_BYTES, 0);
                    self.allocations.push(self.page);
                    self.base = pg_sys::dsa_get_address(self.area, self.page) as *mut u8;
                    self.used = 0;
                }
                std::ptr::copy_nonoverlapping(mt as *const u8, self.base.add(self.used), len);
                // A DSA pointer plus an offset inside its allocation points at that byte.
                let dp = self.page + self.used as u64;
                self.used += need;
                dp
            };
            self.dir.push(dp);
            (self.dir.len() - 1) as i64
        }
    }

    pub fn rows(&self) -> u64 {
        self.dir.len() as u64
    }

    /// Writes the directory and the allocation list into the area and records them in `p`.
    ///
    /// # Safety
    /// `p` is the query's [`Shared`]; this participant claimed the build.
    pub unsafe fn finish(self, p: *mut Shared) {
        // SAFETY: forwarded contract; each array is copied into an allocation of its size.
        unsafe {
            let copy = |v: &[pg_sys::dsa_pointer]| -> pg_sys::dsa_pointer {
                if v.is_empty() {
                    return 0;
                }
                let bytes = std::mem::size_of_val(v);
                let dp = pg_sys::dsa_allocate_extended(self.area, bytes, alloc_flags(bytes));
                std::ptr::copy_nonoverlapping(
                    v.as_ptr(),
                    pg_sys::dsa_get_address(self.area, dp) as *mut pg_sys::dsa_pointer,
                    v.len(),
                );
                dp
            };
            (*p).dir = copy(&self.dir);
            (*p).pages = copy(&self.allocations);
            (*p).npages = self.allocations.len() as u64;
            (*p).rows = self.dir.len() as u64;
        }
    }
}

/// The inner tuples a node emits from, by row id.
pub enum InnerRows {
    /// A serial execution: tuples in the node's memory context.
    Local(Vec<pg_sys::MinimalTuple>),
    /// A parallel one: tuples in the query's DSA area.
    Shared { area: *mut pg_sys::dsa_area, dir: *const pg_sys::dsa_pointer, rows: u64 },
}

impl Default for InnerRows {
    fn default() -> Self {
        InnerRows::Local(Vec::new())
    }
}

impl InnerRows {
    /// The rows of the query's shared state.
    ///
    /// # Safety
    /// `p` is built; `area` is the query's attached DSA area.
    pub unsafe fn of_shared(p: *const Shared, area: *mut pg_sys::dsa_area) -> InnerRows {
        // SAFETY: forwarded contract.
        unsafe {
            let dir = if (*p).dir == 0 {
                std::ptr::null()
            } else {
                pg_sys::dsa_get_address(area, (*p).dir) as *const pg_sys::dsa_pointer
            };
            InnerRows::Shared { area, dir, rows: if dir.is_null() { 0 } else { (*p).rows } }
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            InnerRows::Local(v) => v.len() as u64,
            InnerRows::Shared { rows, .. } => *rows,
        }
    }

    /// The tuple of row `row`, or `None` for an id that names no row (untrusted input).
    pub fn get(&self, row: i64) -> Option<pg_sys::MinimalTuple> {
        match self {
            InnerRows::Local(v) => usize::try_from(row).ok().and_then(|r| v.get(r).copied()),
            InnerRows::Shared { area, dir, rows } => {
                let r = u64::try_from(row).ok().filter(|r| r < rows)?;
                // SAFETY: `r` is below the directory's length; the directory and the tuples stay
                // allocated in the attached area until the query's participants stop.
                Some(unsafe { pg_sys::dsa_get_address(*area, *dir.add(r as usize)) as pg_sys::MinimalTuple })
            }
        }
    }
}
