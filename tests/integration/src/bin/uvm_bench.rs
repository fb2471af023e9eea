//! pg_uvm_share benchmark: attach time of segments in fresh backends, and read/write throughput
//! of 1 MiB calls against a memcpy baseline. Writes a Markdown report.
//!
//!     cargo run --release -p pg_uvm_share_tests --bin uvm_bench -- OUTFILE
//!
//! Needs a running cluster with the extension created (PGHOST, PGPORT, PGUSER; see `make bench`).
//! Only the 256 MiB throughput segment is touched; the large segments are created and mapped,
//! never written, so their memory is not committed.

use pg_uvm_share_tests::*;
use std::fmt::Write as _;
use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

const GIB: i64 = 1 << 30;
const MIB_I: i64 = 1 << 20;
const ATTACH_REPEATS: usize = 5;
const CALLS: usize = 2000;
const RW_SEGMENT_MIB: i64 = 256;
const RW_REPEATS: usize = 3;

struct AttachCase {
    label: String,
    name: String,
    size: i64,
    /// grow in `steps` equal steps from the first step's size
    steps: usize,
}

struct AttachResult {
    label: String,
    size: i64,
    chunks: Option<i64>,
    create_ms: f64,
    server_ms: Vec<f64>,
    client_ms: Vec<f64>,
    error: Option<String>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn gbps(bytes: f64, d: Duration) -> f64 {
    bytes / d.as_secs_f64() / 1e9
}

fn human(bytes: i64) -> String {
    if bytes >= GIB && bytes % GIB == 0 {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB_I && bytes % MIB_I == 0 {
        format!("{} MiB", bytes / MIB_I)
    } else {
        format!("{bytes} B")
    }
}

fn sh(cmd: &str, args: &[&str], dir: Option<&str>) -> Option<String> {
    let mut c = Command::new(cmd);
    c.args(args);
    if let Some(d) = dir {
        c.current_dir(d);
    }
    let out = c.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn git_commit() -> String {
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    match sh("git", &["rev-parse", "--short", "HEAD"], Some(repo)) {
        Some(c) => {
            let dirty = sh("git", &["status", "--porcelain"], Some(repo)).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}-dirty")
            } else {
                c
            }
        }
        None => "(no commit)".to_string(),
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn mem_total() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("MemTotal:")).map(|l| l.trim_start_matches("MemTotal:").trim().to_string())
        })
        .map(|kb| {
            let n: f64 = kb.trim_end_matches("kB").trim().parse().unwrap_or(0.0);
            format!("{:.1} GiB ({kb})", n / 1024.0 / 1024.0)
        })
        .unwrap_or_else(|| "unknown".into())
}

fn drop_if_exists(c: &mut Client, name: &str) {
    let _ = c.execute("SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name = $1", &[&name]);
}

fn chunks_of(c: &mut Client, name: &str) -> Option<i64> {
    c.query_opt("SELECT chunks::bigint FROM uvm.segments WHERE name = $1", &[&name]).ok().flatten().map(|r| r.get(0))
}

fn run_attach_case(admin: &mut Client, case: &AttachCase) -> AttachResult {
    let mut res = AttachResult {
        label: case.label.clone(),
        size: case.size,
        chunks: None,
        create_ms: f64::NAN,
        server_ms: Vec::new(),
        client_ms: Vec::new(),
        error: None,
    };
    drop_if_exists(admin, &case.name);
    let t = Instant::now();
    let created = if case.steps <= 1 {
        admin.query_one("SELECT uvm.create_segment($1, $2)", &[&case.name, &case.size]).map(|_| ())
    } else {
        let step = case.size / case.steps as i64;
        admin.query_one("SELECT uvm.create_segment($1, $2, $3)", &[&case.name, &step, &case.size]).map(|_| ()).and_then(|_| {
            for k in 2..=case.steps as i64 {
                admin.query_one("SELECT uvm.grow_segment($1, $2)", &[&case.name, &(step * k)])?;
            }
            Ok(())
        })
    };
    res.create_ms = ms(t.elapsed());
    if let Err(e) = created {
        res.error = Some(format!("create: {}", describe(&e)));
        return res;
    }
    res.chunks = chunks_of(admin, &case.name);
    for _ in 0..ATTACH_REPEATS {
        let mut fresh = match try_connect() {
            Ok(c) => c,
            Err(e) => {
                res.error = Some(format!("connect: {}", describe(&e)));
                break;
            }
        };
        // Warm the connection (catalog caches) so the timed query is only the attach.
        let _ = fresh.simple_query("SELECT 1");
        let t = Instant::now();
        match fresh.query_one("SELECT uvm.attach_segment($1)::float8", &[&case.name]) {
            Ok(r) => {
                res.client_ms.push(ms(t.elapsed()));
                res.server_ms.push(r.get::<_, f64>(0));
            }
            Err(e) => {
                res.error = Some(format!("attach: {}", describe(&e)));
                break;
            }
        }
    }
    res
}

