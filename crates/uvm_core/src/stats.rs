//! Cumulative statistics: counters in shared memory, as PostgreSQL's `pg_stat_*` views keep them.
//!
//! # Design
//!
//! Every counter is an atomic in a block of shared memory that the postmaster creates at start
//! and re-creates on a crash restart: counters survive a backend's exit (they are not the
//! backend's), and start from zero after a crash, as PostgreSQL's cumulative statistics do.
//! Nothing here takes a lock: counting is a relaxed `fetch_add` on the path that does the work,
//! and a reader sees each counter as it is at that moment (a view may show one counter of a
//! request counted and the next not yet, as `pg_stat_*` may).
//!
//! Three kinds of counter live in the blocks that own what they count:
//!
//! - [`SegmentCounters`], one per segment slot of the registry (`crate::registry`): pins, bytes
//!   read and written by the segment functions and their kernels, migrations and bytes moved,
//!   and the last use. A segment's counters start at zero when it is created (its slot reused).
//! - [`OpCounters`], in the GPU service's channel (`crate::channel`), per GPU and operation:
//!   requests, errors, abandoned requests, time queued and time run. Counted when the service
//!   completes a request, from times the slot carries (`CLOCK_MONOTONIC`, which every process
//!   of the machine shares).
//! - [`NodeCounters`], in the registry's header: the GpuJoin plan node's queries, rows,
//!   batches, GPU time, the join paths it offered the planner, the plans that used it, and the
//!   paths it declined, per reason ([`Decline`]).
//!
//! `uvm.stat_reset()` zeroes all of them (a store of zero per counter: a count racing with the
//! reset lands on either side of it).
//!
//! This module does not call PostgreSQL.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Microseconds since the Unix epoch (0 if the clock is before it).
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process of the machine.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the struct we pass; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One segment's counters (in its registry slot). Zero is the initial state.
#[repr(C)]
#[derive(Default)]
pub struct SegmentCounters {
    pins: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    migrations: AtomicU64,
    bytes_migrated: AtomicU64,
    last_used_us: AtomicI64,
}

/// A snapshot of [`SegmentCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentStats {
    pub pins: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub migrations: u64,
    pub bytes_migrated: u64,
    /// Microseconds since the Unix epoch of the last pin (0: never used).
    pub last_used_us: i64,
}

impl SegmentCounters {
    /// A pin was taken: one more, and the segment was used now.
    pub fn pinned(&self) {
        self.pins.fetch_add(1, Ordering::Relaxed);
        self.last_used_us.store(now_us(), Ordering::Relaxed);
    }
    pub fn read(&self, bytes: u64) {
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }
    pub fn written(&self, bytes: u64) {
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
    }
    pub fn migrated(&self, bytes: u64) {
        self.migrations.fetch_add(1, Ordering::Relaxed);
        self.bytes_migrated.fetch_add(bytes, Ordering::Relaxed);
    }
    pub fn snapshot(&self) -> SegmentStats {
        SegmentStats {
            pins: self.pins.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            migrations: self.migrations.load(Ordering::Relaxed),
            bytes_migrated: self.bytes_migrated.load(Ordering::Relaxed),
            last_used_us: self.last_used_us.load(Ordering::Relaxed),
        }
    }
    pub fn reset(&self) {
        for c in [&self.pins, &self.bytes_read, &self.bytes_written, &self.migrations, &self.bytes_migrated] {
            c.store(0, Ordering::Relaxed);
        }
        self.last_used_us.store(0, Ordering::Relaxed);
    }
}

/// The service's counters of one operation on one GPU (in the channel's header).
#[repr(C)]
#[derive(Default)]
pub struct OpCounters {
    requests: AtomicU64,
    errors: AtomicU64,
    abandoned: AtomicU64,
    wait_ns: AtomicU64,
    run_ns: AtomicU64,
}

/// A snapshot of [`OpCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    pub requests: u64,
    pub errors: u64,
    pub abandoned: u64,
    /// Submitted to taken by the service.
    pub wait_ns: u64,
    /// Taken to completed.
    pub run_ns: u64,
}

