//! Segments shared between sessions: cross-session reads, growth under an attached reader,
//! pins blocking drops.

use pg_uvm_share_tests::*;
use std::time::Duration;

#[test]
fn session_b_reads_what_session_a_wrote() {
    let name = unique_name("xfer");
    let _guard = SegmentGuard::with(&[&name]);
    let mut a = connect();
    let mut b = connect();
    assert_ne!(backend_pid(&mut a), backend_pid(&mut b));

    let size = 4 * MIB;
    create_segment(&mut a, &name, size as i64);
    let data = pattern(size, 1);
    // Two writes: the whole segment, then a small patch at an odd offset.
    assert_eq!(write_segment(&mut a, &name, 0, &data), size as i64);
    let patch = pattern(777, 2);
    let patch_at = 3 * MIB + 12345;
    assert_eq!(write_segment(&mut a, &name, patch_at as i64, &patch), patch.len() as i64);
    let mut want = data.clone();
    want[patch_at..patch_at + patch.len()].copy_from_slice(&patch);

    let got = read_segment(&mut b, &name, 0, size as i32);
    assert_bytes_eq(&got, &want, "B reads A's whole segment");
    let got = read_segment(&mut b, &name, patch_at as i64, patch.len() as i32);
    assert_bytes_eq(&got, &patch, "B reads A's patch");
    let got = read_segment(&mut a, &name, 0, size as i32);
    assert_bytes_eq(&got, &want, "A reads its own writes");

    let ca = checksum_segment(&mut a, &name, 0, size as i64);
    let cb = checksum_segment(&mut b, &name, 0, size as i64);
    assert_eq!(ca, cb, "checksum_segment differs between sessions");
    let ca = checksum_segment(&mut a, &name, patch_at as i64, patch.len() as i64);
    let cb = checksum_segment(&mut b, &name, patch_at as i64, patch.len() as i64);
    assert_eq!(ca, cb, "checksum_segment of the patch differs between sessions");

    // B writes, A reads: sharing goes both ways.
    let back = pattern(64 * KIB, 3);
    write_segment(&mut b, &name, 0, &back);
    assert_bytes_eq(&read_segment(&mut a, &name, 0, back.len() as i32), &back, "A reads B's write");

    // Who maps the segment now: both sessions (in service mode too where they map the host
    // tier), or the GPU service alone, which did the work of both.
    let row = segment_row(&mut a, &name).expect("segment listed in uvm.segments");
    let pids = vec![backend_pid(&mut a), backend_pid(&mut b)];
    let attached: Vec<i32> = a
        .query("SELECT pid FROM uvm.attachments WHERE segment::text = $1 ORDER BY pid", &[&name])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let local = maps_host_tier(&mut a);
    match execution(&mut a) {
        _ if local => {
            assert!(row.attached_processes >= 2, "attached_processes = {} (want >= 2)", row.attached_processes);
            let n = attached.iter().filter(|p| pids.contains(p)).count();
            assert_eq!(n, 2, "both sessions should be listed in uvm.attachments (attached: {attached:?}, sessions: {pids:?})");
        }
        Execution::Process => unreachable!("a process-mode session maps the host tier"),
        Execution::Service => {
            let service = service_pid(&mut a);
            assert_eq!(row.attached_processes, 1, "service mode: only the service maps {name}");
            assert_eq!(attached, vec![service], "service mode: uvm.attachments of {name} (sessions: {pids:?})");
        }
    }

    drop_segment(&mut a, &name);
    assert!(segment_row(&mut a, &name).is_none(), "segment still listed after drop");
    expect_sqlstate(b.query_one("SELECT uvm.read_segment($1, 0::bigint, 1)", &[&name]), "42704", "reading a dropped segment");
}

