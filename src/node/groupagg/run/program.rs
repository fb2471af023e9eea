//! A scan program's run over one column cache, for the fact and for a cached dimension alike:
//! the planned columns found in the cache, the plan's clauses made the program's filters (a
//! text condition evaluated by PostgreSQL over its column's dictionary), the run into a
//! temporary group table that grows and resumes whenever it fills, and the appended rows the
//! snapshot sees folded on the CPU beside it (see the module essay, "Executor").

use super::parallel::{self, RowReader};
use super::*;

/// The header of the group table in `seg`, and the bytes the same read brought: the table's
/// start, as far as its first window ([`read_window`]) reaches, so that a small table (every
/// SSB query's, and every dimension's) is read back in one request, not two.
fn read_head(seg: &SegRef) -> Result<(groups::Head, Vec<u8>)> {
    let (_, info) = crate::runtime::lookup_own(seg.name())?;
    let len = (groups::Head::PREFIX_BYTES + window_bytes()).min(info.size);
    let mut prefix = Vec::new();
    crate::node::fallible::try_resize(&mut prefix, len as usize, 0u8, "a group table's first window")?;
    try_executor(|ex| exec::read(ex, seg, 0, &mut prefix))?;
    let head = groups::Head::parse(seg.name(), &prefix, info.size)?;
    Ok((head, prefix))
}

/// The planned columns `cols` by their index in the cache `u`, where it holds each with the
/// planned encoding (and, for `numeric`, scale).
pub(super) fn cache_index(u: &caches::Usable, cols: &[Col]) -> std::result::Result<Vec<(Col, usize)>, &'static str> {
    let mut index = Vec::new();
    for &c in cols {
        match u.layout.columns().iter().position(|x| x.attnum == c.attnum) {
            Some(i)
                if u.layout.encoding(i) == Some(c.encoding)
                    && (c.encoding != Encoding::Numeric || u.layout.columns()[i].scale == c.scale) =>
            {
                index.push((c, i))
            }
            _ => return Err("the cache lacks a column the plan reads"),
        }
    }
    Ok(index)
}

/// Column `c`'s index in the cache, from [`cache_index`]'s list (which holds every planned
/// column).
pub(super) fn index_of(index: &[(Col, usize)], c: &Col) -> usize {
    index.iter().find(|x| x.0 == *c).map(|x| x.1).expect("a planned column")
}

/// The program's filters for the clauses `clauses` (comparisons in `compares`, text conditions
/// in `texts`) over the cache `u` (`None`: the heap's batches), its columns' indexes by `at`:
/// a text condition as the codes of its column's strings that pass it (PostgreSQL evaluates it
/// per string; the heap's batches hold no text).
///
/// # Safety
/// `node` is the node's executor state; the clauses are its plan's.
pub(super) unsafe fn program_filters(
    node: *mut pg_sys::CustomScanState,
    u: Option<&caches::Usable>,
    clauses: &[Vec<Atom>],
    compares: &[PlanCompare],
    texts: &[*mut pg_sys::Node],
    at: &dyn Fn(&Col) -> usize,
) -> std::result::Result<Vec<Filter>, &'static str> {
    let mut filters = Vec::new();
    let mut bitmap_bytes = 0usize;
    for clause in clauses {
        for (i, a) in clause.iter().enumerate() {
            let first = filters.len();
            match a.check {
                Check::Range { lo, hi } => filters.push(Filter::or(at(&a.col), Test::Range { lo, hi })),
                Check::Null => filters.push(Filter::or(at(&a.col), Test::Null)),
                Check::Compare(n) => {
                    // its steps' columns by their index in the cache
                    let c = &compares[n];
                    let map = |steps: &[Step]| -> Vec<Step> {
                        steps.iter().map(|s| if let Step::Col(i) = *s { Step::Col(at(&c.cols[i])) } else { *s }).collect()
                    };
                    let expr = Compare { lhs: map(&c.expr.lhs), cmp: c.expr.cmp, rhs: map(&c.expr.rhs) };
                    filters.push(Filter::or(at(&a.col), Test::Compare(expr)));
                }
                Check::Text(n) => {
                    let u = u.ok_or("a text condition without its column's dictionary")?;
                    let bytes = read_dictionary(u, at(&a.col))?;
                    let dict = Dict::parse("a text column's dictionary", &bytes).unwrap_or_else(|e| report(e));
                    // SAFETY: forwarded contract; a text condition of the plan.
                    let (bits, null) = unsafe { text_codes(node, &dict, a.col.attnum, texts[n]) };
                    bitmap_bytes += bits.len();
                    filters.push(Filter::or(at(&a.col), Test::Codes(bits)));
                    if null {
                        filters.push(Filter::or(at(&a.col), Test::Null));
                    }
                }
            }
            // (the clause's first alternative starts it)
            filters[first].or = i > 0;
        }
    }
    // (with room for the comparisons' steps: at most 64 filters of 1,040 bytes)
    if bitmap_bytes + (128 << 10) > exec::scan::MAX_BITMAP_BYTES {
        return Err("the text conditions' dictionaries are too large for a program");
    }
    Ok(filters)
}

