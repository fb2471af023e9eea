//! The broker as a PostgreSQL background worker: registration, signals, the sweep, and the exit
//! codes that keep the registry and the broker's fds consistent (see `mod.rs`). It raises its
//! soft open-file limit to the hard one, serves up to `MaxBackends + CLIENT_MARGIN` connections
//! (see `server.rs` for what happens past that and to misbehaving clients) and logs, at most
//! once per sweep, what it refused or dropped.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;

use super::server::{Counters, Limits, Server, EVICT_IDLE};
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

/// Connections the broker serves beyond one per server process (`MaxBackends`): room for a
/// process that reconnects before its old connection is noticed closed, and for tools, which
/// (processes not of the cluster) may hold no more than this margin (`Limits::max_foreign`).
const CLIENT_MARGIN: usize = 64;

/// Raises the soft open-file limit to the hard one: the broker holds one fd per chunk and one
/// per connection, more than any other process of the cluster. Returns the limit in force.
fn raise_fd_limit() -> u64 {
    // SAFETY: rlimit is plain data; getrlimit/setrlimit read and write a live local.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur as u64;
            }
        }
        lim.rlim_cur as u64
    }
}

/// Logs what the server refused or dropped since the last report (once per sweep at most).
fn log_counters(now: &Counters, last: &mut Counters, limits: &Limits) {
    if now.refused_full != last.refused_full || now.evicted != last.evicted {
        pgrx::log!(
            "pg_uvm_share broker: at its limit of {} connections: refused {}, evicted {} idle",
            limits.max_clients,
            now.refused_full - last.refused_full,
            now.evicted - last.evicted
        );
    }
    if now.refused_foreign != last.refused_foreign || now.evicted_foreign != last.evicted_foreign {
        pgrx::log!(
            "pg_uvm_share broker: connections from processes not of this cluster: refused {} past their limit of {}, evicted {} to make room for the cluster's",
            now.refused_foreign - last.refused_foreign,
            limits.max_foreign,
            now.evicted_foreign - last.evicted_foreign
        );
    }
    if now.refused_resources != last.refused_resources || now.accept_pauses != last.accept_pauses {
        pgrx::log!(
            "pg_uvm_share broker: out of file descriptors or memory: refused {} connection(s), paused accepting {} time(s)",
            now.refused_resources - last.refused_resources,
            now.accept_pauses - last.accept_pauses
        );
    }
    if now.bad_requests != last.bad_requests || now.dropped != last.dropped || now.refused_uid != last.refused_uid {
        pgrx::log!(
            "pg_uvm_share broker: {} malformed request(s) refused, {} client(s) dropped, {} connection(s) from another user closed",
            now.bad_requests - last.bad_requests,
            now.dropped - last.dropped,
            now.refused_uid - last.refused_uid
        );
    }
    *last = *now;
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_uvm_share_broker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM | SignalWakeFlags::SIGINT);
    BackgroundWorker::connect_worker_to_spi(None, None);

    let epoch = {
        let Ok(mut reg) = shmem::exclusive() else { force_crash_restart("registry not initialized") };
        // A first broker may find chunks already: the GPU service, starting beside it, reserves
        // its host pool's first pieces, which wait for the broker to take their fds.
        if !reg.start_broker() && !reg.known_chunk_ids().is_empty() {
            // We were restarted while segments exist: their fds died with our predecessor.
            force_crash_restart("restarted while chunks are registered");
        }
        // SAFETY: getpid has no preconditions.
        reg.set_broker_pid(unsafe { libc::getpid() });
        reg.epoch()
    };

    let fd_limit = raise_fd_limit();
    // SAFETY: MaxBackends is set by the postmaster before any worker starts and never changes.
    let max_backends = unsafe { pg_sys::MaxBackends }.max(0) as usize;
    let limits = Limits { max_clients: max_backends + CLIENT_MARGIN, evict_idle: EVICT_IDLE, max_foreign: CLIENT_MARGIN };
    let mut server = match Server::bind_with(Path::new(SOCKET_NAME), epoch, limits) {
        Ok(s) => s,
        Err(e) => force_crash_restart(&format!("could not listen on {SOCKET_NAME}: {e}")),
    };
    pgrx::log!(
        "pg_uvm_share broker listening on {SOCKET_NAME} (epoch {epoch:016x}, up to {} connections, open-file limit {fd_limit})",
        limits.max_clients
    );

    // One wait set for the broker's life: its latch, postmaster death, and the server's epoll
    // fd (readable whenever a connection, a request or the accept backoff timer is pending).
    // SAFETY: main thread; the epoll fd stays open as long as `server`, which outlives the loop.
    let set = unsafe { crate::pgwait::latch_and_fd(server.wait_fd()) };
    let mut events = [pg_sys::WaitEvent::default(); 3];
    let mut last_sweep = Instant::now();
    let mut logged = Counters::default();
    loop {
        if BackgroundWorker::sigterm_received() {
            break;
        }
        // Serve ProcSignal barriers (DROP DATABASE waits for every process to absorb them)
        // and other interrupts. Cancels (SIGINT) only set a flag that the broker ignores.
        pg_sys::check_for_interrupts!();

        let timeout = SWEEP_INTERVAL.saturating_sub(last_sweep.elapsed());
        // SAFETY: `set` is live; `events` has room for the 3 registered events.
        let n =
            unsafe { pg_sys::WaitEventSetWait(set, timeout.as_millis() as _, events.as_mut_ptr(), 3, pg_sys::PG_WAIT_EXTENSION) };
        let mut readable = false;
        for e in &events[..n.max(0) as usize] {
            if e.events & pg_sys::WL_LATCH_SET != 0 {
                // SAFETY: MyLatch is this process's latch.
                unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
            }
            readable |= e.events & pg_sys::WL_SOCKET_READABLE != 0;
        }
        // Whatever a client does is handled inside; an error here is epoll_wait itself failing.
        if readable {
            if let Err(e) = server.serve_ready() {
                force_crash_restart(&format!("socket error: {e}"));
            }
        }
        if last_sweep.elapsed() >= SWEEP_INTERVAL {
            last_sweep = Instant::now();
            log_counters(&server.counters(), &mut logged, &limits);
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
