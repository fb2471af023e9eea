//! Aggregates pushed into GpuJoin: `SELECT count(*), sum(d.v) FROM f JOIN d ON ...` folds its
//! aggregates inside the GpuJoin node and hands PostgreSQL one row per participant.
//!
//! # Why
//!
//! Through the plan node alone, every joined row goes up to PostgreSQL's Partial Aggregate (a
//! tuple formed, a call of the node, a transition function per aggregate), which is most of
//! the node's time on the H200's 50 M x 5 M join. PG-Strom answers with GpuPreAgg; here the
//! GpuJoin node itself folds the matches (`super::agg`), as the `uvm.gpujoin_probe` aggregate
//! already does with its counts and sums.
//!
//! # Plan
//!
//! ```text
//! Custom Scan (UvmGpuJoinAgg)                     one row: the final results
//!   ->  Gather                                    one row per participant
//!         ->  Parallel Custom Scan (UvmGpuJoin)   Aggregates: count(*), sum(d.v)
//!               ->  Parallel Seq Scan on fact f
//!               ->  Parallel Seq Scan on dim d
//! ```
//!
//! (serially, the GpuJoin node directly under the GpuJoinAgg).
//!
//! - **Planner** (`create_upper_paths_hook`, at `UPPERREL_GROUP_AGG`): for a query level with
//!   no GROUP BY, grouping sets, HAVING or set-returning functions in its target, whose
//!   input is a join relation for which the join hook offered GpuJoin paths with no clause
//!   but the join's (`super::gpujoin::candidates`: every serial one, the cheapest partial one), and whose grouping target holds only
//!   aggregates the node computes ([`supported_aggrefs`]: plain, without DISTINCT, ORDER BY or
//!   FILTER, over a plain column of the join) inside any expressions, it adds a path
//!   "GpuJoinAgg" over a copy of the GpuJoin path that computes those aggregates
//!   (`gpujoin::with_aggregates`), under a Gather for the partial one. PostgreSQL's own paths
//!   (Finalize Aggregate over a Gather over a Partial Aggregate over a join) compete by cost.
//! - **The GpuJoin node in aggregate mode** (`super::gpujoin`): its target list is the list of
//!   Aggrefs; its scan tuple starts with their results (setrefs turns the Aggrefs into
//!   references to them, as it does for postgres_fdw's pushed-down aggregates). Each
//!   participant folds its matches and returns one row of partial results, typed as the
//!   aggregates' results (`super::agg::out_of`): no PostgreSQL state type is involved.
//! - **GpuJoinAgg** (this module's node): reads every row of its child, merges the partial
//!   results (`super::agg::Acc::merge`), and returns one row: its scan tuple is the Aggrefs'
//!   values, and its target list (the query's expressions over the aggregates) is projected
//!   from it.
//!
//! # Lifecycle
//!
//! Begin initializes the child; exec returns one row and then none; rescan resets the
//! aggregates and rescans the child; end ends it. The node holds no resource beyond memory:
//! the GpuJoin node below owns the segments.

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::PgList;

use super::agg::{self, Acc, Out};
use super::gpujoin::{self, candidates};
use crate::customscan::{self, JoinScan, Methods};
use crate::error::{Code, UvmError};
use crate::runtime::report;

/// The merge of one partial row, per aggregate, in `cpu_operator_cost`.
const MERGE_FACTOR: f64 = 1.0;

static METHODS: Methods = customscan::methods::<GpuJoinAggScan>();

/// Registers the scan methods (the planner reaches [`add_paths`] through `super`'s
/// upper-paths hook).
pub fn install() {
    customscan::register::<GpuJoinAggScan>();
}

