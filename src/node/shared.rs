//! What the participants of a parallel GpuJoin share: one inner side per query.
//!
//! # Design
//!
//! PostgreSQL's parallel hash join has every participant help build one hash table in the
//! query's dynamic shared memory. GpuJoin does the same with its inner rows: when the inner
//! plan is partial (a parallel scan), every participant that reaches the node while the scan is
//! open joins it, stores its share of the rows, and leaves; the last one to leave builds the
//! table (through the executor: this process or the GPU service, on the CPU or the GPU) from
//! everyone's (key, payload) pairs (a row id, or the probe mode's value) and publishes it; the
//! others sleep on a condition variable until it has. A participant arriving after the scan
//! closed only waits. When the inner plan is not partial, the first participant scans it
//! whole and closes the scan to the others.
//! The table is built by one participant because its inserts are not atomic on the CPU path;
//! the scan, where most of the inner side's time goes, is shared. Where the workers hand their
//! outer keys to the leader (`super::handoff`: they must not start a CUDA context, so they
//! cannot build either), the leader builds: the last worker to leave wakes it
//! ([`Shared::wake`]), and it builds once the phase says every participant has left
//! ([`Shared::awaits_build`]). The pieces:
//!
//! - [`Shared`], in the node's piece of the parallel query's DSM: the phase and the count of
//!   participants scanning (one atomic word, so that "the last one leaves" and "a new one joins"
//!   cannot both win), the condition variable, the table segment (created by the leader when it
//!   sets up the DSM, so that the leader owns it: a worker that built it may exit while others
//!   still probe), counters the participants add their statistics to, and then one `Slot`
//!   per participant (the leader's, then worker `n`'s at `n + 1`): its rows' page lists and its
//!   (key, payload) pairs.
//! - The inner rows, written by each scanning participant ([`RowWriter`]) into pages of the
//!   query's DSA area (`es_query_dsa`, which every participant maps): only the columns the join
//!   uses, each row of a fixed size (a word per column, the value or, for a by-reference type,
//!   the DSA pointer of its bytes, copied beside; then the null flags), so that a row is found
//!   by arithmetic and no tuple is copied or deformed whole. A row id is the participant's slot
//!   above `ROW_BITS` bits and its row number below. They are CPU data (the GPU only sees
//!   keys and row ids), so they live where PostgreSQL keeps a parallel hash join's tuples. The
//!   page lists are trusted (only their participants write them); row ids come from a segment
//!   another process could overwrite, so [`InnerRows::get`] checks each against its slot's rows.
//! - A serial execution stores its rows the same way (slot 0) in a memory context of the node
//!   ([`Arena`]), so the executor code above does not care which.
//! - Each row's (key, payload) pair goes into pages of its own beside the rows, listed in the
//!   slot, read by the builder as slices a page long.
//! - The bytes allocated in the context or the DSA area stay within the node's budget (the hash
//!   memory, times the participants in parallel: `super::spill::Budget`); past it, pages and
//!   values go to the spill segment (`super::spill::Spill`), whose handles carry
//!   [`SPILL_BIT`]. An [`Arena`] resolves both.
//!
//! # Lifecycle
//!
//! `Shared::init` (leader, InitializeDSM) → participants `join` the scan, store their rows,
//! `publish` them to their slot and `leave`; the last one builds the table and wakes the others
//! (`Shared::publish`), a participant that left earlier or came late waits (`wait_built`,
//! `join`) → everyone probes → `Shared::reset` (leader, ReInitializeDSM, before a rescan's
//! workers start) frees every slot's rows and sets the phase back, so the inner side is built
//! again (its parameters may have changed). The DSA area itself goes away with the parallel
//! query.
//!
//! A participant that fails raises its ERROR in its own process; a worker's ERROR reaches the
//! leader (waiting on the condition variable, which checks for interrupts and so for worker
//! messages), whose abort stops every worker. Nobody waits for a build that will not come.

use std::sync::atomic::{AtomicU64, Ordering};

use pgrx::pg_sys;

use super::spill::{Budget, SharedSpill, Spill, SPILL_BIT};
use crate::exec::SegRef;

/// The build's phases, in the high half of [`Shared::sync`]; the low half counts the
/// participants scanning (and holds [`CLOSED`]).
const SCANNING: u64 = 0;
const BUILDING: u64 = 1;
const BUILT: u64 = 2;
/// No more participants may join the scan (set by the one participant that scans a non-partial
/// inner plan whole).
const CLOSED: u64 = 1 << 31;
const ACTIVE: u64 = CLOSED - 1;

/// Row ids: the participant's slot above this many bits, its own row number below.
const ROW_BITS: u32 = 40;

/// The id of the `n`th row stored by the participant in `slot`.
pub fn row_id(slot: u32, n: u64) -> i64 {
    ((u64::from(slot) << ROW_BITS) | n) as i64
}

