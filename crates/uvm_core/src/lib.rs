//! pg_uvm_share's core: everything that does not call into PostgreSQL, in a crate that cannot
//! (no pgrx in its dependency tree: `make lint` checks), so the compiler keeps the layer that
//! the extension crate's modules only claimed to be.
//!
//! - [`vocab`], [`error`]: the plain values and errors every layer shares.
//! - [`registry`]: the table of segments and chunks (its layout and operations; the extension
//!   puts it in PostgreSQL's shared memory).
//! - [`placement`]: which GPU a device chunk goes to, which GPU runs a request.
//! - [`broker`]: the fd broker's protocol, server loop and client (the extension runs the
//!   server in a background worker).
//! - [`provider`]: where chunk memory comes from (memfd, CUDA VMM) and how it is mapped.
//! - [`gpu`]: CUDA in this process: driver, context, NVRTC kernels, typed launches.
//! - [`segment`]: one process's attachments, pins, growth, migration, drop (over an `Env` that
//!   the extension implements with PostgreSQL).
//! - [`gpujoin`]: the GpuJoin table and result buffer, their CPU algorithms and the host side
//!   of their kernels.
//! - [`cache`]: the columnar cache's format (layout, encodings, a bounded CPU reader and
//!   writer).
//! - [`groups`]: the `GROUP BY`'s group table (format, CPU update, grow, merge).
//! - [`scan`]: scan programs (filters, star joins, grouped aggregates over a cache in one
//!   pass), the CPU reference of their kernels.
//! - [`exec`]: the execution seam (the request vocabulary, the `Executor` trait) and the local
//!   executor.
//! - [`channel`]: the GPU service's request channel, slot protocol (the extension puts it in
//!   shared memory and runs the service).
//! - [`checksum`], [`interrupt`]: the checksum and fill pattern; cancel for long loops.
//! - [`stats`]: cumulative counters in shared memory (segments, the service, the plan node).
//!
//! Unsafe code is denied here but in the modules that need it, each allowed with its reason.

#![deny(unsafe_code)]

// fds passed with SCM_RIGHTS (sendmsg/recvmsg control messages), epoll.
#[allow(unsafe_code)]
pub mod broker;
pub mod cache;
// the request channel lives in shared memory: slots read and written through raw pointers with atomics.
#[allow(unsafe_code)]
pub mod channel;
pub mod checksum;
pub mod error;
// request buffers viewed as bytes, and memory of pinned segments read and written by address.
#[allow(unsafe_code)]
pub mod exec;
// the CUDA driver API (cudarc's sys layer) and kernel launches with raw arguments.
#[allow(unsafe_code)]
pub mod gpu;
// tables and result buffers in shared segments, read and written through raw pointers (volatile, bounded).
#[allow(unsafe_code)]
pub mod gpujoin;
pub mod groups;
// the hook PostgreSQL installs, a function pointer set once at start.
#[allow(unsafe_code)]
pub mod interrupt;
pub mod placement;
// memfd_create, mmap and munmap of chunks into the reserved arena, and CUDA VMM mappings.
#[allow(unsafe_code)]
pub mod provider;
// the registry is laid out in shared memory given as a raw base pointer.
#[allow(unsafe_code)]
pub mod registry;
pub mod scan;
// mappings of chunks into the arena, and pins over memory other processes share.
#[allow(unsafe_code)]
pub mod segment;
// clock_gettime(CLOCK_MONOTONIC): the clock every process of the machine shares (service times).
#[allow(unsafe_code)]
pub mod stats;
pub mod vocab;

#[cfg(test)]
pub(crate) mod testing;
