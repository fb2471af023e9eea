//! The broker: one background worker that holds every chunk's file descriptor.
//!
//! # Why a broker
//!
//! A chunk's memory lives as long as some process holds its fd or maps it. PostgreSQL processes
//! come and go (a parallel worker lives for one query), so none of them can be the owner. The
//! broker, a background worker started by the postmaster with the cluster, keeps the fds; any
//! process that needs a chunk asks for a duplicate over a Unix socket in the data directory
//! (`SCM_RIGHTS`), maps it, and closes its copy. Sibling backends cannot take fds from one
//! another directly (`pidfd_getfd` needs ptrace rights that Yama denies), which is the other
//! reason for a broker.
//!
//! # Lifecycle
//!
//! - Started by the postmaster once the cluster is consistent (before any backend can query);
//!   it connects to no database (so it shows in `pg_stat_activity`), publishes its pid
//!   in the registry and binds `pg_uvm_share.sock` in the data directory (mode 0600, and it
//!   serves only peers with the cluster's uid).
//! - Serves `PUT` (creator hands over a new chunk), `GET` (a process maps a chunk), `RELEASE`
//!   (a segment was dropped) and `STATS`; see `protocol.rs`. Each process keeps one connection
//!   (connections carry no state: a request names its epoch and chunk id).
//! - Survives its clients: it never blocks on one, refuses malformed messages (closing any fd
//!   they carried), drops clients that die or do not read their replies, serves at most
//!   `MaxBackends + 64` connections (evicting long-idle ones to make room), and answers running
//!   out of fds by refusing connections, never by exiting; see `server.rs`. A failure inside
//!   the broker is a crash of the cluster, so nothing a client sends may cause one.
//! - Every few seconds it sweeps: fds whose chunk id the registry no longer knows are closed
//!   (a process that died between allocating and registering a chunk).
//! - If it exits abnormally the postmaster performs a crash-restart: every process dies, shared
//!   memory is re-created with a new epoch, and the broker starts again empty. Chunks never
//!   outlive the registry that describes them, and no chunk id of an old epoch resolves.
//!
//! `protocol.rs`, `server.rs` and `client.rs` are plain Rust, here; the background worker that
//! runs the server talks to PostgreSQL and lives in the extension crate (`broker::worker`).

pub mod client;
pub mod protocol;
pub mod server;

/// The broker's socket, relative to the data directory (every PostgreSQL process runs there).
pub const SOCKET_NAME: &str = "pg_uvm_share.sock";