/// Turns the probe mode's (key, value) pairs of the participant in `slot` back into (key, row
/// id) pairs, where a NULL among the values means the matches must be formed: the `n`th pair
/// is the `n`th row that participant stored.
/// `first`: the number of the first pair of `pairs` (a page of them).
pub fn values_to_row_ids(pairs: &mut [[i64; 2]], slot: u32, first: u64) {
    for (n, pair) in pairs.iter_mut().enumerate() {
        pair[1] = row_id(slot, first + n as u64);
    }
}

/// Bytes of a page of inner rows or of their pairs (a larger value gets an allocation of its
/// own).
const PAGE_BYTES: usize = 1 << 20;

/// (key, payload) pairs per page.
const PAIRS_PER_PAGE: usize = PAGE_BYTES / 16;

/// A participant's part of the inner side, in the DSM (written by that participant only).
#[repr(C)]
#[derive(Clone, Copy)]
struct Slot {
    rows: u64,
    /// DSA array of the row pages' DSA pointers, in row order.
    row_pages: pg_sys::dsa_pointer,
    /// DSA array of `nallocations` DSA pointers: every allocation of the rows (freed by `reset`).
    allocations: pg_sys::dsa_pointer,
    nallocations: u64,
    /// DSA array of the handles of the pages of its `rows` (key, payload) pairs, for the table's
    /// build ([`PAIRS_PER_PAGE`] a page).
    keys: pg_sys::dsa_pointer,
    /// The payloads are the probe mode's values, not row ids (see `GpuJoinScan::drain_into`).
    values: bool,
}

/// The node's shared state, in the parallel query's DSM, followed by one [`Slot`] per
/// participant (the leader's first, then worker `n`'s at `n + 1`).
#[repr(C)]
pub struct Shared {
    sync: AtomicU64,
    cv: pg_sys::ConditionVariable,
    /// The table segment the leader created.
    pub table: SegRef,
    /// The spill segment (`super::spill`), the bytes of the participants' rows and pairs in the
    /// DSA area, and their limit.
    pub spill: SharedSpill,
    pub held: AtomicU64,
    pub budget: u64,
    /// Every participant scans a share of the inner side (a partial inner plan), or the first
    /// one scans it whole.
    partial: bool,
    nslots: u32,
    /// Inner rows with a non-NULL key, and NULL keys, over all participants.
    pub rows: AtomicU64,
    nulls: AtomicU64,
    /// The table's bytes and tier (EXPLAIN ANALYZE).
    pub table_bytes: u64,
    pub tier: u32,
    /// The table's build from the pairs, in the builder (EXPLAIN ANALYZE).
    pub table_build_ns: u64,
    /// The table's payloads are the values of the aggregated inner column, not row ids (the
    /// node's probe mode; set by the builder before it publishes).
    pub payload_values: bool,
    /// Batches probed and executor time, summed over the participants.
    pub batches: AtomicU64,
    pub gpu_ns: AtomicU64,
    /// The longest wait of a participant for the inner side (its scan, the build, or both).
    pub build_ns: AtomicU64,
    /// Batches of outer keys read while the table was being built, summed.
    pub ahead: AtomicU64,
    /// The workers' outer keys handed to the leader, which probes them (`super::handoff`;
    /// off unless the leader set it up so).
    pub handoff: super::handoff::Handoff,
}

/// Tier codes for [`Shared::tier`] (EXPLAIN's "Inner Table Tier").
pub const TIERS: [&str; 4] = ["", "device", "host", "device+host"];

