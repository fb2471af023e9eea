//! The outer side: batches of outer tuples probed against the table, their matches formed into
//! joined rows (`super::super::matching`) or folded into the aggregates; the probe mode's
//! batches of keys probed whole.

use super::*;

impl GpuJoinScan {
    /// Makes the next outer batch current and forms its pairs: the batch read ahead if there is
    /// one (its pairs started then), else one read now; false at the end of the outer side.
    ///
    /// In the join mode, once the batch's pairs are all in the emitter (the usual case: they fit
    /// one window), the batch after it is read into the spare storage and its pairs started
    /// ([`GpuJoinScan::read_ahead`]): the GPU service forms them while this batch's rows are
    /// returned, and the next call finds them formed.
    ///
    /// # Safety
    /// Called from exec after the build, with a non-empty inner side.
    pub(super) unsafe fn next_batch(&mut self) -> bool {
        let pending = match self.ahead.take() {
            Some(ahead) => {
                self.swap_spare();
                ahead.pending
            }
            None => {
                // SAFETY: forwarded contract.
                unsafe { self.read_batch() };
                None
            }
        };
        self.matched.clear();
        self.matched.resize(self.batch.len(), false);
        self.unmatched_at = 0;
        if self.batch.is_empty() {
            return !self.outer_done;
        }
        if self.rows.is_empty() || self.batch.distinct().is_empty() {
            // Nothing to probe (an empty inner side of a left or anti join, or a batch of
            // NULL keys): no pair, every tuple unmatched.
            let buf = self.emitter.take_buffer();
            self.emitter.reset(buf);
            self.matches = (0, 0);
        } else {
            self.probe_batch(pending);
        }
        if self.aggs.is_empty() && self.matches.0 >= self.matches.1 && !(self.outer_done && self.pending_rows.is_empty()) {
            // SAFETY: forwarded contract.
            unsafe { self.read_ahead() };
        }
        true
    }

    /// Reads the next outer batch into the current batch's storage (its memory context reset,
    /// its values, NULL flags and keys cleared first): a batch read while the table was built
    /// (`gather_rows_while_building`) first, else tuples of the outer child up to
    /// [`BATCH_TUPLES`]; sets `outer_done` at the outer side's end. A NULL key never matches:
    /// `fetch_chunk` skips those tuples (keeps them for a left or anti join). By-reference
    /// values are copied into the batch's context, which lives until the batch is read again.
    ///
    /// # Safety
    /// As for [`GpuJoinScan::next_batch`].
    unsafe fn read_batch(&mut self) {
        // SAFETY: forwarded contract; tuples are copied into the batch context.
        unsafe {
            pg_sys::MemoryContextReset(self.batch_ctx);
            self.outer_vals.clear();
            self.outer_nulls.clear();
            self.batch.clear();
            let ahead = self.pending_rows.pop_front();
            if let Some(a) = &ahead {
                self.outer_vals.extend_from_slice(&a.vals);
                self.outer_nulls.extend_from_slice(&a.nulls);
                self.batch.extend(&a.keys, &a.keyless);
            }
            let mut chunk = std::mem::take(&mut self.chunk);
            let upto = self.max_outer_att;
            while ahead.is_none() && self.batch.len() < BATCH_TUPLES {
                let ended = fetch_chunk(
                    self.outer,
                    &self.outer_key,
                    upto,
                    &self.outer_resnos,
                    &self.outer_cols,
                    self.batch_ctx,
                    &mut chunk,
                    BATCH_TUPLES - self.batch.len(),
                );
                self.outer_vals.extend_from_slice(&chunk.vals);
                self.outer_nulls.extend_from_slice(&chunk.nulls);
                // Kept NULL keys (left, anti: `Chunk::keep_null_keys`) match nothing.
                self.batch.extend(&chunk.keys, &chunk.keyless);
                if ended {
                    self.outer_done = true;
                    break;
                }
            }
            self.chunk = chunk;
        }
    }

