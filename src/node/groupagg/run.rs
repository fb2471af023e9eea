//! The executor's side of GpuGroupAgg: the program run over the cache, the groups returned
//! (see the module essay).

use super::parallel::{self, Exchange};
use super::plan::agg_of;
use super::values::{datum_of, read_dictionary, table_aggs, text_codes, text_datum, SeenStrings};
use super::*;
use crate::node::handoff::Handoff;

mod dims;
mod explain;
mod program;
use dims::{DimFrom, DimRows};
use program::{
    begin_program, cache_index, finish_program, index_of, program_filters, read_window, run_heap_program, run_program, Begun, Ran,
};

/// Where an execution's rows came from (EXPLAIN ANALYZE's `Read From`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadFrom {
    Cache,
    Heap,
    Child(&'static str),
}

/// The groups of one execution: the group table in its segment, read a window of slots at a
/// time (memory bounded by [`window_bytes`]), then the appended rows' groups that no slot had.
struct Groups {
    /// The table's segment, until every slot is read.
    seg: Option<SegRef>,
    head: groups::Head,
    /// The table's first bytes, read with its header (the first window's slots, or all).
    prefix: Vec<u8>,
    /// The first slot not read yet.
    next_slot: u64,
    window: Vec<groups::Group>,
    /// The next of `window` to return.
    at: usize,
    /// The groups of the appended rows (folded in the backend), by key: each one a slot has
    /// is combined into it and removed.
    appended: std::collections::HashMap<Vec<u64>, Vec<(u64, u64)>>,
    /// Whether `appended`'s groups that no slot had were taken (the last window).
    appended_done: bool,
    returned: u64,
}

/// Bytes of a group table read at a time: a quarter of `work_mem`, within 64 KiB and 8 MiB.
fn window_bytes() -> u64 {
    // SAFETY: reads a GUC of this process.
    let work_mem = unsafe { pg_sys::work_mem } as u64 * 1024;
    (work_mem / 4).clamp(64 << 10, 8 << 20)
}

/// What the execution does: not started, returning groups, or returning the child's rows.
enum Mode {
    Start,
    Groups(Box<Groups>),
    Child,
    /// A parallel worker that handed its rows to the runner: it returns none.
    Handed,
}

/// Figures of the last execution (EXPLAIN ANALYZE).
#[derive(Default)]
struct Stats {
    groups: u64,
    grown: u32,
    appended: u64,
    /// Draining the dimensions' plans and building their join tables.
    dims: std::time::Duration,
    /// The scan requests, round trips included, and of that the scanning itself (kernels or
    /// the CPU's loop).
    scan: std::time::Duration,
    scanning: std::time::Duration,
    /// The fact's group table made (its segment created, its header and empty slots written).
    setup: std::time::Duration,
    /// Its slots read back (the windows, each a request: round trips included).
    read: std::time::Duration,
    /// Over the heap: the fact's rows read, the batches they made, and the time spent
    /// reading them (the heap scan's own time included), laying them out and writing them.
    heap_rows: u64,
    batches: u64,
    batching: std::time::Duration,
    /// Of the batches, those the workers handed over (a parallel query's runner).
    handed: u64,
    /// Where each dimension's rows came from.
    dims_from: Vec<DimFrom>,
    /// The dimensions in the order the program probes them.
    join_order: Vec<usize>,
}

/// The strings of a text grouping column of the fact: per dictionary code in the groups, its
/// text datum (in the node's values context).
struct KeyTexts {
    col: Col,
    texts: std::collections::HashMap<u64, pg_sys::Datum>,
}

/// A program's run as [`GpuGroupAggScan::prepare`] sets it up: the program, its group table's
/// first shape, whether it scans at all (a dimension without rows: no fact row joins), and
/// the most groups it can make (0: unknown).
struct Prepared {
    spec: Spec,
    shape: groups::Shape,
    scan: bool,
    bound: u64,
}

/// Rows of a heap batch of the columns `cols`: [`HEAP_BLOCK_ROWS`], fewer where a block of them
/// would pass `work_mem` or [`HEAP_BATCH_BYTES`] (a power of two, at least the cache's smallest
/// block).
fn heap_block_rows(cols: &[Col]) -> u64 {
    // SAFETY: reads a GUC of this process.
    let work_mem = unsafe { pg_sys::work_mem } as u64 * 1024;
    let row_bytes: u64 = cols.iter().map(|c| c.encoding.width()).sum::<u64>().max(1);
    let fit = (work_mem.min(HEAP_BATCH_BYTES) / row_bytes).max(crate::cache::MIN_BLOCK_ROWS);
    HEAP_BLOCK_ROWS.min(1 << fit.ilog2())
}