/// A participant's part of the build.
pub enum Role {
    /// This participant scans (its share of) the inner side into its slot, then calls
    /// [`Shared::leave`].
    Scan,
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

/// The DSM bytes of a shared state with `participants` slots.
pub fn shared_bytes(participants: usize) -> usize {
    std::mem::size_of::<Shared>() + participants * std::mem::size_of::<Slot>()
}

/// This process's slot: 0 for the leader (or a serial execution), `n + 1` for worker `n`.
pub fn my_slot() -> u32 {
    // SAFETY: reads a global of this process (-1 outside parallel workers).
    let n = unsafe { pg_sys::ParallelWorkerNumber };
    u32::try_from(n + 1).unwrap_or(0)
}

/// What a participant arriving at sync word `v` does.
#[derive(Debug, PartialEq, Eq)]
enum Joined {
    /// Joins the scan: the word becomes this.
    Scan(u64),
    /// The scan is closed and the table not built yet.
    Wait,
    Built,
}

fn joined(v: u64, partial: bool) -> Joined {
    match v >> 32 {
        BUILT => Joined::Built,
        SCANNING if v & CLOSED == 0 => Joined::Scan((v + 1) | if partial { 0 } else { CLOSED }),
        _ => Joined::Wait,
    }
}

/// The sync word after a participant leaves the scan at `v`, and whether it was the last one
/// (the scan then closes for good: the phase becomes building).
fn left(v: u64) -> (u64, bool) {
    if v & ACTIVE == 1 {
        (BUILDING << 32, true)
    } else {
        (v - 1, false)
    }
}

impl Shared {
    /// Sets up `p` (uninitialized DSM bytes: [`shared_bytes`] of `participants`) for a query
    /// whose table segment is `table`.
    ///
    /// # Safety
    /// `p` points at that many writable bytes of the DSM, suitably aligned.
    /// `leader_probes`: the workers hand their outer keys to the leader, which also builds the
    /// table (`super::handoff`), in batches of at most `batch_keys` keys.
    pub unsafe fn init(p: *mut Shared, table: SegRef, partial: bool, participants: u32, leader_probes: bool, batch_keys: usize) {
        // SAFETY: forwarded contract; the condition variables are initialized in place.
        unsafe {
            std::ptr::write_bytes(p as *mut u8, 0, shared_bytes(participants as usize));
            (*p).table = table;
            (*p).budget = super::spill::hash_memory().saturating_mul(u64::from(participants));
            (*p).partial = partial;
            (*p).nslots = participants;
            pg_sys::ConditionVariableInit(&mut (*p).cv);
            let capacity = super::spill::pending_batches(batch_keys, super::handoff::RING);
            super::handoff::Handoff::init(&mut (*p).handoff, leader_probes, capacity, batch_keys);
        }
    }

    /// Whether the leader builds the table (the workers hand their keys to it).
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`].
    pub unsafe fn leader_builds(p: *mut Shared) -> bool {
        // SAFETY: forwarded contract.
        unsafe { super::handoff::Handoff::is_on(&(*p).handoff) }
    }

    /// Whether every participant left the scan and the table waits for its build (the leader
    /// builds it where [`Shared::leader_builds`]).
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`].
    pub unsafe fn awaits_build(p: *mut Shared) -> bool {
        // SAFETY: forwarded contract.
        unsafe { (*p).sync.load(Ordering::Acquire) >> 32 == BUILDING }
    }

