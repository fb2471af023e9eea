//! Column caches under concurrent writers (issue 26, point 2): every answer a reader takes from
//! a cache equals the heap's under the same snapshot, at READ COMMITTED and REPEATABLE READ,
//! while writers insert, update and delete (a quarter of their transactions and some of their
//! subtransactions abort) and a rebuilder keeps building the cache again, by turns serially
//! (with a `numeric` column) and by the parallel scan with workers; the GpuJoin node's join of
//! the table with a cached dimension (reading both caches where they are current) equals
//! PostgreSQL's join under the same snapshot; a parallel build whose worker is terminated
//! leaves nothing behind; strings new to a text column's dictionary, inserted by several
//! writers at once, get one code each; and a build reached from a parallel operation is
//! refused. (`cache_corrupted.rs` holds the tests of overwritten cache segments.)

use pg_uvm_share_tests::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The reader's comparison: the cache's answer (or the heap's, where the cache is not current)
/// and the heap's, in one statement, so under one snapshot at READ COMMITTED too. `heap_fold`
/// is STABLE (it runs with the caller's snapshot) and turns cache use off.
const COMPARE: &str = "SELECT c.source, c.rows, c.non_null, c.sum::text, h.rows, h.non_null, h.sum::text \
                       FROM uvm.cache_fold($1::text::regclass, 'a') c, heap_fold($1::text::regclass, 'a') h";

struct Counts {
    cache: AtomicU64,
    heap: AtomicU64,
    rr_cache: AtomicU64,
}

/// The GpuJoin node's join of the table with its dimension (both cached: the node reads the
/// caches where they are current) and PostgreSQL's own join (`{table}_pg`, STABLE: the
/// caller's snapshot), in one statement.
fn join_compare(table: &str) -> String {
    format!(
        "SELECT count(*)::text || '/' || coalesce(sum(d.v)::text, '-'), {table}_pg() \
         FROM {table} f JOIN {table}_d d ON f.a = d.k"
    )
}

/// Compares the join (the node, over the caches where current) with PostgreSQL's join under one
/// snapshot; in a REPEATABLE READ transaction also says whether the node read the caches (an
/// EXPLAIN ANALYZE under the transaction's one snapshot).
fn compare_join(c: &mut postgres::Client, table: &str, rr: bool) -> bool {
    let row = c.query_one(join_compare(table).as_str(), &[]).unwrap_or_else(|e| panic!("join reader: {}", describe(&e)));
    let (mine, pg): (String, String) = (row.get(0), row.get(1));
    assert_eq!(mine, pg, "the GpuJoin node's answer differs from PostgreSQL's join under one snapshot (repeatable read: {rr})");
    rr && c
        .query(format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {}", join_compare(table)).as_str(), &[])
        .unwrap()
        .iter()
        .any(|r| r.get::<_, String>(0).contains("Read From: column caches"))
}

fn compare(c: &mut postgres::Client, table: &str, counts: &Counts, rr: bool) {
    let row = c.query_one(COMPARE, &[&table]).unwrap_or_else(|e| panic!("reader: {}", describe(&e)));
    let source: String = row.get(0);
    let mine: (i64, i64, Option<String>) = (row.get(1), row.get(2), row.get(3));
    let heap: (i64, i64, Option<String>) = (row.get(4), row.get(5), row.get(6));
    assert_eq!(mine, heap, "the {source}'s answer differs from the heap's under one snapshot (repeatable read: {rr})");
    match (source.as_str(), rr) {
        ("cache", false) => counts.cache.fetch_add(1, Ordering::Relaxed),
        ("cache", true) => counts.rr_cache.fetch_add(1, Ordering::Relaxed),
        _ => counts.heap.fetch_add(1, Ordering::Relaxed),
    };
}

/// The concurrency tests' tables: `table` (id, a, n) of 20000 rows, cached (a, n), and its
/// dimension `{table}_d` (k, v), cached and never written, for the GpuJoin node's readers
/// (issue 26, point 3); `heap_fold` (the fold with caches off, STABLE: the caller's snapshot)
/// and `{table}_pg()` (PostgreSQL's own join, likewise). Returns the rows the first build cached.
fn cached_table_and_dim(admin: &mut postgres::Client, table: &str) -> i64 {
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int8, a int4, n numeric(10, 2));
             INSERT INTO {table} SELECT g, g % 1000, g / 100.0 FROM generate_series(1, 20000) g;
             CREATE OR REPLACE FUNCTION heap_fold(rel regclass, col text)
               RETURNS TABLE (source text, rows bigint, non_null bigint, sum numeric)
               LANGUAGE sql STABLE SET pg_uvm_share.enable_cache = off
               AS $$ SELECT * FROM uvm.cache_fold(rel, col) $$;
             CREATE TABLE {table}_d AS SELECT g::int4 AS k, (g * 3)::int8 AS v FROM generate_series(-200, 700) g;
             CREATE FUNCTION {table}_pg() RETURNS text LANGUAGE sql STABLE
               SET pg_uvm_share.enable_gpujoin = off SET pg_uvm_share.enable_cache = off
               AS $$ SELECT count(*)::text || '/' || coalesce(sum(d.v)::text, '-') FROM {table} f JOIN {table}_d d ON f.a = d.k $$;"
        ))
        .unwrap();
    let built: i64 = admin.query_one("SELECT uvm.cache_table($1::text::regclass, ARRAY['a', 'n'])", &[&table]).unwrap().get(0);
    admin.query_one("SELECT uvm.cache_table($1::text::regclass)", &[&format!("{table}_d")]).unwrap();
    built
}

