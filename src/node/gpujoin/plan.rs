//! Planning: which joins the node takes, which clauses form its key, what it costs, and the
//! paths it offers (the join hook) or keeps for the aggregate push-down (`super::super::preagg`).
//!
//! # Cost model
//!
//! PostgreSQL's cost unit is about one sequential page read; `cpu_operator_cost` (0.0025) is
//! a few nanoseconds of CPU. The constants below:
//!
//! - the GPU work per key: the H200 probes 31 G keys/s and builds at a similar rate
//!   (`bench/gpu-report.md`, `../shared/notes/gpu-facts.md`), well under a nanosecond, so
//!   the GPU part is priced at [`GPU_ROW_FACTOR`] × `cpu_operator_cost` per row. End to end
//!   (scan, key gathering, service round trips) the aggregates reach 106 M keys/s with 5
//!   workers and build 5 M rows in 0.8 s (`bench/gpu-report.md`): the CPU side dominates,
//!   which the next term prices;
//! - the node's own CPU work per tuple (copying it, gathering its key, forming the output):
//!   `cpu_operator_cost` per outer tuple, [`INNER_ROW_FACTOR`] times that per inner tuple
//!   (kept for the whole scan), plus [`JOINED_ROW_FACTOR`] × `cpu_operator_cost` per output
//!   row;
//! - a fixed start-up of [`SETUP_COST`] for the two segments and the round trips, and
//!   [`ROWS_SETUP_COST`] more where the node returns joined rows;
//! - the build's walk past the inner side's duplicate keys ([`build_walk`]), at
//!   [`GPU_ROW_FACTOR`] × `cpu_operator_cost` per slot;
//! - in the `process` execution mode (each process runs its own kernels),
//!   `parallel_setup_cost` × [`CONTEXT_ROWS`] / outer rows per parallel worker of a partial
//!   path, for the CUDA context each creates (a fixed time, worth fewer units of the model's
//!   margin the larger the join: see [`CONTEXT_ROWS`]). (The leader's is not priced: a session
//!   pays it once, at its first GPU query, whatever the plan.) Not for the probe mode's
//!   aggregates where the workers hand their keys to the leader (`crate::node::handoff`,
//!   [`without_worker_contexts`]): no worker starts a context there.
//!
//! ```text
//! startup = inner total + inner rows × (INNER_ROW_FACTOR + GPU_ROW_FACTOR) × cpu_operator_cost
//!           + build walk × GPU_ROW_FACTOR × cpu_operator_cost + SETUP_COST + ROWS_SETUP_COST
//!           [+ workers × parallel_setup_cost × CONTEXT_ROWS / outer rows in process mode]
//! total   = startup + outer total + outer rows × (1 + GPU_ROW_FACTOR) × cpu_operator_cost
//!           + pairs × qual clauses × cpu_operator_cost
//!           + output rows × JOINED_ROW_FACTOR × cpu_operator_cost
//! ```
//!
//! `pairs` are the pairs the key forms: outer rows × inner rows × the key clauses' joint
//! selectivity (`clauselist_selectivity`), each checked against the qual (the clauses that are
//! not in the key, and the key clauses too where the key is hashed, `super::joinkey`). With
//! every equality in the key the pairs are the output rows; a join whose key is weak and whose
//! other clauses filter most pairs (`a = a AND b + 0 = b`, ten values of `a`) is priced for the
//! billions of pairs it would form, and PostgreSQL's plan wins.
//!
//! In a partial path the inner and outer figures are one participant's (the inner side's
//! when its plan is partial too). The aggregate mode (`with_aggregates`) drops the output rows'
//! term and [`ROWS_SETUP_COST`], and adds [`AGG_FOLD_FACTOR`] × `cpu_operator_cost` per joined
//! row and aggregate.
//!
//! **Calibration** (H200; issue 24's sweep, `bench/gpu-report-planner-sweep.md` in service
//! mode and `bench/gpu-report-planner-sweep-process.md` in process mode: fact 20 K to 50 M
//! rows, dim a tenth, uniform and Zipf keys, three query shapes, each point with both plans'
//! estimates beside their times). What decides a plan is the node's cost against the join it
//! replaces, in PostgreSQL's own units, and PostgreSQL's units per millisecond are not one
//! rate: its hash join is priced at about 240 units per ms on 20 K rows and at 18 to 30 on
//! 20 M (its probes miss the CPU caches there, which its model does not see). The constants
//! are therefore fitted to the sweep, not derived from the node's own times:
//!
//! - the node's start-up, [`SETUP_COST`] (150), splits the 20 K joins, where the two plans
//!   are within 1 ms of each other;
//! - [`ROWS_SETUP_COST`] and [`JOINED_ROW_FACTOR`]: returning joined rows costs the node about
//!   150 ns per row and participant (fetching the outer batch's columns, reading matches back,
//!   forming rows), where the aggregate computed in the probe costs next to nothing; the
//!   earlier `cpu_tuple_cost` per joined row (four times the present price) left PostgreSQL's
//!   plan at 20 M rows where the node was 2.5 times faster;
//! - the build's walk over duplicate keys ([`build_walk`]).
//!
//! With them, `auto` was within 1.25x of the faster plan at 27 of 30 points in service mode
//! (the three others at 200 K rows, where the two plans are within 8 ms and one slow run
//! decides: 1.27x to 1.51x). Joined rows have been cheaper since (their inner column rides in
//! the table, one guard per row, read-ahead during the build, every outer key probed off the
//! service's main thread), with the constants unchanged: 30 of 30 points at 744ebdf
//! (`bench/history/`), 29 of 30 at 0dce23d on a slower host (20 K Zipf rows, 10.3 ms against the
//! node's 8.1 ms: 1.27x) and 30 of 30 at daa9c3e. In process mode, 28 of 30 at c8ba866 (see
//! [`CONTEXT_ROWS`]). Not measured: wide inner rows, other GPUs.