    /// Sleeps (answering interrupts) on the build's condition variable; call in a loop that
    /// checks first, and `crate::pgwait::cancel_sleep` after it.
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`]; the main thread.
    pub unsafe fn sleep(p: *mut Shared) {
        // SAFETY: forwarded contract.
        unsafe { pg_sys::ConditionVariableSleep(&mut (*p).cv, pg_sys::PG_WAIT_EXTENSION) }
    }

    /// Wakes the participants waiting on the build's condition variable (the last worker to
    /// leave the scan wakes the leader, which builds).
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`].
    pub unsafe fn wake(p: *mut Shared) {
        // SAFETY: forwarded contract.
        unsafe { pg_sys::ConditionVariableBroadcast(&mut (*p).cv) }
    }

    /// Slot `i`, if there is one.
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`].
    unsafe fn slot(p: *mut Shared, i: u32) -> Option<*mut Slot> {
        // SAFETY: forwarded contract; the slots follow the header.
        unsafe { (i < (*p).nslots).then(|| (p.add(1) as *mut Slot).add(i as usize)) }
    }

    /// Joins the scan of the inner side while it is open, or waits (answering interrupts) until
    /// the others have built it.
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`]; called on the main thread.
    pub unsafe fn join(p: *mut Shared) -> Role {
        // SAFETY: forwarded contract; the condition variable lives in the DSM.
        unsafe {
            let role = loop {
                match Shared::try_join(p) {
                    Some(role) => break role,
                    // The first call prepares to sleep and returns at once; the loop checks again.
                    None => pg_sys::ConditionVariableSleep(&mut (*p).cv, pg_sys::PG_WAIT_EXTENSION),
                }
            };
            crate::pgwait::cancel_sleep();
            role
        }
    }

    /// [`Shared::join`] without the wait: `None` where `join` would wait (another participant
    /// reads a non-partial inner side, or the last one builds), for a participant with other
    /// work to do meanwhile; it then calls [`Shared::wait_built`], not `leave`.
    ///
    /// # Safety
    /// As for [`Shared::join`].
    pub unsafe fn try_join(p: *mut Shared) -> Option<Role> {
        // SAFETY: forwarded contract.
        unsafe {
            let sync = &(*p).sync;
            loop {
                let v = sync.load(Ordering::Acquire);
                match joined(v, (*p).partial) {
                    Joined::Built => return Some(Role::Built),
                    Joined::Scan(next) => {
                        if sync.compare_exchange(v, next, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                            return Some(Role::Scan);
                        }
                    }
                    Joined::Wait => return None,
                }
            }
        }
    }

    /// Ends this participant's scan; true when it was the last one scanning, which then builds
    /// the table from every slot and calls [`Shared::publish`] (no one joins the scan after).
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`]; this participant joined the scan.
    pub unsafe fn leave(p: *mut Shared) -> bool {
        // SAFETY: forwarded contract.
        let sync = unsafe { &(*p).sync };
        loop {
            let v = sync.load(Ordering::Acquire);
            let (next, last) = left(v);
            if sync.compare_exchange(v, next, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return last;
            }
        }
    }

    /// Waits (answering interrupts) until the last participant to leave the scan has built the
    /// table.
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`]; this participant left the scan; the main thread.
    pub unsafe fn wait_built(p: *mut Shared) {
        // SAFETY: forwarded contract.
        unsafe {
            while !Shared::is_built(p) {
                pg_sys::ConditionVariableSleep(&mut (*p).cv, pg_sys::PG_WAIT_EXTENSION);
            }
            crate::pgwait::cancel_sleep();
        }
    }

    /// Whether the inner side is built (without waiting).
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`].
    pub unsafe fn is_built(p: *mut Shared) -> bool {
        // SAFETY: forwarded contract.
        unsafe { (*p).sync.load(Ordering::Acquire) >> 32 == BUILT }
    }

    /// Makes the built inner side visible and wakes the waiting participants.
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`]; this participant was the last to leave the scan.
    pub unsafe fn publish(p: *mut Shared) {
        // SAFETY: forwarded contract.
        unsafe {
            (*p).sync.store(BUILT << 32, Ordering::Release);
            pg_sys::ConditionVariableBroadcast(&mut (*p).cv);
        }
    }

    /// Every participant's (key, payload) pairs, the NULL keys, and whether the payloads are
    /// values, for the table's build. They are values where every participant's are (the
    /// probe mode, no NULL met by anyone); otherwise the pairs that hold values are turned
    /// back into row ids here, so that every payload is a row id.
    ///
    /// # Safety
    /// `p` is in its building phase (every scan ended); `area` is the query's DSA area; only
    /// the builder calls this, once, and drops the pairs before [`Shared::free_keys`].
    pub unsafe fn keys(p: *mut Shared, arena: Arena) -> (Vec<&'static [[i64; 2]]>, u64, bool) {
        // SAFETY: forwarded contract; each slot's pairs were written by its participant before
        // it left the scan, stay allocated until `free_keys` or `reset`, and no one else reads
        // or writes them now; `arena` maps the spill segment as far as anyone wrote.
        unsafe {
            let mut parts = Vec::new();
            for i in 0..(*p).nslots {
                let s = *Shared::slot(p, i).expect("in range");
                if s.keys != 0 && s.rows > 0 {
                    let list = arena.resolve(s.keys) as *const u64;
                    for (j, first) in (0..s.rows).step_by(PAIRS_PER_PAGE).enumerate() {
                        let k = arena.resolve(*list.add(j)) as *mut [i64; 2];
                        let n = (s.rows - first).min(PAIRS_PER_PAGE as u64) as usize;
                        parts.push((i, first, std::slice::from_raw_parts_mut(k, n), s.values));
                    }
                }
            }
            let values = parts.iter().all(|&(_, _, _, v)| v);
            let parts = parts
                .into_iter()
                .map(|(slot, first, pairs, v)| {
                    if v && !values {
                        values_to_row_ids(pairs, slot, first);
                    }
                    &*pairs
                })
                .collect();
            (parts, (*p).nulls.load(Ordering::Relaxed), values)
        }
    }

    /// Frees every slot's (key, payload) pairs once the table is built from them.
    ///
    /// # Safety
    /// As for [`Shared::keys`]; the slices it gave are no longer used.
    pub unsafe fn free_keys(p: *mut Shared, area: *mut pg_sys::dsa_area) {
        // SAFETY: forwarded contract; only the builder reads the pairs; the pages in the DSA
        // area are freed, those in the spill segment go with it.
        unsafe {
            for i in 0..(*p).nslots {
                let s = Shared::slot(p, i).expect("in range");
                if (*s).keys != 0 {
                    free_pair_pages(area, (*s).keys, (*s).rows);
                    (*s).keys = 0;
                }
            }
        }
    }

    /// Frees the inner side in `area` and sets the state back to scanning (a rescan).
    ///
    /// # Safety
    /// `p` was set up by [`Shared::init`] in `area`'s query; no participant is running.
    pub unsafe fn reset(p: *mut Shared, area: *mut pg_sys::dsa_area) {
        // SAFETY: forwarded contract; the rows' allocations, page lists and pairs were allocated
        // in `area` by the participants and are referenced by nothing once they stopped.
        unsafe {
            for i in 0..(*p).nslots {
                let s = Shared::slot(p, i).expect("in range");
                if !area.is_null() {
                    if (*s).allocations != 0 {
                        let all = pg_sys::dsa_get_address(area, (*s).allocations) as *const pg_sys::dsa_pointer;
                        for j in 0..(*s).nallocations as usize {
                            pg_sys::dsa_free(area, *all.add(j));
                        }
                    }
                    if (*s).keys != 0 {
                        free_pair_pages(area, (*s).keys, (*s).rows);
                        (*s).keys = 0;
                    }
                    for dp in [(*s).allocations, (*s).row_pages] {
                        if dp != 0 {
                            pg_sys::dsa_free(area, dp);
                        }
                    }
                }
                std::ptr::write_bytes(s, 0, 1);
            }
            (*p).rows.store(0, Ordering::Relaxed);
            (*p).nulls.store(0, Ordering::Relaxed);
            (*p).spill.reset();
            (*p).held.store(0, Ordering::Relaxed);
            (*p).table_bytes = 0;
            (*p).tier = 0;
            (*p).table_build_ns = 0;
            (*p).payload_values = false;
            (*p).batches.store(0, Ordering::Relaxed);
            (*p).gpu_ns.store(0, Ordering::Relaxed);
            (*p).build_ns.store(0, Ordering::Relaxed);
            (*p).ahead.store(0, Ordering::Relaxed);
            super::handoff::Handoff::reset(&mut (*p).handoff, area);
            (*p).sync.store(SCANNING << 32, Ordering::Release);
        }
    }
}