struct Throughput {
    write_gbps: Vec<f64>,
    read_gbps: Vec<f64>,
    memcpy_hot_gbps: f64,
    memcpy_strided_gbps: f64,
}

/// memcpy of 1 MiB, `CALLS` times, between the same two 1 MiB buffers (cache-warm).
fn memcpy_hot() -> f64 {
    let src = vec![0x5au8; MIB];
    let mut dst = vec![0u8; MIB];
    // warm-up
    for _ in 0..50 {
        // SAFETY: both buffers are MIB bytes long and distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(black_box(src.as_ptr()), black_box(dst.as_mut_ptr()), MIB) };
    }
    let t = Instant::now();
    for _ in 0..CALLS {
        // SAFETY: both buffers are MIB bytes long and distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(black_box(src.as_ptr()), black_box(dst.as_mut_ptr()), MIB) };
        black_box(&mut dst);
    }
    gbps((CALLS * MIB) as f64, t.elapsed())
}

/// memcpy of 1 MiB, `CALLS` times, from offsets cycling through a 256 MiB buffer, the access
/// pattern of the SQL read test.
fn memcpy_strided() -> f64 {
    let n = RW_SEGMENT_MIB as usize;
    let src = pattern(n * MIB, 7);
    let mut dst = vec![0u8; MIB];
    let t = Instant::now();
    for i in 1..=CALLS {
        let off = (i % n) * MIB;
        // SAFETY: `src[off..]` holds at least MIB bytes (off <= (n - 1) MiB); `dst` is MIB long.
        unsafe { std::ptr::copy_nonoverlapping(black_box(src[off..].as_ptr()), black_box(dst.as_mut_ptr()), MIB) };
        black_box(&mut dst);
    }
    gbps((CALLS * MIB) as f64, t.elapsed())
}

fn run_throughput(c: &mut Client, name: &str) -> Result<Throughput, postgres::Error> {
    drop_if_exists(c, name);
    c.query_one("SELECT uvm.create_segment($1, $2)", &[&name, &(RW_SEGMENT_MIB * MIB_I)])?;
    let buf = pattern(MIB, 99);
    let write_sql = format!(
        "SELECT count(uvm.write_segment($1, ((i % {RW_SEGMENT_MIB}) * 1048576)::bigint, $2)) \
           FROM generate_series(1, {CALLS}) i"
    );
    let read_sql = format!(
        "SELECT sum(length(uvm.read_segment($1, ((i % {RW_SEGMENT_MIB}) * 1048576)::bigint, 1048576)))::bigint \
           FROM generate_series(1, {CALLS}) i"
    );
    let write = c.prepare(&write_sql)?;
    let read = c.prepare(&read_sql)?;
    // Warm-up: touch the whole segment once (commits its 256 MiB), and run each query once.
    c.query_one(
        format!(
            "SELECT count(uvm.write_segment($1, (i * 1048576)::bigint, $2)) FROM generate_series(0, {}) i",
            RW_SEGMENT_MIB - 1
        )
        .as_str(),
        &[&name, &buf],
    )?;
    let mut out = Throughput { write_gbps: vec![], read_gbps: vec![], memcpy_hot_gbps: 0.0, memcpy_strided_gbps: 0.0 };
    for _ in 0..RW_REPEATS {
        let t = Instant::now();
        let n: i64 = c.query_one(&write, &[&name, &buf])?.get(0);
        let d = t.elapsed();
        assert_eq!(n, CALLS as i64, "write count");
        out.write_gbps.push(gbps((CALLS * MIB) as f64, d));

        let t = Instant::now();
        let n: i64 = c.query_one(&read, &[&name])?.get(0);
        let d = t.elapsed();
        assert_eq!(n, (CALLS * MIB) as i64, "bytes read");
        out.read_gbps.push(gbps((CALLS * MIB) as f64, d));
    }
    // Spot check: what was written is what is read.
    let got: Vec<u8> = c.query_one("SELECT uvm.read_segment($1, $2, 1048576)", &[&name, &(17 * MIB_I)])?.get(0);
    assert_bytes_eq(&got, &buf, "bench segment content");
    out.memcpy_hot_gbps = memcpy_hot();
    out.memcpy_strided_gbps = memcpy_strided();
    Ok(out)
}