/// The distinct aggregates of `exprs` (a grouping target's expressions), if every one is one the
/// GpuJoin node computes and no column is used outside an aggregate.
///
/// # Safety
/// Planner expressions.
pub unsafe fn supported_aggrefs(exprs: *mut pg_sys::List) -> Option<Vec<*mut pg_sys::Aggref>> {
    // SAFETY: forwarded contract.
    unsafe {
        let flags = pg_sys::PVC_INCLUDE_AGGREGATES | pg_sys::PVC_INCLUDE_WINDOWFUNCS | pg_sys::PVC_INCLUDE_PLACEHOLDERS;
        let found = PgList::<pg_sys::Node>::from_pg(pg_sys::pull_var_clause(exprs as *mut pg_sys::Node, flags as i32));
        let mut out: Vec<*mut pg_sys::Aggref> = Vec::new();
        for n in found.iter_ptr() {
            if (*n).type_ != pg_sys::NodeTag::T_Aggref {
                return None; // a column outside an aggregate, a placeholder
            }
            let a = n as *mut pg_sys::Aggref;
            let (kind, arg) = agg::spec_of(u32::from((*a).aggfnoid))?;
            if !agg::plain(a) {
                return None;
            }
            let args = PgList::<pg_sys::TargetEntry>::from_pg((*a).args);
            if kind == agg::Kind::CountStar {
                if !args.is_empty() {
                    return None;
                }
            } else {
                let te = args.get_ptr(0).filter(|_| args.len() == 1)?;
                let v = gpujoin::as_var((*te).expr as *mut pg_sys::Node)?;
                let want = match arg {
                    agg::Arg::Any => None,
                    agg::Arg::Int2 => Some(pg_sys::INT2OID),
                    agg::Arg::Int4 => Some(pg_sys::INT4OID),
                    agg::Arg::Int8 => Some(pg_sys::INT8OID),
                };
                if want.is_some_and(|t| t != (*v).vartype) {
                    return None;
                }
            }
            if !out.iter().any(|&b| pg_sys::equal(a as *const std::ffi::c_void, b as *const std::ffi::c_void)) {
                out.push(a);
            }
        }
        (!out.is_empty()).then_some(out)
    }
}

/// Adds GpuJoinAgg paths to `output_rel` (the grouped relation) where the query qualifies (see
/// the module comment).
///
/// # Safety
/// The hook's arguments.
pub(super) unsafe fn add_paths(
    root: *mut pg_sys::PlannerInfo,
    input_rel: *mut pg_sys::RelOptInfo,
    output_rel: *mut pg_sys::RelOptInfo,
) {
    // SAFETY: forwarded contract; every node is allocated in the planner's memory context.
    unsafe {
        let parse = (*root).parse;
        if !(*parse).groupClause.is_null()
            || !(*parse).groupingSets.is_null()
            || (*root).hasHavingQual
            || (*parse).hasTargetSRFs
            || (*input_rel).reloptkind != pg_sys::RelOptKind::RELOPT_JOINREL
        {
            return;
        }
        let (serials, partial) = candidates::of(root, input_rel);
        if serials.is_empty() && partial.is_null() {
            return;
        }
        let Some(aggrefs) = supported_aggrefs((*(*output_rel).reltarget).exprs) else { return };
        let target = pg_sys::create_empty_pathtarget();
        for &a in &aggrefs {
            pg_sys::add_column_to_pathtarget(target, a as *mut pg_sys::Expr, 0);
        }
        pg_sys::set_pathtarget_cost_width(root, target);
        if !partial.is_null() && gpujoin::can_aggregate(partial) {
            let p = gpujoin::with_aggregates(partial, target);
            if gpujoin::leader_probes() && probe_mode(partial, &aggrefs) {
                gpujoin::without_worker_contexts(p);
            }
            let mut rows = ((*p).path.parallel_workers + 1) as f64;
            let g = pg_sys::create_gather_path(root, input_rel, p as *mut pg_sys::Path, target, std::ptr::null_mut(), &mut rows);
            pg_sys::add_path(output_rel, final_path(output_rel, g as *mut pg_sys::Path, aggrefs.len()) as *mut pg_sys::Path);
        }
        // Every serial path (add_path keeps the cheapest): one whose sides are plain scans of
        // tables with column caches is priced at the caches' cost (`gpujoin::cached`).
        for serial in serials.into_iter().filter(|&s| gpujoin::can_aggregate(s)) {
            let p = gpujoin::with_aggregates(serial, target);
            if let Some(cost) = gpujoin::cached_cost(root, serial, &aggrefs) {
                (*p).path.startup_cost = cost;
                (*p).path.total_cost = cost;
            }
            pg_sys::add_path(output_rel, final_path(output_rel, p as *mut pg_sys::Path, aggrefs.len()) as *mut pg_sys::Path);
        }
    }
}