/// Where the inner rows' bytes live: the node's memory context (a serial execution) or the
/// query's DSA area (a parallel one), within the node's budget; past it the spill segment
/// (`super::spill`), which `spill` maps here. A handle is the address, the DSA pointer, or
/// [`SPILL_BIT`] and an offset into the spill segment.
#[derive(Clone, Copy)]
pub struct Arena {
    base: Base,
    spill: *mut u8,
}

#[derive(Clone, Copy)]
enum Base {
    Local(pg_sys::MemoryContext),
    Shared(*mut pg_sys::dsa_area),
}

impl Arena {
    /// A serial execution's: `ctx`.
    pub fn local(ctx: pg_sys::MemoryContext) -> Arena {
        Arena { base: Base::Local(ctx), spill: std::ptr::null_mut() }
    }

    /// A parallel one's: the query's DSA area.
    pub fn shared(area: *mut pg_sys::dsa_area) -> Arena {
        Arena { base: Base::Shared(area), spill: std::ptr::null_mut() }
    }

    /// This arena, with the spill segment mapped at `base` in this process.
    pub fn with_spill(self, base: *mut u8) -> Arena {
        Arena { spill: base, ..self }
    }

    /// Allocates `bytes` (MAXALIGNed) in the context or the DSA area: its handle and address.
    ///
    /// # Safety
    /// The context or the area is live.
    unsafe fn alloc(&self, bytes: usize) -> (u64, *mut u8) {
        // SAFETY: forwarded contract.
        unsafe {
            match self.base {
                Base::Local(ctx) => {
                    let p = pg_sys::MemoryContextAllocExtended(ctx, bytes, pg_sys::MCXT_ALLOC_HUGE as i32) as *mut u8;
                    (p as u64, p)
                }
                Base::Shared(area) => {
                    let dp = pg_sys::dsa_allocate_extended(area, bytes, alloc_flags(bytes));
                    (dp, pg_sys::dsa_get_address(area, dp) as *mut u8)
                }
            }
        }
    }

    /// The address of a handle made by [`Arena::alloc`] or by the spill segment (or of a byte
    /// inside that allocation).
    ///
    /// # Safety
    /// `handle` came from this arena and its allocation is live; a spill handle lies in the
    /// spill segment's bytes mapped at `spill`.
    unsafe fn resolve(&self, handle: u64) -> *mut u8 {
        if handle & SPILL_BIT != 0 {
            // SAFETY: forwarded contract.
            return unsafe { self.spill.add((handle & !SPILL_BIT) as usize) };
        }
        match self.base {
            Base::Local(_) => handle as *mut u8,
            // SAFETY: forwarded contract.
            Base::Shared(area) => unsafe { pg_sys::dsa_get_address(area, handle) as *mut u8 },
        }
    }
}

