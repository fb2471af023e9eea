//! Shared helpers for pg_uvm_share's integration tests and benchmark.
//!
//! Everything here talks to a live cluster started by `scripts/cluster.sh` (see `make integration`),
//! found through the environment it exports: `PGHOST` (the socket directory), `PGPORT`, `PGUSER`,
//! `PGDATABASE` and `UVM_PGDATA` (the data directory, for `postmaster.pid`). A missing variable is
//! a hard failure, never a skip.

use std::fs;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use postgres::{Client, NoTls};

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

// --- checksum and fill pattern: an independent copy of crates/uvm_core/src/checksum.rs ---------------------------
//
// The GPU tests compare what the extension's kernels compute with these. They are copied, not
// imported, on purpose: the test crate does not link the extension, and a change to one side
// that is not made to the other must fail the GPU suite.
//
//   checksum = Σ mix(w[i] ^ (i * GOLDEN))  (wrapping), w[i] the little-endian 64-bit word at
//              byte 8i of the range (the last one zero-padded), i counted from the range start
//   fill     = byte j of a range is byte (j % 8) of mix(seed + j / 8)

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finalizer.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Checksum of `bytes` as a range of its own (word index from 0), what
/// `uvm.checksum_segment(name, offset, length)` returns (as `u64`) for the same bytes.
pub fn checksum(bytes: &[u8]) -> u64 {
    checksum_from(bytes, 0)
}

/// Checksum of `bytes` whose first word has index `first_word`: for a piece at byte offset `o`
/// (a multiple of 8) of a larger range, `first_word = o / 8`, and the pieces' values add up
/// (wrapping) to the checksum of the whole range.
pub fn checksum_from(bytes: &[u8], first_word: u64) -> u64 {
    let mut sum = 0u64;
    let mut words = bytes.chunks_exact(8);
    let mut i = first_word;
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().unwrap());
        sum = sum.wrapping_add(mix(w ^ i.wrapping_mul(GOLDEN)));
        i = i.wrapping_add(1);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        sum = sum.wrapping_add(mix(u64::from_le_bytes(w) ^ i.wrapping_mul(GOLDEN)));
    }
    sum
}

/// The fill pattern of `uvm.fill_segment(name, offset, length, seed)` over `bytes`.
pub fn fill(bytes: &mut [u8], seed: u64) {
    let mut words = bytes.chunks_exact_mut(8);
    let mut i = 0u64;
    for w in &mut words {
        w.copy_from_slice(&mix(seed.wrapping_add(i)).to_le_bytes());
        i += 1;
    }
    let rest = words.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&mix(seed.wrapping_add(i)).to_le_bytes()[..n]);
}

/// Bytes `[at, at + len)` of a range filled with `seed` (from the range's start); `at` need not
/// be a multiple of 8. Because the pattern of a piece at byte `o` (a multiple of 8) is the fill
/// of seed `seed + o / 8`, this never materialises the bytes before `at`.
pub fn fill_range(seed: u64, at: u64, len: usize) -> Vec<u8> {
    let skew = (at % 8) as usize;
    let mut v = vec![0u8; len + skew];
    fill(&mut v, seed.wrapping_add(at / 8));
    v.drain(..skew);
    v
}

/// Checksum (word index from 0) of a range of `len` bytes filled with `seed`, computed in pieces
/// of 64 MiB so that multi-GiB ranges need little memory.
pub fn fill_checksum(seed: u64, len: u64) -> u64 {
    const PIECE: u64 = 64 << 20; // a multiple of 8
    let mut buf = vec![0u8; PIECE.min(len) as usize];
    let mut sum = 0u64;
    let mut at = 0u64;
    while at < len {
        let n = PIECE.min(len - at) as usize;
        let piece = &mut buf[..n];
        fill(piece, seed.wrapping_add(at / 8));
        sum = sum.wrapping_add(checksum_from(piece, at / 8));
        at += n as u64;
    }
    sum
}

// --- GPU helpers -----------------------------------------------------------------------------------

/// Device memory in use on GPU 0, in MiB, as `nvidia-smi` reports it (all processes).
pub fn gpu_memory_used_mib() -> u64 {
    try_gpu_memory_used_mib().unwrap_or_else(|e| panic!("{e}"))
}