/// A program's run over one cache: its group table (left in its segment), the table's header,
/// and the groups of the appended rows the snapshot sees, folded on the CPU.
pub(super) struct Ran {
    pub(super) seg: SegRef,
    pub(super) head: groups::Head,
    /// The table's first bytes, read with its header ([`read_head`]).
    pub(super) prefix: Vec<u8>,
    pub(super) appended: std::collections::HashMap<Vec<u64>, Vec<(u64, u64)>>,
}

/// A program's run begun ([`begin_program`]): its first group table, and its first scan
/// request in flight (none where it does not scan).
pub(super) struct Begun {
    seg: SegRef,
    shape: groups::Shape,
    first: Option<exec::ScanGroupsPending>,
}

impl Begun {
    /// Waits for its scan, if one is in flight, ignoring how it ended (a node falling back to
    /// its child: the table goes with the statement's temporary segments).
    pub(super) fn settle(self) {
        if let Some(p) = self.first {
            let _ = p.wait();
        }
    }
}

/// A new temporary group table of `shape` (its segment, not yet a table).
fn new_groups(shape: &groups::Shape) -> Result<SegRef> {
    let bytes = shape.bytes().min(i64::MAX as u64) as i64;
    cleanup::try_create("groups", |name| {
        try_executor(|ex| exec::create(ex, name, bytes, Some(bytes), TierPref::Auto, current_user(), now()))
    })
}

/// A new temporary group table of `shape`, empty (its header and empty slots written with its
/// creation: `exec::create_with`, one request where it fits).
fn new_empty_groups(shape: &groups::Shape) -> Result<SegRef> {
    let mut init = Vec::new();
    crate::node::fallible::try_resize(&mut init, shape.bytes() as usize, 0u8, "a group table")?;
    groups::init(&mut init, shape, 0x5eed)?;
    let bytes = shape.bytes().min(i64::MAX as u64) as i64;
    cleanup::try_create("groups", |name| {
        try_executor(|ex| exec::create_with(ex, name, bytes, Some(bytes), TierPref::Auto, current_user(), now(), &init))
    })
}

/// Begins [`run_program`]: makes its group table of `shape` (its header and empty slots
/// written) and starts the scan over the cache `u`, which runs in the GPU service while the
/// caller goes on (a star join begins its dimensions' programs together, then finishes each:
/// their scans overlap) and has run already elsewhere. `scan` false: no scan, an empty table.
pub(super) fn begin_program(
    u: &caches::Usable,
    spec: &Spec,
    shape: groups::Shape,
    scan: bool,
    max_groups: u64,
    stats: &mut Stats,
) -> Result<Begun> {
    let t = std::time::Instant::now();
    let seg = new_empty_groups(&shape)?;
    stats.setup += t.elapsed();
    let first =
        if scan { Some(try_executor(|ex| exec::scan_groups_start(ex, &u.seg, &seg, spec, (0, 0), max_groups))?) } else { None };
    Ok(Begun { seg, shape, first })
}

/// Runs `spec` over the cache `u` and its visible appended rows `tail` into a new temporary
/// group table of `shape`, growing it into a segment of more slots whenever the program stops
/// full (`exec::groups_grow`); where `scan` is false, the table stays empty (a dimension
/// without rows: no fact row joins). The appended rows are folded by the same program on the
/// CPU ([`crate::scan::fold_row`], over the join tables read back) into a table of their own.
/// `max_groups`: the most distinct keys the program can make (0: unknown; `exec::scan_groups`).
pub(super) fn run_program(
    u: &caches::Usable,
    tail: &crate::cache::tail::TailRows,
    spec: &Spec,
    shape: groups::Shape,
    scan: bool,
    max_groups: u64,
    stats: &mut Stats,
) -> Result<Ran> {
    let begun = begin_program(u, spec, shape, scan, max_groups, stats)?;
    finish_program(u, tail, spec, begun, max_groups, stats)
}

