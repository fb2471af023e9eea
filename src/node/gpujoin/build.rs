//! The inner side: drained from the inner child into rows and (key, payload) pairs, and the
//! table built in a temporary segment, by this process alone or, in a parallel query, by the
//! participants together (`super::super::shared`).

use super::*;
use crate::stats::{ProgressGuard, ProgressKind, ProgressPhase};

/// A row of `uvm.progress` for this participant's part of the build (`None` when the table of
/// rows is full, or without the registry).
fn start_progress(phase: ProgressPhase, segment_id: u64, total: u64) -> Option<ProgressGuard> {
    let reg = crate::registry::shmem::shared().ok()?;
    // SAFETY: a plain global of the backend.
    let pid = unsafe { pg_sys::MyProcPid };
    reg.start_progress(pid, ProgressKind::GpuJoinBuild, phase, segment_id, total)
}

impl GpuJoinScan {
    /// Runs `f` with the executor, counting its time as GPU time.
    pub(super) fn timed<R>(&mut self, f: impl FnOnce(&mut dyn exec::Executor) -> Result<R>) -> R {
        let t = Instant::now();
        let r = with_executor(f);
        self.stats.gpu += t.elapsed();
        r
    }

    /// Builds the table in `seg` (grown to the table's size) from the (key, row id) pairs of
    /// `parts`; returns its bytes and tier code.
    pub(super) fn fill_table(&mut self, seg: &SegRef, parts: &[&[[i64; 2]]], nulls: u64) -> (u64, u32) {
        let kt = self.key;
        let stored = parts.iter().map(|p| p.len() as u64).sum();
        let n = table::slot_count(stored);
        let bytes = table::table_bytes(stored);
        let t = Instant::now();
        let progress = start_progress(ProgressPhase::BuildingTable, seg.id, stored);
        self.timed(|ex| {
            exec::grow_at_least(ex, seg, bytes)?;
            exec::build_begin(ex, seg, n)?;
            let mut done = 0;
            for rows in parts {
                exec::build_insert(ex, seg, kt, n, rows)?;
                done += rows.len() as u64;
                if let Some(p) = &progress {
                    p.done(done);
                }
            }
            exec::build_finish(ex, seg, kt, n, stored, nulls)
        });
        drop(progress);
        self.stats.table_build = t.elapsed();
        super::count(|c| c.built(stored));
        let tier = self.note_table(seg, bytes);
        (bytes, tier)
    }

    /// Notes the table's bytes and tier in the statistics; returns the tier's code (`TIERS`).
    pub(super) fn note_table(&mut self, seg: &SegRef, bytes: u64) -> u32 {
        // The node's own segment, in the reserved namespace: looked up, not resolved (which
        // is for names users give).
        let info = crate::registry::shmem::shared().ok().and_then(|reg| reg.lookup(seg.name()).ok().map(|slot| reg.info(slot)));
        let tier = match info.map(|i| (i.bytes_in(Tier::Device), i.bytes_in(Tier::Host))) {
            Some((d, 0)) if d > 0 => 1,
            Some((0, h)) if h > 0 => 2,
            Some(_) => 3,
            None => 0,
        };
        self.stats.table_bytes = bytes;
        self.stats.tier = TIERS[tier as usize].into();
        tier
    }

    /// Creates a temporary segment of `bytes` that this process drops (End, or abort).
    pub(super) fn create_temp(&mut self, what: &str, bytes: u64, max: Option<u64>) -> SegRef {
        let (size, max) = (bytes.min(i64::MAX as u64) as i64, max.map(|m| m.min(i64::MAX as u64) as i64));
        cleanup::create(what, |name| self.timed(|ex| exec::create(ex, name, size, max, TierPref::Auto, current_user(), now())))
    }

