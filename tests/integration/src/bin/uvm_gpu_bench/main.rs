//! pg_uvm_share GPU benchmark: both execution modes side by side, each figure against its
//! baseline and target.
//!
//!     uvm_gpu_bench measure MODE RESULTS [--keep-tables]
//!     uvm_gpu_bench report OUTFILE process=RESULTS service=RESULTS
//!
//! (built with --features gpu; run by `scripts/gpu-suite run`)
//!
//! `measure` runs every measurement once against the running cluster, whose execution mode
//! (`pg_uvm_share.gpu_execution`, fixed at server start) must be MODE (`process` or `service`),
//! and writes the results to RESULTS, a tab-separated file rewritten after each measurement (so
//! that a bench stopped by the suite's timeout still leaves what it measured). The suite runs it
//! once per mode, restarting the cluster in between. `--keep-tables` leaves the GpuJoin tables
//! (fact 50 M rows, dim 5 M; unlogged, so they survive a clean restart but not a crash) for the
//! next mode's run, which then measures the same data. `report` renders the modes' results as
//! one Markdown section: the figures of issue 9 (point 9) side by side with their targets, then
//! every measurement, the notes, and `uvm.device_info()` of each mode.
//!
//! Needs PGHOST, PGPORT, PGUSER (a superuser: the bench_* functions are revoked from PUBLIC) and
//! nvidia-smi; it runs as root (it reads /proc/<pid>/maps of the cluster's processes).
//! `UVM_COMMIT` is recorded as the commit measured; `UVM_BENCH_BUDGET_S` (default 150) is the
//! time after which no measurement starts.
//!
//! Memory: at most one large segment exists at a time (64 GiB for the process-mode attach test,
//! otherwise 8 GiB plus an 8 GiB private buffer or a 4 GiB copy-ceiling buffer); every segment is
//! dropped before the next is created, and again on the way out. Process mode's 64 sessions hold
//! a CUDA context each (about 33 GiB together) until they are closed, before anything else runs.

use pg_uvm_share_tests::*;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

// The measurements, by topic, and the report.
mod caches;
mod groupagg;
mod joins;
mod report;
mod segments;
mod service;

use caches::*;
use groupagg::*;
use joins::*;
use report::*;
use segments::*;
use service::*;

pub(crate) const GIB: i64 = 1 << 30;
pub(crate) const MIB_I: i64 = 1 << 20;