    /// The join mode's read-ahead: reads the batch after the current one into the spare storage
    /// (swapped in, read, swapped back) and starts forming its pairs in the result buffer, whose
    /// pairs of the current batch are all read. The new batch keeps the current one's mode
    /// (distinct keys once a batch was deduplicated: `materialize_batch`).
    ///
    /// # Safety
    /// As for [`GpuJoinScan::next_batch`], with the current batch's pairs all read.
    unsafe fn read_ahead(&mut self) {
        self.swap_spare();
        if !self.spare.batch.positional() && self.batch.positional() {
            self.batch.set_positional(false);
        }
        // SAFETY: forwarded contract (the spare's context holds no value still in use: its
        // batch's rows were all returned).
        unsafe { self.read_batch() };
        let ahead = if self.batch.is_empty() {
            None
        } else if self.rows.is_empty() || self.batch.distinct().is_empty() {
            Some(Ahead { pending: None })
        } else {
            let (table, result) = (self.table.expect("built"), self.result_buffer());
            let (kt, keys) = (self.key, self.batch.distinct());
            let started = crate::runtime::try_executor(|ex| exec::materialize_within_start(ex, &table, &result, kt, keys, true));
            Some(Ahead { pending: Some(started.unwrap_or_else(|e| report(e))) })
        };
        self.swap_spare();
        self.ahead = ahead;
    }

    /// Swaps the current batch's storage with the spare's (`Spare`).
    pub(super) fn swap_spare(&mut self) {
        std::mem::swap(&mut self.batch_ctx, &mut self.spare.ctx);
        std::mem::swap(&mut self.outer_vals, &mut self.spare.vals);
        std::mem::swap(&mut self.outer_nulls, &mut self.spare.nulls);
        std::mem::swap(&mut self.batch, &mut self.spare.batch);
    }

    /// Waits for the batch read ahead, if any, and drops it (a rescan or the end before its
    /// rows were returned): the result buffer and the table are not dropped under its request.
    pub(super) fn finish_ahead(&mut self) {
        if let Some(p) = self.ahead.take().and_then(|a| a.pending) {
            // Its pairs (or the room they needed) are not wanted: only that it is over.
            let _ = p.wait().unwrap_or_else(|e| report(e));
        }
    }

