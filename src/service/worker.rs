//! The GPU service as a PostgreSQL background worker: start-up (the provider, and under CUDA the
//! context and the kernels, before the first request), the main loop, and the executor pool.
//!
//! # Lifecycle
//!
//! 1. Registered by `_PG_init` unless `gpu_execution = process`; started once the cluster is
//!    consistent; shows in `pg_stat_activity` as `pg_uvm_share gpu service`.
//! 2. Creates the cluster's provider (the first process to do so picks it, as a backend would)
//!    and decides the mode: `service`, or under `auto` with the host provider `process` (it
//!    then idles, so that a crash-restart finds it again). Under CUDA it loads the kernels and
//!    registers the channel's staging memory with the driver, so neither costs a request.
//! 3. Loops: frees what finished, fails what a dead predecessor left, takes submitted
//!    requests (preparing them, or running registry changes itself), and sleeps on its latch
//!    and on an eventfd the executors write when they finish. A registry change on a segment
//!    that abandoned work still pins waits until that work has stopped (`behind_abandoned_work`).
//! 4. On SIGTERM, or once a caller's kernel has faulted (the CUDA context is then unusable:
//!    `gpu::user::context_lost`): stops taking requests, lets the executors finish theirs,
//!    leaves untaken requests to its successor, exits 1 (restarted after 1 s). Its segment mappings and pins
//!    go with it (the segment manager's exit callback).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;

use super::channel::{Channel, ABANDONED};
use crate::error::{Code, Result, UvmError};
use crate::exec::local::{self, Work};
use crate::exec::request::{self, Bulk, Call, Done, Op, Reply, Thread};
use crate::exec::Io;
use crate::exec::Mode;
use crate::guc;
use crate::provider::ProviderKind;
use crate::segment::{PoolPiece, PoolTurn};

/// Registers the service with the postmaster (from `_PG_init`).
pub fn register() {
    BackgroundWorkerBuilder::new("pg_uvm_share gpu service")
        .set_type("pg_uvm_share gpu service")
        .set_library("pg_uvm_share")
        .set_function("pg_uvm_share_service_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::ConsistentState)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

/// Work handed to an executor thread: job id, slot, the work, and its operation and input
/// length (for its staging).
struct Task {
    job: u64,
    slot: u32,
    work: Work,
    op: Op,
    input: u64,
}

/// A migration waiting for a segment's pins to drain. The main thread does not sleep on it
/// (every other request would wait too): it tries again at each turn of its loop until the
/// client's `pin_wait_timeout` has passed. Meanwhile it is queued (`queued`): other processes'
/// new pins of the segment wait behind it, and this loop holds its own requests for the
/// segment back (`behind`), so that readers taking turns cannot starve it.
struct Parked {
    slot: u32,
    req: request::Prefetch,
    since: Instant,
    queued: Option<crate::segment::WaitingToMigrate<crate::runtime::PgEnv>>,
    /// Its `uvm.progress` row while it waits between tries (each try claims its own).
    progress: Option<crate::stats::ProgressGuard>,
}

/// What the main thread and the executors share.
///
/// Executors are grouped per GPU (`service_threads` each; one group without a device tier),
/// each group serving its own queue: the main thread routes every task to a GPU
/// (`crate::placement::route`: the one holding most of the device bytes of the segments the
/// task pinned, else the least loaded) and queues it there. Under CUDA with several placement
/// GPUs (`pg_uvm_share.cuda_devices`) each group's threads bind to their GPU's context, so
/// their kernels run there; with the host provider's simulated GPUs the groups run the CPU
/// paths, so CI covers the routing.
struct Pool {
    /// One queue per GPU, under one lock.
    queues: Mutex<Vec<VecDeque<Task>>>,
    /// One condition per GPU, so that a task wakes a thread of its own group.
    ready: Vec<Condvar>,
    /// Tasks queued or running per GPU: the load routing compares.
    load: Vec<std::sync::atomic::AtomicU32>,
    /// Whether each GPU's group has at least one executor (a thread that could not be spawned
    /// is missing from its group; a group without any gets no task).
    served: Vec<std::sync::atomic::AtomicBool>,
    /// Jobs whose work has finished (their pins may go).
    finished: Mutex<Vec<u64>>,
    /// Written by executors when they finish a job; read by the main thread's wait set.
    eventfd: libc::c_int,
    stop: std::sync::atomic::AtomicBool,
}

/// The staging bytes a request reads or writes.
///
/// # Safety
/// The caller must own slot `slot` (the service, between take and complete).
unsafe fn io_for<'a>(ch: &'a Channel, slot: u32, op: Op, input: u64) -> Io<'a> {
    // SAFETY: forwarded contract.
    let staging = unsafe { ch.staging(slot) };
    match op.bulk() {
        Bulk::Out => Io::Out(staging),
        Bulk::In => {
            let n = (input as usize).min(staging.len());
            Io::In(&staging[..n])
        }
        Bulk::None => Io::None,
    }
}