pub(crate) const READ_BYTES: i64 = 8 * GIB;
pub(crate) const READ_ITERS: i32 = 20;
pub(crate) const HOST_READ_ITERS: i32 = 3;
pub(crate) const ATTACH_BIG: i64 = 64 * GIB;
pub(crate) const FRESH_BACKENDS: usize = 5;
pub(crate) const HOST_ATTACH_REPEATS: usize = 3;
pub(crate) const HOST_BYTES: i64 = 8 * GIB;
pub(crate) const MIG_BYTES: i64 = 8 * GIB;
pub(crate) const CEILING_BYTES: i64 = 4 * GIB;
pub(crate) const CEILING_ITERS: i32 = 3;
/// Kernel read bandwidth from host memory measured on the H200 machine (CuPy, host_numa or
/// registered /dev/shm): docs in shared/notes/gpu-facts.md.
pub(crate) const HOST_READ_BASELINE_GBPS: f64 = 51.0;
pub(crate) const ATTACH_TARGET_MS: f64 = 5.0;
/// The device segment of the first-call and many-sessions measurements, and what they read.
pub(crate) const SMALL_BYTES: i64 = 64 * MIB_I;
pub(crate) const SMALL_SEED: i64 = 17;
pub(crate) const FIRST_CALL_BYTES: i64 = MIB_I;
pub(crate) const FIRST_CALL_BUDGET_MS: f64 = 2.0;
/// Fresh connections timed for the first GPU call (process mode's each create a CUDA context).
pub(crate) const FIRST_CALL_CONNS_SERVICE: usize = 15;
pub(crate) const FIRST_CALL_CONNS_PROCESS: usize = 5;
pub(crate) const RT_REQUESTS_ONE: i32 = 20_000;
/// Per session of the 32: 64 000 requests in all, about 2 s at the target median on 16 cores.
pub(crate) const RT_REQUESTS_EACH: i32 = 2_000;
pub(crate) const RT_SESSIONS: usize = 32;
pub(crate) const RT_MEDIAN_US: f64 = 30.0;
pub(crate) const RT_P99_US: f64 = 200.0;
pub(crate) const MEM_SESSIONS: usize = 64;
/// What 64 sessions may add to GPU memory in service mode: nothing but noise.
pub(crate) const MEM_ALLOWANCE_MIB: f64 = 64.0;
pub(crate) const JOIN_WORKERS: [i32; 2] = [5, 8];
pub(crate) const FACT_ROWS: i64 = 50_000_000;
pub(crate) const DIM_ROWS: i64 = 5_000_000;
/// fact's keys are random in [0, KEY_RANGE): a quarter of them match.
pub(crate) const KEY_RANGE: i64 = 20_000_000;
pub(crate) const JOIN_REPEATS: usize = 3;
pub(crate) const HASH_JOIN_REPEATS: usize = 2;
/// The plan node's runs, each after a count(*) of fact (its baseline).
pub(crate) const NODE_REPEATS: usize = 5;
pub(crate) const SCAN_TARGET: f64 = 1.3;
pub(crate) const HASH_TARGET: f64 = 0.25;
/// Issue 12's targets for the plain SQL join through the plan node.
pub(crate) const NODE_HASH_TARGET: f64 = 0.25;
pub(crate) const NODE_SCAN_TARGET: f64 = 1.5;
pub(crate) const DEFAULT_BUDGET_S: u64 = 150;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    Process,
    Service,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Process => "process",
            Mode::Service => "service",
        }
    }
    fn parse(s: &str) -> Option<Mode> {
        match s {
            "process" => Some(Mode::Process),
            "service" => Some(Mode::Service),
            _ => None,
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Goal {
    /// ratio must be at least this
    AtLeast(f64),
    /// ratio must be at most this
    AtMost(f64),
    /// reported only
    Info,
}

/// A figure's target: the goal for its ratio, the modes it binds (issue 9's targets bind the
/// service; process mode's figure is then its reference), and how the report states it.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) goal: Goal,
    pub(crate) service_only: bool,
    pub(crate) text: Option<String>,
}

impl Target {
    fn info() -> Target {
        Target { goal: Goal::Info, service_only: false, text: None }
    }
    fn both(goal: Goal) -> Target {
        Target { goal, service_only: false, text: None }
    }
    fn service(goal: Goal) -> Target {
        Target { goal, service_only: true, text: None }
    }
    /// States the target in the report's words (an absolute budget, say) instead of the ratio.
    fn saying(mut self, text: &str) -> Target {
        self.text = Some(text.to_string());
        self
    }
    fn text(&self) -> String {
        let g = match (&self.text, self.goal) {
            (Some(t), _) => t.clone(),
            (None, Goal::AtLeast(x)) => format!("≥ {x:.2}"),
            (None, Goal::AtMost(x)) => format!("≤ {x:.2}"),
            (None, Goal::Info) => return "–".into(),
        };
        if self.service_only {
            format!("{g} (service)")
        } else {
            g
        }
    }
    fn verdict(&self, mode: Mode, ratio: Option<f64>) -> String {
        if self.service_only && mode == Mode::Process && !matches!(self.goal, Goal::Info) {
            return "reference".into();
        }
        match (self.goal, ratio) {
            (Goal::Info, _) => "info".into(),
            (_, None) => "–".into(),
            (Goal::AtLeast(x), Some(r)) => meets(r >= x),
            (Goal::AtMost(x), Some(r)) => meets(r <= x),
        }
    }
}

pub(crate) fn meets(ok: bool) -> String {
    if ok { "meets" } else { "**misses**" }.into()
}

/// One measurement of one mode: a line of the tables.
#[derive(Clone, Default)]
pub(crate) struct Row {
    /// stable across modes: the report pairs a measurement's rows by it
    pub(crate) key: String,
    pub(crate) metric: String,
    /// the value in a few words, for the side-by-side table
    pub(crate) short: String,
    pub(crate) value: String,
    pub(crate) baseline: String,
    pub(crate) ratio: Option<f64>,
    pub(crate) target: String,
    pub(crate) verdict: String,
}

pub(crate) struct Bench {
    pub(crate) mode: Mode,
    pub(crate) rows: Vec<Row>,
    /// failed measurements (the exit status)
    pub(crate) failed: usize,
    /// failures not shown in a row of the table
    pub(crate) other_errors: Vec<String>,
    pub(crate) notes: Vec<String>,
    pub(crate) meta: Vec<(String, String)>,
    pub(crate) info: Vec<(String, String)>,
    pub(crate) start: Instant,
    pub(crate) budget: Duration,
    pub(crate) results: String,
    /// the GPU service's pid in service mode, else 0
    pub(crate) service_pid: i32,
}

pub(crate) fn md(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

impl Bench {
    fn push(&mut self, r: Row) {
        eprintln!("uvm_gpu_bench [{}]: {}: {} ({})", self.mode.name(), r.metric, r.value, r.verdict);
        self.rows.push(r);
    }
    #[allow(clippy::too_many_arguments)]
    fn row(&mut self, key: &str, metric: &str, short: String, value: String, baseline: String, ratio: Option<f64>, t: Target) {
        let verdict = t.verdict(self.mode, ratio);
        self.push(Row { key: key.into(), metric: metric.into(), short, value, baseline, ratio, target: t.text(), verdict });
    }
    /// A row whose verdict is decided by the caller (more than one condition).
    #[allow(clippy::too_many_arguments)]
    fn row_judged(
        &mut self,
        key: &str,
        metric: &str,
        short: String,
        value: String,
        baseline: String,
        ratio: Option<f64>,
        t: Target,
        ok: bool,
    ) {
        let verdict = if t.service_only && self.mode == Mode::Process { "reference".into() } else { meets(ok) };
        self.push(Row { key: key.into(), metric: metric.into(), short, value, baseline, ratio, target: t.text(), verdict });
    }
    /// A measurement that does not apply to this mode.
    fn not_applicable(&mut self, key: &str, metric: &str, why: &str) {
        self.push(Row {
            key: key.into(),
            metric: metric.into(),
            short: "n/a".into(),
            value: format!("n/a: {why}"),
            baseline: "–".into(),
            ratio: None,
            target: "–".into(),
            verdict: "n/a".into(),
        });
    }
    fn error(&mut self, key: &str, metric: &str, e: String) {
        eprintln!("uvm_gpu_bench [{}]: {metric}: {e}", self.mode.name());
        self.rows.push(Row {
            key: key.into(),
            metric: metric.into(),
            short: "error".into(),
            value: format!("error: {}", md(&e)),
            baseline: "–".into(),
            ratio: None,
            target: "–".into(),
            verdict: "error".into(),
        });
        self.failed += 1;
    }
    /// False (and a row saying so for each figure) once the bench has used its time: the suite
    /// kills it a little later.
    fn has_time(&mut self, figures: &[(&str, &str)]) -> bool {
        if self.start.elapsed() < self.budget {
            return true;
        }
        for (k, m) in figures {
            self.error(k, m, format!("skipped: the bench has run {} s already", self.budget.as_secs()));
        }
        false
    }
    fn note(&mut self, s: String) {
        eprintln!("uvm_gpu_bench [{}]: {s}", self.mode.name());
        self.notes.push(s);
    }
    /// Writes everything measured so far to the results file.
    fn save(&self) {
        let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
        let mut out = String::new();
        let mut meta = self.meta.clone();
        meta.push(("seconds".into(), format!("{:.0}", self.start.elapsed().as_secs_f64())));
        meta.push(("failed".into(), self.failed.to_string()));
        for (k, v) in &meta {
            let _ = writeln!(out, "meta\t{}\t{}", clean(k), clean(v));
        }
        for r in &self.rows {
            let _ = writeln!(
                out,
                "row\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                clean(&r.key),
                clean(&r.metric),
                clean(&r.short),
                clean(&r.value),
                clean(&r.baseline),
                r.ratio.map(|x| format!("{x}")).unwrap_or_default(),
                clean(&r.target),
                clean(&r.verdict)
            );
        }
        for n in &self.notes {
            let _ = writeln!(out, "note\t{}", clean(n));
        }
        for e in &self.other_errors {
            let _ = writeln!(out, "error\t{}", clean(e));
        }
        for (k, v) in &self.info {
            let _ = writeln!(out, "info\t{}\t{}", clean(k), clean(v));
        }
        if let Err(e) = std::fs::write(&self.results, out) {
            eprintln!("uvm_gpu_bench: cannot write {}: {e}", self.results);
        }
    }
}

pub(crate) fn list(v: &[f64], prec: usize) -> String {
    v.iter().map(|x| format!("{x:.prec$}")).collect::<Vec<_>>().join(", ")
}

pub(crate) fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

pub(crate) fn min_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::min)
}

