//! GpuGroupAgg: `GROUP BY` and aggregates of one table computed from its column cache (issue
//! 27, steps 2 and 3 for a single table; star joins over dimension tables come next).
//!
//! # Why
//!
//! PostgreSQL aggregates a table row by row from the heap: every page read, every tuple
//! deformed, a transition call per aggregate. Where a table has a current column cache
//! (`crate::caches`), the rows' words are already laid out column by column in segments, and a
//! scan program (`crate::scan`, run as `ScanGroups` requests where the segments are: the GPU
//! service, or the backend in process mode) filters them and folds them into a group table in
//! a segment, which grows when the groups outnumber its room. No tuple is formed below the
//! groups.
//!
//! # Plan
//!
//! ```text
//! Custom Scan (UvmGpuGroupAgg)
//!   Column Cache: t
//!   Cached Columns: a, b, v
//!   Group Keys: a
//!   Cache Filters: b >= 10
//!   ->  HashAggregate                 (run where the cache is not current)
//!         Group Key: a
//!         ->  Seq Scan on t
//!               Filter: (b >= 10)
//! ```
//!
//! - **Planner** (`create_upper_paths_hook` at `UPPERREL_GROUP_AGG`, after PostgreSQL added
//!   its own grouping paths): for a query level over one plain table (no inheritance children,
//!   no sample) with a ready cache holding every column the level reads of it, no grouping
//!   sets, `HAVING` or set-returning functions, where ([`Shape::of`])
//!   - each `WHERE` conjunct is a column compared with a constant (`=`, `<`, `<=`, `>`, `>=`,
//!     so `BETWEEN` too: integer types across widths, `date`, `timestamp[tz]` with their own
//!     type) or `IS NOT NULL`: a range of the column's words;
//!   - each `GROUP BY` item is a column of an integer-like type (`int2`, `int4`, `int8`,
//!     `bool`, `date`, `timestamp[tz]`), whose equality is the equality of its words, and
//!     every column the target uses outside an aggregate is one of them;
//!   - each aggregate is `count(*)`, `count(x)`, or `sum`, `min`, `max` of an `int2`, `int4`
//!     or `int8` column, plain (no DISTINCT, ORDER BY or FILTER);
//!
//!   it adds a path priced at the cache's scan ([`cost`]) whose one child is an aggregation by
//!   PostgreSQL (hashed, or plain without GROUP BY) over the input's cheapest path. Anything
//!   else: no path.
//! - **Executor**: at the first call the node checks the cache against the query's snapshot
//!   (`caches::usable_in_query`, the reader's rule) and that it still holds the planned columns
//!   with the planned encodings; then it runs the program (`exec::scan_groups`) into a
//!   temporary group table segment (`super::cleanup`: dropped however the query ends), growing
//!   it into a segment of twice the slots whenever the program stops full (`exec::groups_grow`),
//!   reads the table, folds the rows that inserts appended to the cache and the snapshot sees
//!   (`caches::visible_tail`, with the same program's [`crate::scan::fold_row`]), and returns
//!   one row per group: the scan tuple is the group keys then the aggregates, and the node's
//!   target list (the query's expressions over them) is projected from it. Where the cache is
//!   not current, or is dropped before the program pins it, or the engine runs no scan
//!   programs (the CUDA engine until its kernels exist: 0A000), the node returns its child's
//!   rows instead: nothing was returned yet, so the fallback is whole.
//!
//! Results are PostgreSQL's: counts `int8`, `sum(int2/int4)` `int8` (past its range an ERROR
//! 22003, as `int4_sum`'s), `sum(int8)` `numeric` (128-bit sums), `min`/`max` of the
//! argument's type, NULL over no rows; an ungrouped query over no rows returns one row.
//! `pg_uvm_share.enable_cache = off` (no cache read) or `pg_uvm_share.enable_gpugroupagg = off`
//! keep the planner from offering the node.
//!
//! # Limits (the next steps of issue 27)
//!
//! - One table: star joins (dimension tables built from their filtered rows, their payloads
//!   grouping values) are the program's and the executor's already, not yet the planner's.
//! - Dictionary-encoded text (`=`/`IN` as code bitmaps, text group keys decoded), `IN` lists,
//!   `OR`, `avg`, float and numeric columns, sums of products: declined for now.
//! - The group table is read into the backend's memory (its bytes, then an entry per group),
//!   not bounded by `work_mem` yet; the table in the segment grows without limit but memory.
//! - The CUDA engine answers `ScanGroups` with 0A000 until its kernels exist, so on a GPU the
//!   node runs its child.
//!
//! # Cost
//!
//! [`SETUP_COST`], and per row of the table [`ROW_FACTOR`] x `cpu_operator_cost` for each
//! column the program reads, plus `cpu_tuple_cost` per group: a column's word costs a fraction
//! of what a heap tuple costs PostgreSQL. Provisional: issue 27's sweep (`auto` within 1.25x
//! of the faster plan) will calibrate them on the H200 with the kernels.

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::PgList;

use super::agg::{self, Arg, Kind, Out, Value};
use super::cleanup;
use super::gpujoin;
use crate::cache::Encoding;
use crate::caches;
use crate::customscan::{self, JoinScan, Methods};
use crate::error::{Code, Result, UvmError};
use crate::exec::{self, scan::Spec, SegRef};
use crate::groups::{self, AggKind};
use crate::registry::TierPref;
use crate::runtime::{current_user, now, report, try_executor};
use crate::scan::{Filter, Input, Program, Progress, Row, Source, Test};