/// `gpu_memory_used_mib`, or why nvidia-smi could not tell.
pub fn try_gpu_memory_used_mib() -> Result<u64, String> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output()
        .map_err(|e| format!("cannot run nvidia-smi: {e}"))?;
    if !out.status.success() {
        return Err(format!("nvidia-smi --query-gpu=memory.used failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().and_then(|l| l.trim().parse().ok()).ok_or_else(|| format!("unexpected nvidia-smi output: {text:?}"))
}

/// Device memory (MiB) that `nvidia-smi` attributes to process `pid`, if it lists it (it does
/// not when the process runs in another pid namespace than nvidia-smi sees).
pub fn gpu_process_memory_mib(pid: i32) -> Option<u64> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut it = l.split(',').map(str::trim);
        let p: i32 = it.next()?.parse().ok()?;
        let m: u64 = it.next()?.parse().ok()?;
        (p == pid).then_some(m)
    })
}

/// Every process `nvidia-smi` lists as using GPU memory, as (pid, MiB); the MiB is `None` where
/// nvidia-smi cannot tell (`[N/A]`). An empty list when no process uses the GPU.
pub fn gpu_compute_apps() -> Result<Vec<(i32, Option<u64>)>, String> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
        .output()
        .map_err(|e| format!("cannot run nvidia-smi: {e}"))?;
    if !out.status.success() {
        return Err(format!("nvidia-smi --query-compute-apps failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split(',').map(str::trim);
            let pid: i32 = it.next()?.parse().ok()?;
            Some((pid, it.next().and_then(|m| m.parse().ok())))
        })
        .collect())
}

/// The CUDA driver and NVRTC libraries (`libcuda.so*`, `libnvrtc*`) process `pid` maps, read
/// from `/proc/<pid>/maps`: `Ok(None)` once the process is gone, an error when its maps cannot
/// be read (another user's process needs root).
pub fn cuda_libraries_mapped(pid: i32) -> Result<Option<Vec<String>>, String> {
    let Some(maps) = process_maps(pid)? else { return Ok(None) };
    let mut libs: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|path| {
            let file = path.rsplit('/').next().unwrap_or(path);
            file.starts_with("libcuda.so") || file.starts_with("libnvrtc")
        })
        .map(str::to_string)
        .collect();
    libs.sort();
    libs.dedup();
    Ok(Some(libs))
}

/// `/proc/<pid>/maps`: `Ok(None)` once the process is gone, an error when it cannot be read
/// (another user's process needs root).
pub fn process_maps(pid: i32) -> Result<Option<String>, String> {
    let maps = match fs::read_to_string(format!("/proc/{pid}/maps")) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => match read_maps_as_owner(pid)? {
            Some(m) => m,
            None => return Ok(None),
        },
        Err(e) => return Err(format!("cannot read /proc/{pid}/maps: {e}")),
    };
    if maps.is_empty() && !process_alive(pid) {
        return Ok(None); // exited between open and read
    }
    Ok(Some(maps))
}

