//! Building a cache (`uvm.cache_table`; the module essay, "Building").

use super::*;
use crate::cache::tail::Tail;

/// Rows per block of a cache this module builds: 64 Ki, 256 KiB of an `int4` column, so that a
/// reader fetches a block in one request and a small table does not take a 1 Mi-row block.
const BLOCK_ROWS: u64 = 1 << 16;
/// Rows fetched from the build's cursor at a time.
const FETCH_ROWS: i64 = 4096;

/// A column chosen for the cache: its number and encoding, and the SQL that reads it.
struct Chosen {
    spec: ColumnSpec,
    /// The select-list expression: the column itself, or a `numeric(p, s)` scaled to `int8`.
    expr: String,
}

/// What `cache_table` checked of the table, under its lock.
struct Target {
    /// The planner's estimate of the rows (`pg_class.reltuples`; 0 when never analyzed).
    estimated_rows: u64,
    /// The table's heap pages (`RelationGetNumberOfBlocks`): how many workers a parallel build
    /// takes.
    pages: u64,
    /// The schema-qualified, quoted name, for the build's query.
    qualified: String,
    columns: Vec<Chosen>,
}

/// Checks the table and picks its columns (`names`: all cacheable ones when `None`).
fn target(relid: pg_sys::Oid, names: Option<Vec<String>>) -> Result<Target> {
    let refuse = |why: String| Err(UvmError::new(Code::FeatureNotSupported, why));
    // SAFETY: the relation is locked by the caller; it is opened without a further lock and
    // closed before returning; its descriptor is read within natts.
    unsafe {
        let rel = pg_sys::relation_open(relid, pg_sys::NoLock as i32);
        let form = &*(*rel).rd_rel;
        let kind = form.relkind as u8;
        let persistence = form.relpersistence as u8;
        let partition = form.relispartition;
        let has_children = form.relhassubclass;
        let row_security = form.relrowsecurity;
        let estimated_rows = if form.reltuples > 0.0 { form.reltuples as u64 } else { 0 };
        let nsp = pg_sys::get_namespace_name(form.relnamespace);
        let qualified = std::ffi::CStr::from_ptr(pg_sys::quote_qualified_identifier(nsp, form.relname.data.as_ptr()))
            .to_string_lossy()
            .into_owned();
        let desc = pgrx::PgTupleDesc::from_pg_unchecked((*rel).rd_att);
        let mut all = Vec::new();
        for att in desc.iter() {
            if att.attisdropped {
                continue;
            }
            let name = std::ffi::CStr::from_ptr(att.attname.data.as_ptr()).to_string_lossy().into_owned();
            all.push((name, att.attnum, att.atttypid, att.atttypmod, att.attcollation));
        }
        drop(desc);
        let pages = u64::from(pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM));
        pg_sys::relation_close(rel, pg_sys::NoLock as i32);
        let name = rel_name(relid);
        if kind != pg_sys::RELKIND_RELATION {
            return refuse(format!("\"{name}\" is not a table: only plain tables are cached"));
        }
        if partition || has_children {
            return refuse(format!("\"{name}\" is a partition or has inheritance children: such tables are not cached"));
        }
        if persistence == pg_sys::RELPERSISTENCE_TEMP {
            return refuse(format!("\"{name}\" is a temporary table: only tables every session sees are cached"));
        }
        if row_security {
            // The build reads what its user's policies let through, and every reader would
            // see that: a cache holds all of a table's rows or none.
            return Err(UvmError::new(
                Code::FeatureNotSupported,
                format!("\"{name}\" has row-level security enabled: such tables are not cached"),
            )
            .detail("A cache holds every row of its table for every reader; policies choose rows per user."));
        }
        let mut columns = Vec::new();
        let wanted: Vec<String> = match names {
            Some(v) => v,
            None => all.iter().filter(|c| cacheable(c.2, c.3, c.4).is_ok()).map(|c| c.0.clone()).collect(),
        };
        if wanted.is_empty() {
            return refuse(format!("\"{name}\" has no column of a type a cache holds"));
        }
        for w in &wanted {
            let Some(&(ref n, attnum, typid, typmod, collation)) = all.iter().find(|c| &c.0 == w) else {
                return Err(UvmError::new(Code::UndefinedColumn, format!("column \"{w}\" of \"{name}\" does not exist")));
            };
            if columns.iter().any(|c: &Chosen| c.spec.attnum == attnum) {
                return Err(UvmError::new(Code::DuplicateObject, format!("column \"{w}\" is named twice")));
            }
            let (encoding, scale) = cacheable(typid, typmod, collation).map_err(|why| {
                UvmError::new(Code::FeatureNotSupported, format!("column \"{w}\" of \"{name}\" cannot be cached: {why}")).hint(
                    "Cached types: bool, int2, int4, int8, float4, float8, date, timestamp, timestamptz, numeric(p, s) with p <= 18, text and varchar of a deterministic collation.",
                )
            })?;
            let q = quote_ident(n);
            let expr = if encoding == Encoding::Numeric { format!("(({q}) * 1e{scale})::int8") } else { q };
            columns.push(Chosen { spec: ColumnSpec { encoding, attnum, scale }, expr });
        }
        Ok(Target { estimated_rows, pages, qualified, columns })
    }
}