pub(crate) fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

type R<T> = Result<T, String>;

pub(crate) fn err(what: &str) -> impl Fn(postgres::Error) -> String + '_ {
    move |e| format!("{what}: {}", describe(&e))
}

/// A new connection (a fresh backend) whose statement timeout comes in the startup packet: no
/// query runs before the caller's first.
pub(crate) fn fresh() -> R<Client> {
    let mut cfg = postgres::Config::new();
    let host = env_var("PGHOST");
    if host.starts_with('/') {
        cfg.host_path(&host);
    } else {
        cfg.host(&host);
    }
    let port: u16 = env_var("PGPORT").parse().map_err(|_| "PGPORT is not a port number".to_string())?;
    cfg.port(port)
        .user(&env_var("PGUSER"))
        .dbname(&std::env::var("PGDATABASE").unwrap_or_else(|_| "postgres".into()))
        .application_name("uvm_gpu_bench")
        .options("-c statement_timeout=120s")
        .connect_timeout(Duration::from_secs(10));
    cfg.connect(NoTls).map_err(|e| format!("connect: {}", describe(&e)))
}

/// The first column of the first row of `sql`, sent as one simple-protocol query (one round
/// trip, as psql sends it).
pub(crate) fn simple_value(c: &mut Client, sql: &str) -> R<String> {
    for m in c.simple_query(sql).map_err(err(sql))? {
        if let postgres::SimpleQueryMessage::Row(r) = m {
            return r.get(0).map(str::to_string).ok_or_else(|| format!("{sql}: NULL"));
        }
    }
    Err(format!("{sql}: no row"))
}

