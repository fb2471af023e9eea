//! GPU tests: the CUDA provider's kernels, tiers, migration and clean-up against a live cluster.
//!
//! Built only with `--features gpu` and run by `scripts/gpu-suite run` on the GPU machine, one
//! test at a time (`--test-threads=1`, name order): the crash test is named to run last, since
//! the crash restart terminates every session of the cluster. Every test first asserts that the
//! cluster runs the CUDA provider, in the execution mode the suite expects.
//!
//! The suite runs these tests twice, on a cluster started with `pg_uvm_share.gpu_execution =
//! process` (every process with its own CUDA context) and with `service` (one GPU service runs
//! every operation on segment memory), setting `UVM_EXPECT_EXECUTION` to the mode. The results
//! must be the same in both; what is inherently per process (which process holds a CUDA
//! context, whose pins a request holds) is asserted for the mode at hand, never skipped.
//!
//! The expected values come from the crate's own copy of the checksum and fill pattern
//! (`checksum`, `checksum_from`, `fill`, `fill_range`, `fill_checksum` in src/checksum.rs).
//!
//! Measurements worth reading (prefetch timings, memory figures) are printed to stderr and, when
//! `UVM_GPU_NOTES` names a file, appended to it; the suite puts them in its report.

use pg_uvm_share_tests::*;
use std::collections::{BTreeSet, HashMap};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB_I: i64 = 1 << 20;
const GIB_I: i64 = 1 << 30;

/// The execution mode of the cluster under test (`uvm.device_info()` row `execution`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `gpu_execution = process`: each backend and parallel worker has its own CUDA context.
    Process,
    /// `gpu_execution = service`: the GPU service holds the cluster's only CUDA context.
    Service,
}

fn parse_mode(s: &str) -> Option<Mode> {
    match s {
        "process" => Some(Mode::Process),
        "service" => Some(Mode::Service),
        _ => None,
    }
}

/// Asserts that the cluster runs the CUDA provider, in the execution mode `UVM_EXPECT_EXECUTION`
/// names (process or service; scripts/gpu-suite sets it for each cluster it starts), and
/// returns the mode. Without the variable, the mode is whatever the cluster reports.
#[track_caller]
fn start(c: &mut Client) -> Mode {
    assert_cuda_provider(c);
    let shown = device_info_value(c, "execution");
    let mode = shown
        .as_deref()
        .and_then(parse_mode)
        .unwrap_or_else(|| panic!("uvm.device_info() says execution = {shown:?}: neither process nor service"));
    if let Ok(want) = std::env::var("UVM_EXPECT_EXECUTION") {
        let want = parse_mode(&want).unwrap_or_else(|| panic!("UVM_EXPECT_EXECUTION={want:?}: must be process or service"));
        assert_eq!(mode, want, "the cluster runs execution mode {mode:?}, the suite expects {want:?}");
    }
    // `GPU_SUITE_NVRTC=12 scripts/gpu-suite run`: the kernels are compiled by NVRTC 12.
    if let Ok(want) = std::env::var("UVM_EXPECT_NVRTC") {
        let nvrtc = device_info_value(c, "nvrtc");
        assert!(
            nvrtc.as_deref().is_some_and(|v| v.starts_with(&format!("{want}."))),
            "uvm.device_info() says nvrtc = {nvrtc:?}; the suite expects NVRTC {want}"
        );
    }
    mode
}

/// The GPU service's pid (`uvm.device_info()` row `service_pid`; 0 when none runs).
fn service_pid(c: &mut Client) -> i32 {
    let v = device_info_value(c, "service_pid").expect("uvm.device_info() has no service_pid row");
    v.trim().parse().unwrap_or_else(|_| panic!("service_pid is not a pid: {v:?}"))
}

/// Requests submitted to the GPU service so far (`uvm.device_info()` row `service_requests`:
/// "N submitted, ...").
fn service_submitted(c: &mut Client) -> u64 {
    let v = device_info_value(c, "service_requests").expect("uvm.device_info() has no service_requests row");
    v.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("service_requests: {v:?}"))
}

/// A measurement for the report: stderr, and a line in `$UVM_GPU_NOTES` if set.
fn note(test: &str, msg: &str) {
    eprintln!("[{test}] {msg}");
    if let Some(path) = std::env::var_os("UVM_GPU_NOTES") {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "- `{test}`: {msg}");
        }
    }
}

fn gbps(bytes: i64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn checksum_u64(c: &mut Client, name: &str, offset: i64, len: i64) -> u64 {
    checksum_segment(c, name, offset, len) as u64
}

/// Waits until no other client backend or parallel worker is connected (the sessions of earlier
/// tests exit asynchronously, and each holds a CUDA context).
fn wait_alone(c: &mut Client, timeout: Duration) {
    let mut others = -1i64;
    let ok = wait_until(timeout, || {
        others = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                  WHERE pid <> pg_backend_pid() \
                    AND backend_type IN ('client backend', 'parallel worker')",
                &[],
            )
            .expect("pg_stat_activity")
            .get(0);
        others == 0
    });
    assert!(ok, "{others} other sessions still connected after {timeout:?}");
}

/// GPU memory used once it stops moving (two readings 300 ms apart within 2 MiB; at most 10 s).
fn settled_gpu_memory_mib() -> u64 {
    let start = Instant::now();
    let mut last = gpu_memory_used_mib();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = gpu_memory_used_mib();
        if now.abs_diff(last) <= 2 || start.elapsed() > Duration::from_secs(10) {
            return now;
        }
        last = now;
    }
}

/// Compares `[offset, offset + len)` of a segment (read on the CPU through read_segment) with
/// the fill pattern of `seed` laid from the segment's offset `fill_start`.
#[track_caller]
fn assert_filled(c: &mut Client, name: &str, fill_start: i64, seed: u64, offset: i64, len: i64, what: &str) {
    let got = read_segment_all(c, name, offset, len);
    let want = fill_range(seed, (offset - fill_start) as u64, len as usize);
    assert_bytes_eq(&got, &want, &format!("{what}: {name}[{offset}, +{len})"));
}

// --- a. one segment, many processes ------------------------------------------------------------

#[test]
fn a_checksum_across_sessions_and_parallel_workers() {
    const T: &str = "a_checksum_across_sessions_and_parallel_workers";
    const SIZE: i64 = 256 * MIB_I;
    const PIECE: i64 = 64 * MIB_I;
    const ROWS: i64 = 400;
    let seg = unique_name("gpu_a");
    let table = unique_name("gpu_a_t");
    let _guard = SegmentGuard::with(&[&seg]);

    let mut a = connect();
    start(&mut a);
    create_segment_tier(&mut a, &seg, SIZE, None, "device");
    assert_eq!(tier_bytes(&mut a, &seg), (SIZE, 0), "device-tier segment's bytes per tier");
    let mut want = Vec::with_capacity(SIZE as usize);
    for k in 0..SIZE / PIECE {
        let p = pattern(PIECE as usize, 100 + k as u64);
        write_segment(&mut a, &seg, k * PIECE, &p);
        want.extend_from_slice(&p);
    }

    // Session B reads the bytes back on the CPU; the Rust checksum of those is the reference.
    let mut b = connect();
    let back = read_segment_all(&mut b, &seg, 0, SIZE);
    assert_bytes_eq(&back, &want, "bytes written in A, read in B");
    let rust = checksum(&back);
    assert_eq!(checksum_u64(&mut b, &seg, 0, SIZE), rust, "GPU checksum in B vs Rust");
    assert_eq!(checksum_u64(&mut a, &seg, 0, SIZE), rust, "GPU checksum in A vs Rust");

    // Sub-ranges, aligned or not, across the 64 MiB write boundaries.
    for (off, len) in
        [(0i64, 8i64), (12_345, 10_000_001), (PIECE - 3, 7), (PIECE * 2 - 4096, 8192 + 5), (SIZE - 1001, 1001), (SIZE - 1, 1)]
    {
        let r = checksum(&back[off as usize..(off + len) as usize]);
        assert_eq!(checksum_u64(&mut b, &seg, off, len), r, "GPU checksum of [{off}, +{len}) in B vs Rust");
    }

    // Parallel workers: every row of a parallel scan (leader not participating) checksums the
    // whole segment on the GPU and must get the reference value.
    a.batch_execute(&format!(
        "DROP TABLE IF EXISTS {table};
         CREATE TABLE {table} (i int NOT NULL) WITH (fillfactor = 10, parallel_workers = 4);
         INSERT INTO {table} SELECT g FROM generate_series(1, {ROWS}) g;
         ANALYZE {table};"
    ))
    .expect("create test table");
    b.batch_execute(
        "SET parallel_setup_cost = 0;
         SET parallel_tuple_cost = 0;
         SET min_parallel_table_scan_size = 0;
         SET max_parallel_workers_per_gather = 4;
         SET parallel_leader_participation = off;",
    )
    .and_then(|()| b.batch_execute(FORCE_PARALLEL_SQL))
    .expect("parallel settings");
    let q =
        format!("SELECT count(*) FROM {table} WHERE uvm.checksum_segment({}, 0, {SIZE}) = {}", quote_literal(&seg), rust as i64);
    let t = Instant::now();
    let n: i64 = b.query_one(q.as_str(), &[]).map_err(|e| describe(&e)).expect("parallel checksum query").get(0);
    let took = t.elapsed();
    assert_eq!(n, ROWS, "rows whose GPU checksum (computed in parallel workers) matched");
    let plan = explain_analyze(&mut b, &q);
    let launched = workers_launched(&plan);
    assert!(
        launched.iter().any(|&w| w > 0),
        "no parallel workers launched (plan below); the checksums were not computed in workers:\n{plan}"
    );
    note(
        T,
        &format!(
            "{ROWS} GPU checksums of {} MiB in parallel workers (launched {launched:?}) in {:.0} ms",
            SIZE / MIB_I,
            took.as_secs_f64() * 1e3
        ),
    );

    a.batch_execute(&format!("DROP TABLE {table}")).unwrap();
    drop(b);
    drop_segment(&mut a, &seg);
}

// --- b. host tier, fill kernel on both tiers ---------------------------------------------------

