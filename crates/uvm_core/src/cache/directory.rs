//! The cache directory: which tables of which database have a column cache, in what state, and
//! for which snapshots it is current. One fixed array of [`MAX_CACHES`] slots in shared memory,
//! read and written with atomics only, so that the check every write makes ("is this table
//! cached?") costs a few loads and takes no lock.
//!
//! # A slot's life
//!
//! ```text
//!   Free --claim--> (Claiming) Building --publish--> Ready --mark_stale--> Stale
//!     ^                |                    |                     |
//!     |                +-----abandon--------+------retire---------+--> Dropping --free--> Free
//! ```
//!
//! - **claim**: a builder takes a free slot for (database, table), compare-and-swap on the
//!   state, so two builders never share one. The extension serialises builders of one table
//!   with a table lock (`ShareRowExclusiveLock`, which also keeps writers out during the
//!   build), and [`Directory::claim`] refuses a second live slot of the same table anyway.
//! - **publish**: the build is complete; the slot records the snapshot it is current for and
//!   becomes `Ready`. A build that lost a race with a writer's mark (`Building -> Stale`)
//!   publishes nothing and stays `Stale`.
//! - **mark_stale**: a writer, before it changes the table, moves `Ready` (or `Building`) to
//!   `Stale`. The mark is not transactional: a writer that aborts leaves the cache stale, which
//!   costs a rebuild, never a wrong answer.
//! - **retire** and **free**: dropping a cache moves it to `Dropping` (no reader starts on it
//!   any more), the extension drops its segment, and the slot becomes `Free`.
//!
//! Each claim takes a fresh generation from the directory's counter; it names the cache's
//! segment and is written into the cache's header, so a reader that found a slot `Ready` at
//! generation g and then reads a segment of another generation knows the cache moved under it.
//!
//! # When a reader may use a cache
//!
//! The extension checks, with the reader's snapshot already taken: the slot is `Ready`, the
//! snapshot's `xmin` follows or equals the build's `xmax` (every transaction the build could
//! not see has ended for the reader), and the builder's own transaction, if it had an xid,
//! committed: the builder's commit callback clears the xid ([`Directory::settle_builder`]), its
//! abort callback marks the cache stale, so a reader never asks the commit log about a
//! transaction that may be older than the log's horizon. A writer marks the slot stale before it writes, so a reader that still sees
//! `Ready` after taking its snapshot took it before any later write committed: the cache holds
//! exactly what that snapshot sees of the table. The comparisons of transaction ids are
//! PostgreSQL's and stay in the extension; this module stores the numbers.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering::SeqCst};

use crate::error::{Code, Result, UvmError};

/// Caches a cluster holds at most.
pub const MAX_CACHES: usize = 64;
/// Databases whose stale caches a background refresher rebuilds at once, at most.
pub const MAX_REFRESHERS: usize = 16;
/// Transactions that may have appended to one cache's tail and not yet settled, at most (one
/// more appender marks the cache stale instead).
pub const MAX_PENDING: usize = 32;

crate::wire_enum! {
    /// A slot's state (the module's diagram).
    pub enum State: u32 {
        Free = 0,
        Building = 1,
        Ready = 2,
        Stale = 3,
        Dropping = 4,
        /// A claim filling the slot's fields (nobody else reads them yet).
        Claiming = 5,
    }
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Free => "free",
            State::Building => "building",
            State::Ready => "ready",
            State::Stale => "stale",
            State::Dropping => "dropping",
            State::Claiming => "claiming",
        }
    }
}

