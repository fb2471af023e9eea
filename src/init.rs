//! `_PG_init`: the process's set-up, at the top of the layers (it registers every surface).
//!
//! Defines the GUCs, installs the interrupt hook, reserves the address arena, installs the
//! shared memory (the registry and the GPU service's channel), registers the broker and the
//! GPU service, publishes the C API and installs the plan nodes' hooks and the column caches'
//! (writers mark a cached table's cache stale).

use pgrx::pg_sys;

use crate::error::{Code, UvmError};
use crate::exec::Mode;
use crate::guc;
use crate::provider::reserve_arena;
use crate::registry::shmem;
use crate::registry::Capacity;
use crate::runtime::{check_for_interrupts, report};
use crate::service::shmem::ChannelSpec;

/// Upper bound of the address arena reserved in the postmaster.
const MAX_ARENA: u64 = 64 << 40;

#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: a global flag PostgreSQL sets while loading shared_preload_libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        report(
            UvmError::new(Code::ObjectNotInPrerequisiteState, "pg_uvm_share must be loaded via shared_preload_libraries")
                .hint("Add pg_uvm_share to shared_preload_libraries in postgresql.conf and restart the server."),
        );
    }
    guc::define();
    crate::interrupt::install(check_for_interrupts);
    let cap = Capacity {
        max_segments: guc::MAX_SEGMENTS.get() as u32,
        max_chunks: guc::MAX_CHUNKS.get() as u32,
        max_attachments: guc::MAX_ATTACHMENTS.get() as u32,
    };
    let arena = reserve_arena((cap.max_segments as u64).saturating_mul(guc::max_segment_size()).min(MAX_ARENA));
    let process_only = guc::GPU_EXECUTION.get() == guc::ExecutionChoice::Process;
    let spec = ChannelSpec {
        slots: guc::SERVICE_SLOTS.get().max(2) as u32,
        staging_bytes: (guc::SERVICE_STAGING_MB.get().max(1) as u64 * guc::MIB).min(1 << 30) as u32,
        mode: if process_only { Mode::Process } else { Mode::Undecided },
    };
    shmem::install(cap, arena, &[crate::service::shmem::block(spec), crate::caches::block()]);
    crate::broker::worker::register();
    crate::capi::publish();
    crate::node::init();
    crate::caches::init_hooks();
    if !process_only {
        crate::service::worker::register();
    }
}
