//! Reading a cache where the reader's snapshot may (`uvm.cache_fold`; the module essay,
//! "Reading").

use super::*;
use crate::cache::dict::{concat, Dict};

/// Where `cache_fold`'s answer came from, and the answer.
pub struct Folded {
    pub source: &'static str,
    pub rows: i64,
    pub non_null: i64,
    /// The sum as numeric text (integer and numeric columns), else `None`.
    pub sum: Option<String>,
}

/// The cache of `relid` if this query's snapshot may read it, with its layout.
fn usable(relid: pg_sys::Oid) -> Result<Option<(Entry, SegRef, Layout)>> {
    // SAFETY: reads whether this backend has an active snapshot, and then that snapshot.
    let snap = unsafe {
        if pg_sys::ActiveSnapshotSet() {
            pg_sys::GetActiveSnapshot()
        } else {
            std::ptr::null_mut()
        }
    };
    usable_under(relid, snap)
}

/// A cache that a snapshot may read in place of the heap ([`usable_for`]).
pub struct Usable {
    pub entry: Entry,
    pub seg: SegRef,
    pub layout: Layout,
}

impl Usable {
    /// Whether the cache is still the one found, and `Ready`: what a reader checks again after
    /// it has pinned the segment (a drop or a rebuild in between: the heap answers).
    pub fn still_ready(&self) -> bool {
        directory().is_ok_and(|d| d.state_of(self.entry.slot, self.entry.generation) == Some(State::Ready))
    }

    /// `Ok` where a reader that counted the rows of every block (each block's own count, which
    /// the layout bounds but cannot check against the others) found the rows the cache's build
    /// published; else 22023 naming the cache, whose blocks were overwritten.
    pub fn check_rows_read(&self, read: u64) -> Result<()> {
        let rows = self.entry.rows;
        if read == rows {
            return Ok(());
        }
        Err(crate::cache::overwritten(format!(
            "segment \"{}\": the cache's blocks hold {read} rows, its build published {rows}",
            self.seg.name()
        )))
    }

    /// The segment of the dictionary of column `col` (a `DictCode` one).
    pub fn dictionary(&self, col: usize) -> Result<SegRef> {
        let attnum = self.layout.columns().get(col).map(|c| c.attnum).unwrap_or(0);
        lookup_own(&dictionary_name(self.seg.name(), attnum)).map(|(s, _)| s)
    }

    /// The dictionary of column `col` (a `DictCode` one) as one: its build's strings, then those
    /// appends added (`append::MORE`: codes past the build's, in the tail's rows). Read after
    /// the tail rows it must decode (a string is added before any row holding its code).
    pub fn dictionary_bytes(&self, col: usize) -> Result<Vec<u8>> {
        let read = |seg: &SegRef, len: u64| -> Result<Vec<u8>> {
            let mut bytes = Vec::new();
            bytes
                .try_reserve_exact(len as usize)
                .map_err(|_| UvmError::new(Code::OutOfMemory, "out of memory for a column dictionary"))?;
            bytes.resize(len as usize, 0u8);
            try_executor(|ex| exec::read(ex, seg, 0, &mut bytes))?;
            Ok(bytes)
        };
        let seg = self.dictionary(col)?;
        let (_, info) = lookup_own(seg.name())?;
        let base = read(&seg, info.size)?;
        // No row appended yet (so none taken into a reader's tail before this read, which
        // comes after): no row holds an added string's code, and the additions, if any (of an
        // append that has not reserved its row yet, or aborted), need not be read.
        if directory().is_ok_and(|d| d.tail_rows(self.entry.slot, self.entry.generation) == Some(0)) {
            return Ok(base);
        }
        let attnum = self.layout.columns().get(col).map(|c| c.attnum).unwrap_or(0);
        let Ok((more_seg, more_info)) = lookup_own(&more_name(self.seg.name(), attnum)) else { return Ok(base) };
        let Some(more) = read_added_strings(&more_seg, more_info.size)? else { return Ok(base) };
        let more = Dict::parse(more_seg.name(), &more)?;
        if more.is_empty() {
            return Ok(base);
        }
        concat(&Dict::parse(seg.name(), &base)?, &more)
    }
}