/// One slot, in shared memory.
#[derive(Default)]
#[repr(C)]
pub struct Slot {
    state: AtomicU32,
    database: AtomicU32,
    relation: AtomicU32,
    columns: AtomicU32,
    generation: AtomicU64,
    /// The build's snapshot `xmax` (a 32-bit transaction id, widened).
    built_xmax: AtomicU64,
    /// The builder's top transaction id, 0 if it had none.
    builder_xid: AtomicU64,
    built_at: AtomicI64,
    last_used: AtomicI64,
    rows: AtomicU64,
    bytes: AtomicU64,
    /// The role that built it (for the view).
    builder: AtomicU32,
    /// The parallel workers that built it beside the builder (for the view).
    workers: AtomicU32,
    _pad: AtomicU32,
    /// When it went stale (a refresher rebuilds it `cache_refresh_delay` later), or when a
    /// refresher should try again.
    stale_since: AtomicI64,
    /// Rows the cache's append tail holds at most (0: it has none, so inserts mark it stale).
    tail_capacity: AtomicU64,
    /// Rows of the tail handed out to appenders ([`Directory::reserve_tail`]).
    tail_rows: AtomicU64,
    /// The top transaction ids that appended and have not settled (0: a free entry).
    pending: [AtomicU32; MAX_PENDING],
}

/// The directory's header and slots, in shared memory.
#[repr(C)]
pub struct Directory {
    next_generation: AtomicU64,
    slots: [Slot; MAX_CACHES],
    /// The databases whose background refresher runs (0: a free entry).
    refreshers: [Refresher; MAX_REFRESHERS],
}

/// One database's background refresher: claimed by the backend that launches it, its pid set
/// by the worker once it runs.
#[derive(Default)]
#[repr(C)]
struct Refresher {
    database: AtomicU32,
    pid: AtomicU32,
    claimed_at: AtomicI64,
}

/// What a slot held when it was read (one load per field; fields read while the slot moves may
/// disagree, which is why a reader re-checks the state and the generation before and after).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub slot: usize,
    pub state: State,
    pub database: u32,
    pub relation: u32,
    pub columns: u32,
    pub generation: u64,
    pub built_xmax: u64,
    pub builder_xid: u64,
    pub built_at: i64,
    pub last_used: i64,
    pub rows: u64,
    pub bytes: u64,
    pub builder: u32,
    pub workers: u32,
    pub stale_since: i64,
    pub tail_capacity: u64,
    pub tail_rows: u64,
}

/// What a builder publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Built {
    pub columns: u32,
    pub built_xmax: u64,
    pub builder_xid: u64,
    pub built_at: i64,
    pub rows: u64,
    pub bytes: u64,
    /// The parallel workers that filled blocks beside the builder.
    pub workers: u32,
    /// Rows its append tail holds (0: no tail).
    pub tail_capacity: u64,
}

impl Directory {
    pub const fn size() -> usize {
        std::mem::size_of::<Directory>()
    }

    /// Empties the directory: every slot `Free`, the next generation 1. The extension calls it
    /// once on the block's fresh shared memory (after a crash-restart too, when every cache is
    /// gone with the segments).
    pub fn reset(&self) {
        self.next_generation.store(1, SeqCst);
        for s in &self.slots {
            for f in [&s.state, &s.database, &s.relation, &s.columns, &s.builder, &s.workers] {
                f.store(0, SeqCst);
            }
            for f in [&s.generation, &s.built_xmax, &s.builder_xid, &s.rows, &s.bytes] {
                f.store(0, SeqCst);
            }
            s.built_at.store(0, SeqCst);
            s.last_used.store(0, SeqCst);
            s.stale_since.store(0, SeqCst);
            s.clear_tail();
        }
        for r in &self.refreshers {
            r.database.store(0, SeqCst);
            r.pid.store(0, SeqCst);
        }
    }

    /// An empty directory in this process's memory (tests; the extension's lives in shared
    /// memory).
    pub fn boxed() -> Box<Directory> {
        let d = Box::new(Directory {
            next_generation: AtomicU64::new(1),
            slots: std::array::from_fn(|_| Slot::default()),
            refreshers: std::array::from_fn(|_| Refresher::default()),
        });
        d.reset();
        d
    }

