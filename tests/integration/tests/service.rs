//! The GPU service (issue 9): with `pg_uvm_share.gpu_execution = service` every operation on
//! segment memory runs in one background worker, and backends submit requests through a fixed
//! number of slots in shared memory (`pg_uvm_share.service_slots`, 32 here). Without a GPU the
//! service runs the CPU paths, so the channel, its concurrency, cancellation and errors are all
//! tested on this machine.
//!
//! Every test runs in both stages (`make integration`, `make integration-service`): it checks
//! the mode the run expects (`UVM_EXPECT_EXECUTION`) against `uvm.device_info()`, runs the same
//! workload, and checks what is true of that mode: in service mode that the service did the
//! work (and which process maps what), in process mode that no request went to the service.
//! The crashes of clients and of the service are in `zz_service_crash.rs` (they restart the
//! cluster: they run last).
//!
//! A backend reads and writes host-tier memfds (the host tier's chunks in service mode, under
//! both providers) through its own mapping (`pg_uvm_share.map_host_tier`, the first test checks
//! it), and CI's segments are such: the tests of the service's own machinery (slots, cancels,
//! abandoned requests) open their sessions with that setting off ([`route_through_service`]),
//! so that their checksums run in the service, as a device segment's do on a GPU.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use pg_uvm_share_tests::*;

/// The request slots of the test cluster (`pg_uvm_share.service_slots`, default).
const SLOTS: usize = 32;

/// Bytes of the segment whose checksum runs for seconds (sparse until read: a checksum cut
/// short allocates only what it read).
const LONG_BYTES: i64 = 4 << 30;

/// The most a cancel or statement_timeout may take to end a request here (the issue asks for
/// 100 ms; the rest is room for a loaded 2-core CI machine; the measured values are printed).
const PROMPT: Duration = Duration::from_millis(250);

/// The statement that runs for seconds inside one request.
fn long_checksum(name: &str) -> String {
    format!("SELECT uvm.checksum_segment({}, 0, {LONG_BYTES})", quote_literal(name))
}

/// A statement of long requests one after another, that only an interrupt ends: in service mode
/// the service's few executors finish one 4 GiB checksum long before forty sessions' cancels
/// are sent, so a single one would not be running any more when its cancel comes.
fn endless_checksums(name: &str) -> String {
    format!("SELECT count(uvm.checksum_segment({}, 0, {LONG_BYTES})) FROM generate_series(1, 1000)", quote_literal(name))
}

/// Runs `sql` on `c` and interrupts it `how`; returns how it ended and the time from the
/// interrupt to the error. For a cancel the clock starts before `pg_cancel_backend` is sent (so
/// the figure includes that call's round trip: an upper bound); for a timeout, at its expiry.
fn interrupt(c: &mut Client, sql: &str, how: Interrupt) -> (Result<(), postgres::Error>, Duration) {
    match how {
        Interrupt::Cancel(after) => {
            let pid = backend_pid(c);
            let mut other = connect();
            let canceller = std::thread::spawn(move || {
                std::thread::sleep(after);
                let sent = Instant::now();
                let ok: bool = other.query_one("SELECT pg_cancel_backend($1)", &[&pid]).unwrap().get(0);
                assert!(ok, "pg_cancel_backend({pid}) found no backend");
                sent
            });
            let r = c.batch_execute(sql);
            let end = Instant::now();
            let sent = canceller.join().unwrap();
            (r, end.saturating_duration_since(sent))
        }
        Interrupt::Timeout(t) => {
            let i = run_and_interrupt(c, sql, how);
            assert!(i.total >= t, "statement_timeout {t:?} ended the statement after {:?}", i.total);
            (i.result, i.after_interrupt)
        }
    }
}

