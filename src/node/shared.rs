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
//!   inner rows' page lists, and counters the participants add their statistics to.
//! - The inner rows, written by the builder ([`RowWriter`]) into pages of the query's DSA area
//!   (`es_query_dsa`, which every participant maps): only the columns the join uses, each row
//!   of a fixed size (a word per column, the value or, for a by-reference type, the DSA
//!   pointer of its bytes, copied beside; then the null flags), so that row `r` is found by
//!   arithmetic and no tuple is copied or deformed whole. They are CPU data (the GPU only sees
//!   keys and row ids), so they live where PostgreSQL keeps a parallel hash join's tuples. The
//!   page list is trusted (only the builder writes it); row ids come from a segment another
//!   process could overwrite, so [`InnerRows::get`] checks each against the row count.
//! - A serial execution stores its rows the same way in a memory context of the node
//!   ([`Arena`]), so the executor code above does not care which.
//!
//! # Lifecycle
//!
//! `Shared::init` (leader, InitializeDSM) → a participant claims the build, the others wait →
//! [`RowWriter`] writes the rows, `Shared::publish` wakes the others → everyone probes →
//! `Shared::reset` (leader, ReInitializeDSM, before a rescan's workers start) frees the pages
//! and the page lists and sets the state back, so the inner side is built again (its parameters
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
    /// DSA array of the row pages' DSA pointers, in row order.
    row_pages: pg_sys::dsa_pointer,
    /// DSA array of `nallocations` DSA pointers: every allocation of the rows (freed by `reset`).
    allocations: pg_sys::dsa_pointer,
    nallocations: u64,
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
        // SAFETY: forwarded contract; the rows' allocations and page lists were allocated in `area` by
        // the builder and are referenced by nothing once the participants stopped.
        unsafe {
            if !area.is_null() {
                if (*p).allocations != 0 {
                    let all = pg_sys::dsa_get_address(area, (*p).allocations) as *const pg_sys::dsa_pointer;
                    for i in 0..(*p).nallocations as usize {
                        pg_sys::dsa_free(area, *all.add(i));
                    }
                    pg_sys::dsa_free(area, (*p).allocations);
                }
                if (*p).row_pages != 0 {
                    pg_sys::dsa_free(area, (*p).row_pages);
                }
            }
            (*p).row_pages = 0;
            (*p).allocations = 0;
            (*p).nallocations = 0;
            (*p).rows = 0;
            (*p).table_bytes = 0;
            (*p).tier = 0;
            (*p).batches.store(0, Ordering::Relaxed);
            (*p).gpu_ns.store(0, Ordering::Relaxed);
            (*p).state.store(UNBUILT, Ordering::Release);
        }
    }
}

/// Where the inner rows' bytes live: the node's memory context (a serial execution) or the
/// query's DSA area (a parallel one). A handle is the address, or the DSA pointer.
#[derive(Clone, Copy)]
pub enum Arena {
    Local(pg_sys::MemoryContext),
    Shared(*mut pg_sys::dsa_area),
}

impl Arena {
    /// Allocates `bytes` (MAXALIGNed): its handle and address.
    ///
    /// # Safety
    /// The context or the area is live.
    unsafe fn alloc(&self, bytes: usize) -> (u64, *mut u8) {
        // SAFETY: forwarded contract.
        unsafe {
            match *self {
                Arena::Local(ctx) => {
                    let p = pg_sys::MemoryContextAllocExtended(ctx, bytes, pg_sys::MCXT_ALLOC_HUGE as i32) as *mut u8;
                    (p as u64, p)
                }
                Arena::Shared(area) => {
                    let dp = pg_sys::dsa_allocate_extended(area, bytes, alloc_flags(bytes));
                    (dp, pg_sys::dsa_get_address(area, dp) as *mut u8)
                }
            }
        }
    }

    /// The address of a handle made by [`Arena::alloc`] (or of a byte inside that allocation).
    ///
    /// # Safety
    /// `handle` came from this arena and its allocation is live.
    unsafe fn resolve(&self, handle: u64) -> *mut u8 {
        match *self {
            Arena::Local(_) => handle as *mut u8,
            // SAFETY: forwarded contract.
            Arena::Shared(area) => unsafe { pg_sys::dsa_get_address(area, handle) as *mut u8 },
        }
    }
}

/// An inner column the node keeps: how its values are passed.
#[derive(Clone, Copy, Debug)]
pub struct Col {
    pub byval: bool,
    pub len: i16,
}