/// Setting up a program: the requests, a group table.
pub const SETUP_COST: f64 = 100.0;
/// Per row and column read, in `cpu_operator_cost`.
pub const ROW_FACTOR: f64 = 0.25;
/// The group table's first size, in groups, at least (it grows as needed).
const MIN_GROUPS: u64 = 64;

static METHODS: Methods = customscan::methods::<GpuGroupAggScan>();

static mut PREV_HOOK: pg_sys::create_upper_paths_hook_type = None;

/// Installs the planner hook (chaining the previous one) and registers the scan methods.
pub fn install() {
    // SAFETY: _PG_init runs once per process, before any planning; the hook chain is
    // process-local.
    unsafe {
        PREV_HOOK = pg_sys::create_upper_paths_hook;
        pg_sys::create_upper_paths_hook = Some(upper_paths_hook);
    }
    customscan::register::<GpuGroupAggScan>();
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn upper_paths_hook(
    root: *mut pg_sys::PlannerInfo,
    stage: pg_sys::UpperRelationKind::Type,
    input_rel: *mut pg_sys::RelOptInfo,
    output_rel: *mut pg_sys::RelOptInfo,
    extra: *mut std::ffi::c_void,
) {
    // SAFETY: PostgreSQL's planner calls the hook with valid structures; the previous hook is
    // called with the same arguments.
    unsafe {
        if let Some(prev) = PREV_HOOK {
            prev(root, stage, input_rel, output_rel, extra);
        }
        if stage == pg_sys::UpperRelationKind::UPPERREL_GROUP_AGG && crate::guc::ENABLE_GPUGROUPAGG.get() {
            add_path(root, input_rel, output_rel, extra as *mut pg_sys::GroupPathExtraData);
        }
    }
}

/// A grouping column: its attribute number and the encoding the plan expects of its cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Col {
    attnum: i16,
    encoding: Encoding,
}

/// A `WHERE` conjunct as a range of a column's words (inclusive; `IS NOT NULL` is the whole
/// range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    col: Col,
    lo: i64,
    hi: i64,
}

/// An aggregate: what it computes, over which column (`None`: `count(*)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AggOf {
    kind: Kind,
    arg: Arg,
    col: Option<Col>,
}

/// What the node computes: the plan's private data.
#[derive(Clone, Debug, PartialEq)]
struct Shape {
    relid: pg_sys::Oid,
    /// The table's range table index in the query.
    varno: u32,
    keys: Vec<Col>,
    filters: Vec<Range>,
    aggs: Vec<AggOf>,
    /// The planner's estimate of the groups (the group table's first size).
    groups: u64,
}

/// The encodings a grouping column or a range may have: words whose equality and order are the
/// values'.
fn keyable(e: Encoding) -> bool {
    matches!(
        e,
        Encoding::Bool
            | Encoding::Int2
            | Encoding::Int4
            | Encoding::Int8
            | Encoding::Date
            | Encoding::Timestamp
            | Encoding::TimestampTz
    )
}

/// The encoding a column of type `typid` has in a cache, for the types the node reads.
fn encoding_of_type(typid: pg_sys::Oid) -> Option<Encoding> {
    Some(match typid {
        pg_sys::BOOLOID => Encoding::Bool,
        pg_sys::INT2OID => Encoding::Int2,
        pg_sys::INT4OID => Encoding::Int4,
        pg_sys::INT8OID => Encoding::Int8,
        pg_sys::DATEOID => Encoding::Date,
        pg_sys::TIMESTAMPOID => Encoding::Timestamp,
        pg_sys::TIMESTAMPTZOID => Encoding::TimestampTz,
        _ => return None,
    })
}

/// A word of `encoding` as a datum (by value).
fn datum_of_word(w: u64, encoding: Encoding) -> pg_sys::Datum {
    match encoding {
        Encoding::Bool => pg_sys::Datum::from(w != 0),
        Encoding::Int2 => pg_sys::Datum::from(w as i64 as i16),
        Encoding::Int4 | Encoding::Date => pg_sys::Datum::from(w as i64 as i32),
        _ => pg_sys::Datum::from(w as i64),
    }
}

/// A by-value constant of an integer-like type as its value, if the node reads the type.
///
/// # Safety
/// `c` is a Const.
unsafe fn const_value(c: *const pg_sys::Const) -> Option<i64> {
    // SAFETY: forwarded contract; by-value datums of the listed types.
    unsafe {
        if (*c).constisnull {
            return None;
        }
        let d = (*c).constvalue.value();
        Some(match (*c).consttype {
            pg_sys::INT2OID => d as i16 as i64,
            pg_sys::INT4OID | pg_sys::DATEOID => d as i32 as i64,
            pg_sys::INT8OID | pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID => d as i64,
            _ => return None,
        })
    }
}

fn is_integer(t: pg_sys::Oid) -> bool {
    matches!(t, pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID)
}

/// The plain column `n` of relation `relid` (range table index `varno`) as a cached column of a
/// type the node reads, if it is one.
///
/// # Safety
/// `n` is null or a node.
unsafe fn column(n: *mut pg_sys::Node, varno: u32, cached: &[(i16, Encoding)]) -> Option<(Col, pg_sys::Oid)> {
    // SAFETY: forwarded contract.
    unsafe {
        let v = gpujoin::as_var(n)?;
        if (*v).varno as u32 != varno || (*v).varattno <= 0 {
            return None;
        }
        let encoding = encoding_of_type((*v).vartype)?;
        let att = (*v).varattno;
        cached.iter().any(|&(a, e)| a == att && e == encoding).then_some((Col { attnum: att, encoding }, (*v).vartype))
    }
}

