//! Shared helpers for pg_uvm_share's integration tests and benchmark.
//! This file holds connections, processes, names, errors and the SQL API's wrappers; the checksum
//! copy, GPU helpers, GpuJoin fixtures, cancellation and execution-mode helpers have a module
//! each, re-exported here so that tests `use pg_uvm_share_tests::*`.
//!
//! Everything here talks to a live cluster started by `scripts/cluster.sh` (see `make integration`),
//! found through the environment it exports: `PGHOST` (the socket directory), `PGPORT`, `PGUSER`,
//! `PGDATABASE` and `UVM_PGDATA` (the data directory, for `postmaster.pid`). A missing variable is
//! a hard failure, never a skip.

use std::fs;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use postgres::{Client, NoTls};

mod cancel;
mod checksum;
mod execution;
mod gpu;
mod gpujoin;
pub use cancel::*;
pub use checksum::*;
pub use execution::*;
pub use gpu::*;
pub use gpujoin::*;

/// The backend_type the broker background worker shows in pg_stat_activity.
pub const BROKER_BACKEND_TYPE: &str = "pg_uvm_share broker";

/// SQL that forces parallel plans on every supported version: the setting is `force_parallel_mode`
/// on PostgreSQL 14 and 15, `debug_parallel_query` from 16 on (for `batch_execute`).
pub const FORCE_PARALLEL_SQL: &str =
    "SELECT set_config(name, 'on', false) FROM pg_settings WHERE name IN ('force_parallel_mode', 'debug_parallel_query');";

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;

/// A required environment variable; panics with a pointer to `make test` when it is missing.
pub fn env_var(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "environment variable {name} is not set: these tests need a running cluster; \
             run through `make test` (or `make integration`)"
        ),
    }
}

fn config_for(user: &str) -> postgres::Config {
    config_at(&env_var("PGHOST"), &env_var("PGPORT"), user)
}

fn config_at(host: &str, port: &str, user: &str) -> postgres::Config {
    let port: u16 = port.parse().unwrap_or_else(|_| panic!("{port:?} is not a port number; run through `make test`"));
    let dbname = std::env::var("PGDATABASE").unwrap_or_else(|_| "postgres".to_string());
    let mut cfg = postgres::Config::new();
    if host.starts_with('/') {
        cfg.host_path(host);
    } else {
        cfg.host(host);
    }
    cfg.port(port).user(user).dbname(&dbname).application_name("pg_uvm_share_tests").connect_timeout(Duration::from_secs(10));
    if THROUGH_SERVICE.load(std::sync::atomic::Ordering::Relaxed) {
        cfg.options("-c pg_uvm_share.map_host_tier=off");
    }
    cfg
}

