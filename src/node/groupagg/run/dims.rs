//! A dimension's rows for the star join (see the module essay): from its own column cache
//! where the plan holds a program for it ([`DimCache`]) and the cache is current for the
//! query's snapshot, else from its plan (PostgreSQL's scan with the dimension's conditions).
//! Either way they become a temporary join table of (key, index of the row's distinct grouping
//! values), the values kept in the node's context for the groups returned, so the fact's
//! program never knows where a dimension came from.
//!
//! From a cache, the dimension's conditions run as a scan program of their own (the fact's
//! machinery, [`run_program`]: kernels where the cache lives in GPU memory, the CPU's loop on
//! the host provider), and its rows never come to the backend: the program groups the rows
//! that pass (a NULL key joins nothing and is filtered out) by the grouping columns alone,
//! with a count, a small table of a slot per distinct tuple (years, nations, brands); then
//! `ScanBuild` (`crate::scan::build`, a kernel on the GPU) runs the same filters again where
//! the cache lies and inserts a pair per row into the join table, its payload the slot of the
//! row's tuple (a key twice in the dimension joins twice). The backend reads back only the
//! small table, for the tuples' values, indexed by slot. No tuple is formed and no heap page
//! read: the dimension costs its cached columns' words, twice, not its plan. A cache with
//! appended rows the snapshot sees (kept beside its blocks, folded on the CPU) takes the older
//! way: grouped by (key, grouping columns), the groups read back a window at a time and each
//! inserted as often as its count. Falls back to the plan (and says why in `EXPLAIN ANALYZE`)
//! where the cache is not current, lacks a planned column, was dropped meanwhile, or the
//! engine runs no programs.
//!
//! In the GPU service each request is a round trip (two wake-ups, 40-120 us measured beside
//! the service's own time), so a cached dimension takes few: its group table made with its
//! empty slots in one request (`exec::create_with`), its scan, its table's window read back,
//! its join table's segment made and then built whole in one more (`exec::scan_build_table`:
//! zeroed, built, its header written), both segments retired to be dropped with the node's
//! others in one request at its end (`GpuGroupAggScan::drop_retired`). SSB's Q4.1 went from
//! 49 requests to 28.
//!
//! The cached dimensions' programs are begun together before any dimension's rows are
//! gathered ([`GpuGroupAggScan::start_dim`]: each one's group table made and its scan
//! started), so that in the GPU service their scans run at once on its executor threads
//! while the node prepares the next; each is then finished in turn, in the dimensions'
//! order. A node that falls back to its child meanwhile waits for those still running
//! ([`settle`]); their tables go with the statement's temporary segments.
//!
//! What the dimensions hold in the backend while their tables are built (a plan's pairs, a
//! cache's pairs where they are read back, and the distinct grouping values of either) may
//! take `work_mem` × `hash_mem_multiplier` together ([`Budget`]), as PostgreSQL's hash joins'
//! tables may; a join table built in place lies in a segment, under the device budget, as the
//! GpuJoin node's inner side does. Past the budget the node reads its child, PostgreSQL's own
//! plan, whose hash joins batch to disk: nothing was returned yet, so the fallback is whole.

use super::*;

/// Where a dimension's rows came from (EXPLAIN ANALYZE's `Dimensions Read From`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DimFrom {
    Cache,
    /// Its plan; where the plan holds a program for its cache, why that did not run.
    Plan(Option<&'static str>),
}

/// Why the node reads its child where the dimensions' rows outgrow their [`Budget`].
pub(super) const OVER_BUDGET: &str = "the dimensions' rows need more than work_mem × hash_mem_multiplier";

/// The bytes the dimensions' rows may still take in the backend (the module comment).
pub(super) struct Budget {
    left: u64,
}

impl Budget {
    /// `work_mem` × `hash_mem_multiplier`, for one execution's dimensions together.
    pub(super) fn new() -> Budget {
        Budget { left: crate::node::spill::hash_memory() }
    }

    /// Takes `bytes`; false (taking nothing) where fewer are left.
    fn take(&mut self, bytes: u64) -> bool {
        let ok = bytes <= self.left;
        if ok {
            self.left -= bytes;
        }
        ok
    }
}