impl OpCounters {
    /// A request completed: `failed` (its reply is an error), `abandoned` (its client had
    /// given up), after `wait_ns` queued and `run_ns` running.
    pub fn completed(&self, failed: bool, abandoned: bool, wait_ns: u64, run_ns: u64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.errors.fetch_add(failed as u64, Ordering::Relaxed);
        self.abandoned.fetch_add(abandoned as u64, Ordering::Relaxed);
        self.wait_ns.fetch_add(wait_ns, Ordering::Relaxed);
        self.run_ns.fetch_add(run_ns, Ordering::Relaxed);
    }
    pub fn snapshot(&self) -> OpStats {
        OpStats {
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            abandoned: self.abandoned.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
            run_ns: self.run_ns.load(Ordering::Relaxed),
        }
    }
    pub fn reset(&self) {
        for c in [&self.requests, &self.errors, &self.abandoned, &self.wait_ns, &self.run_ns] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

crate::wire_enum! {
    /// Why the GpuJoin node declined to offer a join path (counted per join the planner
    /// considers, as the hook sees it: one query may count several).
    pub enum Decline: u32 {
        /// The inner side's cheapest path is parameterized (a nested loop's inner side).
        ParameterizedInner = 0,
        /// A clause or the output is more than plain columns (an expression, a constant-only
        /// clause).
        NotPlainColumns = 1,
        /// No clause is an equality of key types the node hashes.
        NoKey = 2,
        /// A left, semi or anti join with a clause outside the key, or a key that is not exact.
        NotExactForOuterJoin = 3,
        /// The key would form far more pairs than the join returns.
        TooManyPairs = 4,
        /// The inner side is estimated past the node's hash memory, and this process cannot
        /// spill it to the host tier.
        InnerOverMemory = 5,
    }
}

impl Decline {
    pub fn name(self) -> &'static str {
        match self {
            Decline::ParameterizedInner => "parameterized inner side",
            Decline::NotPlainColumns => "not plain columns",
            Decline::NoKey => "no hashable key",
            Decline::NotExactForOuterJoin => "outer join without an exact key",
            Decline::TooManyPairs => "too many pairs per row",
            Decline::InnerOverMemory => "inner side over work_mem, cannot spill",
        }
    }
}

/// The GpuJoin node's counters (in the registry's header).
#[repr(C)]
#[derive(Default)]
pub struct NodeCounters {
    /// Executions of the node (one per query run, parallel workers not counted again).
    queries: AtomicU64,
    /// Rows the node returned (every participant's).
    rows: AtomicU64,
    /// Batches of outer keys sent to the probe.
    batches: AtomicU64,
    /// Time spent in the executor's GPU work (every participant's).
    gpu_ns: AtomicU64,
    /// Inner rows the node's tables held.
    inner_rows: AtomicU64,
    /// Join paths the node offered the planner.
    paths_offered: AtomicU64,
    /// Plans the planner made with the node.
    plans: AtomicU64,
    /// Paths declined, by [`Decline`].
    declined: [AtomicU64; 8],
}

/// A snapshot of [`NodeCounters`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    pub queries: u64,
    pub rows: u64,
    pub batches: u64,
    pub gpu_ns: u64,
    pub inner_rows: u64,
    pub paths_offered: u64,
    pub plans: u64,
    pub declined: Vec<(Decline, u64)>,
}

impl NodeCounters {
    pub fn query(&self) {
        self.queries.fetch_add(1, Ordering::Relaxed);
    }
    /// One participant's share of a query's work.
    pub fn work(&self, rows: u64, batches: u64, gpu_ns: u64) {
        self.rows.fetch_add(rows, Ordering::Relaxed);
        self.batches.fetch_add(batches, Ordering::Relaxed);
        self.gpu_ns.fetch_add(gpu_ns, Ordering::Relaxed);
    }
    pub fn built(&self, inner_rows: u64) {
        self.inner_rows.fetch_add(inner_rows, Ordering::Relaxed);
    }
    pub fn offered(&self) {
        self.paths_offered.fetch_add(1, Ordering::Relaxed);
    }
    pub fn planned(&self) {
        self.plans.fetch_add(1, Ordering::Relaxed);
    }
    pub fn declined(&self, why: Decline) {
        self.declined[why as usize].fetch_add(1, Ordering::Relaxed);
    }
    pub fn snapshot(&self) -> NodeStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NodeStats {
            queries: l(&self.queries),
            rows: l(&self.rows),
            batches: l(&self.batches),
            gpu_ns: l(&self.gpu_ns),
            inner_rows: l(&self.inner_rows),
            paths_offered: l(&self.paths_offered),
            plans: l(&self.plans),
            declined: Decline::ALL.iter().map(|&d| (d, l(&self.declined[d as usize]))).collect(),
        }
    }
    pub fn reset(&self) {
        let all = [&self.queries, &self.rows, &self.batches, &self.gpu_ns, &self.inner_rows, &self.paths_offered, &self.plans];
        for c in all.into_iter().chain(self.declined.iter()) {
            c.store(0, Ordering::Relaxed);
        }
    }
}

