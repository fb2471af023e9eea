//! The GPU service's faults that end processes (issue 9, point 6): a client SIGKILLed while the
//! service runs its request, the service SIGKILLed (both crash-restart the cluster, as any
//! backend crash does), and the service terminated while clients wait (it exits and comes
//! back; the cluster goes on).
//!
//! Named to run after every other test (cargo runs test binaries in name order; zz_crash.rs
//! before this one): a crash restart ends every session of the cluster. In process mode the
//! service runs no request: each test then checks that its workload sent none, and kills
//! nothing (zz_crash.rs covers a backend crash in that mode). Sessions send every request to the
//! service, host-tier bytes included (`route_through_service`), as on a GPU.

use std::time::{Duration, Instant};

use pg_uvm_share_tests::*;

/// Bytes of the segment whose checksum runs for seconds in the service.
const LONG_BYTES: i64 = 4 << 30;

/// What a crash restart must leave behind: a fresh registry, and no chunk anywhere.
struct Before {
    postmaster: i32,
    pm_fds: usize,
    broker: i32,
    service: i32,
    epoch: String,
}

fn before(c: &mut Client) -> Before {
    let postmaster = postmaster_pid();
    assert!(process_alive(postmaster), "postmaster {postmaster} from postmaster.pid is not running");
    assert_eq!(memfd_count(postmaster), 0, "the postmaster holds memfds before the test:\n  {}", fd_listing(postmaster));
    let restart: String = c.query_one("SHOW restart_after_crash", &[]).unwrap().get(0);
    assert_eq!(restart, "on", "the cluster must run with restart_after_crash = on");
    let service = service_pid(c);
    assert!(service > 0, "no service_pid in uvm.device_info()");
    Before {
        postmaster,
        pm_fds: fd_count(postmaster),
        broker: wait_broker(c, Duration::from_secs(30)),
        service,
        epoch: device_info_value(c, "epoch").expect("epoch"),
    }
}

/// Reconnects after a crash restart and waits for a new broker and a new service; checks that
/// the postmaster survived, the registry is empty (a new epoch), and no memfd or mapping of a
/// chunk is left in the postmaster, the broker or the service. Returns a connection and the new
/// service's pid.
fn after_crash_restart(b: &Before) -> (Client, i32) {
    let t = Instant::now();
    let mut c = connect_retry(Duration::from_secs(90));
    let (mut broker, mut service) = (None, None);
    let ok = wait_until(Duration::from_secs(60), || {
        match c.query(
            "SELECT backend_type::text, pid FROM pg_stat_activity WHERE backend_type IN ($1, $2)",
            &[&BROKER_BACKEND_TYPE, &SERVICE_BACKEND_TYPE],
        ) {
            Ok(rows) => {
                for r in rows {
                    let (kind, pid): (String, i32) = (r.get(0), r.get(1));
                    if kind == BROKER_BACKEND_TYPE {
                        broker = Some(pid);
                    } else {
                        service = Some(pid);
                    }
                }
            }
            Err(_) => {
                // Connected in a window of the restart; connect again.
                if let Ok(cc) = try_connect() {
                    c = cc;
                }
            }
        }
        matches!(broker, Some(p) if p != b.broker) && matches!(service, Some(p) if p != b.service)
    });
    assert!(
        ok,
        "no new broker and service after the crash restart (saw {broker:?} and {service:?}, old {} and {})",
        b.broker, b.service
    );
    let (broker, service) = (broker.unwrap(), service.unwrap());
    eprintln!("cluster back {} ms after the crash: broker {broker}, service {service}", t.elapsed().as_millis());
    assert_eq!(postmaster_pid(), b.postmaster, "the postmaster itself must survive (crash restart, not a new start)");
    assert!(!process_alive(b.service), "the old service {} survived the crash restart", b.service);
    assert_eq!(service_pid(&mut c), service, "device_info's service_pid");
    assert_eq!(execution(&mut c), Execution::Service);

    let n: i64 = c.query_one("SELECT count(*) FROM uvm.segments", &[]).unwrap().get(0);
    assert_eq!(n, 0, "uvm.segments not empty after the crash restart");
    let n: i64 = c.query_one("SELECT count(*) FROM uvm.attachments", &[]).unwrap().get(0);
    assert_eq!(n, 0, "uvm.attachments not empty after the crash restart");
    assert_ne!(device_info_value(&mut c, "epoch").unwrap(), b.epoch, "the registry's epoch did not change");
    let clean = wait_until(Duration::from_secs(10), || {
        memfd_count(broker) == 0 && memfd_count(b.postmaster) == 0 && fd_count(b.postmaster) == b.pm_fds
    });
    assert!(
        clean,
        "after the crash restart: broker memfds {}, postmaster memfds {}, postmaster fds {} (before {}):\n  {}",
        memfd_count(broker),
        memfd_count(b.postmaster),
        fd_count(b.postmaster),
        b.pm_fds,
        fd_listing(b.postmaster)
    );
    assert_eq!(memfd_count(service), 0, "the new service holds memfds:\n  {}", fd_listing(service));
    (c, service)
}