    fn entry(&self, i: usize) -> Entry {
        let s = &self.slots[i];
        Entry {
            slot: i,
            state: State::from_repr(s.state.load(SeqCst)).unwrap_or(State::Stale),
            database: s.database.load(SeqCst),
            relation: s.relation.load(SeqCst),
            columns: s.columns.load(SeqCst),
            generation: s.generation.load(SeqCst),
            built_xmax: s.built_xmax.load(SeqCst),
            builder_xid: s.builder_xid.load(SeqCst),
            built_at: s.built_at.load(SeqCst),
            last_used: s.last_used.load(SeqCst),
            rows: s.rows.load(SeqCst),
            bytes: s.bytes.load(SeqCst),
            builder: s.builder.load(SeqCst),
            workers: s.workers.load(SeqCst),
            stale_since: s.stale_since.load(SeqCst),
            tail_capacity: s.tail_capacity.load(SeqCst),
            tail_rows: s.tail_rows.load(SeqCst),
        }
    }

    /// Every slot not `Free` (nor being claimed).
    pub fn list(&self) -> Vec<Entry> {
        (0..MAX_CACHES).map(|i| self.entry(i)).filter(|e| !matches!(e.state, State::Free | State::Claiming)).collect()
    }

    /// The slot of (database, relation) that is live (not `Free`, `Dropping` or `Claiming`), if
    /// any.
    pub fn find(&self, database: u32, relation: u32) -> Option<Entry> {
        // (the two ids first: every insert of a cached table's database asks, and a whole entry
        // is 17 loads)
        (0..MAX_CACHES)
            .filter(|&i| self.slots[i].database.load(SeqCst) == database && self.slots[i].relation.load(SeqCst) == relation)
            .map(|i| self.entry(i))
            .find(|e| {
                e.database == database
                    && e.relation == relation
                    && !matches!(e.state, State::Free | State::Dropping | State::Claiming)
            })
    }

    /// Takes a free slot for a new build of (database, relation) by `builder`; returns its
    /// entry (state `Building`, a fresh generation). 42710 if the table has a live cache
    /// (retire it first), 53400 if every slot is taken.
    pub fn claim(&self, database: u32, relation: u32, builder: u32) -> Result<Entry> {
        if let Some(e) = self.find(database, relation) {
            return Err(UvmError::new(
                Code::DuplicateObject,
                format!("table {relation} already has a column cache ({})", e.state.name()),
            ));
        }
        for (i, s) in self.slots.iter().enumerate() {
            if s.state.compare_exchange(State::Free as u32, State::Claiming as u32, SeqCst, SeqCst).is_err() {
                continue;
            }
            // The slot is ours (Claiming: nobody looks it up); fill it, then make it Building.
            let generation = self.next_generation.fetch_add(1, SeqCst);
            s.database.store(database, SeqCst);
            s.relation.store(relation, SeqCst);
            s.generation.store(generation, SeqCst);
            for f in [&s.built_xmax, &s.builder_xid, &s.rows, &s.bytes] {
                f.store(0, SeqCst);
            }
            s.columns.store(0, SeqCst);
            s.workers.store(0, SeqCst);
            s.stale_since.store(0, SeqCst);
            s.built_at.store(0, SeqCst);
            s.last_used.store(0, SeqCst);
            s.clear_tail();
            s.builder.store(builder, SeqCst);
            s.state.store(State::Building as u32, SeqCst);
            return Ok(self.entry(i));
        }
        Err(UvmError::new(Code::ConfigurationLimitExceeded, format!("all {MAX_CACHES} column cache slots are in use"))
            .hint("Drop a cache with uvm.cache_drop(table)."))
    }

    /// `Building -> Ready` with what the build made; false (nothing published) when a writer
    /// marked it stale meanwhile or the slot is not that build's any more.
    pub fn publish(&self, e: &Entry, b: &Built) -> bool {
        let s = &self.slots[e.slot];
        if s.generation.load(SeqCst) != e.generation {
            return false;
        }
        s.columns.store(b.columns, SeqCst);
        s.built_xmax.store(b.built_xmax, SeqCst);
        s.builder_xid.store(b.builder_xid, SeqCst);
        s.built_at.store(b.built_at, SeqCst);
        s.last_used.store(b.built_at, SeqCst);
        s.rows.store(b.rows, SeqCst);
        s.bytes.store(b.bytes, SeqCst);
        s.workers.store(b.workers, SeqCst);
        s.tail_rows.store(0, SeqCst);
        s.tail_capacity.store(b.tail_capacity, SeqCst);
        s.state.compare_exchange(State::Building as u32, State::Ready as u32, SeqCst, SeqCst).is_ok()
    }