/// Whether a process maps a chunk of a segment (the host provider's memfds).
fn maps_a_chunk(pid: i32) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_else(|e| panic!("/proc/{pid}/maps: {e}"));
    // The host provider names each memfd after its place: "pg_uvm_share host chunk", "... device:0 chunk".
    maps.lines().any(|l| l.contains("/memfd:pg_uvm_share ") && l.contains(" chunk"))
}

/// The pids listed in uvm.attachments for segment `name`.
fn attached_pids(c: &mut Client, name: &str) -> Vec<i32> {
    c.query("SELECT pid FROM uvm.attachments WHERE segment::text = $1 ORDER BY pid", &[&name])
        .unwrap_or_else(|e| panic!("uvm.attachments: {}", describe(&e)))
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// `n` connections, each with `statement_timeout` set to `limit`, so that a request that never
/// comes back shows as an error (57014) instead of hanging the suite.
fn sessions(n: usize, limit: Duration) -> Vec<Client> {
    (0..n)
        .map(|_| {
            let mut c = connect();
            c.batch_execute(&format!("SET statement_timeout = {}", limit.as_millis())).unwrap();
            c
        })
        .collect()
}

/// Waits until every backend of `pids` runs a statement (pg_stat_activity: active, and waiting
/// on its latch: for a reply of the service, or for a slot; or computing, in process mode).
fn wait_all_active(c: &mut Client, pids: &[i32]) {
    let mut active = 0;
    let ok = wait_until(Duration::from_secs(20), || {
        active = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1) AND state = 'active' \
                   AND query LIKE '%checksum_segment%'",
                &[&pids],
            )
            .unwrap()
            .get::<_, i64>(0);
        active == pids.len() as i64
    });
    assert!(ok, "only {active} of {} sessions are running their statement", pids.len());
}

#[test]
fn the_service_shows_in_pg_stat_activity_and_does_the_work() {
    let mut c = connect();
    let mode = execution(&mut c);
    let me = backend_pid(&mut c);
    let name = unique_name("svc_who");
    let _guard = SegmentGuard::with(&[&name]);
    let before = service_requests(&mut c);
    let ops_before = service_ops(&mut c, BYTE_OPS);
    create_segment(&mut c, &name, MIB as i64);
    let data = pattern(MIB, 90);
    write_segment(&mut c, &name, 0, &data);
    assert_bytes_eq(&read_segment(&mut c, &name, 0, MIB as i32), &data, "read back");
    assert_eq!(checksum_segment(&mut c, &name, 0, MIB as i64) as u64, checksum(&data), "checksum");
    let after = service_requests(&mut c);
    let ops_after = service_ops(&mut c, BYTE_OPS);
    let attached = attached_pids(&mut c, &name);
    match mode {
        Execution::Service => {
            let pid = service_pid(&mut c);
            assert!(pid > 0, "device_info shows no service_pid");
            assert_eq!(service_pid_in_activity(&mut c), Some(pid), "'{SERVICE_BACKEND_TYPE}' in pg_stat_activity");
            // The create at least (device_info adds its own).
            assert!(after.completed > before.completed, "requests: {before:?} -> {after:?}");
            assert_eq!(after.abandoned, before.abandoned, "nothing was abandoned");
            if maps_host_tier(&mut c) {
                // Host-tier memfds: this backend maps them and read, wrote and checksummed them
                // itself (issue 25, point 1).
                assert_eq!(ops_after, ops_before, "byte requests went to the service though the backend maps the host tier");
                assert!(attached.contains(&me), "uvm.attachments of {name}: {attached:?}, without backend {me}");
                assert!(maps_a_chunk(me), "backend {me} maps no chunk of a host-tier segment");
                // A session with map_host_tier off sends every request to the service, which
                // then maps the segment, and maps nothing itself.
                let mut off = connect();
                off.batch_execute("SET pg_uvm_share.map_host_tier = off").unwrap();
                let off_pid = backend_pid(&mut off);
                assert_bytes_eq(&read_segment(&mut off, &name, 0, MIB as i32), &data, "read through the service");
                assert_eq!(checksum_segment(&mut off, &name, 0, MIB as i64) as u64, checksum(&data), "checksum in the service");
                let through = service_ops(&mut c, BYTE_OPS) - ops_after;
                assert!(through >= 2, "{through} byte requests reached the service with map_host_tier off");
                assert!(maps_a_chunk(pid), "the service {pid} maps no chunk after reading for a client");
                assert!(!maps_a_chunk(off_pid), "backend {off_pid} maps a chunk with map_host_tier off");
            } else {
                // create, write, read, checksum: four requests at least.
                assert!(after.submitted - before.submitted >= 4, "requests: {before:?} -> {after:?}");
                assert!(ops_after - ops_before >= 3, "byte requests: {ops_before} -> {ops_after}");
                // The service maps the segment; this backend maps nothing.
                assert_eq!(attached, vec![pid], "uvm.attachments of {name}");
                assert!(maps_a_chunk(pid), "the service {pid} maps no chunk");
                assert!(!maps_a_chunk(me), "backend {me} maps a chunk in service mode");
            }
        }
        Execution::Process => {
            assert_eq!(after, before, "process mode: requests went to the GPU service");
            assert_eq!(attached, vec![me], "uvm.attachments of {name}");
            assert!(maps_a_chunk(me), "backend {me} maps no chunk in process mode");
        }
    }
    drop_segment(&mut c, &name);
}