use super::*;
use crate::stats::Decline;

/// The GPU part of a row's cost, as a fraction of `cpu_operator_cost` (see the module comment).
pub const GPU_ROW_FACTOR: f64 = 0.05;
/// The node's CPU work per inner tuple, in `cpu_operator_cost`: copied and kept for the whole
/// scan, and a (key, row id) row sent to the build; twice an outer tuple's, so that the
/// smaller side is the inner one.
pub const INNER_ROW_FACTOR: f64 = 2.0;
/// Start-up cost: two segments created and dropped, a few round trips to the executor: about
/// 1 to 2 ms on the H200 where the node aggregates in its probe (the sweep's 20 K x 2 K join:
/// 2.1 to 2.7 ms in all, PostgreSQL's 2.1 to 2.9 ms). Fitted so that the two plans' estimates
/// meet where their times do (see the module comment).
pub const SETUP_COST: f64 = 150.0;
/// Start-up added when the node returns joined rows (rather than computing aggregates in its
/// probe): it keeps the outer batch's columns, reads the matches back in windows and forms
/// each row. The sweep's smallest joins measure it: at 20 K x 2 K the node takes 2 to 5 ms
/// more to return rows than to aggregate them, where PostgreSQL's own join takes 0.3 ms more.
pub const ROWS_SETUP_COST: f64 = 400.0;
/// Each joined row the node returns, in `cpu_operator_cost`, in place of `cpu_tuple_cost`
/// (four times it), fitted to the sweep: priced at `cpu_tuple_cost`, the node lost every
/// row-returning point from 20 M rows up to PostgreSQL's plan, which took 2 to 3 times as long.
pub const JOINED_ROW_FACTOR: f64 = 1.0;
/// Start-up of each parallel worker in the `process` execution mode, where it creates a CUDA
/// context of its own (150 to 170 ms each, serialised by the driver), as a number of outer rows:
/// each worker is charged `parallel_setup_cost` (PostgreSQL's price for starting a worker, 1,000
/// by default; a session that sets it to 0 to force parallel plans forces them here too) times
/// this over the outer side's rows. A fixed charge per worker could not be fitted: the
/// process-mode sweep at 58ad1ff (`bench/history/gpu-report-planner-sweep-process-58ad1ff.md`, 5 units of
/// `parallel_setup_cost` per worker then) kept PostgreSQL's plan at 20 M x 2 M (1.32x to 1.62x)
/// and needed, for every point to pick right, a charge above 4,840 units per worker at 2 M rows
/// and below 1,940 at 20 M. The model's margin between the two plans grows far slower with the
/// join than the time between them does (PostgreSQL's hash join misses the CPU caches on a large
/// inner side, which its model does not see), so a fixed time is worth fewer units of that
/// margin the larger the join. 20 M rows puts both bounds 2x away: 10,000 units per worker at
/// 2 M rows, 1,000 at 20 M, 400 at 50 M. Measured with it (c8ba866,
/// `bench/gpu-report-planner-sweep-process.md`): 28 of 30 points within 1.25x, every point from
/// 20 M rows up on the node; the two misses are 2 M-row count/sum joins (uniform, Zipf), where
/// the node forced ran serially (no worker context) in 158 and 142 ms against PostgreSQL's
/// parallel plan's 264 and 286 ms, and its serial estimate was 40 % above PostgreSQL's. Those
/// joins now run in parallel with no worker context: the workers hand their keys to the leader,
/// which probes them (`crate::node::handoff`), and the charge goes.
pub const CONTEXT_ROWS: f64 = 20e6;
/// The node declines a join whose key forms more than this many pairs per joined row (plus
/// [`PAIRS_SLACK`]), by the planner's estimates: with `a = a AND b = b + 0` and ten values of
/// `a`, 200,000 rows a side form 4 billion pairs for 20,000 joined rows. PostgreSQL's own join
/// hashes all its clauses and does not form them.
pub const MAX_PAIRS_PER_ROW: f64 = 10.0;
/// Pairs the node may form beyond [`MAX_PAIRS_PER_ROW`] per joined row (a small join's
/// estimates are rough, and its pairs cheap).
pub const PAIRS_SLACK: f64 = 1e6;
/// An aggregate computed in the node: its fold per joined row, in `cpu_operator_cost` (an
/// addition, where PostgreSQL's Aggregate calls a transition function).
pub const AGG_FOLD_FACTOR: f64 = 0.25;

static mut PREV_HOOK: pg_sys::set_join_pathlist_hook_type = None;

/// Installs the planner hook, chaining the previous one.
pub(super) fn install_hook() {
    // SAFETY: _PG_init runs once per process, before any planning; the hook chain is
    // process-local.
    unsafe {
        PREV_HOOK = pg_sys::set_join_pathlist_hook;
        pg_sys::set_join_pathlist_hook = Some(join_pathlist_hook);
    }
}

/// The table's key type for a column type (int2, int4, date: int4 keys; int8, timestamp,
/// timestamptz: int8 keys).
pub fn key_type_of(oid: pg_sys::Oid) -> Option<KeyType> {
    match oid {
        pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::DATEOID => Some(KeyType::Int4),
        pg_sys::INT8OID | pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID => Some(KeyType::Int8),
        _ => None,
    }
}

/// The width in bits of a key column of type `oid` (one [`key_type_of`] takes).
pub(super) fn key_bits(oid: pg_sys::Oid) -> u32 {
    match oid {
        pg_sys::INT2OID => 16,
        pg_sys::INT4OID | pg_sys::DATEOID => 32,
        _ => 64,
    }
}