    /// Marks every `Ready` or `Building` cache of (database, relation) stale at time `now`;
    /// `relation` 0 marks every cache of the database. Returns how many it marked. Lock-free:
    /// safe from any hook.
    pub fn mark_stale(&self, database: u32, relation: u32, now: i64) -> usize {
        let mut n = 0;
        for s in &self.slots {
            if s.database.load(SeqCst) != database || (relation != 0 && s.relation.load(SeqCst) != relation) {
                continue;
            }
            for from in [State::Ready, State::Building] {
                // (the time first: a refresher that sees Stale sees when)
                let before = s.stale_since.swap(now, SeqCst);
                if s.state.compare_exchange(from as u32, State::Stale as u32, SeqCst, SeqCst).is_ok() {
                    n += 1;
                } else {
                    s.stale_since.store(before, SeqCst);
                }
            }
        }
        n
    }

    /// The `Stale` caches of `database` that went stale (or were put off) at or before `due`:
    /// what a background refresher rebuilds now.
    pub fn due(&self, database: u32, due: i64) -> Vec<Entry> {
        self.list().into_iter().filter(|e| e.database == database && e.state == State::Stale && e.stale_since <= due).collect()
    }

    /// The earliest time a `Stale` cache of `database` falls due (None: none is stale).
    pub fn next_due(&self, database: u32) -> Option<i64> {
        self.list().into_iter().filter(|e| e.database == database && e.state == State::Stale).map(|e| e.stale_since).min()
    }

    /// Puts a stale cache's refresh off until `until` (a refresher that found its table busy,
    /// or is about to try: a refresher that fails does not try again before then).
    pub fn postpone(&self, slot: usize, generation: u64, until: i64) {
        if let Some(s) = self.slots.get(slot) {
            if s.generation.load(SeqCst) == generation {
                s.stale_since.store(until, SeqCst);
            }
        }
    }

    /// Claims the refresher of `database` for the caller at time `now` (false: one runs or is
    /// starting, or every entry is taken). A claim whose worker never started (`start_within`
    /// after it was made) or whose worker is gone (`alive` says no) is taken over.
    pub fn claim_refresher(&self, database: u32, now: i64, start_within: i64, alive: impl Fn(u32) -> bool) -> bool {
        if database == 0 {
            return false;
        }
        for r in &self.refreshers {
            if r.database.load(SeqCst) != database {
                continue;
            }
            let pid = r.pid.load(SeqCst);
            let lost = if pid == 0 { now.saturating_sub(r.claimed_at.load(SeqCst)) > start_within } else { !alive(pid) };
            if !lost || r.database.compare_exchange(database, 0, SeqCst, SeqCst).is_err() {
                return false;
            }
        }
        for r in &self.refreshers {
            if r.database.compare_exchange(0, database, SeqCst, SeqCst).is_ok() {
                r.pid.store(0, SeqCst);
                r.claimed_at.store(now, SeqCst);
                // Two claimers may both have seen no entry for the database: the one in the
                // earlier entry keeps it.
                let first = self.refreshers.iter().position(|x| x.database.load(SeqCst) == database);
                if first.is_some_and(|i| !std::ptr::eq(&self.refreshers[i], r)) {
                    r.database.store(0, SeqCst);
                    return false;
                }
                return true;
            }
        }
        false
    }

    /// The refresher of `database` runs as process `pid` (the worker, at its start).
    pub fn refresher_started(&self, database: u32, pid: u32) {
        for r in &self.refreshers {
            if r.database.load(SeqCst) == database {
                r.pid.store(pid, SeqCst);
            }
        }
    }

    /// Releases the refresher claim of `database`.
    pub fn release_refresher(&self, database: u32) {
        for r in &self.refreshers {
            let _ = r.database.compare_exchange(database, 0, SeqCst, SeqCst);
        }
    }

    /// Whether any slot of `database` is `Ready` or `Building` (the writers' fast check).
    pub fn any_live(&self, database: u32) -> bool {
        self.slots.iter().any(|s| {
            s.database.load(SeqCst) == database
                && matches!(State::from_repr(s.state.load(SeqCst)), Some(State::Ready | State::Building))
        })
    }