    /// Returns the joined row of outer tuple `pos` of the batch and inner row `row` (with no
    /// inner row, the inner columns NULL: a left join's row without a match; a semi or anti join
    /// returns outer columns only), checked against the qual and projected: the slot to return,
    /// or `None` when the qual rejects it.
    ///
    /// The row's values are gathered first (`row_buf`; a pair naming no row is an ERROR here);
    /// then the executor's per-row calls (the per-tuple memory's reset, the scan slot's clear and
    /// store, the qual, the projection) run inside one pgrx guard, called without a guard each as
    /// [`fetch_chunk`] calls the children: these run once per joined row, and a guard per call
    /// was a `sigsetjmp` each. Nothing in the guarded closure panics or needs dropping. Where the
    /// target list is plain columns and there is no qual (`direct`), the values go straight to
    /// the projection's result slot, with no expression evaluated.
    ///
    /// # Safety
    /// `node` is this node's state, whose scan slot (virtual) has one column per `map` entry; `pos` a
    /// position of the current batch.
    pub(super) unsafe fn emit_row(
        &mut self,
        node: *mut pg_sys::CustomScanState,
        pos: u32,
        row: Option<i64>,
    ) -> Option<*mut pg_sys::TupleTableSlot> {
        let n = self.outer_cols.len();
        let base = pos as usize * n;
        // With payload values (`row_payload`) the pair holds all the row needs; else its row id.
        let by_value = self.payload_values;
        let inner = row.filter(|_| !by_value).map(|r| self.rows.get(r));
        if base + n > self.outer_vals.len() || inner.is_some_and(|ir| ir.is_none()) {
            report(UvmError::new(
                Code::ObjectNotInPrerequisiteState,
                "GpuJoin: a pair names no row (the result buffer was overwritten)",
            ));
        }
        let outer = |at: usize| (self.outer_vals[base + at], self.outer_nulls[base + at]);
        let mut buf = std::mem::take(&mut self.row_buf);
        buf.clear();
        for (i, &(side, _)) in self.p.map.iter().enumerate() {
            buf.push(match (side, row, inner.flatten()) {
                (0, ..) => outer(self.col_index[i]),
                (_, None, _) => (pg_sys::Datum::from(0), true),
                (_, Some(v), _) if by_value => match self.from_outer[i] {
                    Some(o) => outer(o),
                    None => (pg_sys::Datum::from(v as usize), false),
                },
                (_, Some(_), Some(ir)) => self.rows.value(ir, self.col_index[i]),
                (_, Some(_), None) => (pg_sys::Datum::from(0), true),
            });
        }
        // SAFETY: forwarded contract; the slot's arrays have a column per `map` entry (`buf`'s
        // length); the raw calls are PostgreSQL's own for a scan's row (ExecScan's), inside the
        // guard, which turns an ERROR (in the qual or the projection) into a Rust panic at its
        // boundary; the closure holds no value that needs dropping.
        let out = unsafe {
            let scan = (*node).ss.ss_ScanTupleSlot;
            let econtext = (*node).ss.ps.ps_ExprContext;
            let (qual, proj, instrument) = ((*node).ss.ps.qual, (*node).ss.ps.ps_ProjInfo, (*node).ss.ps.instrument);
            let vals: &[(pg_sys::Datum, bool)] = &buf;
            if let Some(direct) = &self.direct {
                // Plain columns and no qual: straight into the projection's result slot.
                let result = (*proj).pi_state.resultslot;
                pg_sys::ffi::pg_guard_ffi_boundary(|| {
                    memory_context_reset_raw((*econtext).ecxt_per_tuple_memory);
                    exec_clear_tuple_raw(result);
                    for (i, &at) in direct.iter().enumerate() {
                        if let Some(&(d, isnull)) = vals.get(at) {
                            *(*result).tts_values.add(i) = d;
                            *(*result).tts_isnull.add(i) = isnull;
                        }
                    }
                    exec_store_virtual_tuple_raw(result);
                });
                self.row_buf = buf;
                self.stats.rows_out += 1;
                return Some(result);
            }
            pg_sys::ffi::pg_guard_ffi_boundary(|| {
                memory_context_reset_raw((*econtext).ecxt_per_tuple_memory);
                exec_clear_tuple_raw(scan);
                for (i, &(d, isnull)) in vals.iter().enumerate() {
                    *(*scan).tts_values.add(i) = d;
                    *(*scan).tts_isnull.add(i) = isnull;
                }
                exec_store_virtual_tuple_raw(scan);
                (*econtext).ecxt_scantuple = scan;
                if !qual.is_null() && !exec_qual_raw(qual, econtext) {
                    if !instrument.is_null() {
                        (*instrument).nfiltered1 += 1.0;
                    }
                    return None;
                }
                Some(if proj.is_null() { scan } else { exec_project_raw(proj) })
            })
        };
        self.row_buf = buf;
        if out.is_some() {
            self.stats.rows_out += 1;
        }
        out
    }

    /// The probe mode's scan: the outer keys probed a batch at a time, each batch's matches and
    /// payload sum folded into the aggregates.
    ///
    /// # Safety
    /// As for exec, after the build, with a table.
    pub(super) unsafe fn probe_all(&mut self) {
        // SAFETY: forwarded contract.
        unsafe {
            let table = self.table.expect("built");
            let mut chunk = std::mem::take(&mut self.chunk);
            loop {
                self.outer_done = self.fetch_keys(&mut chunk);
                if !chunk.keys.is_empty() {
                    self.probe_keys(&table, &chunk.keys);
                }
                if self.outer_done {
                    self.chunk = chunk;
                    return;
                }
                pg_sys::check_for_interrupts!();
                self.serve_handed(false);
            }
        }
    }