    /// Drains the inner child into `writer` (the columns the join uses of each row with a
    /// non-NULL key, and the table's (key, payload) pair of each): returns the count of NULL
    /// keys and whether the payloads are values. A payload is the row's id, or in the probe mode
    /// the aggregated column's value (0 for `count(*)` alone), or in the join mode with a
    /// `row_payload` the kept column's datum, read here as the row goes by, so
    /// that no one makes a second pass over the stored rows; a NULL value turns this
    /// participant's payloads back into row ids ([`RowWriter::pairs_to_row_ids`]). By-reference
    /// values that need flattening are made in `scratch`, reset as it goes.
    ///
    /// # Safety
    /// Called from exec with the node's children initialized; the writer's arena is live.
    pub(super) unsafe fn drain_into(&mut self, writer: &mut RowWriter, scratch: pg_sys::MemoryContext) -> (u64, bool) {
        // SAFETY: forwarded contract.
        unsafe {
            let n = self.inner_resnos.len();
            let mut nulls = 0u64;
            let mut chunk = Chunk::default();
            let upto = self.max_inner_att;
            // The payload column: its index among the stored ones and, in the probe mode, its
            // type (the join mode's `row_payload` keeps the datum as it is); `None` for count(*)
            // alone, or a join that keeps key columns only, whose payloads are 0.
            let mut values = self.probe.is_some() || self.row_payload.is_some();
            // `uvm.progress`: the rows read so far against the planner's estimate.
            let estimate = (*(*self.inner).plan).plan_rows.max(0.0) as u64;
            let table = if self.shared.is_null() { 0 } else { (*self.shared).table.id };
            let progress = start_progress(ProgressPhase::ReadingInner, table, estimate);
            let payload = match (self.probe, self.row_payload) {
                (Some(p), _) => p.map(|c| {
                    // The column's type as a sum reads it (a count before it, `count(x), sum(x)`,
                    // takes any type: its payloads would all be 0).
                    let arg =
                        self.aggs.iter().find(|a| a.col == Some(c) && a.acc.kind == Kind::Sum).map_or(Arg::Any, |a| a.acc.arg);
                    (self.col_index[c], Some(arg))
                }),
                (None, Some(p)) => p.map(|i| (i, None)),
                (None, None) => None,
            };
            loop {
                // The chunk's by-reference values live in `scratch` until the writer copied them.
                pg_sys::MemoryContextReset(scratch);
                let ended = fetch_chunk(
                    self.inner,
                    &self.inner_key,
                    upto,
                    &self.inner_resnos,
                    &self.inner_cols,
                    scratch,
                    &mut chunk,
                    CHUNK_ROWS,
                );
                nulls += chunk.null_keys;
                let old = pg_sys::MemoryContextSwitchTo(scratch);
                for (j, &key) in chunk.keys.iter().enumerate() {
                    let id = writer.push(&chunk.vals[j * n..(j + 1) * n], &chunk.nulls[j * n..(j + 1) * n]);
                    let p = match payload {
                        _ if !values => id,
                        None => 0,
                        Some((i, _)) if chunk.nulls[j * n + i] => {
                            values = false;
                            writer.pairs_to_row_ids();
                            id
                        }
                        Some((i, Some(arg))) => int_of_datum(chunk.vals[j * n + i], arg),
                        Some((i, None)) => chunk.vals[j * n + i].value() as i64,
                    };
                    writer.set_pair([key, p]);
                }
                pg_sys::MemoryContextSwitchTo(old);
                if let Some(p) = &progress {
                    p.done(writer.rows());
                }
                if ended {
                    break;
                }
            }
            pg_sys::MemoryContextReset(scratch);
            self.stats.inner_rows = writer.rows();
            (self.stats.held, self.stats.memory_limit, self.stats.spilled) = writer.memory();
            (nulls, values)
        }
    }

    /// A serial execution's build: the inner rows in the node's memory (past its hash memory,
    /// in its spill segment: `super::super::spill`), the table in a temporary segment of this
    /// process.
    ///
    /// # Safety
    /// Called from exec with the node's children initialized.
    pub(super) unsafe fn build_local(&mut self) {
        // SAFETY: forwarded contract; the rows are stored in the node's inner context.
        unsafe {
            self.drop_table();
            self.rows = InnerRows::default();
            pg_sys::MemoryContextReset(self.inner_ctx);
            let spill = std::mem::take(&mut self.spill);
            let mut writer = RowWriter::new(Arena::local(self.inner_ctx), &self.inner_cols, 0, Budget::own(), spill);
            let (nulls, values) = self.drain_into(&mut writer, self.batch_ctx);
            let stored = writer.rows();
            if stored > 0 {
                let bytes = table::table_bytes(stored);
                let seg = self.create_temp("inner", bytes, Some(bytes));
                self.table = Some(seg);
                self.owns_table = true;
                self.payload_values = values;
                let pairs = writer.pairs();
                let parts: Vec<&[[i64; 2]]> = pairs.iter().map(|p| &**p).collect();
                self.fill_table(&seg, &parts, nulls);
            }
            (self.rows, self.spill) = writer.into_local();
        }
    }