/// Bytes a dimension's pair takes, and a tuple of `n` grouping values besides its text bytes
/// (its datums, and its key in the index of distinct tuples).
const PAIR_BYTES: u64 = 16;
fn tuple_bytes(n: usize) -> u64 {
    64 + 25 * n as u64
}

/// A dimension's rows as the executor gathered them: its join table (none where no row has a
/// key), and the distinct tuples of its grouping columns (a payload is an index among them).
pub(super) struct DimRows {
    pub(super) table: Option<SegRef>,
    pub(super) values: Vec<Vec<(pg_sys::Datum, bool)>>,
    /// How many distinct payloads its table holds at most (its distinct grouping tuples; 1
    /// without grouping columns): a bound on the fact's groups (`GpuGroupAggScan::max_groups`).
    pub(super) tuples: u64,
    /// The share of the dimension's rows its table holds (1 where the rows are not known): of
    /// uniform fact keys, the share of fact rows its join lets pass (the joins' order).
    pub(super) pass: f64,
}

/// `rows` of `of` as a share (1 where `of` is unknown).
fn share(rows: u64, of: Option<f64>) -> f64 {
    match of {
        Some(of) if of >= 1.0 => rows as f64 / of,
        _ => 1.0,
    }
}

/// The rows of table `relid` as the catalog last counted them (`reltuples`), where it did.
///
/// # Safety
/// The query holds a lock on the table (a dimension of its plan).
unsafe fn catalog_rows(relid: pg_sys::Oid) -> Option<f64> {
    // SAFETY: the relation is locked by the query (contract); opened and closed here.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relid);
        if rel.is_null() {
            return None;
        }
        let n = (*(*rel).rd_rel).reltuples;
        pg_sys::RelationClose(rel);
        (n > 0.0).then_some(f64::from(n))
    }
}

/// A cached dimension's program as [`GpuGroupAggScan::start_dim`] left it: its cache, the
/// planned columns' places in it, the appended rows the snapshot sees, the program and its
/// table's first shape, and, where the join table is built in place (no appended rows), the
/// run begun.
pub(super) struct DimStart {
    u: caches::Usable,
    index: Vec<(Col, usize)>,
    tail: crate::cache::tail::TailRows,
    spec: Spec,
    shape: groups::Shape,
    begun: Option<Begun>,
}

/// Waits for the programs [`GpuGroupAggScan::start_dim`] began that no dimension took (the
/// node falls back to its child).
pub(super) fn settle(started: Vec<Option<std::result::Result<DimStart, &'static str>>>) {
    for s in started.into_iter().flatten().flatten() {
        if let Some(b) = s.begun {
            b.settle();
        }
    }
}

/// Why a dimension's program could not run (its plan answers), for the errors that mean so: a
/// cache dropped before the program pinned it, an engine without scan programs. Any other
/// error is raised.
fn program_failed(e: UvmError) -> &'static str {
    match e.code {
        Code::UndefinedObject => "the cache was dropped",
        Code::FeatureNotSupported => "the engine runs no scan programs",
        _ => report(e),
    }
}

/// A new temporary segment for a join table of `rows` rows, and the table's slots.
fn new_table(rows: u64) -> Result<(SegRef, u64)> {
    let size = crate::gpujoin::table::table_bytes(rows).min(i64::MAX as u64) as i64;
    let seg = cleanup::try_create("dim", |name| {
        try_executor(|ex| exec::create(ex, name, size, Some(size), TierPref::Auto, current_user(), now()))
    })?;
    Ok((seg, crate::gpujoin::table::slot_count(rows)))
}

/// The join table of `pairs` (key, payload) in a new temporary segment; none for no pairs.
fn build_table(pairs: &[[i64; 2]], nulls: u64) -> Result<Option<SegRef>> {
    if pairs.is_empty() {
        return Ok(None);
    }
    let rows = pairs.len() as u64;
    let (seg, n) = new_table(rows)?;
    try_executor(|ex| {
        exec::build_begin(ex, &seg, n)?;
        exec::build_insert(ex, &seg, KeyType::Int8, n, pairs)?;
        exec::build_finish(ex, &seg, KeyType::Int8, n, rows, nulls)
    })?;
    Ok(Some(seg))
}