/// Set by [`route_through_service`]: sessions opened from now on by this test binary send every
/// request to the GPU service.
static THROUGH_SERVICE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every session this test binary opens from now on send every request to the GPU service
/// in service mode (`pg_uvm_share.map_host_tier = off`), host-tier bytes included: for the tests
/// of the service's own machinery (slots, cancels, abandoned requests, its crash), whose
/// segments are host-tier memfds in CI (the host provider): their requests would otherwise run
/// in the backends.
pub fn route_through_service() {
    THROUGH_SERVICE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether this session reads, writes, checksums and fills host-tier segments on its own
/// mapping: always in process mode; in service mode while `pg_uvm_share.map_host_tier` is on
/// (the default), under either provider (the host tier's chunks are memfds there).
pub fn maps_host_tier(c: &mut Client) -> bool {
    if execution(c) == Execution::Process {
        return true;
    }
    let on: String = c.query_one("SHOW pg_uvm_share.map_host_tier", &[]).expect("SHOW pg_uvm_share.map_host_tier").get(0);
    on == "on"
}

/// The operations on a segment's bytes, as `uvm.stat_service` names them.
pub const BYTE_OPS: &[&str] = &["read", "write", "checksum", "fill"];

/// Requests of `ops` that the GPU service completed (`uvm.stat_service`; 0 in process mode).
pub fn service_ops(c: &mut Client, ops: &[&str]) -> i64 {
    c.query_one("SELECT coalesce(sum(requests), 0)::bigint FROM uvm.stat_service WHERE operation = ANY($1)", &[&ops])
        .expect("uvm.stat_service")
        .get(0)
}

/// The process that maps a host-tier segment and pins it while it reads, writes, checksums or
/// fills it for the session `c` (whose backend is `backend`): the backend itself where it maps
/// the host tier ([`maps_host_tier`]), the GPU service otherwise.
pub fn host_tier_pid(c: &mut Client, backend: i32) -> i32 {
    if maps_host_tier(c) {
        backend
    } else {
        mapping_pid(c, backend)
    }
}

/// Connects as `PGUSER` (the cluster's superuser), or returns the error.
pub fn try_connect() -> Result<Client, postgres::Error> {
    config_for(&env_var("PGUSER")).connect(NoTls)
}

/// Connects as `PGUSER` (the cluster's superuser).
pub fn connect() -> Client {
    try_connect().unwrap_or_else(|e| panic!("cannot connect to the test cluster: {}", describe(&e)))
}

/// Connects as `PGUSER` to the integration suite's second cluster, which runs the same execution
/// mode with a simulated GPU (`pg_uvm_share.simulated_devices = 1`): a device tier of memfds, so
/// that migrations between tiers run without a GPU. `make integration` starts it and exports
/// `UVM_TIERS_PGHOST` and `UVM_TIERS_PGPORT`.
pub fn connect_tiers() -> Client {
    config_at(&env_var("UVM_TIERS_PGHOST"), &env_var("UVM_TIERS_PGPORT"), &env_var("PGUSER"))
        .connect(NoTls)
        .unwrap_or_else(|e| panic!("cannot connect to the simulated-GPU cluster: {}", describe(&e)))
}

/// How the readers of [`migrations_under_readers`] read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readers {
    /// Each checksums the segment, then pauses 50 ms (the held-out shape of issue 25).
    Pausing,
    /// Each takes a session pin (`uvm.pin_segment`), checksums, and lets go only once another
    /// reader holds a pin too (or after 100 ms): the pins overlap, so that the segment is never
    /// free unless a waiting migration holds new pins back.
    HandingOver,
}