/// Ends [`begin_program`]'s run: waits for its scan, and grows the table and resumes the scan
/// until it is done; then reads the table's header back and folds the appended rows.
pub(super) fn finish_program(
    u: &caches::Usable,
    tail: &crate::cache::tail::TailRows,
    spec: &Spec,
    begun: Begun,
    max_groups: u64,
    stats: &mut Stats,
) -> Result<Ran> {
    let Begun { mut seg, mut shape, mut first } = begun;
    let scan = first.is_some();
    let (mut start, mut done) = ((0, 0), !scan);
    while !done {
        let t = std::time::Instant::now();
        let (progress, scanning) = match first.take() {
            Some(p) => p.wait()?,
            None => try_executor(|ex| exec::scan_groups(ex, &u.seg, &seg, spec, start, max_groups))?,
        };
        stats.scan += t.elapsed();
        stats.scanning += scanning;
        match progress {
            Progress::Done => done = true,
            Progress::Full { block, row, slots } => {
                grow(&mut seg, &mut shape, slots, stats)?;
                start = (block, row);
            }
        }
    }
    // The table stays in its segment (cleanup's list drops it however the statement ends).
    let t = std::time::Instant::now();
    let (head, prefix) = read_head(&seg)?;
    stats.read += t.elapsed();
    let tail_rows = if scan { tail.len() } else { 0 };
    let mut appended = std::collections::HashMap::new();
    if tail_rows == 0 {
        return Ok(Ran { seg, head, prefix, appended });
    }
    let tables: Vec<Vec<u64>> = spec.dims.iter().map(read_table).collect::<Result<_>>()?;
    let mut joins = Vec::new();
    for (&(col, _), t) in spec.joins.iter().zip(&tables) {
        let table = crate::gpujoin::table::Table::view_words("dimension table", t)?;
        joins.push(crate::scan::Join { col, table });
    }
    let program = Program { filters: spec.filters.clone(), joins, keys: spec.keys.clone(), aggs: spec.aggs.clone() };
    let mut local = shape.with_slots(groups::Shape::slots_for(MIN_GROUPS));
    let mut bytes = Vec::new();
    crate::node::fallible::try_resize(&mut bytes, local.bytes() as usize, 0u8, "a group table")?;
    groups::init(&mut bytes, &local, 0x5eed)?;
    let mut scratch = crate::scan::Scratch::default();
    let mut i = 0;
    while i < tail_rows {
        let full = {
            let mut t = groups::Table::parse("group table", &mut bytes)?;
            match crate::scan::fold_row(&program, &mut t, &mut scratch, |c| Ok(tail.word(i, c)))? {
                Row::Full(slots) => Some(slots),
                Row::Folded | Row::Dropped => None,
            }
        };
        match full {
            None => {
                i += 1;
                stats.appended += 1;
            }
            Some(slots) => {
                let mut to = Vec::new();
                crate::node::fallible::try_resize(&mut to, local.with_slots(slots).bytes() as usize, 0u8, "a group table")?;
                let mut from = groups::Table::parse("group table", &mut bytes)?;
                groups::grow(&mut from, &mut to, slots)?;
                (bytes, local.slot_count) = (to, slots);
            }
        }
        if i.is_multiple_of(crate::interrupt::EVERY as usize) {
            pg_sys::check_for_interrupts!();
        }
    }
    appended.extend(groups::Table::parse("group table", &mut bytes).and_then(|mut t| t.groups())?);
    Ok(Ran { seg, head, prefix, appended })
}

/// Grows the group table in `seg` (of `shape`) into a new segment of `slots` slots, which
/// replaces it, as a program that stopped full needs before it resumes.
fn grow(seg: &mut SegRef, shape: &mut groups::Shape, slots: u64, stats: &mut Stats) -> Result<()> {
    let next = new_groups(&shape.with_slots(slots))?;
    try_executor(|ex| exec::groups_grow(ex, seg, &next, slots))?;
    cleanup::drop_now(seg);
    (*seg, shape.slot_count) = (next, slots);
    stats.grown += 1;
    Ok(())
}