crate::wire_enum! {
    /// What a row of `uvm.progress` reports.
    pub enum ProgressKind: u32 {
        /// `prefetch_segment`: bytes moved between tiers.
        Migration = 1,
        /// The GpuJoin plan node's inner side: rows read, then the table's pairs inserted.
        GpuJoinBuild = 2,
    }
}

crate::wire_enum! {
    /// The phase of a long operation.
    pub enum ProgressPhase: u32 {
        /// A migration waits for the pins held on its segment to drain.
        WaitingForPins = 1,
        /// A migration copies chunks (done: bytes).
        Copying = 2,
        /// The plan node reads its inner side (done: rows; total: the planner's estimate).
        ReadingInner = 3,
        /// The plan node builds its table (done: pairs inserted).
        BuildingTable = 4,
    }
}

impl ProgressKind {
    pub fn name(self) -> &'static str {
        match self {
            ProgressKind::Migration => "migration",
            ProgressKind::GpuJoinBuild => "gpujoin build",
        }
    }
    /// What `done` and `total` count.
    pub fn unit(self, phase: ProgressPhase) -> &'static str {
        match (self, phase) {
            (ProgressKind::Migration, _) => "bytes",
            (ProgressKind::GpuJoinBuild, ProgressPhase::BuildingTable) => "pairs",
            (ProgressKind::GpuJoinBuild, _) => "rows",
        }
    }
}

impl ProgressPhase {
    pub fn name(self) -> &'static str {
        match self {
            ProgressPhase::WaitingForPins => "waiting for pins",
            ProgressPhase::Copying => "copying",
            ProgressPhase::ReadingInner => "reading inner side",
            ProgressPhase::BuildingTable => "building table",
        }
    }
}

/// Rows the progress table holds at once (a long operation that finds none free runs
/// unreported).
pub const PROGRESS_SLOTS: usize = 128;

/// One row of the progress table (in the registry's header): claimed by a process for one
/// long operation (`pid` 0: free), written only by it, read by anyone.
#[repr(C)]
#[derive(Default)]
pub struct ProgressSlot {
    pid: std::sync::atomic::AtomicI32,
    kind: std::sync::atomic::AtomicU32,
    phase: std::sync::atomic::AtomicU32,
    _pad: u32,
    segment_id: AtomicU64,
    done: AtomicU64,
    total: AtomicU64,
    started_us: AtomicI64,
}

/// A snapshot of one claimed [`ProgressSlot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub pid: i32,
    pub kind: ProgressKind,
    pub phase: ProgressPhase,
    pub segment_id: u64,
    pub done: u64,
    pub total: u64,
    pub started_us: i64,
}