    /// The slot's state if it still holds generation `generation`.
    pub fn state_of(&self, slot: usize, generation: u64) -> Option<State> {
        let s = self.slots.get(slot)?;
        let st = State::from_repr(s.state.load(SeqCst))?;
        (s.generation.load(SeqCst) == generation).then_some(st)
    }

    /// The builder's transaction ended (its xact callback, in the building backend): committed,
    /// the slot forgets the builder's xid (readers need no commit log for it from now on);
    /// aborted, the cache holds rows nobody will see, so it goes stale.
    pub fn settle_builder(&self, slot: usize, generation: u64, committed: bool, now: i64) {
        let Some(s) = self.slots.get(slot) else { return };
        if s.generation.load(SeqCst) != generation {
            return;
        }
        if committed {
            s.builder_xid.store(0, SeqCst);
        } else if matches!(State::from_repr(s.state.load(SeqCst)), Some(State::Ready | State::Building)) {
            s.stale_since.store(now, SeqCst);
            for from in [State::Ready, State::Building] {
                let _ = s.state.compare_exchange(from as u32, State::Stale as u32, SeqCst, SeqCst);
            }
        }
    }

    /// Records a use (for the view).
    pub fn touch(&self, slot: usize, generation: u64, now: i64) {
        if let Some(s) = self.slots.get(slot) {
            if s.generation.load(SeqCst) == generation {
                s.last_used.store(now, SeqCst);
            }
        }
    }