#[test]
fn b_host_tier_and_fill_kernel() {
    const SIZE: i64 = 64 * MIB_I;
    let host = unique_name("gpu_b_host");
    let dev = unique_name("gpu_b_dev");
    let _guard = SegmentGuard::with(&[&host, &dev]);
    let mut c = connect();
    let mode = start(&mut c);

    create_segment_tier(&mut c, &host, SIZE, None, "host");
    assert_eq!(tier_bytes(&mut c, &host), (0, SIZE), "host-tier segment's bytes per tier");
    create_segment_tier(&mut c, &dev, SIZE, None, "device");
    assert_eq!(tier_bytes(&mut c, &dev), (SIZE, 0), "device-tier segment's bytes per tier");

    // In service mode the host segment's chunks are memfds that this backend maps: with
    // map_host_tier on (the default) its bytes are read, written, checksummed and filled here,
    // on the CPU, and the service does none of it; with it off the service does all of it, its
    // kernels reading and writing the same pages (registered with CUDA at the segment's
    // address when a kernel first needs them). Process mode: every pass runs in this backend.
    let passes: &[(&String, u64, bool)] = match mode {
        Mode::Service => &[(&host, 200, true), (&host, 202, false), (&dev, 201, true)],
        Mode::Process => &[(&host, 200, true), (&dev, 201, true)],
    };
    for &(name, seed, here) in passes {
        c.batch_execute(&format!("SET pg_uvm_share.map_host_tier = {here}")).unwrap();
        let submitted = (mode == Mode::Service).then(|| service_submitted(&mut c));
        // Written through SQL, checksummed by the GPU (or by this backend, where it maps the bytes).
        let mut model = pattern(SIZE as usize, seed);
        write_segment(&mut c, name, 0, &model);
        assert_eq!(checksum_u64(&mut c, name, 0, SIZE), checksum(&model), "GPU checksum of {name} after an SQL write");
        // Filled by the GPU, read back on the CPU; bytes around each range stay as they were.
        let fills: [(i64, i64, i64); 4] =
            [(MIB_I, 5 * MIB_I + 3, 42), (8 * MIB_I + 5, MIB_I + 1, 1 << 40), (SIZE - 4099, 4099, 3), (0, 1, 77)];
        for (off, len, s) in fills {
            fill_segment(&mut c, name, off, len, s);
            fill(&mut model[off as usize..(off + len) as usize], s as u64);
            let lo = (off - 64).max(0);
            let hi = (off + len + 64).min(SIZE);
            let got = read_segment(&mut c, name, lo, (hi - lo) as i32);
            assert_bytes_eq(
                &got,
                &model[lo as usize..hi as usize],
                &format!("{name} after fill_segment({off}, {len}, seed {s}), with 64 bytes around"),
            );
            assert_filled(&mut c, name, off, s as u64, off, len, "fill_segment range");
        }
        let back = read_segment_all(&mut c, name, 0, SIZE);
        assert_bytes_eq(&back, &model, &format!("{name}, whole, after the fills"));
        assert_eq!(checksum_u64(&mut c, name, 0, SIZE), checksum(&model), "GPU checksum of {name} after the fills");
        // A whole-segment fill.
        fill_segment(&mut c, name, 0, SIZE, 9);
        assert_eq!(
            checksum_u64(&mut c, name, 0, SIZE),
            fill_checksum(9, SIZE as u64),
            "GPU checksum of {name} after a whole fill"
        );
        assert_filled(&mut c, name, 0, 9, SIZE / 2 + 3, MIB_I, "whole fill");
        if let Some(before) = submitted {
            let sent = service_submitted(&mut c) - before;
            if name == &host && here {
                // (1: the uvm.device_info() call that counts them.)
                assert_eq!(sent, 1, "service mode, map_host_tier on: the host segment's requests all ran in this backend");
                let me: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
                let maps = process_maps(me).expect("this backend's maps").expect("this backend is alive");
                let memfds = maps.lines().filter(|l| l.contains("memfd:pg_uvm_share host chunk")).count();
                assert!(memfds > 0, "service mode: this backend maps no host chunk memfd of {name}");
                assert!(!maps.contains("libcuda"), "service mode: this backend maps libcuda");
            } else {
                assert!(sent >= 10, "service mode: {name} (map_host_tier {here}) sent {sent} requests to the service");
            }
        }
    }
    c.batch_execute("RESET pg_uvm_share.map_host_tier").unwrap();

    // The tier of each stayed what it was created as.
    assert_eq!(tier_bytes(&mut c, &host), (0, SIZE));
    assert_eq!(tier_bytes(&mut c, &dev), (SIZE, 0));
    drop_segment(&mut c, &host);
    drop_segment(&mut c, &dev);
}

// --- c. growth seen by kernels in another process ----------------------------------------------

#[test]
fn c_growth_seen_by_kernels_in_other_process() {
    let seg = unique_name("gpu_c");
    let _guard = SegmentGuard::with(&[&seg]);
    let mut a = connect();
    start(&mut a);
    let mut b = connect();

    let sizes = [64 * MIB_I, 256 * MIB_I, GIB_I];
    create_segment_tier(&mut a, &seg, sizes[0], Some(GIB_I), "device");
    fill_segment(&mut a, &seg, 0, sizes[0], 1);
    let mut want_whole = fill_checksum(1, sizes[0] as u64);
    assert_eq!(checksum_u64(&mut b, &seg, 0, sizes[0]), want_whole, "B's checksum before growth");
    let mut generation = segment_row(&mut a, &seg).unwrap().generation;
    // (start, seed) of each filled region
    let mut regions: Vec<(i64, u64)> = vec![(0, 1)];

    for (k, w) in sizes.windows(2).enumerate() {
        let (old, new) = (w[0], w[1]);
        let seed = 2 + k as u64;
        let got = a
            .query_one("SELECT uvm.grow_segment($1, $2)::bigint", &[&seg, &new])
            .map_err(|e| describe(&e))
            .expect("grow_segment")
            .get::<_, i64>(0);
        assert_eq!(got, new, "grow_segment's result");
        let row = segment_row(&mut a, &seg).unwrap();
        assert!(row.generation > generation, "generation did not advance with growth");
        generation = row.generation;
        assert_eq!(tier_bytes(&mut a, &seg).0, new, "device bytes after growth");
        fill_segment(&mut a, &seg, old, new - old, seed as i64);

        // B, attached at the old size, checksums the new region and the whole segment.
        let new_part = fill_checksum(seed, (new - old) as u64);
        assert_eq!(
            checksum_u64(&mut b, &seg, old, new - old),
            new_part,
            "B's GPU checksum of the region [{old}, {new}) A grew and filled"
        );
        // Whole range: the new region's words have indices from old / 8.
        let mut piece = vec![0u8; (new - old) as usize];
        fill(&mut piece, seed);
        want_whole = want_whole.wrapping_add(checksum_from(&piece, (old / 8) as u64));
        drop(piece);
        assert_eq!(checksum_u64(&mut b, &seg, 0, new), want_whole, "B's GPU checksum of the whole segment after growth to {new}");
        // And B's CPU mapping of both sides of the boundary.
        let (prev_start, prev_seed) = regions.last().copied().unwrap();
        assert_filled(&mut b, &seg, prev_start, prev_seed, old - 4096, 4096, "B reads before the growth boundary");
        assert_filled(&mut b, &seg, old, seed, old, 4096, "B reads after the growth boundary");
        regions.push((old, seed));
    }
    drop(b);
    drop_segment(&mut a, &seg);
}

// --- d. spill to the host tier beyond the device budget ----------------------------------------

/// Resets `pg_uvm_share.device_memory_limit` on scope exit, also when the test fails.
struct ResetDeviceLimit;