/// Frees the pages of `rows` pairs listed at `list` (a DSA array of their handles) that are in
/// the DSA area, and the list (those in the spill segment go with it).
///
/// # Safety
/// `list` and its DSA pages were allocated in `area` and nothing uses them any more.
unsafe fn free_pair_pages(area: *mut pg_sys::dsa_area, list: pg_sys::dsa_pointer, rows: u64) {
    // SAFETY: forwarded contract: the list holds one handle per page of `rows` pairs.
    unsafe {
        let handles = pg_sys::dsa_get_address(area, list) as *const u64;
        for j in 0..(rows as usize).div_ceil(PAIRS_PER_PAGE) {
            let h = *handles.add(j);
            if h & SPILL_BIT == 0 {
                pg_sys::dsa_free(area, h);
            }
        }
        pg_sys::dsa_free(area, list);
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

/// Writes a participant's inner rows: the columns the join uses, each row of a fixed size,
/// by-reference values copied beside them; and each row's (key, payload) pair, in pages of
/// their own. Within the node's [`Budget`] in its own memory, past it in the spill segment.
pub struct RowWriter {
    arena: Arena,
    budget: Budget,
    spill: Spill,
    cols: Vec<Col>,
    layout: Layout,
    /// Handles of the row pages, in row order.
    pages: Vec<u64>,
    page: *mut u8,
    rows: u64,
    /// Handles of the pair pages, in row order, and the current one.
    pair_pages: Vec<u64>,
    pair_page: *mut [i64; 2],
    /// Handles of every allocation in the context or DSA area but the pair pages (row pages and
    /// value pages), to free them.
    allocations: Vec<u64>,
    blob: (u64, *mut u8),
    blob_used: usize,
    /// This participant's slot: the high bits of its row ids.
    slot: u32,
}

impl RowWriter {
    /// A writer for participant `slot` (0 in a serial execution).
    pub fn new(arena: Arena, cols: &[Col], slot: u32, budget: Budget, spill: Spill) -> RowWriter {
        RowWriter {
            slot,
            arena,
            budget,
            spill,
            cols: cols.to_vec(),
            layout: Layout::of(cols.len()),
            pages: Vec::new(),
            page: std::ptr::null_mut(),
            rows: 0,
            pair_pages: Vec::new(),
            pair_page: std::ptr::null_mut(),
            allocations: Vec::new(),
            blob: (0, std::ptr::null_mut()),
            blob_used: PAGE_BYTES,
        }
    }

    /// Allocates `bytes` (MAXALIGNed): in the context or DSA area within the budget (listed for
    /// freeing unless `pairs`), else in the spill segment. Raises 53200 where this process
    /// cannot spill.
    ///
    /// # Safety
    /// The arena is live.
    unsafe fn alloc(&mut self, bytes: usize, pairs: bool) -> (u64, *mut u8) {
        let need = maxalign(bytes);
        if self.budget.try_take(need as u64) {
            // SAFETY: forwarded contract.
            let (h, p) = unsafe { self.arena.alloc(need) };
            if !pairs {
                self.allocations.push(h);
            }
            return (h, p);
        }
        let got = self.spill.alloc(need).unwrap_or_else(|e| crate::runtime::report(e));
        self.arena = self.arena.with_spill(self.spill.base());
        got
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
                let (h, p) = self.alloc(need, false);
                std::ptr::copy_nonoverlapping(src, p, bytes);
                return h;
            }
            if self.blob_used + need > PAGE_BYTES {
                self.blob = self.alloc(PAGE_BYTES, false);
                self.blob_used = 0;
            }
            std::ptr::copy_nonoverlapping(src, self.blob.1.add(self.blob_used), bytes);
            // A handle plus an offset inside its allocation names that byte.
            let h = self.blob.0 + self.blob_used as u64;
            self.blob_used += need;
            h
        }
    }

    /// Stores a row (one value and null flag per column) and its (key, payload) pair; returns
    /// its row id.
    ///
    /// # Safety
    /// `values` and `nulls` have one entry per column, of the columns' types; the arena is live.
    pub unsafe fn push(&mut self, values: &[pg_sys::Datum], nulls: &[bool]) -> i64 {
        // SAFETY: forwarded contract; the row lies inside its page.
        unsafe {
            let l = self.layout;
            let at = (self.rows % l.rows_per_page as u64) as usize;
            if at == 0 {
                let (h, p) = self.alloc(l.rows_per_page * l.row_bytes, false);
                self.pages.push(h);
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
            if self.rows.is_multiple_of(PAIRS_PER_PAGE as u64) {
                let (h, p) = self.alloc(PAGE_BYTES, true);
                self.pair_pages.push(h);
                self.pair_page = p as *mut [i64; 2];
            }
            self.rows += 1;
            row_id(self.slot, self.rows - 1)
        }
    }

    /// Sets the (key, payload) pair of the row [`RowWriter::push`] stored last.
    pub fn set_pair(&mut self, pair: [i64; 2]) {
        let at = ((self.rows.max(1) - 1) % PAIRS_PER_PAGE as u64) as usize;
        if !self.pair_page.is_null() {
            // SAFETY: `push` made the page, of PAIRS_PER_PAGE pairs, for this row.
            unsafe { self.pair_page.add(at).write(pair) };
        }
    }

    /// The pairs so far, a page at a time.
    ///
    /// # Safety
    /// The arena is live while the slices are used, and nothing pushes meanwhile.
    pub unsafe fn pairs(&mut self) -> Vec<&'static mut [[i64; 2]]> {
        (0..self.rows)
            .step_by(PAIRS_PER_PAGE)
            .zip(&self.pair_pages)
            .map(|(first, &h)| {
                let n = (self.rows - first).min(PAIRS_PER_PAGE as u64) as usize;
                // SAFETY: forwarded contract; page `h` holds pairs `first..first + n`.
                unsafe { std::slice::from_raw_parts_mut(self.arena.resolve(h) as *mut [i64; 2], n) }
            })
            .collect()
    }

    /// Turns the payloads of the pairs so far into row ids (a NULL among the probe mode's values).
    ///
    /// # Safety
    /// As for [`RowWriter::pairs`].
    pub unsafe fn pairs_to_row_ids(&mut self) {
        // SAFETY: forwarded contract.
        for (j, page) in unsafe { self.pairs() }.into_iter().enumerate() {
            values_to_row_ids(page, self.slot, (j * PAIRS_PER_PAGE) as u64);
        }
    }

    /// The participant's slot (the high bits of its row ids).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes in the node's own memory (all participants' in a parallel query), its limit, and
    /// the bytes this participant spilled.
    pub fn memory(&self) -> (u64, u64, u64) {
        (self.budget.used(), self.budget.limit(), self.spill.bytes())
    }

    /// The rows of a serial build, read back in this process, and the spill segment they may
    /// lie in (the node keeps it until End).
    ///
    /// # Safety
    /// The arena is live while the rows are read.
    pub unsafe fn into_local(self) -> (InnerRows, Spill) {
        // SAFETY: forwarded contract.
        let pages = self.pages.iter().map(|&h| unsafe { self.arena.resolve(h) } as *const u8).collect();
        let rows = InnerRows {
            arena: Some(self.arena),
            cols: self.cols,
            layout: Some(self.layout),
            slots: vec![SlotRows { pages, rows: self.rows }],
            total: self.rows,
        };
        (rows, self.spill)
    }

    /// Records this participant's rows, and their (key, payload) pairs for the table (`values`:
    /// the payloads are values, not row ids), in its slot of `p` (a parallel execution); gives
    /// back the spill segment as this process maps it.
    ///
    /// # Safety
    /// `p` is the query's [`Shared`]; this participant joined the scan and has not left it; the
    /// arena is the query's DSA area.
    pub unsafe fn publish(self, p: *mut Shared, nulls: u64, values: bool) -> Spill {
        // SAFETY: forwarded contract; each array is copied into an allocation of its size.
        unsafe {
            let Some(s) = Shared::slot(p, self.slot) else {
                crate::runtime::report(crate::error::UvmError::new(
                    crate::error::Code::SystemError,
                    "GpuJoin: a participant without a slot in the shared state",
                ));
            };
            // The lists themselves (a word per page) stay out of the budget.
            let copy = |v: &[u64]| -> pg_sys::dsa_pointer {
                if v.is_empty() {
                    return 0;
                }
                let (h, dst) = self.arena.alloc(std::mem::size_of_val(v));
                std::ptr::copy_nonoverlapping(v.as_ptr(), dst as *mut u64, v.len());
                h
            };
            (*s).row_pages = copy(&self.pages);
            (*s).allocations = copy(&self.allocations);
            (*s).nallocations = self.allocations.len() as u64;
            (*s).keys = copy(&self.pair_pages);
            (*s).values = values;
            (*s).rows = self.rows;
            (*p).rows.fetch_add(self.rows, Ordering::Relaxed);
            (*p).nulls.fetch_add(nulls, Ordering::Relaxed);
            self.spill
        }
    }
}