    /// Hands `n` rows of the append tail of the `Ready` cache in `slot` at `generation` to an
    /// appender: the first row's index, or `None` where the tail has no room (the appender then
    /// marks the cache stale) or the slot is no longer that cache, ready.
    pub fn reserve_tail(&self, slot: usize, generation: u64, n: u64) -> Option<u64> {
        let s = self.slots.get(slot)?;
        if s.generation.load(SeqCst) != generation || s.state.load(SeqCst) != State::Ready as u32 {
            return None;
        }
        let cap = s.tail_capacity.load(SeqCst);
        let mut cur = s.tail_rows.load(SeqCst);
        loop {
            let end = cur.checked_add(n).filter(|&e| e <= cap)?;
            match s.tail_rows.compare_exchange(cur, end, SeqCst, SeqCst) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        // (a claim may have reset the slot between the checks and the exchange)
        (s.generation.load(SeqCst) == generation).then_some(cur)
    }

    /// Rows of the tail handed out so far, if the slot still holds `generation` (never above
    /// its capacity).
    pub fn tail_rows(&self, slot: usize, generation: u64) -> Option<u64> {
        let s = self.slots.get(slot)?;
        let n = s.tail_rows.load(SeqCst).min(s.tail_capacity.load(SeqCst));
        (s.generation.load(SeqCst) == generation).then_some(n)
    }

    /// Records that top transaction `xid` (non-zero) appends to the cache in `slot` and has not
    /// settled; false where every entry is taken (or the slot is another cache now).
    pub fn add_pending(&self, slot: usize, generation: u64, xid: u32) -> bool {
        let Some(s) = self.slots.get(slot) else { return false };
        if xid == 0 || s.generation.load(SeqCst) != generation {
            return false;
        }
        if s.pending.iter().any(|p| p.load(SeqCst) == xid) {
            return true;
        }
        // (a load before each exchange: a failed exchange still takes the cache line from the
        // other cores, and every inserting backend comes here)
        s.pending.iter().any(|p| p.load(SeqCst) == 0 && p.compare_exchange(0, xid, SeqCst, SeqCst).is_ok())
    }

    /// `xid` settled (committed, or aborted after marking the cache stale).
    pub fn remove_pending(&self, slot: usize, xid: u32) {
        if let Some(s) = self.slots.get(slot) {
            for p in s.pending.iter().filter(|p| p.load(SeqCst) == xid) {
                let _ = p.compare_exchange(xid, 0, SeqCst, SeqCst);
            }
        }
    }

    /// Whether `xid` appended to the cache in `slot` and has not settled.
    pub fn is_pending(&self, slot: usize, xid: u32) -> bool {
        xid != 0 && self.slots.get(slot).is_some_and(|s| s.pending.iter().any(|p| p.load(SeqCst) == xid))
    }

    /// Moves the slot of generation `generation` to `Dropping` from any live state; true if
    /// this call did (the caller then drops the segment and calls [`Directory::free`]).
    pub fn retire(&self, slot: usize, generation: u64) -> bool {
        let Some(s) = self.slots.get(slot) else { return false };
        loop {
            let cur = s.state.load(SeqCst);
            if s.generation.load(SeqCst) != generation
                || matches!(State::from_repr(cur), Some(State::Free | State::Dropping | State::Claiming) | None)
            {
                return false;
            }
            if s.state.compare_exchange(cur, State::Dropping as u32, SeqCst, SeqCst).is_ok() {
                return true;
            }
        }
    }

    /// `Dropping -> Free` for the slot of generation `generation` (idempotent: two processes
    /// that both finished dropping one cache free it once).
    pub fn free(&self, slot: usize, generation: u64) {
        if let Some(s) = self.slots.get(slot) {
            if s.generation.load(SeqCst) == generation {
                let _ = s.state.compare_exchange(State::Dropping as u32, State::Free as u32, SeqCst, SeqCst);
            }
        }
    }
}

impl Slot {
    fn clear_tail(&self) {
        self.tail_capacity.store(0, SeqCst);
        self.tail_rows.store(0, SeqCst);
        for p in &self.pending {
            p.store(0, SeqCst);
        }
    }
}

/// The name of the segment holding generation `generation` of the cache of (database,
/// relation): in the plan nodes' reserved namespace, so no user names it by accident.
pub fn segment_name(database: u32, relation: u32, generation: u64) -> String {
    format!("{}cache_{database}_{relation}_{generation}", crate::registry::RESERVED_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> &'static Directory {
        Box::leak(Directory::boxed())
    }

    fn built(xmax: u64) -> Built {
        Built { columns: 2, built_xmax: xmax, builder_xid: 0, built_at: 7, rows: 10, bytes: 4096, workers: 0, tail_capacity: 100 }
    }

    #[test]
    fn a_slot_goes_through_its_states() {
        let d = dir();
        let e = d.claim(5, 100, 10).unwrap();
        assert_eq!(e.state, State::Building);
        assert!(d.claim(5, 100, 10).is_err(), "a second live cache of one table");
        assert!(d.publish(&e, &built(42)));
        let f = d.find(5, 100).unwrap();
        assert_eq!((f.state, f.built_xmax, f.rows, f.generation), (State::Ready, 42, 10, e.generation));
        assert!(d.any_live(5) && !d.any_live(6));
        assert_eq!(d.mark_stale(5, 999, 50), 0, "another table");
        assert_eq!(d.mark_stale(6, 100, 50), 0, "another database");
        assert_eq!(d.mark_stale(5, 100, 50), 1);
        assert_eq!(d.state_of(e.slot, e.generation), Some(State::Stale));
        assert!(!d.any_live(5));
        assert!(d.retire(e.slot, e.generation));
        assert!(!d.retire(e.slot, e.generation), "retired once");
        assert!(d.find(5, 100).is_none());
        d.free(e.slot, e.generation);
        assert!(d.list().is_empty());
        let g = d.claim(5, 100, 10).unwrap();
        assert!(g.generation > e.generation, "generations are never reused");
    }

    #[test]
    fn a_build_marked_stale_is_not_published() {
        let d = dir();
        let e = d.claim(1, 2, 10).unwrap();
        assert_eq!(d.mark_stale(1, 0, 50), 1, "relation 0: the whole database");
        assert!(!d.publish(&e, &built(1)));
        assert_eq!(d.state_of(e.slot, e.generation), Some(State::Stale));
        assert_eq!(d.state_of(e.slot, e.generation + 1), None, "another generation");
    }

    /// A slot being claimed is nobody's to list, find, retire or free.
    #[test]
    fn a_claim_in_progress_is_invisible() {
        let d = dir();
        d.slots[3].state.store(State::Claiming as u32, SeqCst);
        d.slots[3].database.store(1, SeqCst);
        d.slots[3].relation.store(2, SeqCst);
        assert!(d.list().is_empty());
        assert!(d.find(1, 2).is_none());
        assert!(!d.retire(3, 0));
        d.free(3, 0);
        assert_eq!(d.state_of(3, 0), Some(State::Claiming));
        let e = d.claim(1, 2, 10).unwrap();
        assert_ne!(e.slot, 3, "a claimed slot is not handed out again");
    }

    #[test]
    fn the_builder_settles_its_slot() {
        let d = dir();
        let e = d.claim(1, 2, 10).unwrap();
        assert!(d.publish(&e, &Built { builder_xid: 77, ..built(5) }));
        d.settle_builder(e.slot, e.generation + 1, false, 60);
        assert_eq!(d.state_of(e.slot, e.generation), Some(State::Ready), "another generation's settling");
        d.settle_builder(e.slot, e.generation, true, 60);
        assert_eq!(d.find(1, 2).unwrap().builder_xid, 0);
        let f = d.claim(1, 3, 10).unwrap();
        assert!(d.publish(&f, &Built { builder_xid: 78, ..built(5) }));
        d.settle_builder(f.slot, f.generation, false, 60);
        assert_eq!(d.state_of(f.slot, f.generation), Some(State::Stale), "an aborted builder's cache");
    }

    #[test]
    fn stale_caches_fall_due_from_their_first_mark_and_can_be_put_off() {
        let d = dir();
        let e = d.claim(1, 2, 10).unwrap();
        assert!(d.publish(&e, &built(5)));
        let f = d.claim(1, 3, 10).unwrap();
        assert!(d.publish(&f, &built(5)));
        assert_eq!(d.next_due(1), None, "nothing is stale");
        assert_eq!(d.mark_stale(1, 2, 100), 1);
        assert_eq!(d.mark_stale(1, 2, 300), 0, "already stale: its time stays the first mark's");
        assert_eq!(d.find(1, 2).unwrap().stale_since, 100);
        assert!(d.due(1, 99).is_empty());
        assert_eq!(d.due(1, 100).iter().map(|e| e.relation).collect::<Vec<_>>(), vec![2]);
        assert!(d.due(2, 1000).is_empty(), "another database");
        d.postpone(e.slot, e.generation, 500);
        d.postpone(e.slot, e.generation + 1, 50);
        assert_eq!(d.next_due(1), Some(500));
        // A build its transaction aborted goes stale at that time.
        let g = d.claim(1, 4, 10).unwrap();
        assert!(d.publish(&g, &Built { builder_xid: 9, ..built(5) }));
        d.settle_builder(g.slot, g.generation, false, 200);
        assert_eq!(d.next_due(1), Some(200));
        assert_eq!(d.due(1, 200).len(), 1);
        assert_eq!(d.find(1, 3).unwrap().state, State::Ready);
    }

    #[test]
    fn one_refresher_per_database() {
        let d = dir();
        let live = |_| true;
        assert!(!d.claim_refresher(0, 0, 10, live), "no database 0");
        assert!(d.claim_refresher(7, 0, 10, live));
        assert!(!d.claim_refresher(7, 5, 10, live), "one is starting");
        assert!(d.claim_refresher(7, 11, 10, live), "a worker that never started is replaced");
        d.refresher_started(7, 1234);
        assert!(!d.claim_refresher(7, 1000, 10, live), "one runs");
        assert!(d.claim_refresher(7, 1000, 10, |pid| pid != 1234), "a worker that is gone is replaced");
        assert!(d.claim_refresher(8, 0, 10, live));
        d.release_refresher(7);
        assert!(d.claim_refresher(7, 0, 10, live));
        for db in 100..(100 + MAX_REFRESHERS as u32 - 2) {
            assert!(d.claim_refresher(db, 0, 10, live));
        }
        assert!(!d.claim_refresher(99, 0, 10, live), "every entry is taken");
        // Racing claimers of one database: exactly one wins.
        let d = dir();
        let won: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8).map(|_| s.spawn(|| d.claim_refresher(42, 0, 10, |_| true) as usize)).collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(won, 1);
    }