/// The cluster works through the (new) service: create, write, read from another session,
/// checksum, drop.
fn works(c: &mut Client, tag: &str) {
    let name = unique_name(tag);
    create_segment(c, &name, 2 * MIB as i64);
    let d = pattern(2 * MIB, 80);
    write_segment(c, &name, 0, &d);
    let mut other = connect();
    assert_bytes_eq(&read_segment(&mut other, &name, 0, d.len() as i32), &d, "read after the restart");
    assert_eq!(checksum_segment(&mut other, &name, 0, d.len() as i64) as u64, checksum(&d));
    drop_segment(c, &name);
}

/// Starts the 4 GiB checksum of `name` on a new session; returns its backend pid and the thread
/// that waits for its outcome.
fn start_long_checksum(name: &str) -> (i32, std::thread::JoinHandle<Result<(), String>>) {
    let mut victim = connect();
    let pid = backend_pid(&mut victim);
    let sql = format!("SELECT uvm.checksum_segment({}, 0, {LONG_BYTES})", quote_literal(name));
    (pid, std::thread::spawn(move || victim.batch_execute(&sql).map_err(|e| describe(&e))))
}

/// Waits until the service runs a request on `name` (it pins the segment while it does).
fn wait_running(c: &mut Client, name: &str) {
    assert!(wait_until(Duration::from_secs(20), || pins_held(c, name) > 0), "the service never started the request on {name}");
}

/// In process mode: checks that a request on `name` goes to no service, drops `name`, and
/// returns true (the crash under test needs the service). In service mode: false.
fn process_mode_sends_nothing(admin: &mut Client, name: &str) -> bool {
    if execution(admin) != Execution::Process {
        return false;
    }
    let r = service_requests(admin);
    checksum_segment(admin, name, 0, MIB as i64);
    assert_eq!(service_requests(admin), r, "process mode: requests went to the GPU service");
    drop_segment(admin, name);
    true
}

#[test]
fn a_backend_killed_while_the_service_runs_its_request_restarts_the_cluster_clean() {
    route_through_service();
    let mut admin = connect_retry(Duration::from_secs(90));
    let name = unique_name("svc_victim");
    create_segment(&mut admin, &name, LONG_BYTES);
    if process_mode_sends_nothing(&mut admin, &name) {
        return;
    }
    let b = before(&mut admin);
    let other = unique_name("svc_other");
    create_segment(&mut admin, &other, 8 * MIB as i64);
    write_segment(&mut admin, &other, 0, &pattern(MIB, 81));
    assert!(memfd_count(b.broker) > 0, "the broker holds no memfds with two live segments");

    let (victim, outcome) = start_long_checksum(&name);
    wait_running(&mut admin, &name);
    drop(admin);
    kill_backend_for_crash_restart(victim, b.broker);
    assert!(outcome.join().unwrap().is_err(), "the killed backend's statement succeeded");

    let (mut c, _) = after_crash_restart(&b);
    works(&mut c, "svc_after_victim");
}