/// Runs `p`'s program over the rows of the fact's heap scan `fact` into a new temporary group
/// table of its shape (where it does not scan: no row read, the table stays empty), as
/// [`run_program`] over a cache:
/// the rows laid out in blocks of `layout` (the program's columns in order: the scan's rows),
/// each block written to one of two batch segments in turn, as a cache of one block, and
/// scanned there while the next one is filled (in the GPU service the scan runs meanwhile);
/// one scan runs at a time, since a table that fills grows before the program resumes. In a
/// parallel query (`handed`: the exchange and the query's DSA area; `super::super::parallel`)
/// the workers' batches are taken too, before each of this process's own, until no worker may
/// hand one any more.
///
/// # Safety
/// `fact` is the node's initialized heap scan, whose rows are `layout`'s columns in order;
/// `handed`, where given, the query's exchange and DSA area, and this process the runner.
pub(super) unsafe fn run_heap_program(
    fact: *mut pg_sys::PlanState,
    layout: &crate::cache::Layout,
    handed: Option<(*mut Handoff, *mut pg_sys::dsa_area)>,
    p: Prepared,
    stats: &mut Stats,
) -> Result<Ran> {
    let Prepared { spec, shape, scan, bound: max_groups } = p;
    let spec = &spec;
    let t = std::time::Instant::now();
    let mut seg = new_empty_groups(&shape)?;
    stats.setup += t.elapsed();
    let mut run = Batches { segs: Vec::new(), which: 0, pending: None, layout, spec, max_groups, shape };
    if !scan {
        // (no fact row joins: the workers' batches are taken and freed all the same)
        if let Some((h, area)) = handed {
            // SAFETY: forwarded contract.
            unsafe { parallel::drain(h, area) };
        }
    } else {
        let mut rows = RowReader::new(layout);
        let mut own = true;
        loop {
            if let Some((h, area)) = handed {
                // SAFETY: forwarded contract; every taken batch is released before the next
                // take, its bytes written to a segment (copied) before.
                unsafe {
                    // (closed first: every batch pushed before the last worker left is ready)
                    let closed = !own && Handoff::try_close(h);
                    while let Some(t) = Handoff::take(h) {
                        let r = run.block(parallel::bytes_of(Handoff::keys(area, &t)), &mut seg, stats);
                        Handoff::release(h, area, t);
                        stats.handed += 1;
                        r?;
                        pg_sys::check_for_interrupts!();
                    }
                    if !own {
                        if closed {
                            break;
                        }
                        Handoff::wait(h);
                        continue;
                    }
                }
            } else if !own {
                break;
            }
            let t = std::time::Instant::now();
            // (in parallel, a share of a block at a time: the workers' batches are taken
            // between them)
            let most = if handed.is_some() { parallel::POLL_ROWS } else { usize::MAX };
            // SAFETY: forwarded contract.
            let filled = unsafe { rows.fill_some(fact, most) }?;
            stats.batching += t.elapsed();
            if let Some((block, more)) = filled {
                own = more;
                if block.rows() > 0 {
                    run.block(&block.finish(), &mut seg, stats)?;
                }
            }
        }
        crate::pgwait::cancel_sleep();
        run.finish(&mut seg, stats)?;
        cleanup::drop_all_now(&run.segs);
    }
    let t = std::time::Instant::now();
    let (head, prefix) = read_head(&seg)?;
    stats.read += t.elapsed();
    Ok(Ran { seg, head, prefix, appended: std::collections::HashMap::new() })
}

/// The batches of a run over the heap: two segments written and scanned in turn, the scan of
/// the last one written in flight (see [`run_heap_program`]).
struct Batches<'a> {
    segs: Vec<SegRef>,
    which: usize,
    pending: Option<(exec::ScanGroupsPending, usize)>,
    layout: &'a crate::cache::Layout,
    spec: &'a Spec,
    max_groups: u64,
    shape: groups::Shape,
}