impl Drop for ResetDeviceLimit {
    fn drop(&mut self) {
        if let Ok(mut c) = try_connect() {
            let _ = c.batch_execute("ALTER SYSTEM RESET pg_uvm_share.device_memory_limit");
            let _ = c.batch_execute("SELECT pg_reload_conf()");
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
}

#[test]
fn d_spill_beyond_device_memory_limit() {
    const T: &str = "d_spill_beyond_device_memory_limit";
    const SIZE: i64 = 3 * GIB_I;
    const LIMIT: i64 = 2 * GIB_I;
    let seg = unique_name("gpu_d");
    let dev = unique_name("gpu_d_dev");
    let _guard = SegmentGuard::with(&[&seg, &dev]);
    let mut admin = connect();
    start(&mut admin);

    let _reset = ResetDeviceLimit;
    admin
        .batch_execute("ALTER SYSTEM SET pg_uvm_share.device_memory_limit = '2GB'")
        .map_err(|e| describe(&e))
        .expect("ALTER SYSTEM SET device_memory_limit");
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(1200));

    let mut c = connect();
    let shown: String = c.query_one("SHOW pg_uvm_share.device_memory_limit", &[]).unwrap().get(0);
    note(T, &format!("device_memory_limit in a new session: {shown}"));

    let t = Instant::now();
    create_segment_tier(&mut c, &seg, SIZE, None, "auto");
    let create_ms = t.elapsed().as_secs_f64() * 1e3;
    let (d, h) = tier_bytes(&mut c, &seg);
    note(
        T,
        &format!(
            "3 GiB 'auto' segment under a 2 GiB limit: device {} MiB, host {} MiB, created in {create_ms:.0} ms",
            d / MIB_I,
            h / MIB_I
        ),
    );
    assert!(d <= LIMIT, "device_bytes {d} over the 2 GiB limit");
    assert!(h > 0, "nothing spilled to the host tier (device {d}, host {h})");
    assert_eq!(d + h, SIZE, "device + host bytes of the spilled segment");

    expect_sqlstate(
        try_create_segment_tier(&mut c, &dev, SIZE, None, "device"),
        "53400",
        "3 GiB device-tier segment under a 2 GiB device limit",
    );
    assert!(segment_row(&mut c, &dev).is_none(), "the failed device segment is listed");

    let t = Instant::now();
    fill_segment(&mut c, &seg, 0, SIZE, 7);
    let fill_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let gpu = checksum_u64(&mut c, &seg, 0, SIZE);
    let sum_ms = t.elapsed().as_secs_f64() * 1e3;
    let rust = fill_checksum(7, SIZE as u64);
    assert_eq!(gpu, rust, "GPU checksum of the 3 GiB spilled segment after fill_segment(seed 7)");
    note(T, &format!("fill of 3 GiB across tiers {fill_ms:.0} ms, checksum {sum_ms:.0} ms"));
    // The CPU sees the same bytes on both sides of the device/host boundary.
    if d > 0 && h > 0 {
        assert_filled(&mut c, &seg, 0, 7, d - MIB_I / 2 - 3, MIB_I, "across the tier boundary");
    }
    assert_filled(&mut c, &seg, 0, 7, SIZE - MIB_I, MIB_I, "end of the host part");

    drop_segment(&mut c, &seg);
    drop(c);
    admin.batch_execute("ALTER SYSTEM RESET pg_uvm_share.device_memory_limit").unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
}

// --- e. migration both ways ---------------------------------------------------------------------

#[test]
fn e_migration_both_ways() {
    const T: &str = "e_migration_both_ways";
    const SIZE: i64 = 512 * MIB_I;
    const SEED: u64 = 11;
    let seg = unique_name("gpu_e");
    let _guard = SegmentGuard::with(&[&seg]);
    let mut a = connect();
    start(&mut a);
    let mut b = connect();

    create_segment_tier(&mut a, &seg, SIZE, None, "device");
    fill_segment(&mut a, &seg, 0, SIZE, SEED as i64);
    let want = fill_checksum(SEED, SIZE as u64);
    let c0 = checksum_u64(&mut a, &seg, 0, SIZE);
    assert_eq!(c0, want, "GPU checksum after fill vs Rust");
    assert_eq!(checksum_u64(&mut b, &seg, 0, SIZE), want, "B's GPU checksum before migration");
    let (d0, h0) = tier_bytes(&mut a, &seg);
    assert_eq!(h0, 0, "device segment has host bytes before migration");
    let committed = d0 + h0;

    let ranges = [(0i64, MIB_I), (200 * MIB_I + 3, 777_777), (SIZE - 4096, 4096)];
    for (tier, (want_d, want_h)) in [("host", (0, committed)), ("device", (committed, 0))] {
        let t = Instant::now();
        let moved = prefetch_segment(&mut a, &seg, 0, SIZE, tier);
        let took = t.elapsed();
        assert!(moved > 0, "prefetch to {tier} moved {moved} bytes");
        assert_eq!(tier_bytes(&mut a, &seg), (want_d, want_h), "(device_bytes, host_bytes) after prefetch to {tier}");
        note(
            T,
            &format!(
                "prefetch 512 MiB to {tier}: moved {} MiB in {:.1} ms ({:.1} GB/s, client-side)",
                moved / MIB_I,
                took.as_secs_f64() * 1e3,
                gbps(moved, took)
            ),
        );
        assert_eq!(checksum_u64(&mut a, &seg, 0, SIZE), c0, "A's GPU checksum after prefetch to {tier}");
        assert_eq!(checksum_u64(&mut b, &seg, 0, SIZE), c0, "B's GPU checksum after prefetch to {tier}");
        for (off, len) in ranges {
            assert_filled(&mut a, &seg, 0, SEED, off, len, &format!("A's CPU read after prefetch to {tier}"));
            assert_filled(&mut b, &seg, 0, SEED, off, len, &format!("B's CPU read after prefetch to {tier}"));
        }
        // A second prefetch to the same tier has nothing to move.
        let again = prefetch_segment(&mut a, &seg, 0, SIZE, tier);
        assert_eq!(again, 0, "a repeated prefetch to {tier} moved bytes");
    }
    drop(b);
    drop_segment(&mut a, &seg);
}

/// Issue 25 point 2, the held-out shape: a 2 GiB segment, four sessions checksumming it in a
/// loop with 50 ms pauses, one session moving it host <-> device ten times: ten of ten, no
/// 55P03, every checksum right. Then readers that hand their pins over (the segment is never
/// free unless the waiting migration holds new pins back).
#[test]
fn e_migrations_under_readers_are_not_starved() {
    const T: &str = "e_migrations_under_readers_are_not_starved";
    let mut c = connect();
    start(&mut c);
    for (size, readers, how, moves) in [(2048 * MIB_I, 4, Readers::Pausing, 10), (256 * MIB_I, 3, Readers::HandingOver, 6)] {
        let t = Instant::now();
        let counts = migrations_under_readers(connect, size, readers, how, moves);
        note(
            T,
            &format!(
                "{how:?}: {moves} of {moves} moves of {} MiB under {readers} readers in {:.0} ms; checksums per reader {counts:?}",
                size / MIB_I,
                t.elapsed().as_secs_f64() * 1e3
            ),
        );
    }
}

// --- f. create/drop cycles do not leak device memory -------------------------------------------

#[test]
fn f_create_drop_cycles_keep_gpu_memory_flat() {
    const T: &str = "f_create_drop_cycles_keep_gpu_memory_flat";
    const SIZE: i64 = 64 * MIB_I;
    const CYCLES: usize = 200;
    let seg = unique_name("gpu_f");
    let _guard = SegmentGuard::with(&[&seg]);
    let mut c = connect();
    start(&mut c);
    wait_alone(&mut c, Duration::from_secs(30));
    let want = fill_checksum(5, SIZE as u64);
    let cycle = |c: &mut Client, i: usize| {
        create_segment_tier(c, &seg, SIZE, None, "device");
        fill_segment(c, &seg, 0, SIZE, 5);
        assert_eq!(checksum_u64(c, &seg, 0, SIZE), want, "checksum in cycle {i}");
        drop_segment(c, &seg);
    };
    cycle(&mut c, 0);
    let before = settled_gpu_memory_mib();
    let t = Instant::now();
    for i in 1..=CYCLES {
        cycle(&mut c, i);
    }
    let took = t.elapsed();
    let mut after = 0;
    let flat = wait_until(Duration::from_secs(10), || {
        after = gpu_memory_used_mib();
        after <= before + 64
    });
    note(
        T,
        &format!(
            "{CYCLES} cycles of 64 MiB create/fill/checksum/drop in {:.2} s ({:.1} ms each); GPU memory used {before} MiB before, {after} MiB after",
            took.as_secs_f64(),
            took.as_secs_f64() * 1e3 / CYCLES as f64
        ),
    );
    assert!(flat, "GPU memory grew over {CYCLES} create/drop cycles: {before} MiB -> {after} MiB");
    let n: i64 = c.query_one("SELECT count(*) FROM uvm.segments WHERE name = $1", &[&seg]).unwrap().get(0);
    assert_eq!(n, 0);
}

// --- g. GpuJoin probe on the GPU, against PostgreSQL's join ----------------------------------

#[test]
fn g_gpujoin_matches_postgres_join() {
    const T: &str = "g_gpujoin_matches_postgres_join";
    let mut c = connect();
    let mode = start(&mut c);
    c.batch_execute(
        "DROP TABLE IF EXISTS gj_dim, gj_fact;
         CREATE TABLE gj_dim AS SELECT i::bigint AS k, (i % 1000)::bigint AS v FROM generate_series(1, 200000) i;
         INSERT INTO gj_dim SELECT i, -i FROM generate_series(1, 5000) i;        -- duplicate keys
         INSERT INTO gj_dim VALUES (NULL, 1), (9223372036854775807, 5), (-9223372036854775808, 6);
         CREATE TABLE gj_fact AS SELECT CASE WHEN i % 97 = 0 THEN NULL ELSE (i::bigint * 2654435761) % 400000 END AS k
           FROM generate_series(1, 3000000) i;
         INSERT INTO gj_fact VALUES (9223372036854775807), (-9223372036854775808);
         ANALYZE gj_dim, gj_fact;
         SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
         SET max_parallel_workers_per_gather = 4;",
    )
    .expect("test tables");
    let seg = unique_name("gj");
    let t = Instant::now();
    let rows: i64 = c
        .query_one("SELECT uvm.gpujoin_build($1, 'SELECT k, v FROM gj_dim')", &[&seg])
        .map_err(|e| describe(&e))
        .expect("gpujoin_build")
        .get(0);
    note(T, &format!("built a {rows}-row inner table on the GPU in {:.0} ms", t.elapsed().as_secs_f64() * 1e3));
    let device: i64 = c.query_one("SELECT device_bytes FROM uvm.segments WHERE name = $1", &[&seg]).unwrap().get(0);
    assert!(device > 0, "the inner table is not device-resident");
    let q = format!(
        "SELECT m.matches, m.payload_sum::text FROM (SELECT (uvm.gpujoin_probe({}, k)).* FROM gj_fact) m(matches, payload_sum)",
        quote_literal(&seg)
    );
    let t = Instant::now();
    let ours = c.query_one(q.as_str(), &[]).map_err(|e| describe(&e)).expect("gpujoin_probe");
    let probe_ms = t.elapsed().as_secs_f64() * 1e3;
    let theirs =
        c.query_one("SELECT count(*), sum(d.v)::text FROM gj_fact f JOIN gj_dim d ON f.k = d.k", &[]).expect("PostgreSQL's join");
    assert_eq!(
        (ours.get::<_, i64>(0), ours.get::<_, Option<String>>(1)),
        (theirs.get::<_, i64>(0), theirs.get::<_, Option<String>>(1))
    );
    note(T, &format!("GPU probe of 3 M keys: {} matches, same as PostgreSQL's join, in {probe_ms:.0} ms", ours.get::<_, i64>(0)));
    let plan = explain_analyze(&mut c, &q);
    assert!(plan.contains("Partial Aggregate"), "{plan}");
    assert!(workers_launched(&plan).iter().any(|&w| w > 0), "no workers launched:\n{plan}");
    // int4 keys, and a key type mismatch
    let seg4 = unique_name("gj4");
    c.query_one("SELECT uvm.gpujoin_build($1, 'SELECT k::int, v FROM gj_dim WHERE k BETWEEN 0 AND 2000000000')", &[&seg4])
        .expect("int4 build");
    let q4 = format!(
        "SELECT (uvm.gpujoin_probe({}, k::int)).matches FROM gj_fact WHERE k BETWEEN 0 AND 2000000000",
        quote_literal(&seg4)
    );
    let m4: i64 = c.query_one(q4.as_str(), &[]).map_err(|e| describe(&e)).expect("int4 probe").get(0);
    let j4: i64 = c
        .query_one("SELECT count(*) FROM gj_fact f JOIN gj_dim d ON f.k = d.k WHERE f.k BETWEEN 0 AND 2000000000", &[])
        .unwrap()
        .get(0);
    assert_eq!(m4, j4);
    let e = c
        .query_one(format!("SELECT (uvm.gpujoin_probe({}, k)).matches FROM gj_fact", quote_literal(&seg4)).as_str(), &[])
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42804"), "{}", describe(&e));
    // bigger than the budget: the table spills to the host tier and the join is still right
    // (the budget goes back on every path: left at 2 MB, it would fail every later test)
    let _reset = ResetDeviceLimit;
    c.batch_execute("ALTER SYSTEM SET pg_uvm_share.device_memory_limit = '2MB'").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut c2 = connect();
    c2.batch_execute("SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 4;").unwrap();
    let segh = unique_name("gjh");
    c2.query_one("SELECT uvm.gpujoin_build($1, 'SELECT k, v FROM gj_dim')", &[&segh]).expect("build over budget");
    let (dev, host): (i64, i64) = {
        let r = c2.query_one("SELECT device_bytes, host_bytes FROM uvm.segments WHERE name = $1", &[&segh]).unwrap();
        (r.get(0), r.get(1))
    };
    assert!(host > dev, "the over-budget table is not mostly in the host tier ({dev} device, {host} host)");
    let qh = q.replace(&quote_literal(&seg), &quote_literal(&segh));
    let t = Instant::now();
    let spilled = c2.query_one(qh.as_str(), &[]).map_err(|e| describe(&e)).expect("probe over budget");
    note(
        T,
        &format!(
            "with the table in the host tier ({host} bytes host, {dev} device): same answer in {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        ),
    );
    assert_eq!(spilled.get::<_, i64>(0), ours.get::<_, i64>(0));
    // The same join as plain SQL through the parallel plan node (issue 12, point 3): its inner
    // table, bigger than the budget, spills to the host tier, and the answer is PostgreSQL's.
    c2.batch_execute(
        "SET pg_uvm_share.enable_gpujoin = on; SET enable_hashjoin = off; SET enable_mergejoin = off; \
         SET enable_nestloop = off",
    )
    .unwrap();
    let plain = "SELECT count(*), sum(d.v)::text FROM gj_fact f JOIN gj_dim d ON f.k = d.k";
    let plan = explain_analyze(&mut c2, plain);
    assert!(plan.contains("Parallel Custom Scan (UvmGpuJoin)"), "the plan node is not used:\n{plan}");
    let tier = plan.lines().find_map(|l| l.trim().strip_prefix("Inner Table Tier: ")).unwrap_or("").to_string();
    assert!(tier == "host" || tier == "device+host", "the node's inner table did not spill (tier {tier:?}):\n{plan}");
    let t = Instant::now();
    let node = c2.query_one(plain, &[]).map_err(|e| describe(&e)).expect("the join through the plan node over budget");
    note(
        T,
        &format!(
            "plain SQL through the parallel plan node with its inner table over the budget (tier {tier}): same answer in {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        ),
    );
    assert_eq!(
        (node.get::<_, i64>(0), node.get::<_, Option<String>>(1)),
        (theirs.get::<_, i64>(0), theirs.get::<_, Option<String>>(1))
    );
    // The node's memory within work_mem × hash_mem_multiplier (issue 24, point 1): at 1 MB of
    // work_mem its inner side spills to a segment of the cpu tier, which every process maps in
    // both modes (before the cpu tier, service mode under CUDA had nowhere to spill and the
    // planner kept the node away).
    c2.batch_execute("SET work_mem = '1MB'; SET hash_mem_multiplier = 2").unwrap();
    let plan = explain_analyze(&mut c2, plain);
    let spilled = plan.lines().find_map(|l| l.trim().strip_prefix("Spilled to Host Tier: ")).unwrap_or("").to_string();
    assert!(
        plan.contains("UvmGpuJoin") && !spilled.is_empty(),
        "the node did not spill its inner side at 1 MB of work_mem ({mode:?} mode):\n{plan}"
    );
    let t = Instant::now();
    let small = c2.query_one(plain, &[]).map_err(|e| describe(&e)).expect("the join at 1 MB of work_mem");
    note(
        T,
        &format!(
            "at 1 MB of work_mem: {}, same answer in {:.0} ms",
            if plan.contains("UvmGpuJoin") { format!("the node ({spilled} spilled)") } else { "PostgreSQL's plan".into() },
            t.elapsed().as_secs_f64() * 1e3
        ),
    );
    assert_eq!(
        (small.get::<_, i64>(0), small.get::<_, Option<String>>(1)),
        (theirs.get::<_, i64>(0), theirs.get::<_, Option<String>>(1))
    );
    c2.batch_execute("RESET work_mem; RESET hash_mem_multiplier").unwrap();
    assert_eq!(
        c2.query_one("SELECT count(*) FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin%'", &[]).unwrap().get::<_, i64>(0),
        0,
        "temporary segments left after the plan node"
    );
    c.batch_execute("ALTER SYSTEM RESET pg_uvm_share.device_memory_limit").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    for n in [&seg, &seg4, &segh] {
        c.execute("SELECT uvm.drop_segment($1)", &[n]).unwrap();
    }
    c.batch_execute("DROP TABLE gj_dim, gj_fact").unwrap();
}

// --- h. materializing GpuJoin: kernels append to a shared result buffer that grows ------------

#[test]
fn h_gpujoin_materialize_on_the_gpu() {
    const T: &str = "h_gpujoin_materialize_on_the_gpu";
    let mut c = connect();
    start(&mut c);
    let f = GpujoinFixture::new(&mut c, "gjm", 200_000, 2_000_000);
    let (inner, inner4, dim) = (&f.inner, &f.inner4, &f.dim);
    let device: i64 = c.query_one("SELECT device_bytes FROM uvm.segments WHERE name = $1", &[inner]).unwrap().get(0);
    assert!(device > 0, "the inner table is not device-resident");
    // 16 pairs to start with: every worker's kernel stops, the buffer grows, the kernels resume
    let small = PairsBuffer { name: &f.result, initial: 16, tier: "auto" };
    for suffix in GPUJOIN_OUTERS {
        let outer = f.outer(suffix);
        let matches = probe_and_compare(&mut c, inner, &outer, dim, "k");
        let m = materialize_and_compare(&mut c, inner, small, &outer, dim, "k");
        assert_eq!(m.pairs as i64, matches, "{outer}: pairs vs the probe's matches");
        assert!(m.workers > 0, "{outer}: no parallel workers launched");
        note(
            T,
            &format!(
                "{suffix}: {} pairs from {} workers' kernels, same multiset as PostgreSQL's join; buffer grew from 16 pairs to {} MiB ({:.0} ms)",
                m.pairs,
                m.workers,
                m.buffer_bytes >> 20,
                m.ms
            ),
        );
    }
    let m = materialize_and_compare(&mut c, inner4, small, &f.outer("all_hit"), dim, "k::int");
    note(T, &format!("int4 keys: {} pairs, same multiset as the join", m.pairs));
    // a result buffer in the host tier: the kernels' bump allocator works on pinned host memory
    let m = materialize_and_compare(&mut c, inner, PairsBuffer { tier: "host", ..small }, &f.outer("zipf"), dim, "k");
    note(T, &format!("result buffer in the host tier: {} pairs from {} workers, same multiset as the join", m.pairs, m.workers));
    for n in [inner, inner4] {
        c.execute("SELECT uvm.drop_segment($1)", &[n]).unwrap();
    }
    f.drop_tables(&mut c);
}

// --- h2. chains longer than a launch's walk: more launches, the same exact answer --------------

/// A key repeated 10 000 times makes a chain longer than one thread's walk budget in a launch
/// (`WALK_BUDGET`, 4096 slots): the build and the probe stop and launch again where they
/// stopped. The relaunch once set the wrong word of the kernels' results (the first, with a
/// byte pattern: rows "left out" or matches miscounted); the answers must be PostgreSQL's.
#[test]
fn h2_chains_longer_than_a_launch_stay_exact() {
    const T: &str = "h2_chains_longer_than_a_launch_stay_exact";
    let mut c = connect();
    start(&mut c);
    let seg = unique_name("gjlong");
    let _guard = SegmentGuard::with(&[&seg]);
    let inner = "SELECT 7::bigint AS k, i::bigint AS v FROM generate_series(1, 10000) i \
                 UNION ALL SELECT i::bigint + 100, i::bigint FROM generate_series(1, 10000) i";
    let built: i64 = c
        .query_one("SELECT uvm.gpujoin_build($1, $2)", &[&seg, &inner])
        .map_err(|e| describe(&e))
        .expect("a build whose chain outgrows a launch's walk")
        .get(0);
    assert_eq!(built, 20_000);
    let q = format!(
        "SELECT m.matches, m.payload_sum::text FROM (SELECT (uvm.gpujoin_probe({}, k)).* FROM \
         (VALUES (7::bigint), (7), (150), (99999)) t(k)) m(matches, payload_sum)",
        quote_literal(&seg)
    );
    let r = c.query_one(q.as_str(), &[]).map_err(|e| describe(&e)).expect("probe along the long chain");
    let (matches, sum): (i64, String) = (r.get(0), r.get(1));
    let want = c
        .query_one(
            format!("SELECT count(*), sum(d.v)::text FROM (VALUES (7::bigint), (7), (150), (99999)) t(k) JOIN ({inner}) d ON d.k = t.k")
                .as_str(),
            &[],
        )
        .unwrap();
    assert_eq!((matches, sum.clone()), (want.get::<_, i64>(0), want.get::<_, String>(1)));
    note(T, &format!("a chain of 10 000 equal keys: built and probed over several launches, {matches} matches, sum {sum}, as PostgreSQL's join"));
}

// --- i. corrupted GpuJoin tables on the GPU -----------------------------------------------------

#[test]
fn i_corrupted_tables_end_in_errors_on_the_gpu() {
    // Issue 8 on the GPU: the kernels' walks are bounded by the slot count, so a valid header
    // over a slot array with no empty slot (no probe chain ends) gives 22023 at once, from the
    // probe and the materializing kernels alike, in parallel workers; a header the host check
    // refuses never reaches a kernel. The statement timeout is only the suite's safety net.
    const T: &str = "i_corrupted_tables_end_in_errors_on_the_gpu";
    let mut c = connect();
    let mode = start(&mut c);
    c.batch_execute(
        "DROP TABLE IF EXISTS gjc_dim, gjc_fact;
         CREATE TABLE gjc_dim AS SELECT i::bigint AS k, i::bigint AS v FROM generate_series(1, 100) i;
         CREATE TABLE gjc_fact AS SELECT (i % 200)::bigint AS k FROM generate_series(1, 2000000) i;
         ANALYZE gjc_dim, gjc_fact;
         SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
         SET max_parallel_workers_per_gather = 4; SET statement_timeout = '20s';",
    )
    .expect("test tables");
    let full = unique_name("gjc_full");
    let pairs = unique_name("gjc_pairs");
    let ok = unique_name("gjc_ok");
    let _guard = SegmentGuard::with(&[&full, &pairs, &ok]);
    c.query_one("SELECT uvm.gpujoin_build($1, 'SELECT k, v FROM gjc_dim WHERE false')", &[&full]).expect("empty build");
    let device: i64 = c.query_one("SELECT device_bytes FROM uvm.segments WHERE name = $1", &[&full]).unwrap().get(0);
    assert!(device > 0, "the table is not device-resident");
    c.query_one(
        "SELECT count(uvm.write_segment($1, 64 + 24 * i, '\\x0700000000000000'::bytea)) FROM generate_series(0, 15) i",
        &[&full],
    )
    .expect("fill every slot");
    c.query_one("SELECT uvm.gpujoin_pairs_create($1, 16)", &[&pairs]).expect("pairs");
    let q = quote_literal(&full);
    for (what, sql) in [
        ("probe", format!("SELECT (uvm.gpujoin_probe({q}, k)).matches FROM gjc_fact")),
        ("materialize", format!("SELECT (uvm.gpujoin_materialize({q}, {}, k)).matches FROM gjc_fact", quote_literal(&pairs))),
    ] {
        let t = Instant::now();
        let r = c.query_one(sql.as_str(), &[]);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        expect_sqlstate(r, "22023", &format!("{what} over a full slot array"));
        note(T, &format!("{what} over a table with no empty slot: 22023 after {ms:.0} ms"));
        assert!(ms < 10_000.0, "{what}: the error took {ms:.0} ms");
    }
    // The reproduction (slot count 1, slot 0 occupied): refused by the header check.
    c.query_one("SELECT uvm.gpujoin_build($1, 'SELECT k, v FROM gjc_dim')", &[&ok]).expect("build");
    c.batch_execute(&format!(
        "SELECT uvm.write_segment({o}, 16, '\\x0100000000000000'); SELECT uvm.write_segment({o}, 64, '\\x0100000000000000');",
        o = quote_literal(&ok)
    ))
    .expect("corrupt the header");
    let r = c.query_one(format!("SELECT (uvm.gpujoin_probe({}, k)).matches FROM gjc_fact", quote_literal(&ok)).as_str(), &[]);
    expect_sqlstate(r, "22023", "probe of the issue's corrupted header");
    let pins = |c: &mut Client| -> i64 {
        c.query_one("SELECT coalesce(sum(pins), 0)::bigint FROM uvm.attachments", &[]).unwrap().get(0)
    };
    match mode {
        // The failed requests' pins were this session's and its workers': gone with the ERROR.
        Mode::Process => assert_eq!(pins(&mut c), 0, "pins left after the errors"),
        // They were the service's, given back by its main thread just after the reply (which
        // the client may see first): a moment, not more.
        Mode::Service => {
            let mut left = -1;
            let gone = wait_until(Duration::from_secs(2), || {
                left = pins(&mut c);
                left == 0
            });
            assert!(gone, "{left} pins left 2 s after the errors (held by the GPU service)");
        }
    }
    c.batch_execute("RESET statement_timeout; DROP TABLE gjc_dim, gjc_fact").unwrap();
}

// --- j. no CUDA in backends or parallel workers (service mode) --------------------------------

/// What a watch saw of one parallel worker: how often it was sampled, and the CUDA libraries it
/// mapped at any sample.
#[derive(Default, Debug)]
struct WorkerSeen {
    samples: u32,
    libs: BTreeSet<String>,
}

/// Watches the parallel workers of the cluster while a query runs: every few milliseconds, from
/// a connection of its own, the `parallel worker` rows of `pg_stat_activity` and the CUDA
/// libraries each of those processes maps (`/proc/<pid>/maps`). A worker maps a library from
/// the moment it loads it until it exits, so any sample after its first GPU call shows it.
struct WorkerWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<HashMap<i32, WorkerSeen>, String>>>,
}

impl WorkerWatch {
    fn start() -> WorkerWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let mut c = connect();
        let thread = std::thread::spawn(move || {
            let mut seen: HashMap<i32, WorkerSeen> = HashMap::new();
            while !flag.load(Ordering::Acquire) {
                let rows = c
                    .query("SELECT pid FROM pg_stat_activity WHERE backend_type = 'parallel worker'", &[])
                    .map_err(|e| describe(&e))?;
                for pid in rows.iter().map(|r| r.get::<_, i32>(0)) {
                    if let Some(libs) = cuda_libraries_mapped(pid)? {
                        let w = seen.entry(pid).or_default();
                        w.samples += 1;
                        w.libs.extend(libs);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(seen)
        });
        WorkerWatch { stop, thread: Some(thread) }
    }

    /// Stops the watch; what it saw, by worker pid.
    fn finish(mut self) -> HashMap<i32, WorkerSeen> {
        self.stop.store(true, Ordering::Release);
        let t = self.thread.take().expect("finished twice");
        t.join().expect("the watch thread panicked").unwrap_or_else(|e| panic!("watching parallel workers: {e}"))
    }
}

impl Drop for WorkerWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn worker_maps_libcuda(w: &WorkerSeen) -> bool {
    maps_libcuda(&w.libs.iter().cloned().collect::<Vec<_>>())
}

/// A watch's findings in a few words: "N workers (M samples), K mapping libcuda".
fn describe_workers(seen: &HashMap<i32, WorkerSeen>) -> String {
    let samples: u32 = seen.values().map(|w| w.samples).sum();
    let cuda = seen.values().filter(|w| worker_maps_libcuda(w)).count();
    format!("{} workers ({samples} samples), {cuda} mapping libcuda", seen.len())
}

#[test]
fn j_no_cuda_in_backends_or_parallel_workers() {
    // Issue 9, point 4: in service mode no backend or parallel worker loads libcuda, whatever
    // GPU work it asks for; the service does. After a fill and checksums of a device segment in
    // a backend, GPU checksums in parallel workers and a parallel GpuJoin probe, the maps of
    // every process of the cluster are read; the workers are watched while they run (they
    // sleep a little on some rows, so that each lives on after its GPU calls). In process mode
    // the same reading must find libcuda in the backend and in the workers: the check itself
    // works.
    const T: &str = "j_no_cuda_in_backends_or_parallel_workers";
    const SIZE: i64 = 64 * MIB_I;
    const ROWS: i64 = 200;
    let seg = unique_name("gpu_j");
    let inner = unique_name("gpu_j_ht");
    let p = unique_name("gpu_j");
    let (table, dim, fact) = (format!("{p}_t"), format!("{p}_dim"), format!("{p}_fact"));
    let _guard = SegmentGuard::with(&[&seg, &inner]);
    let mut c = connect();
    let mode = start(&mut c);
    let me = backend_pid(&mut c);
    let postmaster = postmaster_pid();
    let services: Vec<i32> = c
        .query("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_uvm_share gpu service'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let service = service_pid(&mut c);
    let requests_before = service_submitted(&mut c);

    // 1. This backend: a device segment, a fill, checksums.
    create_segment_tier(&mut c, &seg, SIZE, None, "device");
    assert_eq!(tier_bytes(&mut c, &seg), (SIZE, 0), "device-tier segment's bytes per tier");
    fill_segment(&mut c, &seg, 0, SIZE, 21);
    let want = fill_checksum(21, SIZE as u64);
    assert_eq!(checksum_u64(&mut c, &seg, 0, SIZE), want, "GPU checksum after the fill");

    // 2. GPU checksums in parallel workers (the leader does not scan), 10 ms of sleep per row.
    c.batch_execute(&format!(
        "CREATE TABLE {table} (i int NOT NULL) WITH (fillfactor = 10, parallel_workers = 4);
         INSERT INTO {table} SELECT g FROM generate_series(1, {ROWS}) g;
         CREATE TABLE {dim} AS SELECT i::bigint AS k, i::bigint AS v FROM generate_series(1, 100000) i;
         CREATE TABLE {fact} WITH (parallel_workers = 4) AS
           SELECT (i % 200000)::bigint AS k FROM generate_series(1, 2000000) i;
         ANALYZE {table}, {dim}, {fact};
         SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
         SET max_parallel_workers_per_gather = 4; SET parallel_leader_participation = off;
         SET statement_timeout = '60s';"
    ))
    .expect("test tables");
    let q = format!(
        "SELECT count(*) FROM {table} \
          WHERE CASE WHEN uvm.checksum_segment({}, 0, {SIZE}) = {} THEN pg_sleep(0.01) IS NOT NULL ELSE false END",
        quote_literal(&seg),
        want as i64
    );
    let watch = WorkerWatch::start();
    let n: i64 = c.query_one(q.as_str(), &[]).map_err(|e| describe(&e)).expect("parallel checksum query").get(0);
    let checksum_workers = watch.finish();
    assert_eq!(n, ROWS, "rows whose GPU checksum (in parallel workers) matched");

    // 3. A parallel GpuJoin probe; rows with k % 25000 = 0 (80 of them) sleep 20 ms.
    c.query_one("SELECT uvm.gpujoin_build($1, $2)", &[&inner, &format!("SELECT k, v FROM {dim}")])
        .map_err(|e| describe(&e))
        .expect("gpujoin_build");
    let q = format!(
        "SELECT (uvm.gpujoin_probe({}, k)).matches FROM {fact} \
          WHERE CASE WHEN k % 25000 = 0 THEN pg_sleep(0.02) IS NOT NULL ELSE true END",
        quote_literal(&inner)
    );
    let watch = WorkerWatch::start();
    let matches: i64 = c.query_one(q.as_str(), &[]).map_err(|e| describe(&e)).expect("parallel GpuJoin probe").get(0);
    let probe_workers = watch.finish();
    let joined: i64 =
        c.query_one(format!("SELECT count(*) FROM {fact} f JOIN {dim} d ON f.k = d.k").as_str(), &[]).unwrap().get(0);
    assert_eq!(matches, joined, "GpuJoin probe vs PostgreSQL's join");
    for (what, seen) in [("checksum", &checksum_workers), ("GpuJoin probe", &probe_workers)] {
        assert!(!seen.is_empty(), "the {what} query: no parallel worker seen while it ran");
    }

    // 4. Every process of the cluster, as it is now.
    let mut maps: Vec<(i32, Vec<String>)> = Vec::new();
    for pid in child_pids(postmaster) {
        if let Some(libs) = cuda_libraries_mapped(pid).unwrap_or_else(|e| panic!("{e}")) {
            maps.push((pid, libs));
        }
    }
    assert!(maps.iter().any(|(pid, _)| *pid == me), "this test's backend {me} is not among the postmaster's children");
    let kinds: HashMap<i32, String> = c
        .query("SELECT pid, coalesce(backend_type, '?') FROM pg_stat_activity", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let kind = |pid: i32| kinds.get(&pid).cloned().unwrap_or_else(|| "(not in pg_stat_activity)".into());
    let with_cuda: Vec<String> =
        maps.iter().filter(|(_, l)| maps_libcuda(l)).map(|(pid, l)| format!("{pid} {}: {}", kind(*pid), l.join(" "))).collect();
    let summary = format!(
        "{} processes of the cluster read; mapping libcuda: [{}]; parallel workers: checksum query {}, GpuJoin probe {}",
        maps.len(),
        with_cuda.join("; "),
        describe_workers(&checksum_workers),
        describe_workers(&probe_workers)
    );

    match mode {
        Mode::Service => {
            assert_eq!(services, vec![service], "service mode: the GPU service in pg_stat_activity vs device_info's service_pid");
            let own = maps.iter().find(|(pid, _)| *pid == service).map(|(_, l)| l.clone());
            assert!(
                own.as_deref().is_some_and(maps_libcuda),
                "service mode: the GPU service {service} does not map libcuda ({own:?}): {summary}"
            );
            let others: Vec<&String> = with_cuda.iter().filter(|l| !l.starts_with(&format!("{service} "))).collect();
            assert!(others.is_empty(), "service mode: processes other than the GPU service map libcuda: {others:?}");
            for (what, seen) in [("checksum", &checksum_workers), ("GpuJoin probe", &probe_workers)] {
                let bad: Vec<(&i32, &WorkerSeen)> = seen.iter().filter(|(_, w)| worker_maps_libcuda(w)).collect();
                assert!(bad.is_empty(), "service mode: parallel workers of the {what} query mapped libcuda: {bad:?}");
            }
            // The GPU work did go through the service: every worker's checksum is a request.
            let requests = service_submitted(&mut c) - requests_before;
            assert!(requests >= ROWS as u64 + 3, "service mode: only {requests} requests reached the service");
            note(T, &format!("service mode: {summary}; {requests} requests went to the service (pid {service})"));
        }
        Mode::Process => {
            assert!(services.is_empty(), "process mode: a GPU service runs: {services:?}");
            assert!(
                maps.iter().any(|(pid, l)| *pid == me && maps_libcuda(l)),
                "process mode: this backend ran kernels but does not map libcuda (is the check blind?): {summary}"
            );
            for (what, seen) in [("checksum", &checksum_workers), ("GpuJoin probe", &probe_workers)] {
                assert!(
                    seen.values().any(worker_maps_libcuda),
                    "process mode: no parallel worker of the {what} query was seen mapping libcuda: {seen:?}"
                );
            }
            note(T, &format!("process mode: {summary}"));
        }
    }

    c.batch_execute(&format!("RESET statement_timeout; DROP TABLE {table}, {dim}, {fact}")).unwrap();
    drop_segment(&mut c, &inner);
    drop_segment(&mut c, &seg);
}

#[test]
fn j2_leader_probes_keep_cuda_out_of_parallel_workers() {
    // Issue 24, point 5: a parallel GpuJoin that computes count(*) and sum of an inner column
    // in its probe has its workers hand their keys to the leader (`src/node/handoff.rs`;
    // `gpujoin_leader_probes = auto` in process mode, set `on` here for both modes). The
    // workers are watched while they scan (one outer row in 25,000 sleeps 20 ms): none maps
    // libcuda, in process mode too, where before each started a CUDA context; the answer is
    // PostgreSQL's and the leader probed batches the workers read.
    const T: &str = "j2_leader_probes_keep_cuda_out_of_parallel_workers";
    let p = unique_name("gpu_j2");
    let (dim, fact) = (format!("{p}_dim"), format!("{p}_fact"));
    let mut c = connect();
    let mode = start(&mut c);
    c.batch_execute(&format!(
        "CREATE TABLE {dim} AS SELECT i::bigint AS k, (i % 1000)::int AS v FROM generate_series(1, 100000) i;
         CREATE TABLE {fact} WITH (parallel_workers = 4) AS
           SELECT (i % 200000)::bigint AS k FROM generate_series(1, 2000000) i;
         ANALYZE {dim}, {fact};
         SET pg_uvm_share.enable_gpujoin = on; SET enable_hashjoin = off; SET enable_mergejoin = off;
         SET enable_nestloop = off; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;
         SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 4;
         SET pg_uvm_share.gpujoin_leader_probes = on; SET statement_timeout = '60s';"
    ))
    .expect("test tables");
    let q = format!(
        "SELECT count(*), sum(d.v) FROM {fact} f JOIN {dim} d ON f.k = d.k \
          WHERE CASE WHEN f.k % 25000 = 0 THEN pg_sleep(0.02) IS NOT NULL ELSE true END"
    );
    let plan: Vec<String> = c.query(format!("EXPLAIN (COSTS OFF) {q}").as_str(), &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert!(plan.iter().any(|l| l.contains("Parallel Custom Scan (UvmGpuJoin)")), "not a parallel GpuJoin:\n{}", plan.join("\n"));
    let watch = WorkerWatch::start();
    let row = c.query_one(q.as_str(), &[]).map_err(|e| describe(&e)).expect("the parallel join");
    let seen = watch.finish();
    let got: (i64, i64) = (row.get(0), row.get(1));
    c.batch_execute("SET pg_uvm_share.enable_gpujoin = off; SET enable_hashjoin = on;").unwrap();
    let row = c.query_one(q.as_str(), &[]).unwrap();
    let want: (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(got, want, "the leader's probes of every participant's keys vs PostgreSQL's join");
    c.batch_execute("SET pg_uvm_share.enable_gpujoin = on; SET enable_hashjoin = off;").unwrap();
    assert!(!seen.is_empty(), "no parallel worker seen while the join ran");
    let bad: Vec<(&i32, &WorkerSeen)> = seen.iter().filter(|(_, w)| worker_maps_libcuda(w)).collect();
    assert!(bad.is_empty(), "{mode:?} mode: parallel workers mapped libcuda: {bad:?}");
    let text: Vec<String> =
        c.query(format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING ON) {q}").as_str(), &[]).unwrap().iter().map(|r| r.get(0)).collect();
    let handed = text
        .iter()
        .find_map(|l| l.trim().strip_prefix("Batches Probed for Workers:"))
        .and_then(|n| n.trim().parse::<i64>().ok())
        .unwrap_or_else(|| panic!("no Batches Probed for Workers:\n{}", text.join("\n")));
    note(T, &format!("{mode:?} mode: {}; the leader probed {handed} of the workers' batches", describe_workers(&seen)));
    c.batch_execute(&format!("RESET statement_timeout; DROP TABLE {dim}, {fact}")).unwrap();
}

// --- k. the C API: a consumer extension's own kernels, through the executor -----------------

/// The consumer's kernel as PTX (hand-written): adds `v` to the first word of `p` (`n` unused).
const ADD_FIRST_PTX: &str = "
.version 8.0
.target sm_90
.address_size 64
.visible .entry add_first(.param .u64 p, .param .u64 n, .param .u64 v)
{
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [p];
    ld.param.u64 %rd2, [v];
    cvta.to.global.u64 %rd3, %rd1;
    ld.global.u64 %rd4, [%rd3];
    add.s64 %rd4, %rd4, %rd2;
    st.global.u64 [%rd3], %rd4;
    ret;
}
";

/// Words `[0, n)` of a segment, read on the CPU through SQL.
fn words(c: &mut Client, name: &str, n: usize) -> Vec<u64> {
    read_segment_all(c, name, 0, (n * 8) as i64).chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap())).collect()
}

fn word_bytes(v: impl Iterator<Item = u64>) -> Vec<u8> {
    v.flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn k_c_api_consumer_kernels() {
    const T: &str = "k_c_api_consumer_kernels";
    const N: usize = 1 << 20; // words the kernel adds to
    const SIZE: i64 = 64 * MIB_I;
    let dev = unique_name("gpu_k_dev");
    let host = unique_name("gpu_k_host");
    let _guard = SegmentGuard::with(&[&dev, &host]);
    let mut c = connect();
    let mode = start(&mut c);
    c.batch_execute("DROP EXTENSION IF EXISTS uvm_consumer; CREATE EXTENSION uvm_consumer")
        .expect("CREATE EXTENSION uvm_consumer");
    create_segment_tier(&mut c, &dev, SIZE, None, "device");
    create_segment_tier(&mut c, &host, SIZE, None, "host");

    for name in [&dev, &host] {
        // Words 0..N+1024 hold their index; the kernel adds to the first N only.
        write_segment(&mut c, name, 0, &word_bytes(0..(N as u64 + 1024)));
        let t = Instant::now();
        c.execute("SELECT launch_add($1, $2, 5, false)", &[name, &(N as i64)]).expect("launch_add, synchronous");
        let first_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        c.execute("SELECT launch_add($1, $2, 7, true)", &[name, &(N as i64)]).expect("launch_add, started and waited for");
        let again_ms = t.elapsed().as_secs_f64() * 1e3;
        let got = words(&mut c, name, N + 1024);
        for (i, &w) in got.iter().enumerate() {
            let want = if i < N { i as u64 + 12 } else { i as u64 };
            assert_eq!(w, want, "{name}: word {i} after two launches (+5, +7 on the first {N} words)");
        }
        note(T, &format!("{mode:?} mode, {name}: first launch {first_ms:.1} ms (compiles once per process or service), next {again_ms:.1} ms"));
    }

    // The same kernel text as PTX, loaded by the driver.
    c.execute("SELECT launch_source($1, $2, 'add_first', true, 1, 1, 0, 1000)", &[&dev, &ADD_FIRST_PTX]).expect("a PTX kernel");
    assert_eq!(words(&mut c, &dev, 1)[0], 12 + 1000, "word 0 after the PTX kernel added 1000");

    // Caller mistakes are ERRORs with 22023, and leave the context usable.
    expect_sqlstate(
        c.execute("SELECT launch_source($1, 'extern \"C\" __global__ void k(unsigned long long *p, unsigned long long n, unsigned long long v) { p[0] = }', 'k', false, 1, 1, 0, 0)", &[&dev]),
        "22023",
        "a kernel that does not compile",
    );
    expect_sqlstate(
        c.execute("SELECT launch_source($1, 'extern \"C\" __global__ void k(unsigned long long *p, unsigned long long n, unsigned long long v) { }', 'no_such_entry', false, 1, 1, 0, 0)", &[&dev]),
        "22023",
        "a kernel without the named entry",
    );
    expect_sqlstate(
        c.execute("SELECT launch_source($1, $2, 'add_first', true, 1, 4096, 0, 0)", &[&dev, &ADD_FIRST_PTX]),
        "22023",
        "a block of 4096 threads (the device allows 1024)",
    );
    c.execute("SELECT launch_add($1, 1, 1, false)", &[&dev]).expect("a launch after the refused ones");
    assert_eq!(words(&mut c, &dev, 1)[0], 12 + 1000 + 1, "word 0 after the launch that followed the errors");

    // The C API's pin: the host segment is mapped in this backend at its own address in both
    // modes (memfds in service mode); the device segment only in process mode.
    let mapping = |c: &mut Client, name: &str| -> String { c.query_one("SELECT mapping($1)", &[&name]).expect("mapping").get(0) };
    let m = mapping(&mut c, &host);
    note(T, &format!("{mode:?} mode: C API pin of the host segment: {m}"));
    let all =
        m.rsplit_once(" chunks mapped").and_then(|(h, _)| h.rsplit_once(", ")).map(|(_, n)| n.split(" of ").collect::<Vec<_>>());
    assert!(
        m.starts_with("base set, same address") && all.as_ref().is_some_and(|v| v.len() == 2 && v[0] == v[1]),
        "{mode:?} mode: the host segment's pin: {m}"
    );
    let m = mapping(&mut c, &dev);
    match mode {
        Mode::Service => assert!(m.starts_with("base NULL"), "service mode: the device segment's pin: {m}"),
        Mode::Process => assert!(m.starts_with("base set, same address"), "process mode: the device segment's pin: {m}"),
    }

    // Device addresses for the consumer's own kernels exist only where it maps segments.
    match mode {
        Mode::Process => {
            let a: i64 = c.query_one("SELECT device_address($1)", &[&dev]).expect("device_address").get(0);
            assert!(a != 0, "a device address in process mode");
        }
        Mode::Service => {
            expect_sqlstate(c.query_one("SELECT device_address($1)", &[&dev]), "0A000", "device_address in service mode")
        }
    }

    // Eight sessions launch at once, each on its own range of the device segment.
    let threads: Vec<_> = (0..8i64)
        .map(|k| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let mut s = connect();
                for _ in 0..20 {
                    // Each adds 1 to words [k * 4096 + 1, +4096): its own range, past word 0.
                    s.execute("SELECT launch_range($1, $2, 4096, 1)", &[&dev, &(k * 4096 + 1)]).expect("launch_range");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a launching session");
    }
    let got = words(&mut c, &dev, 8 * 4096 + 2);
    for (i, &w) in got.iter().enumerate().skip(1).take(8 * 4096) {
        assert_eq!(w, i as u64 + 12 + 20, "word {i} after 20 launches of +1 by its session");
    }
    assert_eq!(got[8 * 4096 + 1], (8 * 4096 + 1) as u64 + 12, "the word after the eight ranges is untouched");
    c.batch_execute("DROP EXTENSION uvm_consumer").unwrap();
    drop_segment(&mut c, &dev);
    drop_segment(&mut c, &host);
}

/// A kernel that writes to address 16: an illegal address, which CUDA reports as a sticky error.
const FAULTING_KERNEL: &str = "extern \"C\" __global__ void fault(unsigned long long *p, unsigned long long n, \
unsigned long long v) { *(volatile unsigned long long *) 16 = v; }";

#[test]
fn l_a_faulting_kernel_is_an_error_and_the_gpu_work_goes_on() {
    const T: &str = "l_a_faulting_kernel_is_an_error_and_the_gpu_work_goes_on";
    let seg = unique_name("gpu_l");
    let _guard = SegmentGuard::with(&[&seg]);
    let mut c = connect();
    let mode = start(&mut c);
    c.batch_execute("DROP EXTENSION IF EXISTS uvm_consumer; CREATE EXTENSION uvm_consumer")
        .expect("CREATE EXTENSION uvm_consumer");
    create_segment_tier(&mut c, &seg, 16 * MIB_I, None, "device");
    write_segment(&mut c, &seg, 0, &word_bytes(0..4096));
    let service_before = service_pid(&mut c);

    let t = Instant::now();
    expect_sqlstate(
        c.execute("SELECT launch_source($1, $2, 'fault', false, 1, 1, 0, 7)", &[&seg, &FAULTING_KERNEL]),
        "58000",
        "a kernel that writes to an illegal address",
    );
    note(T, &format!("{mode:?} mode: the fault came back as 58000 in {:.0} ms", t.elapsed().as_secs_f64() * 1e3));

    match mode {
        Mode::Service => {
            // The service leaves (its context is unusable) and the postmaster starts another.
            let mut now = service_before;
            let restarted = wait_until(Duration::from_secs(60), || {
                let mut p = connect();
                now = service_pid(&mut p);
                now > 0 && now != service_before && device_info_value(&mut p, "execution").as_deref() == Some("service")
            });
            assert!(restarted, "the GPU service did not restart after the fault (pid {service_before}, now {now})");
            note(T, &format!("service {service_before} left; service {now} runs after {:.1} s", t.elapsed().as_secs_f64()));
        }
        Mode::Process => {
            // This backend's context is lost: its next launch says so; a new session works.
            expect_sqlstate(
                c.execute("SELECT launch_add($1, 1, 1, false)", &[&seg]),
                "58000",
                "a launch after the fault, same backend",
            );
            c = connect();
        }
    }
    // The segment survived (the broker holds its chunk), and kernels run again.
    c.batch_execute("DROP EXTENSION IF EXISTS uvm_consumer; CREATE EXTENSION uvm_consumer")
        .expect("CREATE EXTENSION uvm_consumer");
    c.execute("SELECT launch_add($1, 4096, 1, false)", &[&seg]).expect("a launch after the fault");
    let got = words(&mut c, &seg, 4096);
    for (i, &w) in got.iter().enumerate() {
        assert_eq!(w, i as u64 + 1, "word {i} after the fault and one launch of +1");
    }
    c.batch_execute("DROP EXTENSION uvm_consumer").unwrap();
    drop_segment(&mut c, &seg);
}

// --- m. a huge corrupted table: every launch bounded, cancel answered at once -----------------

#[test]
fn m_a_huge_corrupted_table_answers_cancel_within_100_ms() {
    // Issue 24, point 3: a valid header over 2^27 slots (3 GiB) with no empty slot, so that every
    // probe chain is as long as the table. One launch once walked a whole chain (about 15 s
    // here, deaf to cancel); now no launch walks more than its budget, and the host checks for
    // interrupts between launches: statement_timeout ends the probe and the materializing
    // probe within 100 ms of its deadline, in parallel workers, in both modes.
    const T: &str = "m_a_huge_corrupted_table_answers_cancel_within_100_ms";
    const SLOTS: i64 = 1 << 27;
    let mut c = connect();
    start(&mut c);
    c.batch_execute(
        "DROP TABLE IF EXISTS gjh_dim, gjh_fact;
         CREATE TABLE gjh_dim AS SELECT i::bigint AS k, i::bigint AS v FROM generate_series(1, 100) i;
         CREATE TABLE gjh_fact AS SELECT (i % 200)::bigint AS k FROM generate_series(1, 200000) i;
         ANALYZE gjh_dim, gjh_fact;
         SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
         SET max_parallel_workers_per_gather = 4;",
    )
    .expect("test tables");
    let empty = unique_name("gjh_empty");
    let huge = unique_name("gjh_huge");
    let pairs = unique_name("gjh_pairs");
    let _guard = SegmentGuard::with(&[&empty, &huge, &pairs]);
    c.query_one("SELECT uvm.gpujoin_build($1, 'SELECT k, v FROM gjh_dim WHERE false')", &[&empty]).expect("empty build");
    let bytes = 64 + 24 * SLOTS;
    c.query_one("SELECT uvm.create_segment($1, $2, NULL, 'device')", &[&huge, &bytes]).expect("3 GiB device segment");
    // The empty table's header with 2^27 slots (offset 16), over slots of random bytes: every
    // tag is non-zero, so no chain ends.
    c.query_one("SELECT uvm.write_segment($1, 0, uvm.read_segment($2, 0, 64))", &[&huge, &empty]).expect("header");
    c.query_one("SELECT uvm.write_segment($1, 16, '\\x0000000800000000'::bytea)", &[&huge]).expect("slot count, little-endian");
    let t = Instant::now();
    c.query_one("SELECT uvm.fill_segment($1, 64, $2, 7)", &[&huge, &(24 * SLOTS)]).expect("random slots");
    note(
        T,
        &format!(
            "a table of {SLOTS} slots ({} MiB) without an empty slot, filled in {:.0} ms",
            bytes >> 20,
            t.elapsed().as_secs_f64() * 1e3
        ),
    );
    c.query_one("SELECT uvm.gpujoin_pairs_create($1, 16)", &[&pairs]).expect("pairs");
    let q = quote_literal(&huge);
    const TIMEOUT_MS: f64 = 300.0;
    c.batch_execute(&format!("SET statement_timeout = {TIMEOUT_MS}")).unwrap();
    for (what, sql) in [
        ("probe", format!("SELECT (uvm.gpujoin_probe({q}, k)).matches FROM gjh_fact")),
        ("materialize", format!("SELECT (uvm.gpujoin_materialize({q}, {}, k)).matches FROM gjh_fact", quote_literal(&pairs))),
    ] {
        let t = Instant::now();
        let r = c.query_one(sql.as_str(), &[]);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        expect_sqlstate(r, "57014", &format!("{what} over a huge table with no empty slot"));
        // The ERROR is sent before the backend cleans up; it is ready for the next statement
        // once its parallel workers have exited (in process mode, each tearing down its CUDA
        // context and mappings: a few hundred ms, which the walks' old multi-second launches
        // would have lengthened).
        c.query_one("SELECT 1", &[]).expect("the session goes on");
        let ready = t.elapsed().as_secs_f64() * 1e3;
        note(
            T,
            &format!(
                "{what}: statement_timeout of {TIMEOUT_MS:.0} ms answered after {ms:.0} ms ({:.0} ms late); \
                 the session ready again after {ready:.0} ms",
                ms - TIMEOUT_MS
            ),
        );
        assert!(ms < TIMEOUT_MS + 100.0, "{what}: the timeout of {TIMEOUT_MS} ms was answered after {ms:.0} ms");
        assert!(ready < TIMEOUT_MS + 2000.0, "{what}: the session was ready again only after {ready:.0} ms");
    }
    // In service mode the client gives up at once whatever the service does; the service's own
    // walk must stop too: dropping the table waits for the work abandoned on it.
    c.batch_execute("RESET statement_timeout").unwrap();
    let t = Instant::now();
    c.query_one("SELECT uvm.drop_segment($1)", &[&huge]).expect("drop the huge table");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    note(T, &format!("dropping the table after the timeouts took {ms:.0} ms"));
    assert!(ms < 1000.0, "the drop waited {ms:.0} ms for the abandoned walks");
    c.batch_execute("DROP TABLE gjh_dim, gjh_fact").unwrap();
}

// --- n. statistics after known GPU work (issue 28) ------------------------------------------

/// `uvm.stat_segments`, `uvm.stat_service` and `uvm.stat_gpujoin` after known work on the GPU:
/// 256 MiB filled and checksummed by kernels on a device segment, moved to the host and back,
/// and one GpuJoin node query.
#[test]
fn n_statistics_count_gpu_work() {
    const T: &str = "n_statistics_count_gpu_work";
    const SIZE: i64 = 256 * MIB_I;
    let mut c = connect();
    let mode = start(&mut c);
    let seg = unique_name("gpu_n");
    let _guard = SegmentGuard::with(&[&seg]);
    c.batch_execute("SELECT uvm.stat_reset()").unwrap();
    create_segment_tier(&mut c, &seg, SIZE, None, "device");
    fill_segment(&mut c, &seg, 0, SIZE, 5);
    checksum_u64(&mut c, &seg, 0, SIZE);
    prefetch_segment(&mut c, &seg, 0, SIZE, "host");
    prefetch_segment(&mut c, &seg, 0, SIZE, "device");
    let r = c
        .query_one(
            "SELECT bytes_read, bytes_written, migrations, bytes_migrated, pins >= 2 FROM uvm.stat_segments WHERE name = $1",
            &[&seg],
        )
        .unwrap();
    let got: (i64, i64, i64, i64, bool) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
    assert_eq!(got, (SIZE, SIZE, 2, 2 * SIZE, true), "(bytes_read, bytes_written, migrations, bytes_migrated, pinned)");
    let service: Vec<(Option<i32>, String, i64, f64)> = c
        .query("SELECT gpu, operation, requests, run_ms FROM uvm.stat_service WHERE operation IN ('checksum', 'fill', 'prefetch') ORDER BY 2", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    note(T, &format!("{mode:?}: uvm.stat_service rows for checksum, fill, prefetch: {service:?}"));
    if mode == Mode::Service {
        let find = |op: &str| service.iter().find(|r| r.1 == op).cloned();
        let (gpu, _, n, ms) = find("checksum").expect("a checksum row");
        assert_eq!((gpu, n), (Some(0), 1), "the checksum ran on GPU 0, once");
        assert!(ms > 0.0, "its run time");
        assert_eq!(find("prefetch").map(|r| (r.0, r.2)), Some((None, 2)), "two migrations on the main thread");
    } else {
        assert!(service.is_empty(), "process mode sends no request: {service:?}");
    }
    // One plan node query, forced.
    c.batch_execute(
        "DROP TABLE IF EXISTS gpu_n_out, gpu_n_in;
         CREATE TABLE gpu_n_out AS SELECT g AS k FROM generate_series(1, 100000) g;
         CREATE TABLE gpu_n_in AS SELECT g * 3 AS k FROM generate_series(1, 10000) g;
         ANALYZE gpu_n_out, gpu_n_in;
         SET pg_uvm_share.enable_gpujoin = on; SET enable_hashjoin = off; SET enable_mergejoin = off;
         SET enable_nestloop = off; SET max_parallel_workers_per_gather = 0;",
    )
    .unwrap();
    let n: i64 = c
        .query_one("SELECT count(*) FROM (SELECT o.k FROM gpu_n_out o JOIN gpu_n_in i ON o.k = i.k OFFSET 0) j", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 10000, "every inner key (3, 6, ..., 30000) has its outer row");
    let r = c.query_one("SELECT queries, rows, batches, inner_rows, plans, gpu_ms FROM uvm.stat_gpujoin", &[]).unwrap();
    let (q, rows, batches, inner, plans, ms): (i64, i64, i64, i64, i64, f64) =
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
    note(T, &format!("{mode:?}: uvm.stat_gpujoin: queries {q}, rows {rows}, batches {batches}, inner rows {inner}, plans {plans}, GPU {ms:.2} ms"));
    assert_eq!((q, rows, inner, plans), (1, n, 10000, 1), "(queries, rows, inner_rows, plans)");
    assert!(batches >= 1 && ms > 0.0, "batches {batches}, gpu_ms {ms}");
    c.batch_execute("RESET ALL; DROP TABLE gpu_n_out, gpu_n_in").unwrap();
    drop_segment(&mut c, &seg);
}

// --- z. crash of a backend with a CUDA context and device mappings (runs last) ---------------

#[test]
fn z_crash_releases_gpu_memory() {
    const T: &str = "z_crash_releases_gpu_memory";
    const SIZE: i64 = 4 * GIB_I;
    let seg = unique_name("gpu_z");
    let (mode, service_before) = {
        // Checked in a session of its own: in process mode it creates a CUDA context, which must
        // be gone before the baseline is taken.
        let mut p = connect();
        let mode = start(&mut p);
        let restart: String = p.query_one("SHOW restart_after_crash", &[]).unwrap().get(0);
        assert_eq!(restart, "on", "the cluster must run with restart_after_crash = on");
        (mode, service_pid(&mut p))
    };
    if mode == Mode::Service {
        assert!(service_before > 0 && process_alive(service_before), "no GPU service running (service_pid {service_before})");
    }
    // The admin session never calls the extension, so it holds no CUDA context.
    let mut admin = connect();
    let broker_before = wait_broker(&mut admin, Duration::from_secs(30));
    let postmaster = postmaster_pid();
    wait_alone(&mut admin, Duration::from_secs(30));
    let baseline = settled_gpu_memory_mib();

    let mut victim = connect();
    let victim_pid = backend_pid(&mut victim);
    create_segment_tier(&mut victim, &seg, SIZE, None, "device");
    let sum = checksum_u64(&mut victim, &seg, 0, SIZE);
    let during = gpu_memory_used_mib();
    let apps = gpu_compute_apps().unwrap_or_else(|e| panic!("{e}"));
    let listed = |pid: i32| apps.iter().find(|(p, _)| *p == pid).map(|(_, m)| *m);
    let shown = |pid: i32| match listed(pid) {
        None => "not listed".to_string(),
        Some(None) => "listed, memory N/A".to_string(),
        Some(Some(m)) => format!("{m} MiB"),
    };
    let holder = match mode {
        Mode::Process => "the victim's context and",
        Mode::Service => "the service's context and",
    };
    note(
        T,
        &format!(
            "{mode:?} mode: GPU memory used: baseline {baseline} MiB, with {holder} the 4 GiB segment {during} MiB \
             (per nvidia-smi: victim backend {}, GPU service {}); checksum {sum:#x}",
            shown(victim_pid),
            if service_before > 0 { shown(service_before) } else { "none".into() }
        ),
    );
    assert!(during >= baseline + 4000, "a 4 GiB device segment did not show in GPU memory used ({baseline} -> {during} MiB)");
    // Who holds a CUDA context: the victim itself in process mode; in service mode only the
    // service, never the backend that asked for the segment and its checksum.
    match mode {
        Mode::Process => assert!(
            listed(victim_pid).is_some(),
            "process mode: the victim backend {victim_pid} ran a kernel but nvidia-smi does not list it: {apps:?}"
        ),
        Mode::Service => {
            assert!(
                listed(victim_pid).is_none(),
                "service mode: the victim backend {victim_pid} has a CUDA context (nvidia-smi lists it): {apps:?}"
            );
            assert!(
                listed(service_before).is_some(),
                "service mode: nvidia-smi does not list the GPU service {service_before}: {apps:?}"
            );
        }
    }

    // SIGKILL the attached backend: the postmaster crash-restarts everything.
    drop(admin);
    kill_backend_for_crash_restart(victim_pid, broker_before);
    drop(victim);
    let t = Instant::now();
    let mut c = connect_retry(Duration::from_secs(90));
    let reconnect_s = t.elapsed().as_secs_f64();
    assert_eq!(postmaster_pid(), postmaster, "the postmaster must survive (crash restart)");

    let mut now = 0;
    let released = wait_until(Duration::from_secs(30), || {
        now = gpu_memory_used_mib();
        now <= baseline + 64
    });
    note(
        T,
        &format!(
            "after SIGKILL and crash restart (reconnected in {reconnect_s:.1} s): GPU memory used {now} MiB, \
             baseline {baseline} MiB, {:.1} s after reconnecting",
            t.elapsed().as_secs_f64() - reconnect_s
        ),
    );
    assert!(released, "GPU memory not released within 30 s of the crash restart: {now} MiB used, baseline {baseline} MiB");

    // The registry is empty after the restart (retry if the connection was caught mid-restart).
    let mut n = -1i64;
    let ok = wait_until(Duration::from_secs(30), || match c.query_one("SELECT count(*) FROM uvm.segments", &[]) {
        Ok(r) => {
            n = r.get(0);
            true
        }
        Err(_) => {
            if let Ok(cc) = try_connect() {
                c = cc;
            }
            false
        }
    });
    assert!(ok, "cannot query uvm.segments after the crash restart");
    assert_eq!(n, 0, "uvm.segments not empty after the crash restart");

    // The provider works again, in the same mode; in service mode through a new service (the
    // crash restart ended the old one with every other process).
    assert_eq!(start(&mut c), mode, "the execution mode changed over the crash restart");
    if mode == Mode::Service {
        let after = service_pid(&mut c);
        assert!(
            after > 0 && after != service_before && !process_alive(service_before),
            "service mode: the GPU service was not restarted with the cluster (pid {service_before} before, {after} after)"
        );
    }
    let _guard = SegmentGuard::with(&[&seg]);
    create_segment_tier(&mut c, &seg, 64 * MIB_I, None, "device");
    fill_segment(&mut c, &seg, 0, 64 * MIB_I, 3);
    assert_eq!(checksum_u64(&mut c, &seg, 0, 64 * MIB_I), fill_checksum(3, 64 << 20), "GPU checksum after the restart");
    drop_segment(&mut c, &seg);
}
