//! The SQL surface, schema `uvm` (`functions.rs`: segments; `gpujoin.rs`: the GpuJoin
//! functions and aggregates; `cache.rs`: column caches; `stats.rs`: the statistics views).
//!
//! It stays thin on purpose: argument conversion, and the calls into the backend runtime
//! (`crate::runtime`: the executor, privilege checks against the owner role, turning a
//! `UvmError` into `ereport(ERROR)` with its SQLSTATE). The logic lives in the plain-Rust
//! modules.

mod cache;
mod functions;
mod gpujoin;
mod stats;
// Only with `cargo pgrx test` (feature pg_test): plain `cargo test` has no PostgreSQL.
#[cfg(feature = "pg_test")]
mod tests;