pub(crate) fn pid_of(c: &mut Client) -> R<i32> {
    c.query_one("SELECT pg_backend_pid()", &[]).map_err(err("pg_backend_pid()"))?.try_get(0).map_err(err("pg_backend_pid()"))
}

pub(crate) fn create(c: &mut Client, name: &str, size: i64, tier: &str) -> R<f64> {
    drop_if_exists(c, name);
    let t = Instant::now();
    try_create_segment_tier(c, name, size, None, tier)
        .map_err(err(&format!("create_segment({name}, {} MiB, {tier})", size / MIB_I)))?;
    Ok(ms_since(t))
}

pub(crate) fn drop_if_exists(c: &mut Client, name: &str) {
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

pub(crate) fn info_value(c: &mut Client, property: &str) -> R<Option<String>> {
    Ok(c.query_opt("SELECT value FROM uvm.device_info() WHERE property = $1", &[&property])
        .map_err(err("uvm.device_info()"))?
        .map(|r| r.get(0)))
}

pub(crate) fn info_number(c: &mut Client, property: &str) -> R<f64> {
    let v = info_value(c, property)?.ok_or_else(|| format!("uvm.device_info() has no '{property}' row"))?;
    v.trim().parse().map_err(|_| format!("{property} is not a number: {v:?}"))
}

pub(crate) fn attach_ms(c: &mut Client, name: &str) -> R<f64> {
    c.query_one("SELECT uvm.attach_segment($1)::float8", &[&name]).map(|r| r.get(0)).map_err(err("attach_segment"))
}

pub(crate) fn segment_read(c: &mut Client, name: &str, iters: i32) -> R<f64> {
    c.query_one("SELECT uvm.bench_segment_read($1, $2)::float8", &[&name, &iters])
        .map(|r| r.get(0))
        .map_err(err("bench_segment_read"))
}

pub(crate) fn private_read(c: &mut Client, bytes: i64, iters: i32) -> R<f64> {
    c.query_one("SELECT uvm.bench_private_read($1, $2)::float8", &[&bytes, &iters])
        .map(|r| r.get(0))
        .map_err(err("bench_private_read"))
}

pub(crate) fn checksum(c: &mut Client, name: &str, size: i64) -> R<i64> {
    c.query_one("SELECT uvm.checksum_segment($1, 0, $2)::bigint", &[&name, &size])
        .map(|r| r.get(0))
        .map_err(err("checksum_segment"))
}

pub(crate) fn fill(c: &mut Client, name: &str, size: i64, seed: i64) -> R<()> {
    c.query_one("SELECT uvm.fill_segment($1, 0, $2, $3)::bigint", &[&name, &size, &seed]).map(|_| ()).map_err(err("fill_segment"))
}

/// Free bytes in /dev/shm (bench_host_register puts its file there).
pub(crate) fn dev_shm_free() -> Option<u64> {
    let path = std::ffi::CString::new("/dev/shm").unwrap();
    // SAFETY: statvfs is plain data; all-zero is a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed statvfs for the kernel to fill.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut s) };
    (rc == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

/// GPU memory used once it stops moving (two readings 300 ms apart within 2 MiB; at most 10 s).
pub(crate) fn settled_gpu_memory_mib() -> R<u64> {
    let start = Instant::now();
    let mut last = try_gpu_memory_used_mib()?;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = try_gpu_memory_used_mib()?;
        if now.abs_diff(last) <= 2 || start.elapsed() > Duration::from_secs(10) {
            return Ok(now);
        }
        last = now;
    }
}

/// Waits (up to `timeout`) until `c` is the only client backend and no parallel worker runs:
/// the sessions of earlier measurements exit asynchronously (in process mode each releases a
/// CUDA context on its way out).
pub(crate) fn wait_quiet(c: &mut Client, timeout: Duration) -> R<()> {
    let mut others = -1i64;
    let mut failure = None;
    let ok = wait_until(timeout, || {
        match c.query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
               AND backend_type IN ('client backend', 'parallel worker')",
            &[],
        ) {
            Ok(r) => others = r.get(0),
            Err(e) => failure = Some(describe(&e)),
        }
        others == 0 || failure.is_some()
    });
    match failure {
        Some(e) => Err(format!("pg_stat_activity: {e}")),
        None if ok => Ok(()),
        None => Err(format!("{others} other sessions still connected after {timeout:?}")),
    }
}

/// Runs `f` while sampling GPU memory used every 20 ms: its result and the peak seen.
pub(crate) fn with_peak_memory<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(try_gpu_memory_used_mib().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let r = f();
    stop.store(true, Ordering::Relaxed);
    (r, sampler.join().unwrap_or(0))
}

/// The `Workers Planned: N` counts of an EXPLAIN text.
pub(crate) fn workers_planned(plan: &str) -> Vec<i64> {
    plan.lines().filter_map(|l| l.trim().strip_prefix("Workers Planned:")).filter_map(|n| n.trim().parse().ok()).collect()
}

// --- every measurement, in order -----------------------------------------------------------------

fn measure(mode: Mode, results: String, keep_tables: bool) -> i32 {
    let t_all = Instant::now();
    let pid = std::process::id();
    let budget = std::env::var("UVM_BENCH_BUDGET_S").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_BUDGET_S);
    let mut b = Bench {
        mode,
        rows: Vec::new(),
        failed: 0,
        other_errors: Vec::new(),
        notes: Vec::new(),
        meta: vec![
            ("mode".into(), mode.name().into()),
            ("commit".into(), std::env::var("UVM_COMMIT").unwrap_or_else(|_| "(UVM_COMMIT not set)".into())),
        ],
        info: Vec::new(),
        start: t_all,
        budget: Duration::from_secs(budget),
        results,
        service_pid: 0,
    };
    let mut admin = match fresh() {
        Ok(c) => c,
        Err(e) => {
            b.other_errors.push(format!("cannot connect: {e}"));
            b.failed += 1;
            b.save();
            return 1;
        }
    };
    let server_version: String = admin.query_one("SHOW server_version", &[]).map(|r| r.get(0)).unwrap_or_default();
    let info: Vec<(String, String)> = match admin.query("SELECT property::text, value::text FROM uvm.device_info()", &[]) {
        Ok(rows) => rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
        Err(e) => {
            b.other_errors.push(format!("uvm.device_info(): {} (is the extension created?)", describe(&e)));
            b.failed += 1;
            b.save();
            return 1;
        }
    };
    let get = |k: &str| info.iter().find(|(p, _)| p == k).map(|(_, v)| v.clone()).unwrap_or_else(|| "unknown".into());
    let (provider, execution) = (get("provider"), get("execution"));
    b.service_pid = get("service_pid").parse().unwrap_or(0);
    b.meta.extend([("server_version".to_string(), server_version), ("provider".into(), provider.clone())]);
    b.info = info.clone();
    if provider != "cuda" || execution != mode.name() {
        b.other_errors.push(format!(
            "the cluster runs provider {provider}, execution {execution}; this run is for provider cuda, execution {}: nothing measured",
            mode.name()
        ));
        b.failed += 1;
        b.save();
        return 1;
    }
    b.save();

    type Step<'a> = (&'a str, Box<dyn FnMut(&mut Bench, &mut Client) + 'a>);
    let small = format!("gpu_bench_small_{pid}");
    let small_want = fill_checksum(SMALL_SEED as u64, FIRST_CALL_BYTES as u64) as i64;
    let steps: Vec<Step> = vec![
        ("contexts", Box::new(bench_contexts)),
        (
            "first GPU call, round trips, 64 sessions",
            Box::new(|b: &mut Bench, admin: &mut Client| {
                let made =
                    create(admin, &small, SMALL_BYTES, "device").and_then(|_| fill(admin, &small, SMALL_BYTES, SMALL_SEED));
                match made {
                    Ok(()) => {
                        bench_first_call(b, &small, small_want);
                        b.save();
                        bench_roundtrips(b);
                        b.save();
                        bench_sessions_memory(b, admin, &small, small_want);
                    }
                    Err(e) => {
                        b.error(K_FIRST, M_FIRST, e.clone());
                        b.error(K_MEM64, M_MEM64, e);
                        bench_roundtrips(b);
                    }
                }
                drop_if_exists(admin, &small);
            }),
        ),
        ("GpuJoin", Box::new(|b: &mut Bench, admin: &mut Client| bench_gpujoin(b, admin, pid, keep_tables))),
        ("GpuJoin planner sweep", Box::new(|b: &mut Bench, _admin: &mut Client| bench_gpujoin_planner(b))),
        ("GpuJoin two keys", Box::new(|b: &mut Bench, _admin: &mut Client| bench_gpujoin_two_keys(b))),
        ("segment read", Box::new(|b: &mut Bench, admin: &mut Client| bench_segment_read(b, admin, pid))),
        ("migration", Box::new(|b: &mut Bench, admin: &mut Client| bench_migration(b, admin, pid))),
        ("several GPUs", Box::new(|b: &mut Bench, admin: &mut Client| bench_gpus(b, admin, pid))),
        ("64 GiB attach", Box::new(|b: &mut Bench, admin: &mut Client| bench_attach_big(b, admin, pid))),
        ("host tier", Box::new(|b: &mut Bench, admin: &mut Client| bench_host_tier(b, admin, pid))),
        ("column cache", Box::new(|b: &mut Bench, admin: &mut Client| bench_cache(b, admin, pid))),
        ("cache inserts", Box::new(|b: &mut Bench, admin: &mut Client| bench_cache_inserts(b, admin, pid))),
        ("cached join", Box::new(|b: &mut Bench, admin: &mut Client| bench_cache_join(b, admin))),
        ("GpuGroupAgg planner sweep", Box::new(|b: &mut Bench, _admin: &mut Client| bench_groupagg_planner(b))),
    ];
    // GPU_SUITE_BENCH_STEPS="GpuJoin,migration" runs only the steps whose names contain one of
    // the words (a run spent on one figure), "=GpuJoin" the step of that name alone; the others
    // are left out of the report.
    let only: Option<Vec<String>> = std::env::var("GPU_SUITE_BENCH_STEPS")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map(|v| v.split(',').map(|w| w.trim().to_string()).collect());
    for (what, mut step) in steps {
        let picked = |w: &String| w.strip_prefix('=').map_or_else(|| what.contains(w.as_str()), |exact| what == exact);
        if only.as_ref().is_some_and(|o| !o.iter().any(picked)) {
            b.note(format!("step \"{what}\" left out (GPU_SUITE_BENCH_STEPS)"));
            continue;
        }
        eprintln!("uvm_gpu_bench [{}]: {what} ... ({:.0} s)", mode.name(), t_all.elapsed().as_secs_f64());
        step(&mut b, &mut admin);
        b.save();
    }
    // device_info at the end: the last migration's breakdown, memory as the executor sees it.
    match admin.query("SELECT property::text, value::text FROM uvm.device_info()", &[]) {
        Ok(rows) => b.info = rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
        Err(e) => b.other_errors.push(format!("uvm.device_info() at the end: {}", describe(&e))),
    }
    b.save();
    eprintln!("uvm_gpu_bench [{}]: done in {:.0} s, {} failed", mode.name(), t_all.elapsed().as_secs_f64(), b.failed);
    i32::from(b.failed > 0)
}

fn usage() -> ! {
    eprintln!(
        "usage: uvm_gpu_bench measure process|service RESULTS [--keep-tables]\n       \
         uvm_gpu_bench report OUTFILE process=RESULTS service=RESULTS\n(run through scripts/gpu-suite run)"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("measure") if (3..=4).contains(&args.len()) => {
            let mode = Mode::parse(&args[1]).unwrap_or_else(|| usage());
            let keep = match args.get(3).map(String::as_str) {
                None => false,
                Some("--keep-tables") => true,
                Some(_) => usage(),
            };
            measure(mode, args[2].clone(), keep)
        }
        Some("report") if args.len() >= 2 => report(&args[1], &args[2..]),
        _ => usage(),
    };
    std::process::exit(code)
}