/// A build in progress: its directory slot and segment, dropped and freed unless
/// [`Building::done`] is called (an error or a cancel leaves nothing).
struct Building {
    entry: Entry,
    seg: Option<SegRef>,
    dicts: Vec<SegRef>,
    /// Every segment the build creates, named before its creation: an ERROR or a cancel inside
    /// a creation (after the segment exists, before it returns) must not leave it behind.
    names: Vec<String>,
}

impl Building {
    /// Notes that the build is about to create segment `name`.
    fn creating(&mut self, name: &str) {
        self.names.push(name.to_owned());
    }

    fn done(mut self) {
        self.seg = None;
        self.dicts.clear();
        self.names.clear();
        self.entry.slot = usize::MAX;
    }
}

impl Drop for Building {
    fn drop(&mut self) {
        if self.entry.slot == usize::MAX {
            return;
        }
        let (entry, names) = (self.entry, std::mem::take(&mut self.names));
        crate::runtime::held_off(|| {
            let _ = std::panic::catch_unwind(|| {
                if let Ok(d) = directory() {
                    if d.retire(entry.slot, entry.generation) {
                        // By name: a creation that an ERROR interrupted may or may not have
                        // made its segment. A segment still pinned (a parallel worker of the
                        // build, not yet stopped: the abort stops it after this) keeps the slot
                        // `Dropping`, so that the next reclaim drops what is left.
                        let mut all = true;
                        for name in &names {
                            if let Ok((seg, _)) = lookup_own(name) {
                                match crate::runtime::try_with_executor(|ex| exec::drop(ex, &seg)) {
                                    Ok(()) => {}
                                    Err(e) if e.code == Code::UndefinedObject => {}
                                    Err(_) => all = false,
                                }
                            }
                        }
                        if all {
                            d.free(entry.slot, entry.generation);
                        }
                    }
                }
            });
        });
    }
}

/// Bytes the dictionaries of one build may hold in the builder's memory (54000 past it).
const MAX_DICT_MEMORY: u64 = 1 << 30;

/// `uvm.cache_table`: builds (or rebuilds) the cache of `relid`'s `names` columns; returns the
/// rows cached.
pub fn build(relid: pg_sys::Oid, names: Option<Vec<String>>) -> Result<i64> {
    build_with(relid, names, true).map(|rows| rows.unwrap_or(0))
}

/// The background refresher's build: as [`build`], but `None` at once where the table's lock
/// is not free (a refresher never queues in front of the table's writers).
pub(super) fn rebuild(relid: pg_sys::Oid, names: Vec<String>) -> Result<Option<i64>> {
    build_with(relid, Some(names), false)
}

