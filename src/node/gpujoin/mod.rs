//! GpuJoin as a plan node: plain SQL equi-joins (inner, left, semi, anti) run through the GpuJoin
//! operations.
//!
//! # What runs where
//!
//! - **Planner** (`set_join_pathlist_hook`, this backend): for an inner join (or a left, semi or
//!   anti join whose clauses are all in an exact key: [`JoinKind`]) whose restriction
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
//!   the others wait (`super::shared`). Either holds at most the hash memory (`work_mem` ×
//!   `hash_mem_multiplier`, times the participants in parallel); past it the rows and pairs go
//!   to a spill segment in the host tier (`super::spill`). Then each participant reads its
//!   outer child (its share of a parallel scan) a batch at a time ([`BATCH_TUPLES`] tuples
//!   with a non-NULL key, their used columns kept), materializes the batch's keys into its own
//!   result buffer (a temporary segment, reset before each batch) in one round trip
//!   (`exec::materialize_within`, which the GPU service's executor threads run, not its main
//!   thread), reads the (key's index among them, payload) pairs back (a window at a time:
//!   `super::spill::match_window`) and emits one joined row per call, from the outer columns
//!   of each tuple with that key and the inner row (`super::matching`), after the qual,
//!   projected. The keys are every tuple's (`Batch::set_positional`: no key table, and against
//!   unique inner keys a pair is a joined row) until a batch's pairs outgrow the result
//!   buffer's first size, [`RESULT_PAIRS`] (repeated inner keys); from that batch
//!   on, each batch's distinct keys, whose pairs expand to every tuple with the key (EXPLAIN
//!   ANALYZE: `Outer Keys`). The payload is the inner row's id, or where the join keeps one by-value inner
//!   column besides key columns of the outer key's type, that column's value (`row_payload`:
//!   the row is then made from the outer tuple and the pair alone). A row's executor calls run
//!   under one pgrx guard (`emit_row`). Once a batch's pairs are all read back (they fit one
//!   window, as a rule), the next batch is read into a second batch's storage and its pairs
//!   started (`read_ahead`, `exec::materialize_within_start`): the GPU service forms them while
//!   this batch's rows are returned, so the GPU's time hides behind the CPU's (two batches'
//!   tuples and contexts held, not one). In parallel, a participant waiting for another's build
//!   reads outer batches ahead (`gather_rows_while_building`). Rows are read from the children a
//!   chunk at a time under one pgrx guard ([`fetch_chunk`]). A left, semi or anti join keeps a
//!   matched flag per tuple of the batch: a left join returns the pairs, then each tuple
//!   without a match with NULL inner columns; a semi join a tuple at its first pair; an anti
//!   join the tuples without one. Their outer side keeps its NULL-key tuples (unmatched).
//! - **Aggregate mode** (`super::preagg` plans it: the path's target is a list of Aggrefs):
//!   instead of joined rows, each participant folds its matches into the aggregates
//!   (`super::agg`) and returns one row of results. In its **probe mode** (every aggregate is
//!   `count(*)`, or `count`/`sum` of one inner column: `probe_plan`) the table's payloads are
//!   that column's values where none is NULL (read by each participant as it stores its rows,
//!   `drain_into`), and each batch of outer keys is probed whole (`exec::probe_start`: matches
//!   and payload sum; one batch in flight while the next is read), no pair read back; in
//!   parallel, a participant that finished its share of the inner side reads up to
//!   [`PENDING_BATCHES`] batches of outer keys while another builds the table. Where each
//!   worker would start a CUDA context of its own ([`leader_probes`]), the workers instead hand
//!   their batches of keys to the leader, which builds the table and probes every batch
//!   (`super::handoff`): the workers scan, one process runs kernels.
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
//! # Files
//!
//! By lifecycle: [`plan`] (the planner hook, which clauses form the key, the cost model and the
//! paths the aggregate push-down reuses), [`private`] (the plan's serialised form, and the
//! `CustomScan` made from a path), [`scan`] (the scan state and the executor's callbacks),
//! [`build`] (the inner side, serial or shared by a parallel query), [`probe`] (the outer side's
//! batches, joined rows and aggregates), [`fetch`] (reading a child's rows a chunk at a time),
//! [`results`] (the aggregates' values as datums, shared with `super::preagg`) and [`explain`].
//!
//! Every participant adds its rows, batches and GPU time to the node's cumulative counters at
//! End (`uvm.stat_gpujoin`, `crate::stats`); the planner hook counts the paths it offers and
//! declines (and why), `PlanCustomPath` the plans made with the node.
//!
//! `super::preagg` uses the declared interface re-exported here: [`enabled`], [`as_var`],
//! [`candidates`], [`can_aggregate`], [`with_aggregates`], [`without_worker_contexts`],
//! [`leader_probes`], [`int_node`], [`emit_results`] and [`value_of_datum`].