/// Whether the GpuJoin node computes `aggrefs` in its probe mode over `path`'s join (every one
/// `count(*)`, or `count` or `sum` of one and the same column of the inner side: the outer
/// side gives its keys alone), as its executor decides (`gpujoin`'s `probe_plan`).
///
/// # Safety
/// Planner structures; `aggrefs` from [`supported_aggrefs`].
unsafe fn probe_mode(path: *mut pg_sys::CustomPath, aggrefs: &[*mut pg_sys::Aggref]) -> bool {
    // SAFETY: forwarded contract; the second child is the inner path.
    unsafe {
        let Some(inner) = PgList::<pg_sys::Path>::from_pg((*path).custom_paths).get_ptr(1) else { return false };
        let relids = (*(*inner).parent).relids;
        let mut col: Option<(i32, i16)> = None;
        for &a in aggrefs {
            let Some((kind, _)) = agg::spec_of(u32::from((*a).aggfnoid)) else { return false };
            match kind {
                agg::Kind::CountStar => {}
                agg::Kind::Count | agg::Kind::Sum => {
                    let args = PgList::<pg_sys::TargetEntry>::from_pg((*a).args);
                    let Some(v) = args.get_ptr(0).and_then(|te| gpujoin::as_var((*te).expr as *mut pg_sys::Node)) else {
                        return false;
                    };
                    #[allow(clippy::unnecessary_cast)] // an Index (u32) on PostgreSQL 14, an int from 15 on
                    let this = ((*v).varno as i32, (*v).varattno);
                    if !pg_sys::bms_is_member(this.0, relids) || col.is_some_and(|c| c != this) {
                        return false;
                    }
                    col = Some(this);
                }
                _ => return false,
            }
        }
        true
    }
}

/// The GpuJoinAgg path over `child` (rows of `naggs` partial results).
///
/// # Safety
/// Planner structures.
unsafe fn final_path(output_rel: *mut pg_sys::RelOptInfo, child: *mut pg_sys::Path, naggs: usize) -> *mut pg_sys::CustomPath {
    // SAFETY: forwarded contract.
    unsafe {
        let merge = (*child).rows * naggs as f64 * MERGE_FACTOR * pg_sys::cpu_operator_cost;
        let cost = (*child).total_cost + merge + pg_sys::cpu_tuple_cost;
        #[cfg(feature = "pg18")]
        let disabled = (*child).disabled_nodes;
        #[cfg(not(feature = "pg18"))]
        let disabled = 0;
        customscan::upper_path(output_rel, &[child], 1.0, cost, disabled, &METHODS.path)
    }
}

/// The GpuJoinAgg custom scan: merges its child's rows of partial results into one row.
pub struct GpuJoinAggScan {
    accs: Vec<(Acc, Out)>,
    child: *mut pg_sys::PlanState,
    done: bool,
}

impl JoinScan for GpuJoinAggScan {
    const NAME: &'static CStr = c"UvmGpuJoinAgg";

