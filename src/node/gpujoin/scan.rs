//! The scan state and the executor's callbacks (`crate::customscan::JoinScan`): creation,
//! begin, the first call's build, returning rows or the aggregates' row, rescan, end, and the
//! parallel query's shared memory.

use super::*;

/// The node's execution statistics (EXPLAIN ANALYZE).
#[derive(Default)]
pub(super) struct Stats {
    pub(super) inner_rows: u64,
    pub(super) table_bytes: u64,
    pub(super) tier: String,
    pub(super) batches: u64,
    pub(super) gpu: Duration,
    /// From the first call to the inner side being ready (in parallel, the longest
    /// participant's).
    pub(super) build: Duration,
    /// Batches of outer keys read while another participant built the table.
    pub(super) ahead: u64,
    /// The table's build from the pairs (in parallel, by the participant that built it).
    pub(super) table_build: Duration,
    /// Rows this participant returned (`uvm.stat_gpujoin`), and whether it ran at all.
    pub(super) rows_out: u64,
    pub(super) executed: bool,
    /// The inner side's bytes in the node's own memory (in parallel, every participant's), its
    /// limit (`super::super::spill`), and the bytes spilled past it.
    pub(super) held: u64,
    pub(super) memory_limit: u64,
    pub(super) spilled: u64,
    /// The probe of the outer table's cached keys, where the node read column caches.
    pub(super) cache_probe: Option<Duration>,
    /// Of which the probing itself (the kernels' launches, or the CPU's loop).
    pub(super) cache_kernels: Option<Duration>,
    /// The workers' batches of outer keys the leader probed (`crate::node::handoff`): `None`
    /// where every participant probed its own.
    pub(super) handed: Option<u64>,
}