    /// Reads the next batch of outer keys (the probe mode: the key alone) into `chunk`; true when
    /// the outer side ended.
    ///
    /// # Safety
    /// As for exec.
    pub(super) unsafe fn fetch_keys(&mut self, chunk: &mut Chunk) -> bool {
        let upto = self.outer_key.max_att();
        // SAFETY: forwarded contract; no column is copied, so no context is used.
        unsafe { fetch_chunk(self.outer, &self.outer_key, upto, &[], &[], self.batch_ctx, chunk, BATCH_TUPLES) }
    }

    /// Probes one batch of outer keys against the table (the probe mode) and folds its
    /// matches and payload sum into the aggregates.
    ///
    /// The probe is started, not waited for (the GPU service; a process's own executor runs it
    /// at once): the batch before it is collected first, so one batch is probed while the next
    /// is read, and [`GpuJoinScan::collect_probe`] takes the last one's results.
    pub(super) fn probe_keys(&mut self, table: &SegRef, keys: &[i64]) {
        self.collect_probe();
        let kt = self.key;
        self.stats.batches += 1;
        let started = self.timed(|ex| exec::probe_start(ex, table, kt, keys));
        self.in_flight = Some(started);
    }

    /// Waits for the probe in flight, if any, and drops its results (a rescan or the end
    /// before the results were returned): the table is not dropped or rebuilt under it.
    pub(super) fn finish_probe(&mut self) {
        if let Some(p) = self.in_flight.take() {
            p.wait().unwrap_or_else(|e| report(e));
        }
    }

    /// Folds the matches and payload sum of the probe in flight, if any, into the aggregates.
    pub(super) fn collect_probe(&mut self) {
        let Some(p) = self.in_flight.take() else { return };
        let t = Instant::now();
        let p = p.wait().map(exec::ProbeSum::from).unwrap_or_else(|e| report(e));
        self.stats.gpu += t.elapsed();
        for a in &mut self.aggs {
            a.acc.add_matches(p.matches, p.sum).unwrap_or_else(|e| report(e));
        }
    }

    /// Folds the matches of one batch of outer keys read before the build ended, when the
    /// builder found a NULL in the aggregated column (the table's payloads are row ids): the
    /// batch is matched as `next_batch` does. Only the probe mode reads keys ahead, and its
    /// aggregates read no outer column but the key.
    ///
    /// # Safety
    /// As for exec, after the build.
    pub(super) unsafe fn match_keys(&mut self, keys: &[i64]) {
        // SAFETY: forwarded contract.
        unsafe {
            pg_sys::MemoryContextReset(self.batch_ctx);
            self.outer_vals.clear();
            self.outer_nulls.clear();
            self.batch.clear();
            let n = self.outer_cols.len();
            for &k in keys {
                // The key's columns (outer_cols is the key alone here); their values are never
                // read.
                for _ in 0..n {
                    self.outer_vals.push(pg_sys::Datum::from(k));
                    self.outer_nulls.push(false);
                }
                self.batch.push(Some(k));
            }
            self.probe_batch(None);
            while let Some((pos, row)) = self.next_match() {
                if let Err(e) = self.fold(pos, row) {
                    report(e);
                }
            }
        }
    }

    /// Whether this participant reads whole batches of outer tuples ahead while another builds
    /// the table (the join mode of a parallel query whose outer columns are all by value).
    pub(super) fn reads_rows_ahead(&self) -> bool {
        !self.shared.is_null() && self.aggs.is_empty() && self.outer_cols.iter().all(|c| c.byval)
    }