/// The join table of a dimension's `rows` rows in its cache `u` that pass `spec`'s filters,
/// built where the cache lies (`exec::scan_build`), key column `key_col`, each payload the slot
/// of the row's grouping values in `groups` (`spec`'s table over the same cache).
/// (`exec::scan_build_table`: zeroed, built and its header written in one request, which
/// fails where the build inserts other than `rows` pairs.)
fn build_by_program(u: &caches::Usable, groups: &SegRef, spec: &Spec, key_col: usize, rows: u64) -> Result<SegRef> {
    let (seg, n) = new_table(rows)?;
    try_executor(|ex| exec::scan_build_table(ex, &u.seg, groups, &seg, spec, key_col as u32, n, rows))?;
    Ok(seg)
}

impl GpuGroupAggScan {
    /// Dimension `j`'s rows: from its cache where [`Self::start_dim`] found it current
    /// (`started`: what it left; `None` for a dimension without a cached program), else from
    /// its plan; `Err` where they outgrow `budget` (the node must read its child).
    ///
    /// # Safety
    /// The dimension's plan was initialized in begin; the node's values context is live.
    pub(super) unsafe fn dim_rows(
        &mut self,
        j: usize,
        budget: &mut Budget,
        started: Option<std::result::Result<DimStart, &'static str>>,
    ) -> std::result::Result<(DimRows, DimFrom), &'static str> {
        let why = match started {
            // SAFETY: forwarded contract.
            Some(Ok(start)) => match unsafe { self.read_dim_cache(j, budget, start) } {
                Ok(Some(d)) => return Ok((d, DimFrom::Cache)),
                Ok(None) => return Err(OVER_BUDGET),
                Err(why) => Some(why),
            },
            Some(Err(why)) => Some(why),
            None => None,
        };
        // SAFETY: forwarded contract.
        match unsafe { self.drain(j, budget) }.unwrap_or_else(|e| report(e)) {
            Some(d) => Ok((d, DimFrom::Plan(why))),
            None => Err(OVER_BUDGET),
        }
    }

    /// Dimension `j`'s program over its own cache, prepared and, where its join table is built
    /// in place, begun ([`begin_program`]: in the GPU service its scan runs while the node
    /// prepares the next dimension's, so that the dimensions' scans overlap); `None` for a
    /// dimension without a cached program, `Err` for why its plan must run.
    ///
    /// # Safety
    /// `node` is this node's executor state, `snap` the query's snapshot; the dimension's plan
    /// was initialized in begin.
    pub(super) unsafe fn start_dim(
        &self,
        node: *mut pg_sys::CustomScanState,
        j: usize,
        snap: pg_sys::Snapshot,
    ) -> Option<std::result::Result<DimStart, &'static str>> {
        let dim = &self.shape.dims[j];
        let dc = dim.cached.as_ref()?;
        Some((|| {
            let Some(u) = caches::usable_in_query(dim.relid, snap).unwrap_or_else(|e| report(e)) else {
                return Err("the table has no cache current for the query's snapshot");
            };
            let index = cache_index(&u, &dc.columns())?;
            let at = |c: &Col| index_of(&index, c);
            // SAFETY: the query's snapshot, live while it runs.
            let Some(tail) = (unsafe { caches::visible_tail(&u, snap) }).unwrap_or_else(|e| report(e)) else {
                return Err("the cache holds appended rows this snapshot cannot place");
            };
            // Its rows with a key (NULL joins nothing) that pass its conditions, by their
            // grouping columns (built in place) or by (key, grouping columns) (read back),
            // counted.
            let in_place = tail.is_empty();
            let mut filters = vec![Filter::and(at(&dc.key), Test::Range { lo: i64::MIN, hi: i64::MAX })];
            // SAFETY: forwarded contract; the dimension's own conditions of the plan.
            filters.extend(unsafe { program_filters(node, Some(&u), &dc.filters, &dc.compares, &self.shape.texts, &at) }?);
            let by = dc.groups.iter().copied();
            let keys: Vec<Source> = if in_place {
                by.map(|c| Source::Col(at(&c))).collect()
            } else {
                std::iter::once(dc.key).chain(by).map(|c| Source::Col(at(&c))).collect()
            };
            let aggs = vec![(AggKind::CountStar, Input::Star)];
            // (the plan's estimate of its rows as the first size; of its distinct grouping
            // values, at most FIRST_TUPLES: the table grows if they are more)
            // SAFETY: the dimension's plan state, initialized in begin.
            let estimate = unsafe { (*(*self.dims[j]).plan).plan_rows }.max(1.0) as u64;
            let first = match (in_place, dc.groups.is_empty()) {
                (true, true) => 1,
                (true, false) => estimate.clamp(MIN_GROUPS, FIRST_TUPLES),
                (false, _) => estimate.clamp(MIN_GROUPS, MAX_FIRST_GROUPS),
            };
            let shape = groups::Shape {
                key_words: keys.len() as u16 + 1,
                aggs: vec![AggKind::CountStar],
                slot_count: groups::Shape::slots_for(first),
            };
            let spec = Spec { dims: Vec::new(), filters, joins: Vec::new(), keys, aggs };
            let begun = if in_place {
                match begin_program(&u, &spec, shape.clone(), true, 0, &mut Stats::default()) {
                    Ok(b) => Some(b),
                    Err(e) => return Err(program_failed(e)),
                }
            } else {
                None
            };
            Ok(DimStart { u, index, tail, spec, shape, begun })
        })())
    }

    /// Dimension `j`'s rows from its cache (the module comment; `None` where they outgrow
    /// `budget`), its program started by [`Self::start_dim`], or why its plan must run.
    ///
    /// # Safety
    /// As [`Self::dim_rows`]; the dimension has a cached program.
    unsafe fn read_dim_cache(
        &mut self,
        j: usize,
        budget: &mut Budget,
        start: DimStart,
    ) -> std::result::Result<Option<DimRows>, &'static str> {
        let dc = self.shape.dims[j].cached.as_ref().expect("a dimension with a cached program");
        let DimStart { u, index, tail, spec, shape, begun } = start;
        let at = |c: &Col| index_of(&index, c);
        let in_place = begun.is_some();
        let mut stats = Stats::default();
        let ran = match begun {
            Some(b) => finish_program(&u, &tail, &spec, b, 0, &mut stats),
            None => run_program(&u, &tail, &spec, shape, true, 0, &mut stats),
        };
        let ran = ran.map_err(program_failed)?;
        if in_place {
            // SAFETY: forwarded contract.
            let out = unsafe { self.build_in_place(j, &u, &index, &ran, &spec, budget) };
            self.retired.push(ran.seg);
            return out;
        }
        let out = (|| {
            // The dictionaries of its text grouping columns, for the codes the groups hold.
            let mut dicts = Vec::new();
            for g in &dc.groups {
                dicts.push(if g.encoding == Encoding::DictCode { Some(read_dictionary(&u, at(g))?) } else { None });
            }
            // (a count past the rows the cache holds is a table overwritten)
            let bound = u.layout.header().rows.saturating_add(tail.len() as u64);
            let mut rows = DimPairs { bound, ..DimPairs::default() };
            let h = *ran.head.header();
            let mut next = 0u64;
            let mut window = Vec::new();
            while next < h.slot_count {
                pg_sys::check_for_interrupts!();
                let (n, bytes) = read_window(&ran.seg, &h, next, &ran.prefix);
                next += n;
                window.clear();
                ran.head.groups_in(&bytes, &mut window);
                for (key, states) in &window {
                    // SAFETY: forwarded contract (the values context).
                    if !unsafe { self.add_group(j, &dicts, &mut rows, budget, key, states) }.unwrap_or_else(|e| report(e)) {
                        return Ok(None);
                    }
                }
            }
            for (key, states) in &ran.appended {
                // SAFETY: as above.
                if !unsafe { self.add_group(j, &dicts, &mut rows, budget, key, states) }.unwrap_or_else(|e| report(e)) {
                    return Ok(None);
                }
            }
            let table = build_table(&rows.pairs, 0).unwrap_or_else(|e| report(e));
            let tuples = rows.values.len().max(1) as u64;
            Ok(Some(DimRows { table, values: rows.values, tuples, pass: share(rows.total, Some(bound as f64)) }))
        })();
        self.retired.push(ran.seg);
        out
    }

    /// Dimension `j`'s join table built where its cache lies (a cache without appended rows
    /// for the snapshot): `ran` is its program (`spec`: its conditions, grouped by its grouping
    /// columns alone, counted) run over the cache, a small table of a slot per distinct tuple;
    /// `ScanBuild` then inserts a pair per row that passes, its payload the slot of its tuple
    /// (`crate::scan::build`), and the tuples' values are read back from the small table,
    /// indexed by slot. `None` where the values outgrow `budget`.
    ///
    /// # Safety
    /// The node's values context is live.
    unsafe fn build_in_place(
        &mut self,
        j: usize,
        u: &caches::Usable,
        index: &[(Col, usize)],
        ran: &Ran,
        spec: &Spec,
        budget: &mut Budget,
    ) -> std::result::Result<Option<DimRows>, &'static str> {
        let dc = self.shape.dims[j].cached.as_ref().expect("a dimension with a cached program");
        let ng = dc.groups.len();
        let mut dicts = Vec::new();
        for g in &dc.groups {
            dicts.push(if g.encoding == Encoding::DictCode { Some(read_dictionary(u, index_of(index, g))?) } else { None });
        }
        let h = *ran.head.header();
        let mut values: Vec<Vec<(pg_sys::Datum, bool)>> = Vec::new();
        if ng > 0 {
            if !budget.take(h.slot_count.saturating_mul(std::mem::size_of::<Vec<(pg_sys::Datum, bool)>>() as u64)) {
                return Ok(None);
            }
            crate::node::fallible::try_resize(&mut values, h.slot_count as usize, Vec::new(), "a dimension's grouping values")
                .unwrap_or_else(|e| report(e));
        }
        // (a count past the rows the cache holds is a table overwritten)
        let bound = u.layout.header().rows;
        let (mut rows, mut tuples, mut next, mut window) = (0u64, 0u64, 0u64, Vec::new());
        while next < h.slot_count {
            pg_sys::check_for_interrupts!();
            let (n, bytes) = read_window(&ran.seg, &h, next, &ran.prefix);
            window.clear();
            ran.head.indexed_groups_in(&bytes, &mut window);
            for (i, (key, states)) in window.drain(..) {
                let (Some(&(count, _)), Some(&nulls)) = (states.first(), key.get(ng)) else {
                    report(UvmError::new(Code::SystemError, "GpuGroupAgg: a dimension's group table without its keys or count"));
                };
                rows = rows.saturating_add(count);
                tuples += 1;
                if count == 0 || rows > bound {
                    report(UvmError::new(
                        Code::SystemError,
                        format!("GpuGroupAgg: a dimension's group table counts {rows} rows of {bound} cached"),
                    ));
                }
                if ng > 0 {
                    // SAFETY: forwarded contract.
                    match unsafe { self.tuple_of(j, &dicts, &key[..ng], nulls, budget) }.unwrap_or_else(|e| report(e)) {
                        Some(t) => values[(next + i) as usize] = t,
                        None => return Ok(None),
                    }
                }
            }
            next += n;
        }
        let table = if rows == 0 {
            None
        } else {
            match build_by_program(u, &ran.seg, spec, index_of(index, &dc.key), rows) {
                Ok(t) => Some(t),
                // (dropped or rebuilt since its program ran: the plan answers, as there)
                Err(e) if e.code == Code::UndefinedObject => return Err("the cache was dropped"),
                Err(e) => report(e),
            }
        };
        Ok(Some(DimRows { table, values, tuples: tuples.max(1), pass: share(rows, Some(bound as f64)) }))
    }

    /// Adds a group of dimension `j`'s program (key words: its key, its grouping columns'
    /// words, their NULL bits; one count) to `rows`: its pair, as many times as its rows;
    /// false where they outgrow `budget`.
    ///
    /// # Safety
    /// The node's values context is live.
    unsafe fn add_group(
        &self,
        j: usize,
        dicts: &[Option<Vec<u8>>],
        rows: &mut DimPairs,
        budget: &mut Budget,
        key: &[u64],
        states: &[(u64, u64)],
    ) -> Result<bool> {
        let dim = &self.shape.dims[j];
        let dc = dim.cached.as_ref().expect("a dimension with a cached program");
        let ng = dc.groups.len();
        let bad = |why: &str| UvmError::new(Code::SystemError, format!("GpuGroupAgg: a dimension's group table {why}"));
        let (Some(&nulls), Some(&(count, _))) = (key.get(ng + 1), states.first()) else {
            return Err(bad("without its key or count"));
        };
        if nulls & 1 != 0 {
            return Ok(true); // (the program filters NULL keys out)
        }
        rows.total = rows.total.saturating_add(count);
        if count == 0 || rows.total > rows.bound {
            return Err(bad(&format!("counts {} rows of {} cached", rows.total, rows.bound)));
        }
        let mut payload = 0usize;
        if ng > 0 {
            rows.bytes.clear();
            for i in 0..ng {
                let null = nulls & (1 << (i + 1)) != 0;
                rows.bytes.push(u8::from(!null));
                rows.bytes.extend_from_slice(&if null { 0 } else { key[i + 1] }.to_le_bytes());
            }
            payload = match rows.index.get(&rows.bytes) {
                Some(&i) => i,
                None => {
                    // SAFETY: forwarded contract.
                    let Some(tuple) = (unsafe { self.tuple_of(j, dicts, &key[1..=ng], nulls >> 1, budget) })? else {
                        return Ok(false);
                    };
                    crate::node::fallible::try_push(&mut rows.values, tuple, "a dimension's grouping values")?;
                    rows.index.insert(rows.bytes.clone(), rows.values.len() - 1);
                    rows.values.len() - 1
                }
            };
        }
        if !budget.take(count.saturating_mul(PAIR_BYTES)) {
            return Ok(false);
        }
        crate::node::fallible::try_reserve(&mut rows.pairs, count as usize, "a dimension's rows")?;
        for _ in 0..count {
            rows.pairs.push([key[0] as i64, payload as i64]);
        }
        Ok(true)
    }

    /// The values of dimension `j`'s grouping columns whose words are `words` (bit `i` of
    /// `nulls` set: column `i` is NULL), text made from `dicts` in the values context; `None`
    /// where they outgrow `budget`.
    ///
    /// # Safety
    /// The node's values context is live.
    unsafe fn tuple_of(
        &self,
        j: usize,
        dicts: &[Option<Vec<u8>>],
        words: &[u64],
        nulls: u64,
        budget: &mut Budget,
    ) -> Result<Option<Vec<(pg_sys::Datum, bool)>>> {
        let dc = self.shape.dims[j].cached.as_ref().expect("a dimension with a cached program");
        if !budget.take(tuple_bytes(dc.groups.len())) {
            return Ok(None);
        }
        let mut tuple = Vec::with_capacity(dc.groups.len());
        for (i, (g, &w)) in dc.groups.iter().zip(words).enumerate() {
            if nulls & (1 << i) != 0 {
                tuple.push((pg_sys::Datum::from(0), true));
                continue;
            }
            let d = match dicts.get(i).and_then(|d| d.as_ref()) {
                Some(bytes) => {
                    // (opened, not walked: few of a large dictionary's codes)
                    let dict = Dict::open("a text column's dictionary", bytes)?;
                    let Some(s) = u32::try_from(w).ok().and_then(|c| dict.get(c)) else {
                        return Err(UvmError::new(
                            Code::InvalidParameterValue,
                            format!("GpuGroupAgg: a dimension's group table holds code {w}, past its dictionary: the cache is corrupted"),
                        ));
                    };
                    self.dim_seen.borrow_mut().note(64 * j + i, w as u32, s, &dict)?;
                    if !budget.take(s.len() as u64) {
                        return Ok(None);
                    }
                    // SAFETY: a text datum made in the values context (live while the
                    // execution's rows are: contract).
                    unsafe {
                        let old = pg_sys::MemoryContextSwitchTo(self.values_cxt);
                        let t = super::super::values::text_datum(s);
                        pg_sys::MemoryContextSwitchTo(old);
                        t?
                    }
                }
                None => datum_of_word(w, *g),
            };
            tuple.push((d, false));
        }
        Ok(Some(tuple))
    }

    /// Drains dimension `j`'s plan into a join table of (key, index of its distinct grouping
    /// values), keeping the values in the node's context (`None` where they outgrow `budget`).
    ///
    /// # Safety
    /// The dimension's plan was initialized in begin; the node's context is live.
    unsafe fn drain(&mut self, j: usize, budget: &mut Budget) -> Result<Option<DimRows>> {
        let ps = self.dims[j];
        let dim = &self.shape.dims[j];
        let mut pairs: Vec<[i64; 2]> = Vec::new();
        let mut index: std::collections::HashMap<Vec<u8>, usize> = std::collections::HashMap::new();
        let mut values: Vec<Vec<(pg_sys::Datum, bool)>> = Vec::new();
        let mut nulls = 0u64;
        let mut bytes = Vec::new();
        // SAFETY: forwarded contract; each row's attributes are read where the plan's target
        // list puts them (begin found them), of the planned types.
        unsafe {
            loop {
                let slot = pg_sys::ExecProcNode(ps);
                if slot.is_null() || (*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16 != 0 {
                    break;
                }
                let natts = (*(*slot).tts_tupleDescriptor).natts;
                if i32::from((*slot).tts_nvalid) < natts {
                    pg_sys::slot_getsomeattrs_int(slot, natts);
                }
                let at = |i: usize| (*(*slot).tts_values.add(i), *(*slot).tts_isnull.add(i));
                let (k, knull) = at(dim.key_pos);
                if knull {
                    nulls += 1;
                    continue;
                }
                let key = match dim.key.1 {
                    pg_sys::INT2OID => k.value() as i16 as i64,
                    pg_sys::INT4OID | pg_sys::DATEOID => k.value() as i32 as i64,
                    _ => k.value() as i64,
                };
                let mut payload = 0usize;
                if !dim.groups.is_empty() {
                    // the tuple's bytes: per column a NULL flag, then the value's bytes
                    bytes.clear();
                    let mut tuple = Vec::with_capacity(dim.groups.len());
                    for g in &dim.groups {
                        let (v, isnull) = at(g.pos);
                        if isnull {
                            bytes.push(0);
                            tuple.push((pg_sys::Datum::from(0), true));
                        } else if matches!(g.typid, pg_sys::TEXTOID | pg_sys::VARCHAROID) {
                            let p = pg_sys::pg_detoast_datum_packed(v.cast_mut_ptr());
                            let data = std::slice::from_raw_parts(
                                pgrx::varlena::vardata_any(p) as *const u8,
                                pgrx::varlena::varsize_any_exhdr(p),
                            );
                            bytes.push(1);
                            bytes.extend_from_slice(&(data.len() as u64).to_le_bytes());
                            bytes.extend_from_slice(data);
                            tuple.push((pg_sys::Datum::from(p), false));
                        } else {
                            bytes.push(1);
                            bytes.extend_from_slice(&(v.value() as u64).to_le_bytes());
                            tuple.push((v, false));
                        }
                    }
                    payload = match index.get(&bytes) {
                        Some(&i) => i,
                        None => {
                            if !budget.take(tuple_bytes(tuple.len()) + bytes.len() as u64) {
                                return Ok(None);
                            }
                            // a new tuple: its text values copied into the node's context
                            for (g, (v, isnull)) in dim.groups.iter().zip(tuple.iter_mut()) {
                                if !*isnull && matches!(g.typid, pg_sys::TEXTOID | pg_sys::VARCHAROID) {
                                    let p = v.cast_mut_ptr::<pg_sys::varlena>();
                                    let n = pgrx::varlena::varsize_any(p);
                                    let c = pg_sys::MemoryContextAlloc(self.values_cxt, n);
                                    std::ptr::copy_nonoverlapping(p as *const u8, c as *mut u8, n);
                                    *v = pg_sys::Datum::from(c);
                                }
                            }
                            crate::node::fallible::try_push(&mut values, tuple, "a dimension's grouping values")?;
                            index.insert(bytes.clone(), values.len() - 1);
                            values.len() - 1
                        }
                    };
                }
                if !budget.take(PAIR_BYTES) {
                    return Ok(None);
                }
                crate::node::fallible::try_push(&mut pairs, [key, payload as i64], "a dimension's rows")?;
            }
        }
        let table = build_table(&pairs, nulls)?;
        let tuples = values.len().max(1) as u64;
        // SAFETY: a dimension of the plan, locked by the query.
        let pass = share(pairs.len() as u64, unsafe { catalog_rows(dim.relid) });
        Ok(Some(DimRows { table, values, tuples, pass }))
    }
}

/// A dimension's rows gathered from its program's groups.
#[derive(Default)]
struct DimPairs {
    pairs: Vec<[i64; 2]>,
    /// The distinct grouping tuples (by their words and NULL flags), and their values.
    index: std::collections::HashMap<Vec<u8>, usize>,
    values: Vec<Vec<(pg_sys::Datum, bool)>>,
    bytes: Vec<u8>,
    /// Rows counted so far, and the most there can be.
    total: u64,
    bound: u64,
}