/// The GpuGroupAgg custom scan.
pub struct GpuGroupAggScan {
    shape: Shape,
    /// PostgreSQL's aggregation, run where the cache is not current.
    child: *mut pg_sys::PlanState,
    /// Over the heap: the fact's scan (its rows the program's columns), the layout of its
    /// batches, and in a parallel query the exchange in the DSM (null: serial).
    fact: *mut pg_sys::PlanState,
    heap_layout: Option<crate::cache::Layout>,
    exchange: *mut Exchange,
    /// Whether the last execution ran with a parallel query's exchange (EXPLAIN).
    parallel: bool,
    /// Each dimension's plan (its scan with its own conditions).
    dims: Vec<*mut pg_sys::PlanState>,
    /// Where the dimensions' distinct grouping values live for an execution.
    values_cxt: pg_sys::MemoryContext,
    drained: Vec<DimRows>,
    /// The fact's text grouping columns: (key word, column, its dictionary's bytes).
    key_dicts: Vec<(usize, Col, Vec<u8>)>,
    /// Their strings for the groups of the current window.
    key_texts: Vec<KeyTexts>,
    /// The strings the fact's text keys decoded to so far, by `key_dicts`' index (as many as
    /// a window's bytes hold).
    key_seen: SeenStrings,
    /// The strings the dimensions' text grouping columns decoded to so far (column `64 j + i`:
    /// dimension `j`'s `i`-th), for this execution.
    dim_seen: std::cell::RefCell<SeenStrings>,
    /// Where those strings live (reset per window).
    window_cxt: pg_sys::MemoryContext,
    estate: *mut pg_sys::EState,
    mode: Mode,
    read_from: Option<ReadFrom>,
    stats: Stats,
    /// The attribute names of the table's columns the plan reads (EXPLAIN).
    names: Vec<(i16, String)>,
    relname: String,
    /// Per dimension: its table's name, its key column's, its grouping columns' (EXPLAIN).
    dim_names: Vec<(String, String, Vec<String>)>,
    /// Temporary segments done with (group tables read, join tables probed), dropped together
    /// at the end of the execution ([`Self::drop_retired`]): one request, where each took its
    /// own in the GPU service. Until then cleanup's list drops them at an abort.
    retired: Vec<SegRef>,
}