    /// The join mode's read-ahead: batches of outer tuples (their keys and kept columns) into
    /// `pending_rows` until the table is built or half the hash memory holds them
    /// ([`PENDING_BATCHES`] at most), as [`GpuJoinScan::gather_while_building`] reads keys.
    ///
    /// # Safety
    /// As for exec, after [`GpuJoinScan::scan_share`].
    pub(super) unsafe fn gather_rows_while_building(&mut self) {
        // Words per tuple: the key, a value and a NULL flag per column, the NULL-key flag.
        let words = 2 + self.outer_cols.len() * 2;
        let most = spill::pending_batches(BATCH_TUPLES * words, PENDING_BATCHES);
        // SAFETY: forwarded contract; every kept column is by value (`reads_rows_ahead`), so no
        // value points into the batch context.
        unsafe {
            while !self.outer_done && self.pending_rows.len() < most && !Shared::is_built(self.shared) {
                let mut chunk = Chunk { keep_null_keys: self.chunk.keep_null_keys, ..Chunk::default() };
                self.outer_done = fetch_chunk(
                    self.outer,
                    &self.outer_key,
                    self.max_outer_att,
                    &self.outer_resnos,
                    &self.outer_cols,
                    self.batch_ctx,
                    &mut chunk,
                    BATCH_TUPLES,
                );
                if !chunk.keys.is_empty() {
                    self.stats.ahead += 1;
                    self.pending_rows.push_back(chunk);
                }
                pg_sys::check_for_interrupts!();
            }
        }
    }

    /// Reads batches of outer keys into `pending` until the table is built or
    /// [`PENDING_BATCHES`] are read (the probe mode, in parallel: see `awaiting`).
    ///
    /// # Safety
    /// As for exec, after [`GpuJoinScan::scan_share`].
    pub(super) unsafe fn gather_while_building(&mut self) {
        // SAFETY: forwarded contract.
        unsafe {
            let most = spill::pending_batches(BATCH_TUPLES, PENDING_BATCHES);
            // The leader that builds for everyone stops reading as soon as it can build.
            let builds = self.takes_keys();
            while !self.outer_done
                && self.pending.len() < most
                && !Shared::is_built(self.shared)
                && (!builds || !Shared::awaits_build(self.shared))
            {
                let mut chunk = Chunk::default();
                self.outer_done = self.fetch_keys(&mut chunk);
                if !chunk.keys.is_empty() {
                    self.pending.push(chunk.keys);
                }
                pg_sys::check_for_interrupts!();
            }
        }
    }

    /// The aggregate mode's exec: folds every joined row of this participant's share into the
    /// aggregates, then returns one row of their (partial) results, once per scan.
    ///
    /// # Safety
    /// As for exec, after the build.
    pub(super) unsafe fn exec_aggregates(&mut self, node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        // SAFETY: forwarded contract; the scan slot has the aggregates' results first.
        unsafe {
            if self.agg_done {
                return std::ptr::null_mut();
            }
            if self.hands_keys {
                // A worker whose leader probes: its partial results stay empty.
                if let Some(t) = self.awaiting.take() {
                    self.stats.build = self.stats.build.max(t.elapsed());
                }
                self.hand_keys();
            } else {
                self.fold_all();
            }
            self.collect_probe();
            self.report_stats();
            self.agg_done = true;
            self.stats.rows_out += 1;
            emit_results(node, self.aggs.iter().map(|a| (&a.acc, a.out)), None)
        }
    }

    /// The aggregate mode's work in a participant that probes: every joined row of its share
    /// folded into the aggregates (and, in the leader of a query whose workers hand their keys
    /// over, theirs too: [`GpuJoinScan::serve_handed`]).
    ///
    /// # Safety
    /// As for [`GpuJoinScan::exec_aggregates`].
    unsafe fn fold_all(&mut self) {
        // SAFETY: forwarded contract.
        unsafe {
            if let Some(t) = self.awaiting.take() {
                self.gather_while_building();
                self.finish_attach();
                self.stats.build = self.stats.build.max(t.elapsed());
            }
            let pending = std::mem::take(&mut self.pending);
            self.stats.ahead += pending.len() as u64;
            if !self.rows.is_empty() {
                let table = self.table.expect("built");
                for keys in &pending {
                    if self.payload_values {
                        self.probe_keys(&table, keys);
                    } else {
                        self.match_keys(keys);
                    }
                }
            }
            drop(pending);
            if !self.rows.is_empty() && self.payload_values {
                self.probe_all();
            } else if !self.rows.is_empty() {
                loop {
                    while let Some((pos, row)) = self.next_match() {
                        if let Err(e) = self.fold(pos, row) {
                            report(e);
                        }
                    }
                    if self.outer_done {
                        break;
                    }
                    pg_sys::check_for_interrupts!();
                    self.serve_handed(false);
                    self.next_batch();
                }
            }
            self.serve_handed(true);
        }
    }

