//! Plan nodes: ordinary SQL run through the extension's operations.
//!
//! - [`gpujoin`]: the GpuJoin custom scan (planner hook, executor), over `crate::customscan`.
//! - [`fallible`]: its buffers that follow the data, grown with ERROR 53200 instead of abort().
//! - [`joinkey`]: how its key clauses form the table's key, plain Rust.
//! - [`matching`]: its batch matching, plain Rust.
//! - [`agg`]: the aggregates it can compute itself, plain Rust.
//! - [`preagg`]: the aggregate push-down (planner hook, the GpuJoinAgg node that merges the
//!   participants' partial results).
//! - [`groupagg`]: GpuGroupAgg, `GROUP BY` and aggregates of one table from its column cache
//!   (planner hook, the node).
//! - [`handoff`]: a parallel GpuJoin's workers handing their outer keys to the leader, which
//!   probes them (the probe mode where each worker would start a CUDA context).
//! - [`shared`]: what the participants of a parallel GpuJoin share (one inner side per query).
//! - [`spill`]: its memory, bounded by PostgreSQL's hash memory; past it, the host tier.
//! - [`cleanup`]: the temporary segments of plan nodes, dropped however the query ends.

pub mod agg;
pub mod cleanup;
pub mod fallible;
pub mod gpujoin;
pub mod groupagg;
pub mod handoff;
pub mod joinkey;
pub mod matching;
pub mod preagg;
pub mod shared;
pub mod spill;

use pgrx::pg_sys;

static mut PREV_UPPER_HOOK: pg_sys::create_upper_paths_hook_type = None;

/// Installs the planner hooks and the cleanup callbacks (from `_PG_init`).
pub fn init() {
    gpujoin::install();
    preagg::install();
    groupagg::install();
    cleanup::install();
    // SAFETY: _PG_init runs once per process, before any planning; the hook chain is
    // process-local.
    unsafe {
        PREV_UPPER_HOOK = pg_sys::create_upper_paths_hook;
        pg_sys::create_upper_paths_hook = Some(upper_paths_hook);
    }
}

/// The nodes' one `create_upper_paths_hook` (chained after the previous one): at the grouping
/// stage, GpuJoinAgg's paths over GpuJoin ([`preagg`]) and GpuGroupAgg's over a cached fact
/// table ([`groupagg`]), each where its setting allows.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn upper_paths_hook(
    root: *mut pg_sys::PlannerInfo,
    stage: pg_sys::UpperRelationKind::Type,
    input_rel: *mut pg_sys::RelOptInfo,
    output_rel: *mut pg_sys::RelOptInfo,
    extra: *mut std::ffi::c_void,
) {
    // SAFETY: PostgreSQL's planner calls the hook with valid structures; the previous hook is
    // called with the same arguments; at UPPERREL_GROUP_AGG `extra` is the grouping's
    // GroupPathExtraData.
    unsafe {
        if let Some(prev) = PREV_UPPER_HOOK {
            prev(root, stage, input_rel, output_rel, extra);
        }
        if stage != pg_sys::UpperRelationKind::UPPERREL_GROUP_AGG {
            return;
        }
        if gpujoin::enabled() {
            preagg::add_paths(root, input_rel, output_rel);
        }
        if crate::guc::ENABLE_GPUGROUPAGG.get() {
            groupagg::add_path(root, input_rel, output_rel, extra as *mut pg_sys::GroupPathExtraData);
        }
    }
}