/// The stored inner rows a node emits from, by row id.
#[derive(Default)]
pub struct InnerRows {
    arena: Option<Arena>,
    cols: Vec<Col>,
    layout: Option<Layout>,
    /// Per participant's slot: its row pages' addresses in this process, and its rows.
    slots: Vec<SlotRows>,
    /// Rows over all slots (asked at every call of the node's exec).
    total: u64,
}

struct SlotRows {
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
    /// `p` is built; `arena` is the query's attached DSA area, with the spill segment mapped as
    /// far as the participants wrote.
    pub unsafe fn of_shared(p: *mut Shared, arena: Arena, cols: &[Col]) -> InnerRows {
        // SAFETY: forwarded contract: each slot's page list holds one handle per page of its rows.
        unsafe {
            let layout = Layout::of(cols.len());
            let mut slots = Vec::new();
            for i in 0..(*p).nslots {
                let s = *Shared::slot(p, i).expect("in range");
                let rows = if s.row_pages == 0 { 0 } else { s.rows };
                let npages = (rows as usize).div_ceil(layout.rows_per_page);
                let list = if npages == 0 { std::ptr::null() } else { arena.resolve(s.row_pages) as *const u64 };
                let pages = (0..npages).map(|j| arena.resolve(*list.add(j)) as *const u8).collect();
                slots.push(SlotRows { pages, rows });
            }
            let total = slots.iter().map(|s| s.rows).sum();
            InnerRows { arena: Some(arena), cols: cols.to_vec(), layout: Some(layout), slots, total }
        }
    }