/// The GpuJoin custom scan.
pub struct GpuJoinScan {
    pub(super) p: Private,
    /// The table's key type, and the key columns of each side.
    pub(super) key: KeyType,
    pub(super) outer_key: KeyCols,
    pub(super) inner_key: KeyCols,
    pub(super) outer: *mut pg_sys::PlanState,
    pub(super) inner: *mut pg_sys::PlanState,
    pub(super) inner_ctx: pg_sys::MemoryContext,
    pub(super) batch_ctx: pg_sys::MemoryContext,
    /// The inner rows (the inner columns the join uses: `inner_cols`, read from the inner
    /// child's `inner_resnos`).
    pub(super) rows: InnerRows,
    /// Where the inner side goes past the node's hash memory (`super::super::spill`): this
    /// process's view of the spill segment.
    pub(super) spill: Spill,
    pub(super) inner_cols: Vec<Col>,
    pub(super) inner_resnos: Vec<i32>,
    /// The outer columns the join uses, kept per batch tuple (`outer_vals`, `outer_nulls`:
    /// `outer_cols.len()` entries per tuple; by-reference values copied into the batch context)
    /// instead of whole tuples.
    pub(super) outer_cols: Vec<Col>,
    pub(super) outer_resnos: Vec<i32>,
    pub(super) outer_vals: Vec<pg_sys::Datum>,
    pub(super) outer_nulls: Vec<bool>,
    /// Per scan tuple column: its index in `outer_cols` or `inner_cols` (by its side).
    pub(super) col_index: Vec<usize>,
    /// The inner table; dropped by this process only if it `owns_table` (a parallel query's
    /// table belongs to the leader).
    pub(super) table: Option<SegRef>,
    pub(super) owns_table: bool,
    /// This participant's result buffer.
    pub(super) result: Option<SegRef>,
    /// The plan runs in parallel workers (its inner side is built again at every rescan).
    pub(super) parallel_aware: bool,
    /// The parallel query's shared state (null in a serial execution).
    pub(super) shared: *mut Shared,
    pub(super) estate: *mut pg_sys::EState,
    /// The inner side is built (or attached) for this scan.
    pub(super) ready: bool,
    pub(super) outer_done: bool,
    /// This participant's statistics went to the shared counters.
    pub(super) reported: bool,
    /// A parallel worker that hands its outer keys to the leader (`crate::node::handoff`):
    /// registered there, it probes nothing itself.
    pub(super) hands_keys: bool,
    pub(super) batch: Batch,
    pub(super) emitter: Emitter,
    /// The batch's pairs in the result buffer: the next one to read, and how many.
    pub(super) matches: (u64, u64),
    pub(super) max_outer_att: i32,
    pub(super) max_inner_att: i32,
    pub(super) stats: Stats,
    /// The aggregate mode's aggregates (empty in the join mode), and whether this scan's row of
    /// results was returned.
    pub(super) aggs: Vec<NodeAgg>,
    pub(super) agg_done: bool,
    /// The probe mode's plan: every aggregate is `count(*)`, or `count`/`sum` of one inner
    /// column (`Some(Some(its index in Private::map))`; `Some(None)`: `count(*)` alone). The
    /// table is then built with that column's values as payloads, where none is NULL
    /// (`payload_values`), and the outer keys are probed in batches whose matches and payload
    /// sum are the aggregates: no pairs come back, no match is formed.
    pub(super) probe: Option<Option<usize>>,
    pub(super) payload_values: bool,
    /// The join mode's counterpart of `probe` (`inner_payload`): every inner column the join
    /// keeps is a key column of the outer side's type (`from_outer`: its outer column) but at
    /// most one by-value column (`Some(Some(its index in inner_cols))`). The table's payloads
    /// are then that column's values (where none is NULL: `payload_values`), and a joined row
    /// is made from the outer tuple and the pair alone, with no read of the stored rows.
    pub(super) row_payload: Option<Option<usize>>,
    /// Per scan tuple column: for an inner key column, the index in `outer_cols` of the outer
    /// key column it equals (of the same type, so the same datum).
    pub(super) from_outer: Vec<Option<usize>>,
    /// A joined row's values, gathered before they go to the scan slot (`emit_row`).
    pub(super) row_buf: Vec<(pg_sys::Datum, bool)>,
    /// Where the node's target list is plain columns of its scan tuple and it has no qual: per
    /// output column, its scan tuple column (`emit_row` then fills the projection's result slot
    /// itself, with no expression evaluated per row: [`direct_projection`]).
    pub(super) direct: Option<Vec<usize>>,
    /// A parallel probe-mode participant that finished its share of the inner side while
    /// another builds the table: it reads up to [`PENDING_BATCHES`] batches of outer keys
    /// (`pending`) before it waits, so the build's serial part overlaps the outer scan.
    pub(super) awaiting: Option<Instant>,
    pub(super) pending: Vec<Vec<i64>>,
    /// The join mode's read-ahead (`awaiting` too): whole batches of outer tuples, read while
    /// another participant builds the table, where every outer column kept is by value (so that
    /// none points into the batch context); `next_batch` takes them first.
    pub(super) pending_rows: std::collections::VecDeque<Chunk>,
    /// The probe mode's batch being probed (see `probe_keys`); dropped unwaited (an ERROR, a
    /// rescan), the request is given up and the service reuses its slot once it is done.
    pub(super) in_flight: Option<exec::Pending<exec::request::Probed>>,
    /// The join mode's next batch, read while the current one's rows are returned, its pairs
    /// being formed meanwhile (`read_ahead`), in `spare`'s storage until it becomes current.
    pub(super) ahead: Option<Ahead>,
    pub(super) spare: Spare,
    /// The outer side's chunk buffer (reused from batch to batch).
    pub(super) chunk: Chunk,
    /// A left, semi or anti join: per position of the batch, whether the outer tuple matched;
    /// and (left, anti) the next position to look at for unmatched tuples once the batch's
    /// pairs are done.
    pub(super) matched: Vec<bool>,
    pub(super) unmatched_at: usize,
    /// The column caches this plan may read instead of its children (`super::cached`), and
    /// what the last execution read.
    pub(super) cached: Option<CachePlan>,
    pub(super) read_from: Option<ReadFrom>,
}

/// A batch read ahead (`GpuJoinScan::read_ahead`): the request forming its pairs, none where
/// it has nothing to probe (an empty inner side of a left or anti join, or only NULL keys).
pub(super) struct Ahead {
    pub(super) pending: Option<exec::WithinPending>,
}

/// A second batch's storage, which the batch read ahead fills: the memory context its
/// by-reference values are copied into, its values, NULL flags and keys, as the current batch's
/// (`GpuJoinScan::batch_ctx`, `outer_vals`, `outer_nulls`, `batch`), with which it is swapped.
pub(super) struct Spare {
    pub(super) ctx: pg_sys::MemoryContext,
    pub(super) vals: Vec<pg_sys::Datum>,
    pub(super) nulls: Vec<bool>,
    pub(super) batch: Batch,
}