fn reply_of(r: Result<Done>) -> Reply {
    match r {
        Ok(done) => Reply::ok(&done),
        Err(e) => Reply::error(&e),
    }
}

impl Pool {
    /// Queues `task` for GPU `gpu`'s executors.
    fn push(&self, gpu: usize, task: Task) {
        self.load[gpu].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.queues.lock().unwrap_or_else(|e| e.into_inner())[gpu].push_back(task);
        self.ready[gpu].notify_one();
    }

    /// The next task for GPU `gpu`, waiting for one; `None` once the pool stops.
    fn pop(&self, gpu: usize) -> Option<Task> {
        let mut q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(t) = q[gpu].pop_front() {
                return Some(t);
            }
            if self.stop.load(std::sync::atomic::Ordering::Acquire) {
                return None;
            }
            q = self.ready[gpu].wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The GPU a job runs on: where most of its pinned segments' device bytes are, unless that
    /// GPU is busier than the idlest by the routing margin; else the least loaded
    /// (`crate::placement::route`).
    /// Only the first `limit` GPUs (`pg_uvm_share.service_gpus`) take tasks.
    fn route<E: crate::segment::Env>(&self, pins: &[crate::segment::Pin<E>], limit: Option<usize>) -> usize {
        let gpus = self.load.len();
        if gpus == 1 {
            // One GPU (or none): nothing to choose, and nothing to count on every request.
            return 0;
        }
        let mut bytes = vec![0u64; gpus];
        for pin in pins {
            for (b, add) in bytes.iter_mut().zip(pin.info().bytes_per_gpu(gpus as u32)) {
                *b += add;
            }
        }
        let served = |g: usize| self.served[g].load(std::sync::atomic::Ordering::Relaxed) && limit.is_none_or(|l| g < l);
        // A GPU without executors (or past the limit) looks infinitely busy, and holds no data
        // worth going to.
        let load: Vec<u32> = (0..gpus)
            .map(|g| if served(g) { self.load[g].load(std::sync::atomic::Ordering::Relaxed) } else { u32::MAX })
            .collect();
        for (g, b) in bytes.iter_mut().enumerate() {
            if !served(g) {
                *b = 0;
            }
        }
        let g = crate::placement::route(&bytes, &load, crate::placement::ROUTE_MARGIN).min(gpus - 1);
        if served(g) {
            g
        } else {
            (0..gpus).find(|&g| served(g)).unwrap_or(0)
        }
    }
}

fn executor_loop(ch: Channel, pool: Arc<Pool>, gpu: usize, bind: bool) {
    if bind {
        // Under CUDA with several placement GPUs, this thread's kernels run on its own GPU. If
        // binding fails, its work runs on device 0 (the first `gpu::gpu()` makes that current),
        // reading the chunks over the interconnect: slower, not wrong.
        let _ = crate::gpu::bind_thread(gpu as u32);
    }
    while let Some(task) = pool.pop(gpu) {
        let reply = {
            // SAFETY: the slot's state lives in shared memory as long as the process.
            let _w = unsafe { crate::interrupt::watch(ch.state_flag(task.slot), ABANDONED) };
            // SAFETY: the main thread took the slot (we own it until complete) and holds the
            // job's pins until we report it finished below.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                task.work.run(io_for(&ch, task.slot, task.op, task.input))
            }));
            reply_of(r.unwrap_or_else(|_| Err(UvmError::new(Code::SystemError, "the GPU service's executor failed"))))
        };
        // SAFETY: still ours (see above).
        unsafe { reply.write_to(&mut ch.slot_mut(task.slot).reply) };
        pool.finished.lock().unwrap_or_else(|e| e.into_inner()).push(task.job);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(pool.eventfd, &one as *const u64 as *const libc::c_void, 8) };
        pool.load[gpu].fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        ch.count_routed(gpu);
        let latch = ch.complete(task.slot);
        // SAFETY: a client's latch, in shared memory.
        unsafe { super::set_latch_from_any_thread(latch) };
    }
}