/// The cache of `relid` if `snapshot` (NULL: none, so no cache) may read it in place of the
/// heap, by the reader's rule (the module essay): for other extensions (the C API). 42501
/// without `SELECT` on the table.
pub fn usable_for(relid: pg_sys::Oid, snapshot: pg_sys::Snapshot) -> Result<Option<Usable>> {
    check_select(relid)?;
    let found = usable_under(relid, snapshot)?.map(|(entry, seg, layout)| Usable { entry, seg, layout });
    // The C API hands out the blocks alone: a cache with appended rows (which only a snapshot
    // test tells apart) is not handed out until a rebuild folds them in.
    let d = directory()?;
    Ok(found.filter(|u| d.tail_rows(u.entry.slot, u.entry.generation) == Some(0)))
}

/// [`usable_for`] without its privilege check: for a plan node, whose query's privileges the
/// executor checked when it started (column privileges included, which a table-wide check would
/// refuse).
pub fn usable_in_query(relid: pg_sys::Oid, snapshot: pg_sys::Snapshot) -> Result<Option<Usable>> {
    Ok(usable_under(relid, snapshot)?.map(|(entry, seg, layout)| Usable { entry, seg, layout }))
}

/// The columns (attribute number, encoding) of the cache of `relid` if it is ready now, for the
/// planner's costs: no snapshot is checked (the plan's executor applies the reader's rule when it
/// runs, and reads the heap where it fails). `None` without a ready cache or with caches off.
pub fn ready_columns(relid: pg_sys::Oid) -> Option<Vec<(i16, Encoding)>> {
    if !crate::guc::ENABLE_CACHE.get() {
        return None;
    }
    let d = directory().ok()?;
    let e = d.find(database(), u32::from(relid)).filter(|e| e.state == State::Ready)?;
    let name = segment_name(e.database, e.relation, e.generation);
    let (seg, info) = lookup_own(&name).ok()?;
    let layout = ready_layout(&seg, &name, info.size, &e).ok()??;
    let cols = layout.columns().iter().enumerate().filter_map(|(i, c)| Some((c.attnum, layout.encoding(i)?))).collect();
    Some(cols)
}

/// [`usable`] under `snap` (NULL: no snapshot, no cache).
fn usable_under(relid: pg_sys::Oid, snap: pg_sys::Snapshot) -> Result<Option<(Entry, SegRef, Layout)>> {
    if !crate::guc::ENABLE_CACHE.get() {
        return Ok(None);
    }
    let d = directory()?;
    let Some(e) = d.find(database(), u32::from(relid)) else { return Ok(None) };
    if e.state != State::Ready {
        if e.state == State::Stale {
            // (a cache that went stale where no refresher could be started: its build aborted)
            super::refresh::launch_if_due(d, e.database);
        }
        return Ok(None);
    }
    // SAFETY: reads this transaction's isolation level and the snapshot, non-NULL (the
    // caller's: live while it reads); TransactionIdFollowsOrEquals compares two ids.
    let current = unsafe {
        if pg_sys::XactIsoLevel == pg_sys::XACT_SERIALIZABLE as i32
            || snap.is_null()
            || (*snap).snapshot_type != pg_sys::SnapshotType::SNAPSHOT_MVCC
        {
            false
        } else {
            let xmin = (*snap).xmin;
            // (a builder with an xid clears it when it commits: until then, the heap)
            pg_sys::TransactionIdFollowsOrEquals(xmin, pg_sys::TransactionId::from_inner(e.built_xmax as u32))
                && e.builder_xid == 0
        }
    };
    // The state is read again after the snapshot checks: a writer marks it before it writes.
    if !current || d.state_of(e.slot, e.generation) != Some(State::Ready) || subscribed(relid) {
        return Ok(None);
    }
    let name = segment_name(e.database, e.relation, e.generation);
    let Ok((seg, info)) = lookup_own(&name) else { return Ok(None) };
    // (a segment dropped meanwhile, or a cache of the table as it was: the heap answers)
    let layout = match ready_layout(&seg, &name, info.size, &e) {
        Err(e) if e.code == Code::UndefinedObject => return Ok(None),
        r => match r? {
            Some(layout) => layout,
            None => return Ok(None),
        },
    };
    d.touch(e.slot, e.generation, now());
    Ok(Some((e, seg, layout)))
}