impl ProgressSlot {
    /// Claims this slot for `pid` if it is free.
    pub fn claim(&self, pid: i32, kind: ProgressKind, phase: ProgressPhase, segment_id: u64, total: u64) -> bool {
        if pid == 0 || self.pid.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return false;
        }
        self.kind.store(kind as u32, Ordering::Relaxed);
        self.phase.store(phase as u32, Ordering::Relaxed);
        self.segment_id.store(segment_id, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.started_us.store(now_us(), Ordering::Release);
        true
    }
    /// Claims this slot from the dead process that holds it (its row is stale).
    pub fn reclaim(&self, pid: i32, kind: ProgressKind, phase: ProgressPhase, segment_id: u64, total: u64) -> bool {
        let dead = self.pid.load(Ordering::Acquire);
        dead != 0
            && self.pid.compare_exchange(dead, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            && self.claim(pid, kind, phase, segment_id, total)
    }
    pub fn set_phase(&self, phase: ProgressPhase, done: u64, total: u64) {
        self.phase.store(phase as u32, Ordering::Relaxed);
        self.done.store(done, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
    }
    pub fn set_done(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
    }
    /// Frees the slot if `pid` holds it.
    pub fn release(&self, pid: i32) {
        let _ = self.pid.compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
    /// The slot's row, if claimed (and its numbers make sense: shared memory is not trusted).
    pub fn snapshot(&self) -> Option<Progress> {
        let pid = self.pid.load(Ordering::Acquire);
        if pid == 0 {
            return None;
        }
        Some(Progress {
            pid,
            kind: ProgressKind::from_repr(self.kind.load(Ordering::Relaxed))?,
            phase: ProgressPhase::from_repr(self.phase.load(Ordering::Relaxed))?,
            segment_id: self.segment_id.load(Ordering::Relaxed),
            done: self.done.load(Ordering::Relaxed),
            total: self.total.load(Ordering::Relaxed),
            started_us: self.started_us.load(Ordering::Relaxed),
        })
    }
}

/// A claimed row of the progress table, freed when dropped (or, should the process exit
/// without unwinding, by `Registry::detach_process`).
pub struct ProgressGuard {
    slot: *const ProgressSlot,
    pid: i32,
}

impl ProgressGuard {
    /// # Safety
    /// `slot` points into a block that stays mapped for the guard's life (the registry's), and
    /// `pid` claimed it.
    pub unsafe fn new(slot: *const ProgressSlot, pid: i32) -> ProgressGuard {
        ProgressGuard { slot, pid }
    }
    fn slot(&self) -> &ProgressSlot {
        // SAFETY: the contract of `new`.
        unsafe { &*self.slot }
    }
    pub fn phase(&self, phase: ProgressPhase, done: u64, total: u64) {
        self.slot().set_phase(phase, done, total);
    }
    pub fn done(&self, done: u64) {
        self.slot().set_done(done);
    }
}

impl Drop for ProgressGuard {
    fn drop(&mut self) {
        self.slot().release(self.pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_count_snapshot_and_reset() {
        let s = SegmentCounters::default();
        s.pinned();
        s.pinned();
        s.read(10);
        s.written(7);
        s.migrated(4096);
        let got = s.snapshot();
        assert_eq!((got.pins, got.bytes_read, got.bytes_written, got.migrations, got.bytes_migrated), (2, 10, 7, 1, 4096));
        assert!(got.last_used_us > 1_700_000_000_000_000, "a Unix time in microseconds: {}", got.last_used_us);
        s.reset();
        assert_eq!(s.snapshot(), SegmentStats::default());

        let o = OpCounters::default();
        o.completed(false, false, 5, 9);
        o.completed(true, true, 1, 1);
        assert_eq!(o.snapshot(), OpStats { requests: 2, errors: 1, abandoned: 1, wait_ns: 6, run_ns: 10 });
        o.reset();
        assert_eq!(o.snapshot(), OpStats::default());

        let n = NodeCounters::default();
        n.query();
        n.work(100, 3, 50);
        n.built(9);
        n.offered();
        n.planned();
        n.declined(Decline::TooManyPairs);
        let got = n.snapshot();
        assert_eq!(
            (got.queries, got.rows, got.batches, got.gpu_ns, got.inner_rows, got.paths_offered, got.plans),
            (1, 100, 3, 50, 9, 1, 1)
        );
        assert_eq!(got.declined.iter().find(|(d, _)| *d == Decline::TooManyPairs).map(|x| x.1), Some(1));
        assert!(Decline::ALL.len() <= 8, "room for every reason");
        n.reset();
        assert_eq!(n.snapshot(), NodeStats { declined: Decline::ALL.iter().map(|&d| (d, 0)).collect(), ..Default::default() });
    }

    #[test]
    fn progress_slots_are_claimed_once_updated_and_freed() {
        let slot = ProgressSlot::default();
        assert_eq!(slot.snapshot(), None);
        assert!(slot.claim(7, ProgressKind::Migration, ProgressPhase::WaitingForPins, 3, 100));
        assert!(!slot.claim(8, ProgressKind::Migration, ProgressPhase::WaitingForPins, 3, 100), "claimed once");
        {
            // SAFETY: `slot` outlives the guard; pid 7 claimed it.
            let g = unsafe { ProgressGuard::new(&slot, 7) };
            g.phase(ProgressPhase::Copying, 10, 100);
            g.done(60);
            let p = slot.snapshot().unwrap();
            assert_eq!(
                (p.pid, p.kind, p.phase, p.segment_id, p.done, p.total),
                (7, ProgressKind::Migration, ProgressPhase::Copying, 3, 60, 100)
            );
            assert_eq!(p.kind.unit(p.phase), "bytes");
            slot.release(8); // not the holder: nothing happens
            assert!(slot.snapshot().is_some());
        }
        assert_eq!(slot.snapshot(), None, "freed by the guard");
        // a corrupt kind reads as no row
        assert!(slot.claim(9, ProgressKind::GpuJoinBuild, ProgressPhase::ReadingInner, 0, 5));
        slot.kind.store(77, Ordering::Relaxed);
        assert_eq!(slot.snapshot(), None);
    }

    #[test]
    fn the_monotonic_clock_moves_forward() {
        let a = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(monotonic_ns() >= a + 1_000_000);
    }
}