/// `/proc/<pid>/maps` read as the process's owner, through `setpriv`: root without
/// CAP_SYS_PTRACE (a container's) may not read another user's maps, but may become that user.
fn read_maps_as_owner(pid: i32) -> Result<Option<String>, String> {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else { return Ok(None) };
    let id = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).and_then(|r| r.split_whitespace().next());
    let (Some(uid), Some(gid)) = (id("Uid:"), id("Gid:")) else {
        return Err(format!("/proc/{pid}/status has no Uid or Gid line"));
    };
    let out = std::process::Command::new("setpriv")
        .args(["--reuid", uid, "--regid", gid, "--clear-groups", "cat", &format!("/proc/{pid}/maps")])
        .output()
        .map_err(|e| format!("cannot read /proc/{pid}/maps (permission denied) nor run setpriv: {e}"))?;
    if out.status.success() {
        Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()))
    } else if !process_alive(pid) {
        Ok(None)
    } else {
        Err(format!(
            "cannot read /proc/{pid}/maps, neither as this user nor as uid {uid}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether a list from [`cuda_libraries_mapped`] holds the CUDA driver (libcuda).
pub fn maps_libcuda(libs: &[String]) -> bool {
    libs.iter().any(|p| p.rsplit('/').next().unwrap_or(p).starts_with("libcuda.so"))
}

/// The live children of process `parent` (every process of a cluster is a child of its
/// postmaster), from `/proc/*/stat`.
pub fn child_pids(parent: i32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|stat| {
                // state and ppid are the two fields after the parenthesised command name
                let mut rest = stat.rsplit(')').next().unwrap_or("").split_whitespace();
                let state = rest.next();
                let ppid = rest.next().and_then(|p| p.parse::<i32>().ok());
                ppid == Some(parent) && state != Some("Z") && state != Some("X")
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// `value` of `uvm.device_info()` for `property`, if the provider reports it.
pub fn device_info_value(c: &mut Client, property: &str) -> Option<String> {
    c.query_opt("SELECT value FROM uvm.device_info() WHERE property = $1", &[&property])
        .unwrap_or_else(|e| panic!("uvm.device_info(): {}", describe(&e)))
        .map(|r| r.get(0))
}

/// Asserts that the cluster runs the CUDA provider (`uvm.device_info()` property `provider`).
#[track_caller]
pub fn assert_cuda_provider(c: &mut Client) {
    let p = device_info_value(c, "provider");
    assert_eq!(p.as_deref(), Some("cuda"), "the GPU suite needs the CUDA provider (uvm.device_info() says provider = {p:?})");
}

/// `uvm.create_segment(name, size, max_size, tier)`, or the error.
pub fn try_create_segment_tier(
    c: &mut Client,
    name: &str,
    size: i64,
    max_size: Option<i64>,
    tier: &str,
) -> Result<i64, postgres::Error> {
    c.query_one("SELECT uvm.create_segment($1, $2, $3, $4)::bigint", &[&name, &size, &max_size, &tier]).map(|r| r.get(0))
}

/// `uvm.create_segment(name, size, max_size, tier)`, returns the id.
pub fn create_segment_tier(c: &mut Client, name: &str, size: i64, max_size: Option<i64>, tier: &str) -> i64 {
    try_create_segment_tier(c, name, size, max_size, tier)
        .unwrap_or_else(|e| panic!("create_segment({name}, {size}, {max_size:?}, {tier}): {}", describe(&e)))
}

/// `uvm.fill_segment(name, offset, length, seed)` (the GPU fill kernel with the CUDA provider).
pub fn fill_segment(c: &mut Client, name: &str, offset: i64, len: i64, seed: i64) -> i64 {
    c.query_one("SELECT uvm.fill_segment($1, $2, $3, $4)::bigint", &[&name, &offset, &len, &seed])
        .unwrap_or_else(|e| panic!("fill_segment({name}, {offset}, {len}, {seed}): {}", describe(&e)))
        .get(0)
}

/// `uvm.prefetch_segment(name, offset, length, tier)`, returns the bytes moved.
pub fn prefetch_segment(c: &mut Client, name: &str, offset: i64, len: i64, tier: &str) -> i64 {
    c.query_one("SELECT uvm.prefetch_segment($1, $2, $3, $4)::bigint", &[&name, &offset, &len, &tier])
        .unwrap_or_else(|e| panic!("prefetch_segment({name}, {offset}, {len}, {tier}): {}", describe(&e)))
        .get(0)
}

/// `(device_bytes, host_bytes)` of a segment from `uvm.segments`.
pub fn tier_bytes(c: &mut Client, name: &str) -> (i64, i64) {
    c.query_opt("SELECT device_bytes::bigint, host_bytes::bigint FROM uvm.segments WHERE name = $1", &[&name])
        .unwrap_or_else(|e| panic!("uvm.segments for {name}: {}", describe(&e)))
        .map(|r| (r.get(0), r.get(1)))
        .unwrap_or_else(|| panic!("segment {name} is not in uvm.segments"))
}

/// Reads `[offset, offset + len)` in `read_segment` calls of at most 64 MiB.
pub fn read_segment_all(c: &mut Client, name: &str, offset: i64, len: i64) -> Vec<u8> {
    const PIECE: i64 = 64 << 20;
    let mut out = Vec::with_capacity(len as usize);
    let mut at = 0;
    while at < len {
        let n = PIECE.min(len - at);
        out.extend_from_slice(&read_segment(c, name, offset + at, n as i32));
        at += n;
    }
    out
}

#[cfg(test)]
mod checksum_tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(checksum(&[]), 0);
        assert_eq!(checksum(&[0u8; 8]), 0);
        assert_eq!(checksum(&[1]), mix(1));
        assert_eq!(checksum_from(&1u64.to_le_bytes(), 1), mix(1 ^ GOLDEN));
    }

    #[test]
    fn pieces_add_up() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for split in [8usize, 800, 4096, 9992] {
            let a = checksum_from(&data[..split], 0);
            let b = checksum_from(&data[split..], (split / 8) as u64);
            assert_eq!(a.wrapping_add(b), checksum(&data), "split at {split}");
        }
    }

    #[test]
    fn fill_ranges() {
        let mut whole = vec![0u8; 1000];
        fill(&mut whole, 9);
        assert_eq!(&whole[..8], &mix(9).to_le_bytes());
        for (at, len) in [(0usize, 1000usize), (8, 100), (13, 500), (999, 1), (5, 0)] {
            assert_eq!(fill_range(9, at as u64, len), whole[at..at + len].to_vec(), "at {at} len {len}");
        }
        assert_eq!(fill_checksum(9, 1000), checksum(&whole));
        assert_eq!(fill_checksum(9, 0), 0);
    }

    #[test]
    fn fill_checksum_in_pieces() {
        // more than one 64 MiB piece, and a tail that is not a multiple of 8
        let len = (64 << 20) + 12_345;
        let mut v = vec![0u8; len];
        fill(&mut v, 7);
        assert_eq!(fill_checksum(7, len as u64), checksum(&v));
    }
}

// --- GpuJoin ----------------------------------------------------------------------------------

/// The text of `EXPLAIN (ANALYZE)` of `q`: the query runs, and the plan shows its workers.
pub fn try_explain_analyze(c: &mut Client, q: &str) -> Result<String, postgres::Error> {
    let rows = c.query(format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {q}").as_str(), &[])?;
    Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n"))
}

/// `try_explain_analyze`, panicking with the error.
pub fn explain_analyze(c: &mut Client, q: &str) -> String {
    try_explain_analyze(c, q).unwrap_or_else(|e| panic!("EXPLAIN ANALYZE {q}: {}", describe(&e)))
}

/// The `Workers Launched: N` counts of an `EXPLAIN ANALYZE` text.
pub fn workers_launched(plan: &str) -> Vec<i64> {
    plan.lines().filter_map(|l| l.trim().strip_prefix("Workers Launched:")).filter_map(|n| n.trim().parse().ok()).collect()
}

/// The outer tables `gpujoin_tables` makes, by suffix.
pub const GPUJOIN_OUTERS: [&str; 5] = ["uniform", "zipf", "all_miss", "all_hit", "nulls"];

/// The GpuJoin test fixture: the tables of `gpujoin_tables` under a unique prefix `p`, the
/// inner tables built from `{p}_dim` (`inner` with int8 keys, `inner4` with int4 keys), and a
/// name for a result buffer.
pub struct GpujoinFixture {
    pub p: String,
    pub dim: String,
    pub inner: String,
    pub inner4: String,
    pub result: String,
}

impl GpujoinFixture {
    /// Makes the tables (`dim_rows` inner keys, `fact_rows` rows per outer table) and builds both
    /// inner tables; the session is left planning parallel queries.
    pub fn new(c: &mut Client, tag: &str, dim_rows: i64, fact_rows: i64) -> GpujoinFixture {
        let p = unique_name(tag);
        gpujoin_tables(c, &p, dim_rows, fact_rows);
        let f = GpujoinFixture {
            dim: format!("{p}_dim"),
            inner: format!("{p}_ht"),
            inner4: format!("{p}_ht4"),
            result: format!("{p}_pairs"),
            p,
        };
        let builds = [
            (&f.inner, format!("SELECT k, v FROM {}", f.dim)),
            (&f.inner4, format!("SELECT k::int, v FROM {} WHERE k BETWEEN -2147483648 AND 2147483647 OR k IS NULL", f.dim)),
        ];
        for (seg, q) in builds {
            c.query_one("SELECT uvm.gpujoin_build($1, $2)", &[seg, &q])
                .unwrap_or_else(|e| panic!("gpujoin_build {seg}: {}", describe(&e)));
        }
        f
    }

    /// The outer table of `suffix` (one of `GPUJOIN_OUTERS`).
    pub fn outer(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.p)
    }

    /// The segments the fixture may have made (for a `SegmentGuard`).
    pub fn segments(&self) -> [&str; 3] {
        [&self.inner, &self.inner4, &self.result]
    }

    /// Drops the fixture's tables (its segments are the caller's, or a `SegmentGuard`'s).
    pub fn drop_tables(&self, c: &mut Client) {
        let p = &self.p;
        let _ = c
            .batch_execute(&format!("DROP TABLE IF EXISTS {p}_dim, {p}_uniform, {p}_zipf, {p}_all_miss, {p}_all_hit, {p}_nulls"));
    }
}

/// Makes the GpuJoin test tables `{p}_dim (k bigint, v bigint)`: `dim_rows` keys 1..=dim_rows,
/// a tenth of them three more times (duplicates), NULL keys, a NULL payload, the extreme keys;
/// and the outer tables `{p}_<suffix>` (one column `k bigint`) of `fact_rows` rows: uniform over
/// twice the keys, Zipf-distributed (key ~ 1/u), keys that all miss, keys that all hit, and a
/// third NULL. Deterministic (setseed). Also makes the session plan parallel queries.
fn gpujoin_tables(c: &mut Client, p: &str, dim_rows: i64, fact_rows: i64) {
    c.batch_execute(&format!(
        "SELECT setseed(0.42);
         DROP TABLE IF EXISTS {p}_dim, {p}_uniform, {p}_zipf, {p}_all_miss, {p}_all_hit, {p}_nulls;
         CREATE TABLE {p}_dim AS SELECT i::bigint AS k, (i * 7 % 100003)::bigint AS v FROM generate_series(1, {dim_rows}) i;
         INSERT INTO {p}_dim SELECT i, -i FROM generate_series(1, {dim_rows} / 10) i, generate_series(1, 3);
         INSERT INTO {p}_dim VALUES (NULL, 1), (NULL, 2), (9223372036854775807, 5), (-9223372036854775808, 6), (0, NULL);
         CREATE TABLE {p}_uniform AS SELECT (random() * 2 * {dim_rows})::bigint AS k FROM generate_series(1, {fact_rows});
         INSERT INTO {p}_uniform VALUES (9223372036854775807), (-9223372036854775808), (0), (NULL);
         CREATE TABLE {p}_zipf AS SELECT least((1.0 / (1e-7 + random()))::bigint, 2 * {dim_rows}) AS k FROM generate_series(1, {fact_rows});
         CREATE TABLE {p}_all_miss AS SELECT ({dim_rows} + 1 + i)::bigint AS k FROM generate_series(1, {fact_rows}) i;
         CREATE TABLE {p}_all_hit AS SELECT (1 + i % {dim_rows})::bigint AS k FROM generate_series(1, {fact_rows}) i;
         CREATE TABLE {p}_nulls AS SELECT CASE WHEN i % 3 = 0 THEN NULL ELSE (i % ({dim_rows} + {dim_rows} / 4))::bigint END AS k
           FROM generate_series(1, {fact_rows}) i;
         ANALYZE {p}_dim, {p}_uniform, {p}_zipf, {p}_all_miss, {p}_all_hit, {p}_nulls;
         SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
         SET max_parallel_workers_per_gather = 4;"
    ))
    .unwrap_or_else(|e| panic!("GpuJoin test tables: {}", describe(&e)));
}

/// What one materializing join did.
#[derive(Debug)]
pub struct Materialized {
    pub pairs: usize,
    pub workers: i64,
    /// The result buffer's size in bytes afterwards (it started at 64 + 16 * initial).
    pub buffer_bytes: i64,
    pub ms: f64,
}

/// A result buffer to create for `materialize_and_compare`.
#[derive(Clone, Copy, Debug)]
pub struct PairsBuffer<'a> {
    pub name: &'a str,
    /// Pairs it holds at first.
    pub initial: i64,
    /// Its tier preference: auto, device or host.
    pub tier: &'a str,
}

/// Runs `uvm.gpujoin_materialize(inner, result, key_expr)` over `outer` into a new result
/// buffer (`result`), under EXPLAIN ANALYZE (so the plan shows the workers), and checks
/// that the pairs it holds equal PostgreSQL's `outer JOIN dim` as a multiset (both sides sorted
/// and compared here, NULL payloads as 0). Panics on the first difference. Drops the buffer.
pub fn materialize_and_compare(
    c: &mut Client,
    inner: &str,
    buffer: PairsBuffer,
    outer: &str,
    dim: &str,
    key_expr: &str,
) -> Materialized {
    let result = buffer.name;
    let _ = c.execute("SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name = $1", &[&result]);
    c.query_one("SELECT uvm.gpujoin_pairs_create($1, $2, NULL, $3)", &[&result, &buffer.initial, &buffer.tier])
        .unwrap_or_else(|e| panic!("gpujoin_pairs_create: {}", describe(&e)));
    let q = format!(
        "SELECT (uvm.gpujoin_materialize({}, {}, {key_expr})).* FROM {outer}",
        quote_literal(inner),
        quote_literal(result)
    );
    let t = Instant::now();
    let plan = explain_analyze(c, &q);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let mut pairs = |q: &str| -> Vec<(i64, i64)> {
        c.query(q, &[&result]).unwrap_or_else(|e| panic!("{q}: {}", describe(&e))).iter().map(|r| (r.get(0), r.get(1))).collect()
    };
    let ours = pairs("SELECT key, payload FROM uvm.gpujoin_pairs($1) ORDER BY 1, 2");
    let theirs = pairs(&format!(
        "SELECT o.k::bigint, coalesce(d.v, 0) FROM {outer} o JOIN {dim} d ON o.k = d.k WHERE $1::text IS NOT NULL ORDER BY 1, 2"
    ));
    if ours != theirs {
        let at = ours.iter().zip(&theirs).position(|(a, b)| a != b).unwrap_or(ours.len().min(theirs.len()));
        panic!(
            "{outer}: materialized pairs differ from the join: {} vs {} pairs, first difference at {at}: {:?} vs {:?}",
            ours.len(),
            theirs.len(),
            ours.get(at),
            theirs.get(at)
        );
    }
    let buffer_bytes: i64 = c.query_one("SELECT size FROM uvm.segments WHERE name = $1", &[&result]).unwrap().get(0);
    c.execute("SELECT uvm.drop_segment($1)", &[&result]).unwrap();
    Materialized { pairs: ours.len(), workers: workers_launched(&plan).into_iter().sum(), buffer_bytes, ms }
}

/// Checks `uvm.gpujoin_probe(inner, key_expr)` over `outer` against PostgreSQL's join
/// (`count(*)`, `sum(payload)`); returns the matches.
pub fn probe_and_compare(c: &mut Client, inner: &str, outer: &str, dim: &str, key_expr: &str) -> i64 {
    let q = format!(
        "SELECT m.matches, m.payload_sum::text FROM (SELECT (uvm.gpujoin_probe({}, {key_expr})).* FROM {outer}) m",
        quote_literal(inner)
    );
    let ours = c.query_one(q.as_str(), &[]).unwrap_or_else(|e| panic!("{q}: {}", describe(&e)));
    let theirs = c
        .query_one(format!("SELECT count(*), sum(d.v)::text FROM {outer} o JOIN {dim} d ON o.k = d.k").as_str(), &[])
        .unwrap_or_else(|e| panic!("join: {}", describe(&e)));
    let (a, b): ((i64, Option<String>), (i64, Option<String>)) = ((ours.get(0), ours.get(1)), (theirs.get(0), theirs.get(1)));
    assert_eq!(a, b, "{outer}: gpujoin_probe vs PostgreSQL's join");
    a.0
}

// --- cancellation -------------------------------------------------------------------------------

/// How [`run_and_interrupt`] interrupts a statement.
#[derive(Debug, Clone, Copy)]
pub enum Interrupt {
    /// `pg_cancel_backend` from a second session, this long after the statement starts.
    Cancel(Duration),
    /// `statement_timeout` set to this for the statement (and reset after it).
    Timeout(Duration),
}

/// How a statement ended under [`run_and_interrupt`].
#[derive(Debug)]
pub struct Interrupted {
    pub how: Interrupt,
    /// The statement's outcome: an error (57014 when the interrupt worked), or `Ok` when it ended
    /// before the interrupt arrived (or ignored it).
    pub result: Result<(), postgres::Error>,
    /// From the interrupt (the cancel request sent, or the timeout expired) to the statement's
    /// return; zero when it returned first.
    pub after_interrupt: Duration,
    /// From the statement's start to its return.
    pub total: Duration,
}

impl Interrupted {
    /// The outcome, timings included, for assertion messages.
    pub fn describe(&self) -> String {
        let outcome = match &self.result {
            Ok(()) => "it completed".to_string(),
            Err(e) => describe(e),
        };
        format!(
            "{:?}: {outcome}, {} ms after the interrupt, {} ms in all",
            self.how,
            self.after_interrupt.as_millis(),
            self.total.as_millis()
        )
    }
}

/// Runs `sql` on `client` and interrupts it as `how` says, measuring how long it takes to give
/// up. With `Cancel`, a second connection sends `pg_cancel_backend` to `client`'s backend; the
/// clock for `after_interrupt` starts when the request has been sent.
pub fn run_and_interrupt(client: &mut Client, sql: &str, how: Interrupt) -> Interrupted {
    match how {
        Interrupt::Cancel(after) => {
            let pid = backend_pid(client);
            let mut other = connect();
            let start = Instant::now();
            let canceller = std::thread::spawn(move || {
                std::thread::sleep(after.saturating_sub(start.elapsed()));
                let sent: bool = other.query_one("SELECT pg_cancel_backend($1)", &[&pid]).expect("pg_cancel_backend").get(0);
                assert!(sent, "pg_cancel_backend({pid}) found no such backend");
                Instant::now()
            });
            let result = client.batch_execute(sql);
            let end = Instant::now();
            let sent_at = canceller.join().expect("the cancelling thread panicked");
            Interrupted { how, result, after_interrupt: end.saturating_duration_since(sent_at), total: end - start }
        }
        Interrupt::Timeout(t) => {
            client.batch_execute(&format!("SET statement_timeout = {}", t.as_millis().max(1))).expect("SET statement_timeout");
            let start = Instant::now();
            let result = client.batch_execute(sql);
            let total = start.elapsed();
            client.batch_execute("RESET statement_timeout").expect("RESET statement_timeout");
            Interrupted { how, result, after_interrupt: total.saturating_sub(t), total }
        }
    }
}

/// Asserts that `i` ended with SQLSTATE 57014 (query_canceled) at most `within` after the
/// interrupt.
#[track_caller]
pub fn assert_interrupted(what: &str, i: &Interrupted, within: Duration) {
    match &i.result {
        Err(e) if sqlstate(e).as_deref() == Some("57014") => {}
        _ => panic!("{what}: expected SQLSTATE 57014; {}", i.describe()),
    }
    assert!(i.after_interrupt <= within, "{what}: took longer than {within:?} to stop; {}", i.describe());
}

/// Pins held on segment `name` by any process (`uvm.attachments`).
pub fn pins_held(c: &mut Client, name: &str) -> i64 {
    c.query_one("SELECT coalesce(sum(pins), 0)::bigint FROM uvm.attachments WHERE segment = $1", &[&name])
        .unwrap_or_else(|e| panic!("uvm.attachments for {name}: {}", describe(&e)))
        .get(0)
}

// --- execution mode: each process, or the GPU service -------------------------------------------

/// The backend_type the GPU service shows in pg_stat_activity.
pub const SERVICE_BACKEND_TYPE: &str = "pg_uvm_share gpu service";

/// Where the cluster under test runs operations on segment memory
/// (`pg_uvm_share.gpu_execution`, shown by `uvm.device_info()` as `execution`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Execution {
    /// Every backend and parallel worker maps segments and runs its own work.
    Process,
    /// One background worker, the GPU service, maps segments and runs the work of everyone.
    Service,
}