/// `uvm.cache_fold`: (rows, non-NULL values, sum) of `column`, from the cache where this
/// snapshot may read it, else from the heap.
pub fn fold(relid: pg_sys::Oid, column: &str) -> Result<Folded> {
    check_select(relid)?;
    let t = target_column(relid, column)?;
    if let Some((entry, seg, layout)) = usable(relid)? {
        if let Some(col) = layout.columns().iter().position(|c| c.attnum == t.0) {
            // A rebuild or cache_drop may drop the segment while its blocks are read; the
            // heap, under the same snapshot, answers then.
            let u = Usable { entry, seg, layout };
            match fold_cache(&u, col, t.1) {
                Err(e) if e.code == Code::UndefinedObject => {}
                Ok(None) => {}
                r => return r.map(|f| f.expect("matched")),
            }
        }
    }
    let q = quote_ident(column);
    let sum = if t.1.is_some() { format!("sum({q})::text") } else { "NULL::text".into() };
    let query = format!("SELECT count(*), count({q}), {sum} FROM ONLY {}", qualified(relid));
    heap_fold(&query)
}

/// Runs the heap's fold read-only, so with the query's own snapshot (the one the cache was
/// refused for), never a newer one.
fn heap_fold(query: &str) -> Result<Folded> {
    let q = std::ffi::CString::new(query).map_err(|_| UvmError::new(Code::InvalidParameterValue, "NUL in a name"))?;
    pgrx::spi::Spi::connect(|_| {
        // SAFETY: SPI is connected; a read-only SELECT of one row of (int8, int8, text); its
        // values are read before the connection closes (the text copied out).
        unsafe {
            let rc = pg_sys::SPI_execute(q.as_ptr(), true, 1);
            let tt = pg_sys::SPI_tuptable;
            if rc != pg_sys::SPI_OK_SELECT as i32 || tt.is_null() || pg_sys::SPI_processed != 1 {
                return Err(UvmError::new(Code::SystemError, format!("the heap's fold returned no row ({rc})")));
            }
            let tuple = *(*tt).vals;
            let desc = (*tt).tupdesc;
            let mut null = false;
            let rows = pg_sys::SPI_getbinval(tuple, desc, 1, &mut null).value() as i64;
            let non_null = pg_sys::SPI_getbinval(tuple, desc, 2, &mut null).value() as i64;
            let text = pg_sys::SPI_getvalue(tuple, desc, 3);
            let sum = (!text.is_null()).then(|| std::ffi::CStr::from_ptr(text).to_string_lossy().into_owned());
            Ok(Folded { source: "heap", rows, non_null, sum })
        }
    })
}

pub(super) fn qualified(relid: pg_sys::Oid) -> String {
    // SAFETY: catalog lookups of an existing relation (the caller's regclass).
    unsafe {
        let nsp = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        let rel = pg_sys::get_rel_name(relid);
        if nsp.is_null() || rel.is_null() {
            return format!("pg_catalog.pg_class WHERE false AND oid = {}", u32::from(relid));
        }
        std::ffi::CStr::from_ptr(pg_sys::quote_qualified_identifier(nsp, rel)).to_string_lossy().into_owned()
    }
}

