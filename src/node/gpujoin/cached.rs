//! Reading column caches instead of the children (issue 26, point 3): the probe mode of a
//! serial node whose two sides are plain scans of cached tables builds its table from the inner
//! table's cached columns and probes the outer table's cached keys, both read in place by the
//! executor (`exec::cached`: the GPU service's kernels, a block of a column at a time), so that
//! no heap page is read and no key crosses to this process.
//!
//! # When
//!
//! - **The plan's shape** ([`GpuJoinScan::cache_plan`], at begin): a serial node (a parallel
//!   one shares its children's scans between participants; the caches are read whole by one
//!   process in milliseconds, so the planner prefers the serial plan where the caches are
//!   ready: [`cached_cost`]), an inner join in the probe mode (`count(*)`, `count`/`sum` of one
//!   inner integer column), a key of one column each side, and each child a `Seq Scan` of a
//!   table without a filter and without inheritance children (the planner plans such a
//!   table's scan as an `Append` of its children's and its own; its cache holds its own rows
//!   only, so the path never offers a cached table's scan for it), the key and the aggregated
//!   column plain columns of its output.
//! - **The caches' currency** (at the first call): each table's cache is used only where the
//!   query's snapshot may read it (`caches::usable_in_query`: the reader's rule) and it holds
//!   the columns, with integer encodings no wider than the key. Otherwise, or where a cache
//!   is dropped before its segment is pinned (a rebuild, `cache_drop`), or where the aggregated
//!   column holds a NULL (the probe's payload sum cannot skip it), the node reads its children
//!   as it always does: nothing of them was read yet, so the fallback is whole.
//!   `pg_uvm_share.enable_cache = off` turns cache reading off.
//!
//! `EXPLAIN` names the caches (`Column Caches`) where the shape and the directory allow them;
//! with `ANALYZE`, `Read From` says what the execution read.
//!
//! # Cost
//!
//! Where both tables have ready caches with the columns at planning time, the serial
//! aggregate path is priced without its children's scans: [`SETUP_COST`] and
//! [`GPU_ROW_FACTOR`] × `cpu_operator_cost` per row of each side (the kernels' share of the
//! join; the H200 reads the 50 M keys of issue 26's join in a few milliseconds). A cache that
//! went stale between planning and execution makes the plan read the heap serially: slower
//! than the parallel plan it beat, never wrong.

use super::*;
use crate::cache::Encoding;
use crate::caches;

/// One side's table and key column, and (inner side) the aggregated column.
#[derive(Clone, Copy, Debug)]
pub(super) struct CachedSide {
    relid: pg_sys::Oid,
    key: i16,
    payload: Option<i16>,
}

/// The sides a plan could read from caches ([`GpuJoinScan::cache_plan`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct CachePlan {
    outer: CachedSide,
    inner: CachedSide,
}

/// What an execution read: EXPLAIN ANALYZE's `Read From`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadFrom {
    Caches,
    /// The children, with why the caches were not read.
    Children(&'static str),
}

/// Whether a cached column's encoding can be a key of `kt` (signed integers, no wider).
fn key_encoding(e: Encoding, kt: KeyType) -> bool {
    match e {
        Encoding::Int2 | Encoding::Int4 | Encoding::Date => true,
        Encoding::Int8 | Encoding::Timestamp | Encoding::TimestampTz => kt == KeyType::Int8,
        _ => false,
    }
}

/// Whether a cached column's encoding can be the aggregated column (`int2`, `int4`, `int8`).
fn payload_encoding(e: Encoding) -> bool {
    matches!(e, Encoding::Int2 | Encoding::Int4 | Encoding::Int8)
}

/// Whether `cols` (a cache's) hold `side`'s key and aggregated columns, as the join reads them.
fn holds(cols: &[(i16, Encoding)], side: &CachedSide, kt: KeyType) -> bool {
    let enc = |att: i16| cols.iter().find(|c| c.0 == att).map(|c| c.1);
    enc(side.key).is_some_and(|e| key_encoding(e, kt)) && side.payload.is_none_or(|p| enc(p).is_some_and(payload_encoding))
}

