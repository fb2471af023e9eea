//! Leader probes (issue 24, point 5; `src/node/handoff.rs`): a parallel GpuJoin in its probe
//! mode (`count(*)` and `sum` of one inner column) whose workers hand their outer keys to the
//! leader, which builds the table and probes every batch, so that no worker needs a CUDA context.
//! `pg_uvm_share.gpujoin_leader_probes = on` asks for it on any provider (its `auto` is the
//! process mode under CUDA). The answers equal PostgreSQL's, the leader did probe batches the
//! workers read, and a statement timeout while the workers wait for the leader ends the query
//! at once and leaves no temporary segment.

use std::time::{Duration, Instant};

use pg_uvm_share_tests::*;

const SETTINGS: &str = "SET pg_uvm_share.enable_gpujoin = on; SET enable_hashjoin = off; SET enable_mergejoin = off;
     SET enable_nestloop = off; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;
     SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2;
     SET pg_uvm_share.gpujoin_leader_probes = on;";

fn temp_segments(c: &mut Client) -> Vec<String> {
    c.query("SELECT name FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin%' ORDER BY name", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// `Batches Probed for Workers: N` of an `EXPLAIN (ANALYZE, TIMING ON)` text.
fn probed_for_workers(plan: &str) -> Option<i64> {
    plan.lines().find_map(|l| l.trim().strip_prefix("Batches Probed for Workers:")).and_then(|n| n.trim().parse().ok())
}

#[test]
fn workers_hand_their_keys_to_the_leader() {
    let mut c = connect();
    let (fact, dim) = (unique_name("lp_fact"), unique_name("lp_dim"));
    c.batch_execute(&format!(
        "CREATE TABLE {fact} AS SELECT i AS id, (i % 60000)::bigint AS k FROM generate_series(1, 600000) i;
         CREATE TABLE {dim} AS SELECT i::bigint AS k, (i % 97)::int AS v FROM generate_series(1, 50000) i;
         ANALYZE {fact}, {dim};"
    ))
    .expect("test tables");
    c.batch_execute(SETTINGS).unwrap();
    let q = format!("SELECT count(*), sum(d.v) FROM {fact} f JOIN {dim} d ON f.k = d.k");
    let plan = explain_analyze(&mut c, &q);
    assert!(plan.contains("Parallel Custom Scan (UvmGpuJoin)"), "not a parallel GpuJoin:\n{plan}");
    assert!(plan.contains("Probed By: the leader"), "the leader does not probe for the workers:\n{plan}");

    let row = c.query_one(q.as_str(), &[]).expect("the join");
    let got: (i64, i64) = (row.get(0), row.get(1));
    c.batch_execute("SET pg_uvm_share.enable_gpujoin = off; SET enable_hashjoin = on;").unwrap();
    let row = c.query_one(q.as_str(), &[]).expect("PostgreSQL's join");
    let pg: (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(got, pg, "the leader's probes of every participant's keys");
    c.batch_execute(SETTINGS).unwrap();

    // How many batches the workers read depends on when they start; on a busy machine the
    // leader may read them all. A few tries, each with workers launched.
    let mut seen = Vec::new();
    for _ in 0..5 {
        let rows = c.query(format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING ON) {q}").as_str(), &[]).unwrap();
        let text: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let text = text.join("\n");
        let n = probed_for_workers(&text).unwrap_or_else(|| panic!("no Batches Probed for Workers:\n{text}"));
        seen.push((workers_launched(&text), n));
        if n > 0 {
            break;
        }
    }
    assert!(seen.iter().any(|(_, n)| *n > 0), "the leader never probed a worker's batch: {seen:?}");
    assert!(temp_segments(&mut c).is_empty(), "temporary segments left: {:?}", temp_segments(&mut c));
    c.batch_execute(&format!("DROP TABLE {fact}, {dim}")).unwrap();
}

/// The leader probes batches whose keys all walk one long chain (an inner side of one key), so
/// each takes seconds inside the extension's probe loop; the workers meanwhile fill the ring and
/// sleep until it has room. A statement timeout ends the query within a second or two
/// (57014); the workers go with it, and nothing is left.
#[test]
fn a_timeout_while_workers_wait_for_the_leader_leaves_nothing() {
    let mut c = connect();
    let (fact, dim) = (unique_name("lp_slow_fact"), unique_name("lp_slow_dim"));
    c.batch_execute(&format!(
        "CREATE TABLE {fact} AS SELECT i AS id, 7::bigint AS k FROM generate_series(1, 1000000) i;
         CREATE TABLE {dim} AS SELECT 7::bigint AS k, i AS v FROM generate_series(1, 20000) i;
         ANALYZE {fact}, {dim};"
    ))
    .expect("test tables");
    c.batch_execute(SETTINGS).unwrap();
    let q = format!("SELECT count(*), sum(d.v) FROM {fact} f JOIN {dim} d ON f.k = d.k");
    let plan: Vec<String> = c.query(format!("EXPLAIN (COSTS OFF) {q}").as_str(), &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert!(plan.iter().any(|l| l.contains("Parallel Custom Scan (UvmGpuJoin)")), "not a parallel GpuJoin:\n{}", plan.join("\n"));
    c.batch_execute("SET statement_timeout = '1500ms'").unwrap();
    let t = Instant::now();
    let err = c.query_one(q.as_str(), &[]).expect_err("the join ran to its end within the timeout");
    let took = t.elapsed();
    assert_eq!(sqlstate(&err).as_deref(), Some("57014"), "{}", describe(&err));
    // 1.5 s to the timeout, then the probe's next interrupt check and the workers' exit; a loaded
    // 2-core machine gets several seconds of slack.
    assert!(took < Duration::from_millis(1500) + Duration::from_secs(8), "the timeout took {took:?}");
    c.batch_execute("RESET statement_timeout").unwrap();
    let gone = wait_until(Duration::from_secs(10), || temp_segments(&mut c).is_empty());
    assert!(gone, "temporary segments left: {:?}", temp_segments(&mut c));
    // The session works on.
    let n: i64 = c.query_one(format!("SELECT count(*) FROM {dim} d JOIN {dim} e ON d.v = e.v").as_str(), &[]).unwrap().get(0);
    assert_eq!(n, 20_000);
    c.batch_execute(&format!("DROP TABLE {fact}, {dim}")).unwrap();
}