/// A `WHERE` conjunct as a range, if it is one the node evaluates.
///
/// # Safety
/// `clause` is a planner expression.
unsafe fn range_of(clause: *mut pg_sys::Node, varno: u32, cached: &[(i16, Encoding)]) -> Option<Range> {
    // SAFETY: forwarded contract; nodes are read by their tags.
    unsafe {
        if (*clause).type_ == pg_sys::NodeTag::T_NullTest {
            let t = clause as *mut pg_sys::NullTest;
            if (*t).nulltesttype != pg_sys::NullTestType::IS_NOT_NULL || (*t).argisrow {
                return None;
            }
            let (col, _) = column((*t).arg as *mut pg_sys::Node, varno, cached)?;
            return Some(Range { col, lo: i64::MIN, hi: i64::MAX });
        }
        if (*clause).type_ != pg_sys::NodeTag::T_OpExpr {
            return None;
        }
        let op = clause as *mut pg_sys::OpExpr;
        let args = PgList::<pg_sys::Node>::from_pg((*op).args);
        if args.len() != 2 {
            return None;
        }
        let (a, b) = (args.get_ptr(0)?, args.get_ptr(1)?);
        // column op constant, or constant op column (the strategy commuted)
        let (var, konst, commuted) = if (*b).type_ == pg_sys::NodeTag::T_Const {
            (a, b as *const pg_sys::Const, false)
        } else if (*a).type_ == pg_sys::NodeTag::T_Const {
            (b, a as *const pg_sys::Const, true)
        } else {
            return None;
        };
        let (col, vtype) = column(var, varno, cached)?;
        if col.encoding == Encoding::Bool {
            return None;
        }
        let ctype = (*konst).consttype;
        // Integers compare exactly across widths (one operator family); other types with
        // their own type only (date against timestamp converts).
        if !(ctype == vtype || is_integer(ctype) && is_integer(vtype)) {
            return None;
        }
        let value = const_value(konst)?;
        let opclass = pg_sys::GetDefaultOpClass(vtype, pg_sys::BTREE_AM_OID);
        if opclass == pg_sys::InvalidOid {
            return None;
        }
        let family = pg_sys::get_opclass_family(opclass);
        let mut strategy = pg_sys::get_op_opfamily_strategy((*op).opno, family);
        if commuted {
            strategy = 6 - strategy; // < and >, <= and >= trade places; = stays
        }
        let (lo, hi) = match strategy {
            1 => (i64::MIN, value.checked_sub(1)?),
            2 => (i64::MIN, value),
            3 => (value, value),
            4 => (value, i64::MAX),
            5 => (value.checked_add(1)?, i64::MAX),
            _ => return None,
        };
        Some(Range { col, lo, hi })
    }
}

/// An aggregate the node computes, if `a` is one.
///
/// # Safety
/// `a` is an Aggref.
unsafe fn agg_of(a: *mut pg_sys::Aggref, varno: u32, cached: &[(i16, Encoding)]) -> Option<AggOf> {
    // SAFETY: forwarded contract.
    unsafe {
        let (kind, arg) = agg::spec_of(u32::from((*a).aggfnoid))?;
        let plain = (*a).agglevelsup == 0
            && (*a).aggfilter.is_null()
            && (*a).aggdistinct.is_null()
            && (*a).aggorder.is_null()
            && (*a).aggkind as u8 == b'n' // AGGKIND_NORMAL
            && !(*a).aggvariadic
            && (*a).aggsplit == pg_sys::AggSplit::AGGSPLIT_SIMPLE;
        if !plain {
            return None;
        }
        let args = PgList::<pg_sys::TargetEntry>::from_pg((*a).args);
        if kind == Kind::CountStar {
            return args.is_empty().then_some(AggOf { kind, arg, col: None });
        }
        let te = args.get_ptr(0).filter(|_| args.len() == 1)?;
        let n = (*te).expr as *mut pg_sys::Node;
        let col = if kind == Kind::Count {
            // count(x) looks at NULLs alone: any cached column of the relation
            let v = gpujoin::as_var(n)?;
            if (*v).varno as u32 != varno || (*v).varattno <= 0 {
                return None;
            }
            let &(attnum, encoding) = cached.iter().find(|c| c.0 == (*v).varattno)?;
            Col { attnum, encoding }
        } else {
            let (col, _) = column(n, varno, cached)?;
            let fits = matches!(
                (arg, col.encoding),
                (Arg::Int2, Encoding::Int2) | (Arg::Int4, Encoding::Int4) | (Arg::Int8, Encoding::Int8)
            );
            if !fits {
                return None;
            }
            col
        };
        Some(AggOf { kind, arg, col: Some(col) })
    }
}