/// The width in bits of a key clause between columns of types `a` and `b`: the wider one's (a
/// narrower value, sign-extended, is the same number).
pub(super) fn clause_bits(a: pg_sys::Oid, b: pg_sys::Oid) -> u32 {
    key_bits(a).max(key_bits(b))
}

/// A key datum of type `oid` as an i64 (sign-extended from its width).
pub(super) fn key_of(d: pg_sys::Datum, oid: pg_sys::Oid) -> i64 {
    match oid {
        pg_sys::INT2OID => d.value() as i16 as i64,
        pg_sys::INT4OID | pg_sys::DATEOID => d.value() as i32 as i64,
        _ => d.value() as i64,
    }
}

/// The plain Var `n` is, if it is one of this query level.
///
/// # Safety
/// `n` is null or a node.
pub unsafe fn as_var(n: *mut pg_sys::Node) -> Option<*mut pg_sys::Var> {
    // SAFETY: forwarded contract.
    unsafe {
        (!n.is_null() && (*n).type_ == pg_sys::NodeTag::T_Var && (*(n as *mut pg_sys::Var)).varlevelsup == 0)
            .then_some(n as *mut pg_sys::Var)
    }
}

/// Whether `expr` holds anything but plain Vars where it holds Vars (a PlaceHolderVar).
///
/// # Safety
/// `expr` is an expression tree of the planner.
pub(super) unsafe fn only_plain_vars(expr: *mut pg_sys::Node) -> bool {
    // SAFETY: forwarded contract; pull_var_clause walks the tree.
    unsafe {
        let vars = PgList::<pg_sys::Node>::from_pg(pg_sys::pull_var_clause(expr, pg_sys::PVC_INCLUDE_PLACEHOLDERS as i32));
        let ok = vars.iter_ptr().all(|v| as_var(v).is_some());
        ok
    }
}

/// The outer and inner Vars of a usable join clause, if `rinfo` is one.
///
/// # Safety
/// Planner structures.
pub(super) unsafe fn hash_clause(
    rinfo: *mut pg_sys::RestrictInfo,
    outer: *mut pg_sys::RelOptInfo,
    inner: *mut pg_sys::RelOptInfo,
) -> Option<(*mut pg_sys::Var, *mut pg_sys::Var)> {
    // SAFETY: forwarded contract.
    unsafe {
        if !(*rinfo).can_join || (*rinfo).hashjoinoperator == pg_sys::InvalidOid {
            return None;
        }
        let clause = (*rinfo).clause as *mut pg_sys::Node;
        if clause.is_null() || (*clause).type_ != pg_sys::NodeTag::T_OpExpr {
            return None;
        }
        let args = PgList::<pg_sys::Node>::from_pg((*(clause as *mut pg_sys::OpExpr)).args);
        if args.len() != 2 {
            return None;
        }
        let a = as_var(args.get_ptr(0)?)?;
        let b = as_var(args.get_ptr(1)?)?;
        let (ta, tb) = ((*a).vartype, (*b).vartype);
        if key_type_of(ta).is_none() || key_type_of(tb).is_none() {
            return None;
        }
        // Across types only among int2, int4 and int8, whose values are the numbers themselves
        // (a date and a timestamp are not: their equality converts one of them).
        let integer = |t: pg_sys::Oid| matches!(t, pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID);
        if ta != tb && !(integer(ta) && integer(tb)) {
            return None;
        }
        if !is_own_equality((*(clause as *mut pg_sys::OpExpr)).opno, ta, tb) {
            return None;
        }
        // Var.varno is an Index (u32) on PostgreSQL 14, an int from 15 on.
        #[allow(clippy::unnecessary_cast)]
        let in_rel = |v: *mut pg_sys::Var, r: *mut pg_sys::RelOptInfo| pg_sys::bms_is_member((*v).varno as i32, (*r).relids);
        if in_rel(a, outer) && in_rel(b, inner) {
            Some((a, b))
        } else if in_rel(b, outer) && in_rel(a, inner) {
            Some((b, a))
        } else {
            None
        }
    }
}

/// Whether `opno` is the equality between `left` and `right` of `left`'s default hash operator
/// family (`int4 = int4`, or `int4 = int8` of `integer_ops`): the one equality the node's keys
/// implement (equality of the values). A user-defined operator that PostgreSQL may hash
/// (`HASHES`, in an operator class of its own) can mean anything else, `a % 1000 = b % 1000`
/// for one: the node leaves such a join to PostgreSQL.
///
/// # Safety
/// Reads the system catalogs (the planner's caches).
pub(super) unsafe fn is_own_equality(opno: pg_sys::Oid, left: pg_sys::Oid, right: pg_sys::Oid) -> bool {
    // SAFETY: catalog lookups through the syscache; each returns InvalidOid when nothing fits.
    unsafe {
        let opclass = pg_sys::GetDefaultOpClass(left, pg_sys::HASH_AM_OID);
        if opclass == pg_sys::InvalidOid {
            return false;
        }
        let family = pg_sys::get_opclass_family(opclass);
        let eq = pg_sys::get_opfamily_member(family, left, right, pg_sys::HTEqualStrategyNumber as i16);
        eq != pg_sys::InvalidOid && eq == opno
    }
}

/// A join's restrict clauses, as the node uses them: the key clauses it hashes together
/// (`super::joinkey`), each with its outer and inner Var, and the others, checked on each
/// joined row (with the key clauses again where the key is hashed).
pub(super) struct Clauses {
    pub(super) keys: Vec<(*mut pg_sys::RestrictInfo, *mut pg_sys::Var, *mut pg_sys::Var)>,
    pub(super) others: Vec<*mut pg_sys::RestrictInfo>,
}