impl GpuGroupAggScan {
    /// Computes the groups from the cache, or says why the child answers instead.
    ///
    /// # Safety
    /// `node` is this node's executor state.
    unsafe fn read_cache(&mut self, node: *mut pg_sys::CustomScanState) -> std::result::Result<Groups, &'static str> {
        // SAFETY: the executor state is live while the node runs.
        let snap = unsafe { (*self.estate).es_snapshot };
        let Some(u) = caches::usable_in_query(self.shape.relid, snap).unwrap_or_else(|e| report(e)) else {
            return Err("the table has no cache current for the query's snapshot");
        };
        let index = cache_index(&u, &self.shape.columns())?;
        let at = |c: &Col| index_of(&index, c);
        // SAFETY: the query's snapshot, live while it runs.
        let Some(tail) = (unsafe { caches::visible_tail(&u, snap) }).unwrap_or_else(|e| report(e)) else {
            return Err("the cache holds appended rows this snapshot cannot place");
        };
        // SAFETY: forwarded contract.
        let p = unsafe { self.prepare(node, snap, Some(&u), &at) }?;
        let ran = run_program(&u, &tail, &p.spec, p.shape, p.scan, p.bound, &mut self.stats);
        let ran = Self::ran_or_why(ran)?;
        // The dictionaries of the fact's text grouping columns, for the codes the groups hold.
        self.key_dicts.clear();
        self.key_seen.clear();
        for (w, src) in self.program_keys().iter().enumerate() {
            if let Ok(c) = src {
                if c.encoding == Encoding::DictCode {
                    self.key_dicts.push((w, *c, read_dictionary(&u, at(c))?));
                }
            }
        }
        Ok(self.groups_of(ran))
    }

    /// Computes the groups from the fact's heap: its scan's rows laid out in column batches of
    /// the cache's format, the program run over each (the plan has no text column of the fact).
    ///
    /// # Safety
    /// `node` is this node's executor state.
    unsafe fn read_heap(&mut self, node: *mut pg_sys::CustomScanState) -> std::result::Result<Groups, &'static str> {
        // SAFETY: the executor state is live while the node runs.
        let snap = unsafe { (*self.estate).es_snapshot };
        let cols = self.shape.columns();
        let at = |c: &Col| cols.iter().position(|x| x == c).expect("a planned column");
        // SAFETY: forwarded contract.
        let p = unsafe { self.prepare(node, snap, None, &at) }?;
        self.key_dicts.clear();
        self.key_seen.clear();
        let layout = self.heap_layout.clone().expect("a heap plan's layout, made in begin");
        let handed = self.handed();
        // SAFETY: the fact's scan, initialized in begin, its rows the columns in `cols`' order;
        // the exchange and area of this query, this process its runner.
        let ran = unsafe { run_heap_program(self.fact, &layout, handed, p, &mut self.stats) };
        Self::ran_or_why(ran).map(|r| self.groups_of(r))
    }

    /// In a parallel query over the heap, the exchange's handoff and the query's DSA area.
    fn handed(&self) -> Option<(*mut Handoff, *mut pg_sys::dsa_area)> {
        if self.exchange.is_null() {
            return None;
        }
        // SAFETY: the exchange was set up before any participant ran; the executor state is
        // live.
        let (h, area) = unsafe { (Exchange::handoff(self.exchange), (*self.estate).es_query_dsa) };
        if area.is_null() {
            report(UvmError::new(Code::SystemError, "GpuGroupAgg: a parallel execution without a query DSA area"));
        }
        Some((h, area))
    }

    /// A program's run, or why the child answers instead: a cache dropped before the program
    /// pinned it (a rebuild, cache_drop); an engine without scan programs. The temporary
    /// segments are dropped at the abort of an error, and at the statement's end (cleanup's
    /// list) otherwise.
    fn ran_or_why(ran: Result<Ran>) -> std::result::Result<Ran, &'static str> {
        match ran {
            Ok(x) => Ok(x),
            Err(e) if e.code == Code::UndefinedObject => Err("the cache was dropped"),
            Err(e) if e.code == Code::FeatureNotSupported => Err("the engine runs no scan programs"),
            Err(e) => report(e),
        }
    }

    /// The groups of a program's run, to be returned.
    fn groups_of(&mut self, ran: Ran) -> Groups {
        let Ran { seg, head, prefix, appended } = ran;
        self.stats.groups = head.header().groups;
        self.drop_dims();
        Groups {
            seg: Some(seg),
            head,
            prefix,
            next_slot: 0,
            window: Vec::new(),
            at: 0,
            appended,
            appended_done: false,
            returned: 0,
        }
    }

    /// What a program's run needs, from the cache `u` or the heap (`None`) alike, the fact's
    /// columns by their place `at` in it: the dimensions' join tables (from their rows that
    /// pass their own conditions), the joins in order, the filters, the keys and the
    /// aggregates, and the group table's first shape. Resets the execution's figures.
    ///
    /// # Safety
    /// `node` is this node's executor state; `snap` the query's snapshot.
    unsafe fn prepare(
        &mut self,
        node: *mut pg_sys::CustomScanState,
        snap: pg_sys::Snapshot,
        u: Option<&caches::Usable>,
        at: &dyn Fn(&Col) -> usize,
    ) -> std::result::Result<Prepared, &'static str> {
        let aggs = table_aggs(&self.shape.aggs, at);
        // The dimensions' tables, from their rows that pass their own conditions.
        self.drop_dims();
        self.drained.clear();
        self.dim_seen.borrow_mut().clear();
        // SAFETY: the node's context, made in begin.
        unsafe { pg_sys::MemoryContextReset(self.values_cxt) };
        let t = std::time::Instant::now();
        let mut dims_from = Vec::new();
        let mut budget = dims::Budget::new();
        // The cached dimensions' programs begun together (their scans overlap in the GPU
        // service; `enable_async_dimensions`), then each dimension's rows gathered in turn.
        let together = crate::guc::ENABLE_ASYNC_DIMENSIONS.get();
        let mut started: Vec<_> = (0..self.dims.len())
            // SAFETY: forwarded contract; the dimensions' plans, initialized in begin.
            .map(|j| if together { unsafe { self.start_dim(node, j, snap) } } else { None })
            .collect();
        for j in 0..self.dims.len() {
            // SAFETY: as above.
            let start = if together { started[j].take() } else { unsafe { self.start_dim(node, j, snap) } };
            // SAFETY: as above.
            match unsafe { self.dim_rows(j, &mut budget, start) } {
                Ok((d, from)) => {
                    self.drained.push(d);
                    dims_from.push(from);
                }
                Err(why) => {
                    // (the programs still running are waited for: their tables are dropped
                    // with the statement's temporary segments)
                    dims::settle(started);
                    return Err(why);
                }
            }
        }
        let dims_time = t.elapsed();
        let empty = self.drained.iter().any(|d| d.table.is_none());
        let dim_tables: Vec<SegRef> = self.drained.iter().filter_map(|d| d.table).collect();
        // The joins in the order of the rows they let pass, fewest first (Crystal's rule; as
        // PostgreSQL puts its most selective join lowest): a fact row stops at the first join
        // it fails, so the later probes run for fewer rows. A key from a join's payload names
        // the join by its place in that order.
        let mut order: Vec<usize> = (0..self.drained.len()).collect();
        order.sort_by(|&a, &b| self.drained[a].pass.total_cmp(&self.drained[b].pass));
        let place = |j: usize| order.iter().position(|&x| x == j).expect("every dimension has a place");
        let keys: Vec<Source> = self
            .program_keys()
            .into_iter()
            .map(|k| k.map_or_else(|j| Source::Payload(place(j)), |c| Source::Col(at(&c))))
            .collect();
        // SAFETY: forwarded contract; the plan's own conditions.
        let filters = unsafe { program_filters(node, u, &self.shape.filters, &self.shape.compares, &self.shape.texts, at) }?;
        let spec = Spec {
            dims: if empty { Vec::new() } else { dim_tables },
            filters,
            joins: if empty { Vec::new() } else { order.iter().map(|&j| (at(&self.shape.dims[j].fact_col), j)).collect() },
            keys,
            aggs: aggs.clone(),
        };
        // The table sized for the most groups there can be where the keys' values are counted
        // (room for all of them: the kernels fold in one pass, and a table sized by the
        // planner's estimate of, say, cities × cities × years is not written and read back
        // whole for the few hundred groups there are); else for the planner's estimate.
        let bound = self.max_groups();
        let first = if bound != 0 && bound <= MAX_FIRST_GROUPS { bound } else { self.shape.groups };
        let shape = groups::Shape {
            key_words: spec.keys.len() as u16 + 1,
            aggs: aggs.iter().map(|a| a.0).collect(),
            slot_count: groups::Shape::slots_for(first.clamp(MIN_GROUPS, MAX_FIRST_GROUPS)),
        };
        self.stats = Stats { dims: dims_time, dims_from, join_order: if empty { Vec::new() } else { order }, ..Stats::default() };
        // (a dimension without rows: no fact row joins, the table stays empty)
        Ok(Prepared { spec, shape, scan: !empty, bound })
    }

    /// The next group: from the window of slots read last, reading the next window when it is
    /// used up (combining into each group the appended rows' states of its key), then the
    /// appended rows' groups no slot had, then, for an ungrouped level over no rows, one of
    /// empty states. The group table's segment is dropped once read.
    fn next_group(&mut self) -> Option<groups::Group> {
        let nkeys = self.shape.keys.len();
        loop {
            let Mode::Groups(g) = &mut self.mode else { return None };
            if g.at < g.window.len() {
                g.at += 1;
                g.returned += 1;
                return Some(std::mem::take(&mut g.window[g.at - 1]));
            }
            let h = *g.head.header();
            let rows = if g.next_slot < h.slot_count {
                pg_sys::check_for_interrupts!();
                let seg = g.seg.expect("the group table, until read");
                let t = std::time::Instant::now();
                let (n, bytes) = read_window(&seg, &h, g.next_slot, &g.prefix);
                // (the prefix holds the first window at most: its memory goes with it)
                g.prefix = Vec::new();
                self.stats.read += t.elapsed();
                g.next_slot += n;
                let mut window = Vec::new();
                g.head.groups_in(&bytes, &mut window);
                for (key, states) in &mut window {
                    if let Some(t) = g.appended.remove(key) {
                        groups::combine_states(g.head.aggs(), states, &t);
                    }
                }
                if g.next_slot == h.slot_count {
                    g.seg = None;
                    self.retired.push(seg);
                }
                window
            } else if !g.appended_done {
                // the appended rows' groups no slot had, as a last window
                g.appended_done = true;
                let rest: Vec<groups::Group> = g.appended.drain().collect();
                self.stats.groups += rest.len() as u64;
                rest
            } else {
                // an ungrouped query returns one row over no rows
                if g.returned == 0 && nkeys == 0 {
                    g.returned += 1;
                    return Some((vec![0], vec![(0, 0); g.head.aggs().len()]));
                }
                return None;
            };
            // The strings of the rows' text keys, in the window's context (the last window's
            // rows were all returned).
            // SAFETY: the window context, made in begin.
            unsafe { pg_sys::MemoryContextReset(self.window_cxt) };
            self.key_texts = self.decode_texts(&rows);
            let Mode::Groups(g) = &mut self.mode else { return None };
            g.window = rows;
            g.at = 0;
        }
    }

    /// The text datums of the codes `rows` hold in the fact's text grouping columns, made in
    /// the window's context (reset when the next window is read).
    fn decode_texts(&mut self, rows: &[groups::Group]) -> Vec<KeyTexts> {
        let nsources = self.program_keys().len();
        let mut out = Vec::new();
        for (i, (w, c, bytes)) in self.key_dicts.iter().enumerate() {
            // (opened, not walked: a window holds few of a large dictionary's codes)
            let dict = Dict::open("a text column's dictionary", bytes).unwrap_or_else(|e| report(e));
            let mut texts = std::collections::HashMap::new();
            for (key, _) in rows {
                let (Some(&code), Some(&nulls)) = (key.get(*w), key.get(nsources)) else { continue };
                if nulls & (1 << w) != 0 || texts.contains_key(&code) {
                    continue;
                }
                let Some(s) = u32::try_from(code).ok().and_then(|c| dict.get(c)) else {
                    report(UvmError::new(
                        Code::InvalidParameterValue,
                        format!("GpuGroupAgg: a group of code {code}, past its dictionary: the cache is corrupted"),
                    ));
                };
                let code = code as u32;
                self.key_seen.note(i, code, s, &dict).unwrap_or_else(|e| report(e));
                // SAFETY: a text datum made in the window's context (live while its rows are).
                let d = unsafe {
                    let old = pg_sys::MemoryContextSwitchTo(self.window_cxt);
                    let t = text_datum(s);
                    pg_sys::MemoryContextSwitchTo(old);
                    t.unwrap_or_else(|e| report(e))
                };
                texts.insert(u64::from(code), d);
            }
            out.push(KeyTexts { col: *c, texts });
        }
        out
    }

    /// The fact's heap scan, where the plan reads the heap.
    fn heap_scan(&self) -> Option<&*mut pg_sys::PlanState> {
        (!self.fact.is_null()).then_some(&self.fact)
    }

    /// Retires the group table's segment of this execution if it is still there.
    fn drop_groups(&mut self) {
        if let Mode::Groups(g) = &mut self.mode {
            if let Some(seg) = g.seg.take() {
                self.retired.push(seg);
            }
        }
    }

    /// Drops the retired segments, in one request.
    fn drop_retired(&mut self) {
        let segs = std::mem::take(&mut self.retired);
        cleanup::drop_all_now(&segs);
    }

    /// The program's group key sources, in order: the fact's grouping columns (`Ok`), then one
    /// payload per dimension grouped by (`Err(j)`: join `j`'s).
    fn program_keys(&self) -> Vec<std::result::Result<Col, usize>> {
        let mut out: Vec<std::result::Result<Col, usize>> =
            self.shape.keys.iter().filter_map(|k| if let Key::Fact(c) = k { Some(Ok(*c)) } else { None }).collect();
        out.extend(self.shape.dims.iter().enumerate().filter(|(_, d)| !d.groups.is_empty()).map(|(j, _)| Err(j)));
        out
    }

    /// The most distinct keys the fact's program can make, where every key's values are
    /// counted (0: unknown): the product of each key's distinct values, a dimension's its
    /// distinct grouping tuples (never NULL), a `bool` column's three (NULL among them). A
    /// column of any other type is unknown. For the kernels' one pass (`exec::scan_groups`).
    fn max_groups(&self) -> u64 {
        let mut bound = 1u64;
        for k in self.program_keys() {
            let n = match k {
                Err(j) => self.drained.get(j).map_or(0, |d| d.tuples),
                Ok(c) if c.encoding == Encoding::Bool => 3,
                Ok(_) => 0,
            };
            match bound.checked_mul(n) {
                Some(b) if b != 0 => bound = b,
                _ => return 0,
            }
        }
        bound
    }

    /// Retires the dimensions' tables of this execution (their grouping values stay, for the
    /// rows).
    fn drop_dims(&mut self) {
        for d in &mut self.drained {
            if let Some(t) = d.table.take() {
                self.retired.push(t);
            }
        }
    }

    /// The next group as the node's row (the scan tuple: the keys, then the aggregates,
    /// projected), or null at the end.
    ///
    /// # Safety
    /// `node` is this node's executor state.
    unsafe fn emit(&mut self, node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        let sources = self.program_keys();
        let Some((key, states)) = self.next_group() else { return std::ptr::null_mut() };
        let (key, states) = (&key, &states);
        let nkeys = self.shape.keys.len();
        // SAFETY: forwarded contract: the scan slot has one column per key and per aggregate,
        // of their types; values are made in the per-tuple memory.
        unsafe {
            let econtext = (*node).ss.ps.ps_ExprContext;
            let scan = (*node).ss.ss_ScanTupleSlot;
            pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
            pg_sys::ExecClearTuple(scan);
            let old = pg_sys::MemoryContextSwitchTo((*econtext).ecxt_per_tuple_memory);
            let nulls = key.get(sources.len()).copied().unwrap_or(0);
            for (i, k) in self.shape.keys.iter().enumerate() {
                let (d, isnull) = match *k {
                    Key::Fact(c) => {
                        let w = sources.iter().position(|s| *s == Ok(c)).expect("a fact key");
                        let (word, isnull) = (key.get(w).copied().unwrap_or(0), nulls & (1 << w) != 0);
                        if c.encoding == Encoding::DictCode && !isnull {
                            let t = self.key_texts.iter().find(|t| t.col == c).and_then(|t| t.texts.get(&word));
                            let Some(&d) = t else {
                                report(UvmError::new(Code::SystemError, "GpuGroupAgg: a text group without its string"));
                            };
                            (d, false)
                        } else {
                            (datum_of_word(word, c), isnull)
                        }
                    }
                    Key::Dim { dim, idx } => {
                        let w = sources.iter().position(|s| *s == Err(dim)).expect("a dimension's key");
                        let payload = key.get(w).copied().unwrap_or(0) as usize;
                        let values = self.drained.get(dim).and_then(|d| d.values.get(payload));
                        let Some(&v) = values.and_then(|t| t.get(idx)) else {
                            report(UvmError::new(Code::SystemError, "GpuGroupAgg: a group of an unknown dimension row"));
                        };
                        v
                    }
                };
                *(*scan).tts_values.add(i) = d;
                *(*scan).tts_isnull.add(i) = isnull;
            }
            for i in 0..self.shape.aggs.len() {
                let (d, isnull) = datum_of(&self.shape.aggs, i, states).unwrap_or_else(|e| report(e));
                *(*scan).tts_values.add(nkeys + i) = d;
                *(*scan).tts_isnull.add(nkeys + i) = isnull;
            }
            pg_sys::MemoryContextSwitchTo(old);
            pg_sys::ExecStoreVirtualTuple(scan);
            (*econtext).ecxt_scantuple = scan;
            let proj = (*node).ss.ps.ps_ProjInfo;
            if proj.is_null() {
                scan
            } else {
                pg_sys::ExecProject(proj)
            }
        }
    }
}