/// The mode this run expects: `UVM_EXPECT_EXECUTION`, `process` or `service` (set by
/// `make integration` and `make integration-service`). Missing or anything else: a hard failure.
pub fn expected_execution() -> Execution {
    match env_var("UVM_EXPECT_EXECUTION").as_str() {
        "process" => Execution::Process,
        "service" => Execution::Service,
        other => panic!("UVM_EXPECT_EXECUTION must be 'process' or 'service', not {other:?}"),
    }
}

/// The cluster's execution mode, checked against [`expected_execution`]: a suite run against a
/// cluster of the other mode fails here instead of testing the wrong thing.
#[track_caller]
pub fn execution(c: &mut Client) -> Execution {
    let want = expected_execution();
    let got = device_info_value(c, "execution");
    let want_name = match want {
        Execution::Process => "process",
        Execution::Service => "service",
    };
    assert_eq!(got.as_deref(), Some(want_name), "uvm.device_info() execution (UVM_EXPECT_EXECUTION={want_name})");
    want
}

/// The GPU service's request counters (`uvm.device_info()`, row `service_requests`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceRequests {
    pub submitted: i64,
    pub completed: i64,
    pub abandoned: i64,
}

/// The service's request counters now ("N submitted, N completed, N abandoned"). Reading them
/// is itself a request in service mode (`device_info` asks the service for the provider's rows),
/// counted before the counters are read or after, depending on the moment: compare with slack.
pub fn service_requests(c: &mut Client) -> ServiceRequests {
    let v = device_info_value(c, "service_requests").expect("uvm.device_info() has no service_requests row");
    let n: Vec<i64> = v.split(',').filter_map(|p| p.split_whitespace().next()).filter_map(|x| x.parse().ok()).collect();
    assert_eq!(n.len(), 3, "service_requests {v:?}: want 'N submitted, N completed, N abandoned'");
    ServiceRequests { submitted: n[0], completed: n[1], abandoned: n[2] }
}

