//! The column cache measurements (issue 26): building a cache of a table's columns, reading it
//! against reading the heap, and its bytes against the heap's.

use super::*;

/// Rows of the table the step caches: the 50 M x 2 columns.
const CACHE_ROWS: i64 = 50_000_000;
/// Issue 26's budget for building the cache of 50 M rows x 2 columns.
const BUILD_BUDGET_S: f64 = 2.0;
/// Parallel workers of the measured build (`max_parallel_maintenance_workers`).
const BUILD_WORKERS: i32 = 4;

/// Builds the cache of a 50 M-row table of two `int8` columns (best of two builds, with
/// [`BUILD_WORKERS`] parallel workers, against the leader alone in the same run), then folds
/// one column from the cache and from the heap (`uvm.cache_fold`, both serial in the backend),
/// and against PostgreSQL's own parallel `count(*), count(v), sum(v)`; notes the bytes per row.
pub(crate) fn bench_cache(b: &mut Bench, admin: &mut Client, pid: u32) {
    const K_BUILD: &str = "cache_build";
    const M_BUILD: &str =
        "building the column cache of 50 M rows x 2 int8 columns (s), the leader and 4 parallel workers, vs the budget";
    const K_FOLD: &str = "cache_fold";
    const M_FOLD: &str = "count, non-NULL count and sum of one cached int8 column of 50 M rows, from the cache vs PostgreSQL's parallel aggregate over the heap (s)";
    if !b.has_time(&[(K_BUILD, M_BUILD), (K_FOLD, M_FOLD)]) {
        return;
    }
    let table = format!("gpu_bench_cache_{pid}");
    let r = (|| -> R<()> {
        let t = Instant::now();
        // (VACUUM cannot run in the implicit transaction of a multi-statement batch)
        for q in [
            format!("DROP TABLE IF EXISTS {table}"),
            format!("CREATE UNLOGGED TABLE {table} AS SELECT g::int8 AS k, (g % 1000)::int8 AS v FROM generate_series(1, {CACHE_ROWS}) g"),
            format!("VACUUM ANALYZE {table}"),
        ] {
            admin.batch_execute(&q).map_err(err("make the cache table"))?;
        }
        b.note(format!("generated {table} ({CACHE_ROWS} rows) in {:.0} s", t.elapsed().as_secs_f64()));
        let build = format!("SELECT uvm.cache_table('{table}')::text");
        let mut timed_builds = |workers: i32| -> R<Vec<f64>> {
            admin.batch_execute(&format!("SET max_parallel_maintenance_workers = {workers}")).map_err(err("set workers"))?;
            let mut builds = Vec::new();
            for _ in 0..2 {
                let (s, v) = time_query(admin, &build)?;
                if v.first().map(String::as_str) != Some(&CACHE_ROWS.to_string()) {
                    return Err(format!("cache_table returned {v:?}, not {CACHE_ROWS} rows"));
                }
                builds.push(s);
            }
            admin.batch_execute("RESET max_parallel_maintenance_workers").map_err(err("reset workers"))?;
            Ok(builds)
        };
        let alone = timed_builds(0)?;
        let builds = timed_builds(BUILD_WORKERS)?;
        let launched: i32 = admin
            .query_one("SELECT build_workers FROM uvm.caches WHERE relation = $1::text::regclass", &[&table])
            .map_err(err("uvm.caches"))?
            .get(0);
        let best = builds.iter().cloned().fold(f64::INFINITY, f64::min);
        let best_alone = alone.iter().cloned().fold(f64::INFINITY, f64::min);
        b.note(format!(
            "cache build: {best:.2} s with {launched} of {BUILD_WORKERS} workers launched; the leader alone {best_alone:.2} s ({}); {:.1}x faster",
            list(&alone, 2),
            best_alone / best
        ));
        b.row(
            K_BUILD,
            M_BUILD,
            format!("{best:.2} s"),
            format!("{best:.2} ({}; {launched} workers)", list(&builds, 2)),
            format!("{BUILD_BUDGET_S:.1} s budget (the leader alone: {best_alone:.2} s)"),
            Some(best / BUILD_BUDGET_S),
            Target::service(Goal::AtMost(1.0)).saying("≤ 2 s"),
        );
        let sizes = admin
            .query_one(
                "SELECT device_bytes, host_bytes, pg_relation_size(relation) FROM uvm.caches WHERE relation = $1::text::regclass",
                &[&table],
            )
            .map_err(err("uvm.caches"))?;
        let (dev, host, heap): (i64, i64, i64) = (sizes.get(0), sizes.get(1), sizes.get(2));
        b.note(format!(
            "cache of {table}: {dev} device + {host} host bytes = {:.2} bytes a row; the heap {heap} bytes = {:.2} a row",
            (dev + host) as f64 / CACHE_ROWS as f64,
            heap as f64 / CACHE_ROWS as f64
        ));
        let fold = format!("SELECT source, rows::text, non_null::text, sum::text FROM uvm.cache_fold('{table}', 'v')");
        let (cache_s, cache_v) = best_of(admin, "RESET pg_uvm_share.enable_cache", &fold, 3)?;
        if cache_v.first().map(String::as_str) != Some("cache") {
            return Err(format!("cache_fold read {cache_v:?}, not the cache"));
        }
        let (heap_s, heap_v) = best_of(admin, "SET pg_uvm_share.enable_cache = off", &fold, 2)?;
        admin.batch_execute("RESET pg_uvm_share.enable_cache").map_err(err("reset"))?;
        let pgq = format!("SELECT count(*)::text, count(v)::text, sum(v)::text FROM {table}");
        let (pg_s, pg_v) = best_of(admin, "SELECT 1", &pgq, 3)?;
        if cache_v[1..] != heap_v[1..] || cache_v[1..] != pg_v[..] {
            return Err(format!("answers differ: cache {cache_v:?}, heap {heap_v:?}, PostgreSQL {pg_v:?}"));
        }
        b.row(
            K_FOLD,
            M_FOLD,
            format!("{cache_s:.3} s = {:.2}x PostgreSQL", cache_s / pg_s),
            format!("{cache_s:.3} from the cache (the same fold over the heap, serial: {heap_s:.2} s)"),
            format!("{pg_s:.3} PostgreSQL's parallel aggregate"),
            Some(cache_s / pg_s),
            Target::info(),
        );
        Ok(())
    })();
    if let Err(e) = r {
        b.error(K_BUILD, M_BUILD, e);
    }
    let _ = admin.batch_execute(&format!("DROP TABLE IF EXISTS {table}"));
}

