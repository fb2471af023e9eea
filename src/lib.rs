//! pg_uvm_share: shared managed memory segments for PostgreSQL.
//!
//! The crate is layered so that the architecture is visible in the module tree:
//!
//! - [`vocab`]: the plain values every layer shares (tier, place, arena, chunk info, provider kind), so
//!   that the provider need not import the registry nor the registry the provider.
//! - [`registry`]: the table of segments and chunks in PostgreSQL shared memory.
//! - [`broker`]: the background worker that holds every chunk's fd, and its protocol.
//! - [`provider`]: where chunk memory comes from (memfd now, CUDA VMM next) and how it is mapped.
//! - [`placement`]: which GPU a device chunk goes to under the per-GPU budgets, and which GPU
//!   runs a service request (plain decisions over counts).
//! - [`segment`]: one process's attachments, the pin/generation protocol, growth and drop.
//! - [`exec`]: the execution seam: requests, run in this process or in the GPU service.
//! - [`service`]: the GPU service (one process, one CUDA context per GPU) and its request channel.
//! - [`gpu`]: CUDA in this process: driver loading, the primary context, NVRTC kernels with
//!   typed launches, CUDA handles owned by RAII. Knows nothing of GpuJoin.
//! - [`gpujoin`]: the GpuJoin inner hash table in a segment (layout, CPU build and probe, the
//!   materializing result buffer) and the host side of its kernels, on top of [`gpu`].
//! - [`interrupt`]: cancel and `statement_timeout` for long plain-Rust loops (a hook `_PG_init` sets).
//! - [`pgwait`]: the background workers' wait set (latch, postmaster death, one fd).
//! - [`checksum`]: the segment checksum and fill pattern shared by the CPU and GPU paths.
//! - [`customscan`]: custom scan plan nodes: the method tables and trampolines, written once.
//! - [`node`]: plan nodes over the extension's operations (GpuJoin as a join node).
//! - [`runtime`]: the backend runtime under the PostgreSQL surfaces: this process's segment
//!   manager, the executor choice, error reporting, authorisation.
//! - [`sql`]: the thin SQL surface: functions and views in schema `uvm`.
//! - `init`: `_PG_init`, at the top: GUCs, shared memory, workers, and every surface's hooks.
//! - [`capi`]: the C API (`include/pg_uvm_share.h`): a versioned function table for extensions
//!   written in C, beside [`sql`] and as thin: pins per resource owner, handles checked on use.
//!
//! The plain-Rust layers (`vocab`, `error`, `registry`'s layout, `placement`, `broker`'s
//! protocol, server and client, `provider`, `gpu`, `segment`, `gpujoin`, `exec`, the service's
//! `channel`, `checksum`, `interrupt`) live in the pgrx-free core crate `uvm_core`
//! (`crates/uvm_core`), re-exported here under their names; this crate is the PostgreSQL glue.
//! `docs/ARCHITECTURE.md` ("Layers") draws what may import what; `scripts/check-layers` checks it.

pub mod broker;
pub mod caches;
pub mod capi;
pub mod customscan;
pub mod guc;
mod init;
pub mod node;
pub mod pgwait;
pub mod registry;
pub mod runtime;
pub mod service;
pub mod sql;

// The plain-Rust layers, from the pgrx-free core crate (`crates/uvm_core`), under their
// names here, so that `crate::error`, `crate::segment` and the others read as before.
pub use uvm_core::{
    cache, checksum, error, exec, gpu, gpujoin, groups, interrupt, placement, provider, scan, segment, stats, uvm_err, vocab,
};

::pgrx::pg_module_magic!();

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'pg_uvm_share'"]
    }
}