/// The GPU service's pid as `uvm.device_info()` reports it (0: none running).
pub fn service_pid(c: &mut Client) -> i32 {
    let v = device_info_value(c, "service_pid").expect("uvm.device_info() has no service_pid row");
    v.parse().unwrap_or_else(|_| panic!("service_pid {v:?} is not a pid"))
}

/// The GPU service's pid from pg_stat_activity, if it is running.
pub fn service_pid_in_activity(c: &mut Client) -> Option<i32> {
    c.query_opt(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = $1 ORDER BY backend_start DESC LIMIT 1",
        &[&SERVICE_BACKEND_TYPE],
    )
    .expect("query pg_stat_activity for the GPU service")
    .map(|r| r.get::<_, i32>(0))
}

/// The process that maps segments, and pins them while it works, for the requests of backend
/// `backend` that need the device or the service (the GpuJoin operations, device-tier bytes): the
/// backend itself in process mode, the GPU service in service mode. For host-tier bytes see
/// [`host_tier_pid`].
pub fn mapping_pid(c: &mut Client, backend: i32) -> i32 {
    match execution(c) {
        Execution::Process => backend,
        Execution::Service => {
            let pid = service_pid(c);
            assert!(pid > 0, "service mode, but uvm.device_info() shows no service_pid");
            pid
        }
    }
}

/// Pins held on segment `name` once an interrupted statement's work has stopped. In process
/// mode the work stopped before the statement returned: the pins are read at once. In service
/// mode the client returns at once and the service stops the abandoned work at its next
/// interrupt check (microseconds of CPU work later, a busy 2-core machine permitting): the
/// pins are given up to 5 s to go to zero, and how long they took is printed.
#[track_caller]
pub fn pins_after_interrupt(c: &mut Client, name: &str) -> i64 {
    if execution(c) == Execution::Process {
        return pins_held(c, name);
    }
    let t = Instant::now();
    let mut last = pins_held(c, name);
    wait_until(Duration::from_secs(5), || {
        last = pins_held(c, name);
        last == 0
    });
    eprintln!("service mode: the service's pins on {name} went to {last} in {} ms", t.elapsed().as_millis());
    last
}