/// Spawns `n` executors for each GPU of the pool (PostgreSQL's signals stay the main thread's),
/// bound to their GPU's CUDA context if `bind`.
fn spawn_executors(ch: Channel, pool: &Arc<Pool>, n: usize, bind: bool) -> Vec<std::thread::JoinHandle<()>> {
    (0..pool.load.len() * n)
        .filter_map(|i| {
            let p = pool.clone();
            let gpu = i / n;
            let name = format!("uvm-exec-g{gpu}-{}", i % n);
            let h = crate::interrupt::spawn_without_signals(name, move || executor_loop(ch, p, gpu, bind)).ok()?;
            pool.served[gpu].store(true, std::sync::atomic::Ordering::Relaxed);
            Some(h)
        })
        .collect()
}

/// Under CUDA: loads the kernels and registers the staging memory now, not at a request.
fn warm_cuda(ch: &Channel) {
    // Compiles the kernels into the disk cache (or finds them there): each executor thread
    // then loads its own copy from it at its first request.
    match crate::gpu::gpu().and_then(|g| g.kernels()) {
        Ok(()) => {}
        Err(e) => pgrx::warning!("pg_uvm_share gpu service: kernels unavailable: {}", e.message),
    }
    let (addr, len) = ch.staging_range();
    if let Err(e) = crate::gpu::register_host(addr, len) {
        pgrx::log!("pg_uvm_share gpu service: staging memory not registered with CUDA ({}); copies will be slower", e.message);
    }
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_uvm_share_service_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    let ch = match super::shmem::channel() {
        Ok(c) => c,
        Err(e) => {
            pgrx::log!("pg_uvm_share gpu service: {}", e.message);
            // SAFETY: proc_exit runs the exit callbacks and ends the process.
            unsafe { pg_sys::proc_exit(1) };
            #[allow(unreachable_code)]
            {
                unreachable!("proc_exit returned")
            }
        }
    };
    // SAFETY: MyProcPid and MyLatch are set at process start; the latch is in our PGPROC.
    let (pid, latch) = unsafe { (pg_sys::MyProcPid, pg_sys::MyLatch as u64) };
    let incarnation = ch.service_started(pid, latch);
    crate::runtime::set_service_process();

    let provider = crate::runtime::try_with_segments(|s| Ok(s.provider().kind()));
    let kind = match provider {
        Ok(k) => k,
        Err(e) => {
            pgrx::log!("pg_uvm_share gpu service: no provider: {}", e.message);
            ch.set_error(request::code_index(e.code), &e.message);
            idle_until_terminated(&ch, false);
        }
    };
    let mode = match guc::GPU_EXECUTION.get() {
        guc::ExecutionChoice::Service => Mode::Service,
        _ if kind == ProviderKind::Cuda => Mode::Service,
        _ => Mode::Process,
    };
    if mode == Mode::Process {
        pgrx::log!("pg_uvm_share gpu service: provider {}, execution mode process: idle", kind.name());
        ch.set_mode(Mode::Process);
        idle_until_terminated(&ch, true);
    }
    if kind == ProviderKind::Cuda {
        warm_cuda(&ch);
    }

    // SAFETY: a fresh non-blocking eventfd, owned by this process until it exits.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        let e = UvmError::last_os("eventfd failed");
        ch.set_error(request::code_index(e.code), &e.message);
        idle_until_terminated(&ch, false);
    }
    // One executor group per GPU the provider places chunks on (one without a device tier).
    let gpus = crate::runtime::try_with_segments(|s| Ok(s.provider().devices())).unwrap_or(0).max(1) as usize;
    let pool = Arc::new(Pool {
        queues: Mutex::new((0..gpus).map(|_| VecDeque::new()).collect()),
        ready: (0..gpus).map(|_| Condvar::new()).collect(),
        load: (0..gpus).map(|_| std::sync::atomic::AtomicU32::new(0)).collect(),
        served: (0..gpus).map(|_| std::sync::atomic::AtomicBool::new(false)).collect(),
        finished: Mutex::new(Vec::new()),
        eventfd: efd,
        stop: std::sync::atomic::AtomicBool::new(false),
    });
    // Chunks a migration or a drop replaced are released after the reply (each turn, below),
    // and the host pool's pieces stay mapped for the copies of migrations (`KeptMaps`).
    let _ = crate::runtime::try_with_segments(|s| {
        s.defer_releases(true);
        s.keep_pool_mappings(true);
        Ok(())
    });
    let threads = guc::SERVICE_THREADS.get().max(1) as usize;
    // Executors of GPU n > 0 bind to its context under CUDA; GPU 0's use the process's own.
    let handles = spawn_executors(ch, &pool, threads, kind == ProviderKind::Cuda && gpus > 1);
    ch.set_mode(Mode::Service);
    pgrx::log!(
        "pg_uvm_share gpu service: provider {}, {} executor thread(s) for {gpus} GPU(s), {} request slots of {} bytes (incarnation {incarnation})",
        kind.name(),
        handles.len(),
        ch.nslots(),
        ch.staging_bytes()
    );

    // SAFETY: main thread; the eventfd stays open for the life of the process.
    let set = unsafe { crate::pgwait::latch_and_fd(efd) };
    let mut events = [pg_sys::WaitEvent::default(); 3];
    // Jobs whose work runs (or ran) on an executor: id -> (slot, pins).
    let mut running: Running = HashMap::new();
    let mut next_job = 1u64;
    let mut parked: Vec<Parked> = Vec::new();
    // Taken requests that wait for abandoned work on their segments to stop (slots).
    let mut behind: Vec<u32> = Vec::new();
    // When to look at the host pool next: at once while it changes, every 100 ms once it has
    // its size (the look takes the registry's lock exclusively), 10 s after a failure.
    let mut pool_check_at = Instant::now();
    // The host pool's piece being made (pinned) on a thread of its own.
    let mut making: Option<PoolMaker> = None;
    // The abandoned requests counted at the last sweep of the slots, and when it ran.
    let mut swept: Option<(u64, Instant)> = None;
    loop {
        if BackgroundWorker::sigterm_received() {
            break;
        }
        if crate::gpu::user::context_lost() {
            // A caller's kernel faulted: the context is unusable for every later request. Leave
            // as on SIGTERM; the successor starts with a new context (its chunks are the
            // broker's fds, which outlive us).
            pgrx::log!("pg_uvm_share gpu service: a kernel faulted and the CUDA context is lost; restarting");
            break;
        }
        pg_sys::check_for_interrupts!();
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloads postgresql.conf in the main thread, as any process does on SIGHUP.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        // 1. Give back the pins of finished jobs (before taking anything new: a client that saw
        //    its reply may already ask to drop the segment). The executors' list says which;
        //    their eventfd only wakes this thread, and is drained when the wait reports it (a
        //    read per turn would be a system call per turn of a busy loop).
        reap(&pool, &mut running);
        // 2. Free abandoned slots; fail what a dead predecessor took and never answered. Only
        //    when a client abandoned a request since the last sweep (a predecessor's slots are
        //    all there at the first), and every 100 ms as a safety net: a sweep reads every
        //    slot's state, a cache line that its client may have just written, and a busy
        //    service turns many times a millisecond.
        let abandoned = ch.abandoned_count();
        if swept.is_none_or(|(n, at)| n != abandoned || at.elapsed() >= SWEEP_EVERY) {
            swept = Some((abandoned, Instant::now()));
            let busy: Vec<u32> =
                running.values().map(|(s, _)| *s).chain(parked.iter().map(|p| p.slot)).chain(behind.iter().copied()).collect();
            let dead = UvmError::new(Code::SystemError, "the pg_uvm_share GPU service was restarted while it ran this request");
            for l in ch.sweep(incarnation, |i| busy.contains(&i), |r| *r = Reply::error(&dead)) {
                // SAFETY: a client's latch in shared memory; the main thread may call SetLatch.
                unsafe { pg_sys::SetLatch(l as *mut pg_sys::Latch) };
            }
        }
        // 3. Migrations waiting for pins try again (or give up: timed out, or abandoned).
        for p in std::mem::take(&mut parked) {
            if let Some(p) = try_prefetch(&ch, p) {
                parked.push(p);
            }
        }
        // 4. Take what was submitted (after the requests that waited behind abandoned work).
        let submitted: Vec<u32> = ch.submitted().collect();
        let waited = std::mem::take(&mut behind);
        let served = !submitted.is_empty() || !waited.is_empty();
        // The moment of the next take: the turn's start, then each main-thread completion's
        // (one clock read per request: this loop serves every client in turn).
        let mut clock = crate::stats::monotonic_ns();
        for (slot, taken) in waited.into_iter().map(|s| (s, true)).chain(submitted.into_iter().map(|s| (s, false))) {
            if !taken && !ch.take_at(slot, incarnation, clock) {
                continue;
            }
            // SAFETY: taken: ours until complete.
            let req = unsafe { ch.slot_mut(slot).request };
            if req.input as usize > ch.staging_bytes() {
                clock = finish_here(
                    &ch,
                    slot,
                    Err(UvmError::new(Code::ProtocolViolation, "a request claims more input than its staging")),
                );
                continue;
            }
            let call = match Call::decode(&req) {
                Ok(call) => call,
                Err(e) => {
                    clock = finish_here(&ch, slot, Err(e));
                    continue;
                }
            };
            let op = call.op();
            if op.thread() == Thread::Main {
                if taken && ch.abandoned(slot) {
                    clock = finish_here(&ch, slot, Err(UvmError::new(Code::QueryCanceled, "abandoned")));
                    continue;
                }
                if behind_abandoned_work(&ch, &pool, &mut running, &call) {
                    behind.push(slot);
                    continue;
                }
            }
            if let Call::Prefetch(p) = call {
                if let Some(p) = try_prefetch(&ch, Parked { slot, req: p, since: Instant::now(), queued: None, progress: None }) {
                    parked.push(p);
                }
                continue;
            }
            // A segment whose migration is parked takes no new pin until the migration has run
            // or given up (the queue that `Segments::pin` keeps for other processes), unless
            // the client holds a pin on it itself (a session pin: it would wait for itself).
            if behind_parked_migration(&ch, slot, &parked, &call) {
                if ch.abandoned(slot) {
                    clock = finish_here(&ch, slot, Err(UvmError::new(Code::QueryCanceled, "abandoned")));
                } else {
                    behind.push(slot);
                }
                continue;
            }
            if op.thread() == Thread::Main {
                let r = {
                    // SAFETY: the slot's state lives in shared memory as long as the process.
                    let _w = unsafe { crate::interrupt::watch(ch.state_flag(slot), ABANDONED) };
                    // SAFETY: taken: ours until complete.
                    crate::runtime::try_with_segments(|s| local::run_main(s, &call, unsafe { io_for(&ch, slot, op, req.input) }))
                };
                clock = finish_here(&ch, slot, r);
                continue;
            }
            // SAFETY: taken: ours until complete; the input is copied into the work.
            let io = unsafe { io_for(&ch, slot, op, req.input) };
            match crate::runtime::try_with_segments(|s| local::prepare(s, &call, &io)) {
                Err(e) => clock = finish_here(&ch, slot, Err(e)),
                Ok(local::Job { pins, work }) => {
                    let id = next_job;
                    next_job += 1;
                    let gpu = pool.route(&pins, guc::service_gpus());
                    // The pins stay here (the work refers to their memory) until it finishes.
                    running.insert(id, (slot, pins));
                    ch.set_gpu(slot, gpu);
                    pool.push(gpu, Task { job: id, slot, work, op, input: req.input });
                    clock = crate::stats::monotonic_ns();
                }
            }
        }
        // 5. Release what this turn's migrations and drops replaced, now that their clients have
        //    their answers (freeing pinned memory is slow: it does not belong in the round trip),
        //    and bring the host pool one piece closer to its size (pg_uvm_share.host_pool_size):
        //    a piece is pinned on a thread of its own (256 MB: 45-64 ms, which on this thread
        //    every request of the turn would wait through), that writes the eventfd when done.
        let pool_busy = crate::runtime::try_with_segments(|s| {
            s.release_deferred();
            if let Some(m) = making.take() {
                making = m.finish(s, false)?;
            }
            if making.is_some() || Instant::now() < pool_check_at {
                return Ok(false);
            }
            s.sweep_kept_maps()?;
            match s.pool_begin()? {
                PoolTurn::Idle => {
                    pool_check_at = Instant::now() + Duration::from_millis(100);
                    Ok(false)
                }
                PoolTurn::Trimmed => Ok(true),
                PoolTurn::Make(piece) => {
                    making = Some(PoolMaker::start(s, piece, pool.eventfd)?);
                    Ok(false)
                }
            }
        })
        .unwrap_or_else(|e| {
            // Out of chunk slots or pinnable memory: say so, and try again in a while.
            pgrx::log!("pg_uvm_share gpu service: the host pool could not grow: {}", e.message);
            pool_check_at = Instant::now() + Duration::from_secs(10);
            false
        });
        // After a turn that served requests, look for the next ones a moment before sleeping:
        // a client that sends its next request within it wakes nobody.
        if served && !pool_busy && ch.submission_within(POLL_AFTER_TURN) {
            continue;
        }
        let timeout = if pool_busy {
            0
        } else if !parked.is_empty() || !behind.is_empty() {
            2
        } else {
            1000
        };
        // SAFETY: `set` is live; `events` has room for the 3 registered events.
        let n = unsafe { pg_sys::WaitEventSetWait(set, timeout, events.as_mut_ptr(), 3, pg_sys::PG_WAIT_EXTENSION) };
        for e in &events[..n.max(0) as usize] {
            if e.events & pg_sys::WL_LATCH_SET != 0 {
                // SAFETY: MyLatch is this process's latch.
                unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
            }
            if e.events & pg_sys::WL_SOCKET_READABLE != 0 {
                let mut drained = [0u8; 8];
                // SAFETY: reads up to 8 bytes into a live buffer from our non-blocking eventfd.
                unsafe { libc::read(efd, drained.as_mut_ptr() as *mut libc::c_void, 8) };
            }
        }
    }

    // SIGTERM: let the executors finish what they run; untaken requests stay for the successor.
    pool.stop.store(true, std::sync::atomic::Ordering::Release);
    {
        // Under the queues' lock, so that no executor misses the wake-up between its check of
        // `stop` and its wait.
        let _q = pool.queues.lock().unwrap_or_else(|e| e.into_inner());
        pool.ready.iter().for_each(Condvar::notify_all);
    }
    for h in handles {
        let _ = h.join();
    }
    if let Some(m) = making.take() {
        let _ = crate::runtime::try_with_segments(|s| m.finish(s, true));
    }
    drop(running);
    // (Withdraws the parked migrations' places in their segments' queues: proc_exit returns
    // to no destructor.)
    drop(parked);
    ch.service_stopped();
    // SAFETY: proc_exit runs the exit callbacks (the segment manager's detach) and ends the
    // process; exit code 1: restarted unless the postmaster is shutting down.
    unsafe { pg_sys::proc_exit(1) };
    #[allow(unreachable_code)]
    {
        unreachable!("proc_exit returned")
    }
}