impl JoinScan for GpuGroupAggScan {
    const NAME: &'static CStr = c"UvmGpuGroupAgg";

    fn methods() -> &'static Methods {
        &METHODS
    }

    unsafe fn plan(
        _root: *mut pg_sys::PlannerInfo,
        _rel: *mut pg_sys::RelOptInfo,
        path: *mut pg_sys::CustomPath,
        tlist: *mut pg_sys::List,
        _clauses: *mut pg_sys::List,
        custom_plans: *mut pg_sys::List,
    ) -> *mut pg_sys::CustomScan {
        // SAFETY: PlanCustomPath's arguments; the path is ours. The scan tuple is the grouping
        // columns' Vars, then the Aggrefs, which setrefs matches in the target list (whose
        // expressions use only them: `Shape::of`).
        unsafe {
            let shape = Shape::from_private((*path).custom_private)
                .unwrap_or_else(|| report(UvmError::new(Code::SystemError, "GpuGroupAgg: a path without its program")));
            let mut scan_tlist = PgList::<pg_sys::TargetEntry>::new();
            let mut resno = 1i16;
            let exprs = PgList::<pg_sys::Node>::from_pg((*(*path).path.pathtarget).exprs);
            let flags = pg_sys::PVC_INCLUDE_AGGREGATES | pg_sys::PVC_INCLUDE_WINDOWFUNCS | pg_sys::PVC_INCLUDE_PLACEHOLDERS;
            let found =
                PgList::<pg_sys::Node>::from_pg(pg_sys::pull_var_clause(exprs.as_ptr() as *mut pg_sys::Node, flags as i32));
            // the keys in the shape's order: the first Var of each grouping column found in
            // the target, or a Var made for it
            let mut key_vars: Vec<*mut pg_sys::Node> = vec![std::ptr::null_mut(); shape.keys.len()];
            let mut aggrefs: Vec<*mut pg_sys::Node> = vec![std::ptr::null_mut(); shape.aggs.len()];
            for n in found.iter_ptr() {
                if (*n).type_ == pg_sys::NodeTag::T_Var {
                    let v = n as *mut pg_sys::Var;
                    let at = ((*v).varno as u32, (*v).varattno);
                    if let Some(i) = shape.keys.iter().position(|k| shape.key_column(k) == at) {
                        if key_vars[i].is_null() {
                            key_vars[i] = n;
                        }
                    }
                } else if (*n).type_ == pg_sys::NodeTag::T_Aggref {
                    // the aggregate as the planner read it (its columns are the program's)
                    let cols = shape.columns();
                    let cached: Vec<(i16, Encoding)> = cols.iter().map(|c| (c.attnum, c.encoding)).collect();
                    let Some(a) = agg_of(n as *mut pg_sys::Aggref, shape.varno, &cached) else { continue };
                    if let Some(i) = shape.aggs.iter().position(|x| *x == a) {
                        if aggrefs[i].is_null() {
                            aggrefs[i] = n;
                        }
                    }
                }
            }
            for (i, k) in shape.keys.iter().enumerate() {
                if key_vars[i].is_null() {
                    // a grouping column the target does not show: a Var of it, for the scan
                    // tuple's shape
                    let (varno, attnum) = shape.key_column(k);
                    let (typ, typmod, coll) = match k {
                        Key::Fact(c) => (type_of(c.encoding).0, -1, pg_sys::InvalidOid),
                        Key::Dim { dim, idx } => {
                            let g = shape.dims[*dim].groups[*idx];
                            (g.typid, g.typmod, g.collation)
                        }
                    };
                    key_vars[i] = pg_sys::makeVar(varno as _, attnum, typ, typmod, coll, 0) as *mut pg_sys::Node;
                }
            }
            if aggrefs.iter().any(|a| a.is_null()) {
                report(UvmError::new(Code::SystemError, "GpuGroupAgg: an aggregate of the program is not in the target"));
            }
            for n in key_vars.into_iter().chain(aggrefs) {
                let copy = pg_sys::copyObjectImpl(n as *const std::ffi::c_void) as *mut pg_sys::Expr;
                scan_tlist.push(pg_sys::makeTargetEntry(copy, resno, std::ptr::null_mut(), false));
                resno += 1;
            }
            if shape.heap {
                // The fact's scan returns every row: the program tests the conditions (every
                // one of them is the program's: `Shape::of`).
                let plans = PgList::<pg_sys::Plan>::from_pg(custom_plans);
                match plans.get_ptr(plans.len().wrapping_sub(1)) {
                    Some(scan) if (*scan).type_ == pg_sys::NodeTag::T_SeqScan => (*scan).qual = std::ptr::null_mut(),
                    _ => report(UvmError::new(Code::SystemError, "GpuGroupAgg: a heap plan without its fact's scan")),
                }
            }
            customscan::upper_scan(path, tlist, std::ptr::null_mut(), custom_plans, scan_tlist.into_pg(), (*path).custom_private)
        }
    }

    unsafe fn create(cscan: *mut pg_sys::CustomScan) -> Self {
        // SAFETY: our plan: custom_private is what `Shape::to_private` wrote.
        let shape = unsafe { Shape::from_private((*cscan).custom_private) }
            .unwrap_or_else(|| report(UvmError::new(Code::SystemError, "GpuGroupAgg: a plan without its program")));
        GpuGroupAggScan {
            shape,
            child: std::ptr::null_mut(),
            fact: std::ptr::null_mut(),
            heap_layout: None,
            exchange: std::ptr::null_mut(),
            parallel: false,
            dims: Vec::new(),
            values_cxt: std::ptr::null_mut(),
            drained: Vec::new(),
            key_dicts: Vec::new(),
            key_texts: Vec::new(),
            // (a few dozen bytes a code: as many as a window's bytes hold)
            key_seen: SeenStrings::limited(window_bytes() as usize / 48),
            // (each dimension tuple's strings are charged to the dimensions' budget already)
            dim_seen: std::cell::RefCell::new(SeenStrings::limited(usize::MAX)),
            window_cxt: std::ptr::null_mut(),
            estate: std::ptr::null_mut(),
            mode: Mode::Start,
            read_from: None,
            stats: Stats::default(),
            names: Vec::new(),
            relname: String::new(),
            dim_names: Vec::new(),
            retired: Vec::new(),
        }
    }

    unsafe fn begin(&mut self, node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
        // SAFETY: BeginCustomScan's arguments; the child is listed in custom_ps for EXPLAIN.
        unsafe {
            let cscan = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
            // The fallback first, then each dimension's plan, then over the heap the fact's scan.
            let plans = PgList::<pg_sys::Plan>::from_pg((*cscan).custom_plans);
            let mut ps = PgList::<pg_sys::PlanState>::new();
            for (i, plan) in plans.iter_ptr().enumerate() {
                let state = pg_sys::ExecInitNode(plan, estate, eflags);
                if i == 0 {
                    self.child = state;
                } else if i <= self.shape.dims.len() {
                    self.dims.push(state);
                } else {
                    self.fact = state;
                }
                ps.push(state);
            }
            if self.child.is_null() || self.dims.len() != self.shape.dims.len() || self.fact.is_null() == self.shape.heap {
                report(UvmError::new(Code::SystemError, "GpuGroupAgg: a plan without its children"));
            }
            (*node).custom_ps = ps.into_pg();
            self.estate = estate;
            if self.shape.heap {
                // (every participant of a parallel query the same: work_mem is the leader's)
                let cols = self.shape.columns();
                let specs: Vec<crate::cache::ColumnSpec> = cols
                    .iter()
                    .map(|c| crate::cache::ColumnSpec { encoding: c.encoding, attnum: c.attnum, scale: c.scale })
                    .collect();
                let layout = crate::cache::Layout::plan(u32::from(self.shape.relid), &specs, heap_block_rows(&cols))
                    .unwrap_or_else(|e| report(e));
                self.heap_layout = Some(layout);
            }
            // (in the query's context: gone with it)
            self.values_cxt = pg_sys::AllocSetContextCreateInternal(
                pg_sys::CurrentMemoryContext,
                c"UvmGpuGroupAgg values".as_ptr(),
                0,
                8 * 1024,
                8 * 1024 * 1024,
            );
            // (a sibling: resetting the values' context deletes its children)
            self.window_cxt = pg_sys::AllocSetContextCreateInternal(
                pg_sys::CurrentMemoryContext,
                c"UvmGpuGroupAgg window".as_ptr(),
                0,
                8 * 1024,
                8 * 1024 * 1024,
            );
            for d in &self.shape.dims {
                let rel = pg_sys::get_rel_name(d.relid);
                let rel = if rel.is_null() { String::new() } else { CStr::from_ptr(rel).to_string_lossy().into_owned() };
                let name = |att: i16| {
                    let p = pg_sys::get_attname(d.relid, att, true);
                    if p.is_null() {
                        format!("#{att}")
                    } else {
                        CStr::from_ptr(p).to_string_lossy().into_owned()
                    }
                };
                let groups = d.groups.iter().map(|g| format!("{rel}.{}", name(g.attnum))).collect();
                self.dim_names.push((rel.clone(), name(d.key.0), groups));
            }
            let rel = pg_sys::get_rel_name(self.shape.relid);
            if !rel.is_null() {
                self.relname = CStr::from_ptr(rel).to_string_lossy().into_owned();
            }
            for c in self.shape.columns() {
                let p = pg_sys::get_attname(self.shape.relid, c.attnum, true);
                if !p.is_null() {
                    self.names.push((c.attnum, CStr::from_ptr(p).to_string_lossy().into_owned()));
                }
            }
        }
    }

    unsafe fn exec(&mut self, node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        // SAFETY: the exchange, where set, was set up before any participant ran.
        if matches!(self.mode, Mode::Start) && !self.exchange.is_null() && !unsafe { Exchange::runs_here(self.exchange) } {
            // A parallel worker that is not the runner: its share of the rows to the runner.
            let (h, area) = self.handed().expect("a parallel query's exchange");
            let layout = self.heap_layout.as_ref().expect("a heap plan's layout, made in begin");
            // SAFETY: the fact's scan, initialized in begin; this query's exchange and area.
            unsafe { parallel::hand_batches(self.fact, layout, h, area) };
            self.mode = Mode::Handed;
        }
        if matches!(self.mode, Mode::Start) {
            // SAFETY: ExecCustomScan's argument, this node's state.
            let read = if self.shape.heap { unsafe { self.read_heap(node) } } else { unsafe { self.read_cache(node) } };
            self.mode = match read {
                Ok(g) => {
                    self.read_from = Some(if self.shape.heap { ReadFrom::Heap } else { ReadFrom::Cache });
                    Mode::Groups(Box::new(g))
                }
                Err(why) => {
                    self.drop_dims();
                    if let Some((h, area)) = self.handed() {
                        // (the workers' batches taken and freed: they must not wait for room)
                        // SAFETY: this query's exchange and area; this process the runner.
                        unsafe { parallel::drain(h, area) };
                    }
                    self.read_from = Some(ReadFrom::Child(why));
                    Mode::Child
                }
            };
        }
        // SAFETY: ExecCustomScan's argument; the child was initialized in begin and returns
        // rows of the node's own target list (the same expressions), copied into the node's
        // result slot.
        unsafe {
            match self.mode {
                Mode::Handed => std::ptr::null_mut(),
                Mode::Child => {
                    let slot = pg_sys::ExecProcNode(self.child);
                    if slot.is_null() || (*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16 != 0 {
                        return std::ptr::null_mut();
                    }
                    let out = (*node).ss.ps.ps_ResultTupleSlot;
                    pg_sys::ExecCopySlot(out, slot)
                }
                _ => self.emit(node),
            }
        }
    }

    unsafe fn rescan(&mut self, node: *mut pg_sys::CustomScanState) {
        // SAFETY: ReScanCustomScan's argument; the child initialized in begin.
        unsafe {
            let chg = (*node).ss.ps.chgParam;
            for &c in std::iter::once(&self.child).chain(&self.dims).chain(self.heap_scan()) {
                if !chg.is_null() {
                    pg_sys::UpdateChangedParamSet(c, chg);
                }
                if (*c).chgParam.is_null() {
                    pg_sys::ExecReScan(c);
                }
            }
        }
        self.drop_dims();
        self.drop_groups();
        self.drop_retired();
        self.drained.clear();
        self.mode = Mode::Start;
    }

    unsafe fn end(&mut self, _node: *mut pg_sys::CustomScanState) {
        self.drop_dims();
        self.drop_groups();
        self.drop_retired();
        // SAFETY: initialized in begin.
        unsafe {
            for &c in std::iter::once(&self.child).chain(&self.dims).chain(self.heap_scan()) {
                if !c.is_null() {
                    pg_sys::ExecEndNode(c);
                }
            }
        }
    }

    unsafe fn estimate_dsm(&mut self, _node: *mut pg_sys::CustomScanState, _pcxt: *mut pg_sys::ParallelContext) -> usize {
        parallel::exchange_bytes()
    }

    unsafe fn initialize_dsm(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _pcxt: *mut pg_sys::ParallelContext,
        coordinate: *mut std::ffi::c_void,
    ) {
        let x = coordinate as *mut Exchange;
        let block = self.heap_layout.as_ref().map_or(0, |l| l.header().block_bytes);
        // SAFETY: `coordinate` holds the bytes estimate_dsm asked for; no worker runs yet.
        unsafe { Exchange::init(x, block) };
        self.exchange = x;
        self.parallel = true;
    }

    unsafe fn reinitialize_dsm(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _pcxt: *mut pg_sys::ParallelContext,
        coordinate: *mut std::ffi::c_void,
    ) {
        let x = coordinate as *mut Exchange;
        // SAFETY: our exchange; no worker runs (the Gather stopped them before a rescan).
        unsafe { Exchange::reset(x, (*self.estate).es_query_dsa) };
        self.exchange = x;
    }

    unsafe fn initialize_worker(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _toc: *mut pg_sys::shm_toc,
        coordinate: *mut std::ffi::c_void,
    ) {
        self.exchange = coordinate as *mut Exchange;
        self.parallel = true;
    }

    unsafe fn shutdown(&mut self, _node: *mut pg_sys::CustomScanState) {
        // The parallel context goes away next (a rescan after this sets up a new one).
        self.exchange = std::ptr::null_mut();
    }

    unsafe fn explain(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _ancestors: *mut pg_sys::List,
        es: *mut pg_sys::ExplainState,
    ) {
        // SAFETY: forwarded contract.
        unsafe { self.explain_node(es) }
    }
}

/// The type and typmod of a grouping column's Var made for the scan tuple.
fn type_of(e: Encoding) -> (pg_sys::Oid, i32) {
    let t = match e {
        Encoding::Bool => pg_sys::BOOLOID,
        Encoding::Int2 => pg_sys::INT2OID,
        Encoding::Int4 => pg_sys::INT4OID,
        Encoding::Date => pg_sys::DATEOID,
        Encoding::Timestamp => pg_sys::TIMESTAMPOID,
        Encoding::TimestampTz => pg_sys::TIMESTAMPTZOID,
        Encoding::DictCode => pg_sys::TEXTOID,
        Encoding::Numeric => pg_sys::NUMERICOID,
        Encoding::Float4 => pg_sys::FLOAT4OID,
        Encoding::Float8 => pg_sys::FLOAT8OID,
        _ => pg_sys::INT8OID,
    };
    (t, -1)
}