/// The column's number, and the decimal scale of its sum where it has one (integers: 0).
fn target_column(relid: pg_sys::Oid, column: &str) -> Result<(i16, Option<i16>)> {
    let c = std::ffi::CString::new(column).map_err(|_| UvmError::new(Code::InvalidParameterValue, "NUL in a name"))?;
    // SAFETY: catalog lookups by name.
    let (attnum, typid, typmod) = unsafe {
        let attnum = pg_sys::get_attnum(relid, c.as_ptr());
        if attnum <= 0 {
            return Err(UvmError::new(
                Code::UndefinedColumn,
                format!("column \"{column}\" of \"{}\" does not exist", rel_name(relid)),
            ));
        }
        let mut typid = pg_sys::InvalidOid;
        let mut typmod = -1;
        let mut coll = pg_sys::InvalidOid;
        pg_sys::get_atttypetypmodcoll(relid, attnum, &mut typid, &mut typmod, &mut coll);
        (attnum, typid, typmod)
    };
    let scale = match encoding_of(typid, typmod) {
        Ok((Encoding::Int2 | Encoding::Int4 | Encoding::Int8, _)) => Some(0),
        Ok((Encoding::Numeric, s)) => Some(s),
        _ => None,
    };
    Ok((attnum, scale))
}

/// The fold from the cache's blocks and the tail rows this snapshot sees; `None` where the
/// tail says the heap must answer.
fn fold_cache(u: &Usable, col: usize, scale: Option<i16>) -> Result<Option<Folded>> {
    let (seg, layout) = (&u.seg, &u.layout);
    // SAFETY: reads whether this backend has an active snapshot (usable found one), then it.
    let snap = unsafe { pg_sys::GetActiveSnapshot() };
    // SAFETY: the active snapshot, live while this function reads.
    let Some(tail) = (unsafe { super::append::visible(u, snap)? }) else { return Ok(None) };
    let h = *layout.header();
    let one = layout.one_block();
    let enc = layout.encoding(col).expect("a parsed column");
    let (mut rows, mut non_null, mut sum) = (0u64, 0u64, 0i128);
    let mut buf = vec![0u8; h.block_bytes as usize];
    for b in 0..h.blocks {
        let (at, _) =
            layout.block_at(b).ok_or_else(|| UvmError::new(Code::InvalidParameterValue, "a block past the cache's end"))?;
        try_executor(|ex| exec::read(ex, seg, at as i64, &mut buf))?;
        let n = one.block_rows(&buf, 0)?;
        rows += n;
        let (nn, s) = match enc {
            Encoding::Float4 | Encoding::Float8 | Encoding::DictCode => (count_non_null(&one, &buf, col, n)?, 0),
            _ => one.fold_ints(&buf, col)?,
        };
        non_null += nn;
        sum += s;
        crate::interrupt::check()?;
    }
    u.check_rows_read(rows)?;
    let enc_signed = !matches!(enc, Encoding::Float4 | Encoding::Float8 | Encoding::DictCode | Encoding::Bool);
    for i in 0..tail.len() {
        rows += 1;
        if let Some(w) = tail.word(i, col) {
            non_null += 1;
            if enc_signed {
                sum += i128::from(w as i64);
            } else if enc == Encoding::Bool {
                sum += i128::from(w);
            }
        }
    }
    let sum = scale.map(|s| decimal(sum, s));
    // (as SQL's sum: NULL over no value)
    Ok(Some(Folded { source: "cache", rows: rows as i64, non_null: non_null as i64, sum: sum.filter(|_| non_null > 0) }))
}

fn count_non_null(one: &Layout, block: &[u8], col: usize, rows: u64) -> Result<u64> {
    let mut n = 0;
    for r in 0..rows {
        match one.get(block, col, 0, rows, r) {
            Some(Some(_)) => n += 1,
            Some(None) => {}
            None => return Err(UvmError::new(Code::InvalidParameterValue, "the cache's bytes end inside a block")),
        }
    }
    Ok(n)
}

/// `v / 10^scale` as decimal text.
fn decimal(v: i128, scale: i16) -> String {
    if scale <= 0 {
        return v.to_string();
    }
    let s = v.unsigned_abs().to_string();
    let scale = scale as usize;
    let s = if s.len() <= scale { format!("{}{s}", "0".repeat(scale + 1 - s.len())) } else { s };
    let (int, frac) = s.split_at(s.len() - scale);
    format!("{}{int}.{frac}", if v < 0 { "-" } else { "" })
}
