//! pg_uvm_share GPU benchmark: one run of each measurement against its baseline, as a Markdown
//! section (a table of metric, value, baseline, ratio, target, verdict).
//!
//!     uvm_gpu_bench OUTFILE        (built with --features gpu; run by `scripts/gpu-suite run`)
//!
//! Needs a running cluster with the CUDA provider and the extension created (PGHOST, PGPORT,
//! PGUSER as a superuser: the bench_* functions are revoked from PUBLIC), and nvidia-smi.
//! `UVM_COMMIT`, when set, is printed as the commit measured.
//!
//! Memory: at most one large segment exists at a time (64 GiB for the attach test, otherwise
//! 8 GiB plus an 8 GiB private buffer or a 4 GiB copy-ceiling buffer), every segment is dropped
//! before the next is created, and each is dropped again on the way out.

use pg_uvm_share_tests::*;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

const GIB: i64 = 1 << 30;
const MIB_I: i64 = 1 << 20;

const READ_BYTES: i64 = 8 * GIB;
const READ_ITERS: i32 = 20;
const HOST_READ_ITERS: i32 = 3;
const ATTACH_BIG: i64 = 64 * GIB;
const FRESH_BACKENDS: usize = 5;
const HOST_ATTACH_REPEATS: usize = 3;
const HOST_BYTES: i64 = 8 * GIB;
const MIG_BYTES: i64 = 8 * GIB;
const CEILING_BYTES: i64 = 4 * GIB;
const CEILING_ITERS: i32 = 3;
/// Kernel read bandwidth from host memory measured on the H200 machine (CuPy, host_numa or
/// registered /dev/shm): docs in shared/notes/gpu-facts.md.
const HOST_READ_BASELINE_GBPS: f64 = 51.0;
const ATTACH_TARGET_MS: f64 = 5.0;
/// No measurement starts after this many seconds.
const TIME_BUDGET_S: u64 = 150;

/// One line of the table.
struct Row {
    metric: String,
    value: String,
    baseline: String,
    ratio: Option<f64>,
    target: String,
    verdict: String,
}

#[derive(Clone, Copy)]
enum Goal {
    /// ratio must be at least this
    AtLeast(f64),
    /// ratio must be at most this
    AtMost(f64),
    /// reported only
    Info,
}

impl Goal {
    fn text(self) -> String {
        match self {
            Goal::AtLeast(x) => format!("≥ {x:.2}"),
            Goal::AtMost(x) => format!("≤ {x:.2}"),
            Goal::Info => "–".into(),
        }
    }
    fn verdict(self, ratio: Option<f64>) -> String {
        match (self, ratio) {
            (Goal::Info, _) => "info".into(),
            (_, None) => "–".into(),
            (Goal::AtLeast(x), Some(r)) => if r >= x { "meets" } else { "**misses**" }.into(),
            (Goal::AtMost(x), Some(r)) => if r <= x { "meets" } else { "**misses**" }.into(),
        }
    }
}

struct Bench {
    rows: Vec<Row>,
    /// every failed measurement (the exit status)
    errors: Vec<String>,
    /// failures not shown in a row of the table
    other_errors: Vec<String>,
    notes: Vec<String>,
    start: Instant,
}

impl Bench {
    fn row(&mut self, metric: &str, value: String, baseline: String, ratio: Option<f64>, goal: Goal) {
        self.rows.push(Row { metric: metric.into(), value, baseline, ratio, target: goal.text(), verdict: goal.verdict(ratio) });
    }
    fn error(&mut self, metric: &str, e: String) {
        eprintln!("uvm_gpu_bench: {metric}: {e}");
        self.rows.push(Row {
            metric: metric.into(),
            value: format!("error: {}", e.replace('|', "\\|").replace('\n', " ")),
            baseline: "–".into(),
            ratio: None,
            target: "–".into(),
            verdict: "error".into(),
        });
        self.errors.push(format!("{metric}: {e}"));
    }
    /// False (and a row saying so) once the bench has used its time: the suite kills it at
    /// 200 s, and a killed bench writes no report.
    fn has_time(&mut self, metric: &str) -> bool {
        if self.start.elapsed() < Duration::from_secs(TIME_BUDGET_S) {
            return true;
        }
        self.error(metric, format!("skipped: the bench has run {TIME_BUDGET_S} s already"));
        false
    }
    fn note(&mut self, s: String) {
        eprintln!("uvm_gpu_bench: {s}");
        self.notes.push(s);
    }
}