    /// A parallel execution: builds the inner side for every participant, or waits for the
    /// participant that does (see `super::shared`), then attaches to it.
    ///
    /// # Safety
    /// Called from exec with `self.shared` set up and the query's DSA area attached.
    pub(super) unsafe fn attach_shared(&mut self) {
        // SAFETY: forwarded contract.
        unsafe {
            self.scan_share(false);
            self.finish_attach();
        }
    }

    /// The query's DSA area (ERROR without one).
    ///
    /// # Safety
    /// Called from exec.
    pub(super) unsafe fn query_area(&self) -> *mut pg_sys::dsa_area {
        // SAFETY: forwarded contract: the executor state is live.
        let area = unsafe { (*self.estate).es_query_dsa };
        if area.is_null() {
            report(UvmError::new(Code::SystemError, "GpuJoin: a parallel execution without a query DSA area"));
        }
        area
    }

    /// A parallel execution's first half: this participant's share of the inner side, and the
    /// build if it is the last to finish its share (see `super::shared`). The other
    /// participants then wait in [`GpuJoinScan::finish_attach`], or first read outer keys
    /// (the probe mode, `exec_aggregates`: `ahead`, which also skips the wait to join a scan
    /// that another participant reads whole).
    ///
    /// # Safety
    /// As for [`GpuJoinScan::attach_shared`].
    pub(super) unsafe fn scan_share(&mut self, ahead: bool) {
        // SAFETY: forwarded contract; the builder writes the rows into the query's DSA area.
        unsafe {
            let sh = self.shared;
            let area = self.query_area();
            let role = if ahead { Shared::try_join(sh) } else { Some(Shared::join(sh)) };
            if let Some(Role::Scan) = role {
                // This participant's share of the inner side (all of it for a non-partial
                // inner plan, which only the first participant scans).
                let spill = std::mem::take(&mut self.spill);
                let budget = Budget::shared(&(*sh).held, (*sh).budget);
                let mut writer = RowWriter::new(Arena::shared(area), &self.inner_cols, shared::my_slot(), budget, spill);
                let (nulls, values) = self.drain_into(&mut writer, self.batch_ctx);
                self.spill = writer.publish(sh, nulls, values);
                if Shared::leave(sh) {
                    if Shared::leader_builds(sh) && shared::my_slot() != 0 {
                        // The leader builds (`super::super::handoff`): wake it.
                        Shared::wake(sh);
                    } else {
                        self.build_shared(sh, area);
                    }
                }
            }
        }
    }

    /// Builds the table from every participant's pairs and publishes it (the last participant
    /// to finish its share of the inner side, or the leader where it builds): in the probe
    /// mode, with the aggregated column's values as payloads, unless a participant met a NULL
    /// among them, and then every one's row ids.
    ///
    /// # Safety
    /// As for [`GpuJoinScan::scan_share`], with every participant out of the scan.
    unsafe fn build_shared(&mut self, sh: *mut Shared, area: *mut pg_sys::dsa_area) {
        // SAFETY: forwarded contract.
        unsafe {
            let arena = self.shared_arena(sh, area);
            let (parts, nulls, values) = Shared::keys(sh, arena);
            if parts.iter().any(|p| !p.is_empty()) {
                let seg = (*sh).table;
                self.rows = InnerRows::of_shared(sh, arena, &self.inner_cols);
                (*sh).payload_values = values;
                let (bytes, tier) = self.fill_table(&seg, &parts, nulls);
                (*sh).table_bytes = bytes;
                (*sh).tier = tier;
                (*sh).table_build_ns = self.stats.table_build.as_nanos() as u64;
            }
            drop(parts);
            Shared::free_keys(sh, area);
            Shared::publish(sh);
        }
    }

