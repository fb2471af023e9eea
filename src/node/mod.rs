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
//! - [`shared`]: what the participants of a parallel GpuJoin share (one inner side per query).
//! - [`spill`]: its memory, bounded by PostgreSQL's hash memory; past it, the host tier.
//! - [`cleanup`]: the temporary segments of plan nodes, dropped however the query ends.

pub mod agg;
pub mod cleanup;
pub mod fallible;
pub mod gpujoin;
pub mod groupagg;
pub mod joinkey;
pub mod matching;
pub mod preagg;
pub mod shared;
pub mod spill;

/// Installs the planner hook and the cleanup callbacks (from `_PG_init`).
pub fn init() {
    gpujoin::install();
    preagg::install();
    groupagg::install();
    cleanup::install();
}