    /// Rows over all participants.
    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row `row`, or `None` for an id that names no row (row ids come from a segment another
    /// process could overwrite).
    pub fn get(&self, row: i64) -> Option<RowRef> {
        let l = self.layout?;
        let row = u64::try_from(row).ok()?;
        let slot = self.slots.get(usize::try_from(row >> ROW_BITS).ok()?)?;
        let r = Some(row & ((1 << ROW_BITS) - 1)).filter(|r| *r < slot.rows)? as usize;
        let page = *slot.pages.get(r / l.rows_per_page)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Participants joining and leaving in a given order, as the atomic word sees them.
    #[test]
    fn the_last_to_leave_builds_and_no_one_joins_after() {
        let start = SCANNING << 32;
        // Partial: three join, leave in turn; only the third leaving is the last.
        let mut v = start;
        for _ in 0..3 {
            let Joined::Scan(n) = joined(v, true) else { panic!("could not join at {v:#x}") };
            v = n;
        }
        assert_eq!(v & ACTIVE, 3);
        let (v1, last) = left(v);
        assert!(!last);
        // A fourth may still join while others scan.
        let Joined::Scan(v2) = joined(v1, true) else { panic!("late joiner refused") };
        let (v3, l1) = left(v2);
        let (v4, l2) = left(v3);
        assert!(!l1 && !l2);
        let (v5, l3) = left(v4);
        assert!(l3, "the last one leaving builds");
        assert_eq!(v5 >> 32, BUILDING);
        // After the last left, newcomers wait; once built, they go on.
        assert_eq!(joined(v5, true), Joined::Wait);
        assert_eq!(joined(BUILT << 32, true), Joined::Built);
    }

    #[test]
    fn a_non_partial_inner_side_is_scanned_by_the_first_only() {
        let Joined::Scan(v) = joined(SCANNING << 32, false) else { panic!("the first could not join") };
        assert_eq!(v & ACTIVE, 1);
        assert_ne!(v & CLOSED, 0);
        assert_eq!(joined(v, false), Joined::Wait, "a second participant must not scan it again");
        let (v, last) = left(v);
        assert!(last);
        assert_eq!(v >> 32, BUILDING);
    }

    /// `row_id` (which the probe mode's fallback uses to turn a participant's n-th pair back
    /// into its row id) names the row `InnerRows::get` finds: the slot's n-th row, across page
    /// boundaries, and nothing past a slot's rows.
    #[test]
    fn row_ids_name_the_nth_row_of_their_slot() {
        let l = Layout::of(2);
        let per = l.rows_per_page;
        let pages: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; PAGE_BYTES]).collect();
        let slot_rows = |first: usize, n: usize, rows: u64| SlotRows {
            pages: pages[first..first + n].iter().map(|p| p.as_ptr()).collect(),
            rows,
        };
        let rows = InnerRows {
            arena: None,
            cols: vec![Col { byval: true, len: 8 }; 2],
            layout: Some(l),
            slots: vec![slot_rows(0, 1, 3), slot_rows(1, 3, 2 * per as u64 + 5)],
            total: 3 + 2 * per as u64 + 5,
        };
        let at = |id: i64| rows.get(id).map(|r| r.0 as usize);
        assert_eq!(at(row_id(0, 2)), Some(pages[0].as_ptr() as usize + 2 * l.row_bytes));
        assert_eq!(at(row_id(0, 3)), None, "past slot 0's rows");
        assert_eq!(at(row_id(1, 0)), Some(pages[1].as_ptr() as usize));
        assert_eq!(at(row_id(1, per as u64)), Some(pages[2].as_ptr() as usize), "the first row of the second page");
        assert_eq!(at(row_id(1, 2 * per as u64 + 4)), Some(pages[3].as_ptr() as usize + 4 * l.row_bytes));
        assert_eq!(at(row_id(1, 2 * per as u64 + 5)), None, "past slot 1's rows");
        assert_eq!(at(row_id(2, 0)), None, "no slot 2");
        assert_eq!(at(-1), None);
    }

    #[test]
    fn rows_are_found_by_arithmetic_within_their_page() {
        for n in [0usize, 1, 2, 7, 8, 9, 64] {
            let l = Layout::of(n);
            assert!(l.row_bytes >= 8 * n + n && l.row_bytes.is_multiple_of(8), "{n} columns: {l:?}");
            assert!(l.rows_per_page * l.row_bytes <= PAGE_BYTES);
        }
    }
}
