//! Plan nodes: ordinary SQL run through the extension's operations.
//!
//! - [`gpujoin`]: the GpuJoin custom scan (planner hook, executor), over `crate::customscan`.
//! - [`matching`]: its batch matching, plain Rust.
//! - [`cleanup`]: the temporary segments of plan nodes, dropped however the query ends.

pub mod cleanup;
pub mod gpujoin;
pub mod matching;

/// Installs the planner hook and the cleanup callbacks (from `_PG_init`).
pub fn init() {
    gpujoin::install();
    cleanup::install();
}