#[test]
fn cached_answers_equal_the_heap_under_concurrent_writers() {
    let table = unique_name("cache_conc");
    let mut admin = connect();
    let built = cached_table_and_dim(&mut admin, &table);
    assert_eq!(built, 20000);
    let join_cache = AtomicU64::new(0);
    let join_reads = AtomicU64::new(0);

    let stop = AtomicBool::new(false);
    let counts = Counts { cache: AtomicU64::new(0), heap: AtomicU64::new(0), rr_cache: AtomicU64::new(0) };
    let writes = AtomicU64::new(0);
    let builds = AtomicU64::new(0);
    let run_for = Duration::from_secs(8);
    // Phases of 400 ms: writers write in the even ones; the rebuilder builds once at the start
    // of each odd one, so that readers find the cache current for a while, then stale again.
    let t0 = Instant::now();
    let phase = move || t0.elapsed().as_millis() / 400;
    std::thread::scope(|s| {
        // Writers: small transactions of inserts, updates and deletes; every fourth aborts, and
        // some roll a savepoint back.
        for w in 0..2u64 {
            let (stop, writes, table) = (&stop, &writes, &table);
            s.spawn(move || {
                let mut c = connect();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if phase() % 2 == 1 {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    i += 1;
                    let k = (i * 7919 + w * 104729) % 20000;
                    let body = match i % 3 {
                        0 => format!("INSERT INTO {table} VALUES ({}, {}, 1.25)", 100000 + i * 2 + w, k % 1000),
                        1 => format!("UPDATE {table} SET a = a + 1, n = n + 0.5 WHERE id = {k}"),
                        _ => format!("DELETE FROM {table} WHERE id = {k}"),
                    };
                    let sub = if i.is_multiple_of(5) {
                        format!("SAVEPOINT s; UPDATE {table} SET a = -a WHERE id = {}; ROLLBACK TO SAVEPOINT s;", (k + 1) % 20000)
                    } else {
                        String::new()
                    };
                    let end = if i.is_multiple_of(4) { "ROLLBACK" } else { "COMMIT" };
                    c.batch_execute(&format!("BEGIN; {body}; {sub} {end};"))
                        .unwrap_or_else(|e| panic!("writer: {}", describe(&e)));
                    writes.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
        }
        // The rebuilder (it waits for the writers' locks).
        {
            let (stop, builds, table) = (&stop, &builds, &table);
            s.spawn(move || {
                let mut c = connect();
                // Workers for a table of any size: the parallel build every other time.
                c.batch_execute("SET min_parallel_table_scan_size = 0; SET max_parallel_maintenance_workers = 2").unwrap();
                let mut last = u128::MAX;
                while !stop.load(Ordering::Relaxed) {
                    let p = phase();
                    if p % 2 == 0 || p == last {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    last = p;
                    let columns = if p % 4 == 1 { "ARRAY['a', 'n']" } else { "ARRAY['a']" };
                    c.query_one(&format!("SELECT uvm.cache_table($1::text::regclass, {columns})"), &[table])
                        .unwrap_or_else(|e| panic!("rebuilder: {}", describe(&e)));
                    builds.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // Readers: one at READ COMMITTED, one in REPEATABLE READ transactions that compare
        // twice, a while apart, under their one snapshot.
        {
            let (stop, counts, table) = (&stop, &counts, &table);
            s.spawn(move || {
                let mut c = connect();
                while !stop.load(Ordering::Relaxed) {
                    compare(&mut c, table, counts, false);
                }
            });
        }
        {
            let (stop, counts, table) = (&stop, &counts, &table);
            s.spawn(move || {
                let mut c = connect();
                while !stop.load(Ordering::Relaxed) {
                    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
                    compare(&mut c, table, counts, true);
                    std::thread::sleep(Duration::from_millis(40));
                    compare(&mut c, table, counts, true);
                    c.batch_execute("COMMIT").unwrap();
                }
            });
        }
        // The GpuJoin node's readers: one at READ COMMITTED, one in REPEATABLE READ
        // transactions (which also count the node's reads of the caches).
        for rr in [false, true] {
            let (stop, table, join_cache, join_reads) = (&stop, &table, &join_cache, &join_reads);
            s.spawn(move || {
                let mut c = connect();
                c.batch_execute("SET pg_uvm_share.enable_gpujoin = on").unwrap();
                while !stop.load(Ordering::Relaxed) {
                    if rr {
                        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
                    }
                    let cached = compare_join(&mut c, table, rr);
                    if rr {
                        std::thread::sleep(Duration::from_millis(30));
                        compare_join(&mut c, table, rr);
                        c.batch_execute("COMMIT").unwrap();
                    }
                    join_reads.fetch_add(1, Ordering::Relaxed);
                    if cached {
                        join_cache.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        while t0.elapsed() < run_for {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let (jc, jr) = (join_cache.load(Ordering::Relaxed), join_reads.load(Ordering::Relaxed));
    eprintln!("cache: {jr} GpuJoin comparisons with PostgreSQL's join, {jc} repeatable read ones over the caches");
    assert!(jc > 0, "the GpuJoin node never read the caches");
    let (cache, heap, rr) =
        (counts.cache.load(Ordering::Relaxed), counts.heap.load(Ordering::Relaxed), counts.rr_cache.load(Ordering::Relaxed));
    eprintln!(
        "cache: {cache} read committed and {rr} repeatable read answers from the cache, {heap} from the heap; {} writes, {} builds",
        writes.load(Ordering::Relaxed),
        builds.load(Ordering::Relaxed)
    );
    // The test proves something only if both kinds of reader used the cache, and writes ran.
    assert!(cache > 0, "no READ COMMITTED answer came from the cache");
    assert!(rr > 0, "no REPEATABLE READ answer came from the cache");
    assert!(heap > 0, "no answer came from the heap: the writers never made the cache stale");
    assert!(writes.load(Ordering::Relaxed) > 20 && builds.load(Ordering::Relaxed) > 2);
    admin
        .batch_execute(&format!(
            "DROP TABLE {table}, {table}_d; DROP FUNCTION heap_fold(regclass, text); DROP FUNCTION {table}_pg();"
        ))
        .unwrap();
    assert_caches_reclaimed(&mut admin);
}

/// Inserts appended to a cache (issue 26, point 2): writers insert in small transactions (one
/// in 60 aborts, one in 45 rolls back a savepoint after inserting in it, one in five inserts
/// inside a savepoint it keeps) while readers at READ COMMITTED and in REPEATABLE READ
/// transactions compare the cache's fold and the GpuJoin node's join with the heap's under one
/// snapshot; a rebuilder rebuilds the cache whenever an abort made it stale. The test proves
/// something only if readers took appended rows from the cache (more rows than its blocks hold)
/// and a snapshot held across inserts kept its answer.
#[test]
fn appended_rows_are_read_per_snapshot_beside_writers() {
    let table = unique_name("cache_app");
    let mut admin = connect();
    cached_table_and_dim(&mut admin, &table);
    // The cache's fold, the heap's, and the rows the cache's blocks hold, under one snapshot
    // (of the live cache: while the rebuilder runs, the old one is listed as dropping beside it).
    let fold = "SELECT c.source, c.rows, c.non_null, c.sum::text, h.rows, h.non_null, h.sum::text, \
                (SELECT rows FROM uvm.caches WHERE relation = $1::text::regclass AND state <> 'dropping') \
                FROM uvm.cache_fold($1::text::regclass, 'a') c, heap_fold($1::text::regclass, 'a') h";
    let stop = AtomicBool::new(false);
    let (appended_reads, rr_held, inserts, rebuilds, join_cached) =
        (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for w in 0..3u64 {
            let (stop, inserts, table) = (&stop, &inserts, &table);
            s.spawn(move || {
                let mut c = connect();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let id = 1_000_000 + i * 3 + w;
                    let rows = format!("({id}, {}, 0.25), ({}, NULL, NULL)", (i * 31 + w) % 1000, id + 500_000_000);
                    let body = if i.is_multiple_of(45) {
                        format!("INSERT INTO {table} VALUES ({id}, 1, 1); SAVEPOINT s; INSERT INTO {table} VALUES {rows}; ROLLBACK TO SAVEPOINT s;")
                    } else if i.is_multiple_of(5) {
                        format!("SAVEPOINT s; INSERT INTO {table} VALUES {rows}; RELEASE SAVEPOINT s;")
                    } else {
                        format!("INSERT INTO {table} VALUES {rows};")
                    };
                    let end = if i.is_multiple_of(60) { "ROLLBACK" } else { "COMMIT" };
                    c.batch_execute(&format!("BEGIN; {body} {end};")).unwrap_or_else(|e| panic!("writer: {}", describe(&e)));
                    inserts.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(3));
                }
            });
        }
        {
            let (stop, rebuilds, table) = (&stop, &rebuilds, &table);
            s.spawn(move || {
                let mut c = connect();
                while !stop.load(Ordering::Relaxed) {
                    if cache_state(&mut c, table).is_some_and(|(st, _)| st == "stale") {
                        c.query_one("SELECT uvm.cache_table($1::text::regclass, ARRAY['a', 'n'])", &[table])
                            .unwrap_or_else(|e| panic!("rebuilder: {}", describe(&e)));
                        rebuilds.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        }
        for rr in [false, true] {
            let (stop, appended_reads, rr_held, table, join_cached) = (&stop, &appended_reads, &rr_held, &table, &join_cached);
            s.spawn(move || {
                let mut c = connect();
                c.batch_execute("SET pg_uvm_share.enable_gpujoin = on").unwrap();
                let read = |c: &mut postgres::Client| -> (i64, bool) {
                    let r = c.query_one(fold, &[table]).unwrap_or_else(|e| panic!("reader: {}", describe(&e)));
                    let source: String = r.get(0);
                    let mine: (i64, i64, Option<String>) = (r.get(1), r.get(2), r.get(3));
                    let heap: (i64, i64, Option<String>) = (r.get(4), r.get(5), r.get(6));
                    assert_eq!(
                        mine, heap,
                        "the {source}'s answer differs from the heap's under one snapshot (repeatable read: {rr})"
                    );
                    let blocks: Option<i64> = r.get(7);
                    if source == "cache" && blocks.is_some_and(|b| mine.0 > b) {
                        appended_reads.fetch_add(1, Ordering::Relaxed);
                    }
                    if compare_join(c, table, rr) {
                        join_cached.fetch_add(1, Ordering::Relaxed);
                    }
                    (mine.0, source == "cache")
                };
                while !stop.load(Ordering::Relaxed) {
                    if rr {
                        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
                        let (first, _) = read(&mut c);
                        std::thread::sleep(Duration::from_millis(30));
                        let (second, cached) = read(&mut c);
                        assert_eq!(first, second, "a repeatable read snapshot saw rows appended after it");
                        if cached {
                            rr_held.fetch_add(1, Ordering::Relaxed);
                        }
                        c.batch_execute("COMMIT").unwrap();
                    } else {
                        read(&mut c);
                    }
                }
            });
        }
        while t0.elapsed() < Duration::from_secs(8) {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let (a, h, n, r, j) = (
        appended_reads.load(Ordering::Relaxed),
        rr_held.load(Ordering::Relaxed),
        inserts.load(Ordering::Relaxed),
        rebuilds.load(Ordering::Relaxed),
        join_cached.load(Ordering::Relaxed),
    );
    eprintln!("cache appends: {n} insert transactions, {r} rebuilds; {a} answers with appended rows from the cache, {h} repeatable read snapshots held over the cache, {j} joins over the caches");
    assert!(n > 50 && r > 0, "the writers or the rebuilder did not run");
    assert!(a > 0, "no reader took appended rows from the cache");
    assert!(h > 0, "no repeatable read snapshot was held over the cache");
    assert!(j > 0, "the GpuJoin node never read the caches");
    admin
        .batch_execute(&format!(
            "DROP TABLE {table}, {table}_d; DROP FUNCTION heap_fold(regclass, text); DROP FUNCTION {table}_pg();"
        ))
        .unwrap();
    assert_caches_reclaimed(&mut admin);
}

/// After the tables of every cache were dropped: each reader of `uvm.caches` reclaims what
/// they left (a segment a process still pins stays for the next one, so this looks for a while),
/// until no cache segment is left; otherwise fails with what is left and its state.
fn assert_caches_reclaimed(admin: &mut postgres::Client) {
    let segments = "SELECT count(*) FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%'";
    let t0 = Instant::now();
    loop {
        let _ = admin.query_one("SELECT count(*) FROM uvm.caches", &[]).unwrap();
        let left: i64 = admin.query_one(segments, &[]).unwrap().get(0);
        if left == 0 {
            return;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let seen: Vec<String> = admin
                .query(
                    "SELECT format('segment %s (attached to %s processes)', name, attached_processes) FROM uvm.segments \
                     WHERE name LIKE 'pg_temp_cache_%' UNION ALL \
                     SELECT format('cache of %s: %s, segment %s', relation, state, segment) FROM uvm.caches",
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            panic!("cache segments left 20 s after their tables were dropped: {seen:#?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A `DROP TABLE` that waits for the table's lock while a build holds it: the drop's mark comes
/// before the build publishes its cache (no cache to mark yet), so the cache is `ready` for a
/// table that is gone once the drop goes through; the next reader of `uvm.caches` reclaims it.
#[test]
fn a_cache_built_while_its_table_is_dropped_is_reclaimed() {
    let table = unique_name("cache_dropwait");
    let mut admin = connect();
    admin.batch_execute(&format!("CREATE TABLE {table} AS SELECT g::int8 AS k FROM generate_series(1, 1000) g")).unwrap();
    let mut builder = connect();
    // The build's lock first (ShareRowExclusiveLock, as `cache_table` takes it), so that the
    // drop waits behind it before any cache exists.
    builder.batch_execute(&format!("BEGIN; LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")).unwrap();
    std::thread::scope(|s| {
        let dropper = s.spawn(|| connect().batch_execute(&format!("DROP TABLE {table}")));
        let t0 = Instant::now();
        let waiting = "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = $1::text::regclass AND NOT granted)";
        while !admin.query_one(waiting, &[&table]).unwrap().get::<_, bool>(0) {
            assert!(t0.elapsed() < Duration::from_secs(20), "the DROP TABLE never waited for the build's lock");
            std::thread::sleep(Duration::from_millis(20));
        }
        let rows: i64 = builder.query_one("SELECT uvm.cache_table($1::text::regclass)", &[&table]).unwrap().get(0);
        assert_eq!(rows, 1000);
        builder.batch_execute("COMMIT").unwrap();
        dropper.join().unwrap().unwrap();
    });
    assert_caches_reclaimed(&mut admin);
}

/// A parallel build whose worker is terminated mid-way fails with the worker's error and leaves
/// no cache, no segment and no broker fd; the builder's session builds again afterwards.
#[test]
fn a_parallel_build_whose_worker_is_terminated_leaves_nothing() {
    let table = unique_name("cache_par_term");
    let mut admin = connect();
    let broker = wait_broker(&mut admin, Duration::from_secs(10));
    admin
        .batch_execute(&format!(
            "CREATE UNLOGGED TABLE {table} AS SELECT g::int8 AS k, (g % 1000)::int8 AS v FROM generate_series(1, 4000000) g"
        ))
        .unwrap();
    // (VACUUM cannot run in the implicit transaction of a multi-statement batch)
    admin.batch_execute(&format!("VACUUM ANALYZE {table}")).unwrap();
    let cache_segments = |c: &mut postgres::Client| -> i64 {
        c.query_one("SELECT count(*) FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%'", &[]).unwrap().get(0)
    };
    assert_eq!(cache_segments(&mut admin), 0, "cache segments before the test");
    let before = memfd_count(broker);
    let mut builder = connect();
    let pid = backend_pid(&mut builder);
    builder.batch_execute("SET min_parallel_table_scan_size = 0; SET max_parallel_maintenance_workers = 2").unwrap();
    // A build is short: try a few times to catch one of its workers.
    let mut caught = None;
    for _ in 0..5 {
        let sql = format!("SELECT uvm.cache_table('{table}')");
        let mut c = connect();
        let runner = std::thread::spawn(move || {
            let mut b = builder;
            let r = b.query_one(&sql, &[]).map(|_| ()).map_err(|e| describe(&e));
            (b, r)
        });
        let mut worker = None;
        wait_until(Duration::from_secs(20), || {
            worker = c
                .query_opt("SELECT pid FROM pg_stat_activity WHERE leader_pid = $1 AND pid <> $1 LIMIT 1", &[&pid])
                .unwrap()
                .map(|r| r.get::<_, i32>(0));
            worker.is_some() || runner.is_finished()
        });
        if let Some(w) = worker {
            c.execute("SELECT pg_terminate_backend($1)", &[&w]).unwrap();
        }
        let (b, r) = runner.join().unwrap();
        builder = b;
        if let (Some(_), Err(e)) = (worker, &r) {
            caught = Some(e.clone());
            break;
        }
        builder.batch_execute(&format!("SELECT uvm.cache_drop('{table}')")).unwrap();
    }
    let err = caught.expect("no attempt caught a worker of the parallel build mid-way");
    eprintln!("the build failed with: {err}");
    let cached: i64 =
        admin.query_one("SELECT count(*) FROM uvm.caches WHERE relation = $1::text::regclass", &[&table]).unwrap().get(0);
    assert_eq!(cached, 0, "a cache is left of the failed build");
    assert_eq!(cache_segments(&mut admin), 0, "a segment is left of the failed build");
    let mut now = 0;
    assert!(
        wait_until(Duration::from_secs(10), || {
            now = memfd_count(broker);
            now == before
        }),
        "the broker holds {now} memfds, {before} before the build"
    );
    // The session goes on: the build again, and its answer is the heap's.
    let rows: i64 = builder.query_one(&format!("SELECT uvm.cache_table('{table}')"), &[]).unwrap().get(0);
    assert_eq!(rows, 4_000_000);
    let q = format!("SELECT source, rows, non_null, sum::text FROM uvm.cache_fold('{table}', 'v')");
    let cache = builder.query_one(&q, &[]).unwrap();
    builder.batch_execute("SET pg_uvm_share.enable_cache = off").unwrap();
    let heap = builder.query_one(&q, &[]).unwrap();
    assert_eq!((cache.get::<_, String>(0), heap.get::<_, String>(0)), ("cache".to_string(), "heap".to_string()));
    for i in 1..3 {
        assert_eq!(cache.get::<_, i64>(i), heap.get::<_, i64>(i));
    }
    assert_eq!(cache.get::<_, String>(3), heap.get::<_, String>(3));
    admin.batch_execute(&format!("DROP TABLE {table}")).unwrap();
}

/// Sets `pg_uvm_share.cache_refresh_delay` cluster-wide for the test's life (`ALTER SYSTEM`),
/// and resets it when dropped, also when the test fails.
struct RefreshDelay;

impl RefreshDelay {
    fn set(ms: i32) -> RefreshDelay {
        let mut c = connect();
        // (ALTER SYSTEM cannot run in the implicit transaction of a multi-statement batch)
        c.batch_execute(&format!("ALTER SYSTEM SET pg_uvm_share.cache_refresh_delay = {ms}")).unwrap();
        c.batch_execute("SELECT pg_reload_conf()").unwrap();
        // (a reload reaches the backends at their next command; new ones read it at start)
        let want = format!("{ms}ms");
        assert!(
            wait_until(Duration::from_secs(10), || {
                connect().query_one("SHOW pg_uvm_share.cache_refresh_delay", &[]).unwrap().get::<_, String>(0) == want
            }),
            "the refresh delay did not reach new sessions"
        );
        RefreshDelay
    }
}

impl Drop for RefreshDelay {
    fn drop(&mut self) {
        let mut c = connect();
        let _ = c.batch_execute("ALTER SYSTEM RESET pg_uvm_share.cache_refresh_delay");
        let _ = c.batch_execute("SELECT pg_reload_conf()");
    }
}

/// With `pg_uvm_share.cache_refresh_delay` set, a stale cache is rebuilt in the background:
/// after a write (its columns as they were, the answers the heap's), after its build's
/// transaction aborted (a reader starts the refresher), and one whose building role lost SELECT,
/// or whose table can no longer be cached, is dropped; the refresher then exits.
#[test]
fn stale_caches_are_rebuilt_in_the_background() {
    let _delay = RefreshDelay::set(300);
    let table = unique_name("cache_refresh");
    let role = unique_name("cache_refresher_role");
    let mut admin = connect();
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int8, a int4, n numeric(10, 2), t text);
             INSERT INTO {table} SELECT g, g % 1000, g / 100.0, 'w' || (g % 9) FROM generate_series(1, 20000) g;
             CREATE ROLE {role};
             GRANT SELECT ON {table} TO {role};"
        ))
        .unwrap();
    let built: i64 =
        admin.query_one("SELECT uvm.cache_table($1::text::regclass, ARRAY['a', 'n', 't'])", &[&table]).unwrap().get(0);
    assert_eq!(built, 20000);
    let ready_with = |c: &mut postgres::Client, rows: i64| {
        let mut last = None;
        let ok = wait_until(Duration::from_secs(20), || {
            last = cache_state(c, &table);
            last == Some(("ready".into(), rows))
        });
        assert!(ok, "the cache of {table} was not rebuilt with {rows} rows: {last:?}");
    };

    let refreshers = |c: &mut postgres::Client| -> i64 {
        c.query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_uvm_share cache refresh'", &[])
            .unwrap()
            .get(0)
    };

    // 1. An insert (appended to the tail) and an update (which the tail cannot follow): stale,
    //    then rebuilt (20001 rows) with the same columns; the answers are the heap's.
    admin
        .batch_execute(&format!("INSERT INTO {table} VALUES (0, 7, 1.5, 'new'); UPDATE {table} SET a = 7 WHERE id = 0"))
        .unwrap();
    ready_with(&mut admin, 20001);
    let cols: Vec<String> =
        admin.query_one("SELECT columns FROM uvm.caches WHERE relation = $1::text::regclass", &[&table]).unwrap().get(0);
    assert_eq!(cols, vec!["a", "n", "t"]);
    for col in ["a", "n", "t"] {
        let q = format!("SELECT source, rows, non_null, sum::text FROM uvm.cache_fold('{table}', '{col}')");
        let cache = admin.query_one(&q, &[]).unwrap();
        admin.batch_execute("SET pg_uvm_share.enable_cache = off").unwrap();
        let heap = admin.query_one(&q, &[]).unwrap();
        admin.batch_execute("RESET pg_uvm_share.enable_cache").unwrap();
        assert_eq!(cache.get::<_, String>(0), "cache", "column {col}");
        assert_eq!(heap.get::<_, String>(0), "heap", "column {col}");
        assert_eq!(
            (cache.get::<_, i64>(1), cache.get::<_, i64>(2), cache.get::<_, Option<String>>(3)),
            (heap.get::<_, i64>(1), heap.get::<_, i64>(2), heap.get::<_, Option<String>>(3)),
            "column {col}"
        );
    }

    // 2. A build whose transaction (with an xid) aborts leaves the cache stale; a reader starts
    //    the refresher (the first one has left: nothing was stale).
    assert!(wait_until(Duration::from_secs(10), || refreshers(&mut admin) == 0), "the refresher did not exit");
    admin
        .batch_execute(&format!(
            "BEGIN; SELECT txid_current(); SELECT uvm.cache_table('{table}', ARRAY['a', 'n', 't']); ROLLBACK;"
        ))
        .unwrap();
    assert_eq!(cache_state(&mut admin, &table).map(|s| s.0), Some("stale".to_string()));
    admin.query_one(&format!("SELECT source FROM uvm.cache_fold('{table}', 'a')"), &[]).unwrap();
    ready_with(&mut admin, 20001);

    // 3. Built by a role that then loses SELECT: dropped, not rebuilt with its privileges.
    let mut other = connect();
    other.batch_execute(&format!("SET ROLE {role}")).unwrap();
    other.query_one(&format!("SELECT uvm.cache_table('{table}', ARRAY['a'])"), &[]).unwrap();
    // (a delete: an insert would be appended, leaving the cache ready)
    admin.batch_execute(&format!("REVOKE SELECT ON {table} FROM {role}; DELETE FROM {table} WHERE id = -1")).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || cache_state(&mut admin, &table).is_none()),
        "the cache of a role without SELECT was not dropped: {:?}",
        cache_state(&mut admin, &table)
    );
    // 4. A table that can no longer be cached (given an inheritance child since): dropped, not
    //    tried again once per delay for ever.
    let child = format!("{table}_child");
    admin.query_one(&format!("SELECT uvm.cache_table('{table}', ARRAY['a'])"), &[]).unwrap();
    admin.batch_execute(&format!("CREATE TABLE {child} () INHERITS ({table}); DELETE FROM {table} WHERE id = -1")).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || cache_state(&mut admin, &table).is_none()),
        "the cache of a table with an inheritance child was not dropped: {:?}",
        cache_state(&mut admin, &table)
    );
    // 5. Nothing stale: the refresher leaves.
    assert!(wait_until(Duration::from_secs(10), || refreshers(&mut admin) == 0), "the refresher did not exit");
    drop(other);
    admin.batch_execute(&format!("DROP TABLE {child}; DROP TABLE {table}; DROP ROLE {role}")).unwrap();
}

/// Inserts of strings a text column's dictionary lacks, by several writers at once, the same
/// new strings among them: each string gets one code past the dictionary's (under the column's
/// lock), so `GROUP BY` over the cache and its appended rows gives one group per string, the
/// heap's answer; the cache stays ready throughout.
#[test]
fn concurrent_appends_of_new_strings_share_their_codes() {
    let table = unique_name("cache_newstr");
    let mut admin = connect();
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int8, t text);
             INSERT INTO {table} SELECT g, 'base' || (g % 10) FROM generate_series(1, 10000) g;
             ANALYZE {table};"
        ))
        .unwrap();
    let built: i64 = admin.query_one("SELECT uvm.cache_table($1::text::regclass)", &[&table]).unwrap().get(0);
    assert_eq!(built, 10000);
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let table = &table;
            s.spawn(move || {
                let mut c = connect();
                for i in 0..40u64 {
                    let id = 100_000 + i * 10 + w;
                    let rows: Vec<String> = (0..3u64).map(|k| format!("({id}, 'new' || {})", (i * 7 + w * 3 + k) % 25)).collect();
                    c.batch_execute(&format!("INSERT INTO {table} VALUES {}, ({id}, 'base3')", rows.join(", ")))
                        .unwrap_or_else(|e| panic!("writer: {}", describe(&e)));
                }
            });
        }
    });
    assert_eq!(cache_state(&mut admin, &table).map(|s| s.0), Some("ready".to_string()), "the inserts made the cache stale");
    let q = format!("SELECT t, count(*), sum(id) FROM {table} GROUP BY t ORDER BY t");
    let plan: Vec<String> = admin
        .query(&format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {q}"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    let plan = plan.join("\n");
    assert!(plan.contains("Read From: cache") && plan.contains("Appended Rows: 640"), "not read from the cache:\n{plan}");
    let answer = |c: &mut postgres::Client| -> Vec<(String, i64, String)> {
        c.query(&format!("SELECT t, count, sum::text FROM ({q}) x"), &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    };
    let cached = answer(&mut admin);
    admin.batch_execute("SET pg_uvm_share.enable_cache = off").unwrap();
    let heap = answer(&mut admin);
    admin.batch_execute("RESET pg_uvm_share.enable_cache").unwrap();
    assert_eq!(heap.len(), 35, "10 strings of the build, 25 new ones");
    assert_eq!(cached, heap, "the cache's groups differ from the heap's");
    admin.batch_execute(&format!("DROP TABLE {table}")).unwrap();
    assert_caches_reclaimed(&mut admin);
}

/// A build reached from a parallel operation (through a function falsely marked PARALLEL SAFE;
/// `uvm.cache_table` is not) is refused with 25000 and a hint, as PostgreSQL refuses writes
/// there, where before it failed deep in the build with a Rust backtrace in its DETAIL.
#[test]
fn a_build_inside_a_parallel_operation_is_refused() {
    let mut c = connect();
    let t = unique_name("cache_par");
    let version: i32 = c.query_one("SELECT current_setting('server_version_num')::int", &[]).unwrap().get(0);
    let force = if version >= 160000 { "debug_parallel_query" } else { "force_parallel_mode" };
    c.batch_execute(&format!(
        "CREATE TABLE {t} (k int4); INSERT INTO {t} SELECT generate_series(1, 10); \
         CREATE FUNCTION {t}_build() RETURNS bigint LANGUAGE sql PARALLEL SAFE \
           AS $$ SELECT uvm.cache_table('{t}') $$; \
         SET {force} = on; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0"
    ))
    .unwrap();
    let err =
        c.query_one(&format!("SELECT {t}_build()"), &[]).map(|_| ()).map_err(|e| describe(&e)).expect_err("a build in a worker");
    assert!(err.contains("25000") && err.contains("parallel operation") && err.contains("PARALLEL UNSAFE"), "{err}");
    assert!(!err.contains("backtrace") && !err.contains("panicked"), "{err}");
    c.batch_execute(&format!("RESET {force}; DROP FUNCTION {t}_build(); DROP TABLE {t}")).unwrap();
}