impl Batches<'_> {
    /// Scans one block's bytes (a block of the layout, its count set, from this process or a
    /// worker): written as a cache of one block to the next segment, the scan of the one before
    /// finished, this one's started.
    fn block(&mut self, bytes: &[u8], seg: &mut SegRef, stats: &mut Stats) -> Result<()> {
        let one = self.layout.one_block();
        if bytes.len() as u64 != one.header().block_bytes {
            return Err(UvmError::new(Code::SystemError, "GpuGroupAgg: a batch of another size than its layout's"));
        }
        let rows = one.block_rows(bytes, 0)?;
        let t = std::time::Instant::now();
        if self.segs.len() < 2 {
            let size = self.layout.bytes_for(1).min(i64::MAX as u64) as i64;
            self.segs.push(cleanup::try_create("batch", |name| {
                try_executor(|ex| exec::create(ex, name, size, Some(size), TierPref::Auto, current_user(), now()))
            })?);
        }
        // The batch: the layout's header for one block of `rows` rows, then the block.
        let mut head = self.layout.clone();
        head.set_extent(1, rows)?;
        let at = self.layout.header().data_offset as i64;
        let target = &self.segs[self.which];
        try_executor(|ex| exec::write(ex, target, 0, &head.prefix()))?;
        try_executor(|ex| exec::write(ex, target, at, bytes))?;
        stats.batching += t.elapsed();
        stats.heap_rows += rows;
        self.finish(seg, stats)?;
        let t = std::time::Instant::now();
        let (spec, max_groups, target) = (self.spec, self.max_groups, &self.segs[self.which]);
        let p = try_executor(|ex| exec::scan_groups_start(ex, target, seg, spec, (0, 0), max_groups))?;
        self.pending = Some((p, self.which));
        stats.scan += t.elapsed();
        stats.batches += 1;
        self.which ^= 1;
        Ok(())
    }

    /// Finishes the scan in flight, if any.
    fn finish(&mut self, seg: &mut SegRef, stats: &mut Stats) -> Result<()> {
        match self.pending.take() {
            Some((p, b)) => finish_batch(p, &self.segs[b], seg, &mut self.shape, self.spec, self.max_groups, stats),
            None => Ok(()),
        }
    }
}

/// Waits for the scan `p` of the batch `batch`, and grows the table and resumes the scan of
/// that batch until it is done.
fn finish_batch(
    p: exec::ScanGroupsPending,
    batch: &SegRef,
    seg: &mut SegRef,
    shape: &mut groups::Shape,
    spec: &Spec,
    max_groups: u64,
    stats: &mut Stats,
) -> Result<()> {
    let t = std::time::Instant::now();
    let (mut progress, scanning) = p.wait()?;
    stats.scan += t.elapsed();
    stats.scanning += scanning;
    while let Progress::Full { block, row, slots } = progress {
        grow(seg, shape, slots, stats)?;
        let t = std::time::Instant::now();
        let (next, scanning) = try_executor(|ex| exec::scan_groups(ex, batch, seg, spec, (block, row), max_groups))?;
        stats.scan += t.elapsed();
        stats.scanning += scanning;
        progress = next;
    }
    Ok(())
}

/// The bytes of the slots of the group table in `seg` (header `h`) from slot `next` on, as
/// many as a window holds (a quarter of `work_mem`, at least one slot), and how many: from
/// `prefix` (the table's first bytes, [`Ran::prefix`]) where it holds them, else read.
pub(super) fn read_window(seg: &SegRef, h: &groups::Header, next: u64, prefix: &[u8]) -> (u64, Vec<u8>) {
    let n = (window_bytes() / h.slot_bytes.max(1)).clamp(1, h.slot_count - next);
    let len = n * h.slot_bytes;
    let at = h.slots_at + next * h.slot_bytes;
    let mut bytes = Vec::new();
    if let Some(held) = prefix.get(at as usize..(at + len) as usize) {
        crate::node::fallible::try_reserve(&mut bytes, held.len(), "a window of a group table").unwrap_or_else(|e| report(e));
        bytes.extend_from_slice(held);
        return (n, bytes);
    }
    crate::node::fallible::try_resize(&mut bytes, len as usize, 0u8, "a window of a group table").unwrap_or_else(|e| report(e));
    try_executor(|ex| exec::read(ex, seg, at as i64, &mut bytes)).unwrap_or_else(|e| report(e));
    (n, bytes)
}

/// A join table's bytes, read back into 8-byte aligned memory (for the appended rows' probes).
fn read_table(t: &SegRef) -> Result<Vec<u64>> {
    let (_, info) = crate::runtime::lookup_own(t.name())?;
    let mut bytes: Vec<u8> = Vec::new();
    crate::node::fallible::try_resize(&mut bytes, info.size as usize, 0u8, "a dimension's table")?;
    try_executor(|ex| exec::read(ex, t, 0, &mut bytes))?;
    let mut words: Vec<u64> = Vec::new();
    crate::node::fallible::try_reserve(&mut words, bytes.len().div_ceil(8), "a dimension's table")?;
    words.extend(bytes.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_ne_bytes(w)
    }));
    Ok(words)
}
