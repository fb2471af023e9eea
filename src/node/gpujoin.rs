//! GpuJoin as a plan node: plain SQL inner equi-joins run through the GpuJoin operations.
//!
//! # What runs where
//!
//! - **Planner** (`set_join_pathlist_hook`, this backend): for an inner join whose restriction
//!   list holds a hashable equality between a plain column of the outer relation and one of
//!   the inner relation, both of one type among int2, int4, date (held as int4 keys) and
//!   int8, timestamp, timestamptz (int8 keys), or of two of int2, int4 and int8, with the
//!   equality of the type's default hash operator family (never a user's operator that
//!   PostgreSQL may hash but that means something else), and whose target list and clauses
//!   hold plain columns only, it adds `CustomPath`s
//!   "UvmGpuJoin" (the name carries the extension's prefix: PG-Strom registers "GpuJoin").
//!   Every such equality goes into the key, together (`super::joinkey`: one clause's value,
//!   several packed side by side, or hashed and checked again), when
//!   `pg_uvm_share.enable_gpujoin` is `on`
//!   (`auto`, the default: where the cluster's provider is CUDA, see [`enabled`]): a serial one over
//!   the cheapest unparameterized paths of both sides, and a parallel-aware partial one over
//!   the outer side's cheapest partial path and the inner side's cheapest partial (parallel
//!   scan) path, else its cheapest parallel-safe one, which PostgreSQL puts under a Gather.
//!   The other clauses become the node's qual (with the key clauses, where the key is hashed).
//!   A join whose key would form more than [`MAX_PAIRS_PER_ROW`] pairs per joined row (the
//!   qual throwing the rest away) is declined.
//! - **Plan** (`PlanCustomPath`): a `CustomScan` with `scanrelid = 0`, the two child plans,
//!   `custom_scan_tlist` = every column the target list, the qual and the join clause use,
//!   each taken from one child's target list; `custom_private` says where (side, attribute
//!   number), the key columns' positions and the key type; `custom_exprs` keeps the join
//!   clause for EXPLAIN. `set_customscan_references` rewrites the Vars to `INDEX_VAR`.
//! - **Executor** (each participant; the GpuJoin operations run where the cluster runs them, in
//!   this process or in the GPU service, on the CPU or the GPU): at the first call the inner
//!   side is built: the inner child is drained, the columns the join uses of each row with a
//!   non-NULL key stored (`super::shared::RowWriter`: row id = its number), and the GpuJoin
//!   table built in a temporary segment exactly as `uvm.gpujoin_build` does (payload = row
//!   id). Serially the rows stay in a memory context of the node; in a parallel query they go
//!   to the query's DSA area, every participant storing its share of a partial inner plan and
//!   the last one building the table, or the first storing all of a non-partial one, while
//!   the others wait (`super::shared`). Then each participant reads its outer child (its share
//!   of a parallel scan) a batch at a time ([`BATCH_TUPLES`] tuples with a non-NULL key, their
//!   used columns kept), materializes the batch's distinct keys into its own result buffer (a
//!   temporary segment, reset before each batch), reads the (key, row id) pairs back and emits
//!   one joined row per call, from the outer columns of each tuple with that key and the inner
//!   row (`super::matching`), after the qual, projected. Rows are read from the children a
//!   chunk at a time under one pgrx guard ([`fetch_chunk`]).
//! - **Aggregate mode** (`super::preagg` plans it: the path's target is a list of Aggrefs):
//!   instead of joined rows, each participant folds its matches into the aggregates
//!   (`super::agg`) and returns one row of results. In its **probe mode** (every aggregate is
//!   `count(*)`, or `count`/`sum` of one inner column: `probe_plan`) the table's payloads are
//!   that column's values where none is NULL (read by each participant as it stores its rows,
//!   `drain_into`), and each batch of outer keys is probed whole (`exec::probe_start`: matches
//!   and payload sum; one batch in flight while the next is read), no pair read back; in
//!   parallel, a participant that finished its share of the inner side reads up to
//!   [`PENDING_BATCHES`] batches of outer keys while another builds the table.
//!
//! # Lifecycle
//!
//! Rescan: the outer child is rescanned; a serial node keeps its inner table unless the inner
//! child's parameters changed, a parallel one builds it again (the leader resets the shared
//! state before the workers start again). End: the children end and the segments this process
//! owns are dropped (a parallel query's table belongs to the leader, which creates it when it
//! sets up the shared memory). After an ERROR or a cancel, `super::cleanup` drops the segments
//! at (sub)transaction abort (in each worker too) and the memory context's reset callback frees
//! the node's Rust memory (`crate::customscan`).
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
//!   (kept for the whole scan), plus `cpu_tuple_cost` per output row;
//! - a fixed start-up of [`SETUP_COST`] for the two segments and the round trips;
//! - in the `process` execution mode (each process runs its own kernels),
//!   [`WORKER_CONTEXT_FACTOR`] × `parallel_setup_cost` per parallel worker of a partial path,
//!   for the CUDA context each creates. (The leader's is not priced: a session pays it once, at
//!   its first GPU query, whatever the plan.)
//!
//! ```text
//! startup = inner total + inner rows × (INNER_ROW_FACTOR + GPU_ROW_FACTOR) × cpu_operator_cost
//!           + SETUP_COST [+ workers × WORKER_CONTEXT_FACTOR × parallel_setup_cost in process mode]
//! total   = startup + outer total + outer rows × (1 + GPU_ROW_FACTOR) × cpu_operator_cost
//!           + pairs × qual clauses × cpu_operator_cost + output rows × cpu_tuple_cost
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
//! term and adds [`AGG_FOLD_FACTOR`] × `cpu_operator_cost` per joined row and aggregate.
//!
//! **Calibration** (H200, service mode; `bench/gpu-report-gpujoin-node.md`, and for the
//! process mode `bench/gpu-report-gpujoin-planner-process.md`; the figures below are from the
//! first sweep, `bench/history/gpu-report-gpujoin-planner-0789994.md`, whose choices the
//! latest runs repeat). What decides a plan is the node's cost against the
//! join it replaces, in PostgreSQL's own units. On the 50 M x 5 M join, PostgreSQL's parallel
//! hash join adds about 150 K units to the scans for about 4 s of work, the node (this model)
//! about 25 K units for its 0.3 to 0.4 s (the build, the probes): cheaper, as measured, and so
//! are the forms that hand rows up (0.46x) or sort them (0.48x). What the model lacked was the
//! fixed cost: two segments created and dropped and the first round trips, about 4 ms (test f:
//! 2.5 ms per segment's create/fill/checksum/drop), priced at 10 units where PostgreSQL's hash
//! join on a small table costs a few hundred; [`SETUP_COST`] is now 500. With it, `auto` picks
//! the faster plan at every size of the planner sweep (fact 20 K to 20 M rows, dim a tenth):
//! PostgreSQL's at 20 K x 2 K (3.8 ms against the node's 4.6 ms), the node from 200 K x 20 K up
//! (16.5 ms against 26.4 ms, up to 360 ms against 1,872 ms at 20 M x 2 M). Not measured: skews
//! other than uniform keys, wide inner rows, and joins where the node hands millions of rows up
//! to other nodes at small sizes; and only the H200.

use std::ffi::CStr;
use std::time::{Duration, Instant};

use pgrx::pg_sys;
use pgrx::PgList;

use super::agg::{self, Acc, Arg, Kind, Out, Value};
use super::cleanup;
use super::fallible;
use super::matching::{Batch, Emitter};
use super::shared::{self, Arena, Col, InnerRows, Role, RowWriter, Shared, TIERS};
use crate::customscan::{self, JoinScan, Methods};
use crate::error::{Code, Result, UvmError};
use crate::exec::{self, SegRef};
use crate::gpujoin::pairs;
use crate::gpujoin::table::{self, KeyType};
use crate::guc::{self, GpuJoinChoice};
use crate::registry::TierPref;
use crate::sql::{current_user, now, report, with_executor};
use crate::vocab::Tier;

use super::joinkey::Composer;

/// Outer tuples with a non-NULL key per batch.
pub const BATCH_TUPLES: usize = 1 << 16;
/// Batches of outer keys a parallel probe-mode participant reads while the table is being
/// built (16 MiB of keys at most).
pub const PENDING_BATCHES: usize = 32;
/// Pairs the result buffer holds at first (it grows on demand).
const RESULT_PAIRS: u64 = 1 << 16;
/// The GPU part of a row's cost, as a fraction of `cpu_operator_cost` (see the module comment).
pub const GPU_ROW_FACTOR: f64 = 0.05;
/// The node's CPU work per inner tuple, in `cpu_operator_cost`: copied and kept for the whole
/// scan, and a (key, row id) row sent to the build; twice an outer tuple's, so that the
/// smaller side is the inner one.
pub const INNER_ROW_FACTOR: f64 = 2.0;
/// Start-up cost: two segments created and dropped, a few round trips to the executor: about
/// 4 ms on the H200 (test f: a segment's create, fill, checksum and drop take 2.5 ms), priced
/// at the rate PostgreSQL's own estimates imply there for the parallel hash join the node
/// competes with (see the module comment), with a margin: joins that PostgreSQL prices below
/// this stay with PostgreSQL.
pub const SETUP_COST: f64 = 500.0;
/// Start-up of each parallel worker in the `process` execution mode, where it creates a CUDA
/// context of its own, in units of `parallel_setup_cost` (PostgreSQL's price for starting the
/// workers, 1,000 by default; a session that sets it to 0 to force parallel plans forces them
/// here too). A context takes 260 ms alone and more when several start at once (the driver
/// serialises them; `bench/probes/cuda_process_cost.py`); the planner sweep measured 365 ms
/// per worker (the node with 2 workers took 1,030 ms at 20 M x 2 M against 299 ms in service
/// mode). 12 × 1,000 units is about 320 ms at the module comment's rate (about 37 units per ms).
pub const WORKER_CONTEXT_FACTOR: f64 = 12.0;
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

static METHODS: Methods = customscan::methods::<GpuJoinScan>();

static mut PREV_HOOK: pg_sys::set_join_pathlist_hook_type = None;

/// Installs the planner hook (chaining the previous one) and registers the scan methods.
pub fn install() {
    // SAFETY: _PG_init runs once per process, before any planning; the hook chain is
    // process-local.
    unsafe {
        PREV_HOOK = pg_sys::set_join_pathlist_hook;
        pg_sys::set_join_pathlist_hook = Some(join_pathlist_hook);
    }
    customscan::register::<GpuJoinScan>();
}