fn main() {
    let outfile = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: uvm_bench OUTFILE   (run through `make bench`)");
        std::process::exit(2)
    });
    let t_all = Instant::now();
    let mut admin = connect();
    let server_version: String = admin.query_one("SHOW server_version", &[]).unwrap().get(0);
    let device_info: Vec<(String, String)> = device_info(&mut admin);
    let provider = device_info.iter().find(|(k, _)| k == "provider").map(|(_, v)| v.clone()).unwrap_or_else(|| "unknown".into());
    let settings: Vec<(String, String)> = admin
        .query("SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name LIKE 'pg_uvm_share.%' ORDER BY name", &[])
        .map(|rows| rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        .unwrap_or_default();

    let pid = std::process::id();
    let cases: Vec<AttachCase> = [
        ("1 MiB", MIB_I, 1),
        ("16 MiB", 16 * MIB_I, 1),
        ("256 MiB", 256 * MIB_I, 1),
        ("1 GiB", GIB, 1),
        ("4 GiB", 4 * GIB, 1),
        ("16 GiB", 16 * GIB, 1),
        ("1 GiB, grown in 64 steps of 16 MiB", GIB, 64),
    ]
    .iter()
    .enumerate()
    .map(|(i, (label, size, steps))| AttachCase {
        label: label.to_string(),
        name: format!("bench_attach_{pid}_{i}"),
        size: *size,
        steps: *steps,
    })
    .collect();

    let mut attach = Vec::new();
    for case in &cases {
        eprintln!("uvm_bench: attach {} ...", case.label);
        let r = run_attach_case(&mut admin, case);
        if let Some(e) = &r.error {
            eprintln!("uvm_bench:   {e}");
        }
        // Drop right away: keeps the number of live mappings (and arena use) low.
        drop_if_exists(&mut admin, &case.name);
        attach.push(r);
    }

    eprintln!("uvm_bench: read/write throughput ...");
    let rw_name = format!("bench_rw_{pid}");
    let tp = run_throughput(&mut admin, &rw_name);
    drop_if_exists(&mut admin, &rw_name);
    if let Err(e) = &tp {
        eprintln!("uvm_bench:   {}", describe(e));
    }

    // --- report ------------------------------------------------------------------------------
    let mut md = String::new();
    let date = sh("date", &["-u", "+%Y-%m-%d %H:%M:%S UTC"], None).unwrap_or_default();
    let _ = writeln!(md, "# pg_uvm_share segment benchmark\n");
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(md, "| Date | {date} |");
    let _ = writeln!(md, "| Git commit | {} |", git_commit());
    let _ = writeln!(md, "| Machine | {} |", sh("uname", &["-srm"], None).unwrap_or_default());
    let _ = writeln!(md, "| CPU | {} |", cpu_model());
    let _ = writeln!(md, "| CPUs (nproc) | {} |", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0));
    let _ = writeln!(md, "| Memory | {} |", mem_total());
    let _ = writeln!(md, "| PostgreSQL | {server_version} |");
    let _ = writeln!(md, "| Provider | {provider} |");
    let _ = writeln!(md);
    if !settings.is_empty() || !device_info.is_empty() {
        let _ = writeln!(md, "<details><summary>device_info and settings</summary>\n");
        let _ = writeln!(md, "| property | value |\n|---|---|");
        for (k, v) in &device_info {
            let _ = writeln!(md, "| {k} | {v} |");
        }
        for (k, v) in &settings {
            let _ = writeln!(md, "| {k} | {v} |");
        }
        let _ = writeln!(md, "\n</details>\n");
    }

    let _ = writeln!(md, "## Attach time in a fresh backend\n");
    let _ = writeln!(
        md,
        "Each segment is created once; then {ATTACH_REPEATS} times a new connection runs \
         `SELECT uvm.attach_segment(name)`. *Server* is the time the function reports spending on \
         mapping; *round trip* is the client-side time of that query. Medians of {ATTACH_REPEATS}. \
         Nothing is written, so no memory is committed.\n"
    );
    let _ = writeln!(md, "| Segment | Size | Chunks | Create (ms) | Attach, server (ms, median) | Attach, round trip (ms, median) | Server min–max (ms) |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|");
    for r in &attach {
        if let Some(e) = &r.error {
            if r.server_ms.is_empty() {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | – | – | – | error: {} |",
                    r.label,
                    human(r.size),
                    r.chunks.map(|c| c.to_string()).unwrap_or("–".into()),
                    e.replace('|', "\\|")
                );
                continue;
            }
        }
        let min = r.server_ms.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = r.server_ms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.1} | {:.3} | {:.3} | {:.3}–{:.3} |",
            r.label,
            human(r.size),
            r.chunks.map(|c| c.to_string()).unwrap_or("–".into()),
            r.create_ms,
            median(&r.server_ms),
            median(&r.client_ms),
            min,
            max
        );
    }
    let _ = writeln!(md);

    let _ = writeln!(md, "## read_segment / write_segment throughput, 1 MiB per call\n");
    match &tp {
        Ok(tp) => {
            let w = median(&tp.write_gbps);
            let r = median(&tp.read_gbps);
            let _ = writeln!(
                md,
                "{CALLS} calls of 1 MiB in one statement over a {RW_SEGMENT_MIB} MiB segment \
                 (offsets cycle through it), timed client-side, median of {RW_REPEATS} runs. \
                 GB/s = 10^9 bytes per second. Reads are `sum(length(uvm.read_segment(...)))`, so \
                 no data crosses the wire; writes send one 1 MiB bytea parameter.\n"
            );
            let _ =
                writeln!(md, "| Operation | GB/s (median) | runs (GB/s) | vs memcpy, 1 MiB hot | vs memcpy, 256 MiB strided |");
            let _ = writeln!(md, "|---|---:|---:|---:|---:|");
            let runs = |v: &Vec<f64>| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", ");
            let _ = writeln!(
                md,
                "| uvm.write_segment | {w:.2} | {} | {:.1}% | {:.1}% |",
                runs(&tp.write_gbps),
                100.0 * w / tp.memcpy_hot_gbps,
                100.0 * w / tp.memcpy_strided_gbps
            );
            let _ = writeln!(
                md,
                "| uvm.read_segment | {r:.2} | {} | {:.1}% | {:.1}% |",
                runs(&tp.read_gbps),
                100.0 * r / tp.memcpy_hot_gbps,
                100.0 * r / tp.memcpy_strided_gbps
            );
            let _ = writeln!(md, "| memcpy 1 MiB, same buffers (bench process) | {:.2} | | 100% | |", tp.memcpy_hot_gbps);
            let _ =
                writeln!(md, "| memcpy 1 MiB from a 256 MiB buffer (bench process) | {:.2} | | | 100% |", tp.memcpy_strided_gbps);
            let _ = writeln!(
                md,
                "\nThe memcpy baselines copy {CALLS} × 1 MiB with `std::ptr::copy_nonoverlapping` in \
                 this process: once between the same two 1 MiB buffers (cache-warm, an upper bound), \
                 once from offsets cycling through a 256 MiB buffer like the SQL calls do."
            );
        }
        Err(e) => {
            let _ = writeln!(md, "Failed: {}", describe(e).replace('|', "\\|"));
        }
    }
    let _ = writeln!(
        md,
        "\n---\nNumbers are from a single run on the machine above (total bench time {:.0} s); \
         expect run-to-run variation, especially on small or shared machines.",
        t_all.elapsed().as_secs_f64()
    );

    if let Some(parent) = std::path::Path::new(&outfile).parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
        }
    }
    std::fs::write(&outfile, &md).unwrap_or_else(|e| panic!("write {outfile}: {e}"));
    print!("{md}");
    eprintln!("uvm_bench: report written to {outfile}");
    let failed = attach.iter().any(|r| r.error.is_some()) || tp.is_err();
    if failed {
        eprintln!("uvm_bench: some measurements failed (see the report)");
        std::process::exit(1);
    }
}
