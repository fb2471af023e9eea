//! Soak: 1,000 create/write/read/drop cycles over 8 concurrent sessions; the broker ends with
//! the file descriptors it started with.

use pg_uvm_share_tests::*;
use std::time::{Duration, Instant};

const SESSIONS: usize = 8;
const CYCLES_PER_SESSION: usize = 125;

/// 4 KiB .. 1 MiB, varying (powers of two and odd sizes).
fn cycle_size(session: usize, cycle: usize) -> usize {
    let k = session * 131 + cycle * 7;
    if cycle.is_multiple_of(2) {
        (4 * KIB) << (k % 9) // 4 KiB, 8 KiB, ... 1 MiB
    } else {
        4 * KIB + (k * 7919 * 4099) % (MIB - 4 * KIB + 1)
    }
}

#[test]
fn soak_create_write_read_drop() {
    let mut admin = connect();
    let broker = wait_broker(&mut admin, Duration::from_secs(30));
    let fds_before = fd_count(broker);
    let memfds_before = memfd_count(broker);
    let tag = unique_name("soak");
    let start = Instant::now();

    let threads: Vec<_> = (0..SESSIONS)
        .map(|s| {
            let tag = tag.clone();
            std::thread::spawn(move || {
                let mut c = connect();
                for i in 0..CYCLES_PER_SESSION {
                    let name = format!("{tag}_{s}_{i}");
                    let size = cycle_size(s, i);
                    let data = pattern(size, (s * 100_000 + i) as u64);
                    let mut guard = SegmentGuard::with(&[&name]);
                    create_segment(&mut c, &name, size as i64);
                    assert_eq!(write_segment(&mut c, &name, 0, &data), size as i64);
                    let got = read_segment(&mut c, &name, 0, size as i32);
                    assert_bytes_eq(&got, &data, &format!("session {s} cycle {i} ({size} bytes)"));
                    drop_segment(&mut c, &name);
                    guard.forget(&name);
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for (s, t) in threads.into_iter().enumerate() {
        if let Err(p) = t.join() {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("session {s}: {msg}"));
        }
    }
    assert!(failures.is_empty(), "soak sessions failed:\n{}", failures.join("\n"));
    eprintln!("soak: {} cycles over {SESSIONS} sessions in {:?}", SESSIONS * CYCLES_PER_SESSION, start.elapsed());

    let left: i64 =
        admin.query_one("SELECT count(*) FROM uvm.segments WHERE name LIKE $1", &[&format!("{tag}_%")]).unwrap().get(0);
    assert_eq!(left, 0, "soak segments left in uvm.segments");

    assert_eq!(broker_pid(&mut admin), Some(broker), "the broker changed during the soak");
    let settled = wait_until(Duration::from_secs(10), || fd_count(broker) == fds_before && memfd_count(broker) == memfds_before);
    assert!(
        settled,
        "broker fds did not return to the baseline: fds {} -> {}, memfds {} -> {}; now:\n  {}",
        fds_before,
        fd_count(broker),
        memfds_before,
        memfd_count(broker),
        fd_listing(broker)
    );
}