/// A host-pool piece pinned on a thread of its own: the piece pending in the registry, and
/// where the thread sends its chunk (then writing the service's eventfd, to wake the main
/// thread, which hands the chunk to the broker: `Segments::pool_finish`). The chunk comes
/// through a channel, not the thread's result: a thread that has written the eventfd may not
/// count as finished yet when the main thread looks.
struct PoolMaker {
    piece: PoolPiece,
    made: std::sync::mpsc::Receiver<Result<crate::segment::MadePiece>>,
}

impl PoolMaker {
    fn start(s: &mut crate::segment::Segments<crate::runtime::PgEnv>, piece: PoolPiece, eventfd: i32) -> Result<PoolMaker> {
        let maker = piece.maker();
        let (tx, made) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new().name("uvm host pool".into()).spawn(move || {
            // (The main thread may have gone: then nobody wants the chunk, and it closes.)
            let _ = tx.send(maker.make());
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to the service's eventfd, open for the
            // life of the process.
            unsafe { libc::write(eventfd, &one as *const u64 as *const libc::c_void, 8) };
        });
        match spawned {
            Ok(_detached) => Ok(PoolMaker { piece, made }),
            Err(e) => {
                let e = UvmError::new(Code::SystemError, format!("could not start the host pool's thread: {e}"));
                s.pool_finish(piece, Err(e.clone()))?;
                Err(e)
            }
        }
    }