#[test]
fn the_service_killed_restarts_the_cluster_clean() {
    route_through_service();
    let mut admin = connect_retry(Duration::from_secs(90));
    let name = unique_name("svc_killed");
    create_segment(&mut admin, &name, LONG_BYTES);
    if process_mode_sends_nothing(&mut admin, &name) {
        return;
    }
    let b = before(&mut admin);
    // A client waits for the service when it dies.
    let (_, outcome) = start_long_checksum(&name);
    wait_running(&mut admin, &name);
    drop(admin);
    // SAFETY: kill(2) on a pid of the test's own cluster.
    let rc = unsafe { libc::kill(b.service, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill({}, SIGKILL): {}", b.service, std::io::Error::last_os_error());
    assert!(
        wait_until(Duration::from_secs(30), || !process_alive(b.broker)),
        "the broker {} still runs: the service's death did not restart the cluster",
        b.broker
    );
    assert!(outcome.join().unwrap().is_err(), "the waiting client's statement succeeded");

    let (mut c, _) = after_crash_restart(&b);
    works(&mut c, "svc_after_kill");
}

/// `pg_terminate_backend` of the service while clients wait: each gets its result or the
/// ERROR 58000 of a request the service was restarted under, never a hang; a new service comes
/// back within seconds and serves; the cluster was not restarted (same broker, segments kept);
/// no pin is left.
#[test]
fn the_service_terminated_while_clients_wait_comes_back() {
    route_through_service();
    const CLIENTS: usize = 8;
    const BYTES: i64 = 512 << 20;
    let mut admin = connect_retry(Duration::from_secs(90));
    let mode = execution(&mut admin);
    let name = unique_name("svc_term");
    let mut guard = SegmentGuard::with(&[&name]);
    create_segment(&mut admin, &name, BYTES);
    admin.execute("SELECT uvm.fill_segment($1, 0, $2, 82)", &[&name, &BYTES]).unwrap();
    let want = checksum_segment(&mut admin, &name, 0, BYTES);
    let broker = wait_broker(&mut admin, Duration::from_secs(30));
    let service = service_pid(&mut admin);
    let requests = service_requests(&mut admin);

    let clients: Vec<Client> = (0..CLIENTS).map(|_| connect()).collect();
    let t = Instant::now();
    let runners: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            let name = name.clone();
            std::thread::spawn(move || {
                // A hang shows as 57014 (a failure below), not as a stuck suite.
                c.batch_execute("SET statement_timeout = '60s'").unwrap();
                let r = c.query_one("SELECT uvm.checksum_segment($1, 0, $2)", &[&name, &BYTES]).map(|r| r.get::<_, i64>(0));
                (r.map_err(|e| (sqlstate(&e), describe(&e))), Instant::now())
            })
        })
        .collect();
    if mode == Execution::Process {
        for r in runners {
            assert_eq!(r.join().unwrap().0, Ok(want), "a client's checksum");
        }
        assert_eq!(service_requests(&mut admin), requests, "process mode: requests went to the GPU service");
        drop_segment(&mut admin, &name);
        guard.forget(&name);
        return;
    }
    wait_running(&mut admin, &name);
    std::thread::sleep(Duration::from_millis(50)); // the other clients submit meanwhile
    let terminated_at = Instant::now();
    let sent: bool = admin.query_one("SELECT pg_terminate_backend($1)", &[&service]).unwrap().get(0);
    assert!(sent, "pg_terminate_backend({service}) found no such process");

    let (mut results, mut failed) = (0, 0);
    for r in runners {
        let (outcome, at) = r.join().unwrap();
        match outcome {
            Ok(v) => {
                assert_eq!(v, want, "a client's checksum across the service's restart");
                results += 1;
            }
            Err((Some(code), msg)) if code == "58000" && msg.contains("restarted while it ran this request") => failed += 1,
            Err(e) => panic!("a client waiting for the terminated service got {e:?}"),
        }
        assert!(at.duration_since(t) < Duration::from_secs(45), "a client waited {:?}", at.duration_since(t));
    }
    eprintln!("service terminated with {CLIENTS} clients waiting: {results} got their result, {failed} ERROR 58000");

    // A new service within seconds, which serves.
    let mut new = None;
    let back = wait_until(Duration::from_secs(15), || {
        new = service_pid_in_activity(&mut admin).filter(|&p| p != service);
        new.is_some()
    });
    assert!(back, "no new service within 15 s of terminating {service}");
    let new = new.unwrap();
    eprintln!("new service {new} {} ms after the terminate", terminated_at.elapsed().as_millis());
    assert!(wait_until(Duration::from_secs(10), || !process_alive(service)), "the terminated service {service} still runs");
    assert_eq!(checksum_segment(&mut admin, &name, 0, BYTES), want, "the new service's checksum");
    assert_eq!(service_pid(&mut admin), new, "device_info's service_pid");

    // Not a crash: the same broker, the segment kept; the old service's attachments are gone
    // and no pins are left.
    assert_eq!(wait_broker(&mut admin, Duration::from_secs(5)), broker, "the broker changed: the cluster restarted");
    let old: i64 = admin.query_one("SELECT count(*) FROM uvm.attachments WHERE pid = $1", &[&service]).unwrap().get(0);
    assert_eq!(old, 0, "attachments of the terminated service remain");
    let mut pins: i64 = -1;
    let none = wait_until(Duration::from_secs(5), || {
        pins = admin.query_one("SELECT coalesce(sum(pins), 0)::bigint FROM uvm.attachments", &[]).unwrap().get(0);
        pins == 0
    });
    assert!(none, "{pins} pins left in uvm.attachments");
    drop_segment(&mut admin, &name);
    guard.forget(&name);
}