    fn methods() -> &'static Methods {
        &METHODS
    }

    unsafe fn plan(
        _root: *mut pg_sys::PlannerInfo,
        _rel: *mut pg_sys::RelOptInfo,
        path: *mut pg_sys::CustomPath,
        tlist: *mut pg_sys::List,
        clauses: *mut pg_sys::List,
        custom_plans: *mut pg_sys::List,
    ) -> *mut pg_sys::CustomScan {
        // SAFETY: PlanCustomPath's arguments; the path is ours (one child, whose target is the
        // list of Aggrefs).
        unsafe {
            let child = PgList::<pg_sys::Path>::from_pg((*path).custom_paths).get_ptr(0).expect("child path");
            let mut scan_tlist = PgList::<pg_sys::TargetEntry>::new();
            let mut private = PgList::<pg_sys::Node>::new();
            for (i, e) in PgList::<pg_sys::Node>::from_pg((*(*child).pathtarget).exprs).iter_ptr().enumerate() {
                let a = e as *mut pg_sys::Aggref;
                private.push(gpujoin::int_node(u32::from((*a).aggfnoid) as i64));
                let copy = pg_sys::copyObjectImpl(e as *const std::ffi::c_void) as *mut pg_sys::Expr;
                scan_tlist.push(pg_sys::makeTargetEntry(copy, (i + 1) as i16, std::ptr::null_mut(), false));
            }
            let qual = pg_sys::extract_actual_clauses(clauses, false);
            customscan::upper_scan(path, tlist, qual, custom_plans, scan_tlist.into_pg(), private.into_pg())
        }
    }

    unsafe fn create(cscan: *mut pg_sys::CustomScan) -> Self {
        // SAFETY: our plan: custom_private holds one int8 Const (the function's OID) per aggregate.
        let accs = unsafe {
            PgList::<pg_sys::Node>::from_pg((*cscan).custom_private)
                .iter_ptr()
                .map(|n| {
                    let fnoid = (*(n as *mut pg_sys::Const)).constvalue.value() as u32;
                    let Some((kind, arg)) = agg::spec_of(fnoid) else {
                        report(UvmError::new(Code::SystemError, format!("GpuJoinAgg: aggregate function {fnoid} in plan")));
                    };
                    (Acc::new(kind, arg), agg::out_of(kind, arg))
                })
                .collect()
        };
        GpuJoinAggScan { accs, child: std::ptr::null_mut(), done: false }
    }

    unsafe fn begin(&mut self, node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
        // SAFETY: BeginCustomScan's arguments; the child is listed in custom_ps for EXPLAIN.
        unsafe {
            let cscan = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
            let plan = PgList::<pg_sys::Plan>::from_pg((*cscan).custom_plans).get_ptr(0).expect("child plan");
            self.child = pg_sys::ExecInitNode(plan, estate, eflags);
            let mut ps = PgList::<pg_sys::PlanState>::new();
            ps.push(self.child);
            (*node).custom_ps = ps.into_pg();
        }
    }

    unsafe fn exec(&mut self, node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        // SAFETY: ExecCustomScan's argument; the child's rows have one column per aggregate,
        // of its result type; the scan slot has the same shape.
        unsafe {
            if self.done {
                return std::ptr::null_mut();
            }
            let n = self.accs.len();
            loop {
                let slot = pg_sys::ExecProcNode(self.child);
                if slot.is_null() || (*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16 != 0 {
                    break;
                }
                if ((*slot).tts_nvalid as usize) < n {
                    pg_sys::slot_getsomeattrs_int(slot, n as i32);
                }
                for (i, (acc, out)) in self.accs.iter_mut().enumerate() {
                    if *(*slot).tts_isnull.add(i) {
                        continue;
                    }
                    let v = gpujoin::value_of_datum(*(*slot).tts_values.add(i), *out).unwrap_or_else(|e| report(e));
                    acc.merge(v).unwrap_or_else(|e| report(e));
                }
            }
            self.done = true;
            gpujoin::emit_results(node, self.accs.iter().map(|(acc, out)| (acc, *out)), Some((*node).ss.ps.qual))
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
        self.done = false;
        for (acc, _) in &mut self.accs {
            *acc = Acc::new(acc.kind, acc.arg);
        }
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
        _es: *mut pg_sys::ExplainState,
    ) {
    }
}