impl JoinScan for GpuJoinScan {
    const NAME: &'static CStr = c"UvmGpuJoin";

    fn methods() -> &'static Methods {
        &METHODS
    }

    unsafe fn plan(
        root: *mut pg_sys::PlannerInfo,
        rel: *mut pg_sys::RelOptInfo,
        path: *mut pg_sys::CustomPath,
        tlist: *mut pg_sys::List,
        clauses: *mut pg_sys::List,
        custom_plans: *mut pg_sys::List,
    ) -> *mut pg_sys::CustomScan {
        // SAFETY: forwarded: PlanCustomPath's arguments for a path of ours.
        unsafe { plan_custom_path(root, rel, path, tlist, clauses, custom_plans) }
    }

    unsafe fn create(cscan: *mut pg_sys::CustomScan) -> Self {
        // SAFETY: our plan, made by `plan`.
        let p = unsafe { Private::from_list((*cscan).custom_private) };
        let (outer_key, inner_key) = (p.key_cols(0), p.key_cols(1));
        let key = outer_key.composer.key_type();
        let aggs = node_aggs(&p);
        let probe = probe_plan(&p, &aggs);
        let max_outer_att = p.map.iter().filter(|m| m.0 == 0).map(|m| m.1).max().unwrap_or(0).max(outer_key.max_att());
        let max_inner_att = p.map.iter().filter(|m| m.0 == 1).map(|m| m.1).max().unwrap_or(0).max(inner_key.max_att());
        // SAFETY: our plan.
        let parallel_aware = unsafe { (*cscan).scan.plan.parallel_aware };
        let p_join = p.join;
        GpuJoinScan {
            p,
            key,
            outer_key,
            inner_key,
            outer: std::ptr::null_mut(),
            inner: std::ptr::null_mut(),
            inner_ctx: std::ptr::null_mut(),
            batch_ctx: std::ptr::null_mut(),
            rows: InnerRows::default(),
            spill: Spill::default(),
            inner_cols: Vec::new(),
            inner_resnos: Vec::new(),
            outer_cols: Vec::new(),
            outer_resnos: Vec::new(),
            outer_vals: Vec::new(),
            outer_nulls: Vec::new(),
            col_index: Vec::new(),
            table: None,
            owns_table: false,
            result: None,
            parallel_aware,
            shared: std::ptr::null_mut(),
            estate: std::ptr::null_mut(),
            ready: false,
            outer_done: false,
            reported: false,
            hands_keys: false,
            batch: positional_batch(),
            emitter: Emitter::default(),
            matches: (0, 0),
            max_outer_att,
            max_inner_att,
            stats: Stats::default(),
            aggs,
            agg_done: false,
            probe,
            payload_values: false,
            row_payload: None,
            from_outer: Vec::new(),
            row_buf: Vec::new(),
            direct: None,
            awaiting: None,
            in_flight: None,
            pending: Vec::new(),
            pending_rows: Default::default(),
            ahead: None,
            spare: Spare { ctx: std::ptr::null_mut(), vals: Vec::new(), nulls: Vec::new(), batch: positional_batch() },
            chunk: Chunk { keep_null_keys: p_join.keeps_unmatched(), ..Chunk::default() },
            matched: Vec::new(),
            unmatched_at: 0,
            cached: None,
            read_from: None,
        }
    }

    unsafe fn begin(&mut self, node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
        // SAFETY: BeginCustomScan's arguments; the children are initialized in the query's
        // memory context (the current one) and listed in custom_ps for EXPLAIN.
        unsafe {
            let cscan = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
            let plans = PgList::<pg_sys::Plan>::from_pg((*cscan).custom_plans);
            self.outer = pg_sys::ExecInitNode(plans.get_ptr(0).expect("outer"), estate, eflags);
            self.inner = pg_sys::ExecInitNode(plans.get_ptr(1).expect("inner"), estate, eflags);
            let mut ps = PgList::<pg_sys::PlanState>::new();
            ps.push(self.outer);
            ps.push(self.inner);
            (*node).custom_ps = ps.into_pg();
            let ctx = |name: &CStr| {
                pg_sys::AllocSetContextCreateInternal(
                    pg_sys::CurrentMemoryContext,
                    name.as_ptr(),
                    pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                    pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                    pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
                )
            };
            self.inner_ctx = ctx(c"GpuJoin inner tuples");
            self.batch_ctx = ctx(c"GpuJoin outer batch");
            self.spare.ctx = ctx(c"GpuJoin outer batch");
            self.estate = estate;
            // The columns to keep from each side, with how to copy them.
            let (odesc, idesc) = (pg_sys::ExecGetResultType(self.outer), pg_sys::ExecGetResultType(self.inner));
            for (side, resno) in self.p.map.clone() {
                let (desc, resnos) = if side == 0 { (odesc, &mut self.outer_resnos) } else { (idesc, &mut self.inner_resnos) };
                let at = match resnos.iter().position(|&r| r == resno) {
                    Some(at) => at,
                    None => {
                        // The executor's descriptor, borrowed (not released by the wrapper).
                        let desc = pgrx::PgTupleDesc::from_pg_unchecked(desc);
                        let Some(a) = usize::try_from(resno - 1).ok().and_then(|i| desc.get(i)) else {
                            report(UvmError::new(Code::SystemError, "GpuJoin: a column outside its side's row"));
                        };
                        resnos.push(resno);
                        let col = Col { byval: a.attbyval, len: a.attlen };
                        if side == 0 {
                            self.outer_cols.push(col);
                        } else {
                            self.inner_cols.push(col);
                        }
                        resnos.len() - 1
                    }
                };
                self.col_index.push(at);
            }
            self.row_payload = self.inner_payload();
            self.direct = direct_projection(node, self.p.map.len());
            self.cached = self.cache_plan();
        }
    }

    unsafe fn exec(&mut self, node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        // SAFETY: ExecCustomScan's argument; the scan slot has the custom_scan_tlist's shape
        // (PostgreSQL made it from it); the stored tuples live until the next batch or build.
        unsafe {
            if !self.ready {
                let t = Instant::now();
                if self.shared.is_null() {
                    if !self.join_cached() {
                        self.build_local();
                    }
                } else if (!self.aggs.is_empty() && self.probe.is_some()) || self.reads_rows_ahead() {
                    // A worker whose leader probes for it registers before it reads a tuple.
                    self.hands_keys = shared::my_slot() != 0
                        && Shared::leader_builds(self.shared)
                        && Handoff::register(&mut (*self.shared).handoff);
                    // exec_aggregates reads outer keys until the table is built, the join mode
                    // whole batches of outer tuples (`gather_rows_while_building`).
                    self.scan_share(true);
                    self.awaiting = Some(t);
                } else {
                    self.attach_shared();
                }
                if self.awaiting.is_none() {
                    self.stats.build = self.stats.build.max(t.elapsed());
                }
                self.ready = true;
                self.reported = false;
                self.stats.executed = true;
            }
            if !self.aggs.is_empty() {
                return self.exec_aggregates(node);
            }
            if let Some(t) = self.awaiting.take() {
                self.gather_rows_while_building();
                self.finish_attach();
                self.stats.build = self.stats.build.max(t.elapsed());
            }
            let join = self.p.join;
            if self.rows.is_empty() && !join.keeps_unmatched() {
                self.report_stats();
                return std::ptr::null_mut(); // no inner row has a non-NULL key
            }
            loop {
                // The next (outer position, inner row) to return: a pair of the batch, or once
                // they are done (left, anti) an outer tuple without a match (no inner row). The
                // per-tuple memory is reset as each row is returned (`emit_row`).
                let (pos, row) = match self.next_match() {
                    Some((pos, row)) => {
                        let first = !std::mem::replace(self.matched.get_mut(pos as usize).unwrap_or(&mut true), true);
                        match join {
                            JoinKind::Inner | JoinKind::Left => (pos, Some(row)),
                            // Each outer tuple once, at its first match.
                            JoinKind::Semi if first => (pos, None),
                            JoinKind::Semi | JoinKind::Anti => continue,
                        }
                    }
                    None => {
                        if join.keeps_unmatched() {
                            let from = self.unmatched_at.min(self.matched.len());
                            if let Some(k) = self.matched[from..].iter().position(|m| !m) {
                                self.unmatched_at = from + k + 1;
                                if let Some(slot) = self.emit_row(node, (from + k) as u32, None) {
                                    return slot;
                                }
                                continue;
                            }
                        }
                        if self.outer_done && self.pending_rows.is_empty() && self.ahead.is_none() {
                            self.report_stats();
                            return std::ptr::null_mut();
                        }
                        pg_sys::check_for_interrupts!();
                        self.next_batch();
                        continue;
                    }
                };
                if let Some(slot) = self.emit_row(node, pos, row) {
                    return slot;
                }
            }
        }
    }

    unsafe fn rescan(&mut self, node: *mut pg_sys::CustomScanState) {
        // SAFETY: ReScanCustomScan's argument; children initialized in begin.
        unsafe {
            self.finish_probe();
            self.finish_ahead();
            self.matched.clear();
            self.unmatched_at = 0;
            let chg = (*node).ss.ps.chgParam;
            if !chg.is_null() {
                pg_sys::UpdateChangedParamSet(self.outer, chg);
                pg_sys::UpdateChangedParamSet(self.inner, chg);
            }
            if self.parallel_aware {
                // A parallel plan builds its inner side again at every rescan (the leader's
                // ReInitializeDSM resets the shared state; any participant may build it).
                if (*self.inner).chgParam.is_null() {
                    pg_sys::ExecReScan(self.inner);
                }
                self.ready = false;
                self.rows = InnerRows::default();
                self.awaiting = None;
                self.pending.clear();
                self.pending_rows.clear();
            } else if !(*self.inner).chgParam.is_null() || self.read_from == Some(ReadFrom::Caches) {
                // New parameters for the inner side: build again (ExecProcNode rescans it). A
                // table built from the caches is built again too: the caches are checked
                // against the snapshot again, and the outer keys were probed from them.
                self.drop_table();
                self.ready = false;
            }
            if (*self.outer).chgParam.is_null() {
                pg_sys::ExecReScan(self.outer);
            }
            self.outer_done = false;
            self.agg_done = false;
            for a in &mut self.aggs {
                a.acc = Acc::new(a.acc.kind, a.acc.arg);
            }
            self.batch.clear();
            self.spare.batch.clear();
            let buf = self.emitter.take_buffer();
            self.emitter.reset(buf);
            self.matches = (0, 0);
            self.outer_vals.clear();
            self.outer_nulls.clear();
        }
    }

    unsafe fn end(&mut self, _node: *mut pg_sys::CustomScanState) {
        // SAFETY: EndCustomScan; children and slots made in begin (null in EXPLAIN-only runs
        // that failed before begin).
        unsafe {
            self.count_in_stats();
            self.finish_probe();
            self.finish_ahead();
            self.drop_table();
            // A parallel query's spill segment: this process's pin, and the leader drops it.
            self.rows = InnerRows::default();
            self.spill.finish();
            if let Some(seg) = self.result.take() {
                cleanup::drop_now(&seg);
            }
            for c in [self.outer, self.inner] {
                if !c.is_null() {
                    pg_sys::ExecEndNode(c);
                }
            }
        }
    }

    unsafe fn estimate_dsm(&mut self, _node: *mut pg_sys::CustomScanState, pcxt: *mut pg_sys::ParallelContext) -> usize {
        // SAFETY: PostgreSQL's parallel context.
        shared::shared_bytes(unsafe { (*pcxt).nworkers }.max(0) as usize + 1)
    }

    unsafe fn initialize_dsm(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        pcxt: *mut pg_sys::ParallelContext,
        coordinate: *mut std::ffi::c_void,
    ) {
        // The leader creates the table segment (so that it owns and drops it) and sets up the
        // shared state; a participant grows the segment when it builds.
        self.drop_table();
        let seg = self.create_temp("inner", table::table_bytes(0), None);
        self.table = Some(seg);
        self.owns_table = true;
        let sh = coordinate as *mut Shared;
        // SAFETY: `coordinate` holds the bytes estimate_dsm asked for, in the DSM.
        // (One slot per participant: the leader and every worker the context may start.)
        unsafe {
            let participants = (*pcxt).nworkers.max(0) as u32 + 1;
            let leader_probes = !self.aggs.is_empty() && self.probe.is_some() && super::leader_probes();
            Shared::init(sh, seg, self.p.inner_partial, participants, leader_probes, BATCH_TUPLES);
            // The spill segment, created once the inner side outgrows the participants' hash
            // memory; the leader drops it.
            self.spill = Spill::shared(&(*sh).spill, true, (*sh).budget);
        }
        self.shared = sh;
        self.ready = false;
    }

    unsafe fn reinitialize_dsm(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _pcxt: *mut pg_sys::ParallelContext,
        coordinate: *mut std::ffi::c_void,
    ) {
        // SAFETY: our shared state; no worker runs (the Gather stopped them before a rescan);
        // this process's view of the old rows is dropped first.
        unsafe {
            self.rows = InnerRows::default();
            self.ready = false;
            let sh = coordinate as *mut Shared;
            Shared::reset(sh, (*self.estate).es_query_dsa);
            self.spill = Spill::shared(&(*sh).spill, true, (*sh).budget);
        }
        self.shared = coordinate as *mut Shared;
    }

    unsafe fn initialize_worker(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _toc: *mut pg_sys::shm_toc,
        coordinate: *mut std::ffi::c_void,
    ) {
        let sh = coordinate as *mut Shared;
        self.shared = sh;
        self.owns_table = false;
        self.ready = false;
        // SAFETY: the leader set the shared state up before the workers started.
        unsafe { self.spill = Spill::shared(&(*sh).spill, false, (*sh).budget) };
    }

    unsafe fn shutdown(&mut self, _node: *mut pg_sys::CustomScanState) {
        // The parallel context goes away next: keep the totals for EXPLAIN ANALYZE and forget
        // the shared state (a rescan after this sets up a new one).
        if self.shared.is_null() {
            return;
        }
        // The batch read ahead uses the table, which the leader drops after this.
        self.finish_ahead();
        self.report_stats();
        self.copy_shared_stats();
        // SAFETY: mapped until the Gather above cleans up, after this call.
        unsafe {
            let sh = &*self.shared;
            self.stats.batches = sh.batches.load(std::sync::atomic::Ordering::Relaxed);
            self.stats.gpu = Duration::from_nanos(sh.gpu_ns.load(std::sync::atomic::Ordering::Relaxed));
            self.stats.build = Duration::from_nanos(sh.build_ns.load(std::sync::atomic::Ordering::Relaxed));
            self.stats.ahead = sh.ahead.load(std::sync::atomic::Ordering::Relaxed);
            self.stats.handed =
                Handoff::is_on(&sh.handoff).then(|| sh.handoff.batches.load(std::sync::atomic::Ordering::Relaxed));
        }
        self.shared = std::ptr::null_mut();
        self.rows = InnerRows::default();
        self.spill.leave_shared();
        self.ready = false;
        self.awaiting = None;
        self.pending.clear();
        self.pending_rows.clear();
    }

    unsafe fn explain(
        &mut self,
        node: *mut pg_sys::CustomScanState,
        ancestors: *mut pg_sys::List,
        es: *mut pg_sys::ExplainState,
    ) {
        // SAFETY: forwarded: ExplainCustomScan's arguments.
        unsafe { super::explain::explain(self, node, ancestors, es) }
    }
}