    /// The piece's chunk if the thread has made it (`wait`: waiting for it), added to the pool;
    /// `Some(self)` while it is still being made.
    fn finish(self, s: &mut crate::segment::Segments<crate::runtime::PgEnv>, wait: bool) -> Result<Option<PoolMaker>> {
        use std::sync::mpsc::TryRecvError;
        let failed = || Err(UvmError::new(Code::SystemError, "the host pool's thread failed"));
        let made = match if wait { self.made.recv().map_err(|_| TryRecvError::Disconnected) } else { self.made.try_recv() } {
            Ok(made) => made,
            Err(TryRecvError::Empty) => return Ok(Some(self)),
            Err(TryRecvError::Disconnected) => failed(),
        };
        s.pool_finish(self.piece, made)?;
        Ok(None)
    }
}

/// How long the main thread looks for new requests after a turn that served some.
const POLL_AFTER_TURN: Duration = Duration::from_micros(50);

/// How often the main thread sweeps the slots when no client abandoned a request meanwhile.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// Jobs whose work runs (or ran) on an executor: id -> (slot, the pins of its segments).
type Running = HashMap<u64, (u32, Vec<crate::segment::Pin<crate::runtime::PgEnv>>)>;

/// Gives back the pins of the jobs the executors have finished.
fn reap(pool: &Pool, running: &mut Running) {
    let finished: Vec<u64> = std::mem::take(&mut *pool.finished.lock().unwrap_or_else(|e| e.into_inner()));
    for j in finished {
        running.remove(&j);
    }
}

