//! Cancellation of the long-running segment functions (issue 8, point 7): `pg_cancel_backend`
//! from a second session and `statement_timeout` each end the statement within 1 s with SQLSTATE
//! 57014, and the segment system is consistent afterwards: no pin held, the segment's size and
//! chunks as before (or as the last completed step left them), exactly one broker fd per chunk
//! (no half-made chunk), the segment can be dropped (the broker's fds go back to where they
//! were), and the next call works.
//!
//! Host provider. A checksum or fill is long only over a large segment, so the segment here is
//! large (`UVM_CANCEL_SEGMENT_BYTES`, default 4 GiB of memfd, released at the end); the test
//! checks that an uninterrupted run takes clearly longer than the moment of the interrupt, so that
//! a machine fast enough to finish first fails loudly rather than passing for nothing. Growth and
//! prefetch do no long work per call under the host provider (a chunk is a sparse memfd; one tier,
//! nothing to move): a large grow is checked to return promptly, and a statement of many grows
//! is cancelled and checked for consistency. Prefetch's long part, waiting for pins to drain and
//! copying chunk after chunk, exists only under the CUDA provider: its test needs the `gpu`
//! feature (the GPU suite).

use std::time::{Duration, Instant};

use pg_uvm_share_tests::*;

/// The most an interrupted statement may take to give up.
const WITHIN: Duration = Duration::from_secs(1);

/// The most a checksum or fill may run on after an interrupt: they serve it between blocks of
/// well under a millisecond (the issue asks for 100 ms; the rest is slack for a loaded machine).
/// An uninterrupted run must take clearly longer, so that an interrupt served only by the
/// executor after the function returned fails this.
const SERVED_INSIDE: Duration = Duration::from_millis(200);

