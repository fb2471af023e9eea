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
    let host = env_var("PGHOST");
    let port: u16 = env_var("PGPORT")
        .parse()
        .unwrap_or_else(|_| panic!("PGPORT is not a port number; run through `make test`"));
    let dbname = std::env::var("PGDATABASE").unwrap_or_else(|_| "postgres".to_string());
    let mut cfg = postgres::Config::new();
    if host.starts_with('/') {
        cfg.host_path(&host);
    } else {
        cfg.host(&host);
    }
    cfg.port(port)
        .user(user)
        .dbname(&dbname)
        .application_name("pg_uvm_share_tests")
        .connect_timeout(Duration::from_secs(10));
    cfg
}

/// Connects as `PGUSER` (the cluster's superuser), or returns the error.
pub fn try_connect() -> Result<Client, postgres::Error> {
    config_for(&env_var("PGUSER")).connect(NoTls)
}

/// Connects as `PGUSER` (the cluster's superuser).
pub fn connect() -> Client {
    try_connect().unwrap_or_else(|e| panic!("cannot connect to the test cluster: {}", describe(&e)))
}

/// Connects as another role (trust authentication).
pub fn connect_as(user: &str) -> Client {
    config_for(user).connect(NoTls).unwrap_or_else(|e| {
        panic!(
            "cannot connect to the test cluster as {user}: {}",
            describe(&e)
        )
    })
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
    pid.unwrap_or_else(|| {
        panic!("no '{BROKER_BACKEND_TYPE}' in pg_stat_activity within {timeout:?}")
    })
}

/// The backend pid of a connection.
pub fn backend_pid(client: &mut Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pg_backend_pid()")
        .get(0)
}

/// The postmaster's pid: first line of `$UVM_PGDATA/postmaster.pid`.
pub fn postmaster_pid() -> i32 {
    let path = format!("{}/postmaster.pid", env_var("UVM_PGDATA"));
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("{path} does not start with a pid"))
}

/// Whether a process exists (and is not a zombie).
pub fn process_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // state is the field after the parenthesised command name
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next());
            state != Some("Z") && state != Some("X")
        }
        Err(_) => false,
    }
}

fn fd_targets(pid: i32) -> Vec<String> {
    let dir = format!("/proc/{pid}/fd");
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!("cannot list {dir}: {e} (the tests must run as root or as the cluster's owner)")
    });
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
    fd_targets(pid)
        .iter()
        .filter(|t| t.starts_with("/memfd:"))
        .count()
}

/// A readable listing of a process's fds, for assertion messages.
pub fn fd_listing(pid: i32) -> String {
    let mut t = fd_targets(pid);
    t.sort();
    t.join("\n  ")
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes; returns its last value.
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
            assert_eq!(
                got.as_deref(),
                Some(code),
                "{what}: expected SQLSTATE {code}, got {got:?}: {}",
                describe(&e)
            );
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
    a.iter()
        .zip(b.iter())
        .position(|(x, y)| x != y)
        .or_else(|| {
            if a.len() == b.len() {
                None
            } else {
                Some(a.len().min(b.len()))
            }
        })
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
    c.query_one(
        "SELECT uvm.create_segment($1, $2, $3)::bigint",
        &[&name, &size, &max_size],
    )
    .unwrap_or_else(|e| {
        panic!(
            "create_segment({name}, {size}, {max_size}): {}",
            describe(&e)
        )
    })
    .get(0)
}

pub fn write_segment(c: &mut Client, name: &str, offset: i64, data: &[u8]) -> i64 {
    c.query_one(
        "SELECT uvm.write_segment($1, $2, $3)::bigint",
        &[&name, &offset, &data],
    )
    .unwrap_or_else(|e| {
        panic!(
            "write_segment({name}, {offset}, {} bytes): {}",
            data.len(),
            describe(&e)
        )
    })
    .get(0)
}

pub fn read_segment(c: &mut Client, name: &str, offset: i64, len: i32) -> Vec<u8> {
    c.query_one(
        "SELECT uvm.read_segment($1, $2, $3)",
        &[&name, &offset, &len],
    )
    .unwrap_or_else(|e| panic!("read_segment({name}, {offset}, {len}): {}", describe(&e)))
    .get(0)
}

pub fn checksum_segment(c: &mut Client, name: &str, offset: i64, len: i64) -> i64 {
    c.query_one(
        "SELECT uvm.checksum_segment($1, $2, $3)::bigint",
        &[&name, &offset, &len],
    )
    .unwrap_or_else(|e| {
        panic!(
            "checksum_segment({name}, {offset}, {len}): {}",
            describe(&e)
        )
    })
    .get(0)
}

pub fn try_drop_segment(c: &mut Client, name: &str) -> Result<(), postgres::Error> {
    c.execute("SELECT uvm.drop_segment($1)", &[&name])
        .map(|_| ())
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
        SegmentGuard {
            names: names.iter().map(|s| s.to_string()).collect(),
        }
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
                let _ = c.execute(
                    "SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name = $1",
                    &[n],
                );
            }
        }
    }
}
