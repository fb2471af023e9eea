//! The broker as a PostgreSQL background worker: registration, signals, the sweep, and the exit
//! codes that keep the registry and the broker's fds consistent (see `mod.rs`).

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;

use super::server::Server;
use super::SOCKET_NAME;
use crate::registry::shmem;

/// How often the broker closes fds the registry no longer knows.
const SWEEP_INTERVAL: Duration = Duration::from_secs(2);

/// Registers the broker with the postmaster. Called from `_PG_init` under
/// `shared_preload_libraries`.
pub fn register() {
    BackgroundWorkerBuilder::new("pg_uvm_share broker")
        .set_type("pg_uvm_share broker")
        .set_library("pg_uvm_share")
        .set_function("pg_uvm_share_broker_main")
        // A connection to no database: that is what puts the broker in pg_stat_activity
        // (as the logical replication launcher is), for monitoring and tests.
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::ConsistentState)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

/// Exit code 2 makes the postmaster treat the broker's exit as a crash and re-create shared
/// memory: the only safe answer once fds and registry may disagree.
fn force_crash_restart(why: &str) -> ! {
    pgrx::log!("pg_uvm_share broker: {why}; forcing a crash-restart so that no segment outlives its chunks");
    // SAFETY: _exit ends the process at once; the postmaster sees exit code 2.
    unsafe { libc::_exit(2) }
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_uvm_share_broker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);

    let epoch = {
        let Ok(mut reg) = shmem::exclusive() else { force_crash_restart("registry not initialized") };
        if !reg.known_chunk_ids().is_empty() {
            // We were restarted while segments exist: their fds died with our predecessor.
            force_crash_restart("restarted while chunks are registered");
        }
        // SAFETY: getpid has no preconditions.
        reg.set_broker_pid(unsafe { libc::getpid() });
        reg.epoch()
    };

    let mut server = match Server::bind(Path::new(SOCKET_NAME), epoch) {
        Ok(s) => s,
        Err(e) => force_crash_restart(&format!("could not listen on {SOCKET_NAME}: {e}")),
    };
    pgrx::log!("pg_uvm_share broker listening on {SOCKET_NAME} (epoch {epoch:016x})");

    let mut last_sweep = Instant::now();
    loop {
        if BackgroundWorker::sigterm_received() {
            break;
        }
        // SAFETY: getppid has no preconditions; PostmasterPid is set before any child starts.
        if unsafe { libc::getppid() != pg_sys::PostmasterPid } {
            // SAFETY: as above; nothing to clean: the fds close with the process.
            unsafe { libc::_exit(1) };
        }
        if let Err(e) = server.poll_once(250) {
            force_crash_restart(&format!("socket error: {e}"));
        }
        if last_sweep.elapsed() >= SWEEP_INTERVAL {
            last_sweep = Instant::now();
            let known: HashSet<u64> = match shmem::shared() {
                Ok(reg) => reg.known_chunk_ids().into_iter().collect(),
                Err(_) => continue,
            };
            let closed = server.broker.retain(&known);
            if closed > 0 {
                pgrx::log!("pg_uvm_share broker: closed {closed} fd(s) of unregistered chunks");
            }
        }
    }

    let _ = std::fs::remove_file(SOCKET_NAME);
    if let Ok(mut reg) = shmem::exclusive() {
        reg.set_broker_pid(0);
    }
    // Exit code 1: restarted if the postmaster is still running (then the new broker finds
    // registered chunks and forces a crash-restart), not restarted during shutdown.
    // SAFETY: proc_exit runs PostgreSQL's exit callbacks and ends the process.
    unsafe { pg_sys::proc_exit(1) };
}