/// Whether `req` (an operation of the main thread: drop, grow, migrate, materialize) names a
/// segment that an executor still pins for work whose client has given up on it. Such work
/// stops at its next interrupt check, and the request waits for it (`behind`), instead of
/// finding the segment pinned: the client of the abandoned work already has its ERROR and may
/// be the one asking now (a cancelled `gpujoin_build` drops its half-made table at once, which
/// a pin would refuse). Work whose client still waits is not waited for: a drop then fails on
/// its pin, as in process mode.
fn behind_abandoned_work(ch: &Channel, pool: &Pool, running: &mut Running, call: &Call) -> bool {
    // An executor reports a job finished before it completes the job's slot: after this reap, a
    // client that saw its reply finds that job's pins gone, and a job still here has not
    // completed its slot, whose state tells whether its client left.
    reap(pool, running);
    let ids: Vec<u64> = call.segments().iter().map(|s| s.id).filter(|&id| id != 0).collect();
    !ids.is_empty() && running.values().any(|(slot, pins)| ch.abandoned(*slot) && pins.iter().any(|p| ids.contains(&p.info().id)))
}

/// Whether request `slot` (`call`) names a segment whose migration is parked here, and its
/// client holds no pin on that segment (see `crate::segment`'s queue of pins).
fn behind_parked_migration(ch: &Channel, slot: u32, parked: &[Parked], call: &Call) -> bool {
    let queued: Vec<u64> = call.segments().iter().map(|s| s.id).filter(|id| parked.iter().any(|p| p.req.seg.id == *id)).collect();
    if queued.is_empty() {
        return false;
    }
    let client = ch.client_pid(slot);
    match crate::registry::shmem::shared() {
        Ok(reg) => queued.iter().any(|&id| !reg.holds_pin(client, id)),
        Err(_) => true,
    }
}