impl Shape {
    /// What the node computes for this query level, if it can (the module comment's rules).
    ///
    /// # Safety
    /// The hook's arguments.
    unsafe fn of(
        root: *mut pg_sys::PlannerInfo,
        input_rel: *mut pg_sys::RelOptInfo,
        output_rel: *mut pg_sys::RelOptInfo,
    ) -> Option<Shape> {
        // SAFETY: forwarded contract; every node is read by its tag.
        unsafe {
            let parse = (*root).parse;
            if !(*parse).groupingSets.is_null()
                || (*root).hasHavingQual
                || (*parse).hasTargetSRFs
                || (*input_rel).reloptkind != pg_sys::RelOptKind::RELOPT_BASEREL
            {
                return None;
            }
            let varno = (*input_rel).relid;
            let rte = *(*root).simple_rte_array.add(varno as usize);
            if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
                || (*rte).inh
                || (*rte).relkind as u8 != pg_sys::RELKIND_RELATION
                || !(*rte).tablesample.is_null()
            {
                return None;
            }
            let relid = (*rte).relid;
            let cached = caches::ready_columns(relid)?;
            let mut filters = Vec::new();
            for ri in PgList::<pg_sys::RestrictInfo>::from_pg((*input_rel).baserestrictinfo).iter_ptr() {
                if (*ri).pseudoconstant {
                    return None;
                }
                filters.push(range_of((*ri).clause as *mut pg_sys::Node, varno, &cached)?);
            }
            if filters.len() > exec::scan::MAX_FILTERS {
                return None;
            }
            // The grouping columns, as GROUP BY lists them.
            let group_exprs =
                PgList::<pg_sys::Node>::from_pg(pg_sys::get_sortgrouplist_exprs((*parse).groupClause, (*root).processed_tlist));
            let mut keys: Vec<(Col, *mut pg_sys::Var)> = Vec::new();
            for e in group_exprs.iter_ptr() {
                let (col, _) = column(e, varno, &cached)?;
                if !keyable(col.encoding) {
                    return None;
                }
                if !keys.iter().any(|k| k.0 == col) {
                    keys.push((col, e as *mut pg_sys::Var));
                }
            }
            if keys.len() > exec::scan::MAX_KEYS {
                return None;
            }
            // The target: aggregates, and columns only where they are grouping columns.
            let flags = pg_sys::PVC_INCLUDE_AGGREGATES | pg_sys::PVC_INCLUDE_WINDOWFUNCS | pg_sys::PVC_INCLUDE_PLACEHOLDERS;
            let found = PgList::<pg_sys::Node>::from_pg(pg_sys::pull_var_clause(
                (*(*output_rel).reltarget).exprs as *mut pg_sys::Node,
                flags as i32,
            ));
            let mut aggs = Vec::new();
            for n in found.iter_ptr() {
                match (*n).type_ {
                    pg_sys::NodeTag::T_Var => {
                        let (col, _) = column(n, varno, &cached)?;
                        if !keys.iter().any(|k| k.0 == col) {
                            return None;
                        }
                    }
                    pg_sys::NodeTag::T_Aggref => {
                        let a = agg_of(n as *mut pg_sys::Aggref, varno, &cached)?;
                        if !aggs.contains(&a) {
                            aggs.push(a);
                        }
                    }
                    _ => return None,
                }
            }
            // (each sum has a count beside it in the group table: NULL over no value)
            if aggs.len() * 2 > exec::scan::MAX_AGGS {
                return None;
            }
            Some(Shape { relid, varno, keys: keys.into_iter().map(|k| k.0).collect(), filters, aggs, groups: 0 })
        }
    }

    /// The columns the program reads (each once).
    fn columns(&self) -> Vec<Col> {
        let mut out: Vec<Col> = Vec::new();
        let all =
            self.keys.iter().chain(self.filters.iter().map(|f| &f.col)).chain(self.aggs.iter().filter_map(|a| a.col.as_ref()));
        for c in all {
            if !out.contains(c) {
                out.push(*c);
            }
        }
        out
    }

    /// The plan's private list: int8 constants.
    fn to_private(&self) -> *mut pg_sys::List {
        let mut v: Vec<i64> = vec![u32::from(self.relid) as i64, i64::from(self.varno), self.groups as i64];
        let col = |v: &mut Vec<i64>, c: &Col| {
            v.push(c.attnum as i64);
            v.push(c.encoding as u16 as i64);
        };
        v.push(self.keys.len() as i64);
        for k in &self.keys {
            col(&mut v, k);
        }
        v.push(self.filters.len() as i64);
        for f in &self.filters {
            col(&mut v, &f.col);
            v.push(f.lo);
            v.push(f.hi);
        }
        v.push(self.aggs.len() as i64);
        for a in &self.aggs {
            v.push(kind_code(a.kind, a.arg));
            match &a.col {
                Some(c) => col(&mut v, c),
                None => v.extend([0, 0]),
            }
        }
        let mut l = PgList::<pg_sys::Node>::new();
        for x in v {
            l.push(gpujoin::int_node(x));
        }
        l.into_pg()
    }

    /// The plan's private list read back (`None`: not a list this module wrote).
    ///
    /// # Safety
    /// `list` is a List of int8 Consts.
    unsafe fn from_private(list: *mut pg_sys::List) -> Option<Shape> {
        // SAFETY: forwarded contract.
        let v: Vec<i64> = unsafe {
            PgList::<pg_sys::Node>::from_pg(list)
                .iter_ptr()
                .map(|n| (*(n as *mut pg_sys::Const)).constvalue.value() as i64)
                .collect()
        };
        let mut it = v.into_iter();
        let mut next = || it.next();
        let col = |next: &mut dyn FnMut() -> Option<i64>| -> Option<Col> {
            let attnum = i16::try_from(next()?).ok()?;
            let encoding = Encoding::from_repr(u16::try_from(next()?).ok()?)?;
            Some(Col { attnum, encoding })
        };
        let relid = pg_sys::Oid::from(u32::try_from(next()?).ok()?);
        let varno = u32::try_from(next()?).ok()?;
        let groups = u64::try_from(next()?).ok()?;
        let mut keys = Vec::new();
        for _ in 0..next()? {
            keys.push(col(&mut next)?);
        }
        let mut filters = Vec::new();
        for _ in 0..next()? {
            let c = col(&mut next)?;
            filters.push(Range { col: c, lo: next()?, hi: next()? });
        }
        let mut aggs = Vec::new();
        for _ in 0..next()? {
            let (kind, arg) = kind_of(next()?)?;
            let c = col(&mut next);
            aggs.push(AggOf { kind, arg, col: if kind == Kind::CountStar { None } else { Some(c?) } });
        }
        Some(Shape { relid, varno, keys, filters, aggs, groups })
    }
}