/// The projection `emit_row` can make itself: with no qual and a projection whose target list
/// is plain columns of the scan tuple (`INDEX_VAR` Vars, as `set_customscan_references` leaves
/// them), per output column the scan tuple column it copies (`None` otherwise: the executor's
/// projection runs). Both slots are virtual, the columns' types the same.
///
/// # Safety
/// `node` is an initialized custom scan state (its projection set up by ExecInitCustomScan) whose
/// scan tuple has `ncols` columns.
/// The scan's batches start positional (every key probed) until one forms more pairs than it
/// has tuples (`materialize_batch`).
fn positional_batch() -> Batch {
    let mut b = Batch::default();
    b.set_positional(true);
    b
}

unsafe fn direct_projection(node: *mut pg_sys::CustomScanState, ncols: usize) -> Option<Vec<usize>> {
    // SAFETY: forwarded contract: the plan's target list is a List of TargetEntry.
    unsafe {
        let ps = &(*node).ss.ps;
        if !ps.qual.is_null() || ps.ps_ProjInfo.is_null() || (*ps.ps_ProjInfo).pi_state.resultslot.is_null() {
            return None;
        }
        let tlist = PgList::<pg_sys::TargetEntry>::from_pg((*ps.plan).targetlist);
        let natts = (*(*(*ps.ps_ProjInfo).pi_state.resultslot).tts_tupleDescriptor).natts as usize;
        if tlist.len() != natts {
            return None;
        }
        tlist
            .iter_ptr()
            .map(|te| {
                let var = (*te).expr as *mut pg_sys::Var;
                if var.is_null() || (*var).xpr.type_ != pg_sys::NodeTag::T_Var || (*var).varno != pg_sys::INDEX_VAR {
                    return None;
                }
                usize::try_from((*var).varattno - 1).ok().filter(|&at| at < ncols)
            })
            .collect()
    }
}