/// Migrations under readers (issue 25, point 2): `readers` sessions checksum a segment of `size`
/// bytes in a loop while one session moves it host <-> device `moves` times. Every migration
/// must succeed (no 55P03: a waiting migration is not overtaken by new pins) and every checksum
/// must be right. `connect` opens a session on the cluster under test. Returns the checksums
/// the readers took, per reader.
pub fn migrations_under_readers(connect: fn() -> Client, size: i64, readers: usize, how: Readers, moves: usize) -> Vec<usize> {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let name = unique_name("starve");
    let mut m = connect();
    create_segment_tier(&mut m, &name, size, None, "host");
    fill_segment(&mut m, &name, 0, size, 25);
    let want = checksum_segment(&mut m, &name, 0, size);
    let stop = Arc::new(AtomicBool::new(false));
    let holding = Arc::new(AtomicU32::new(0));
    let threads: Vec<_> = (0..readers)
        .map(|_| {
            let (stop, holding, name) = (stop.clone(), holding.clone(), name.clone());
            std::thread::spawn(move || {
                let mut c = connect();
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    if how == Readers::HandingOver {
                        c.execute("SELECT uvm.pin_segment($1)", &[&name])
                            .unwrap_or_else(|e| panic!("pin_segment: {}", describe(&e)));
                        holding.fetch_add(1, Ordering::SeqCst);
                    }
                    match c.query_one("SELECT uvm.checksum_segment($1, 0, $2)::bigint", &[&name, &size]) {
                        Ok(r) => assert_eq!(r.get::<_, i64>(0), want, "a reader's checksum"),
                        Err(e) => panic!("a reader's checksum failed: {}", describe(&e)),
                    }
                    n += 1;
                    if how == Readers::HandingOver {
                        let t = Instant::now();
                        while holding.load(Ordering::SeqCst) < 2 && t.elapsed() < Duration::from_millis(100) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        holding.fetch_sub(1, Ordering::SeqCst);
                        c.execute("SELECT uvm.unpin_segment($1)", &[&name])
                            .unwrap_or_else(|e| panic!("unpin_segment: {}", describe(&e)));
                        std::thread::sleep(Duration::from_millis(5));
                    } else {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut failed = Vec::new();
    for i in 0..moves {
        // To the other tier (a failed move leaves the segment where it was).
        let (tier, want_tiers) = if tier_bytes(&mut m, &name).0 == 0 { ("device", (size, 0)) } else { ("host", (0, size)) };
        let t = Instant::now();
        match m.query_one("SELECT uvm.prefetch_segment($1, 0, $2, $3)::bigint", &[&name, &size, &tier]) {
            Ok(r) => {
                assert_eq!(r.get::<_, i64>(0), size, "move {i} to {tier}");
                assert_eq!(tier_bytes(&mut m, &name), want_tiers, "(device, host) bytes after move {i} to {tier}");
            }
            Err(e) => failed.push(format!("move {i} to {tier}: {}", describe(&e))),
        }
        eprintln!("migrations_under_readers ({how:?}): move {i} to {tier} took {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    }
    stop.store(true, Ordering::SeqCst);
    let counts: Vec<usize> = threads.into_iter().map(|t| t.join().expect("a reader panicked")).collect();
    assert!(failed.is_empty(), "{} of {moves} migrations failed under {readers} readers: {failed:?}", failed.len());
    assert_eq!(checksum_segment(&mut m, &name, 0, size), want, "the checksum after every move");
    // uvm.stat_segments counted every move and its bytes.
    let r = m
        .query_one("SELECT migrations, bytes_migrated FROM uvm.stat_segments WHERE name = $1", &[&name])
        .unwrap_or_else(|e| panic!("uvm.stat_segments: {}", describe(&e)));
    assert_eq!((r.get::<_, i64>(0), r.get::<_, i64>(1)), (moves as i64, moves as i64 * size), "(migrations, bytes_migrated)");
    drop_segment(&mut m, &name);
    counts
}

/// Connects as another role (trust authentication).
pub fn connect_as(user: &str) -> Client {
    config_for(user).connect(NoTls).unwrap_or_else(|e| panic!("cannot connect to the test cluster as {user}: {}", describe(&e)))
}

/// Connects, retrying until `timeout` (the server may be crash-restarting or in recovery).
pub fn connect_retry(timeout: Duration) -> Client {
    let start = Instant::now();
    loop {
        match try_connect() {
            Ok(mut c) => {
                // A connection can be accepted just before the postmaster kills everyone
                // (crash in progress); make sure it answers.
                if c.simple_query("SELECT 1").is_ok() {
                    return c;
                }
            }
            Err(e) => {
                if start.elapsed() > timeout {
                    panic!("could not reconnect within {timeout:?}: {}", describe(&e));
                }
            }
        }
        if start.elapsed() > timeout {
            panic!("could not reconnect within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The broker's pid from pg_stat_activity, if it is running.
pub fn broker_pid(client: &mut Client) -> Option<i32> {
    client
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = $1 ORDER BY backend_start DESC LIMIT 1",
            &[&BROKER_BACKEND_TYPE],
        )
        .expect("query pg_stat_activity for the broker")
        .map(|r| r.get::<_, i32>(0))
}

/// Waits (up to `timeout`) for the broker to show up and returns its pid.
pub fn wait_broker(client: &mut Client, timeout: Duration) -> i32 {
    let mut pid = None;
    wait_until(timeout, || {
        pid = broker_pid(client);
        pid.is_some()
    });
    pid.unwrap_or_else(|| panic!("no '{BROKER_BACKEND_TYPE}' in pg_stat_activity within {timeout:?}"))
}

/// The backend pid of a connection.
pub fn backend_pid(client: &mut Client) -> i32 {
    client.query_one("SELECT pg_backend_pid()", &[]).expect("pg_backend_pid()").get(0)
}

/// The postmaster's pid: first line of `$UVM_PGDATA/postmaster.pid`.
pub fn postmaster_pid() -> i32 {
    let path = format!("{}/postmaster.pid", env_var("UVM_PGDATA"));
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    text.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("{path} does not start with a pid"))
}

/// Whether a process exists (and is not a zombie).
pub fn process_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // state is the field after the parenthesised command name
            let state = stat.rsplit(')').next().and_then(|s| s.split_whitespace().next());
            state != Some("Z") && state != Some("X")
        }
        Err(_) => false,
    }
}

fn fd_targets(pid: i32) -> Vec<String> {
    let dir = format!("/proc/{pid}/fd");
    let entries = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {dir}: {e} (the tests must run as root or as the cluster's owner)"));
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| fs::read_link(e.path()).ok())
        .map(|t| t.to_string_lossy().into_owned())
        .collect()
}

/// Number of open file descriptors of a process.
pub fn fd_count(pid: i32) -> usize {
    fd_targets(pid).len()
}

/// Number of open file descriptors of a process that are memfds (`/memfd:name (deleted)`).
pub fn memfd_count(pid: i32) -> usize {
    fd_targets(pid).iter().filter(|t| t.starts_with("/memfd:")).count()
}

/// A readable listing of a process's fds, for assertion messages.
pub fn fd_listing(pid: i32) -> String {
    let mut t = fd_targets(pid);
    t.sort();
    t.join("\n  ")
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes; returns its last value.
/// `uvm.device_info()` as (property, value) pairs; panics with the server's message.
pub fn device_info(c: &mut postgres::Client) -> Vec<(String, String)> {
    c.query("SELECT property::text, value::text FROM uvm.device_info()", &[])
        .unwrap_or_else(|e| panic!("uvm.device_info(): {} (is the extension created?)", describe(&e)))
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// SIGKILLs backend `pid` — the postmaster answers with a crash-restart of the whole cluster —
/// and waits until the broker of before the crash is gone.
pub fn kill_backend_for_crash_restart(pid: i32, broker_before: i32) {
    // SAFETY: kill(2) on a pid of the test's own cluster.
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill({pid}, SIGKILL): {}", std::io::Error::last_os_error());
    assert!(
        wait_until(Duration::from_secs(30), || !process_alive(broker_before)),
        "the old broker {broker_before} is still running after the crash"
    );
}

/// The median of some measurements (NaN for none).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

static NAME_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A segment (or role, table) name unique to this process and call: `it_<tag>_<pid>_<n>`.
pub fn unique_name(tag: &str) -> String {
    let n = NAME_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("it_{tag}_{}_{n}", std::process::id())
}

/// SQL string literal.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A database error with its SQLSTATE, message, detail and hint (`Display` says only "db error").
pub fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => {
            let mut s = format!("{} {}: {}", d.severity(), d.code().code(), d.message());
            if let Some(x) = d.detail() {
                s.push_str(&format!(" DETAIL: {x}"));
            }
            if let Some(x) = d.hint() {
                s.push_str(&format!(" HINT: {x}"));
            }
            s
        }
        None => format!("{e:?}"),
    }
}

/// The SQLSTATE of a database error, if it is one.
pub fn sqlstate(e: &postgres::Error) -> Option<String> {
    e.code().map(|c| c.code().to_string())
}

/// Asserts that `r` failed with SQLSTATE `code`.
#[track_caller]
pub fn expect_sqlstate<T: std::fmt::Debug>(r: Result<T, postgres::Error>, code: &str, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected SQLSTATE {code}, but it succeeded ({v:?})"),
        Err(e) => {
            let got = sqlstate(&e);
            assert_eq!(got.as_deref(), Some(code), "{what}: expected SQLSTATE {code}, got {got:?}: {}", describe(&e));
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift64*), different for each seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Index of the first differing byte, for readable failures on large buffers.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b.iter()).position(|(x, y)| x != y).or_else(
        || {
            if a.len() == b.len() {
                None
            } else {
                Some(a.len().min(b.len()))
            }
        },
    )
}

#[track_caller]
pub fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = first_difference(got, want) {
        panic!(
            "{what}: data differs at byte {i} (got {} bytes, want {} bytes; got {:?}, want {:?})",
            got.len(),
            want.len(),
            got.get(i),
            want.get(i)
        );
    }
}

// --- thin wrappers over the SQL API ------------------------------------------------------------

/// `uvm.create_segment(name, size)`, returns the id.
pub fn create_segment(c: &mut Client, name: &str, size: i64) -> i64 {
    c.query_one("SELECT uvm.create_segment($1, $2)::bigint", &[&name, &size])
        .unwrap_or_else(|e| panic!("create_segment({name}, {size}): {}", describe(&e)))
        .get(0)
}

/// `uvm.create_segment(name, size, max_size)`, returns the id.
pub fn create_segment_max(c: &mut Client, name: &str, size: i64, max_size: i64) -> i64 {
    c.query_one("SELECT uvm.create_segment($1, $2, $3)::bigint", &[&name, &size, &max_size])
        .unwrap_or_else(|e| panic!("create_segment({name}, {size}, {max_size}): {}", describe(&e)))
        .get(0)
}

pub fn write_segment(c: &mut Client, name: &str, offset: i64, data: &[u8]) -> i64 {
    c.query_one("SELECT uvm.write_segment($1, $2, $3)::bigint", &[&name, &offset, &data])
        .unwrap_or_else(|e| panic!("write_segment({name}, {offset}, {} bytes): {}", data.len(), describe(&e)))
        .get(0)
}

pub fn read_segment(c: &mut Client, name: &str, offset: i64, len: i32) -> Vec<u8> {
    c.query_one("SELECT uvm.read_segment($1, $2, $3)", &[&name, &offset, &len])
        .unwrap_or_else(|e| panic!("read_segment({name}, {offset}, {len}): {}", describe(&e)))
        .get(0)
}

pub fn checksum_segment(c: &mut Client, name: &str, offset: i64, len: i64) -> i64 {
    c.query_one("SELECT uvm.checksum_segment($1, $2, $3)::bigint", &[&name, &offset, &len])
        .unwrap_or_else(|e| panic!("checksum_segment({name}, {offset}, {len}): {}", describe(&e)))
        .get(0)
}

pub fn try_drop_segment(c: &mut Client, name: &str) -> Result<(), postgres::Error> {
    c.execute("SELECT uvm.drop_segment($1)", &[&name]).map(|_| ())
}

pub fn drop_segment(c: &mut Client, name: &str) {
    try_drop_segment(c, name).unwrap_or_else(|e| panic!("drop_segment({name}): {}", describe(&e)));
}

/// One row of uvm.segments, the columns the tests look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRow {
    pub id: i64,
    pub size: i64,
    pub max_size: Option<i64>,
    pub chunks: i64,
    pub generation: i64,
    pub attached_processes: i64,
}

pub fn segment_row(c: &mut Client, name: &str) -> Option<SegmentRow> {
    c.query_opt(
        "SELECT id::bigint, size::bigint, max_size::bigint, chunks::bigint, generation::bigint, \
                attached_processes::bigint \
           FROM uvm.segments WHERE name = $1",
        &[&name],
    )
    .unwrap_or_else(|e| panic!("uvm.segments for {name}: {}", describe(&e)))
    .map(|r| SegmentRow {
        id: r.get(0),
        size: r.get(1),
        max_size: r.get(2),
        chunks: r.get(3),
        generation: r.get(4),
        attached_processes: r.get(5),
    })
}

/// The state and rows of a table's live cache (`uvm.caches`), if it has one. A rebuild retires
/// the old cache, which the view lists as dropping until its segment is gone, beside the new one
/// building: that row is left out.
pub fn cache_state(c: &mut Client, table: &str) -> Option<(String, i64)> {
    c.query_opt("SELECT state, rows FROM uvm.caches WHERE relation = $1::text::regclass AND state <> 'dropping'", &[&table])
        .unwrap_or_else(|e| panic!("uvm.caches for {table}: {}", describe(&e)))
        .map(|r| (r.get(0), r.get(1)))
}

/// Drops segments on scope exit (best effort, through a fresh connection), so a failing
/// assertion does not leave segments behind for the following tests.
pub struct SegmentGuard {
    names: Vec<String>,
}

impl SegmentGuard {
    pub fn new() -> Self {
        SegmentGuard { names: Vec::new() }
    }
    pub fn with(names: &[&str]) -> Self {
        SegmentGuard { names: names.iter().map(|s| s.to_string()).collect() }
    }
    pub fn add(&mut self, name: &str) {
        self.names.push(name.to_string());
    }
    /// Forget a name (the test dropped it itself).
    pub fn forget(&mut self, name: &str) {
        self.names.retain(|n| n != name);
    }
}

impl Default for SegmentGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SegmentGuard {
    fn drop(&mut self) {
        if self.names.is_empty() {
            return;
        }
        // Never panic here (this runs during unwinding): no environment, no cleanup.
        if std::env::var_os("PGHOST").is_none() || std::env::var_os("PGUSER").is_none() {
            return;
        }
        if let Ok(mut c) = try_connect() {
            for n in &self.names {
                // Unknown (already dropped) is fine; anything else is only reported.
                let _ = c.execute("SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name = $1", &[n]);
            }
        }
    }
}