    /// Whether this process probes the keys the workers hand over (the leader of a query set up
    /// so: `crate::node::handoff`).
    fn takes_keys(&self) -> bool {
        // SAFETY: the shared state is mapped while set.
        !self.shared.is_null() && shared::my_slot() == 0 && unsafe { Shared::leader_builds(self.shared) }
    }

    /// The leader of a query whose workers hand their keys over: probes every batch handed
    /// over so far, folding its matches into this participant's aggregates as its own; with
    /// `until_closed`, until no worker may hand any more (waiting for them, answering
    /// interrupts). Every batch is taken, so no worker waits for room forever, even where the
    /// inner side is empty.
    ///
    /// # Safety
    /// As for [`GpuJoinScan::exec_aggregates`], after the build.
    pub(super) unsafe fn serve_handed(&mut self, until_closed: bool) {
        if !self.takes_keys() {
            return;
        }
        // SAFETY: forwarded contract; every taken batch is released before the next take.
        unsafe {
            let h = &raw mut (*self.shared).handoff;
            let area = self.query_area();
            loop {
                // Closed first: every batch pushed before the last worker left is ready then.
                let closed = until_closed && Handoff::try_close(h);
                while let Some(t) = Handoff::take(h) {
                    let keys = Handoff::keys(area, &t);
                    if !self.rows.is_empty() {
                        if self.payload_values {
                            // The probe copies its keys (a request's input) before it returns.
                            let table = self.table.expect("built");
                            self.probe_keys(&table, keys);
                        } else {
                            self.match_keys(keys);
                        }
                    }
                    Handoff::release(h, area, t);
                    pg_sys::check_for_interrupts!();
                }
                if !until_closed || closed {
                    break;
                }
                Handoff::wait(h);
            }
            crate::pgwait::cancel_sleep();
        }
    }

    /// A worker whose leader probes: hands every batch of its share of outer keys to the
    /// leader, then leaves the exchange.
    ///
    /// # Safety
    /// As for [`GpuJoinScan::exec_aggregates`], registered in the exchange.
    unsafe fn hand_keys(&mut self) {
        // SAFETY: forwarded contract.
        unsafe {
            let h = &raw mut (*self.shared).handoff;
            let area = self.query_area();
            let mut chunk = std::mem::take(&mut self.chunk);
            loop {
                let done = self.fetch_keys(&mut chunk);
                Handoff::push(h, area, &chunk.keys).unwrap_or_else(|e| report(e));
                if done {
                    break;
                }
                pg_sys::check_for_interrupts!();
            }
            self.chunk = chunk;
            self.hands_keys = false;
            Handoff::finish(h);
        }
    }

    /// Folds the joined row (outer tuple `pos` of the batch, inner row `row`) into the
    /// aggregates.
    pub(super) fn fold(&mut self, pos: u32, row: i64) -> Result<()> {
        let n = self.outer_cols.len();
        let base = pos as usize * n;
        let (true, Some(ir)) = (base + n <= self.outer_vals.len(), self.rows.get(row)) else {
            return Err(UvmError::new(
                Code::ObjectNotInPrerequisiteState,
                "GpuJoin: a pair names no row (the result buffer was overwritten)",
            ));
        };
        for k in 0..self.aggs.len() {
            let v = match self.aggs[k].col {
                None => None,
                Some(i) => {
                    let (d, isnull) = if self.p.map[i].0 == 0 {
                        let at = base + self.col_index[i];
                        (self.outer_vals[at], self.outer_nulls[at])
                    } else {
                        self.rows.value(ir, self.col_index[i])
                    };
                    (!isnull).then(|| int_of_datum(d, self.aggs[k].acc.arg))
                }
            };
            self.aggs[k].acc.add(v)?;
        }
        Ok(())
    }