/// Clients and seconds of the INSERT throughput measurement.
const INSERT_CLIENTS: usize = 16;
const INSERT_SECONDS: f64 = 5.0;

/// INSERT throughput into a table of 1 M rows, 16 clients each inserting one row per
/// transaction for 5 s, with the table cached against without a cache (alternating, best of
/// two each). Until INSERTs append to a cache, the first INSERT makes the cache stale and the
/// rest only find it so: this measures what the cache costs its table's writers.
pub(crate) fn bench_cache_inserts(b: &mut Bench, admin: &mut Client, pid: u32) {
    const K: &str = "cache_inserts";
    const M: &str =
        "INSERT throughput into a cached table (16 clients, one row per transaction), against the same table without a cache";
    if !b.has_time(&[(K, M)]) {
        return;
    }
    let table = format!("gpu_bench_inserts_{pid}");
    let r = (|| -> R<()> {
        admin
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table};
                 CREATE TABLE {table} AS SELECT g::int8 AS k, (g % 1000)::int8 AS v FROM generate_series(1, 1000000) g"
            ))
            .map_err(err("make the insert table"))?;
        let run = |cached: bool, admin: &mut Client| -> R<f64> {
            if cached {
                simple_value(admin, &format!("SELECT uvm.cache_table('{table}')::text"))?;
            } else {
                simple_value(admin, &format!("SELECT uvm.cache_drop('{table}')::text"))?;
            }
            let stop = std::sync::atomic::AtomicBool::new(false);
            let done = std::sync::atomic::AtomicU64::new(0);
            let t = Instant::now();
            let failed: Vec<String> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..INSERT_CLIENTS)
                    .map(|i| {
                        let (stop, done, table) = (&stop, &done, &table);
                        s.spawn(move || -> R<()> {
                            let mut c = fresh()?;
                            let ins = c.prepare(&format!("INSERT INTO {table} VALUES ($1, $2)")).map_err(err("prepare"))?;
                            let mut n = 0i64;
                            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                                n += 1;
                                c.execute(&ins, &[&(-(i as i64) * 1_000_000_000 - n), &n]).map_err(err("insert"))?;
                                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            Ok(())
                        })
                    })
                    .collect();
                std::thread::sleep(Duration::from_secs_f64(INSERT_SECONDS));
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                hs.into_iter().filter_map(|h| h.join().unwrap_or_else(|_| Err("a client panicked".into())).err()).collect()
            });
            if let Some(e) = failed.first() {
                return Err(e.clone());
            }
            Ok(done.load(std::sync::atomic::Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64())
        };
        let (mut plain, mut cached) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            plain.push(run(false, admin)?);
            cached.push(run(true, admin)?);
        }
        let (p, c) = (max_of(&plain), max_of(&cached));
        let state = simple_value(admin, &format!("SELECT state FROM uvm.caches WHERE relation = '{table}'::regclass"))?;
        b.note(format!(
            "cache inserts: {c:.0}/s cached ({}), {p:.0}/s without ({}); the cache was {state} after the run (INSERTs do not append yet)",
            list(&cached, 0),
            list(&plain, 0)
        ));
        b.row(
            K,
            M,
            format!("{:.2}x", c / p),
            format!("{c:.0} rows/s ({})", list(&cached, 0)),
            format!("{p:.0} rows/s without a cache ({})", list(&plain, 0)),
            Some(c / p),
            Target::service(Goal::AtLeast(0.8)).saying("≥ 0.8"),
        );
        Ok(())
    })();
    if let Err(e) = r {
        b.error(K, M, e);
    }
    let _ = admin.batch_execute(&format!("DROP TABLE IF EXISTS {table}"));
}