    /// A parallel execution's second half: waits until the inner side is built, then attaches
    /// to it.
    ///
    /// # Safety
    /// As for [`GpuJoinScan::attach_shared`], after [`GpuJoinScan::scan_share`].
    pub(super) unsafe fn finish_attach(&mut self) {
        // SAFETY: forwarded contract.
        unsafe {
            let sh = self.shared;
            let area = self.query_area();
            if Shared::leader_builds(sh) && shared::my_slot() == 0 {
                // The leader builds once every participant has left the scan (the last one to
                // leave wakes it).
                while !Shared::is_built(sh) {
                    if Shared::awaits_build(sh) {
                        self.build_shared(sh, area);
                    } else {
                        Shared::sleep(sh);
                    }
                }
                crate::pgwait::cancel_sleep();
            }
            Shared::wait_built(sh);
            self.table = Some((*sh).table);
            let arena = self.shared_arena(sh, area);
            self.rows = InnerRows::of_shared(sh, arena, &self.inner_cols);
            self.copy_shared_stats();
        }
    }

    /// The query's DSA area, with the spill segment mapped here as far as the participants
    /// wrote (every one of them has left the scan).
    ///
    /// # Safety
    /// `sh` is the query's shared state, `area` its DSA area.
    unsafe fn shared_arena(&mut self, sh: *mut Shared, area: *mut pg_sys::dsa_area) -> Arena {
        // SAFETY: forwarded contract.
        let used = unsafe { (*sh).spill.used.load(std::sync::atomic::Ordering::Acquire) };
        let arena = Arena::shared(area);
        if used == 0 {
            return arena;
        }
        arena.with_spill(self.spill.map(used, false).unwrap_or_else(|e| report(e)))
    }

    /// The build's statistics, the table's payload kind and the participants' counters, from the
    /// shared state.
    pub(super) fn copy_shared_stats(&mut self) {
        if self.shared.is_null() {
            return;
        }
        // SAFETY: the shared state is mapped while `self.shared` is set.
        unsafe {
            let sh = &*self.shared;
            self.stats.inner_rows = sh.rows.load(std::sync::atomic::Ordering::Relaxed);
            self.stats.held = sh.held.load(std::sync::atomic::Ordering::Relaxed);
            self.stats.memory_limit = sh.budget;
            self.stats.spilled = sh.spill.used.load(std::sync::atomic::Ordering::Relaxed);
            self.stats.table_bytes = sh.table_bytes;
            self.stats.tier = TIERS.get(sh.tier as usize).copied().unwrap_or("").into();
            self.stats.table_build = Duration::from_nanos(sh.table_build_ns);
            self.payload_values = sh.payload_values;
        }
    }

    /// Adds this participant's batches and executor time to the shared counters, once per scan.
    pub(super) fn report_stats(&mut self) {
        if self.shared.is_null() || self.reported {
            return;
        }
        self.reported = true;
        // SAFETY: as above; the counters are atomics.
        unsafe {
            let sh = &*self.shared;
            sh.batches.fetch_add(self.stats.batches, std::sync::atomic::Ordering::Relaxed);
            sh.gpu_ns.fetch_add(self.stats.gpu.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
            sh.build_ns.fetch_max(self.stats.build.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
            sh.ahead.fetch_add(self.stats.ahead, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Adds this participant's work to the node's cumulative counters (`uvm.stat_gpujoin`), at
    /// End: the query once (by the leader, or a serial execution), the rows, batches and GPU
    /// time of every participant that ran.
    pub(super) fn count_in_stats(&mut self) {
        if !std::mem::take(&mut self.stats.executed) {
            return;
        }
        // SAFETY: a plain global of the backend.
        let worker = unsafe { pg_sys::ParallelWorkerNumber } >= 0;
        let (rows, batches, gpu) = (self.stats.rows_out, self.stats.batches, self.stats.gpu.as_nanos() as u64);
        super::count(|c| {
            if !worker {
                c.query();
            }
            c.work(rows, batches, gpu);
        });
    }

    /// Forgets the inner table, dropping it if this process owns it (End, or a rebuild); a
    /// serial execution's spill segment goes with it.
    pub(super) fn drop_table(&mut self) {
        if let Some(seg) = self.table.take() {
            if std::mem::replace(&mut self.owns_table, false) {
                cleanup::drop_now(&seg);
            }
        }
        if self.shared.is_null() {
            self.rows = InnerRows::default();
            self.spill.finish();
        }
    }
}