impl Clauses {
    /// Splits `rinfos`, in their order.
    ///
    /// # Safety
    /// Planner structures.
    pub(super) unsafe fn of(
        rinfos: *mut pg_sys::List,
        outer: *mut pg_sys::RelOptInfo,
        inner: *mut pg_sys::RelOptInfo,
    ) -> Clauses {
        let mut c = Clauses { keys: Vec::new(), others: Vec::new() };
        // SAFETY: forwarded contract: a list of RestrictInfos (a path's `custom_private` ends
        // with its join kind, a Const, which is skipped).
        let list = unsafe { PgList::<pg_sys::RestrictInfo>::from_pg(rinfos) };
        // SAFETY: every element of a List is a Node.
        for r in list.iter_ptr().filter(|&r| unsafe { (*r).type_ } == pg_sys::NodeTag::T_RestrictInfo) {
            // SAFETY: forwarded contract.
            match unsafe { hash_clause(r, outer, inner) } {
                Some((o, i)) => c.keys.push((r, o, i)),
                None => c.others.push(r),
            }
        }
        c
    }

    /// How the key columns form the table's key.
    pub(super) fn composer(&self) -> Composer {
        // SAFETY: the Vars of planner clauses.
        Composer::new(self.keys.iter().map(|&(_, o, i)| unsafe { clause_bits((*o).vartype, (*i).vartype) }).collect())
    }

    /// The clauses the node checks on each joined row: the others, and the key clauses too
    /// where equal keys do not mean equal columns.
    pub(super) fn qual(&self) -> Vec<*mut pg_sys::RestrictInfo> {
        let mut q = Vec::new();
        if !self.composer().form().exact() {
            q.extend(self.keys.iter().map(|k| k.0));
        }
        q.extend_from_slice(&self.others);
        q
    }

    /// The key clauses, then the others (a path's `custom_private`, before its join kind).
    pub(super) fn ordered(&self) -> *mut pg_sys::List {
        let mut l = PgList::<pg_sys::RestrictInfo>::new();
        for &(r, _, _) in &self.keys {
            l.push(r);
        }
        for &r in &self.others {
            l.push(r);
        }
        l.into_pg()
    }
}

/// Which joins the node runs: the outer side is the one probed (a batch at a time), the inner
/// side the one built into the table. The number is what a path's `custom_private` and the
/// plan's private list carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JoinKind {
    /// Every (outer, inner) pair whose keys are equal (and that passes the qual).
    Inner = 0,
    /// As `Inner`, and each outer row without a match once, its inner columns NULL.
    Left = 1,
    /// Each outer row with at least one match, once (`EXISTS`, `IN (SELECT ...)`).
    Semi = 2,
    /// Each outer row without a match (`NOT EXISTS`), a NULL key included: `NULL = x` is
    /// never true. (`NOT IN` is not an anti join in PostgreSQL's planner: its NULL rules
    /// differ, and it runs as PostgreSQL plans it.)
    Anti = 3,
}

impl JoinKind {
    /// The kind of PostgreSQL's `jointype` the node runs; `None` for the others (right and
    /// full joins, and the unique-ified sides PostgreSQL plans for semi joins).
    pub(crate) fn of(jointype: pg_sys::JoinType::Type) -> Option<JoinKind> {
        match jointype {
            pg_sys::JoinType::JOIN_INNER => Some(JoinKind::Inner),
            pg_sys::JoinType::JOIN_LEFT => Some(JoinKind::Left),
            pg_sys::JoinType::JOIN_SEMI => Some(JoinKind::Semi),
            pg_sys::JoinType::JOIN_ANTI => Some(JoinKind::Anti),
            _ => None,
        }
    }

    /// The kind numbered `v` (a plan's), inner for anything else.
    pub(crate) fn from_i64(v: i64) -> JoinKind {
        match v {
            1 => JoinKind::Left,
            2 => JoinKind::Semi,
            3 => JoinKind::Anti,
            _ => JoinKind::Inner,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            JoinKind::Inner => "Inner",
            JoinKind::Left => "Left",
            JoinKind::Semi => "Semi",
            JoinKind::Anti => "Anti",
        }
    }

    /// Whether outer rows without a match are returned.
    pub(crate) fn keeps_unmatched(self) -> bool {
        matches!(self, JoinKind::Left | JoinKind::Anti)
    }
}

/// The join kind a path's `custom_private` ends with (see [`add_path`]).
///
/// # Safety
/// A GpuJoin path's `custom_private`.
pub(super) unsafe fn path_join_kind(private: *mut pg_sys::List) -> JoinKind {
    // SAFETY: forwarded contract: every element is a Node; the last, a Const, is ours.
    unsafe {
        let l = PgList::<pg_sys::Node>::from_pg(private);
        match l.get_ptr(l.len().wrapping_sub(1)) {
            Some(n) if (*n).type_ == pg_sys::NodeTag::T_Const => JoinKind::from_i64(int_of(n)),
            _ => JoinKind::Inner,
        }
    }
}