/// Runs a migration request without waiting for pins: done (answered), or parked again while
/// the segment is pinned and the client's wait (its `pin_wait_timeout`) lasts.
fn try_prefetch(ch: &Channel, mut p: Parked) -> Option<Parked> {
    if ch.abandoned(p.slot) {
        drop(p.progress.take());
        finish_here(ch, p.slot, Err(UvmError::new(Code::QueryCanceled, "abandoned")));
        return None;
    }
    let wait = Duration::from_millis(p.req.pin_wait_ms);
    let now = Call::Prefetch(request::Prefetch { pin_wait_ms: 0, ..p.req });
    // The waiting row stays through the try, so that a waiting migration never leaves
    // uvm.progress (the try adds its own row beside it while it runs: `Segments::prefetch`).
    let waiting = p.progress.take();
    let r = {
        // SAFETY: the slot's state lives in shared memory as long as the process.
        let _w = unsafe { crate::interrupt::watch(ch.state_flag(p.slot), ABANDONED) };
        crate::runtime::try_with_segments(|s| local::run_main(s, &now, Io::None))
    };
    match r {
        Err(e) if e.code == Code::LockNotAvailable && p.since.elapsed() < wait => {
            if p.queued.is_none() {
                // (A segment dropped meanwhile: the next try says so.)
                p.queued = crate::runtime::try_with_segments(|s| s.wait_to_migrate(p.req.seg.id)).ok();
            }
            p.progress = waiting.or_else(|| waiting_row(&p.req));
            Some(p)
        }
        // (the waiting row goes before the answer: a client that has its answer finds no row
        // of the migration left in uvm.progress)
        Err(e) if e.code == Code::LockNotAvailable => {
            drop(waiting);
            let detail = e.detail.unwrap_or(e.message);
            finish_here(ch, p.slot, Err(crate::segment::still_pinned(p.req.seg.name(), wait, detail)));
            None
        }
        r => {
            drop(waiting);
            finish_here(ch, p.slot, r);
            None
        }
    }
}

