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

/// Waits (PostgreSQL's WaitEventSet: latch, postmaster death, sockets) until a socket is
/// readable, the latch is set or `timeout` passes; returns the readable sockets.
fn wait_for_sockets(fds: &[i32], timeout: Duration, events: &mut Vec<pg_sys::WaitEvent>) -> Vec<i32> {
    if events.len() < fds.len() + 2 {
        events.resize(fds.len() + 2, pg_sys::WaitEvent::default());
    }
    // SAFETY: the set is created in TopMemoryContext and freed before returning; the sockets
    // stay open for the duration (they are owned by the server, which is not touched here);
    // `events` has room for every registered event.
    unsafe {
        // 14-16 take the memory context; 17 on a resource owner (none: freed below, and the
        // set lives in TopMemoryContext as before).
        #[cfg(any(feature = "pg14", feature = "pg15", feature = "pg16"))]
        let set = pg_sys::CreateWaitEventSet(pg_sys::TopMemoryContext, (fds.len() + 2) as i32);
        #[cfg(not(any(feature = "pg14", feature = "pg15", feature = "pg16")))]
        let set = pg_sys::CreateWaitEventSet(std::ptr::null_mut(), (fds.len() + 2) as i32);
        pg_sys::AddWaitEventToSet(set, pg_sys::WL_LATCH_SET, pg_sys::PGINVALID_SOCKET, pg_sys::MyLatch, std::ptr::null_mut());
        pg_sys::AddWaitEventToSet(
            set,
            pg_sys::WL_EXIT_ON_PM_DEATH,
            pg_sys::PGINVALID_SOCKET,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        for &fd in fds {
            pg_sys::AddWaitEventToSet(set, pg_sys::WL_SOCKET_READABLE, fd, std::ptr::null_mut(), std::ptr::null_mut());
        }
        let n = pg_sys::WaitEventSetWait(
            set,
            timeout.as_millis() as _,
            events.as_mut_ptr(),
            events.len() as i32,
            pg_sys::PG_WAIT_EXTENSION,
        );
        let mut ready = Vec::new();
        for e in &events[..n.max(0) as usize] {
            if e.events & pg_sys::WL_LATCH_SET != 0 {
                pg_sys::ResetLatch(pg_sys::MyLatch);
            }
            if e.events & pg_sys::WL_SOCKET_READABLE != 0 {
                ready.push(e.fd);
            }
        }
        pg_sys::FreeWaitEventSet(set);
        ready
    }
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_uvm_share_broker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM | SignalWakeFlags::SIGINT);
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
    let mut events = vec![pg_sys::WaitEvent::default(); 64];
    loop {
        if BackgroundWorker::sigterm_received() {
            break;
        }
        // Serve ProcSignal barriers (DROP DATABASE waits for every process to absorb them)
        // and other interrupts. Cancels (SIGINT) only set a flag that the broker ignores.
        pg_sys::check_for_interrupts!();

        let fds = server.watched_fds();
        let ready = wait_for_sockets(&fds, SWEEP_INTERVAL, &mut events);
        for fd in ready {
            if let Err(e) = server.on_readable(fd) {
                force_crash_restart(&format!("socket error: {e}"));
            }
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