/// The table and the attribute number of output column `resno` of `ps`, where `ps` is a `Seq
/// Scan` without a filter whose output column `resno` is a plain column of its table.
///
/// # Safety
/// `ps` is an initialized plan state.
unsafe fn scanned_column(ps: *mut pg_sys::PlanState, resno: i32) -> Option<(pg_sys::Oid, i16)> {
    // SAFETY: forwarded contract: a SeqScan's state starts with a ScanState, whose relation
    // is open for the query; the target list is the plan's.
    unsafe {
        let plan = (*ps).plan;
        if (*plan).type_ != pg_sys::NodeTag::T_SeqScan || !(*plan).qual.is_null() || !(*plan).initPlan.is_null() {
            return None;
        }
        let rel = (*(ps as *mut pg_sys::ScanState)).ss_currentRelation;
        let tl = PgList::<pg_sys::TargetEntry>::from_pg((*plan).targetlist);
        let te = tl.get_ptr(usize::try_from(resno - 1).ok()?)?;
        let var = as_var((*te).expr as *mut pg_sys::Node)?;
        ((*var).varattno > 0 && !rel.is_null()).then(|| ((*rel).rd_id, (*var).varattno))
    }
}

impl GpuJoinScan {
    /// The caches this plan could read (see the module comment), from its children's plans:
    /// called in begin, once the children are initialized.
    ///
    /// # Safety
    /// After begin initialized the children.
    pub(super) unsafe fn cache_plan(&self) -> Option<CachePlan> {
        let payload = self.probe?;
        if self.parallel_aware || self.p.join != JoinKind::Inner || self.p.keys.len() != 1 {
            return None;
        }
        // SAFETY: forwarded contract.
        unsafe {
            let (orel, okey) = scanned_column(self.outer, *self.outer_key.atts.first()?)?;
            let (irel, ikey) = scanned_column(self.inner, *self.inner_key.atts.first()?)?;
            let payload = match payload {
                Some(c) => Some(scanned_column(self.inner, self.p.map.get(c)?.1)?.1),
                None => None,
            };
            Some(CachePlan {
                outer: CachedSide { relid: orel, key: okey, payload: None },
                inner: CachedSide { relid: irel, key: ikey, payload },
            })
        }
    }