#[test]
fn cancel_and_statement_timeout_end_a_long_request_promptly() {
    route_through_service();
    let mut c = connect();
    let mode = execution(&mut c);
    let name = unique_name("svc_cancel");
    let mut guard = SegmentGuard::with(&[&name]);
    create_segment(&mut c, &name, LONG_BYTES);
    let head = pattern(4096, 91);
    write_segment(&mut c, &name, 0, &head);
    let sql = long_checksum(&name);
    let at = Duration::from_millis(200);
    let before = service_requests(&mut c);
    // The first interrupt of a backend takes longer to report when the server runs with
    // RUST_BACKTRACE set (as from a developer's shell; the cluster and these tests share the
    // environment of `make`): pgrx then symbolizes a backtrace for the ERROR, 100 to 150 ms the
    // first time, in either mode (6 ms without). It gets the slack of cancel.rs then.
    let backtraces = std::env::var("RUST_BACKTRACE").is_ok_and(|v| v != "0");
    let (r, first) = interrupt(&mut c, &sql, Interrupt::Cancel(at));
    expect_sqlstate(r, "57014", "the first cancel");
    let first_limit = if backtraces { Duration::from_secs(1) } else { PROMPT };
    assert!(first < first_limit, "the first cancel took {first:?} (RUST_BACKTRACE set: {backtraces})");
    let mut measured = Vec::new();
    for how in [Interrupt::Cancel(at), Interrupt::Timeout(at)].repeat(3) {
        let (r, took) = interrupt(&mut c, &sql, how);
        expect_sqlstate(r, "57014", &format!("checksum_segment of 4 GiB, {how:?}"));
        measured.push((how, took));
        // The next call of the session works.
        assert_eq!(checksum_segment(&mut c, &name, 0, 4096) as u64, checksum(&head), "the call after {how:?}");
    }
    let ms: Vec<String> = measured.iter().map(|(h, d)| format!("{h:?} {:.1} ms", d.as_secs_f64() * 1e3)).collect();
    eprintln!(
        "{mode:?} mode, from the interrupt to the error: first cancel {:.1} ms, then {}",
        first.as_secs_f64() * 1e3,
        ms.join(", ")
    );
    for (how, took) in &measured {
        assert!(*took < PROMPT, "{how:?}: the error came {took:?} after the interrupt");
    }
    let after = service_requests(&mut c);
    match mode {
        // Each interrupted statement gave up one request.
        Execution::Service => assert_eq!(after.abandoned - before.abandoned, 7, "abandoned: {before:?} -> {after:?}"),
        Execution::Process => assert_eq!(after, before, "process mode: requests went to the GPU service"),
    }
    // Dropped right after a cancel, by the same session: in service mode the abandoned work may
    // still pin the segment for a moment, and the drop waits for it to stop rather than failing
    // with 55006 (a race this rarely loses; gpujoin_cancel.rs has the case that always did: a
    // cancelled build dropping its half-made table).
    let (r, _) = interrupt(&mut c, &sql, Interrupt::Cancel(at));
    expect_sqlstate(r, "57014", "checksum_segment before a drop");
    drop_segment(&mut c, &name);
    guard.forget(&name);
}