    #[test]
    fn slots_run_out_with_a_clear_error() {
        let d = dir();
        for r in 0..MAX_CACHES as u32 {
            d.claim(1, r + 1, 10).unwrap();
        }
        let e = d.claim(1, 9999, 10).unwrap_err();
        assert_eq!(e.code, Code::ConfigurationLimitExceeded);
    }

    #[test]
    fn concurrent_claims_never_share_a_slot() {
        let d = dir();
        let got: Vec<Vec<Entry>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u32)
                .map(|t| s.spawn(move || (0..16u32).map(|r| d.claim(t + 1, r + 1, 10).unwrap()).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut slots: Vec<usize> = got.iter().flatten().map(|e| e.slot).collect();
        slots.sort();
        slots.dedup();
        assert_eq!(slots.len(), 64);
        let mut gens: Vec<u64> = got.iter().flatten().map(|e| e.generation).collect();
        gens.sort();
        gens.dedup();
        assert_eq!(gens.len(), 64);
    }

    #[test]
    fn the_tail_hands_out_rows_up_to_its_capacity() {
        let d = dir();
        let e = d.claim(1, 2, 10).unwrap();
        assert_eq!(d.reserve_tail(e.slot, e.generation, 1), None, "not ready yet");
        assert!(d.publish(&e, &built(1)));
        assert_eq!(d.reserve_tail(e.slot, e.generation, 60), Some(0));
        assert_eq!(d.reserve_tail(e.slot, e.generation, 41), None, "past the capacity of 100");
        assert_eq!(d.reserve_tail(e.slot, e.generation, 40), Some(60));
        assert_eq!(d.tail_rows(e.slot, e.generation), Some(100));
        assert_eq!(d.reserve_tail(e.slot, e.generation + 1, 0), None, "another generation");
        d.mark_stale(1, 2, 5);
        assert_eq!(d.reserve_tail(e.slot, e.generation, 0), None, "stale");
        // concurrent appenders never share a row
        let f = d.claim(1, 3, 10).unwrap();
        assert!(d.publish(&f, &Built { tail_capacity: 1000, ..built(1) }));
        let mut got: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..300).filter_map(|_| d.reserve_tail(f.slot, f.generation, 1)).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        got.sort();
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn pending_appenders_are_listed_until_they_settle() {
        let d = dir();
        let e = d.claim(1, 2, 10).unwrap();
        assert!(d.publish(&e, &built(1)));
        assert!(!d.add_pending(e.slot, e.generation, 0), "no xid");
        assert!(d.add_pending(e.slot, e.generation, 77));
        assert!(d.add_pending(e.slot, e.generation, 77), "twice: one entry");
        assert!(d.is_pending(e.slot, 77) && !d.is_pending(e.slot, 78));
        for x in 1..MAX_PENDING as u32 {
            assert!(d.add_pending(e.slot, e.generation, 1000 + x));
        }
        assert!(!d.add_pending(e.slot, e.generation, 5000), "full");
        d.remove_pending(e.slot, 77);
        assert!(!d.is_pending(e.slot, 77));
        assert!(d.add_pending(e.slot, e.generation, 5000));
        assert!(!d.add_pending(e.slot, e.generation + 1, 6000), "another generation");
        // a new claim of the slot starts with an empty list and tail
        d.mark_stale(1, 2, 5);
        assert!(d.retire(e.slot, e.generation));
        d.free(e.slot, e.generation);
        let g = d.claim(1, 2, 10).unwrap();
        assert_eq!(g.slot, e.slot);
        assert!(!d.is_pending(g.slot, 5000));
        assert_eq!((g.tail_capacity, g.tail_rows), (0, 0));
    }

    #[test]
    fn segment_names_are_reserved() {
        let n = segment_name(4_294_967_295, 4_294_967_295, u64::MAX);
        assert!(crate::registry::check_not_reserved(&n).is_err());
        assert!(n.len() <= crate::registry::MAX_NAME_LEN, "{n}");
    }
}