mod build;
mod cached;
mod explain;
mod fetch;
mod plan;
mod private;
mod probe;
mod results;
mod scan;

// The node's vocabulary, which each of its files takes with `use super::*`.
use std::ffi::CStr;
use std::time::{Duration, Instant};

use pgrx::pg_sys;
use pgrx::PgList;

use super::agg::{self, Acc, Arg, Kind, Out, Value};
use super::cleanup;
use super::fallible;
use super::handoff::Handoff;
use super::matching::{Batch, Emitter};
use super::shared::{self, Arena, Col, InnerRows, Role, RowWriter, Shared, TIERS};
use super::spill::{self, Budget, Spill};
use crate::customscan::{self, JoinScan, Methods};
use crate::error::{Code, Result, UvmError};
use crate::exec::{self, SegRef};
use crate::gpujoin::pairs;
use crate::gpujoin::table::{self, KeyType};
use crate::guc::{self, GpuJoinChoice};
use crate::registry::TierPref;
use crate::runtime::{current_user, now, report, with_executor};
use crate::vocab::Tier;

use super::joinkey::Composer;

use cached::*;
use fetch::*;
use plan::*;
use private::*;
use results::*;
use scan::*;

pub use cached::cached_cost;
pub use plan::{as_var, can_aggregate, candidates, with_aggregates, without_worker_contexts};
pub use private::int_node;
pub use results::datum_of_value;
pub use results::{emit_results, value_of_datum};

/// Outer tuples with a non-NULL key per batch.
pub const BATCH_TUPLES: usize = 1 << 16;
/// Batches of outer keys a parallel probe-mode participant reads while the table is being
/// built (16 MiB of keys at most).
pub const PENDING_BATCHES: usize = 32;
/// Pairs the result buffer holds at first (it grows on demand): a batch's, so that a batch
/// that probes every tuple's key against unique inner keys always fits, and one that does not
/// fit met repeated inner keys (`GpuJoinScan::materialize_batch`).
const RESULT_PAIRS: u64 = BATCH_TUPLES as u64;

static METHODS: Methods = customscan::methods::<GpuJoinScan>();

/// Installs the planner hook (chaining the previous one) and registers the scan methods.
pub fn install() {
    plan::install_hook();
    customscan::register::<GpuJoinScan>();
}

/// Counts in the node's cumulative counters (`uvm.stat_gpujoin`); a registry that cannot be
/// reached (no preload) counts nothing.
fn count(f: impl FnOnce(&crate::stats::NodeCounters)) {
    if let Ok(reg) = crate::registry::shmem::shared() {
        f(reg.node_counters());
    }
}

/// Whether a parallel probe-mode GpuJoin's workers hand their outer keys to the leader, which
/// probes them (`super::handoff`): where the leader runs the plan below the Gather, and
/// `pg_uvm_share.gpujoin_leader_probes` says so (`auto`: where each process would start a CUDA
/// context of its own). Read by the planner (the cost of worker contexts) and by the leader
/// as it sets up the DSM.
pub fn leader_probes() -> bool {
    // SAFETY: reads a GUC of this process.
    let leader_runs = unsafe { pg_sys::parallel_leader_participation };
    leader_runs
        && match guc::GPUJOIN_LEADER_PROBES.get() {
            GpuJoinChoice::On => true,
            GpuJoinChoice::Off => false,
            GpuJoinChoice::Auto => crate::runtime::per_process_cuda(),
        }
}

/// Whether the planner may offer GpuJoin now.
pub fn enabled() -> bool {
    match guc::ENABLE_GPUJOIN.get() {
        GpuJoinChoice::On => true,
        GpuJoinChoice::Off => false,
        // On where a GPU does the work (the cluster's provider is CUDA), where the cost model
        // (`plan`'s module comment) is calibrated; the host provider's CPU path is never faster than
        // PostgreSQL's own joins. Unknown until some process claimed the provider: off.
        GpuJoinChoice::Auto => crate::runtime::gpu_does_the_work(),
    }
}