/// Whether the planner may offer GpuJoin now.
pub fn enabled() -> bool {
    match guc::ENABLE_GPUJOIN.get() {
        GpuJoinChoice::On => true,
        GpuJoinChoice::Off => false,
        // On where a GPU does the work (the cluster's provider is CUDA), where the cost model
        // (module comment) is calibrated; the host provider's CPU path is never faster than
        // PostgreSQL's own joins. Unknown until some process claimed the provider: off.
        GpuJoinChoice::Auto => crate::sql::cluster_provider() == Some(crate::provider::ProviderKind::Cuda),
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
fn key_bits(oid: pg_sys::Oid) -> u32 {
    match oid {
        pg_sys::INT2OID => 16,
        pg_sys::INT4OID | pg_sys::DATEOID => 32,
        _ => 64,
    }
}

/// The width in bits of a key clause between columns of types `a` and `b`: the wider one's (a
/// narrower value, sign-extended, is the same number).
fn clause_bits(a: pg_sys::Oid, b: pg_sys::Oid) -> u32 {
    key_bits(a).max(key_bits(b))
}

/// A key datum of type `oid` as an i64 (sign-extended from its width).
fn key_of(d: pg_sys::Datum, oid: pg_sys::Oid) -> i64 {
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
unsafe fn only_plain_vars(expr: *mut pg_sys::Node) -> bool {
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
unsafe fn hash_clause(
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
unsafe fn is_own_equality(opno: pg_sys::Oid, left: pg_sys::Oid, right: pg_sys::Oid) -> bool {
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
struct Clauses {
    keys: Vec<(*mut pg_sys::RestrictInfo, *mut pg_sys::Var, *mut pg_sys::Var)>,
    others: Vec<*mut pg_sys::RestrictInfo>,
}

impl Clauses {
    /// Splits `rinfos`, in their order.
    ///
    /// # Safety
    /// Planner structures.
    unsafe fn of(rinfos: *mut pg_sys::List, outer: *mut pg_sys::RelOptInfo, inner: *mut pg_sys::RelOptInfo) -> Clauses {
        let mut c = Clauses { keys: Vec::new(), others: Vec::new() };
        // SAFETY: forwarded contract: a list of RestrictInfos.
        let list = unsafe { PgList::<pg_sys::RestrictInfo>::from_pg(rinfos) };
        for r in list.iter_ptr() {
            // SAFETY: forwarded contract.
            match unsafe { hash_clause(r, outer, inner) } {
                Some((o, i)) => c.keys.push((r, o, i)),
                None => c.others.push(r),
            }
        }
        c
    }

    /// How the key columns form the table's key.
    fn composer(&self) -> Composer {
        // SAFETY: the Vars of planner clauses.
        Composer::new(self.keys.iter().map(|&(_, o, i)| unsafe { clause_bits((*o).vartype, (*i).vartype) }).collect())
    }

    /// The clauses the node checks on each joined row: the others, and the key clauses too
    /// where equal keys do not mean equal columns.
    fn qual(&self) -> Vec<*mut pg_sys::RestrictInfo> {
        let mut q = Vec::new();
        if !self.composer().form().exact() {
            q.extend(self.keys.iter().map(|k| k.0));
        }
        q.extend_from_slice(&self.others);
        q
    }

    /// The key clauses, then the others: a path's `custom_private`.
    fn ordered(&self) -> *mut pg_sys::List {
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

/// A GpuJoin path's clauses (its `custom_private`, over its two children's relations).
///
/// # Safety
/// A path made by this module.
unsafe fn path_clauses(path: *mut pg_sys::CustomPath) -> Clauses {
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
        if jointype != pg_sys::JoinType::JOIN_INNER || !enabled() {
            return;
        }
        add_path(root, joinrel, outerrel, innerrel, extra);
    }
}

/// Adds GpuJoin paths to `joinrel` if the join qualifies (see the module comment): a serial
/// path over both sides' cheapest paths, and a parallel-aware partial path over the outer
/// side's cheapest partial path where the join may run in parallel workers.
///
/// # Safety
/// The hook's arguments.
unsafe fn add_path(
    root: *mut pg_sys::PlannerInfo,
    joinrel: *mut pg_sys::RelOptInfo,
    outerrel: *mut pg_sys::RelOptInfo,
    innerrel: *mut pg_sys::RelOptInfo,
    extra: *mut pg_sys::JoinPathExtraData,
) {
    // SAFETY: forwarded contract; every node is allocated in the planner's memory context.
    unsafe {
        let inner_path = (*innerrel).cheapest_total_path;
        if inner_path.is_null() || !(*inner_path).param_info.is_null() {
            return;
        }
        let rinfos = PgList::<pg_sys::RestrictInfo>::from_pg((*extra).restrictlist);
        for r in rinfos.iter_ptr() {
            if (*r).pseudoconstant || !only_plain_vars((*r).clause as *mut pg_sys::Node) {
                return;
            }
        }
        if !only_plain_vars((*(*joinrel).reltarget).exprs as *mut pg_sys::Node) {
            return;
        }
        // Every clause the node can hash goes into the key (`super::joinkey`): the pairs it
        // forms are those of all of them, which the cost counts.
        let clauses = Clauses::of((*extra).restrictlist, outerrel, innerrel);
        if clauses.keys.is_empty() {
            return;
        }
        let mut keylist = PgList::<pg_sys::RestrictInfo>::new();
        for &(r, _, _) in &clauses.keys {
            keylist.push(r);
        }
        let key_sel = pg_sys::clauselist_selectivity(root, keylist.into_pg(), 0, pg_sys::JoinType::JOIN_INNER, (*extra).sjinfo);
        let cost = PairCost { key_sel, qual_clauses: clauses.qual().len() };
        // A key that forms far more pairs than the join returns (the other clauses, which the
        // node cannot hash, throw most away) is no job for the node, forced or not.
        let formed = (*outerrel).rows * (*innerrel).rows * key_sel;
        if cost.qual_clauses > 0 && formed > MAX_PAIRS_PER_ROW * (*joinrel).rows + PAIRS_SLACK {
            return;
        }
        let ordered = || clauses.ordered();
        let outer_path = (*outerrel).cheapest_total_path;
        if !outer_path.is_null() && (*outer_path).param_info.is_null() {
            let cp = make_path(joinrel, outer_path, inner_path, ordered(), None, cost);
            pg_sys::add_path(joinrel, cp as *mut pg_sys::Path);
            candidates::remember(root, joinrel, make_path(joinrel, outer_path, inner_path, ordered(), None, cost));
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
                candidates::remember(
                    root,
                    joinrel,
                    make_path(joinrel, outer_partial, safe_inner, ordered(), Some(workers), cost),
                );
            }
        }
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
/// what it points to.
pub mod candidates {
    use std::cell::RefCell;

    use pgrx::pg_sys;

    struct Entry {
        ctx: pg_sys::MemoryContext,
        root: *mut pg_sys::PlannerInfo,
        joinrel: *mut pg_sys::RelOptInfo,
        serial: *mut pg_sys::CustomPath,
        partial: *mut pg_sys::CustomPath,
    }

    thread_local! {
        static ENTRIES: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    }

    /// Keeps `path` (a GpuJoin path of `joinrel` that no path list holds) if it is the cheapest
    /// of its kind so far.
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
                        entries.push(Entry { ctx, root, joinrel, serial: null, partial: null });
                        entries.len() - 1
                    }
                };
                let e = &mut entries[at];
                let slot = if (*path).path.parallel_aware { &mut e.partial } else { &mut e.serial };
                if slot.is_null() || (*path).path.total_cost < (**slot).path.total_cost {
                    *slot = path;
                }
            });
        }
    }

    /// The cheapest serial and partial GpuJoin paths offered for `joinrel` of `root` (null
    /// where none).
    pub fn of(
        root: *mut pg_sys::PlannerInfo,
        joinrel: *mut pg_sys::RelOptInfo,
    ) -> (*mut pg_sys::CustomPath, *mut pg_sys::CustomPath) {
        ENTRIES.with_borrow(|entries| {
            entries
                .iter()
                .find(|x| x.root == root && x.joinrel == joinrel)
                .map_or((std::ptr::null_mut(), std::ptr::null_mut()), |e| (e.serial, e.partial))
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
        p.total_cost =
            p.total_cost - joined * pg_sys::cpu_tuple_cost + joined * naggs * AGG_FOLD_FACTOR * pg_sys::cpu_operator_cost;
        p.startup_cost = p.total_cost;
        cp
    }
}

/// The share of the rows one participant of a parallel plan with `workers` workers handles
/// (costsize.c's `get_parallel_divisor`, which is not exported).
fn parallel_divisor(workers: i32) -> f64 {
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

/// What the pairs a join forms cost: the selectivity of its key clauses (the pairs the table
/// forms are outer rows × inner rows × this), and the clauses checked on each pair.
#[derive(Clone, Copy)]
struct PairCost {
    key_sel: f64,
    qual_clauses: usize,
}

/// A GpuJoin path over `outer_path` and `inner_path`; parallel-aware with `workers` when given.
///
/// # Safety
/// Planner structures of one join.
unsafe fn make_path(
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
        p.startup_cost = (*inner_path).total_cost + (*inner_path).rows * build + SETUP_COST;
        if let Some(w) = workers.filter(|_| crate::sql::per_process_cuda()) {
            p.startup_cost += f64::from(w) * WORKER_CONTEXT_FACTOR * pg_sys::parallel_setup_cost;
        }
        // The pairs the key forms (this participant's outer rows against the whole inner
        // side), each checked against the qual.
        let formed = (*outer_path).rows * (*(*inner_path).parent).rows * pairs.key_sel;
        let check = formed * pairs.qual_clauses as f64 * pg_sys::cpu_operator_cost;
        p.total_cost =
            p.startup_cost + (*outer_path).total_cost + (*outer_path).rows * probe + check + rows * pg_sys::cpu_tuple_cost;
        let mut children = PgList::<pg_sys::Path>::new();
        children.push(outer_path);
        children.push(inner_path);
        (*cp).custom_paths = children.into_pg();
        (*cp).custom_private = clauses;
        (*cp).methods = &METHODS.path;
        cp
    }
}

/// An int8 constant (custom_private holds only Consts: copyable and printable on every major).
pub fn int_node(v: i64) -> *mut pg_sys::Node {
    // SAFETY: makeConst allocates a Const in the current memory context.
    unsafe {
        pg_sys::makeConst(pg_sys::INT8OID, -1, pg_sys::InvalidOid, 8, pg_sys::Datum::from(v), false, true) as *mut pg_sys::Node
    }
}

fn text_node(s: &str) -> *mut pg_sys::Node {
    let c = std::ffi::CString::new(s.replace('\0', "")).expect("no NUL");
    // SAFETY: cstring_to_text copies the string into a palloc'd text.
    unsafe {
        let t = pg_sys::cstring_to_text(c.as_ptr());
        pg_sys::makeConst(pg_sys::TEXTOID, -1, pg_sys::DEFAULT_COLLATION_OID, -1, pg_sys::Datum::from(t), false, false)
            as *mut pg_sys::Node
    }
}

/// # Safety
/// `n` is an int8 Const made by [`int_node`].
unsafe fn int_of(n: *mut pg_sys::Node) -> i64 {
    // SAFETY: forwarded contract.
    unsafe { (*(n as *mut pg_sys::Const)).constvalue.value() as i64 }
}

/// # Safety
/// `n` is a text Const made by [`text_node`].
unsafe fn text_of(n: *mut pg_sys::Node) -> String {
    // SAFETY: forwarded contract.
    unsafe {
        let c = pg_sys::text_to_cstring((*(n as *mut pg_sys::Const)).constvalue.cast_mut_ptr());
        CStr::from_ptr(c).to_string_lossy().into_owned()
    }
}

/// The resno of `var` in `tlist` (a child plan's target list), matched by relation and column.
///
/// # Safety
/// Planner structures.
unsafe fn resno_in(tlist: *mut pg_sys::List, var: *mut pg_sys::Var) -> Option<i64> {
    // SAFETY: forwarded contract.
    unsafe {
        PgList::<pg_sys::TargetEntry>::from_pg(tlist).iter_ptr().find_map(|te| {
            let v = as_var((*te).expr as *mut pg_sys::Node)?;
            ((*v).varno == (*var).varno && (*v).varattno == (*var).varattno).then_some((*te).resno as i64)
        })
    }
}

/// "relname alias" of every base relation in `relids`.
///
/// # Safety
/// Planner structures.
unsafe fn relation_names(root: *mut pg_sys::PlannerInfo, relids: *mut pg_sys::Bitmapset) -> String {
    // SAFETY: forwarded contract; simple_rte_array has an entry for every relid.
    unsafe {
        let mut names = Vec::new();
        let mut i = pg_sys::bms_next_member(relids, -1);
        while i >= 0 {
            let rte = *(*root).simple_rte_array.add(i as usize);
            if !rte.is_null() && (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION {
                let rel = pg_sys::get_rel_name((*rte).relid);
                let rel = if rel.is_null() { String::from("?") } else { CStr::from_ptr(rel).to_string_lossy().into_owned() };
                let alias = if (*rte).eref.is_null() {
                    rel.clone()
                } else {
                    CStr::from_ptr((*(*rte).eref).aliasname).to_string_lossy().into_owned()
                };
                names.push(if alias == rel { rel } else { format!("{rel} {alias}") });
            }
            i = pg_sys::bms_next_member(relids, i);
        }
        names.join(", ")
    }
}

/// The plan's private list: [the number of key columns, (outer type oid, inner type oid, outer
/// resno, inner resno) per key column, inner relation names, whether the inner plan is
/// partial, the number of aggregates, (function OID, column) per aggregate, then (side, resno)
/// per column kept].
struct Private {
    /// Per key clause (`super::joinkey`, in the clauses' order): the outer and inner columns'
    /// types and their resnos in the outer and inner child's rows.
    keys: Vec<(pg_sys::Oid, pg_sys::Oid, i32, i32)>,
    inner_names: String,
    /// The inner plan is partial (a parallel query's participants each scan a share of it).
    inner_partial: bool,
    /// (0 outer / 1 inner, resno) per column of the join the node keeps: per scan tuple
    /// column, or in the aggregate mode per scan tuple column after the aggregates'.
    map: Vec<(u8, i32)>,
    /// The aggregate mode (empty: the join mode): per aggregate, its function's OID and the
    /// index in `map` of its argument (-1 for `count(*)`).
    aggs: Vec<(u32, i32)>,
}

impl Private {
    fn to_list(&self) -> *mut pg_sys::List {
        let mut l = PgList::<pg_sys::Node>::new();
        l.push(int_node(self.keys.len() as i64));
        for &(outer_oid, inner_oid, outer, inner) in &self.keys {
            l.push(int_node(u32::from(outer_oid) as i64));
            l.push(int_node(u32::from(inner_oid) as i64));
            l.push(int_node(outer as i64));
            l.push(int_node(inner as i64));
        }
        l.push(text_node(&self.inner_names));
        l.push(int_node(self.inner_partial as i64));
        l.push(int_node(self.aggs.len() as i64));
        for &(fnoid, col) in &self.aggs {
            l.push(int_node(fnoid as i64));
            l.push(int_node(col as i64));
        }
        for &(side, resno) in &self.map {
            l.push(int_node(side as i64));
            l.push(int_node(resno as i64));
        }
        l.into_pg()
    }

    /// # Safety
    /// A list made by [`Private::to_list`].
    unsafe fn from_list(list: *mut pg_sys::List) -> Private {
        // SAFETY: forwarded contract.
        unsafe {
            let l = PgList::<pg_sys::Node>::from_pg(list);
            let node = |i: usize| l.get_ptr(i).expect("GpuJoin plan private data");
            let at = |i: usize| int_of(node(i));
            let nkeys = at(0).max(0) as usize;
            let oid = |i: usize| pg_sys::Oid::from(at(i) as u32);
            let keys = (0..nkeys).map(|j| (oid(1 + 4 * j), oid(2 + 4 * j), at(3 + 4 * j) as i32, at(4 + 4 * j) as i32));
            let keys: Vec<_> = keys.collect();
            let rest = 1 + 4 * nkeys;
            let naggs = at(rest + 2).max(0) as usize;
            let aggs = (0..naggs).map(|j| (at(rest + 3 + 2 * j) as u32, at(rest + 4 + 2 * j) as i32)).collect();
            let mut map = Vec::new();
            let mut i = rest + 3 + 2 * naggs;
            while i + 1 < l.len() {
                map.push((at(i) as u8, at(i + 1) as i32));
                i += 2;
            }
            Private { keys, inner_names: text_of(node(rest)), inner_partial: at(rest + 1) != 0, map, aggs }
        }
    }

    /// The key's composer (`super::joinkey`), checked: every key column of a type the node
    /// takes.
    fn composer(&self) -> Composer {
        let bad = |k: &(pg_sys::Oid, pg_sys::Oid, i32, i32)| key_type_of(k.0).is_none() || key_type_of(k.1).is_none();
        if self.keys.is_empty() || self.keys.iter().any(bad) {
            report(UvmError::new(Code::SystemError, "GpuJoin: bad key type in plan"));
        }
        Composer::new(self.keys.iter().map(|k| clause_bits(k.0, k.1)).collect())
    }

    /// The key columns of one side (0 outer, 1 inner).
    fn key_cols(&self, side: u8) -> KeyCols {
        let pick = |k: &(pg_sys::Oid, pg_sys::Oid, i32, i32)| if side == 0 { (k.0, k.2) } else { (k.1, k.3) };
        KeyCols {
            atts: self.keys.iter().map(|k| pick(k).1).collect(),
            oids: self.keys.iter().map(|k| pick(k).0).collect(),
            composer: self.composer(),
        }
    }
}

/// The key columns of one side of the join as [`fetch_chunk`] reads them: their attribute
/// numbers in the child's rows, their types, and how they form the key.
struct KeyCols {
    atts: Vec<i32>,
    oids: Vec<pg_sys::Oid>,
    composer: Composer,
}

impl KeyCols {
    /// The highest attribute number among them.
    fn max_att(&self) -> i32 {
        self.atts.iter().copied().max().unwrap_or(0)
    }
}

/// The node's execution statistics (EXPLAIN ANALYZE).
#[derive(Default)]
struct Stats {
    inner_rows: u64,
    table_bytes: u64,
    tier: String,
    batches: u64,
    gpu: Duration,
    /// From the first call to the inner side being ready (in parallel, the longest
    /// participant's).
    build: Duration,
    /// Batches of outer keys read while another participant built the table.
    ahead: u64,
    /// The table's build from the pairs (in parallel, by the participant that built it).
    table_build: Duration,
}

// utils/datum.h's datumCopy, which pgrx's bindings leave out, and executor/tuptable.h's
// slot_getsomeattrs_int, both declared without pgrx's per-call guard (the same signatures on
// PostgreSQL 14 to 18): the loops that read a child's rows call them inside one guard per
// chunk (`fetch_chunk`).
unsafe extern "C-unwind" {
    #[link_name = "datumCopy"]
    fn datum_copy_raw(value: pg_sys::Datum, typ_by_val: bool, typ_len: std::ffi::c_int) -> pg_sys::Datum;
    #[link_name = "slot_getsomeattrs_int"]
    fn slot_getsomeattrs_raw(slot: *mut pg_sys::TupleTableSlot, attnum: std::ffi::c_int);
}

/// What the executor's static inline `ExecProcNode` does before it calls the node's method: a
/// node whose parameters changed is rescanned first. [`fetch_chunk`], which calls the method
/// directly, calls this before each chunk: parameters change only between
/// scans, and the rescan clears `chgParam`. (Without it, a child with new parameters was not
/// rescanned and returned nothing: PostgreSQL 17 and 18's battery caught it.)
///
/// # Safety
/// `node` is an initialized plan state.
unsafe fn rescan_if_changed(node: *mut pg_sys::PlanState) {
    // SAFETY: forwarded contract.
    unsafe {
        if !(*node).chgParam.is_null() {
            pg_sys::ExecReScan(node);
        }
    }
}

/// Rows of a child plan with a non-NULL key, as [`fetch_chunk`] reads them: their keys, and per
/// row the values and NULL flags of some columns (`n` per row, none for the probe mode's keys),
/// by-reference values copied.
#[derive(Default)]
struct Chunk {
    keys: Vec<i64>,
    vals: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
    /// Rows with a NULL key skipped.
    null_keys: u64,
}

/// Rows per chunk of the inner side (its by-reference values are copied into a scratch context
/// reset between chunks).
const CHUNK_ROWS: usize = 1024;

/// Reads the next chunk of `node`'s rows with a non-NULL key (every key column of `key`
/// non-NULL) into `chunk`: the key, and the columns `resnos` (of `cols`: by-reference values
/// copied into `ctx` with `datumCopy`, which the caller keeps until it has used them). At most
/// `cap` rows; true when the child ended.
///
/// This is the node's per-row loop over its children, the work it adds to their scans, so it
/// calls PostgreSQL without pgrx's per-call guard (a `sigsetjmp` per call, two or three per
/// row): ExecProcNode, slot_getsomeattrs_int and datumCopy are called directly inside one
/// guard per chunk, which turns an ERROR raised inside into a Rust panic at its boundary;
/// nothing in the frames the ERROR jumps over needs dropping (the buffers are written through
/// raw pointers into room reserved before).
///
/// # Safety
/// `node` is an initialized plan state whose rows have the key's attributes (of their types)
/// and `resnos` (of the types `cols` describe), all ≤ `upto`; `ctx` is a live memory context.
#[allow(clippy::too_many_arguments)]
unsafe fn fetch_chunk(
    node: *mut pg_sys::PlanState,
    key: &KeyCols,
    upto: i32,
    resnos: &[i32],
    cols: &[Col],
    ctx: pg_sys::MemoryContext,
    chunk: &mut Chunk,
    cap: usize,
) -> bool {
    let n = resnos.len();
    chunk.keys.clear();
    chunk.vals.clear();
    chunk.nulls.clear();
    chunk.keys.reserve(cap);
    chunk.vals.reserve(cap * n);
    chunk.nulls.reserve(cap * n);
    let (kp, vp, np) = (chunk.keys.as_mut_ptr(), chunk.vals.as_mut_ptr(), chunk.nulls.as_mut_ptr());
    let (mut got, mut null_keys) = (0usize, 0u64);
    // SAFETY: forwarded contract.
    unsafe { rescan_if_changed(node) };
    // SAFETY: forwarded contract; every write is below `cap` rows of the room reserved above;
    // datumCopy allocates in `ctx` (CurrentMemoryContext is restored after each copy, and by
    // the abort after an ERROR).
    let ended = unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            let Some(next) = (*node).ExecProcNode else { return true };
            let mut ended = false;
            while got < cap {
                let slot = next(node);
                if tup_is_null(slot) {
                    ended = true;
                    break;
                }
                if ((*slot).tts_nvalid as i32) < upto {
                    slot_getsomeattrs_raw(slot, upto);
                }
                let at = |att: i32| {
                    let i = (att - 1) as usize;
                    (*(*slot).tts_values.add(i), *(*slot).tts_isnull.add(i))
                };
                let mut k = key.composer.start();
                let mut null = false;
                for (i, (&att, &oid)) in key.atts.iter().zip(&key.oids).enumerate() {
                    let (d, isnull) = at(att);
                    if isnull {
                        null = true;
                        break;
                    }
                    k = key.composer.add(k, i, key_of(d, oid));
                }
                if null {
                    null_keys += 1;
                    continue;
                }
                *kp.add(got) = k as i64;
                for (i, (&r, c)) in resnos.iter().zip(cols).enumerate() {
                    let (mut v, isnull) = at(r);
                    if !isnull && !c.byval {
                        // Only the copy goes to `ctx`: the child runs in the caller's context
                        // (a scan allocates what it keeps there at its first call).
                        let old = pg_sys::MemoryContextSwitchTo(ctx);
                        v = datum_copy_raw(v, false, c.len as std::ffi::c_int);
                        pg_sys::MemoryContextSwitchTo(old);
                    }
                    *vp.add(got * n + i) = v;
                    *np.add(got * n + i) = isnull;
                }
                got += 1;
            }
            ended
        })
    };
    // SAFETY: the first `got` rows were written above.
    unsafe {
        chunk.keys.set_len(got);
        chunk.vals.set_len(got * n);
        chunk.nulls.set_len(got * n);
    }
    chunk.null_keys = null_keys;
    ended
}

/// The GpuJoin custom scan.
pub struct GpuJoinScan {
    p: Private,
    /// The table's key type, and the key columns of each side.
    key: KeyType,
    outer_key: KeyCols,
    inner_key: KeyCols,
    outer: *mut pg_sys::PlanState,
    inner: *mut pg_sys::PlanState,
    inner_ctx: pg_sys::MemoryContext,
    batch_ctx: pg_sys::MemoryContext,
    /// The inner rows (the inner columns the join uses: `inner_cols`, read from the inner
    /// child's `inner_resnos`).
    rows: InnerRows,
    inner_cols: Vec<Col>,
    inner_resnos: Vec<i32>,
    /// The outer columns the join uses, kept per batch tuple (`outer_vals`, `outer_nulls`:
    /// `outer_cols.len()` entries per tuple; by-reference values copied into the batch context)
    /// instead of whole tuples.
    outer_cols: Vec<Col>,
    outer_resnos: Vec<i32>,
    outer_vals: Vec<pg_sys::Datum>,
    outer_nulls: Vec<bool>,
    /// Per scan tuple column: its index in `outer_cols` or `inner_cols` (by its side).
    col_index: Vec<usize>,
    /// The inner table; dropped by this process only if it `owns_table` (a parallel query's
    /// table belongs to the leader).
    table: Option<SegRef>,
    owns_table: bool,
    /// This participant's result buffer.
    result: Option<SegRef>,
    /// The plan runs in parallel workers (its inner side is built again at every rescan).
    parallel_aware: bool,
    /// The parallel query's shared state (null in a serial execution).
    shared: *mut Shared,
    estate: *mut pg_sys::EState,
    /// The inner side is built (or attached) for this scan.
    ready: bool,
    outer_done: bool,
    /// This participant's statistics went to the shared counters.
    reported: bool,
    batch: Batch,
    emitter: Emitter,
    max_outer_att: i32,
    max_inner_att: i32,
    stats: Stats,
    /// The aggregate mode's aggregates (empty in the join mode), and whether this scan's row of
    /// results was returned.
    aggs: Vec<NodeAgg>,
    agg_done: bool,
    /// The probe mode's plan: every aggregate is `count(*)`, or `count`/`sum` of one inner
    /// column (`Some(Some(its index in Private::map))`; `Some(None)`: `count(*)` alone). The
    /// table is then built with that column's values as payloads, where none is NULL
    /// (`payload_values`), and the outer keys are probed in batches whose matches and payload
    /// sum are the aggregates: no pairs come back, no match is formed.
    probe: Option<Option<usize>>,
    payload_values: bool,
    /// A parallel probe-mode participant that finished its share of the inner side while
    /// another builds the table: it reads up to [`PENDING_BATCHES`] batches of outer keys
    /// (`pending`) before it waits, so the build's serial part overlaps the outer scan.
    awaiting: Option<Instant>,
    pending: Vec<Vec<i64>>,
    /// The probe mode's batch being probed (see `probe_keys`); dropped unwaited (an ERROR, a
    /// rescan), the request is given up and the service reuses its slot once it is done.
    in_flight: Option<exec::Pending>,
    /// The outer side's chunk buffer (reused from batch to batch).
    chunk: Chunk,
}

/// An aggregate the node computes: its state, the index in `Private::map` of its argument
/// (`None` for `count(*)`), and its result type.
struct NodeAgg {
    acc: Acc,
    col: Option<usize>,
    out: Out,
}

/// The aggregates of a plan's private list, checked.
fn node_aggs(p: &Private) -> Vec<NodeAgg> {
    p.aggs
        .iter()
        .map(|&(fnoid, col)| {
            let Some((kind, arg)) = agg::spec_of(fnoid) else {
                report(UvmError::new(Code::SystemError, format!("GpuJoin: aggregate function {fnoid} in plan")));
            };
            let col = usize::try_from(col).ok().filter(|&c| c < p.map.len());
            if col.is_none() != (kind == Kind::CountStar) {
                report(UvmError::new(Code::SystemError, "GpuJoin: an aggregate's argument is not a column of the join"));
            }
            NodeAgg { acc: Acc::new(kind, arg), col, out: agg::out_of(kind, arg) }
        })
        .collect()
}

/// The probe mode's plan for `aggs` (see `GpuJoinScan::probe`).
fn probe_plan(p: &Private, aggs: &[NodeAgg]) -> Option<Option<usize>> {
    let mut col = None;
    for a in aggs {
        match (a.acc.kind, a.col) {
            (Kind::CountStar, _) => {}
            (Kind::Count | Kind::Sum, Some(c)) if p.map[c].0 == 1 && col.is_none_or(|x| x == c) => col = Some(c),
            _ => return None,
        }
    }
    (!aggs.is_empty()).then_some(col)
}

/// An `int2`, `int4` or `int8` datum (`arg`) as an i64 (`Arg::Any`: 0, only its NULL counts).
pub fn int_of_datum(d: pg_sys::Datum, arg: Arg) -> i64 {
    match arg {
        Arg::Any => 0,
        Arg::Int2 => d.value() as i16 as i64,
        Arg::Int4 => d.value() as i32 as i64,
        Arg::Int8 => d.value() as i64,
    }
}

/// An aggregate's value as a datum of its type `out` (a numeric is allocated in the current
/// memory context).
pub fn datum_of_value(v: Value, out: Out) -> (pg_sys::Datum, bool) {
    match (v, out) {
        (Value::Null, _) => (pg_sys::Datum::from(0), true),
        (Value::Int(x), Out::Int2) => (pg_sys::Datum::from(x as i16), false),
        (Value::Int(x), Out::Int4) => (pg_sys::Datum::from(x as i32), false),
        (Value::Int(x), Out::Int8) => (pg_sys::Datum::from(x), false),
        (Value::Int(x), Out::Numeric) => datum_of_value(Value::Big(x as i128), out),
        (Value::Big(x), _) => {
            let n = pgrx::AnyNumeric::from(x);
            (pgrx::IntoDatum::into_datum(n).expect("a numeric datum"), false)
        }
    }
}

/// Returns the aggregates' results as the node's one row: the scan tuple holds them first
/// (the rest NULL), made in the per-tuple memory, checked against the plan's qual if any, then
/// projected (the node's target list over them). Shared by the GpuJoin node's aggregate mode
/// and `super::preagg`'s GpuJoinAgg.
///
/// # Safety
/// `node` is a custom scan state whose scan tuple starts with one column per aggregate, of
/// the aggregate's result type.
pub unsafe fn emit_results<'a>(
    node: *mut pg_sys::CustomScanState,
    results: impl Iterator<Item = (&'a Acc, Out)>,
    qual: Option<*mut pg_sys::ExprState>,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: forwarded contract.
    unsafe {
        let econtext = (*node).ss.ps.ps_ExprContext;
        let scan = (*node).ss.ss_ScanTupleSlot;
        pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
        pg_sys::ExecClearTuple(scan);
        let natts = (*(*scan).tts_tupleDescriptor).natts as usize;
        for i in 0..natts {
            *(*scan).tts_values.add(i) = pg_sys::Datum::from(0);
            *(*scan).tts_isnull.add(i) = true;
        }
        let old = pg_sys::MemoryContextSwitchTo((*econtext).ecxt_per_tuple_memory);
        for (i, (acc, out)) in results.enumerate().take(natts) {
            let v = acc.value().unwrap_or_else(|e| report(e));
            let (d, isnull) = datum_of_value(v, out);
            *(*scan).tts_values.add(i) = d;
            *(*scan).tts_isnull.add(i) = isnull;
        }
        pg_sys::MemoryContextSwitchTo(old);
        pg_sys::ExecStoreVirtualTuple(scan);
        (*econtext).ecxt_scantuple = scan;
        if let Some(q) = qual.filter(|q| !q.is_null()) {
            if !pg_sys::ExecQual(q, econtext) {
                return std::ptr::null_mut();
            }
        }
        let proj = (*node).ss.ps.ps_ProjInfo;
        if proj.is_null() {
            scan
        } else {
            pg_sys::ExecProject(proj)
        }
    }
}

/// A datum of type `out`, as an aggregate's partial value (a numeric must hold an integer).
///
/// # Safety
/// `d` is a datum of type `out` (not NULL).
pub unsafe fn value_of_datum(d: pg_sys::Datum, out: Out) -> Result<Value> {
    Ok(match out {
        Out::Int2 => Value::Int(d.value() as i16 as i64),
        Out::Int4 => Value::Int(d.value() as i32 as i64),
        Out::Int8 => Value::Int(d.value() as i64),
        Out::Numeric => {
            // SAFETY: forwarded contract.
            let n = unsafe { <pgrx::AnyNumeric as pgrx::FromDatum>::from_datum(d, false) }.expect("not NULL");
            let text = n.to_string();
            Value::Big(text.parse::<i128>().map_err(|_| {
                UvmError::new(Code::ProtocolViolation, format!("a GpuJoin partial sum is not an integer: {text}"))
            })?)
        }
    })
}

fn tup_is_null(slot: *mut pg_sys::TupleTableSlot) -> bool {
    // SAFETY: reads the flags of a live slot.
    slot.is_null() || unsafe { (*slot).tts_flags } & pg_sys::TTS_FLAG_EMPTY as u16 != 0
}

impl GpuJoinScan {
    /// Runs `f` with the executor, counting its time as GPU time.
    fn timed<R>(&mut self, f: impl FnOnce(&mut dyn exec::Executor) -> Result<R>) -> R {
        let t = Instant::now();
        let r = with_executor(f);
        self.stats.gpu += t.elapsed();
        r
    }

    /// Builds the table in `seg` (grown to the table's size) from the (key, row id) pairs of
    /// `parts`; returns its bytes and tier code.
    fn fill_table(&mut self, seg: &SegRef, parts: &[&[[i64; 2]]], nulls: u64) -> (u64, u32) {
        let kt = self.key;
        let stored = parts.iter().map(|p| p.len() as u64).sum();
        let n = table::slot_count(stored);
        let bytes = table::table_bytes(stored);
        let t = Instant::now();
        self.timed(|ex| {
            exec::grow_at_least(ex, seg, bytes)?;
            exec::build_begin(ex, seg, n)?;
            for rows in parts {
                exec::build_insert(ex, seg, kt, n, rows)?;
            }
            exec::build_finish(ex, seg, kt, n, stored, nulls)
        });
        self.stats.table_build = t.elapsed();
        // The node's own segment, in the reserved namespace: looked up, not resolved (which
        // is for names users give).
        let info = crate::registry::shmem::shared().ok().and_then(|reg| reg.lookup(seg.name()).ok().map(|slot| reg.info(slot)));
        let tier = match info.map(|i| (i.bytes_in(Tier::Device), i.bytes_in(Tier::Host))) {
            Some((d, 0)) if d > 0 => 1,
            Some((0, h)) if h > 0 => 2,
            Some(_) => 3,
            None => 0,
        };
        self.stats.table_bytes = bytes;
        self.stats.tier = TIERS[tier as usize].into();
        (bytes, tier)
    }

    /// Creates a temporary segment of `bytes` that this process drops (End, or abort).
    fn create_temp(&mut self, what: &str, bytes: u64, max: Option<u64>) -> SegRef {
        let (size, max) = (bytes.min(i64::MAX as u64) as i64, max.map(|m| m.min(i64::MAX as u64) as i64));
        cleanup::create(what, |name| self.timed(|ex| exec::create(ex, name, size, max, TierPref::Auto, current_user(), now())))
    }

    /// Drains the inner child into `writer` (the columns the join uses of each row with a
    /// non-NULL key): returns the table's (key, payload) pairs, the count of NULL keys and
    /// whether the payloads are values. A payload is the row's id, or in the probe mode the
    /// aggregated column's value (0 for `count(*)` alone), read here as the row goes by, so
    /// that no one makes a second pass over the stored rows; a NULL value turns this
    /// participant's payloads back into row ids ([`shared::values_to_row_ids`]). By-reference
    /// values that need flattening are made in `scratch`, reset as it goes.
    ///
    /// # Safety
    /// Called from exec with the node's children initialized; the writer's arena is live.
    unsafe fn drain_into(&mut self, writer: &mut RowWriter, scratch: pg_sys::MemoryContext) -> (Vec<[i64; 2]>, u64, bool) {
        // SAFETY: forwarded contract.
        unsafe {
            let n = self.inner_resnos.len();
            let mut rows: Vec<[i64; 2]> = Vec::new();
            let mut nulls = 0u64;
            let mut chunk = Chunk::default();
            let upto = self.max_inner_att;
            // The probe mode's payload column: its index among the stored ones and its type
            // (`None` for count(*) alone, whose payloads are 0).
            let mut values = self.probe.is_some();
            let payload = self.probe.flatten().map(|c| {
                let arg = self.aggs.iter().find(|a| a.col == Some(c)).map_or(Arg::Any, |a| a.acc.arg);
                (self.col_index[c], arg)
            });
            loop {
                // The chunk's by-reference values live in `scratch` until the writer copied them.
                pg_sys::MemoryContextReset(scratch);
                let ended = fetch_chunk(
                    self.inner,
                    &self.inner_key,
                    upto,
                    &self.inner_resnos,
                    &self.inner_cols,
                    scratch,
                    &mut chunk,
                    CHUNK_ROWS,
                );
                nulls += chunk.null_keys;
                // Room for the chunk's pairs first (an ERROR here leaves nothing half done).
                if let Err(e) = fallible::try_reserve(&mut rows, chunk.keys.len(), "the inner side's keys") {
                    pg_sys::MemoryContextReset(scratch);
                    report(e);
                }
                let old = pg_sys::MemoryContextSwitchTo(scratch);
                for (j, &key) in chunk.keys.iter().enumerate() {
                    let id = writer.push(&chunk.vals[j * n..(j + 1) * n], &chunk.nulls[j * n..(j + 1) * n]);
                    let p = match payload {
                        _ if !values => id,
                        None => 0,
                        Some((i, _)) if chunk.nulls[j * n + i] => {
                            values = false;
                            shared::values_to_row_ids(&mut rows, writer.slot());
                            id
                        }
                        Some((i, arg)) => int_of_datum(chunk.vals[j * n + i], arg),
                    };
                    rows.push([key, p]);
                }
                pg_sys::MemoryContextSwitchTo(old);
                if ended {
                    break;
                }
            }
            pg_sys::MemoryContextReset(scratch);
            self.stats.inner_rows = rows.len() as u64;
            (rows, nulls, values)
        }
    }

    /// A serial execution's build: the inner rows in the node's memory, the table in a
    /// temporary segment of this process.
    ///
    /// # Safety
    /// Called from exec with the node's children initialized.
    unsafe fn build_local(&mut self) {
        // SAFETY: forwarded contract; the rows are stored in the node's inner context.
        unsafe {
            self.drop_table();
            self.rows = InnerRows::default();
            pg_sys::MemoryContextReset(self.inner_ctx);
            let mut writer = RowWriter::new(Arena::Local(self.inner_ctx), &self.inner_cols, 0);
            let (rows, nulls, values) = self.drain_into(&mut writer, self.batch_ctx);
            self.rows = writer.into_local();
            if rows.is_empty() {
                return;
            }
            let bytes = table::table_bytes(rows.len() as u64);
            let seg = self.create_temp("inner", bytes, Some(bytes));
            self.table = Some(seg);
            self.owns_table = true;
            self.payload_values = values;
            self.fill_table(&seg, &[&rows], nulls);
        }
    }

    /// A parallel execution: builds the inner side for every participant, or waits for the
    /// participant that does (see `super::shared`), then attaches to it.
    ///
    /// # Safety
    /// Called from exec with `self.shared` set up and the query's DSA area attached.
    unsafe fn attach_shared(&mut self) {
        // SAFETY: forwarded contract.
        unsafe {
            self.scan_share(false);
            self.finish_attach();
        }
    }

    /// The query's DSA area (ERROR without one).
    ///
    /// # Safety
    /// Called from exec.
    unsafe fn query_area(&self) -> *mut pg_sys::dsa_area {
        // SAFETY: forwarded contract: the executor state is live.
        let area = unsafe { (*self.estate).es_query_dsa };
        if area.is_null() {
            report(UvmError::new(Code::SystemError, "GpuJoin: a parallel execution without a query DSA area"));
        }
        area
    }

    /// A parallel execution's first half: this participant's share of the inner side, and the
    /// build if it is the last to finish its share (see `super::shared`). The other
    /// participants then wait in [`GpuJoinScan::finish_attach`], or first read outer keys
    /// (the probe mode, `exec_aggregates`: `ahead`, which also skips the wait to join a scan
    /// that another participant reads whole).
    ///
    /// # Safety
    /// As for [`GpuJoinScan::attach_shared`].
    unsafe fn scan_share(&mut self, ahead: bool) {
        // SAFETY: forwarded contract; the builder writes the rows into the query's DSA area.
        unsafe {
            let sh = self.shared;
            let area = self.query_area();
            let role = if ahead { Shared::try_join(sh) } else { Some(Shared::join(sh)) };
            if let Some(Role::Scan) = role {
                // This participant's share of the inner side (all of it for a non-partial
                // inner plan, which only the first participant scans).
                let mut writer = RowWriter::new(Arena::Shared(area), &self.inner_cols, shared::my_slot());
                let (rows, nulls, values) = self.drain_into(&mut writer, self.batch_ctx);
                writer.publish(sh, &rows, nulls, values);
                drop(rows);
                if Shared::leave(sh) {
                    // The last to finish builds the table from every participant's pairs: in
                    // the probe mode, with the aggregated column's values as payloads, unless
                    // a participant met a NULL among them, and then every one's row ids.
                    let (parts, nulls, values) = Shared::keys(sh, area);
                    if parts.iter().any(|p| !p.is_empty()) {
                        let seg = (*sh).table;
                        self.rows = InnerRows::of_shared(sh, area, &self.inner_cols);
                        (*sh).payload_values = values;
                        let (bytes, tier) = self.fill_table(&seg, &parts, nulls);
                        (*sh).table_bytes = bytes;
                        (*sh).tier = tier;
                        (*sh).table_build_ns = self.stats.table_build.as_nanos() as u64;
                    }
                    drop(parts);
                    Shared::free_keys(sh, area);
                    Shared::publish(sh);
                }
            }
        }
    }

    /// A parallel execution's second half: waits until the inner side is built, then attaches
    /// to it.
    ///
    /// # Safety
    /// As for [`GpuJoinScan::attach_shared`], after [`GpuJoinScan::scan_share`].
    unsafe fn finish_attach(&mut self) {
        // SAFETY: forwarded contract.
        unsafe {
            let sh = self.shared;
            let area = self.query_area();
            Shared::wait_built(sh);
            self.table = Some((*sh).table);
            self.rows = InnerRows::of_shared(sh, area, &self.inner_cols);
            self.copy_shared_stats();
        }
    }

    /// The build's statistics, the table's payload kind and the participants' counters, from the
    /// shared state.
    fn copy_shared_stats(&mut self) {
        if self.shared.is_null() {
            return;
        }
        // SAFETY: the shared state is mapped while `self.shared` is set.
        unsafe {
            let sh = &*self.shared;
            self.stats.inner_rows = sh.rows.load(std::sync::atomic::Ordering::Relaxed);
            self.stats.table_bytes = sh.table_bytes;
            self.stats.tier = TIERS.get(sh.tier as usize).copied().unwrap_or("").into();
            self.stats.table_build = Duration::from_nanos(sh.table_build_ns);
            self.payload_values = sh.payload_values;
        }
    }

    /// Adds this participant's batches and executor time to the shared counters, once per scan.
    fn report_stats(&mut self) {
        if self.shared.is_null() || self.reported {
            return;
        }
        self.reported = true;
        // SAFETY: as above; the counters are atomics.
        unsafe {
            let sh = &*self.shared;
            sh.batches.fetch_add(self.stats.batches, std::sync::atomic::Ordering::Relaxed);
            sh.gpu_ns.fetch_add(self.stats.gpu.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
            sh.build_ns.fetch_max(self.stats.build.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
            sh.ahead.fetch_add(self.stats.ahead, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Reads the next outer batch and probes it; false at the end of the outer side.
    ///
    /// # Safety
    /// Called from exec after the build, with a non-empty inner side.
    unsafe fn next_batch(&mut self) -> bool {
        // SAFETY: forwarded contract; tuples are copied into the batch context.
        unsafe {
            pg_sys::MemoryContextReset(self.batch_ctx);
            self.outer_vals.clear();
            self.outer_nulls.clear();
            self.batch.clear();
            // A NULL key never matches: fetch_chunk skips those tuples. By-reference values are
            // copied into the batch context, which lives until the next batch.
            let mut chunk = std::mem::take(&mut self.chunk);
            let upto = self.max_outer_att;
            while self.batch.len() < BATCH_TUPLES {
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
                for &k in &chunk.keys {
                    self.batch.push(Some(k));
                }
                if ended {
                    self.outer_done = true;
                    break;
                }
            }
            self.chunk = chunk;
            if self.batch.is_empty() {
                return !self.outer_done;
            }
            self.probe_batch();
            true
        }
    }

    /// The probe mode's scan: the outer keys probed a batch at a time, each batch's matches and
    /// payload sum folded into the aggregates.
    ///
    /// # Safety
    /// As for exec, after the build, with a table.
    unsafe fn probe_all(&mut self) {
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
            }
        }
    }

    /// Reads the next batch of outer keys (the probe mode: the key alone) into `chunk`; true when
    /// the outer side ended.
    ///
    /// # Safety
    /// As for exec.
    unsafe fn fetch_keys(&mut self, chunk: &mut Chunk) -> bool {
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
    fn probe_keys(&mut self, table: &SegRef, keys: &[i64]) {
        self.collect_probe();
        let kt = self.key;
        self.stats.batches += 1;
        let started = self.timed(|ex| exec::probe_start(ex, table, kt, keys));
        self.in_flight = Some(started);
    }

    /// Waits for the probe in flight, if any, and drops its results (a rescan or the end
    /// before the results were returned): the table is not dropped or rebuilt under it.
    fn finish_probe(&mut self) {
        if let Some(p) = self.in_flight.take() {
            p.wait().unwrap_or_else(|e| report(e));
        }
    }

    /// Folds the matches and payload sum of the probe in flight, if any, into the aggregates.
    fn collect_probe(&mut self) {
        let Some(p) = self.in_flight.take() else { return };
        let t = Instant::now();
        let (m, sum) = p.wait().map(|(v, _)| exec::probe_result(v)).unwrap_or_else(|e| report(e));
        self.stats.gpu += t.elapsed();
        for a in &mut self.aggs {
            a.acc.add_matches(m, sum).unwrap_or_else(|e| report(e));
        }
    }

    /// Folds the matches of one batch of outer keys read before the build ended, when the
    /// builder found a NULL in the aggregated column (the table's payloads are row ids): the
    /// batch is matched as `next_batch` does. Only the probe mode reads keys ahead, and its
    /// aggregates read no outer column but the key.
    ///
    /// # Safety
    /// As for exec, after the build.
    unsafe fn match_keys(&mut self, keys: &[i64]) {
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
            self.probe_batch();
            while let Some((pos, row)) = self.emitter.next(&self.batch) {
                if let Err(e) = self.fold(pos, row) {
                    report(e);
                }
            }
        }
    }

    /// Reads batches of outer keys into `pending` until the table is built or
    /// [`PENDING_BATCHES`] are read (the probe mode, in parallel: see `awaiting`).
    ///
    /// # Safety
    /// As for exec, after [`GpuJoinScan::scan_share`].
    unsafe fn gather_while_building(&mut self) {
        // SAFETY: forwarded contract.
        unsafe {
            while !self.outer_done && self.pending.len() < PENDING_BATCHES && !Shared::is_built(self.shared) {
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
    unsafe fn exec_aggregates(&mut self, node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        // SAFETY: forwarded contract; the scan slot has the aggregates' results first.
        unsafe {
            if self.agg_done {
                return std::ptr::null_mut();
            }
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
                    while let Some((pos, row)) = self.emitter.next(&self.batch) {
                        if let Err(e) = self.fold(pos, row) {
                            report(e);
                        }
                    }
                    if self.outer_done {
                        break;
                    }
                    pg_sys::check_for_interrupts!();
                    self.next_batch();
                }
            }
            self.collect_probe();
            self.report_stats();
            self.agg_done = true;
            emit_results(node, self.aggs.iter().map(|a| (&a.acc, a.out)), None)
        }
    }

    /// Folds the joined row (outer tuple `pos` of the batch, inner row `row`) into the
    /// aggregates.
    fn fold(&mut self, pos: u32, row: i64) -> Result<()> {
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

    /// Materializes the current batch's distinct keys into this participant's result buffer
    /// (created at the first batch), reads the pairs back and hands them to the emitter.
    fn probe_batch(&mut self) {
        self.stats.batches += 1;
        if self.result.is_none() {
            let seg = self.create_temp("pairs", pairs::bytes_for(RESULT_PAIRS), None);
            self.result = Some(seg);
        }
        let (table, result) = (self.table.expect("built"), self.result.expect("created"));
        let kt = self.key;
        let mut buf = self.emitter.take_buffer();
        let keys = self.batch.distinct();
        let t = Instant::now();
        let got = crate::sql::try_executor(|ex| {
            exec::pairs_reset(ex, &result)?;
            let (m, _) = exec::materialize(ex, &table, &result, kt, keys)?;
            let mut raw = [0u8; pairs::HEADER_BYTES as usize];
            exec::read(ex, &result, 0, &mut raw)?;
            let name = result.name().to_string();
            let h = pairs::parse_header(&name, &raw, pairs::HEADER_BYTES)?;
            if h.next != m || h.written != m {
                return Err(UvmError::new(
                    Code::ObjectNotInPrerequisiteState,
                    format!(
                        "GpuJoin result buffer \"{name}\" holds {} pairs ({} written), the probe found {m}",
                        h.next, h.written
                    ),
                ));
            }
            fallible::try_resize(&mut buf, m as usize, [0, 0], "a batch's matches")?;
            // SAFETY: viewing our own [i64; 2] buffer as bytes.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, buf.len() * pairs::PAIR_BYTES as usize) };
            exec::read(ex, &result, pairs::HEADER_BYTES as i64, bytes)?;
            Ok(buf)
        });
        self.stats.gpu += t.elapsed();
        let buf = got.unwrap_or_else(|e| report(e));
        self.emitter.reset(buf);
    }

    /// Forgets the inner table, dropping it if this process owns it (End, or a rebuild).
    fn drop_table(&mut self) {
        if let Some(seg) = self.table.take() {
            if std::mem::replace(&mut self.owns_table, false) {
                cleanup::drop_now(&seg);
            }
        }
    }
}

impl JoinScan for GpuJoinScan {
    const NAME: &'static CStr = c"UvmGpuJoin";

    fn methods() -> &'static Methods {
        &METHODS
    }

    unsafe fn plan(
        root: *mut pg_sys::PlannerInfo,
        rel: *mut pg_sys::RelOptInfo,
        path: *mut pg_sys::CustomPath,
        tlist: *mut pg_sys::List,
        _clauses: *mut pg_sys::List,
        custom_plans: *mut pg_sys::List,
    ) -> *mut pg_sys::CustomScan {
        // SAFETY: PlanCustomPath's arguments; the path is ours (custom_private: the key clauses
        // first, then the other restrict clauses; custom_paths: outer, inner).
        unsafe {
            let plans = PgList::<pg_sys::Plan>::from_pg(custom_plans);
            let (outer_plan, inner_plan) = (plans.get_ptr(0).expect("outer plan"), plans.get_ptr(1).expect("inner plan"));
            let paths = PgList::<pg_sys::Path>::from_pg((*path).custom_paths);
            let (outer_rel, inner_rel) = ((*paths.get_ptr(0).expect("outer")).parent, (*paths.get_ptr(1).expect("inner")).parent);
            let clauses = Clauses::of((*path).custom_private, outer_rel, inner_rel);
            if clauses.keys.is_empty() {
                report(UvmError::new(Code::SystemError, "GpuJoin: a path without a key clause"));
            }
            let mut qual_rinfos = PgList::<pg_sys::RestrictInfo>::new();
            for r in clauses.qual() {
                qual_rinfos.push(r);
            }
            let quals = pg_sys::extract_actual_clauses(qual_rinfos.into_pg(), false);
            // Every Var the join's output, the qual and the join clause use, once. The output is
            // the path's target, not only `tlist`: PostgreSQL 14 plans a projection above a
            // custom scan by asking for no target list (CP_IGNORE_TLIST) and then putting the
            // projection's own, made of the path target's Vars, in its place.
            //
            // In the aggregate mode (`with_aggregates`: the target is a list of Aggrefs) the scan
            // tuple is the aggregates' results, then the columns (the Aggrefs' arguments and the
            // keys, which the join clause in custom_exprs names): setrefs turns the target list's
            // Aggrefs into references to the first ones, as for postgres_fdw's pushed-down
            // aggregates.
            let target = (*(*path).path.pathtarget).exprs as *mut pg_sys::Node;
            let aggrefs: Vec<*mut pg_sys::Aggref> = PgList::<pg_sys::Node>::from_pg(target as *mut pg_sys::List)
                .iter_ptr()
                .filter(|n| (**n).type_ == pg_sys::NodeTag::T_Aggref)
                .map(|n| n as *mut pg_sys::Aggref)
                .collect();
            if !aggrefs.is_empty() && !PgList::<pg_sys::Node>::from_pg(quals).is_empty() {
                report(UvmError::new(Code::SystemError, "GpuJoin: aggregates over a join with other clauses"));
            }
            let same = |a: *mut pg_sys::Var, b: *mut pg_sys::Var| (*a).varno == (*b).varno && (*a).varattno == (*b).varattno;
            let mut vars: Vec<*mut pg_sys::Var> = Vec::new();
            let mut add = |v: *mut pg_sys::Var| {
                if !vars.iter().any(|w| same(*w, v)) {
                    vars.push(v);
                }
            };
            for &(_, ov, iv) in &clauses.keys {
                add(ov);
                add(iv);
            }
            for n in [target, tlist as *mut pg_sys::Node, quals as *mut pg_sys::Node] {
                let found = pg_sys::pull_var_clause(n, pg_sys::PVC_RECURSE_AGGREGATES as i32);
                for v in PgList::<pg_sys::Node>::from_pg(found).iter_ptr() {
                    add(as_var(v).expect("plain Vars only (checked by the path)"));
                }
            }
            let mut scan_tlist = PgList::<pg_sys::TargetEntry>::new();
            let mut aggs = Vec::with_capacity(aggrefs.len());
            for (i, &a) in aggrefs.iter().enumerate() {
                let args = PgList::<pg_sys::TargetEntry>::from_pg((*a).args);
                let col = match args.get_ptr(0) {
                    None => -1,
                    Some(te) => {
                        let v = as_var((*te).expr as *mut pg_sys::Node).expect("a plain Var (checked by the path)");
                        let at = vars.iter().position(|w| (**w).varno == (*v).varno && (**w).varattno == (*v).varattno);
                        at.expect("pulled above") as i32
                    }
                };
                aggs.push((u32::from((*a).aggfnoid), col));
                let copy = pg_sys::copyObjectImpl(a as *const std::ffi::c_void) as *mut pg_sys::Expr;
                scan_tlist.push(pg_sys::makeTargetEntry(copy, (i + 1) as i16, std::ptr::null_mut(), false));
            }
            let naggs = aggrefs.len();
            let mut map = Vec::with_capacity(vars.len());
            for (i, v) in vars.iter().enumerate() {
                let side = if let Some(r) = resno_in((*outer_plan).targetlist, *v) {
                    (0u8, r as i32)
                } else if let Some(r) = resno_in((*inner_plan).targetlist, *v) {
                    (1u8, r as i32)
                } else {
                    report(UvmError::new(Code::SystemError, "GpuJoin: a column of the join is in neither child's target list"))
                };
                map.push(side);
                let copy = pg_sys::copyObjectImpl(*v as *const std::ffi::c_void) as *mut pg_sys::Expr;
                scan_tlist.push(pg_sys::makeTargetEntry(copy, (naggs + i + 1) as i16, std::ptr::null_mut(), false));
            }
            let resno_of = |v: *mut pg_sys::Var| map[vars.iter().position(|w| same(*w, v)).expect("a key column")].1;
            let keys = clauses.keys.iter().map(|&(_, ov, iv)| ((*ov).vartype, (*iv).vartype, resno_of(ov), resno_of(iv)));
            let keys = keys.collect();
            let p = Private {
                keys,
                inner_names: relation_names(root, (*inner_rel).relids),
                // From the path: a partial inner path here is a parallel-aware scan (add_path
                // takes no other), whatever the planner puts above it in the plan.
                inner_partial: (*path).path.parallel_aware && (*paths.get_ptr(1).expect("inner")).parallel_aware,
                map,
                aggs,
            };
            let cscan = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomScan>()) as *mut pg_sys::CustomScan;
            (*cscan).scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
            (*cscan).scan.plan.targetlist = tlist;
            (*cscan).scan.plan.qual = quals;
            (*cscan).scan.scanrelid = 0;
            (*cscan).flags = (*path).flags;
            (*cscan).custom_plans = custom_plans;
            (*cscan).custom_scan_tlist = scan_tlist.into_pg();
            // The key clauses, for EXPLAIN: one clause, or their AND.
            let mut key_exprs = PgList::<pg_sys::Node>::new();
            for &(r, _, _) in &clauses.keys {
                key_exprs.push(pg_sys::copyObjectImpl((*r).clause as *const std::ffi::c_void) as *mut pg_sys::Node);
            }
            let cond = match key_exprs.len() {
                1 => key_exprs.get_ptr(0).expect("one clause"),
                _ => pg_sys::make_andclause(key_exprs.into_pg()) as *mut pg_sys::Node,
            };
            let mut exprs = PgList::<pg_sys::Node>::new();
            exprs.push(cond);
            (*cscan).custom_exprs = exprs.into_pg();
            (*cscan).custom_private = p.to_list();
            (*cscan).custom_relids = (*rel).relids;
            cscan
        }
    }

    unsafe fn create(cscan: *mut pg_sys::CustomScan) -> Self {
        // SAFETY: our plan, made by `plan`.
        let p = unsafe { Private::from_list((*cscan).custom_private) };
        let (outer_key, inner_key) = (p.key_cols(0), p.key_cols(1));
        let key = outer_key.composer.key_type();
        let aggs = node_aggs(&p);
        let probe = probe_plan(&p, &aggs);
        let max_outer_att = p.map.iter().filter(|m| m.0 == 0).map(|m| m.1).max().unwrap_or(0).max(outer_key.max_att());
        let max_inner_att = p.map.iter().filter(|m| m.0 == 1).map(|m| m.1).max().unwrap_or(0).max(inner_key.max_att());
        // SAFETY: our plan.
        let parallel_aware = unsafe { (*cscan).scan.plan.parallel_aware };
        GpuJoinScan {
            p,
            key,
            outer_key,
            inner_key,
            outer: std::ptr::null_mut(),
            inner: std::ptr::null_mut(),
            inner_ctx: std::ptr::null_mut(),
            batch_ctx: std::ptr::null_mut(),
            rows: InnerRows::default(),
            inner_cols: Vec::new(),
            inner_resnos: Vec::new(),
            outer_cols: Vec::new(),
            outer_resnos: Vec::new(),
            outer_vals: Vec::new(),
            outer_nulls: Vec::new(),
            col_index: Vec::new(),
            table: None,
            owns_table: false,
            result: None,
            parallel_aware,
            shared: std::ptr::null_mut(),
            estate: std::ptr::null_mut(),
            ready: false,
            outer_done: false,
            reported: false,
            batch: Batch::default(),
            emitter: Emitter::default(),
            max_outer_att,
            max_inner_att,
            stats: Stats::default(),
            aggs,
            agg_done: false,
            probe,
            payload_values: false,
            awaiting: None,
            in_flight: None,
            pending: Vec::new(),
            chunk: Chunk::default(),
        }
    }

    unsafe fn begin(&mut self, node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
        // SAFETY: BeginCustomScan's arguments; the children are initialized in the query's
        // memory context (the current one) and listed in custom_ps for EXPLAIN.
        unsafe {
            let cscan = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
            let plans = PgList::<pg_sys::Plan>::from_pg((*cscan).custom_plans);
            self.outer = pg_sys::ExecInitNode(plans.get_ptr(0).expect("outer"), estate, eflags);
            self.inner = pg_sys::ExecInitNode(plans.get_ptr(1).expect("inner"), estate, eflags);
            let mut ps = PgList::<pg_sys::PlanState>::new();
            ps.push(self.outer);
            ps.push(self.inner);
            (*node).custom_ps = ps.into_pg();
            let ctx = |name: &CStr| {
                pg_sys::AllocSetContextCreateInternal(
                    pg_sys::CurrentMemoryContext,
                    name.as_ptr(),
                    pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                    pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                    pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
                )
            };
            self.inner_ctx = ctx(c"GpuJoin inner tuples");
            self.batch_ctx = ctx(c"GpuJoin outer batch");
            self.estate = estate;
            // The columns to keep from each side, with how to copy them.
            let (odesc, idesc) = (pg_sys::ExecGetResultType(self.outer), pg_sys::ExecGetResultType(self.inner));
            for (side, resno) in self.p.map.clone() {
                let (desc, resnos) = if side == 0 { (odesc, &mut self.outer_resnos) } else { (idesc, &mut self.inner_resnos) };
                let at = match resnos.iter().position(|&r| r == resno) {
                    Some(at) => at,
                    None => {
                        // The executor's descriptor, borrowed (not released by the wrapper).
                        let desc = pgrx::PgTupleDesc::from_pg_unchecked(desc);
                        let Some(a) = usize::try_from(resno - 1).ok().and_then(|i| desc.get(i)) else {
                            report(UvmError::new(Code::SystemError, "GpuJoin: a column outside its side's row"));
                        };
                        resnos.push(resno);
                        let col = Col { byval: a.attbyval, len: a.attlen };
                        if side == 0 {
                            self.outer_cols.push(col);
                        } else {
                            self.inner_cols.push(col);
                        }
                        resnos.len() - 1
                    }
                };
                self.col_index.push(at);
            }
        }
    }

    unsafe fn exec(&mut self, node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
        // SAFETY: ExecCustomScan's argument; the scan slot has the custom_scan_tlist's shape
        // (PostgreSQL made it from it); the stored tuples live until the next batch or build.
        unsafe {
            if !self.ready {
                let t = Instant::now();
                if self.shared.is_null() {
                    self.build_local();
                } else if !self.aggs.is_empty() && self.probe.is_some() {
                    // exec_aggregates reads outer keys until the table is built.
                    self.scan_share(true);
                    self.awaiting = Some(t);
                } else {
                    self.attach_shared();
                }
                if self.awaiting.is_none() {
                    self.stats.build = self.stats.build.max(t.elapsed());
                }
                self.ready = true;
                self.reported = false;
            }
            if !self.aggs.is_empty() {
                return self.exec_aggregates(node);
            }
            if self.rows.is_empty() {
                self.report_stats();
                return std::ptr::null_mut(); // no inner row has a non-NULL key
            }
            let econtext = (*node).ss.ps.ps_ExprContext;
            let scan = (*node).ss.ss_ScanTupleSlot;
            loop {
                pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
                let Some((pos, row)) = self.emitter.next(&self.batch) else {
                    if self.outer_done {
                        self.report_stats();
                        return std::ptr::null_mut();
                    }
                    pg_sys::check_for_interrupts!();
                    self.next_batch();
                    continue;
                };
                let n = self.outer_cols.len();
                let base = pos as usize * n;
                let (true, Some(ir)) = (base + n <= self.outer_vals.len(), self.rows.get(row)) else {
                    report(UvmError::new(
                        Code::ObjectNotInPrerequisiteState,
                        "GpuJoin: a pair names no row (the result buffer was overwritten)",
                    ));
                };
                pg_sys::ExecClearTuple(scan);
                for (i, &(side, _)) in self.p.map.iter().enumerate() {
                    let (d, isnull) = if side == 0 {
                        let at = base + self.col_index[i];
                        (self.outer_vals[at], self.outer_nulls[at])
                    } else {
                        self.rows.value(ir, self.col_index[i])
                    };
                    *(*scan).tts_values.add(i) = d;
                    *(*scan).tts_isnull.add(i) = isnull;
                }
                pg_sys::ExecStoreVirtualTuple(scan);
                (*econtext).ecxt_scantuple = scan;
                let qual = (*node).ss.ps.qual;
                if !qual.is_null() && !pg_sys::ExecQual(qual, econtext) {
                    if !(*node).ss.ps.instrument.is_null() {
                        (*(*node).ss.ps.instrument).nfiltered1 += 1.0;
                    }
                    continue;
                }
                let proj = (*node).ss.ps.ps_ProjInfo;
                return if proj.is_null() { scan } else { pg_sys::ExecProject(proj) };
            }
        }
    }

    unsafe fn rescan(&mut self, node: *mut pg_sys::CustomScanState) {
        // SAFETY: ReScanCustomScan's argument; children initialized in begin.
        unsafe {
            self.finish_probe();
            let chg = (*node).ss.ps.chgParam;
            if !chg.is_null() {
                pg_sys::UpdateChangedParamSet(self.outer, chg);
                pg_sys::UpdateChangedParamSet(self.inner, chg);
            }
            if self.parallel_aware {
                // A parallel plan builds its inner side again at every rescan (the leader's
                // ReInitializeDSM resets the shared state; any participant may build it).
                if (*self.inner).chgParam.is_null() {
                    pg_sys::ExecReScan(self.inner);
                }
                self.ready = false;
                self.rows = InnerRows::default();
                self.awaiting = None;
                self.pending.clear();
            } else if !(*self.inner).chgParam.is_null() {
                // New parameters for the inner side: build again (ExecProcNode rescans it).
                self.drop_table();
                self.ready = false;
            }
            if (*self.outer).chgParam.is_null() {
                pg_sys::ExecReScan(self.outer);
            }
            self.outer_done = false;
            self.agg_done = false;
            for a in &mut self.aggs {
                a.acc = Acc::new(a.acc.kind, a.acc.arg);
            }
            self.batch.clear();
            let buf = self.emitter.take_buffer();
            self.emitter.reset(buf);
            self.outer_vals.clear();
            self.outer_nulls.clear();
        }
    }

    unsafe fn end(&mut self, _node: *mut pg_sys::CustomScanState) {
        // SAFETY: EndCustomScan; children and slots made in begin (null in EXPLAIN-only runs
        // that failed before begin).
        unsafe {
            self.finish_probe();
            self.drop_table();
            if let Some(seg) = self.result.take() {
                cleanup::drop_now(&seg);
            }
            for c in [self.outer, self.inner] {
                if !c.is_null() {
                    pg_sys::ExecEndNode(c);
                }
            }
        }
    }

    unsafe fn estimate_dsm(&mut self, _node: *mut pg_sys::CustomScanState, pcxt: *mut pg_sys::ParallelContext) -> usize {
        // SAFETY: PostgreSQL's parallel context.
        shared::shared_bytes(unsafe { (*pcxt).nworkers }.max(0) as usize + 1)
    }

    unsafe fn initialize_dsm(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        pcxt: *mut pg_sys::ParallelContext,
        coordinate: *mut std::ffi::c_void,
    ) {
        // The leader creates the table segment (so that it owns and drops it) and sets up the
        // shared state; a participant grows the segment when it builds.
        self.drop_table();
        let seg = self.create_temp("inner", table::table_bytes(0), None);
        self.table = Some(seg);
        self.owns_table = true;
        // SAFETY: `coordinate` holds the bytes estimate_dsm asked for, in the DSM.
        // (One slot per participant: the leader and every worker the context may start.)
        unsafe {
            let participants = (*pcxt).nworkers.max(0) as u32 + 1;
            Shared::init(coordinate as *mut Shared, seg, self.p.inner_partial, participants)
        };
        self.shared = coordinate as *mut Shared;
        self.ready = false;
    }

    unsafe fn reinitialize_dsm(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _pcxt: *mut pg_sys::ParallelContext,
        coordinate: *mut std::ffi::c_void,
    ) {
        // SAFETY: our shared state; no worker runs (the Gather stopped them before a rescan);
        // this process's view of the old rows is dropped first.
        unsafe {
            self.rows = InnerRows::default();
            self.ready = false;
            Shared::reset(coordinate as *mut Shared, (*self.estate).es_query_dsa);
        }
        self.shared = coordinate as *mut Shared;
    }

    unsafe fn initialize_worker(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _toc: *mut pg_sys::shm_toc,
        coordinate: *mut std::ffi::c_void,
    ) {
        self.shared = coordinate as *mut Shared;
        self.owns_table = false;
        self.ready = false;
    }

    unsafe fn shutdown(&mut self, _node: *mut pg_sys::CustomScanState) {
        // The parallel context goes away next: keep the totals for EXPLAIN ANALYZE and forget
        // the shared state (a rescan after this sets up a new one).
        if self.shared.is_null() {
            return;
        }
        self.report_stats();
        self.copy_shared_stats();
        // SAFETY: mapped until the Gather above cleans up, after this call.
        unsafe {
            let sh = &*self.shared;
            self.stats.batches = sh.batches.load(std::sync::atomic::Ordering::Relaxed);
            self.stats.gpu = Duration::from_nanos(sh.gpu_ns.load(std::sync::atomic::Ordering::Relaxed));
            self.stats.build = Duration::from_nanos(sh.build_ns.load(std::sync::atomic::Ordering::Relaxed));
            self.stats.ahead = sh.ahead.load(std::sync::atomic::Ordering::Relaxed);
        }
        self.shared = std::ptr::null_mut();
        self.rows = InnerRows::default();
        self.ready = false;
        self.awaiting = None;
        self.pending.clear();
    }

    unsafe fn explain(
        &mut self,
        node: *mut pg_sys::CustomScanState,
        ancestors: *mut pg_sys::List,
        es: *mut pg_sys::ExplainState,
    ) {
        // SAFETY: ExplainCustomScan's arguments; custom_exprs holds the join clause with Vars
        // rewritten to the scan tuple, which ruleutils resolves through custom_scan_tlist.
        unsafe {
            let plan = (*node).ss.ps.plan;
            let cscan = plan as *mut pg_sys::CustomScan;
            let ctx = pg_sys::set_deparse_context_plan((*es).deparse_cxt, plan, ancestors);
            let clause = PgList::<pg_sys::Node>::from_pg((*cscan).custom_exprs).get_ptr(0).expect("join clause");
            let text = pg_sys::deparse_expression(clause, ctx, true, false);
            // deparse_expression puts an operator clause in parentheses already.
            let cond = CStr::from_ptr(text).to_string_lossy().into_owned();
            let prop = |label: &CStr, value: &str| {
                let v = std::ffi::CString::new(value.replace('\0', "")).expect("no NUL");
                pg_sys::ExplainPropertyText(label.as_ptr(), v.as_ptr(), es);
            };
            prop(c"GpuJoin Cond", &cond);
            if self.p.keys.len() > 1 {
                let form = self.outer_key.composer.form().label();
                prop(c"GpuJoin Key", &format!("{} columns, {form}", self.p.keys.len()));
            }
            prop(c"Inner Relation", &self.p.inner_names);
            if !self.aggs.is_empty() {
                let tl = PgList::<pg_sys::TargetEntry>::from_pg((*cscan).custom_scan_tlist);
                let names: Vec<String> = tl
                    .iter_ptr()
                    .take(self.aggs.len())
                    .map(|te| {
                        let t = pg_sys::deparse_expression((*te).expr as *mut pg_sys::Node, ctx, true, false);
                        CStr::from_ptr(t).to_string_lossy().into_owned()
                    })
                    .collect();
                prop(c"Aggregates", &names.join(", "));
            }
            if (*es).analyze {
                let int = |label: &CStr, unit: Option<&CStr>, v: u64| {
                    pg_sys::ExplainPropertyInteger(label.as_ptr(), unit.map_or(std::ptr::null(), |u| u.as_ptr()), v as i64, es)
                };
                int(c"Inner Rows", None, self.stats.inner_rows);
                if !self.aggs.is_empty() {
                    // Probe mode: the aggregates came from the probes' match counts and payload sums.
                    prop(c"Aggregated", if self.payload_values { "in the probe" } else { "per match" });
                }
                int(c"Inner Table", Some(c"bytes"), self.stats.table_bytes);
                if !self.stats.tier.is_empty() {
                    prop(c"Inner Table Tier", &self.stats.tier);
                }
                int(c"Batches", None, self.stats.batches);
                if (*es).timing {
                    pg_sys::ExplainPropertyFloat(c"GPU Time".as_ptr(), c"ms".as_ptr(), self.stats.gpu.as_secs_f64() * 1e3, 3, es);
                    let build = self.stats.build.as_secs_f64() * 1e3;
                    pg_sys::ExplainPropertyFloat(c"Inner Ready".as_ptr(), c"ms".as_ptr(), build, 3, es);
                    let table = self.stats.table_build.as_secs_f64() * 1e3;
                    pg_sys::ExplainPropertyFloat(c"Inner Table Build".as_ptr(), c"ms".as_ptr(), table, 3, es);
                    // How many batches were read ahead depends on timing: shown with the timings.
                    if self.probe.is_some() && self.parallel_aware {
                        int(c"Batches Read Ahead", None, self.stats.ahead);
                    }
                }
            }
        }
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