/// A `uvm.progress` row for a parked migration between its tries: waiting for pins, the bytes
/// it asked to move (`None` without a free row or the segment).
fn waiting_row(req: &request::Prefetch) -> Option<crate::stats::ProgressGuard> {
    use crate::stats::{ProgressKind, ProgressPhase};
    let reg = crate::registry::shmem::shared().ok()?;
    let size = reg.find_id(req.seg.id).map(|slot| reg.info(slot).size)?;
    let offset = req.offset.max(0) as u64;
    let total = (req.length.max(0) as u64).min(size.saturating_sub(offset));
    // SAFETY: a plain global of the process.
    let pid = unsafe { pg_sys::MyProcPid };
    reg.start_progress(pid, ProgressKind::Migration, ProgressPhase::WaitingForPins, req.seg.id, total)
}

/// Completes a request on the main thread and wakes its client. Returns when it completed
/// (`stats::monotonic_ns`): the moment the main thread's next take happens at.
fn finish_here(ch: &Channel, slot: u32, r: Result<Done>) -> u64 {
    // SAFETY: taken by us: ours until complete.
    unsafe { reply_of(r).write_to(&mut ch.slot_mut(slot).reply) };
    let now = crate::stats::monotonic_ns();
    let l = ch.complete_at(slot, now);
    if l != 0 {
        // SAFETY: a client's latch in shared memory; the main thread may call SetLatch.
        unsafe { pg_sys::SetLatch(l as *mut pg_sys::Latch) };
    }
    now
}

/// Sleeps until SIGTERM (a service with nothing to do, or one that cannot start), then exits 1.
fn idle_until_terminated(ch: &Channel, keep_pool: bool) -> ! {
    // Exits with the postmaster (WL_EXIT_ON_PM_DEATH: pgrx's wait_latch would return at once,
    // forever, once it died, and the loop would spin).
    while !BackgroundWorker::sigterm_received() {
        let mut pool_busy = false;
        if keep_pool {
            // Process mode under `gpu_execution = auto` (the host provider): the backends
            // migrate, and take the pool's pieces, themselves; the service, idle, still keeps
            // the pool (a failure: try again at the next timeout). With `gpu_execution =
            // process` there is no service, and no pool.
            if BackgroundWorker::sighup_received() {
                // SAFETY: reloads postgresql.conf in the main thread, as any process does.
                unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            }
            pool_busy = crate::runtime::try_with_segments(|s| s.pool_step()).unwrap_or(false);
        }
        // SAFETY: MyLatch is this process's latch; main thread.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                if pool_busy { 0 } else { 10_000 },
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pg_sys::check_for_interrupts!();
    }
    ch.service_stopped();
    // SAFETY: as at the end of the main function.
    unsafe { pg_sys::proc_exit(1) };
    #[allow(unreachable_code)]
    {
        unreachable!("proc_exit returned")
    }
}