const KINDS: [Kind; 5] = [Kind::CountStar, Kind::Count, Kind::Sum, Kind::Min, Kind::Max];
const ARGS: [Arg; 4] = [Arg::Any, Arg::Int2, Arg::Int4, Arg::Int8];

fn kind_code(kind: Kind, arg: Arg) -> i64 {
    let k = KINDS.iter().position(|&x| x == kind).unwrap_or(0);
    let a = ARGS.iter().position(|&x| x == arg).unwrap_or(0);
    (k * 8 + a) as i64
}

fn kind_of(code: i64) -> Option<(Kind, Arg)> {
    let code = usize::try_from(code).ok()?;
    Some((*KINDS.get(code / 8)?, *ARGS.get(code % 8)?))
}

/// The path's cost: see the module comment.
fn cost(rows: f64, columns: usize, groups: f64) -> f64 {
    // SAFETY: reads planner GUCs of this process.
    let (op, tuple) = unsafe { (pg_sys::cpu_operator_cost, pg_sys::cpu_tuple_cost) };
    SETUP_COST + rows * ROW_FACTOR * op * columns.max(1) as f64 + groups * tuple
}

/// Adds the GpuGroupAgg path to `output_rel` where the query qualifies.
///
/// Its child is an aggregation of its own over the input's cheapest path (hashed, or plain
/// without GROUP BY), not one of `output_rel`'s paths: `add_path` frees the paths a new one
/// dominates, and the node's path dominates PostgreSQL's serial ones.
///
/// # Safety
/// The hook's arguments (`extra`: the grouping's `GroupPathExtraData`).
unsafe fn add_path(
    root: *mut pg_sys::PlannerInfo,
    input_rel: *mut pg_sys::RelOptInfo,
    output_rel: *mut pg_sys::RelOptInfo,
    extra: *mut pg_sys::GroupPathExtraData,
) {
    // SAFETY: forwarded contract; every node is allocated in the planner's memory context.
    unsafe {
        let subpath = (*input_rel).cheapest_total_path;
        if subpath.is_null() || extra.is_null() {
            return;
        }
        let Some(mut shape) = Shape::of(root, input_rel, output_rel) else { return };
        // PostgreSQL's estimate of the groups, from its own cheapest path so far.
        let estimate = PgList::<pg_sys::Path>::from_pg((*output_rel).pathlist).get_ptr(0).map_or(1.0, |p| (*p).rows).max(1.0);
        shape.groups = estimate as u64;
        #[cfg(any(feature = "pg14", feature = "pg15"))]
        let group_clause = (*(*root).parse).groupClause;
        #[cfg(not(any(feature = "pg14", feature = "pg15")))]
        let group_clause = (*root).processed_groupClause;
        let strategy = if group_clause.is_null() { pg_sys::AggStrategy::AGG_PLAIN } else { pg_sys::AggStrategy::AGG_HASHED };
        let child = pg_sys::create_agg_path(
            root,
            output_rel,
            subpath,
            (*output_rel).reltarget,
            strategy,
            pg_sys::AggSplit::AGGSPLIT_SIMPLE,
            group_clause,
            std::ptr::null_mut(),
            &(*extra).agg_final_costs,
            estimate,
        ) as *mut pg_sys::Path;
        let cp = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomPath>()) as *mut pg_sys::CustomPath;
        let p = &mut (*cp).path;
        p.type_ = pg_sys::NodeTag::T_CustomPath;
        p.pathtype = pg_sys::NodeTag::T_CustomScan;
        p.parent = output_rel;
        p.pathtarget = (*output_rel).reltarget;
        p.param_info = std::ptr::null_mut();
        p.parallel_aware = false;
        p.parallel_safe = false;
        p.parallel_workers = 0;
        p.rows = estimate;
        #[cfg(feature = "pg18")]
        {
            p.disabled_nodes = 0;
        }
        let c = cost((*input_rel).tuples, shape.columns().len(), estimate);
        p.startup_cost = c;
        p.total_cost = c;
        let mut children = PgList::<pg_sys::Path>::new();
        children.push(child);
        (*cp).custom_paths = children.into_pg();
        (*cp).custom_private = shape.to_private();
        (*cp).methods = &METHODS.path;
        pg_sys::add_path(output_rel, cp as *mut pg_sys::Path);
    }
}

/// Where an execution's rows came from (EXPLAIN ANALYZE's `Read From`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadFrom {
    Cache,
    Child(&'static str),
}

/// The groups of one execution, as the table gave them, and the next to return.
struct Groups {
    rows: Vec<groups::Group>,
    next: usize,
}

/// What the execution does: not started, returning groups, or returning the child's rows.
enum Mode {
    Start,
    Groups(Groups),
    Child,
}

/// Figures of the last execution (EXPLAIN ANALYZE).
#[derive(Default)]
struct Stats {
    groups: u64,
    grown: u32,
    appended: u64,
}

/// The GpuGroupAgg custom scan.
pub struct GpuGroupAggScan {
    shape: Shape,
    child: *mut pg_sys::PlanState,
    estate: *mut pg_sys::EState,
    mode: Mode,
    read_from: Option<ReadFrom>,
    stats: Stats,
    /// The attribute names of the table's columns the plan reads (EXPLAIN).
    names: Vec<(i16, String)>,
    relname: String,
}