    /// Computes the aggregates from the two tables' caches if the query's snapshot may read
    /// both (see the module comment); false where the children must be read instead (nothing
    /// of them read, no table left).
    ///
    /// # Safety
    /// Called from exec, serially, before the inner side is built.
    pub(super) unsafe fn join_cached(&mut self) -> bool {
        let Some(plan) = self.cached else { return false };
        // SAFETY: forwarded contract: the executor state is live.
        let snap = unsafe { (*self.estate).es_snapshot };
        let found = |side: &CachedSide| caches::usable_in_query(side.relid, snap).unwrap_or_else(|e| report(e));
        let (Some(outer), Some(inner)) = (found(&plan.outer), found(&plan.inner)) else {
            self.read_from = Some(ReadFrom::Children("a table has no cache current for the query's snapshot"));
            return false;
        };
        let kt = self.key;
        let col = |u: &caches::Usable, att: i16| -> Option<u32> {
            let i = u.layout.columns().iter().position(|c| c.attnum == att)?;
            u.layout.encoding(i).is_some_and(|e| key_encoding(e, kt)).then_some(i as u32)
        };
        let (Some(ok), Some(ik)) = (col(&outer, plan.outer.key), col(&inner, plan.inner.key)) else {
            self.read_from = Some(ReadFrom::Children("a cache lacks a key column"));
            return false;
        };
        let ip = match plan.inner.payload {
            Some(att) => match inner.layout.columns().iter().position(|c| c.attnum == att) {
                Some(i) if inner.layout.encoding(i).is_some_and(payload_encoding) => Some(i as u32),
                _ => {
                    self.read_from = Some(ReadFrom::Children("the inner cache lacks the aggregated column"));
                    return false;
                }
            },
            None => None,
        };
        // The rows inserts appended since the builds, as far as this snapshot sees them: staged
        // beside the blocks (the inner ones inserted after the cache's, the outer keys probed
        // after the cache's).
        // SAFETY: the query's snapshot, live while it runs.
        let tail = |u: &caches::Usable| unsafe { caches::visible_tail(u, snap) }.unwrap_or_else(|e| report(e));
        let (Some(otail), Some(itail)) = (tail(&outer), tail(&inner)) else {
            self.read_from = Some(ReadFrom::Children("a cache holds appended rows this snapshot cannot place"));
            return false;
        };
        let (ik, ok) = (ik as usize, ok as usize);
        let mut tail_pairs: Vec<[i64; 2]> = Vec::with_capacity(itail.len());
        let mut tail_null_keys = 0u64;
        for i in 0..itail.len() {
            let payload = match ip {
                Some(p) => match itail.word(i, p as usize) {
                    Some(v) => v as i64,
                    None => {
                        self.read_from = Some(ReadFrom::Children("the aggregated column holds a NULL"));
                        return false;
                    }
                },
                None => 0,
            };
            match itail.word(i, ik) {
                Some(k) => tail_pairs.push([k as i64, payload]),
                None => tail_null_keys += 1,
            }
        }
        let tail_keys: Vec<i64> = (0..otail.len()).filter_map(|i| otail.word(i, ok)).map(|k| k as i64).collect();
        let (ik, ok) = (ik as u32, ok as u32);
        let rows = inner.layout.header().rows + tail_pairs.len() as u64;
        let t = Instant::now();
        let seg = if rows > 0 {
            let bytes = table::table_bytes(rows);
            let seg = self.create_temp("inner", bytes, Some(bytes));
            self.table = Some(seg);
            self.owns_table = true;
            Some(seg)
        } else {
            None
        };
        // The table from the inner cache, then the outer cache's keys probed against it: two
        // requests, timed apart (EXPLAIN ANALYZE: Inner Table Build, Cache Probe).
        let g = Instant::now();
        let built = match &seg {
            None => Ok(None),
            Some(seg) => crate::runtime::try_executor(|ex| {
                let n = table::slot_count(rows);
                exec::build_begin(ex, seg, n)?;
                let mut b = exec::cache_build(ex, seg, kt, n, &inner.seg, ik, ip)?;
                if b.null_payloads > 0 {
                    return Ok(None);
                }
                // (every block's rows were read, each by its own count: their total is the
                // cache's, or the blocks were overwritten)
                inner.check_rows_read(b.inserted + b.null_keys)?;
                exec::build_insert(ex, seg, kt, n, &tail_pairs)?;
                b.inserted += tail_pairs.len() as u64;
                b.null_keys += tail_null_keys;
                exec::build_finish(ex, seg, kt, n, b.inserted, b.null_keys)?;
                Ok(Some(b))
            }),
        };
        self.stats.table_build = t.elapsed();
        let p = Instant::now();
        let probed = match (&seg, built) {
            (Some(seg), Ok(Some(b))) if b.inserted > 0 => crate::runtime::try_executor(|ex| {
                let (p, rows, kernels) = exec::cache_probe(ex, seg, kt, &outer.seg, ok)?;
                // (the CPU's loop counts each block's rows; the kernels report the header's)
                outer.check_rows_read(rows)?;
                let appended = if tail_keys.is_empty() {
                    exec::ProbeSum { matches: 0, sum: 0 }
                } else {
                    exec::probe(ex, seg, kt, &tail_keys)?
                };
                Ok((p + appended, rows, kernels))
            })
            .map(|r| (Ok(Some(b)), Some(r))),
            (_, built) => Ok((built, None)),
        };
        self.stats.cache_probe = Some(p.elapsed());
        self.stats.gpu += g.elapsed();
        let (built, probed) = match probed.and_then(|(b, p)| b.map(|b| (b, p))) {
            Ok((built, probed)) if seg.is_none() || built.is_some() => (built, probed),
            Ok(_) => {
                self.drop_table();
                self.read_from = Some(ReadFrom::Children("the aggregated column holds a NULL"));
                return false;
            }
            // A cache dropped before its segment was pinned (a rebuild, cache_drop).
            Err(e) if e.code == Code::UndefinedObject => {
                self.drop_table();
                self.read_from = Some(ReadFrom::Children("a cache was dropped"));
                return false;
            }
            Err(e) => report(e),
        };
        if let (Some(b), Some(seg)) = (built, seg) {
            self.stats.inner_rows = b.inserted;
            self.note_table(&seg, table::table_bytes(rows));
        }
        if let Some((p, _rows, kernels)) = probed {
            self.stats.batches = outer.layout.header().blocks;
            self.stats.cache_kernels = Some(kernels);
            for a in &mut self.aggs {
                a.acc.add_matches(p.matches, p.sum).unwrap_or_else(|e| report(e));
            }
        }
        self.payload_values = true;
        self.outer_done = true;
        self.read_from = Some(ReadFrom::Caches);
        true
    }

    /// EXPLAIN's lines about caches.
    ///
    /// # Safety
    /// ExplainCustomScan's `es`.
    pub(super) unsafe fn explain_caches(&self, es: *mut pg_sys::ExplainState) {
        let Some(plan) = self.cached else { return };
        let kt = self.key;
        let listed = [&plan.outer, &plan.inner].iter().all(|s| caches::ready_columns(s.relid).is_some_and(|c| holds(&c, s, kt)));
        // SAFETY: forwarded contract; catalog lookups of the plan's tables.
        unsafe {
            let prop = |label: &CStr, value: &str| {
                let v = std::ffi::CString::new(value.replace('\0', "")).expect("no NUL");
                pg_sys::ExplainPropertyText(label.as_ptr(), v.as_ptr(), es);
            };
            if listed || self.read_from == Some(ReadFrom::Caches) {
                let name = |s: &CachedSide| {
                    let mut cols = vec![s.key];
                    cols.extend(s.payload.filter(|&p| p != s.key));
                    let cols: Vec<String> = cols.iter().map(|&a| attname(s.relid, a)).collect();
                    format!("{} ({})", relname(s.relid), cols.join(", "))
                };
                prop(c"Column Caches", &format!("{}, {}", name(&plan.outer), name(&plan.inner)));
            }
            if (*es).analyze {
                match self.read_from {
                    Some(ReadFrom::Caches) => prop(c"Read From", "column caches"),
                    Some(ReadFrom::Children(why)) => prop(c"Read From", &format!("children ({why})")),
                    None => {}
                }
            }
        }
    }
}