#[test]
fn growth_while_another_session_is_attached() {
    let name = unique_name("grow");
    let _guard = SegmentGuard::with(&[&name]);
    let mut a = connect();
    let mut b = connect();

    let old_size = 2 * MIB;
    let new_size = 48 * MIB;
    create_segment_max(&mut a, &name, old_size as i64, 256 * MIB as i64);
    let head = pattern(old_size, 10);
    write_segment(&mut a, &name, 0, &head);

    // B attaches at the old size.
    assert_bytes_eq(&read_segment(&mut b, &name, 0, old_size as i32), &head, "B reads before growth");
    let before = segment_row(&mut a, &name).expect("segment row");
    assert_eq!(before.size, old_size as i64);

    // Past the old end is out of range before growing.
    expect_sqlstate(
        b.query_one("SELECT uvm.read_segment($1, $2, 16)", &[&name, &((old_size + MIB) as i64)]),
        "2202E",
        "read past the end before growth",
    );

    let grown: i64 = a.query_one("SELECT uvm.grow_segment($1, $2)::bigint", &[&name, &(new_size as i64)]).unwrap().get(0);
    assert!(grown >= new_size as i64, "grow_segment returned {grown}, want >= {new_size}");

    // A writes far past the old end (in a new chunk), and across the old boundary.
    let far = pattern(3 * MIB, 11);
    let far_at = 40 * MIB + 4096 + 17;
    write_segment(&mut a, &name, far_at as i64, &far);
    let straddle = pattern(256 * KIB, 12);
    let straddle_at = old_size - 100 * KIB;
    write_segment(&mut a, &name, straddle_at as i64, &straddle);

    // B, still attached with the old mapping, sees the new region.
    assert_bytes_eq(&read_segment(&mut b, &name, far_at as i64, far.len() as i32), &far, "B reads the grown region");
    assert_bytes_eq(
        &read_segment(&mut b, &name, straddle_at as i64, straddle.len() as i32),
        &straddle,
        "B reads across the old end",
    );
    assert_bytes_eq(&read_segment(&mut b, &name, 0, (straddle_at) as i32), &head[..straddle_at], "B still reads the old head");
    assert_eq!(
        checksum_segment(&mut a, &name, 0, new_size as i64),
        checksum_segment(&mut b, &name, 0, new_size as i64),
        "checksums differ after growth"
    );

    let after = segment_row(&mut b, &name).expect("segment row");
    assert_eq!(after.size, grown, "uvm.segments.size after growth");
    assert!(after.chunks > before.chunks, "chunks did not increase: {before:?} -> {after:?}");
    assert!(after.generation > before.generation, "generation did not increase: {before:?} -> {after:?}");

    // B's attachment (the service's where it read for B: `host_tier_pid`) has caught up with the
    // new generation.
    let b_pid = backend_pid(&mut b);
    let reader = host_tier_pid(&mut b, b_pid);
    let mapped: Option<i64> = b
        .query_opt(
            "SELECT mapped_generation::bigint FROM uvm.attachments WHERE pid = $1 AND segment::text = $2",
            &[&reader, &name],
        )
        .unwrap()
        .map(|r| r.get(0));
    assert_eq!(
        mapped,
        Some(after.generation),
        "B's reader {reader} (backend {b_pid}): its row in uvm.attachments (mapped_generation) after reading the grown region"
    );

    drop_segment(&mut a, &name);
}

#[test]
fn pinned_segment_cannot_be_dropped() {
    let name = unique_name("pin");
    let mut guard = SegmentGuard::with(&[&name]);
    let mut a = connect();
    let mut b = connect();

    create_segment(&mut a, &name, MIB as i64);
    let data = pattern(8 * KIB, 20);
    write_segment(&mut a, &name, 0, &data);

    b.execute("SELECT uvm.pin_segment($1)", &[&name]).expect("pin_segment");
    let pins: i64 = b
        .query_one(
            "SELECT coalesce(sum(pins), 0)::bigint FROM uvm.attachments WHERE pid = pg_backend_pid() AND segment::text = $1",
            &[&name],
        )
        .unwrap()
        .get(0);
    assert!(pins >= 1, "B's pin not shown in uvm.attachments (pins = {pins})");

    expect_sqlstate(try_drop_segment(&mut a, &name), "55006", "drop of a segment pinned by B");
    assert!(segment_row(&mut a, &name).is_some(), "failed drop removed the segment");
    assert_bytes_eq(&read_segment(&mut a, &name, 0, data.len() as i32), &data, "A reads after failed drop");

    let unpinned: bool = b.query_one("SELECT uvm.unpin_segment($1)", &[&name]).unwrap().get(0);
    assert!(unpinned, "unpin_segment returned false for a pinned segment");
    let again: bool = b.query_one("SELECT uvm.unpin_segment($1)", &[&name]).unwrap().get(0);
    assert!(!again, "second unpin_segment should return false");

    drop_segment(&mut a, &name);
    guard.forget(&name);
    assert!(segment_row(&mut a, &name).is_none());
}

#[test]
fn pins_are_released_when_the_session_ends() {
    let name = unique_name("pinexit");
    let mut guard = SegmentGuard::with(&[&name]);
    let mut a = connect();
    create_segment(&mut a, &name, MIB as i64);
    {
        let mut b = connect();
        let b_pid = backend_pid(&mut b);
        b.execute("SELECT uvm.pin_segment($1)", &[&name]).expect("pin_segment");
        expect_sqlstate(try_drop_segment(&mut a, &name), "55006", "drop while B's session pins it");
        drop(b); // closes the connection; the backend exits
        assert!(wait_until(Duration::from_secs(10), || !process_alive(b_pid)), "B's backend {b_pid} did not exit");
    }
    let mut last = None;
    let dropped = wait_until(Duration::from_secs(10), || match try_drop_segment(&mut a, &name) {
        Ok(()) => true,
        Err(e) => {
            last = Some(e.to_string());
            false
        }
    });
    assert!(dropped, "drop still fails after the pinning session ended: {last:?}");
    guard.forget(&name);
    assert!(segment_row(&mut a, &name).is_none());
}

#[test]
fn unknown_and_duplicate_names() {
    let name = unique_name("dup");
    let _guard = SegmentGuard::with(&[&name]);
    let mut a = connect();
    create_segment(&mut a, &name, MIB as i64);
    expect_sqlstate(a.query_one("SELECT uvm.create_segment($1, $2)", &[&name, &(MIB as i64)]), "42710", "duplicate create");
    drop_segment(&mut a, &name);
    expect_sqlstate(try_drop_segment(&mut a, &name), "42704", "drop of an unknown segment");
}