    /// Materializes the current batch's keys (distinct, or all of them: `Batch::positional`)
    /// into this participant's result buffer (created at the first batch) and hands the first
    /// window of its pairs to the emitter ([`GpuJoinScan::next_match`] reads the others).
    /// `started`: its pairs' request, started when the batch was read ahead.
    pub(super) fn probe_batch(&mut self, started: Option<exec::WithinPending>) {
        self.stats.batches += 1;
        self.result_buffer();
        let t = Instant::now();
        let got = self.materialize_batch(started);
        self.stats.gpu += t.elapsed();
        self.matches = (0, got.unwrap_or_else(|e| report(e)));
        self.read_matches();
    }

    /// This participant's result buffer, created at its first batch.
    fn result_buffer(&mut self) -> SegRef {
        if let Some(seg) = self.result {
            return seg;
        }
        let seg = self.create_temp("pairs", pairs::bytes_for(RESULT_PAIRS), None);
        *self.result.insert(seg)
    }

    /// The batch's pairs written to the result buffer: their number.
    ///
    /// First within the buffer's present size, which an executor thread of the GPU service runs
    /// in one round trip (the buffer keeps the largest size a batch needed, so this is the rule).
    /// A positional batch (`Batch::set_positional`) whose pairs do not fit there formed more
    /// than one pair per tuple on the whole (repeated inner keys): it is deduplicated, and the
    /// scan goes on with distinct keys, which form fewer pairs where outer keys repeat too. A
    /// batch of distinct keys that does not fit is formed by the main thread, which grows the
    /// buffer.
    fn materialize_batch(&mut self, started: Option<exec::WithinPending>) -> Result<u64> {
        let (table, result) = (self.table.expect("built"), self.result.expect("created"));
        let kt = self.key;
        let batch = &mut self.batch;
        crate::runtime::try_executor(|ex| {
            // One round trip: it resets the buffer and checks its header after.
            let first = match started {
                Some(p) => p.wait()?,
                None => exec::materialize_within(ex, &table, &result, kt, batch.distinct(), true)?,
            };
            if let Ok(p) = first {
                return Ok(p.matches);
            }
            if batch.positional() {
                batch.deduplicate();
                if let Ok(p) = exec::materialize_within(ex, &table, &result, kt, batch.distinct(), true)? {
                    return Ok(p.matches);
                }
            }
            Ok(exec::materialize_reset(ex, &table, &result, kt, batch.distinct(), true)?.matches)
        })
    }

    /// Reads the next window of the batch's pairs ([`spill::match_window`] of them) from the
    /// result buffer into the emitter.
    fn read_matches(&mut self) {
        let (from, m) = self.matches;
        let n = (m - from).min(spill::match_window() as u64);
        let result = self.result.expect("created");
        let mut buf = self.emitter.take_buffer();
        let t = Instant::now();
        let got = crate::runtime::try_executor(|ex| {
            fallible::try_resize(&mut buf, n as usize, [0, 0], "a batch's matches")?;
            // SAFETY: viewing our own [i64; 2] buffer as bytes.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, buf.len() * pairs::PAIR_BYTES as usize) };
            let at = pairs::HEADER_BYTES + from * pairs::PAIR_BYTES;
            exec::read(ex, &result, at as i64, bytes)?;
            Ok(buf)
        });
        self.stats.gpu += t.elapsed();
        self.matches.0 = from + n;
        self.emitter.reset(got.unwrap_or_else(|e| report(e)));
    }

    /// The next (outer position, inner row id) of the batch, reading its pairs a window at a
    /// time; `None` when they are done.
    pub(super) fn next_match(&mut self) -> Option<(u32, i64)> {
        loop {
            if let Some(x) = self.emitter.next(&self.batch) {
                return Some(x);
            }
            if self.matches.0 >= self.matches.1 {
                return None;
            }
            self.read_matches();
        }
    }
}