/// The fixed layout of a stored inner row of `n` columns: `n` 8-byte words (the value, or the
/// handle of its bytes for a by-reference type), then `n` null flags, padded to 8 bytes.
#[derive(Clone, Copy, Debug)]
struct Layout {
    n: usize,
    row_bytes: usize,
    rows_per_page: usize,
}

impl Layout {
    fn of(n: usize) -> Layout {
        let row_bytes = (8 * n + maxalign(n)).max(8);
        Layout { n, row_bytes, rows_per_page: (PAGE_BYTES / row_bytes).max(1) }
    }
}

/// The bytes of a by-reference value, inline: a varlena pointing elsewhere (an expanded object,
/// an indirect pointer) is flattened first; an on-disk TOAST pointer is kept as it is (it names
/// a row of the TOAST table, readable by every participant of the query).
///
/// # Safety
/// `v` is a non-NULL datum of a by-reference type of length `len`.
unsafe fn value_bytes(v: pg_sys::Datum, len: i16) -> (*const u8, usize) {
    // SAFETY: forwarded contract; a varlena's header says how long it is.
    unsafe {
        let p = v.cast_mut_ptr::<u8>();
        match len {
            -1 => {
                let mut p = p;
                // VARATT_IS_1B_E with a tag other than VARTAG_ONDISK (18).
                if *p == 0x01 && *p.add(1) != 18 {
                    p = pg_sys::pg_detoast_datum_copy(p as *mut pg_sys::varlena) as *mut u8;
                }
                (p, pgrx::varlena::varsize_any(p as *const pg_sys::varlena))
            }
            -2 => (p, std::ffi::CStr::from_ptr(p as *const std::ffi::c_char).to_bytes_with_nul().len()),
            n => (p, n.max(0) as usize),
        }
    }
}

/// Writes the inner rows (the builder): the columns the join uses, each row of a fixed size,
/// by-reference values copied beside them.
pub struct RowWriter {
    arena: Arena,
    cols: Vec<Col>,
    layout: Layout,
    /// Handles of the row pages, in row order.
    pages: Vec<u64>,
    page: *mut u8,
    rows: u64,
    /// Handles of every allocation (row pages and value pages), to free them.
    allocations: Vec<u64>,
    blob: (u64, *mut u8),
    blob_used: usize,
}

impl RowWriter {
    pub fn new(arena: Arena, cols: &[Col]) -> RowWriter {
        RowWriter {
            arena,
            cols: cols.to_vec(),
            layout: Layout::of(cols.len()),
            pages: Vec::new(),
            page: std::ptr::null_mut(),
            rows: 0,
            allocations: Vec::new(),
            blob: (0, std::ptr::null_mut()),
            blob_used: PAGE_BYTES,
        }
    }

    /// Copies `bytes` into the value pages; returns the handle of the copy.
    ///
    /// # Safety
    /// `src` holds `bytes` readable bytes; the arena is live.
    unsafe fn copy_value(&mut self, src: *const u8, bytes: usize) -> u64 {
        // SAFETY: forwarded contract; every copy stays inside the allocation it was given.
        unsafe {
            let need = maxalign(bytes);
            if need > PAGE_BYTES / 4 {
                let (h, p) = self.arena.alloc(need);
                self.allocations.push(h);
                std::ptr::copy_nonoverlapping(src, p, bytes);
                return h;
            }
            if self.blob_used + need > PAGE_BYTES {
                self.blob = self.arena.alloc(PAGE_BYTES);
                self.allocations.push(self.blob.0);
                self.blob_used = 0;
            }
            std::ptr::copy_nonoverlapping(src, self.blob.1.add(self.blob_used), bytes);
            // A DSA pointer (or an address) plus an offset inside its allocation names that byte.
            let h = self.blob.0 + self.blob_used as u64;
            self.blob_used += need;
            h
        }
    }