/// A GpuJoin path's clauses (its `custom_private`, over its two children's relations).
///
/// # Safety
/// A path made by this module.
pub(super) unsafe fn path_clauses(path: *mut pg_sys::CustomPath) -> Clauses {
    // SAFETY: forwarded contract: custom_paths are (outer, inner).
    unsafe {
        let paths = PgList::<pg_sys::Path>::from_pg((*path).custom_paths);
        let (outer, inner) = ((*paths.get_ptr(0).expect("outer")).parent, (*paths.get_ptr(1).expect("inner")).parent);
        Clauses::of((*path).custom_private, outer, inner)
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn join_pathlist_hook(
    root: *mut pg_sys::PlannerInfo,
    joinrel: *mut pg_sys::RelOptInfo,
    outerrel: *mut pg_sys::RelOptInfo,
    innerrel: *mut pg_sys::RelOptInfo,
    jointype: pg_sys::JoinType::Type,
    extra: *mut pg_sys::JoinPathExtraData,
) {
    // SAFETY: PostgreSQL's planner calls the hook with valid structures; the previous hook is
    // called with the same arguments.
    unsafe {
        if let Some(prev) = PREV_HOOK {
            prev(root, joinrel, outerrel, innerrel, jointype, extra);
        }
        let Some(kind) = JoinKind::of(jointype).filter(|_| enabled()) else { return };
        add_path(root, joinrel, outerrel, innerrel, extra, kind);
    }
}

/// Adds GpuJoin paths to `joinrel` if the join qualifies (see the module comment): a serial
/// path over both sides' cheapest paths, and a parallel-aware partial path over the outer
/// side's cheapest partial path where the join may run in parallel workers.
///
/// # Safety
/// The hook's arguments.
pub(super) unsafe fn add_path(
    root: *mut pg_sys::PlannerInfo,
    joinrel: *mut pg_sys::RelOptInfo,
    outerrel: *mut pg_sys::RelOptInfo,
    innerrel: *mut pg_sys::RelOptInfo,
    extra: *mut pg_sys::JoinPathExtraData,
    kind: JoinKind,
) {
    // SAFETY: forwarded contract; every node is allocated in the planner's memory context.
    unsafe {
        let decline = |why| super::count(|c| c.declined(why));
        let inner_path = (*innerrel).cheapest_total_path;
        if inner_path.is_null() || !(*inner_path).param_info.is_null() {
            return decline(Decline::ParameterizedInner);
        }
        let rinfos = PgList::<pg_sys::RestrictInfo>::from_pg((*extra).restrictlist);
        for r in rinfos.iter_ptr() {
            if (*r).pseudoconstant || !only_plain_vars((*r).clause as *mut pg_sys::Node) {
                return decline(Decline::NotPlainColumns);
            }
        }
        if !only_plain_vars((*(*joinrel).reltarget).exprs as *mut pg_sys::Node) {
            return decline(Decline::NotPlainColumns);
        }
        // Every clause the node can hash goes into the key (`super::joinkey`): the pairs it
        // forms are those of all of them, which the cost counts.
        let clauses = Clauses::of((*extra).restrictlist, outerrel, innerrel);
        if clauses.keys.is_empty() {
            return decline(Decline::NoKey);
        }
        // An outer, semi or anti join matches an outer row by its key alone: every clause of
        // the join must be in the key, and the key exact (a hashed key needs its clauses
        // checked again, after which a row found no match after all: not done).
        if kind != JoinKind::Inner && !(clauses.others.is_empty() && clauses.composer().form().exact()) {
            return decline(Decline::NotExactForOuterJoin);
        }
        // Past its hash memory the node spills the inner side to the host tier, which not every
        // process maps (`super::super::spill`): where this one does not, an inner side estimated
        // past it is no job for the node.
        let inner_bytes = (*innerrel).rows * (f64::from((*(*innerrel).reltarget).width) + 32.0);
        if inner_bytes > spill::hash_memory() as f64 && !spill::can_spill() {
            return decline(Decline::InnerOverMemory);
        }
        let mut keylist = PgList::<pg_sys::RestrictInfo>::new();
        for &(r, _, _) in &clauses.keys {
            keylist.push(r);
        }
        let key_sel = pg_sys::clauselist_selectivity(root, keylist.into_pg(), 0, pg_sys::JoinType::JOIN_INNER, (*extra).sjinfo);
        let inner_keys: Vec<*mut pg_sys::Var> = clauses.keys.iter().map(|&(_, _, iv)| iv).collect();
        let build_walk = build_walk(root, (*innerrel).rows, &inner_keys);
        let cost = PairCost { key_sel, qual_clauses: clauses.qual().len(), build_walk };
        // A key that forms far more pairs than the join returns (the other clauses, which the
        // node cannot hash, throw most away) is no job for the node, forced or not.
        let formed = (*outerrel).rows * (*innerrel).rows * key_sel;
        if cost.qual_clauses > 0 && formed > MAX_PAIRS_PER_ROW * (*joinrel).rows + PAIRS_SLACK {
            return decline(Decline::TooManyPairs);
        }
        let ordered = || {
            let mut l = PgList::<pg_sys::Node>::from_pg(clauses.ordered());
            l.push(int_node(kind as i64));
            l.into_pg()
        };
        let outer_path = (*outerrel).cheapest_total_path;
        if !outer_path.is_null() && (*outer_path).param_info.is_null() {
            let cp = make_path(joinrel, outer_path, inner_path, ordered(), None, cost);
            pg_sys::add_path(joinrel, cp as *mut pg_sys::Path);
            super::count(|c| c.offered());
            if kind == JoinKind::Inner {
                candidates::remember(root, joinrel, make_path(joinrel, outer_path, inner_path, ordered(), None, cost));
                // Over plain scans of both tables too, where a cheaper path (a Gather) won
                // either side: the aggregate push-down may read those tables' column caches
                // instead (`super::cached`), which only a scan of a table leaves it.
                if let (Some(o), Some(i)) = (cached_scan_path(root, outerrel), cached_scan_path(root, innerrel)) {
                    if o != outer_path || i != inner_path {
                        candidates::remember(root, joinrel, make_path(joinrel, o, i, ordered(), None, cost));
                    }
                }
            }
        }
        // In parallel: the outer side's cheapest partial path, split among the participants; the
        // inner side built once for all of them (so it need only be safe to run in a worker).
        let partial = PgList::<pg_sys::Path>::from_pg((*outerrel).partial_pathlist).get_ptr(0);
        if let Some(outer_partial) = partial {
            // The inner side: its cheapest partial path (every participant scans a share and
            // the table is built from all of them), else the cheapest path that may run in a
            // worker (not a Gather), which the first participant scans whole.
            let partial_inner = PgList::<pg_sys::Path>::from_pg((*innerrel).partial_pathlist)
                .get_ptr(0)
                .filter(|p| (**p).param_info.is_null() && (**p).parallel_aware);
            let safe_inner = match partial_inner {
                Some(p) => p,
                None => pg_sys::get_cheapest_parallel_safe_total_inner((*innerrel).pathlist),
            };
            if (*joinrel).consider_parallel
                && !safe_inner.is_null()
                && (*outer_partial).param_info.is_null()
                && (*outer_partial).parallel_workers > 0
            {
                let workers = (*outer_partial).parallel_workers;
                let cp = make_path(joinrel, outer_partial, safe_inner, ordered(), Some(workers), cost);
                pg_sys::add_partial_path(joinrel, cp as *mut pg_sys::Path);
                super::count(|c| c.offered());
                if kind == JoinKind::Inner {
                    candidates::remember(
                        root,
                        joinrel,
                        make_path(joinrel, outer_partial, safe_inner, ordered(), Some(workers), cost),
                    );
                }
            }
        }
    }
}

/// The plain sequential scan path of a base relation that is a table with a ready column
/// cache: the one in its path list, or a new one where a cheaper path (a Gather) pushed it out.
///
/// # Safety
/// Planner structures.
unsafe fn cached_scan_path(root: *mut pg_sys::PlannerInfo, rel: *mut pg_sys::RelOptInfo) -> Option<*mut pg_sys::Path> {
    // SAFETY: forwarded contract; a new path is allocated in the planner's memory context.
    unsafe {
        if (*rel).reloptkind != pg_sys::RelOptKind::RELOPT_BASEREL {
            return None;
        }
        let rte = *(*root).simple_rte_array.add((*rel).relid as usize);
        // (not an inheritance parent: its rows are its children's too, and its cache holds its
        // own; the planner set `inh` to whether it has children, and a scan of it is an Append)
        if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION || (*rte).inh || crate::caches::ready_columns((*rte).relid).is_none() {
            return None;
        }
        let found = PgList::<pg_sys::Path>::from_pg((*rel).pathlist)
            .iter_ptr()
            .find(|&p| (*p).pathtype == pg_sys::NodeTag::T_SeqScan && (*p).param_info.is_null() && !(*p).parallel_aware);
        Some(found.unwrap_or_else(|| pg_sys::create_seqscan_path(root, rel, std::ptr::null_mut(), 0)))
    }
}

/// The GpuJoin paths the planner was offered for each join relation, kept aside for the
/// aggregate push-down (`super::preagg`), which runs later, at the grouping stage.
///
/// `add_path` may throw a path away (and free it) when a cheaper one of the relation
/// dominates it, yet the aggregate above a GpuJoin can still be the cheapest way to compute
/// the query's aggregates: so every join hook call also makes a copy that no path list owns,
/// and this keeps the cheapest copy of each kind (serial, partial) per join relation. The
/// copies live in the planner's memory context; a reset callback on that context forgets them
/// when it goes (end of planning, an ERROR, GEQO's per-plan contexts), so no entry outlives
/// what it points to. Every serial path is kept, not only the cheapest: the push-down prices
/// the ones that may read column caches at their caches' cost (`super::cached`).
pub mod candidates {
    use std::cell::RefCell;

    use pgrx::pg_sys;

    struct Entry {
        ctx: pg_sys::MemoryContext,
        root: *mut pg_sys::PlannerInfo,
        joinrel: *mut pg_sys::RelOptInfo,
        serial: Vec<*mut pg_sys::CustomPath>,
        partial: *mut pg_sys::CustomPath,
    }

    thread_local! {
        static ENTRIES: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    }

    /// Keeps `path` (a GpuJoin path of `joinrel` that no path list holds): every serial one,
    /// the cheapest partial one.
    ///
    /// # Safety
    /// Planner structures, allocated in the current memory context.
    pub unsafe fn remember(root: *mut pg_sys::PlannerInfo, joinrel: *mut pg_sys::RelOptInfo, path: *mut pg_sys::CustomPath) {
        // SAFETY: forwarded contract; the callback is allocated in the context it watches.
        unsafe {
            let ctx = pg_sys::CurrentMemoryContext;
            let register = ENTRIES.with_borrow(|e| !e.iter().any(|x| x.ctx == ctx));
            if register {
                let cb =
                    pg_sys::palloc0(std::mem::size_of::<pg_sys::MemoryContextCallback>()) as *mut pg_sys::MemoryContextCallback;
                (*cb).func = Some(forget);
                (*cb).arg = ctx as *mut std::ffi::c_void;
                pg_sys::MemoryContextRegisterResetCallback(ctx, cb);
            }
            ENTRIES.with_borrow_mut(|entries| {
                let at = match entries.iter().position(|x| x.root == root && x.joinrel == joinrel && x.ctx == ctx) {
                    Some(at) => at,
                    None => {
                        let null = std::ptr::null_mut();
                        entries.push(Entry { ctx, root, joinrel, serial: Vec::new(), partial: null });
                        entries.len() - 1
                    }
                };
                let e = &mut entries[at];
                if !(*path).path.parallel_aware {
                    e.serial.push(path);
                } else if e.partial.is_null() || (*path).path.total_cost < (*e.partial).path.total_cost {
                    e.partial = path;
                }
            });
        }
    }

    /// The serial GpuJoin paths and the cheapest partial one offered for `joinrel` of `root`
    /// (null where none).
    pub fn of(
        root: *mut pg_sys::PlannerInfo,
        joinrel: *mut pg_sys::RelOptInfo,
    ) -> (Vec<*mut pg_sys::CustomPath>, *mut pg_sys::CustomPath) {
        ENTRIES.with_borrow(|entries| {
            entries
                .iter()
                .find(|x| x.root == root && x.joinrel == joinrel)
                .map_or((Vec::new(), std::ptr::null_mut()), |e| (e.serial.clone(), e.partial))
        })
    }

    #[pgrx::pg_guard]
    unsafe extern "C-unwind" fn forget(arg: *mut std::ffi::c_void) {
        let ctx = arg as pg_sys::MemoryContext;
        ENTRIES.with_borrow_mut(|entries| entries.retain(|x| x.ctx != ctx));
    }
}

/// Whether `path` (a GpuJoin path) can compute aggregates itself: it checks no clause on the
/// joined rows (the aggregate mode evaluates no qual), so every clause is a key clause and the
/// key is exact.
///
/// # Safety
/// A path made by this module.
pub unsafe fn can_aggregate(path: *mut pg_sys::CustomPath) -> bool {
    // SAFETY: forwarded contract.
    unsafe { path_clauses(path).qual().is_empty() }
}

/// A copy of the GpuJoin path `path` that computes `target`'s aggregates (each expression an
/// Aggref that `super::agg::spec_of` takes, over plain Vars of the join) and returns one row
/// of their partial results per participant, instead of the joined rows.
///
/// Its cost is the join's without the output rows, plus [`AGG_FOLD_FACTOR`] ×
/// `cpu_operator_cost` per joined row and aggregate.
///
/// # Safety
/// `path` is a path of this module for which [`can_aggregate`] holds; `target` a planner
/// PathTarget.
pub unsafe fn with_aggregates(path: *mut pg_sys::CustomPath, target: *mut pg_sys::PathTarget) -> *mut pg_sys::CustomPath {
    // SAFETY: forwarded contract; the copy is allocated in the planner's memory context.
    unsafe {
        let cp = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomPath>()) as *mut pg_sys::CustomPath;
        std::ptr::copy_nonoverlapping(path, cp, 1);
        let p = &mut (*cp).path;
        let joined = p.rows;
        let naggs = PgList::<pg_sys::Node>::from_pg((*target).exprs).len() as f64;
        p.pathtarget = target;
        p.rows = 1.0;
        p.total_cost = p.total_cost - ROWS_SETUP_COST - joined * JOINED_ROW_FACTOR * pg_sys::cpu_operator_cost
            + joined * naggs * AGG_FOLD_FACTOR * pg_sys::cpu_operator_cost;
        p.startup_cost = p.total_cost;
        cp
    }
}

/// Takes [`make_path`]'s charge for the workers' CUDA contexts off a partial path whose
/// workers hand their keys to the leader (`crate::node::handoff`; see [`super::leader_probes`]):
/// only the leader, whose context is not priced, probes.
///
/// # Safety
/// A partial GpuJoin path made by [`make_path`] (or its copy).
pub unsafe fn without_worker_contexts(cp: *mut pg_sys::CustomPath) {
    if !crate::runtime::per_process_cuda() {
        return; // none was charged
    }
    // SAFETY: forwarded contract; the first child is the outer path.
    unsafe {
        let p = &mut (*cp).path;
        let Some(outer) = PgList::<pg_sys::Path>::from_pg((*cp).custom_paths).get_ptr(0) else { return };
        let charge = f64::from(p.parallel_workers) * context_charge((*(*outer).parent).rows);
        p.startup_cost = (p.startup_cost - charge).max(0.0);
        p.total_cost = (p.total_cost - charge).max(p.startup_cost);
    }
}

/// The share of the rows one participant of a parallel plan with `workers` workers handles
/// (costsize.c's `get_parallel_divisor`, which is not exported).
pub(super) fn parallel_divisor(workers: i32) -> f64 {
    let mut divisor = workers as f64;
    // SAFETY: reads a GUC of this process.
    if unsafe { pg_sys::parallel_leader_participation } {
        let leader = 1.0 - 0.3 * workers as f64;
        if leader > 0.0 {
            divisor += leader;
        }
    }
    divisor
}

/// The charge for one parallel worker's CUDA context in the `process` execution mode, for a
/// join whose outer side has `outer_rows` rows ([`CONTEXT_ROWS`]).
pub(super) fn context_charge(outer_rows: f64) -> f64 {
    // SAFETY: reads a GUC of this process.
    let setup = unsafe { pg_sys::parallel_setup_cost };
    setup * CONTEXT_ROWS / outer_rows.max(1.0)
}

/// What the pairs a join forms cost: the selectivity of its key clauses (the pairs the table
/// forms are outer rows × inner rows × this), and the clauses checked on each pair.
#[derive(Clone, Copy)]
pub(super) struct PairCost {
    pub(super) key_sel: f64,
    pub(super) qual_clauses: usize,
    /// Slots the build walks for the inner side's most common key: its rows share one chain
    /// of the open-addressing table, so the n-th of them walks past the n - 1 before it
    /// ([`build_walk`]).
    pub(super) build_walk: f64,
}

/// The slots the build walks for the most common key of `inner`'s key columns: with `f` rows
/// of one key (the planner's most-common-value frequency times the inner rows; the combined
/// key repeats at most as often as its least repeated column), f × f / 2. A table keyed by a
/// skewed column is quadratic to build: 2 M Zipf-like keys (7 % of them one value) walk 10^10
/// slots, where PostgreSQL's hash join chains duplicates in O(1) each. A unique key walks none.
///
/// # Safety
/// Planner structures of one join; `keys` are its key clauses' inner Vars.
pub(super) unsafe fn build_walk(root: *mut pg_sys::PlannerInfo, inner_rows: f64, keys: &[*mut pg_sys::Var]) -> f64 {
    let mut freq = 1.0f64;
    for &v in keys {
        let (mut mcv, mut bucket) = (0.0, 0.0);
        // SAFETY: forwarded contract; the function reads the Var's statistics.
        unsafe { pg_sys::estimate_hash_bucket_stats(root, v as *mut pg_sys::Node, 1024.0, &mut mcv, &mut bucket) };
        freq = freq.min(mcv);
    }
    let most = (freq * inner_rows).max(1.0);
    most * (most - 1.0) / 2.0
}

/// A GpuJoin path over `outer_path` and `inner_path`; parallel-aware with `workers` when given.
///
/// # Safety
/// Planner structures of one join.
pub(super) unsafe fn make_path(
    joinrel: *mut pg_sys::RelOptInfo,
    outer_path: *mut pg_sys::Path,
    inner_path: *mut pg_sys::Path,
    clauses: *mut pg_sys::List,
    workers: Option<i32>,
    pairs: PairCost,
) -> *mut pg_sys::CustomPath {
    // SAFETY: forwarded contract.
    unsafe {
        let cp = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomPath>()) as *mut pg_sys::CustomPath;
        let p = &mut (*cp).path;
        p.type_ = pg_sys::NodeTag::T_CustomPath;
        p.pathtype = pg_sys::NodeTag::T_CustomScan;
        p.parent = joinrel;
        p.pathtarget = (*joinrel).reltarget;
        p.param_info = std::ptr::null_mut();
        p.parallel_aware = workers.is_some();
        p.parallel_safe = workers.is_some();
        p.parallel_workers = workers.unwrap_or(0);
        // A partial path's rows are one participant's.
        let rows = match workers {
            Some(w) => pg_sys::clamp_row_est((*joinrel).rows / parallel_divisor(w)),
            None => (*joinrel).rows,
        };
        p.rows = rows;
        #[cfg(feature = "pg18")]
        {
            p.disabled_nodes = (*outer_path).disabled_nodes + (*inner_path).disabled_nodes;
        }
        let build = pg_sys::cpu_operator_cost * (INNER_ROW_FACTOR + GPU_ROW_FACTOR);
        let probe = pg_sys::cpu_operator_cost * (1.0 + GPU_ROW_FACTOR);
        p.startup_cost = (*inner_path).total_cost
            + (*inner_path).rows * build
            + pairs.build_walk * GPU_ROW_FACTOR * pg_sys::cpu_operator_cost
            + SETUP_COST
            + ROWS_SETUP_COST;
        if let Some(w) = workers.filter(|_| crate::runtime::per_process_cuda()) {
            p.startup_cost += f64::from(w) * context_charge((*(*outer_path).parent).rows);
        }
        // The pairs the key forms (this participant's outer rows against the whole inner
        // side), each checked against the qual.
        let formed = (*outer_path).rows * (*(*inner_path).parent).rows * pairs.key_sel;
        let check = formed * pairs.qual_clauses as f64 * pg_sys::cpu_operator_cost;
        p.total_cost = p.startup_cost
            + (*outer_path).total_cost
            + (*outer_path).rows * probe
            + check
            + rows * JOINED_ROW_FACTOR * pg_sys::cpu_operator_cost;
        let mut children = PgList::<pg_sys::Path>::new();
        children.push(outer_path);
        children.push(inner_path);
        (*cp).custom_paths = children.into_pg();
        (*cp).custom_private = clauses;
        (*cp).methods = &METHODS.path;
        // The node evaluates its target list itself (`finish_row` projects each joined row), so
        // PostgreSQL need not put a Result node above it to compute a sort key or a cast: one
        // executor node less per joined row, and no `cpu_tuple_cost` for it. PostgreSQL 14 takes
        // every custom scan as projection-capable; 15 added the flag.
        #[cfg(not(feature = "pg14"))]
        {
            (*cp).flags = pg_sys::CUSTOMPATH_SUPPORT_PROJECTION;
        }
        cp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_types_map_by_width_and_values_keep_their_sign() {
        for (oid, kt) in [
            (pg_sys::INT2OID, KeyType::Int4),
            (pg_sys::INT4OID, KeyType::Int4),
            (pg_sys::DATEOID, KeyType::Int4),
            (pg_sys::INT8OID, KeyType::Int8),
            (pg_sys::TIMESTAMPOID, KeyType::Int8),
            (pg_sys::TIMESTAMPTZOID, KeyType::Int8),
        ] {
            assert_eq!(key_type_of(oid), Some(kt));
        }
        assert_eq!(key_type_of(pg_sys::NUMERICOID), None);
        assert_eq!(key_type_of(pg_sys::TEXTOID), None);
        // Datums of narrow types carry their value sign-extended or not: only the low bits count.
        assert_eq!(key_of(pg_sys::Datum::from(0xffff_usize), pg_sys::INT2OID), -1);
        assert_eq!(key_of(pg_sys::Datum::from(0xffff_ffff_usize), pg_sys::INT4OID), -1);
        assert_eq!(key_of(pg_sys::Datum::from(-7i32 as usize), pg_sys::DATEOID), -7);
        assert_eq!(key_of(pg_sys::Datum::from(i64::MIN), pg_sys::TIMESTAMPTZOID), i64::MIN);
    }
}