fn relname(relid: pg_sys::Oid) -> String {
    // SAFETY: a catalog lookup; NULL for a relation gone.
    unsafe {
        let n = pg_sys::get_rel_name(relid);
        if n.is_null() {
            format!("{}", u32::from(relid))
        } else {
            CStr::from_ptr(n).to_string_lossy().into_owned()
        }
    }
}

fn attname(relid: pg_sys::Oid, att: i16) -> String {
    // SAFETY: a catalog lookup (missing_ok).
    unsafe {
        let n = pg_sys::get_attname(relid, att, true);
        if n.is_null() {
            format!("{att}")
        } else {
            CStr::from_ptr(n).to_string_lossy().into_owned()
        }
    }
}

/// The cost of the serial aggregate path over `path` (a serial GpuJoin path computing
/// `aggrefs`) where it will read column caches (the module comment, "Cost"): `None` where its
/// shape or the caches do not allow it.
///
/// # Safety
/// Planner structures: a path of this module, the aggregates `preagg` took.
pub unsafe fn cached_cost(
    root: *mut pg_sys::PlannerInfo,
    path: *mut pg_sys::CustomPath,
    aggrefs: &[*mut pg_sys::Aggref],
) -> Option<f64> {
    // SAFETY: forwarded contract.
    unsafe {
        if (*path).path.parallel_aware || path_join_kind((*path).custom_private) != JoinKind::Inner {
            return None;
        }
        let clauses = path_clauses(path);
        let [(_, ov, iv)] = clauses.keys.as_slice() else { return None };
        if !clauses.others.is_empty() {
            return None;
        }
        let children = PgList::<pg_sys::Path>::from_pg((*path).custom_paths);
        let (outer, inner) = (children.get_ptr(0)?, children.get_ptr(1)?);
        let table_of = |p: *mut pg_sys::Path| -> Option<(pg_sys::Oid, pg_sys::Index, f64)> {
            let rel = (*p).parent;
            if (*p).pathtype != pg_sys::NodeTag::T_SeqScan
                || (*rel).reloptkind != pg_sys::RelOptKind::RELOPT_BASEREL
                || !(*rel).baserestrictinfo.is_null()
            {
                return None;
            }
            let rte = *(*root).simple_rte_array.add((*rel).relid as usize);
            // (not a table with inheritance children: its cache holds its own rows only)
            ((*rte).rtekind == pg_sys::RTEKind::RTE_RELATION && !(*rte).inh).then(|| ((*rte).relid, (*rel).relid, (*rel).rows))
        };
        let (orel, oidx, orows) = table_of(outer)?;
        let (irel, iidx, irows) = table_of(inner)?;
        if (**ov).varno as pg_sys::Index != oidx || (**iv).varno as pg_sys::Index != iidx {
            return None;
        }
        // The probe mode: count(*), count or sum of one column of the inner table.
        let mut payload = None;
        for &a in aggrefs {
            let (kind, _) = agg::spec_of(u32::from((*a).aggfnoid))?;
            match kind {
                Kind::CountStar => {}
                Kind::Count | Kind::Sum => {
                    let te = PgList::<pg_sys::TargetEntry>::from_pg((*a).args).get_ptr(0)?;
                    let v = as_var((*te).expr as *mut pg_sys::Node)?;
                    if (*v).varno as pg_sys::Index != iidx || payload.is_some_and(|p| p != (*v).varattno) {
                        return None;
                    }
                    payload = Some((*v).varattno);
                }
                _ => return None,
            }
        }
        let kt = clauses.composer().key_type();
        let o = CachedSide { relid: orel, key: (**ov).varattno, payload: None };
        let i = CachedSide { relid: irel, key: (**iv).varattno, payload };
        if !holds(&caches::ready_columns(orel)?, &o, kt) || !holds(&caches::ready_columns(irel)?, &i, kt) {
            return None;
        }
        Some(SETUP_COST + (orows + irows) * GPU_ROW_FACTOR * pg_sys::cpu_operator_cost)
    }
}
