//! Crash of an attached backend: the postmaster crash-restarts the cluster, a new broker starts,
//! the registry is empty, the cumulative statistics start from zero, no memfd survives in the
//! broker or the postmaster, and the extension works again.
//!
//! This file is named to run last (cargo runs test binaries in name order) and holds a single
//! test: the restart terminates every session of the cluster.

use pg_uvm_share_tests::*;
use std::time::Duration;

#[test]
fn backend_crash_restarts_cleanly() {
    let mut admin = connect();
    let broker_before = wait_broker(&mut admin, Duration::from_secs(30));
    let postmaster = postmaster_pid();
    assert!(process_alive(postmaster), "postmaster {postmaster} from postmaster.pid is not running");
    let pm_fds_before = fd_count(postmaster);
    let pm_fd_listing_before = fd_listing(postmaster);
    assert_eq!(memfd_count(postmaster), 0, "the postmaster holds memfds before the test:\n  {pm_fd_listing_before}");
    let restart: String = admin.query_one("SHOW restart_after_crash", &[]).unwrap().get(0);
    assert_eq!(restart, "on", "the cluster must run with restart_after_crash = on");

    // Segments: one the victim creates and reads (so it is attached), one made by another session.
    let victim_seg = unique_name("crash_v");
    let other_seg = unique_name("crash_o");
    create_segment(&mut admin, &other_seg, 8 * MIB as i64);
    write_segment(&mut admin, &other_seg, 0, &pattern(MIB, 40));

    let mut victim = connect();
    let victim_pid = backend_pid(&mut victim);
    create_segment_max(&mut victim, &victim_seg, 4 * MIB as i64, 64 * MIB as i64);
    let data = pattern(4 * MIB, 41);
    write_segment(&mut victim, &victim_seg, 0, &data);
    assert_bytes_eq(&read_segment(&mut victim, &victim_seg, 0, data.len() as i32), &data, "victim reads");
    assert_bytes_eq(&read_segment(&mut victim, &other_seg, 0, MIB as i32), &pattern(MIB, 40), "victim reads other");
    // The victim's segments are mapped by the victim itself, or by the service where it read
    // and wrote them for the victim (`host_tier_pid`).
    let mode = execution(&mut admin);
    let mapper = host_tier_pid(&mut admin, victim_pid);
    let attached: i64 = admin.query_one("SELECT count(*) FROM uvm.attachments WHERE pid = $1", &[&mapper]).unwrap().get(0);
    assert!(attached >= 2, "process {mapper} (victim backend {victim_pid}) maps {attached} segments, want both");
    let service_before = service_pid(&mut admin);
    let provider: Option<String> =
        admin.query_opt("SELECT value FROM uvm.device_info() WHERE property = 'provider'", &[]).unwrap().map(|r| r.get(0));
    if provider.as_deref() == Some("host") {
        assert!(memfd_count(broker_before) > 0, "the host provider's broker holds no memfds with two live segments");
    }

    // The cumulative statistics outlive the session that counted (a declined join path, counted
    // by a session that exits) and, below, start from zero after the crash restart.
    {
        let mut counter = connect();
        counter
            .batch_execute(
                "SET pg_uvm_share.enable_gpujoin = on;
                 EXPLAIN SELECT 1 FROM pg_class a JOIN pg_class b ON a.oid::int8 + 0 = b.oid::int8",
            )
            .unwrap();
    }
    let declined: i64 = admin.query_one("SELECT paths_declined FROM uvm.stat_gpujoin", &[]).unwrap().get(0);
    assert!(declined > 0, "uvm.stat_gpujoin lost what an exited session counted");

    // SIGKILL the attached backend: the postmaster crash-restarts everything.
    drop(admin);
    kill_backend_for_crash_restart(victim_pid, broker_before);
    drop(victim);

    // Reconnect (the cluster goes through crash recovery) and wait for a new broker.
    let mut c = connect_retry(Duration::from_secs(90));
    let mut broker_after = None;
    let ok = wait_until(Duration::from_secs(60), || {
        match c.query("SELECT pid FROM pg_stat_activity WHERE backend_type = $1", &[&BROKER_BACKEND_TYPE]) {
            Ok(rows) => broker_after = rows.first().map(|r| r.get::<_, i32>(0)),
            Err(_) => {
                // Connected in a window of the restart; connect again.
                if let Ok(cc) = try_connect() {
                    c = cc;
                }
            }
        }
        matches!(broker_after, Some(p) if p != broker_before)
    });
    assert!(ok, "no new broker after the crash restart (saw {broker_after:?}, old {broker_before})");
    let broker_after = broker_after.unwrap();
    if mode == Execution::Service {
        // The restart started a new service; the calls below go through it.
        let ok =
            wait_until(Duration::from_secs(30), || matches!(service_pid_in_activity(&mut c), Some(p) if p != service_before));
        assert!(ok, "no new GPU service after the crash restart (old {service_before})");
        assert!(!process_alive(service_before), "the old service {service_before} survived the crash restart");
    }

    assert_eq!(postmaster_pid(), postmaster, "the postmaster itself must survive (crash restart, not a new start)");
    assert!(process_alive(postmaster));

    // Registry is clean, and the statistics start from zero.
    let declined: i64 = c.query_one("SELECT paths_declined FROM uvm.stat_gpujoin", &[]).unwrap().get(0);
    assert_eq!(declined, 0, "uvm.stat_gpujoin after the crash restart");
    let n: i64 = c.query_one("SELECT count(*) FROM uvm.segments", &[]).unwrap().get(0);
    assert_eq!(n, 0, "uvm.segments not empty after the crash restart");
    let n: i64 = c.query_one("SELECT count(*) FROM uvm.attachments", &[]).unwrap().get(0);
    assert_eq!(n, 0, "uvm.attachments not empty after the crash restart");

    // No memfd survives anywhere we can see; the postmaster's fd table is as before.
    let clean = wait_until(Duration::from_secs(10), || {
        memfd_count(broker_after) == 0 && memfd_count(postmaster) == 0 && fd_count(postmaster) == pm_fds_before
    });
    assert!(
        clean,
        "after the crash restart: broker memfds {}, postmaster memfds {}, postmaster fds {} (before {}).\n\
         postmaster fds now:\n  {}\nbefore:\n  {}\nbroker fds:\n  {}",
        memfd_count(broker_after),
        memfd_count(postmaster),
        fd_count(postmaster),
        pm_fds_before,
        fd_listing(postmaster),
        pm_fd_listing_before,
        fd_listing(broker_after)
    );

    // The extension works again, including the names used before the crash.
    for name in [&victim_seg, &other_seg] {
        create_segment(&mut c, name, 2 * MIB as i64);
        let d = pattern(2 * MIB, 42);
        write_segment(&mut c, name, 0, &d);
        let mut other = connect();
        assert_bytes_eq(&read_segment(&mut other, name, 0, d.len() as i32), &d, "read after restart");
        assert_eq!(checksum_segment(&mut c, name, 0, d.len() as i64), checksum_segment(&mut other, name, 0, d.len() as i64));
        drop_segment(&mut c, name);
    }
    let n: i64 = c.query_one("SELECT count(*) FROM uvm.segments", &[]).unwrap().get(0);
    assert_eq!(n, 0);
    assert!(
        wait_until(Duration::from_secs(10), || memfd_count(broker_after) == 0),
        "broker memfds after dropping the new segments: {}",
        memfd_count(broker_after)
    );
}