fn list(v: &[f64], prec: usize) -> String {
    v.iter().map(|x| format!("{x:.prec$}")).collect::<Vec<_>>().join(", ")
}

type R<T> = Result<T, String>;

fn err(what: &str) -> impl Fn(postgres::Error) -> String + '_ {
    move |e| format!("{what}: {}", describe(&e))
}

/// A new connection (a fresh backend), with a statement timeout so nothing hangs the bench.
fn fresh() -> R<Client> {
    let mut c = try_connect().map_err(|e| format!("connect: {}", describe(&e)))?;
    c.batch_execute("SET statement_timeout = '90s'").map_err(err("SET statement_timeout"))?;
    Ok(c)
}

fn create(c: &mut Client, name: &str, size: i64, tier: &str) -> R<f64> {
    drop_if_exists(c, name);
    let t = Instant::now();
    try_create_segment_tier(c, name, size, None, tier)
        .map_err(err(&format!("create_segment({name}, {} GiB, {tier})", size / GIB)))?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

fn drop_if_exists(c: &mut Client, name: &str) {
    // A segment can be pinned for a moment by a session that is still exiting: retry briefly.
    for _ in 0..50 {
        match c.execute("SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name = $1", &[&name]) {
            Ok(_) => return,
            Err(e) if sqlstate(&e).as_deref() == Some("55006") => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => {
                eprintln!("uvm_gpu_bench: drop {name}: {}", describe(&e));
                return;
            }
        }
    }
}

fn context_ms(c: &mut Client) -> R<f64> {
    let v: Option<String> = c
        .query_opt("SELECT value FROM uvm.device_info() WHERE property = 'context_ms'", &[])
        .map_err(err("device_info() context_ms"))?
        .map(|r| r.get(0));
    let v = v.ok_or("uvm.device_info() has no 'context_ms' row")?;
    v.trim().parse().map_err(|_| format!("context_ms is not a number: {v:?}"))
}

fn attach_ms(c: &mut Client, name: &str) -> R<f64> {
    c.query_one("SELECT uvm.attach_segment($1)::float8", &[&name]).map(|r| r.get(0)).map_err(err("attach_segment"))
}

fn segment_read(c: &mut Client, name: &str, iters: i32) -> R<f64> {
    c.query_one("SELECT uvm.bench_segment_read($1, $2)::float8", &[&name, &iters])
        .map(|r| r.get(0))
        .map_err(err("bench_segment_read"))
}

fn private_read(c: &mut Client, bytes: i64, iters: i32) -> R<f64> {
    c.query_one("SELECT uvm.bench_private_read($1, $2)::float8", &[&bytes, &iters])
        .map(|r| r.get(0))
        .map_err(err("bench_private_read"))
}

/// Where a migration's time went, from `uvm.device_info()` of the migrating session.
#[derive(Clone, Copy, Default)]
struct Phases {
    map_ms: f64,
    alloc_ms: f64,
    copy_ms: f64,
    other_ms: f64,
}

fn prefetch(c: &mut Client, name: &str, size: i64, tier: &str) -> R<(i64, Duration, Phases)> {
    let t = Instant::now();
    let moved: i64 = c
        .query_one("SELECT uvm.prefetch_segment($1, 0, $2, $3)::bigint", &[&name, &size, &tier])
        .map_err(err(&format!("prefetch_segment to {tier}")))?
        .get(0);
    let elapsed = t.elapsed();
    let rows = c
        .query("SELECT property::text, value::text FROM uvm.device_info() WHERE property LIKE 'last_migration_%_ms'", &[])
        .map_err(err("device_info"))?;
    let get = |k: &str| {
        rows.iter()
            .find(|r| r.get::<_, String>(0) == format!("last_migration_{k}_ms"))
            .and_then(|r| r.get::<_, String>(1).parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    Ok((moved, elapsed, Phases { map_ms: get("map"), alloc_ms: get("alloc"), copy_ms: get("copy"), other_ms: get("other") }))
}

fn checksum(c: &mut Client, name: &str, size: i64) -> R<i64> {
    c.query_one("SELECT uvm.checksum_segment($1, 0, $2)::bigint", &[&name, &size])
        .map(|r| r.get(0))
        .map_err(err("checksum_segment"))
}

fn fill(c: &mut Client, name: &str, size: i64, seed: i64) -> R<()> {
    c.query_one("SELECT uvm.fill_segment($1, 0, $2, $3)::bigint", &[&name, &size, &seed]).map(|_| ()).map_err(err("fill_segment"))
}

/// Free bytes in /dev/shm (bench_host_register puts its file there).
fn dev_shm_free() -> Option<u64> {
    let path = std::ffi::CString::new("/dev/shm").unwrap();
    // SAFETY: statvfs is plain data; all-zero is a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed statvfs for the kernel to fill.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut s) };
    (rc == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

// --- the measurements ----------------------------------------------------------------------------

/// Context creation time and device memory per process, in fresh backends.
fn bench_contexts(b: &mut Bench) {
    const M: &str = "CUDA context creation, fresh backend (ms, median of 5)";
    if !b.has_time(M) {
        return;
    }
    let mut ms = Vec::new();
    let mut mem_note = None;
    for i in 0..FRESH_BACKENDS {
        let r = (|| -> R<()> {
            let used_before = try_gpu_memory_used_mib()?;
            let mut c = fresh()?;
            let pid = backend_pid(&mut c);
            ms.push(context_ms(&mut c)?);
            if i == 0 {
                std::thread::sleep(Duration::from_millis(300));
                let used_after = try_gpu_memory_used_mib()?;
                mem_note = Some((gpu_process_memory_mib(pid), used_after as i64 - used_before as i64));
            }
            Ok(())
        })();
        if let Err(e) = r {
            b.error(M, e);
            return;
        }
    }
    b.row(
        M,
        format!("{:.1} ({})", median(&ms), list(&ms, 1)),
        "140 (probe: bare context)".into(),
        Some(median(&ms) / 140.0),
        Goal::Info,
    );
    let (per_pid, delta) = mem_note.unwrap();
    let value = match per_pid {
        Some(m) => format!("{m} (nvidia-smi, backend's pid); {delta} total delta"),
        None => format!("{delta} (delta of memory.used; the pid is not in nvidia-smi's list)"),
    };
    let base = per_pid.map(|m| m as f64).unwrap_or(delta as f64);
    b.row(
        "device memory of a backend with a context (MiB)",
        value,
        "527 (probe: bare context)".into(),
        Some(base / 527.0),
        Goal::Info,
    );
}

/// Kernel read of an 8 GiB device segment made by another session vs a private allocation.
fn bench_segment_read(b: &mut Bench, admin: &mut Client, pid: u32) {
    const M: &str = "kernel read, 8 GiB device segment from another session (GB/s)";
    if !b.has_time(M) {
        return;
    }
    let name = format!("gpu_bench_rd_{pid}");
    let r = (|| -> R<()> {
        let create_ms = create(admin, &name, READ_BYTES, "device")?;
        fill(admin, &name, READ_BYTES, 1)?;
        b.note(format!("created the 8 GiB device segment in {create_ms:.0} ms"));
        let mut s = fresh()?;
        segment_read(&mut s, &name, 2)?; // warm-up: context, attach, kernel load
        private_read(&mut s, READ_BYTES, 2)?;
        let mut seg = Vec::new();
        let mut private = Vec::new();
        for _ in 0..3 {
            seg.push(segment_read(&mut s, &name, READ_ITERS)?);
            private.push(private_read(&mut s, READ_BYTES, READ_ITERS)?);
        }
        let (sg, pv) = (median(&seg), median(&private));
        b.row(
            M,
            format!("{sg:.0} ({})", list(&seg, 0)),
            format!("{pv:.0} private cuMemAlloc, same backend ({})", list(&private, 0)),
            Some(sg / pv),
            Goal::AtLeast(0.97),
        );
        Ok(())
    })();
    if let Err(e) = r {
        b.error(M, e);
    }
    drop_if_exists(admin, &name);
}

/// Attach of a 64 GiB device segment in fresh backends (context created before the timer).
fn bench_attach_big(b: &mut Bench, admin: &mut Client, pid: u32) {
    const M: &str = "attach 64 GiB device segment, fresh backend (ms, median of 5)";
    if !b.has_time(M) {
        return;
    }
    let name = format!("gpu_bench_att64_{pid}");
    let r = (|| -> R<()> {
        let create_ms = create(admin, &name, ATTACH_BIG, "device")?;
        let chunks: i64 = admin
            .query_one("SELECT chunks::bigint FROM uvm.segments WHERE name = $1", &[&name])
            .map_err(err("uvm.segments"))?
            .get(0);
        b.note(format!("created the 64 GiB device segment in {create_ms:.0} ms ({chunks} chunks)"));
        let mut ms = Vec::new();
        let mut client_ms = Vec::new();
        for _ in 0..FRESH_BACKENDS {
            let mut c = fresh()?;
            context_ms(&mut c)?;
            let t = Instant::now();
            ms.push(attach_ms(&mut c, &name)?);
            client_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let m = median(&ms);
        b.row(
            M,
            format!("{m:.2} ({}; round trip median {:.2})", list(&ms, 2), median(&client_ms)),
            format!("{ATTACH_TARGET_MS:.0} ms budget"),
            Some(m / ATTACH_TARGET_MS),
            Goal::AtMost(1.0),
        );
        Ok(())
    })();
    if let Err(e) = r {
        b.error(M, e);
    }
    drop_if_exists(admin, &name);
}

/// 8 GiB host-tier segment: attach vs cuMemHostRegister of the same bytes; kernel read from it.
fn bench_host_tier(b: &mut Bench, admin: &mut Client, pid: u32) {
    const M_ATT: &str = "attach 8 GiB host-tier segment, fresh backend (ms, median of 3)";
    const M_READ: &str = "kernel read, 8 GiB host-tier segment (GB/s)";
    if !b.has_time(M_ATT) {
        return;
    }
    let name = format!("gpu_bench_host_{pid}");
    match create(admin, &name, HOST_BYTES, "host") {
        Ok(create_ms) => b.note(format!("created the 8 GiB host-tier segment in {create_ms:.0} ms")),
        Err(e) => {
            b.error(M_ATT, e.clone());
            b.error(M_READ, e);
            drop_if_exists(admin, &name);
            return;
        }
    }
    let r = (|| -> R<()> {
        let shm = dev_shm_free().unwrap_or(0);
        let can_register = shm >= HOST_BYTES as u64 + GIB as u64;
        if !can_register {
            b.note(format!("/dev/shm has {} MiB free: bench_host_register({} GiB) skipped", shm >> 20, HOST_BYTES / GIB));
        }
        let mut att = Vec::new();
        let mut reg = Vec::new();
        for _ in 0..HOST_ATTACH_REPEATS {
            let mut c = fresh()?;
            context_ms(&mut c)?;
            att.push(attach_ms(&mut c, &name)?);
            if can_register {
                let ms: f64 = c
                    .query_one("SELECT uvm.bench_host_register($1)::float8", &[&HOST_BYTES])
                    .map_err(err("bench_host_register"))?
                    .get(0);
                reg.push(ms);
            }
        }
        let a = median(&att);
        if can_register {
            let g = median(&reg);
            b.row(
                M_ATT,
                format!("{a:.1} ({})", list(&att, 1)),
                format!("{g:.1} mmap + cuMemHostRegister of populated /dev/shm ({})", list(&reg, 1)),
                Some(a / g),
                Goal::AtMost(1.0),
            );
        } else {
            b.row(M_ATT, format!("{a:.1} ({})", list(&att, 1)), "– (no room in /dev/shm)".into(), None, Goal::Info);
        }
        Ok(())
    })();
    if let Err(e) = r {
        b.error(M_ATT, e);
    }
    let r = (|| -> R<()> {
        let mut c = fresh()?;
        segment_read(&mut c, &name, 1)?; // warm-up
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(segment_read(&mut c, &name, HOST_READ_ITERS)?);
        }
        let m = median(&v);
        b.row(
            M_READ,
            format!("{m:.1} ({})", list(&v, 1)),
            format!("{HOST_READ_BASELINE_GBPS:.0} (probe: CuPy over host_numa)"),
            Some(m / HOST_READ_BASELINE_GBPS),
            Goal::AtLeast(0.9),
        );
        Ok(())
    })();
    if let Err(e) = r {
        b.error(M_READ, e);
    }
    drop_if_exists(admin, &name);
}

/// Migration of an 8 GiB device segment to the host tier and back vs pinned cuMemcpy.
fn bench_migration(b: &mut Bench, admin: &mut Client, pid: u32) {
    const M_DTOH: &str = "migrate 8 GiB device → host, prefetch_segment (GB/s, client-side)";
    const M_HTOD: &str = "migrate 8 GiB host → device, prefetch_segment (GB/s, client-side)";
    if !b.has_time(M_DTOH) {
        return;
    }
    let ceiling: R<(f64, f64)> = (|| {
        let rows = admin
            .query("SELECT direction::text, gbps::float8 FROM uvm.bench_copy_ceiling($1, $2)", &[&CEILING_BYTES, &CEILING_ITERS])
            .map_err(err("bench_copy_ceiling"))?;
        let get = |d: &str| rows.iter().find(|r| r.get::<_, String>(0) == d).map(|r| r.get::<_, f64>(1));
        match (get("htod"), get("dtoh")) {
            (Some(h), Some(d)) => Ok((h, d)),
            _ => Err("bench_copy_ceiling did not return rows 'htod' and 'dtoh'".into()),
        }
    })();
    let name = format!("gpu_bench_mig_{pid}");
    let r = (|| -> R<[(i64, Duration, Phases); 2]> {
        create(admin, &name, MIG_BYTES, "device")?;
        fill(admin, &name, MIG_BYTES, 3)?;
        let before = checksum(admin, &name, MIG_BYTES)?;
        let to_host = prefetch(admin, &name, MIG_BYTES, "host")?;
        let to_dev = prefetch(admin, &name, MIG_BYTES, "device")?;
        let after = checksum(admin, &name, MIG_BYTES)?;
        if before != after {
            return Err(format!("checksum changed over the round trip: {before:#x} -> {after:#x}"));
        }
        Ok([to_host, to_dev])
    })();
    drop_if_exists(admin, &name);
    let moves = match r {
        Ok(m) => m,
        Err(e) => {
            b.error(M_DTOH, e.clone());
            b.error(M_HTOD, e);
            return;
        }
    };
    for (m, (moved, d, ph), dir) in [(M_DTOH, moves[0], "dtoh"), (M_HTOD, moves[1], "htod")] {
        if moved <= 0 {
            b.error(m, format!("prefetch moved {moved} bytes"));
            continue;
        }
        b.note(format!(
            "migration {dir} of {} MiB: updating this session's own mapping first {:.0} ms, allocating the new \
             chunks {:.0} ms, copying {:.0} ms ({:.1} GB/s), mapping/swapping/releasing {:.0} ms",
            moved / MIB_I,
            ph.map_ms,
            ph.alloc_ms,
            ph.copy_ms,
            moved as f64 / (ph.copy_ms / 1e3) / 1e9,
            ph.other_ms
        ));
        if let Ok((htod, dtoh)) = &ceiling {
            let ceil = if dir == "dtoh" { *dtoh } else { *htod };
            let g = moved as f64 / (ph.copy_ms / 1e3) / 1e9;
            b.row(
                &format!("migration copy phase {dir} (GB/s, cuMemcpy per chunk inside prefetch_segment)"),
                format!("{g:.1}"),
                format!("{ceil:.1} pinned cuMemcpy {dir}"),
                Some(g / ceil),
                Goal::AtLeast(0.9),
            );
        }
        let g = moved as f64 / d.as_secs_f64() / 1e9;
        let value = format!("{g:.1} ({} MiB in {:.0} ms)", moved / MIB_I, d.as_secs_f64() * 1e3);
        match &ceiling {
            Ok((htod, dtoh)) => {
                let ceil = if dir == "dtoh" { *dtoh } else { *htod };
                b.row(
                    m,
                    value,
                    format!("{ceil:.1} pinned cuMemcpy {dir}, {} GiB", CEILING_BYTES / GIB),
                    Some(g / ceil),
                    Goal::AtLeast(0.9),
                );
            }
            Err(e) => {
                b.row(m, value, format!("error: {}", e.replace('|', "\\|")), None, Goal::AtLeast(0.9));
                b.errors.push(format!("{m}: baseline: {e}"));
            }
        }
    }
}

/// GpuJoin on the data of shared/notes/gpu-facts.md: fact 50 M random int8 keys in [0, 20 M),
/// dim 5 M unique keys with a payload. PostgreSQL's parallel hash join, the GPU probe aggregate
/// and a bare parallel count(*) of fact, all with the same number of workers.
fn bench_gpujoin(b: &mut Bench, admin: &mut Client, pid: u32) {
    const M_JOIN: &str = "GpuJoin probe vs PostgreSQL's parallel hash join, fact 50 M x dim 5 M (s)";
    const M_SCAN: &str = "GpuJoin probe vs a bare parallel count(*) of fact (s)";
    const M_KERNEL: &str = "GpuJoin probe kernel alone, 4 Mi keys vs the 5 M-row table (M keys/s)";
    const M_MAT: &str =
        "GpuJoin materialize (all 12.5 M pairs into a result buffer grown from 64 Ki pairs) vs PostgreSQL's join count (s)";
    if !b.has_time(M_JOIN) {
        return;
    }
    let seg = format!("gpu_bench_dim_{pid}");
    let r = (|| -> R<()> {
        let mut c = try_connect().map_err(|e| format!("connect: {}", describe(&e)))?;
        let t = Instant::now();
        for q in [
            "SET statement_timeout = '200s'",
            "DROP TABLE IF EXISTS bench_fact, bench_dim",
            "CREATE UNLOGGED TABLE bench_dim AS SELECT i::bigint AS k, i::bigint AS v FROM generate_series(1, 5000000) i",
            "CREATE UNLOGGED TABLE bench_fact AS SELECT (random() * 20000000)::bigint AS k FROM generate_series(1, 50000000)",
            "VACUUM ANALYZE bench_dim",
            "VACUUM ANALYZE bench_fact",
            "SET work_mem = '1GB'",
            "SET max_parallel_workers_per_gather = 5",
        ] {
            c.batch_execute(q).map_err(err(q))?;
        }
        b.note(format!("generated fact (50 M) and dim (5 M) in {:.0} s", t.elapsed().as_secs_f64()));
        let time = |c: &mut Client, q: &str| -> R<(f64, Vec<String>)> {
            let t = Instant::now();
            let row = c.query_one(q, &[]).map_err(err(q))?;
            let vals = (0..row.len()).map(|i| row.get::<_, Option<String>>(i).unwrap_or_default()).collect();
            Ok((t.elapsed().as_secs_f64(), vals))
        };
        drop_if_exists(&mut c, &seg);
        let (build_s, _) = time(&mut c, &format!("SELECT uvm.gpujoin_build('{seg}', 'SELECT k, v FROM bench_dim')::text"))?;
        let dev: i64 =
            c.query_one("SELECT device_bytes FROM uvm.segments WHERE name = $1", &[&seg]).map_err(err("segments"))?.get(0);
        b.note(format!("gpujoin_build of dim (5 M rows) in {build_s:.2} s; inner table {} MiB on the device", dev >> 20));
        let pg_q = "SELECT count(*)::text, sum(d.v)::text FROM bench_fact f JOIN bench_dim d ON f.k = d.k";
        let gpu_q = format!(
            "SELECT m.matches::text, m.payload_sum::text FROM (SELECT (uvm.gpujoin_probe('{seg}', k)).* FROM bench_fact) m"
        );
        let scan_q = "SELECT count(*)::text FROM bench_fact";
        let (mut pg, mut gpu, mut scan) = (vec![], vec![], vec![]);
        let (mut pg_vals, mut gpu_vals) = (vec![], vec![]);
        time(&mut c, scan_q)?; // warm the buffers
        for _ in 0..2 {
            let (s, v) = time(&mut c, pg_q)?;
            pg.push(s);
            pg_vals = v;
            let (s, v) = time(&mut c, &gpu_q)?;
            gpu.push(s);
            gpu_vals = v;
            scan.push(time(&mut c, scan_q)?.0);
        }
        if pg_vals != gpu_vals {
            return Err(format!("different answers: PostgreSQL {pg_vals:?}, GpuJoin {gpu_vals:?}"));
        }
        let (pgm, gm, sm) = (median(&pg), median(&gpu), median(&scan));
        b.row(
            M_JOIN,
            format!("{gm:.2} ({})", list(&gpu, 2)),
            format!("{pgm:.2} PostgreSQL, 5 workers ({})", list(&pg, 2)),
            Some(gm / pgm),
            Goal::AtMost(0.33),
        );
        b.row(
            M_SCAN,
            format!("{gm:.2}"),
            format!("{sm:.2} count(*), 5 workers ({})", list(&scan, 2)),
            Some(gm / sm),
            Goal::AtMost(1.5),
        );
        b.note(format!("both joins: {} matches, payload sum {}", gpu_vals[0], gpu_vals[1]));
        b.note(format!("probe throughput end to end: {:.0} M keys/s (50 M keys, scan and batching included)", 50.0 / gm));
        let kq = format!("SELECT uvm.bench_join_probe('{seg}', 4194304, 20000000)");
        let kps: f64 = c.query_one(kq.as_str(), &[]).map_err(err("bench_join_probe"))?.get(0);
        b.row(
            M_KERNEL,
            format!("{:.0}", kps / 1e6),
            format!("{:.0} M keys/s end to end", 50.0 / gm),
            Some(kps / 1e6 / (50.0 / gm)),
            Goal::Info,
        );
        let res = format!("gpu_bench_pairs_{pid}");
        drop_if_exists(&mut c, &res);
        c.query_one("SELECT uvm.gpujoin_pairs_create($1, 65536)", &[&res]).map_err(err("gpujoin_pairs_create"))?;
        let mq = format!("SELECT m.matches::text, m.payload_sum::text FROM (SELECT (uvm.gpujoin_materialize('{seg}', '{res}', k)).* FROM bench_fact) m");
        let (ms, mvals) = time(&mut c, &mq)?;
        if mvals != pg_vals {
            return Err(format!("materialize: different answers: PostgreSQL {pg_vals:?}, GpuJoin {mvals:?}"));
        }
        let r = c
            .query_one("SELECT size, device_bytes, host_bytes, chunks::bigint FROM uvm.segments WHERE name = $1", &[&res])
            .map_err(err("segments"))?;
        let (size, dev, host, chunks): (i64, i64, i64, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
        let (n, sum): (i64, String) = {
            let r = c
                .query_one("SELECT count(*), sum(payload)::text FROM uvm.gpujoin_pairs($1)", &[&res])
                .map_err(err("gpujoin_pairs"))?;
            (r.get(0), r.get(1))
        };
        if n.to_string() != pg_vals[0] || sum != pg_vals[1] {
            return Err(format!("materialized pairs read back: {n} pairs, sum {sum}; PostgreSQL {pg_vals:?}"));
        }
        b.row(M_MAT, format!("{ms:.2}"), format!("{pgm:.2} PostgreSQL's join, count only"), Some(ms / pgm), Goal::Info);
        b.note(format!(
            "materialized result buffer: {n} pairs read back (same count and sum as PostgreSQL's join); {} MiB in {chunks} chunks ({} MiB device, {} MiB host)",
            size >> 20,
            dev >> 20,
            host >> 20
        ));
        drop_if_exists(&mut c, &res);
        for w in [1, 4, 8] {
            c.batch_execute(&format!("SET max_parallel_workers_per_gather = {w}")).map_err(err("workers"))?;
            // GPU memory in use before the query (the inner table included: it is already there)
            // and at its peak (sampled while it runs): the difference is the workers' contexts.
            let before = try_gpu_memory_used_mib()?;
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let sampler = {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut peak = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        peak = peak.max(try_gpu_memory_used_mib().unwrap_or(0));
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    peak
                })
            };
            let plan = try_explain_analyze(&mut c, &gpu_q).map_err(err("explain analyze"))?;
            let (s, _) = time(&mut c, &gpu_q)?;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let peak = sampler.join().unwrap_or(0);
            let launched: i64 = workers_launched(&plan).iter().sum();
            let dev_now: i64 =
                c.query_one("SELECT device_bytes FROM uvm.segments WHERE name = $1", &[&seg]).map_err(err("segments"))?.get(0);
            let per = if launched > 0 {
                format!(", ~{} MiB per worker", peak.saturating_sub(before) / launched as u64)
            } else {
                String::new()
            };
            b.note(format!(
                "{w} worker(s) asked, {launched} launched: probe {s:.2} s; inner table: one segment of {} MiB on the device whatever the workers; \
                 GPU memory in use {before} MiB before the query, {peak} MiB at its peak: +{} MiB for the workers' CUDA contexts{per}",
                dev_now >> 20,
                peak.saturating_sub(before)
            ));
        }
        c.batch_execute("DROP TABLE bench_fact, bench_dim").map_err(err("drop tables"))?;
        Ok(())
    })();
    if let Err(e) = r {
        b.error(M_JOIN, e);
    }
    drop_if_exists(admin, &seg);
}

fn main() {
    let outfile = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: uvm_gpu_bench OUTFILE   (run through scripts/gpu-suite run)");
        std::process::exit(2)
    });
    let t_all = Instant::now();
    let pid = std::process::id();
    let mut b = Bench { rows: Vec::new(), errors: Vec::new(), other_errors: Vec::new(), notes: Vec::new(), start: t_all };

    let mut admin = fresh().unwrap_or_else(|e| panic!("cannot connect: {e}"));
    let info: Vec<(String, String)> = device_info(&mut admin);
    let provider = info.iter().find(|(k, _)| k == "provider").map(|(_, v)| v.as_str()).unwrap_or("unknown");
    if provider != "cuda" {
        b.errors.push(format!("provider is {provider}, not cuda"));
        b.other_errors.push(format!("provider is {provider}, not cuda: nothing measured"));
    } else {
        eprintln!("uvm_gpu_bench: contexts ...");
        bench_contexts(&mut b);
        eprintln!("uvm_gpu_bench: segment read ...");
        bench_segment_read(&mut b, &mut admin, pid);
        eprintln!("uvm_gpu_bench: 64 GiB attach ...");
        bench_attach_big(&mut b, &mut admin, pid);
        eprintln!("uvm_gpu_bench: host tier ...");
        bench_host_tier(&mut b, &mut admin, pid);
        eprintln!("uvm_gpu_bench: migration ...");
        bench_migration(&mut b, &mut admin, pid);
        bench_gpujoin(&mut b, &mut admin, pid);
    }

    // --- report ------------------------------------------------------------------------------
    let mut md = String::new();
    let _ = writeln!(md, "## GPU benchmark\n");
    let commit = std::env::var("UVM_COMMIT").unwrap_or_else(|_| "(UVM_COMMIT not set)".into());
    let server_version: String = admin.query_one("SHOW server_version", &[]).map(|r| r.get(0)).unwrap_or_default();
    let _ = writeln!(
        md,
        "One run (commit {commit}, PostgreSQL {server_version}, provider {provider}, {:.0} s in all). \
         Ratio = value / baseline; each baseline is measured in the same run unless marked *probe* \
         (a figure from shared/notes/gpu-facts.md) or *budget*. GB/s = 10^9 bytes/s.\n",
        t_all.elapsed().as_secs_f64()
    );
    let _ = writeln!(md, "| metric | value | baseline | ratio | target | verdict |");
    let _ = writeln!(md, "|---|---|---|---:|---|---|");
    for r in &b.rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            r.metric,
            r.value,
            r.baseline,
            r.ratio.map(|x| format!("{x:.2}")).unwrap_or_else(|| "–".into()),
            r.target,
            r.verdict
        );
    }
    if !b.notes.is_empty() {
        let _ = writeln!(md);
        for n in &b.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    if !b.other_errors.is_empty() {
        let _ = writeln!(md, "\n**Errors:**\n");
        for e in &b.other_errors {
            let _ = writeln!(md, "- {}", e.replace('\n', " "));
        }
    }
    let _ = writeln!(md, "\n<details><summary>uvm.device_info()</summary>\n\n| property | value |\n|---|---|");
    for (k, v) in &info {
        let _ = writeln!(md, "| {k} | {} |", v.replace('|', "\\|"));
    }
    let _ = writeln!(md, "\n</details>");

    if let Some(parent) = std::path::Path::new(&outfile).parent() {
        if !parent.as_os_str().is_empty() {
            let _ = std::fs::create_dir_all(parent);
        }
    }
    std::fs::write(&outfile, &md).unwrap_or_else(|e| panic!("write {outfile}: {e}"));
    print!("{md}");
    if !b.errors.is_empty() {
        eprintln!("uvm_gpu_bench: {} measurement(s) failed", b.errors.len());
        std::process::exit(1);
    }
}
