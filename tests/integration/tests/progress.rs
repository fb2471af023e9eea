//! `uvm.progress` (issue 28, point 4): a long operation shows while it runs, with its phase and
//! how far it has come, and is gone when it ends, in the execution mode of the run: a migration
//! waiting for a pin (on the suite's second cluster, which simulates a GPU), and the GpuJoin
//! plan node reading a slow inner side.

use std::time::{Duration, Instant};

use pg_uvm_share_tests::*;

type Row = (i32, String, String, Option<String>, i64, i64, String);

fn progress(c: &mut Client, kind: &str) -> Vec<Row> {
    c.query("SELECT pid, kind, phase, segment, done, total, unit FROM uvm.progress WHERE kind = $1", &[&kind])
        .unwrap_or_else(|e| panic!("uvm.progress: {}", describe(&e)))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6)))
        .collect()
}

/// Polls until `f` finds a row, or 10 s.
fn wait_for_row(c: &mut Client, kind: &str, f: impl Fn(&Row) -> bool) -> Row {
    let t = Instant::now();
    loop {
        if let Some(r) = progress(c, kind).into_iter().find(|r| f(r)) {
            return r;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no {kind} row in uvm.progress: {:?}", progress(c, kind));
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_migration_waiting_for_a_pin_shows_in_progress() {
    const SIZE: i64 = 16 << 20;
    let name = unique_name("progress_mig");
    let mut a = connect_tiers();
    let mut holder = connect_tiers();
    let mut watcher = connect_tiers();
    create_segment_tier(&mut a, &name, SIZE, None, "host");
    holder.execute("SELECT uvm.pin_segment($1)", &[&name]).unwrap();
    let service = std::env::var("UVM_EXPECT_EXECUTION").as_deref() == Ok("service");
    let mover = if service { service_pid(&mut watcher) } else { backend_pid(&mut a) };
    let n = name.clone();
    let t = std::thread::spawn(move || prefetch_segment(&mut a, &n, 0, SIZE, "device"));
    let row = wait_for_row(&mut watcher, "migration", |r| r.3.as_deref() == Some(name.as_str()));
    // The row stays while the migration waits (not only while one try runs: the GPU service
    // tries a parked migration again at each turn of its loop).
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(5));
        assert!(
            progress(&mut watcher, "migration").iter().any(|r| r.3.as_deref() == Some(name.as_str())),
            "the waiting migration's row came and went"
        );
    }
    assert_eq!(
        row,
        (mover, "migration".into(), "waiting for pins".into(), Some(name.clone()), 0, SIZE, "bytes".into()),
        "the waiting migration's row (pid: {})",
        if service { "the GPU service" } else { "the migrating backend" }
    );
    holder.execute("SELECT uvm.unpin_segment($1)", &[&name]).unwrap();
    assert_eq!(t.join().expect("the migration"), SIZE);
    assert!(progress(&mut watcher, "migration").is_empty(), "the row went with the migration");
    drop_segment(&mut holder, &name);
}

#[test]
fn a_gpujoin_build_reading_its_inner_side_shows_in_progress() {
    let mut c = connect();
    let mut watcher = connect();
    c.batch_execute(
        "DROP TABLE IF EXISTS progress_out, progress_in;
         CREATE TABLE progress_out AS SELECT g AS k FROM generate_series(1, 20000) g;
         CREATE TABLE progress_in AS SELECT g AS k FROM generate_series(1, 100) g;
         ANALYZE progress_out, progress_in;
         -- 20 ms per inner row: the build reads for about 2 s
         CREATE OR REPLACE FUNCTION pg_temp.slow(k int) RETURNS int VOLATILE LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep(0.02); RETURN k; END $$;
         SET pg_uvm_share.enable_gpujoin = on; SET enable_hashjoin = off; SET enable_mergejoin = off;
         SET enable_nestloop = off; SET max_parallel_workers_per_gather = 0;",
    )
    .unwrap();
    let q = "SELECT count(*) FROM progress_out o JOIN (SELECT pg_temp.slow(k) AS k FROM progress_in) i ON o.k = i.k";
    let plan: Vec<String> = c.query(&format!("EXPLAIN (COSTS OFF) {q}"), &[]).unwrap().iter().map(|r| r.get(0)).collect();
    // The node, with the slow side inner (built): the last child of the join.
    assert!(plan.iter().any(|l| l.contains("UvmGpuJoin")), "the plan: {plan:#?}");
    let (outer_at, inner_at) =
        (plan.iter().position(|l| l.contains("progress_out")), plan.iter().position(|l| l.contains("progress_in")));
    assert!(outer_at < inner_at, "the slow side is not the inner one: {plan:#?}");
    let pid = backend_pid(&mut c);
    let t = std::thread::spawn(move || {
        let n: i64 = c.query_one(q, &[]).unwrap().get(0);
        (n, c)
    });
    // (`done` moves a chunk of rows at a time: the 100 rows here are one chunk, read in 2 s.)
    let row = wait_for_row(&mut watcher, "gpujoin build", |r| r.0 == pid);
    assert_eq!((row.1.as_str(), row.2.as_str(), row.6.as_str()), ("gpujoin build", "reading inner side", "rows"), "{row:?}");
    assert!(row.4 <= 100 && row.5 == 100, "done {} of the estimated {}", row.4, row.5);
    let (n, mut c) = t.join().expect("the join");
    assert_eq!(n, 100);
    assert!(progress(&mut watcher, "gpujoin build").iter().all(|r| r.0 != pid), "the rows went with the build");
    c.batch_execute("RESET ALL; DROP TABLE progress_out, progress_in").unwrap();
}