/// [`build`], waiting for the table's lock or not (`None`: not free).
fn build_with(relid: pg_sys::Oid, names: Option<Vec<String>>, wait: bool) -> Result<Option<i64>> {
    // SAFETY: reads a flag of this process.
    if unsafe { pg_sys::RecoveryInProgress() } {
        return Err(UvmError::new(Code::ObjectNotInPrerequisiteState, "column caches cannot be built during recovery")
            .detail("A standby's tables change by WAL replay, which no cache follows."));
    }
    // SAFETY: reads a flag of this process.
    if unsafe { pg_sys::IsInParallelMode() } {
        // (reached only through a function falsely marked PARALLEL SAFE: uvm.cache_table is
        // not, and a build writes shared state a parallel operation must not)
        return Err(UvmError::new(Code::InvalidTransactionState, "a column cache cannot be built during a parallel operation")
            .hint("uvm.cache_table is PARALLEL UNSAFE; a function that calls it must be marked so too."));
    }
    check_select(relid)?;
    // SAFETY: takes a heavyweight lock held to the end of the transaction.
    unsafe {
        if wait {
            pg_sys::LockRelationOid(relid, pg_sys::ShareRowExclusiveLock as i32);
        } else if !pg_sys::ConditionalLockRelationOid(relid, pg_sys::ShareRowExclusiveLock as i32) {
            return Ok(None);
        }
    }
    // SAFETY: a syscache probe.
    if !unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            pg_sys::Datum::from(relid),
            0.into(),
            0.into(),
            0.into(),
        )
    } {
        return Err(UvmError::new(Code::UndefinedObject, format!("table {} was dropped", u32::from(relid))));
    }
    if super::marks::being_written(u32::from(relid)) {
        return Err(UvmError::new(
            Code::ObjectInUse,
            format!("cannot build the cache of \"{}\" inside a statement that writes it", rel_name(relid)),
        )
        .detail("The statement marked the table's cache when it began; a cache built inside it would miss its later writes.")
        .hint("Build the cache before or after that statement."));
    }
    super::marks::build_started();
    let t = target(relid, names)?;
    if subscribed(relid) {
        return Err(UvmError::new(
            Code::FeatureNotSupported,
            format!("\"{}\" is written by a subscription: such tables are not cached", rel_name(relid)),
        )
        .detail("Logical replication's apply worker writes without the hooks that keep a cache current."));
    }
    let specs: Vec<ColumnSpec> = t.columns.iter().map(|c| c.spec).collect();
    // Inserts append to a cache whose table has the append trigger (`append.rs`); a cache that
    // cannot take appends leaves its table without one.
    let appends = super::append::appendable(&specs) && super::append::capacity() > 0;
    if appends {
        super::trigger::ensure_trigger(relid, &t.qualified)?;
    } else {
        super::trigger::drop_trigger(relid, &t.qualified)?;
    }
    let d = directory()?;
    let db = database();
    reclaim(d);
    if let Some(old) = d.find(db, u32::from(relid)) {
        match drop_entry(d, &old) {
            Ok(_) => {}
            // A reader still reads the old cache's segments: its slot stays `Dropping` and the
            // next reclaim drops them once free; the new build goes on beside them.
            Err(e) if e.code == Code::ObjectInUse => {}
            Err(e) => return Err(e),
        }
    }
    // SAFETY: GetUserId reads this backend's current user.
    let entry = d.claim(db, u32::from(relid), u32::from(unsafe { pg_sys::GetUserId() }))?;
    let mut building = Building { entry, seg: None, dicts: Vec::new(), names: Vec::new() };
    let mut layout = Layout::plan(u32::from(relid), &specs, BLOCK_ROWS)?;
    let name = segment_name(db, u32::from(relid), entry.generation);
    let parallel = super::parallel::suits(&specs, &name);
    let workers = if parallel { super::parallel::workers_for(t.pages) } else { 0 };
    // Sized for the estimated rows at once (one chunk where the estimate holds; growth
    // otherwise), so the segment does not end in a half-empty doubled chunk; each participant
    // of a parallel build leaves one block partly full.
    let blocks = t.estimated_rows.div_ceil(BLOCK_ROWS).max(1) + workers as u64;
    let first = layout.bytes_for(blocks).min(crate::guc::max_segment_size()).min(i64::MAX as u64) as i64;
    building.creating(&name);
    try_executor(|ex| exec::create(ex, &name, first, None, TierPref::Auto, BOOTSTRAP_SUPERUSER, now()))?;
    let (seg, _) = lookup_own(&name)?;
    building.seg = Some(seg);
    let tail = if appends { Some(create_tail(&mut building, &name, specs.len() as u32, u32::from(relid))?) } else { None };

    // The build's snapshot: the latest, taken under the lock, so every writer has ended.
    // SAFETY: GetLatestSnapshot returns a static snapshot that PushActiveSnapshot copies; it is
    // popped below, or by the transaction's abort after an error.
    let (xmax, builder_xid) = unsafe {
        let snap = pg_sys::GetLatestSnapshot();
        pg_sys::PushActiveSnapshot(snap);
        let s = pg_sys::GetActiveSnapshot();
        (u64::from((*s).xmax.into_inner()), u64::from(pg_sys::GetTopTransactionIdIfAny().into_inner()))
    };
    let select: Vec<&str> = t.columns.iter().map(|c| c.expr.as_str()).collect();
    let query = format!("SELECT {} FROM ONLY {}", select.join(", "), t.qualified);
    let mut dicts: Vec<Option<DictBuilder>> =
        t.columns.iter().map(|c| (c.spec.encoding == Encoding::DictCode).then(DictBuilder::default)).collect();
    let (blocks, rows, launched) = if parallel {
        super::parallel::fill(relid, &seg, &specs, BLOCK_ROWS, workers)?
    } else {
        let (blocks, rows) = pgrx::spi::Spi::connect(|_| fill(&seg, &layout, &query, &mut dicts))?;
        (blocks, rows, 0)
    };
    // SAFETY: pops the snapshot pushed above (the SPI connection is closed).
    unsafe { pg_sys::PopActiveSnapshot() };
    // Each text column's dictionary, a segment of its own, named from the cache's.
    for (col, dict) in dicts.iter().enumerate() {
        let Some(dict) = dict else { continue };
        let attnum = t.columns[col].spec.attnum;
        let dname = dictionary_name(&name, attnum);
        let bytes = dict.to_bytes();
        building.creating(&dname);
        try_executor(|ex| exec::create(ex, &dname, bytes.len() as i64, None, TierPref::Auto, BOOTSTRAP_SUPERUSER, now()))?;
        let (dseg, _) = lookup_own(&dname)?;
        building.dicts.push(dseg);
        try_executor(|ex| exec::write(ex, &dseg, 0, &bytes))?;
        layout.set_dictionary(col, attnum as u64);
        if tail.is_some() {
            // the room for strings appends add (host tier: backends read and write it)
            let mname = super::more_name(&name, attnum);
            let size = super::append::MORE.size() as i64;
            building.creating(&mname);
            try_executor(|ex| exec::create(ex, &mname, size, None, TierPref::Cpu, BOOTSTRAP_SUPERUSER, now()))?;
            let (mseg, _) = lookup_own(&mname)?;
            building.dicts.push(mseg);
            try_executor(|ex| exec::write(ex, &mseg, 0, &super::append::MORE.empty()))?;
        }
    }
    layout.set_extent(blocks, rows)?;
    layout.stamp(u32::from(relid), xmax, entry.generation);
    try_executor(|ex| exec::write(ex, &seg, 0, &layout.prefix()))?;
    let dict_bytes: u64 = building.dicts.iter().filter_map(|d| lookup_own(d.name()).ok()).map(|(_, i)| i.committed).sum();
    let bytes = lookup_own(&name).map(|(_, i)| i.committed).unwrap_or(0) + dict_bytes;
    let built = Built {
        columns: t.columns.len() as u32,
        built_xmax: xmax,
        builder_xid,
        built_at: now(),
        rows,
        bytes,
        workers: launched,
        tail_capacity: tail.map_or(0, |t| t.capacity()),
    };
    d.publish(&entry, &built);
    building.done();
    super::append::built(u32::from(relid));
    if builder_xid != 0 {
        // The builder's transaction decides whether the rows it wrote (and the cache holds) are
        // real: its end settles the slot (commit: forget the xid; abort, or PREPARE
        // TRANSACTION, whose outcome this backend never learns: stale).
        super::append::settle_at_end(entry.slot, entry.generation);
    }
    Ok(Some(rows as i64))
}