/// The group table's aggregates for `aggs`: one state each, then a count beside each sum.
fn table_aggs(aggs: &[AggOf], cols: &dyn Fn(&Col) -> usize) -> Vec<(AggKind, Input)> {
    let mut out: Vec<(AggKind, Input)> = aggs
        .iter()
        .map(|a| {
            let input = a.col.as_ref().map_or(Input::Star, |c| Input::Col(cols(c)));
            let kind = match a.kind {
                Kind::CountStar => AggKind::CountStar,
                Kind::Count => AggKind::Count,
                Kind::Sum => AggKind::SumInt,
                Kind::Min => AggKind::MinInt,
                Kind::Max => AggKind::MaxInt,
            };
            (kind, input)
        })
        .collect();
    for a in aggs.iter().filter(|a| a.kind == Kind::Sum) {
        let c = a.col.as_ref().expect("a sum has a column");
        out.push((AggKind::Count, Input::Col(cols(c))));
    }
    out
}

/// Aggregate `i`'s value from its group's states (`states[i]`, and for a sum the count the
/// table keeps beside it).
fn value_of(aggs: &[AggOf], i: usize, states: &[(u64, u64)]) -> Result<Value> {
    let a = aggs[i];
    let s = *states.get(i).ok_or_else(|| UvmError::new(Code::SystemError, "a group without its aggregates"))?;
    Ok(match a.kind {
        Kind::CountStar | Kind::Count => Value::Int(s.0 as i64),
        Kind::Min | Kind::Max => {
            if s.1 == 0 {
                Value::Null
            } else {
                Value::Int(s.0 as i64)
            }
        }
        Kind::Sum => {
            let nth = aggs[..i].iter().filter(|a| a.kind == Kind::Sum).count();
            let count =
                states.get(aggs.len() + nth).ok_or_else(|| UvmError::new(Code::SystemError, "a sum without its count"))?;
            if count.0 == 0 {
                Value::Null
            } else {
                let sum = groups::sum_int(s);
                match agg::out_of(a.kind, a.arg) {
                    Out::Numeric => Value::Big(sum),
                    _ => Value::Int(
                        i64::try_from(sum).map_err(|_| UvmError::new(Code::NumericValueOutOfRange, "bigint out of range"))?,
                    ),
                }
            }
        }
    })
}