    /// Stores a row (one value and null flag per column); returns its row id.
    ///
    /// # Safety
    /// `values` and `nulls` have one entry per column, of the columns' types; the arena is live.
    pub unsafe fn push(&mut self, values: &[pg_sys::Datum], nulls: &[bool]) -> i64 {
        // SAFETY: forwarded contract; the row lies inside its page.
        unsafe {
            let l = self.layout;
            let at = (self.rows % l.rows_per_page as u64) as usize;
            if at == 0 {
                let (h, p) = self.arena.alloc(l.rows_per_page * l.row_bytes);
                self.pages.push(h);
                self.allocations.push(h);
                self.page = p;
            }
            let row = self.page.add(at * l.row_bytes);
            for i in 0..l.n {
                let c = self.cols[i];
                let word = if nulls[i] {
                    0
                } else if c.byval {
                    values[i].value() as u64
                } else {
                    let (src, bytes) = value_bytes(values[i], c.len);
                    self.copy_value(src, bytes)
                };
                (row as *mut u64).add(i).write(word);
                row.add(8 * l.n + i).write(u8::from(nulls[i]));
            }
            self.rows += 1;
            (self.rows - 1) as i64
        }
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The rows of a serial build, read back in this process.
    ///
    /// # Safety
    /// The arena is live while the rows are read.
    pub unsafe fn into_local(self) -> InnerRows {
        // SAFETY: forwarded contract.
        let pages = self.pages.iter().map(|&h| unsafe { self.arena.resolve(h) } as *const u8).collect();
        InnerRows { arena: Some(self.arena), cols: self.cols, layout: Some(self.layout), pages, rows: self.rows }
    }

    /// Writes the page lists into the area and records them in `p` (a parallel build).
    ///
    /// # Safety
    /// `p` is the query's [`Shared`]; this participant claimed the build; the arena is the
    /// query's DSA area.
    pub unsafe fn publish(self, p: *mut Shared) {
        // SAFETY: forwarded contract; each array is copied into an allocation of its size.
        unsafe {
            let copy = |v: &[u64]| -> pg_sys::dsa_pointer {
                if v.is_empty() {
                    return 0;
                }
                let (h, dst) = self.arena.alloc(std::mem::size_of_val(v));
                std::ptr::copy_nonoverlapping(v.as_ptr(), dst as *mut u64, v.len());
                h
            };
            (*p).row_pages = copy(&self.pages);
            (*p).allocations = copy(&self.allocations);
            (*p).nallocations = self.allocations.len() as u64;
            (*p).rows = self.rows;
        }
    }
}

/// The stored inner rows a node emits from, by row id.
#[derive(Default)]
pub struct InnerRows {
    arena: Option<Arena>,
    cols: Vec<Col>,
    layout: Option<Layout>,
    /// The row pages' addresses in this process.
    pages: Vec<*const u8>,
    rows: u64,
}

/// A stored row (valid while its [`InnerRows`] is).
#[derive(Clone, Copy)]
pub struct RowRef(*const u8);

impl InnerRows {
    /// The rows of the query's shared state, with the plan's inner columns.
    ///
    /// # Safety
    /// `p` is built; `area` is the query's attached DSA area.
    pub unsafe fn of_shared(p: *const Shared, area: *mut pg_sys::dsa_area, cols: &[Col]) -> InnerRows {
        // SAFETY: forwarded contract: the page list holds one handle per page of `rows` rows.
        unsafe {
            let layout = Layout::of(cols.len());
            let arena = Arena::Shared(area);
            let rows = if (*p).row_pages == 0 { 0 } else { (*p).rows };
            let npages = (rows as usize).div_ceil(layout.rows_per_page);
            let list = if npages == 0 { std::ptr::null() } else { arena.resolve((*p).row_pages) as *const u64 };
            let pages = (0..npages).map(|i| arena.resolve(*list.add(i)) as *const u8).collect();
            InnerRows { arena: Some(arena), cols: cols.to_vec(), layout: Some(layout), pages, rows }
        }
    }

    pub fn len(&self) -> u64 {
        self.rows
    }

    /// Row `row`, or `None` for an id that names no row (row ids come from a segment another
    /// process could overwrite).
    pub fn get(&self, row: i64) -> Option<RowRef> {
        let l = self.layout?;
        let r = u64::try_from(row).ok().filter(|r| *r < self.rows)? as usize;
        let page = *self.pages.get(r / l.rows_per_page)?;
        // SAFETY: the row lies inside its page (rows_per_page rows of row_bytes each).
        Some(RowRef(unsafe { page.add((r % l.rows_per_page) * l.row_bytes) }))
    }

    /// Column `i` of `row` as a datum (by-reference values point into the arena).
    pub fn value(&self, row: RowRef, i: usize) -> (pg_sys::Datum, bool) {
        let (Some(l), Some(arena), Some(c)) = (self.layout, self.arena, self.cols.get(i)) else {
            return (pg_sys::Datum::from(0), true);
        };
        // SAFETY: `row` came from `get` on these rows; `i` is one of its columns; a
        // by-reference value's handle was written by the builder into this arena.
        unsafe {
            if *row.0.add(8 * l.n + i) != 0 {
                return (pg_sys::Datum::from(0), true);
            }
            let word = (row.0 as *const u64).add(i).read();
            if c.byval {
                (pg_sys::Datum::from(word as usize), false)
            } else {
                (pg_sys::Datum::from(arena.resolve(word)), false)
            }
        }
    }
}