/// Cancels `SLOTS + 8` statements that each wait for a long request (more than there are slots:
/// some wait for a slot), then terminates as many others, then checks that every slot came back:
/// a burst of as many sessions works at once. A slot or a place in the queue that an
/// interrupted or exiting client kept would make the burst wait forever (its statement_timeout
/// then fails the test).
#[test]
fn interrupted_and_exiting_clients_give_every_slot_back() {
    route_through_service();
    let mut admin = connect();
    let mode = execution(&mut admin);
    let name = unique_name("svc_slots");
    let _guard = SegmentGuard::with(&[&name]);
    create_segment(&mut admin, &name, LONG_BYTES);
    let head = pattern(64 * KIB, 92);
    write_segment(&mut admin, &name, 0, &head);
    let want = checksum(&head);
    let n = SLOTS + 8;
    let before = service_requests(&mut admin);

    for how in ["pg_cancel_backend", "pg_terminate_backend"] {
        let mut clients = sessions(n, Duration::from_secs(60));
        let pids: Vec<i32> = clients.iter_mut().map(backend_pid).collect();
        let t = Instant::now();
        let runners: Vec<_> = clients
            .into_iter()
            .map(|mut c| {
                let sql = endless_checksums(&name);
                std::thread::spawn(move || c.batch_execute(&sql).map_err(|e| (sqlstate(&e), describe(&e))))
            })
            .collect();
        wait_all_active(&mut admin, &pids);
        std::thread::sleep(Duration::from_millis(200));
        for pid in &pids {
            let sent: bool = admin.query_one(format!("SELECT {how}($1)").as_str(), &[pid]).unwrap().get(0);
            assert!(sent, "{how}({pid}) found no backend");
        }
        for (pid, r) in pids.iter().zip(runners) {
            match (how, r.join().unwrap()) {
                ("pg_cancel_backend", Err((Some(code), _))) if code == "57014" => {}
                // terminated: FATAL 57P01, or the connection closed under it
                ("pg_terminate_backend", Err(_)) => {}
                (_, other) => panic!("{how}: backend {pid} ended with {other:?}"),
            }
        }
        if how == "pg_terminate_backend" {
            let gone = wait_until(Duration::from_secs(20), || pids.iter().all(|&p| !process_alive(p)));
            assert!(gone, "terminated backends still alive");
        }
        eprintln!("{how} of {n} sessions: {} ms", t.elapsed().as_millis());

        // A burst from as many sessions, each with a few requests, all at once.
        let burst = sessions(n, Duration::from_secs(30));
        let go = Arc::new(Barrier::new(n));
        let t = Instant::now();
        let runners: Vec<_> = burst
            .into_iter()
            .map(|mut c| {
                let (go, name) = (go.clone(), name.clone());
                std::thread::spawn(move || {
                    go.wait();
                    for _ in 0..5 {
                        let v: i64 = c
                            .query_one("SELECT uvm.checksum_segment($1, 0, $2)", &[&name, &(64 * KIB as i64)])
                            .map_err(|e| describe(&e))?
                            .get(0);
                        if v as u64 != want {
                            return Err(format!("checksum {v:#x}, want {want:#x}"));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for r in runners {
            r.join().unwrap().unwrap_or_else(|e| panic!("the burst after {how}: {e}"));
        }
        eprintln!("burst of {n} sessions x 5 requests after {how}: {} ms", t.elapsed().as_millis());
    }

    let after = service_requests(&mut admin);
    match mode {
        Execution::Service => {
            // The cancelled statements that held a slot gave it up: at least one per slot.
            let abandoned = after.abandoned - before.abandoned;
            assert!(abandoned >= SLOTS as i64, "only {abandoned} requests abandoned ({before:?} -> {after:?})");
            // Nothing pins the segment once the abandoned work stopped.
            assert_eq!(pins_after_interrupt(&mut admin, &name), 0, "pins left on {name}");
        }
        Execution::Process => assert_eq!(after, before, "process mode: requests went to the GPU service"),
    }
    drop_segment(&mut admin, &name);
}

/// 48 sessions (more than the 32 slots) each send many requests at once: every request comes
/// back with the right answer, none fails, and every session finishes (waiting for a slot is
/// first come, first served).
#[test]
fn more_sessions_than_slots_all_finish() {
    route_through_service();
    const SESSIONS: usize = 48;
    const ROUNDS: usize = 8;
    const RANGE: usize = 4 * MIB;
    const RANGES: usize = 4;
    const OWN: usize = 64 * KIB;
    let mut admin = connect();
    let mode = execution(&mut admin);
    let name = unique_name("svc_many");
    let _guard = SegmentGuard::with(&[&name]);
    let size = RANGES * RANGE + SESSIONS * OWN;
    create_segment(&mut admin, &name, size as i64);
    admin.execute("SELECT uvm.fill_segment($1, 0, $2, 93)", &[&name, &((RANGES * RANGE) as i64)]).unwrap();
    // The checksum of each range, computed here from the fill pattern.
    let sums: Vec<u64> = (0..RANGES).map(|r| checksum(&fill_range(93, (r * RANGE) as u64, RANGE))).collect();
    let before = service_requests(&mut admin);

    let go = Arc::new(Barrier::new(SESSIONS));
    let t = Instant::now();
    let runners: Vec<_> = sessions(SESSIONS, Duration::from_secs(120))
        .into_iter()
        .enumerate()
        .map(|(s, mut c)| {
            let (go, name, sums) = (go.clone(), name.clone(), sums.clone());
            std::thread::spawn(move || -> Result<Duration, String> {
                go.wait();
                let own = (RANGES * RANGE + s * OWN) as i64;
                for round in 0..ROUNDS {
                    // A checksum (no staging), then a write and a read of this session's own
                    // bytes (through its slot's staging): another session's bytes showing here
                    // would be a slot's staging reused too early.
                    let r = (s + round) % RANGES;
                    let v: i64 = c
                        .query_one("SELECT uvm.checksum_segment($1, $2, $3)", &[&name, &((r * RANGE) as i64), &(RANGE as i64)])
                        .map_err(|e| describe(&e))?
                        .get(0);
                    if v as u64 != sums[r] {
                        return Err(format!("session {s}: checksum of range {r}: {v:#x}, want {:#x}", sums[r]));
                    }
                    let mine = pattern(OWN, (1000 * s + round) as u64);
                    c.execute("SELECT uvm.write_segment($1, $2, $3)", &[&name, &own, &mine]).map_err(|e| describe(&e))?;
                    let back: Vec<u8> = c
                        .query_one("SELECT uvm.read_segment($1, $2, $3)", &[&name, &own, &(OWN as i32)])
                        .map_err(|e| describe(&e))?
                        .get(0);
                    if back != mine {
                        return Err(format!("session {s} round {round}: read back other bytes than it wrote"));
                    }
                }
                Ok(t.elapsed())
            })
        })
        .collect();
    let mut done = Vec::new();
    for (s, r) in runners.into_iter().enumerate() {
        done.push(r.join().unwrap().unwrap_or_else(|e| panic!("session {s}: {e}")));
    }
    done.sort();
    eprintln!(
        "{SESSIONS} sessions x {ROUNDS} rounds of 3 requests: first session done after {} ms, last after {} ms",
        done[0].as_millis(),
        done[SESSIONS - 1].as_millis()
    );
    let after = service_requests(&mut admin);
    match mode {
        Execution::Service => {
            let n = (SESSIONS * ROUNDS * 3) as i64;
            assert!(after.completed - before.completed >= n, "{n} requests sent: {before:?} -> {after:?}");
            assert_eq!(after.abandoned, before.abandoned, "abandoned requests: {before:?} -> {after:?}");
        }
        Execution::Process => assert_eq!(after, before, "process mode: requests went to the GPU service"),
    }
    drop_segment(&mut admin, &name);
}

/// An ERROR in one request (a probe of a segment that holds no GpuJoin table, a checksum or a
/// read past the end) is that backend's ERROR, with its SQLSTATE; the sessions that send good
/// requests meanwhile see none, the service stays the same process, and the failing session
/// works on.
#[test]
fn an_error_in_one_request_stays_in_its_backend() {
    route_through_service();
    const GOOD: usize = 4;
    let mut admin = connect();
    let mode = execution(&mut admin);
    let service_before = service_pid(&mut admin);
    let name = unique_name("svc_err");
    let _guard = SegmentGuard::with(&[&name]);
    create_segment(&mut admin, &name, MIB as i64);
    let data = pattern(MIB, 94);
    write_segment(&mut admin, &name, 0, &data);
    let want = checksum(&data);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let good: Vec<_> = sessions(GOOD, Duration::from_secs(60))
        .into_iter()
        .map(|mut c| {
            let (stop, name) = (stop.clone(), name.clone());
            std::thread::spawn(move || -> Result<usize, String> {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Acquire) || n == 0 {
                    let v: i64 = c
                        .query_one("SELECT uvm.checksum_segment($1, 0, $2)", &[&name, &(MIB as i64)])
                        .map_err(|e| describe(&e))?
                        .get(0);
                    if v as u64 != want {
                        return Err(format!("checksum {v:#x}, want {want:#x}"));
                    }
                    n += 1;
                }
                Ok(n)
            })
        })
        .collect();

    let mut bad = connect();
    let past = MIB as i64 - 8;
    for _ in 0..20 {
        expect_sqlstate(
            bad.query_one("SELECT (uvm.gpujoin_probe($1, 1::bigint)).matches", &[&name]),
            "22023",
            "a probe of a segment that holds no GpuJoin table",
        );
        expect_sqlstate(
            bad.query_one("SELECT uvm.checksum_segment($1, $2, 64)", &[&name, &past]),
            "2202E",
            "a checksum past the end",
        );
        expect_sqlstate(bad.query_one("SELECT uvm.fill_segment($1, $2, 64, 1)", &[&name, &past]), "2202E", "a fill past the end");
        expect_sqlstate(bad.query_one("SELECT uvm.read_segment($1, $2, 64)", &[&name, &past]), "2202E", "a read past the end");
    }
    // The failing session works on.
    assert_eq!(checksum_segment(&mut bad, &name, 0, MIB as i64) as u64, want, "the failing session's next call");
    stop.store(true, std::sync::atomic::Ordering::Release);
    let rounds: Vec<usize> =
        good.into_iter().map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("a good session failed: {e}"))).collect();
    eprintln!("good sessions' requests while another failed: {rounds:?}");
    assert_eq!(service_pid(&mut admin), service_before, "the service changed (restarted?) after the errors");
    if mode == Execution::Process {
        assert_eq!(device_info_value(&mut admin, "service_requests").as_deref(), Some("0 submitted, 0 completed, 0 abandoned"));
    }
    drop_segment(&mut admin, &name);
}