impl GpuGroupAggScan {
    /// Computes the groups from the cache, or says why the child answers instead.
    fn read_cache(&mut self) -> std::result::Result<Groups, &'static str> {
        // SAFETY: the executor state is live while the node runs.
        let snap = unsafe { (*self.estate).es_snapshot };
        let Some(u) = caches::usable_in_query(self.shape.relid, snap).unwrap_or_else(|e| report(e)) else {
            return Err("the table has no cache current for the query's snapshot");
        };
        // The planned columns, by their index in the cache, with the planned encodings.
        let mut index: Vec<(Col, usize)> = Vec::new();
        for c in self.shape.columns() {
            match u.layout.columns().iter().position(|x| x.attnum == c.attnum) {
                Some(i) if u.layout.encoding(i) == Some(c.encoding) => index.push((c, i)),
                _ => return Err("the cache lacks a column the plan reads"),
            }
        }
        let at = |c: &Col| index.iter().find(|x| x.0 == *c).map(|x| x.1).expect("a planned column");
        // SAFETY: the query's snapshot, live while it runs.
        let Some(tail) = (unsafe { caches::visible_tail(&u, snap) }).unwrap_or_else(|e| report(e)) else {
            return Err("the cache holds appended rows this snapshot cannot place");
        };
        let aggs = table_aggs(&self.shape.aggs, &at);
        let spec = Spec {
            dims: Vec::new(),
            filters: self
                .shape
                .filters
                .iter()
                .map(|f| Filter { col: at(&f.col), test: Test::Range { lo: f.lo, hi: f.hi } })
                .collect(),
            joins: Vec::new(),
            keys: self.shape.keys.iter().map(|k| Source::Col(at(k))).collect(),
            aggs: aggs.clone(),
        };
        let mut shape = groups::Shape {
            key_words: self.shape.keys.len() as u16 + 1,
            aggs: aggs.iter().map(|a| a.0).collect(),
            slot_count: groups::Shape::slots_for(self.shape.groups.max(MIN_GROUPS)),
        };
        // The program into a group table segment, grown into a new one whenever it is full.
        let create = |shape: &groups::Shape| -> Result<SegRef> {
            let bytes = shape.bytes().min(i64::MAX as u64) as i64;
            cleanup::try_create("groups", |name| {
                try_executor(|ex| exec::create(ex, name, bytes, Some(bytes), TierPref::Auto, current_user(), now()))
            })
        };
        let run = |shape: &mut groups::Shape, stats: &mut Stats| -> Result<(SegRef, Vec<u8>)> {
            let mut seg = create(shape)?;
            let mut init = Vec::new();
            super::fallible::try_resize(&mut init, shape.bytes() as usize, 0u8, "a group table")?;
            groups::init(&mut init, shape, 0x5eed)?;
            try_executor(|ex| exec::write(ex, &seg, 0, &init))?;
            drop(init);
            let mut start = (0, 0);
            loop {
                match try_executor(|ex| exec::scan_groups(ex, &u.seg, &seg, &spec, start))? {
                    Progress::Done => break,
                    Progress::Full { block, row, slots } => {
                        let next = create(&shape.with_slots(slots))?;
                        try_executor(|ex| exec::groups_grow(ex, &seg, &next, slots))?;
                        cleanup::drop_now(&seg);
                        (seg, start, shape.slot_count) = (next, (block, row), slots);
                        stats.grown += 1;
                    }
                }
            }
            let mut out = Vec::new();
            super::fallible::try_resize(&mut out, shape.bytes() as usize, 0u8, "a group table")?;
            try_executor(|ex| exec::read(ex, &seg, 0, &mut out))?;
            Ok((seg, out))
        };
        self.stats = Stats::default();
        let (seg, mut bytes) = match run(&mut shape, &mut self.stats) {
            Ok(x) => x,
            // A cache dropped before the program pinned it (a rebuild, cache_drop); an engine
            // without scan programs. The temporary segments are dropped at the abort of an
            // error, and here at the statement's end (cleanup's list) otherwise.
            Err(e) if e.code == Code::UndefinedObject => return Err("the cache was dropped"),
            Err(e) if e.code == Code::FeatureNotSupported => return Err("the engine runs no scan programs"),
            Err(e) => report(e),
        };
        cleanup::drop_now(&seg);
        // The appended rows this snapshot sees, folded by the same program on the CPU.
        let program = Program { filters: spec.filters.clone(), joins: Vec::new(), keys: spec.keys.clone(), aggs: aggs.clone() };
        let mut scratch = crate::scan::Scratch::default();
        let mut i = 0;
        while i < tail.len() {
            let full = {
                let mut t = groups::Table::parse("group table", &mut bytes).unwrap_or_else(|e| report(e));
                match crate::scan::fold_row(&program, &mut t, &mut scratch, |c| Ok(tail.word(i, c))).unwrap_or_else(|e| report(e))
                {
                    Row::Full(slots) => Some(slots),
                    Row::Folded | Row::Dropped => None,
                }
            };
            match full {
                None => {
                    i += 1;
                    self.stats.appended += 1;
                }
                Some(slots) => {
                    let mut to = Vec::new();
                    super::fallible::try_resize(&mut to, shape.with_slots(slots).bytes() as usize, 0u8, "a group table")
                        .unwrap_or_else(|e| report(e));
                    let mut from = groups::Table::parse("group table", &mut bytes).unwrap_or_else(|e| report(e));
                    groups::grow(&mut from, &mut to, slots).unwrap_or_else(|e| report(e));
                    (bytes, shape.slot_count) = (to, slots);
                    self.stats.grown += 1;
                }
            }
            if i.is_multiple_of(crate::interrupt::EVERY as usize) {
                pg_sys::check_for_interrupts!();
            }
        }
        let mut rows = groups::Table::parse("group table", &mut bytes).and_then(|mut t| t.groups()).unwrap_or_else(|e| report(e));
        // An ungrouped query returns one row over no rows.
        if rows.is_empty() && self.shape.keys.is_empty() {
            rows.push((vec![0], vec![(0, 0); aggs.len()]));
        }
        self.stats.groups = rows.len() as u64;
        Ok(Groups { rows, next: 0 })
    }

    /// The next group as the node's row (the scan tuple: the keys, then the aggregates,
    /// projected), or null at the end.
    ///
    /// # Safety
    /// `node` is this node's executor state.
    unsafe fn emit(&mut self, node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        let Mode::Groups(g) = &mut self.mode else { return std::ptr::null_mut() };
        let Some((key, states)) = g.rows.get(g.next) else { return std::ptr::null_mut() };
        g.next += 1;
        let nkeys = self.shape.keys.len();
        // SAFETY: forwarded contract: the scan slot has one column per key and per aggregate,
        // of their types; values are made in the per-tuple memory.
        unsafe {
            let econtext = (*node).ss.ps.ps_ExprContext;
            let scan = (*node).ss.ss_ScanTupleSlot;
            pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
            pg_sys::ExecClearTuple(scan);
            let old = pg_sys::MemoryContextSwitchTo((*econtext).ecxt_per_tuple_memory);
            let nulls = key.get(nkeys).copied().unwrap_or(0);
            for (i, k) in self.shape.keys.iter().enumerate() {
                let isnull = nulls & (1 << i) != 0;
                *(*scan).tts_values.add(i) = datum_of_word(key.get(i).copied().unwrap_or(0), k.encoding);
                *(*scan).tts_isnull.add(i) = isnull;
            }
            for (i, a) in self.shape.aggs.iter().enumerate() {
                let v = value_of(&self.shape.aggs, i, states).unwrap_or_else(|e| report(e));
                let (d, isnull) = super::gpujoin::datum_of_value(v, agg::out_of(a.kind, a.arg));
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

    fn name_of(&self, c: &Col) -> String {
        self.names.iter().find(|n| n.0 == c.attnum).map_or_else(|| format!("#{}", c.attnum), |n| n.1.clone())
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
                    if let Some(i) = shape.keys.iter().position(|k| k.attnum == (*v).varattno) {
                        if key_vars[i].is_null() {
                            key_vars[i] = n;
                        }
                    }
                } else if (*n).type_ == pg_sys::NodeTag::T_Aggref {
                    let a = n as *mut pg_sys::Aggref;
                    let args = PgList::<pg_sys::TargetEntry>::from_pg((*a).args);
                    let Some((kind, arg)) = agg::spec_of(u32::from((*a).aggfnoid)) else { continue };
                    let col =
                        args.get_ptr(0).and_then(|te| gpujoin::as_var((*te).expr as *mut pg_sys::Node)).map(|v| (*v).varattno);
                    if let Some(i) =
                        shape.aggs.iter().position(|x| x.kind == kind && x.arg == arg && x.col.map(|c| c.attnum) == col)
                    {
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
                    let (typ, typmod) = type_of(k.encoding);
                    key_vars[i] =
                        pg_sys::makeVar(shape.varno as _, k.attnum, typ, typmod, pg_sys::InvalidOid, 0) as *mut pg_sys::Node;
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
            let cscan = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomScan>()) as *mut pg_sys::CustomScan;
            (*cscan).scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
            (*cscan).scan.plan.targetlist = tlist;
            (*cscan).scan.scanrelid = 0;
            (*cscan).flags = (*path).flags;
            (*cscan).custom_plans = custom_plans;
            (*cscan).custom_scan_tlist = scan_tlist.into_pg();
            (*cscan).custom_private = (*path).custom_private;
            cscan
        }
    }

    unsafe fn create(cscan: *mut pg_sys::CustomScan) -> Self {
        // SAFETY: our plan: custom_private is what `Shape::to_private` wrote.
        let shape = unsafe { Shape::from_private((*cscan).custom_private) }
            .unwrap_or_else(|| report(UvmError::new(Code::SystemError, "GpuGroupAgg: a plan without its program")));
        GpuGroupAggScan {
            shape,
            child: std::ptr::null_mut(),
            estate: std::ptr::null_mut(),
            mode: Mode::Start,
            read_from: None,
            stats: Stats::default(),
            names: Vec::new(),
            relname: String::new(),
        }
    }

    unsafe fn begin(&mut self, node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
        // SAFETY: BeginCustomScan's arguments; the child is listed in custom_ps for EXPLAIN.
        unsafe {
            let cscan = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
            let plan = PgList::<pg_sys::Plan>::from_pg((*cscan).custom_plans).get_ptr(0).expect("child plan");
            self.child = pg_sys::ExecInitNode(plan, estate, eflags);
            self.estate = estate;
            let mut ps = PgList::<pg_sys::PlanState>::new();
            ps.push(self.child);
            (*node).custom_ps = ps.into_pg();
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
        if matches!(self.mode, Mode::Start) {
            self.mode = match self.read_cache() {
                Ok(g) => {
                    self.read_from = Some(ReadFrom::Cache);
                    Mode::Groups(g)
                }
                Err(why) => {
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
            if !chg.is_null() {
                pg_sys::UpdateChangedParamSet(self.child, chg);
            }
            if (*self.child).chgParam.is_null() {
                pg_sys::ExecReScan(self.child);
            }
        }
        self.mode = Mode::Start;
    }

    unsafe fn end(&mut self, _node: *mut pg_sys::CustomScanState) {
        if !self.child.is_null() {
            // SAFETY: initialized in begin.
            unsafe { pg_sys::ExecEndNode(self.child) };
        }
    }

    unsafe fn explain(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _ancestors: *mut pg_sys::List,
        es: *mut pg_sys::ExplainState,
    ) {
        // SAFETY: ExplainCustomScan's state; the strings are copied by EXPLAIN.
        unsafe {
            let prop = |label: &CStr, value: &str| {
                let v = std::ffi::CString::new(value.replace('\0', "")).expect("no NUL");
                pg_sys::ExplainPropertyText(label.as_ptr(), v.as_ptr(), es);
            };
            prop(c"Column Cache", &self.relname);
            let cols: Vec<String> = self.shape.columns().iter().map(|c| self.name_of(c)).collect();
            if !cols.is_empty() {
                prop(c"Cached Columns", &cols.join(", "));
            }
            if !self.shape.keys.is_empty() {
                let keys: Vec<String> = self.shape.keys.iter().map(|k| self.name_of(k)).collect();
                prop(c"Group Keys", &keys.join(", "));
            }
            if !self.shape.filters.is_empty() {
                let f: Vec<String> = self.shape.filters.iter().map(|f| describe_range(&self.name_of(&f.col), f)).collect();
                prop(c"Cache Filters", &f.join(" AND "));
            }
            if (*es).analyze {
                match self.read_from {
                    Some(ReadFrom::Cache) => {
                        prop(c"Read From", "cache");
                        let int =
                            |label: &CStr, v: u64| pg_sys::ExplainPropertyInteger(label.as_ptr(), std::ptr::null(), v as i64, es);
                        int(c"Groups", self.stats.groups);
                        if self.stats.appended > 0 {
                            int(c"Appended Rows", self.stats.appended);
                        }
                        if self.stats.grown > 0 {
                            int(c"Group Table Grown", u64::from(self.stats.grown));
                        }
                    }
                    Some(ReadFrom::Child(why)) => prop(c"Read From", &format!("child: {why}")),
                    None => {}
                }
            }
        }
    }
}

/// A range as EXPLAIN shows it, its bounds in the column's type.
fn describe_range(name: &str, f: &Range) -> String {
    let v = |x: i64| text_of(x as u64, f.col.encoding);
    match (f.lo, f.hi) {
        (i64::MIN, i64::MAX) => format!("{name} IS NOT NULL"),
        (lo, hi) if lo == hi => format!("{name} = {}", v(lo)),
        (i64::MIN, hi) => format!("{name} <= {}", v(hi)),
        (lo, i64::MAX) => format!("{name} >= {}", v(lo)),
        (lo, hi) => format!("{name} BETWEEN {} AND {}", v(lo), v(hi)),
    }
}

/// A word of `encoding` as its type's text (its output function).
fn text_of(w: u64, encoding: Encoding) -> String {
    let (typ, _) = type_of(encoding);
    // SAFETY: a catalog lookup and a call of a built-in type's output function on a by-value
    // datum of that type; the result is a palloc'd C string.
    unsafe {
        let (mut func, mut varlena) = (pg_sys::InvalidOid, false);
        pg_sys::getTypeOutputInfo(typ, &mut func, &mut varlena);
        let p = pg_sys::OidOutputFunctionCall(func, datum_of_word(w, encoding));
        CStr::from_ptr(p).to_string_lossy().into_owned()
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
        _ => pg_sys::INT8OID,
    };
    (t, -1)
}