fn segment_bytes() -> i64 {
    std::env::var("UVM_CANCEL_SEGMENT_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(4 << 30)
}

/// How long a whole fill should take for the interrupt test (the segment grows until it does,
/// memory allowing): the interrupt at up to 200 ms, then three times SERVED_INSIDE of room. Two
/// times is the least the test accepts: an interrupt served only after the function returned
/// would then come at least SERVED_INSIDE too late (a 6 GiB fill, the most a CI machine's free
/// memory allowed, took 745 ms on a fast one).
const MIN_WHOLE_RUN: Duration = Duration::from_millis(800);

/// The largest segment the test may grow to: half the memory available now (the segment is
/// memfd memory), at most 16 GiB.
fn max_segment_bytes() -> i64 {
    let avail_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find(|l| l.starts_with("MemAvailable:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<i64>().ok())
        })
        .unwrap_or(0);
    (avail_kib * 1024 / 2).min(16 << 30)
}

/// Bytes of the chunks that back segment `name` (`host_bytes + device_bytes`).
fn backed_bytes(c: &mut Client, name: &str) -> i64 {
    c.query_one("SELECT (host_bytes + device_bytes)::bigint FROM uvm.segments WHERE name = $1", &[&name])
        .unwrap_or_else(|e| panic!("uvm.segments for {name}: {}", describe(&e)))
        .get(0)
}

/// The segment system after an interrupt: no pins, the expected size (when known), chunks that
/// cover it, and one broker memfd per chunk beyond `broker_memfds_before`.
#[track_caller]
fn assert_consistent(
    c: &mut Client,
    what: &str,
    name: &str,
    size: Option<i64>,
    broker: i32,
    broker_memfds_before: usize,
) -> SegmentRow {
    // (In service mode the service stops the abandoned work just after the client's error.)
    assert_eq!(pins_after_interrupt(c, name), 0, "{what}: pins left on {name}");
    let row = segment_row(c, name).unwrap_or_else(|| panic!("{what}: segment {name} is gone"));
    if let Some(size) = size {
        assert_eq!(row.size, size, "{what}: size of {name}");
    }
    let backed = backed_bytes(c, name);
    assert!(row.chunks >= 1 && backed >= row.size, "{what}: {} chunks of {backed} bytes for a size of {}", row.chunks, row.size);
    // A chunk handed to the broker but never committed (or committed twice) shows here.
    let memfds = memfd_count(broker);
    assert_eq!(
        memfds,
        broker_memfds_before + row.chunks as usize,
        "{what}: the broker holds {memfds} memfds, {broker_memfds_before} before + {} chunks expected:\n  {}",
        row.chunks,
        fd_listing(broker)
    );
    row
}

/// Drops `name` and waits for the broker's memfds to come back to `before`.
#[track_caller]
fn drop_and_check_fds(c: &mut Client, name: &str, broker: i32, before: usize) {
    drop_segment(c, name);
    let settled = wait_until(Duration::from_secs(10), || memfd_count(broker) == before);
    assert!(
        settled,
        "broker memfds after dropping {name}: {} (before: {before}):\n  {}",
        memfd_count(broker),
        fd_listing(broker)
    );
}

fn timed(c: &mut Client, sql: &str) -> Duration {
    let t = Instant::now();
    c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
    t.elapsed()
}

#[test]
fn checksum_and_fill_of_a_large_segment_answer_cancel_and_timeout() {
    let mut c = connect();
    let broker = wait_broker(&mut c, Duration::from_secs(10));
    let before = memfd_count(broker);
    let name = unique_name("cancel_big");
    let mut guard = SegmentGuard::with(&[&name]);
    let q = quote_literal(&name);
    // The segment must be large enough that a whole fill leaves room to interrupt it (see the
    // assertion below): from UVM_CANCEL_SEGMENT_BYTES (4 GiB), grown by half (whole GiB) while a
    // fill is shorter than that here and memory allows (a faster machine fills 4 GiB in 0.6 s).
    let mut size = segment_bytes();
    let fill_time = loop {
        create_segment(&mut c, &name, size);
        // The first fill also faults the pages in, so the second one is timed.
        timed(&mut c, &format!("SELECT uvm.fill_segment({q}, 0, {size}, 7)"));
        let t = timed(&mut c, &format!("SELECT uvm.fill_segment({q}, 0, {size}, 7)"));
        let next = (size / 2 * 3 + (1 << 30) - 1) & !((1 << 30) - 1);
        if t >= MIN_WHOLE_RUN || next > max_segment_bytes() {
            break t;
        }
        eprintln!("{size} bytes fill in {} ms here: too short to interrupt, growing to {next}", t.as_millis());
        drop_and_check_fds(&mut c, &name, broker, before);
        size = next;
    };
    let fill = |seed: i64| format!("SELECT uvm.fill_segment({q}, 0, {size}, {seed})");
    let checksum = format!("SELECT uvm.checksum_segment({q}, 0, {size})");

    // Uninterrupted: how long each takes here, and the reference checksum.
    let t = Instant::now();
    let sum: i64 = c.query_one(checksum.as_str(), &[]).unwrap_or_else(|e| panic!("checksum: {}", describe(&e))).get(0);
    let checksum_time = t.elapsed();
    assert_eq!(sum as u64, fill_checksum(7, size as u64), "checksum of the fill pattern");
    eprintln!("{size} bytes: fill {} ms, checksum {} ms", fill_time.as_millis(), checksum_time.as_millis());
    assert_consistent(&mut c, "after the reference fill", &name, Some(size), broker, before);

    // The first cancel in a backend reports slowly when RUST_BACKTRACE is set (CI's machines set
    // it): pgrx raises it as a Rust panic and captures a backtrace, whose first symbolizing loads
    // debug info (100 ms alone, 464 ms once under CI's load), which is not the serving this test
    // measures. A first cancelled fill, not measured, has it done. (A service-mode backend fills
    // and checksums host-tier memfds itself, so this holds in both modes.) It leaves a prefix of
    // seed 9's pattern, as the measured ones do.
    let _ = run_and_interrupt(&mut c, &fill(9), Interrupt::Cancel((fill_time / 5).min(Duration::from_millis(200))));
    for (what, sql, full) in [("fill_segment", fill(9), fill_time), ("checksum_segment", checksum.clone(), checksum_time)] {
        // Interrupt at a fifth of the uninterrupted time, which must leave room to notice.
        let at = (full / 5).min(Duration::from_millis(200));
        assert!(
            full >= at + 2 * SERVED_INSIDE,
            "{what} of {size} bytes takes only {} ms here: too short to interrupt; raise UVM_CANCEL_SEGMENT_BYTES",
            full.as_millis()
        );
        for how in [Interrupt::Cancel(at), Interrupt::Timeout(at)] {
            let i = run_and_interrupt(&mut c, &sql, how);
            eprintln!("{what}: {}", i.describe());
            assert_interrupted(what, &i, WITHIN);
            // Served inside the function, not by the executor once the function has finished
            // (which would also give 57014, and within 1 s on a fast machine).
            assert!(
                i.after_interrupt <= SERVED_INSIDE,
                "{what}: the interrupt was served only {} ms after it came, of {} ms for a whole run; {}",
                i.after_interrupt.as_millis(),
                full.as_millis(),
                i.describe()
            );
            assert_consistent(&mut c, &format!("{what} after {how:?}"), &name, Some(size), broker, before);
            // The session works on: a small call on the same segment.
            let small: i64 = c
                .query_one("SELECT uvm.checksum_segment($1, 0, 4096)", &[&name])
                .unwrap_or_else(|e| panic!("{what}: the next call after {how:?}: {}", describe(&e)))
                .get(0);
            let _ = small;
        }
    }

    // The next full calls work and agree with the reference: the cancelled fills left a prefix of
    // seed 9's pattern, which a complete fill of seed 7 overwrites.
    timed(&mut c, &fill(7));
    let again: i64 = c.query_one(checksum.as_str(), &[]).unwrap().get(0);
    assert_eq!(again, sum, "checksum after the interrupted calls and a complete fill");
    drop_and_check_fds(&mut c, &name, broker, before);
    guard.forget(&name);
}

#[test]
fn a_large_grow_returns_promptly_and_a_statement_of_grows_answers_cancel_and_timeout() {
    let mut c = connect();
    let broker = wait_broker(&mut c, Duration::from_secs(10));
    let before = memfd_count(broker);

    // One large grow: a sparse chunk, no memory touched, so there is nothing long to interrupt.
    let big = unique_name("cancel_grow_big");
    let mut guard = SegmentGuard::with(&[&big]);
    create_segment_max(&mut c, &big, 1 << 20, 48 << 30);
    let t = timed(&mut c, &format!("SELECT uvm.grow_segment({}, {})", quote_literal(&big), 48i64 << 30));
    assert!(t < WITHIN, "a grow to 48 GiB took {} ms", t.as_millis());
    assert_consistent(&mut c, "after a large grow", &big, Some(48 << 30), broker, before);
    drop_and_check_fds(&mut c, &big, broker, before);
    guard.forget(&big);

    // A statement that grows one segment in 8 KiB steps up to 48 GiB (six million calls, a few
    // dozen chunks: seconds even on a fast machine, where 500,000 calls once took 282 ms and
    // ended before the interrupt): interrupted, it leaves the segment at the last completed step.
    const STEP: i64 = 8 << 10;
    const MAX: i64 = 48 << 30;
    for how in [Interrupt::Cancel(Duration::from_millis(300)), Interrupt::Timeout(Duration::from_millis(300))] {
        let name = unique_name("cancel_grow");
        guard.add(&name);
        create_segment_max(&mut c, &name, STEP, MAX);
        let sql = format!(
            "SELECT count(uvm.grow_segment({}, g * {STEP})) FROM generate_series(1::bigint, {}) g",
            quote_literal(&name),
            MAX / STEP
        );
        let i = run_and_interrupt(&mut c, &sql, how);
        eprintln!("grow_segment steps: {}", i.describe());
        assert_interrupted("a statement of grows", &i, WITHIN);
        let row = assert_consistent(&mut c, &format!("grows after {how:?}"), &name, None, broker, before);
        assert!(row.size >= STEP && row.size < MAX && row.size % STEP == 0, "size after the interrupted grows: {}", row.size);
        // The next grow works, and adds chunks only as needed.
        c.execute("SELECT uvm.grow_segment($1, $2)", &[&name, &(row.size + 10 * STEP)])
            .unwrap_or_else(|e| panic!("the next grow after {how:?}: {}", describe(&e)));
        assert_consistent(&mut c, &format!("the next grow after {how:?}"), &name, Some(row.size + 10 * STEP), broker, before);
        drop_and_check_fds(&mut c, &name, broker, before);
        guard.forget(&name);
    }
}

#[test]
fn prefetch_under_the_host_provider_has_nothing_long_to_interrupt() {
    // One tier: prefetch validates and moves nothing, at once, whatever the size.
    let mut c = connect();
    let name = unique_name("cancel_prefetch_host");
    let _guard = SegmentGuard::with(&[&name]);
    create_segment_max(&mut c, &name, 1 << 20, 16 << 30);
    c.execute("SELECT uvm.grow_segment($1, $2)", &[&name, &(16i64 << 30)]).unwrap();
    if device_info_value(&mut c, "provider").as_deref() != Some("host") {
        return; // the CUDA provider: see prefetch_waiting_for_pins_answers_cancel_and_timeout
    }
    let t = Instant::now();
    let moved: i64 = c.query_one("SELECT uvm.prefetch_segment($1, 0, $2, 'host')", &[&name, &(16i64 << 30)]).unwrap().get(0);
    assert_eq!(moved, 0);
    assert!(t.elapsed() < WITHIN);
    expect_sqlstate(
        c.query_one("SELECT uvm.prefetch_segment($1, 0, 4096, 'device')", &[&name]),
        "0A000",
        "prefetch to a missing tier",
    );
    assert_eq!(pins_held(&mut c, &name), 0);
}

/// CUDA provider: a prefetch waits up to `pg_uvm_share.pin_wait_timeout` for other sessions'
/// pins to drain; cancel and statement_timeout end the wait, and the segment is not left marked
/// migrating (a new pin succeeds) with every chunk where it was.
#[cfg(feature = "gpu")]
#[test]
fn prefetch_waiting_for_pins_answers_cancel_and_timeout() {
    let mut c = connect();
    assert_cuda_provider(&mut c);
    let name = unique_name("cancel_prefetch");
    let _guard = SegmentGuard::with(&[&name]);
    let size: i64 = 256 << 20;
    create_segment_tier(&mut c, &name, size, None, "host");
    fill_segment(&mut c, &name, 0, size, 5);
    let mut holder = connect();
    holder.execute("SELECT uvm.pin_segment($1)", &[&name]).unwrap();
    c.batch_execute("SET pg_uvm_share.pin_wait_timeout = '60s'").unwrap();
    let sql = format!("SELECT uvm.prefetch_segment({}, 0, {size}, 'device')", quote_literal(&name));
    for how in [Interrupt::Cancel(Duration::from_millis(300)), Interrupt::Timeout(Duration::from_millis(300))] {
        let i = run_and_interrupt(&mut c, &sql, how);
        eprintln!("prefetch: {}", i.describe());
        assert_interrupted("prefetch waiting for pins", &i, WITHIN);
        assert_eq!(tier_bytes(&mut c, &name), (0, size), "nothing moved after {how:?}");
        // Not left migrating: a pin (a read) from a third session succeeds at once.
        let mut reader = connect();
        reader.batch_execute("SET pg_uvm_share.pin_wait_timeout = '1s'").unwrap();
        assert_eq!(checksum_segment(&mut reader, &name, 0, size) as u64, fill_checksum(5, size as u64));
    }
    holder.execute("SELECT uvm.unpin_segment($1)", &[&name]).unwrap();
    assert_eq!(prefetch_segment(&mut c, &name, 0, size, "device"), size);
    assert_eq!(pins_held(&mut c, &name), 0);
}

/// `pg_terminate_backend` raises FATAL, and PostgreSQL exits without unwinding: a backend
/// terminated inside a checksum (which holds a pin and borrows its segment manager) must still
/// give its pins and attachments back at exit, so that the segment can be dropped.
#[test]
fn a_backend_terminated_mid_checksum_leaves_no_pin_behind() {
    let mut c = connect();
    let broker = wait_broker(&mut c, Duration::from_secs(10));
    let before = memfd_count(broker);
    let name = unique_name("terminate_big");
    let mut guard = SegmentGuard::with(&[&name]);
    let size = segment_bytes() / 2;
    create_segment(&mut c, &name, size);
    let q = quote_literal(&name);
    timed(&mut c, &format!("SELECT uvm.fill_segment({q}, 0, {size}, 3)"));

    let mut victim = connect();
    let pid = backend_pid(&mut victim);
    let sql = format!("SELECT uvm.checksum_segment({q}, 0, {size})");
    let runner = std::thread::spawn(move || victim.batch_execute(&sql).map_err(|e| describe(&e)));
    // Terminate once the checksum holds its pin (it pins before it reads).
    let pinned = wait_until(Duration::from_secs(10), || pins_held(&mut c, &name) > 0);
    assert!(pinned, "the checksum never pinned {name}");
    let t = Instant::now();
    c.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    let outcome = runner.join().unwrap();
    assert!(outcome.is_err(), "the terminated checksum completed");
    assert!(wait_until(Duration::from_secs(5), || !process_alive(pid)), "backend {pid} still alive");
    eprintln!("terminated after {} ms: {}", t.elapsed().as_millis(), outcome.unwrap_err());

    let left: i64 = c.query_one("SELECT count(*) FROM uvm.attachments WHERE pid = $1", &[&pid]).unwrap().get(0);
    assert_eq!(left, 0, "attachments of the terminated backend {pid} remain");
    assert_consistent(&mut c, "after pg_terminate_backend", &name, Some(size), broker, before);
    drop_and_check_fds(&mut c, &name, broker, before);
    guard.forget(&name);
}

/// Issue 24, point 6: a backend terminated in the middle of a parallel GpuJoin plan node query
/// (its inner table and result buffer in temporary segments, its parallel workers attached)
/// leaves nothing: no temporary segment, no attachment of the backend, no broker fd. The query
/// returns wide rows to a client that stops reading after the first, so the leader blocks on
/// its socket with the node's state alive, whatever the machine's speed.
#[test]
fn a_backend_terminated_mid_node_query_leaves_nothing() {
    use postgres::fallible_iterator::FallibleIterator;
    let mut c = connect();
    let broker = wait_broker(&mut c, Duration::from_secs(10));
    c.batch_execute(
        "DROP TABLE IF EXISTS term_fact, term_dim;
         CREATE TABLE term_fact AS SELECT (i % 50000)::bigint AS k FROM generate_series(1, 300000) i;
         CREATE TABLE term_dim AS SELECT i::bigint AS k, i::bigint AS v FROM generate_series(1, 50000) i;
         ANALYZE term_fact, term_dim;",
    )
    .expect("test tables");
    let temp = |c: &mut Client| -> Vec<String> {
        c.query("SELECT name FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin%' ORDER BY name", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    assert!(temp(&mut c).is_empty(), "temporary segments before the test: {:?}", temp(&mut c));
    let before = memfd_count(broker);

    let mut victim = connect();
    let pid = backend_pid(&mut victim);
    victim
        .batch_execute(
            "SET pg_uvm_share.enable_gpujoin = on; SET enable_hashjoin = off; SET enable_mergejoin = off;
             SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
             SET max_parallel_workers_per_gather = 2;",
        )
        .unwrap();
    let sql = "SELECT f.k, d.v, repeat('x', 4000) AS pad FROM term_fact f JOIN term_dim d ON f.k = d.k";
    let plan: Vec<String> = victim.query(&format!("EXPLAIN (COSTS OFF) {sql}"), &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert!(plan.iter().any(|l| l.contains("UvmGpuJoin")), "the plan node is not used:\n{}", plan.join("\n"));
    let mut rows = victim.query_raw(sql, std::iter::empty::<i32>()).expect("the join starts");
    assert!(rows.next().expect("a first row").is_some(), "the join returned no row");
    let held = temp(&mut c);
    assert!(!held.is_empty(), "the node holds no temporary segment mid-query");

    let t = Instant::now();
    c.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    // The client goes away, as a terminated session's does. It must: a backend the signal
    // finds inside the node (between two flushes of its output, not blocked on the socket)
    // raises its FATAL there, and PostgreSQL then writes that message to the client, which
    // blocks while the socket is full and nobody reads (elog.c sends it before proc_exit).
    // Closing the connection reads what is left, so that write ends; it runs in a thread,
    // because it waits for the backend to close its end: a backend that never exits fails the
    // assertion below instead of hanging the test.
    drop(rows);
    let closer = std::thread::spawn(move || drop(victim));
    let exited = wait_until(Duration::from_secs(10), || !process_alive(pid));
    assert!(exited, "backend {pid} still alive 10 s after pg_terminate_backend and its client closed");
    closer.join().expect("closing the terminated session's connection");
    let mut left = held.clone();
    let gone = wait_until(Duration::from_secs(10), || {
        left = temp(&mut c);
        left.is_empty()
    });
    assert!(gone, "temporary segments left after the backend was terminated: {left:?} (held before: {held:?})");
    eprintln!("terminated mid-query after {} ms; {} temporary segment(s) dropped", t.elapsed().as_millis(), held.len());
    let attached: i64 = c.query_one("SELECT count(*) FROM uvm.attachments WHERE pid = $1", &[&pid]).unwrap().get(0);
    assert_eq!(attached, 0, "attachments of the terminated backend {pid} remain");
    let mut now = 0;
    let fds_back = wait_until(Duration::from_secs(10), || {
        now = memfd_count(broker);
        now == before
    });
    assert!(fds_back, "the broker holds {now} memfds, {before} before the query");
    c.batch_execute("DROP TABLE term_fact, term_dim").unwrap();
}