/// Creates the append tail of the cache in segment `name` (generation `building.entry`'s), in
/// the host tier (backends decode it on the CPU), with its header and every stamp zero.
fn create_tail(building: &mut Building, name: &str, columns: u32, relid: u32) -> Result<Tail> {
    let tail = Tail::new(columns, super::append::capacity())?;
    let tname = super::append::tail_name(name);
    building.creating(&tname);
    try_executor(|ex| exec::create(ex, &tname, tail.bytes() as i64, None, TierPref::Cpu, BOOTSTRAP_SUPERUSER, now()))?;
    let (tseg, _) = lookup_own(&tname)?;
    building.dicts.push(tseg);
    // (a segment's pieces may come from a pool, not zeroed)
    let zeros = vec![0u8; 1 << 20];
    let mut at = tail.stamp_at(0);
    while at < tail.record_at(0) {
        let n = (tail.record_at(0) - at).min(zeros.len() as u64) as usize;
        try_executor(|ex| exec::write(ex, &tseg, at as i64, &zeros[..n]))?;
        at += n as u64;
    }
    let header = tail.header_bytes(relid, building.entry.generation);
    try_executor(|ex| exec::write(ex, &tseg, 0, &header))?;
    Ok(tail)
}

/// Reads `query` through a cursor into blocks of `seg`; returns (blocks, rows).
fn fill(seg: &SegRef, layout: &Layout, query: &str, dicts: &mut [Option<DictBuilder>]) -> Result<(u64, u64)> {
    let ncols = dicts.len();
    let q = std::ffi::CString::new(query).map_err(|_| UvmError::new(Code::InvalidParameterValue, "NUL in a name"))?;
    // SAFETY: SPI is connected; read-only, so the cursor runs with the active snapshot (the
    // build's); an error raises an ERROR (a Rust unwind), and the abort closes the portal.
    let portal = unsafe {
        pg_sys::SPI_cursor_open_with_args(
            std::ptr::null(),
            q.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null(),
            true,
            0,
        )
    };
    if portal.is_null() {
        return Err(UvmError::new(Code::SystemError, "the cache build opened no cursor"));
    }
    let encodings: Vec<Encoding> = (0..ncols).map(|c| layout.encoding(c).expect("planned column")).collect();
    let (data_offset, block_bytes) = (layout.header().data_offset, layout.header().block_bytes);
    // Block `b` goes at data_offset + b * block_bytes (the layout's extent is set at the end).
    let flush = |b: BlockBuilder, blocks: &mut u64| -> Result<()> {
        let too_many = || UvmError::new(Code::ProgramLimitExceeded, "the cache outgrows a segment");
        let at = blocks.checked_mul(block_bytes).and_then(|x| x.checked_add(data_offset)).ok_or_else(too_many)?;
        let end = at.checked_add(block_bytes).ok_or_else(too_many)?;
        try_executor(|ex| exec::grow_at_least(ex, seg, end))?;
        let bytes = b.finish();
        try_executor(|ex| exec::write(ex, seg, at as i64, &bytes))?;
        *blocks += 1;
        Ok(())
    };
    let mut block = BlockBuilder::new(layout);
    let (mut blocks, mut rows) = (0u64, 0u64);
    let mut row: Vec<Option<u64>> = vec![None; ncols];
    // Detoasted text lives in a context reset after each batch, not in SPI's for the whole build.
    let mut batch_cx = pgrx::PgMemoryContexts::new("pg_uvm_share cache build");
    loop {
        // SAFETY: an open portal of this SPI connection; SPI_tuptable holds SPI_processed rows
        // of `ncols` by-value columns (the query's), freed after use.
        let n = unsafe {
            pg_sys::SPI_cursor_fetch(portal, true, FETCH_ROWS as std::ffi::c_long);
            let tt = pg_sys::SPI_tuptable;
            if tt.is_null() {
                0
            } else {
                let n = pg_sys::SPI_processed as usize;
                let r: Result<()> = batch_cx.switch_to(|_| {
                    for i in 0..n {
                        let tuple = *(*tt).vals.add(i);
                        for (c, slot) in row.iter_mut().enumerate() {
                            let mut isnull = false;
                            let v = pg_sys::SPI_getbinval(tuple, (*tt).tupdesc, c as i32 + 1, &mut isnull);
                            *slot = match (isnull, &mut dicts[c]) {
                                (true, _) => None,
                                (false, None) => Some(encodings[c].word_of_raw(v.value() as u64)),
                                (false, Some(dict)) => {
                                    // a text datum: its bytes, detoasted into the batch's context
                                    let p = pg_sys::pg_detoast_datum_packed(v.cast_mut_ptr());
                                    let bytes = std::slice::from_raw_parts(
                                        pgrx::varlena::vardata_any(p) as *const u8,
                                        pgrx::varlena::varsize_any_exhdr(p),
                                    );
                                    Some(u64::from(dict.intern(bytes)?))
                                }
                            };
                        }
                        block.push(&row)?;
                        rows += 1;
                        if block.is_full() {
                            flush(std::mem::replace(&mut block, BlockBuilder::new(layout)), &mut blocks)?;
                        }
                    }
                    Ok(())
                });
                batch_cx.reset();
                r?;
                let memory: u64 = dicts.iter().flatten().map(|d| d.memory()).sum();
                if memory > MAX_DICT_MEMORY {
                    return Err(UvmError::new(
                        Code::ProgramLimitExceeded,
                        format!("the text columns' dictionaries outgrow {} MiB", MAX_DICT_MEMORY >> 20),
                    )
                    .hint("Cache text columns of fewer distinct values, or leave them out."));
                }
                pg_sys::SPI_freetuptable(tt);
                n
            }
        };
        crate::interrupt::check()?;
        if n == 0 {
            break;
        }
    }
    if block.rows() > 0 {
        flush(block, &mut blocks)?;
    }
    // SAFETY: the portal is open and closed once.
    unsafe { pg_sys::SPI_cursor_close(portal) };
    Ok((blocks, rows))
}
