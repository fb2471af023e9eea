//! UvmGpuGroupAgg over the heap (issue 27, point 1; `src/node/groupagg`, "Over the heap"): the
//! node scans a fact table without a column cache serially, lays its rows out in column
//! batches and runs its scan program over each. `pg_uvm_share.gpugroupagg_heap = on` offers it
//! on any provider (its `auto` is a CUDA cluster). Over a table of millions of rows, the answer
//! equals PostgreSQL's with many batches, serially and with parallel workers handing their
//! batches to the leader; a statement timeout ends the query while it reads the heap (and while
//! the workers wait for the leader), and a backend terminated mid-read leaves no temporary
//! segment and no chunk behind.

use std::time::{Duration, Instant};

use pg_uvm_share_tests::*;

/// The node over the heap, PostgreSQL's grouping plans priced out (as the regress battery
/// `uvm_heap_groupagg` does).
const SETTINGS: &str = "SET pg_uvm_share.gpugroupagg_heap = on; SET max_parallel_workers_per_gather = 0;
     SET enable_hashagg = off; SET enable_sort = off;";

/// [`SETTINGS`] with two parallel workers, priced for free.
const PARALLEL: &str = "SET pg_uvm_share.gpugroupagg_heap = on; SET enable_hashagg = off; SET enable_sort = off;
     SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
     SET max_parallel_workers_per_gather = 2;";

/// `label: N` of an `EXPLAIN ANALYZE` text.
fn figure(plan: &str, label: &str) -> Option<i64> {
    plan.lines().find_map(|l| l.trim().strip_prefix(label)).and_then(|n| n.trim().parse().ok())
}

fn temp_segments(c: &mut Client) -> Vec<String> {
    c.query("SELECT name FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin%' ORDER BY name", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A fact of `rows` rows (`k` 1,000 groups, `v` the row's number) under a fresh name.
fn fact(c: &mut Client, tag: &str, rows: i64) -> String {
    let t = unique_name(tag);
    c.batch_execute(&format!(
        "CREATE TABLE {t} AS SELECT (i % 1000)::int4 AS k, i::int8 AS v, (i % 7)::int2 AS w FROM generate_series(1, {rows}) i;
         ANALYZE {t};"
    ))
    .expect("the fact table");
    t
}

/// `q`'s rows as one sorted text, with the node allowed and with it off.
fn node_and_postgres(c: &mut Client, q: &str) -> (String, String) {
    let sorted = format!("SELECT coalesce(array_agg(r::text ORDER BY r::text), '{{}}')::text FROM ({q}) r");
    let got: String = c.query_one(sorted.as_str(), &[]).unwrap().get(0);
    c.batch_execute("SET pg_uvm_share.enable_gpugroupagg = off").unwrap();
    let want: String = c.query_one(sorted.as_str(), &[]).unwrap().get(0);
    c.batch_execute("RESET pg_uvm_share.enable_gpugroupagg").unwrap();
    (got, want)
}

/// A statement timeout while the node (`node`, in its plan under `settings`) reads three
/// million rows ends the query (57014), and nothing is left.
fn timeout_leaves_nothing(settings: &str, tag: &str, node: &str) {
    let mut c = connect();
    let t = fact(&mut c, tag, 3_000_000);
    c.batch_execute(settings).unwrap();
    let q = format!("SELECT k, count(*), sum(v) FROM {t} GROUP BY k");
    let plan = plan_of(&mut c, &q);
    assert!(plan.contains(node), "no {node} in the plan:\n{plan}");
    c.batch_execute("SET statement_timeout = '200ms'").unwrap();
    let t0 = Instant::now();
    let err = c.query(q.as_str(), &[]).expect_err("three million rows read within the timeout");
    let took = t0.elapsed();
    assert_eq!(sqlstate(&err).as_deref(), Some("57014"), "{}", describe(&err));
    // 200 ms to the timeout, then the scan's next interrupt check (and the workers' exit); a
    // loaded 2-core machine gets several seconds of slack.
    assert!(took < Duration::from_millis(200) + Duration::from_secs(8), "the timeout took {took:?}");
    c.batch_execute("RESET statement_timeout").unwrap();
    let gone = wait_until(Duration::from_secs(10), || temp_segments(&mut c).is_empty());
    assert!(gone, "temporary segments left: {:?}", temp_segments(&mut c));
    let n: i64 = c.query_one(format!("SELECT count(*) FROM {t} WHERE k = 1").as_str(), &[]).unwrap().get(0);
    assert_eq!(n, 3000, "the session works on");
    c.batch_execute(&format!("DROP TABLE {t}")).unwrap();
}

fn plan_of(c: &mut Client, q: &str) -> String {
    let rows = c.query(format!("EXPLAIN (COSTS OFF) {q}").as_str(), &[]).unwrap();
    rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n")
}

/// Many batches (64 kB of `work_mem`: blocks of 4 Ki rows) over a million rows: every group of
/// every batch, as PostgreSQL counts and sums them.
#[test]
fn many_batches_give_postgres_answer() {
    let mut c = connect();
    let t = fact(&mut c, "hg_fact", 1_000_000);
    c.batch_execute(SETTINGS).unwrap();
    c.batch_execute("SET work_mem = '64kB'").unwrap();
    let q = format!("SELECT k, count(*), sum(v), max(w) FROM {t} WHERE w <> 3 GROUP BY k");
    let plan = explain_analyze(&mut c, &q);
    assert!(plan.contains("Fact Heap:") && plan.contains("Read From: heap"), "not the node over the heap:\n{plan}");
    let batches = figure(&plan, "Batches:").expect("Batches");
    assert!(batches >= 100, "{batches} batches for a million rows in 64 kB:\n{plan}");
    let (got, want) = node_and_postgres(&mut c, &q);
    assert_eq!(got, want, "the node's groups differ from PostgreSQL's");
    c.batch_execute(&format!("DROP TABLE {t}")).unwrap();
}

/// A statement timeout while the node reads the heap serially.
#[test]
fn a_timeout_while_the_node_reads_the_heap_leaves_nothing() {
    timeout_leaves_nothing(SETTINGS, "hg_slow", "Fact Heap:");
}

/// A backend terminated while the node reads the heap: its batches' and group table's
/// segments go with it, and the broker holds no more chunks than before.
#[test]
fn a_backend_terminated_mid_read_leaves_nothing() {
    let mut c = connect();
    let broker = wait_broker(&mut c, Duration::from_secs(10));
    let t = fact(&mut c, "hg_term", 3_000_000);
    assert!(temp_segments(&mut c).is_empty(), "temporary segments before the test: {:?}", temp_segments(&mut c));
    let before = memfd_count(broker);
    let mut victim = connect();
    let pid = backend_pid(&mut victim);
    victim.batch_execute(SETTINGS).unwrap();
    let q = format!("SELECT k, count(*), sum(v) FROM {t} GROUP BY k");
    let plan = plan_of(&mut victim, &q);
    assert!(plan.contains("Fact Heap:"), "not the node over the heap:\n{plan}");
    let runner = std::thread::spawn(move || victim.query(q.as_str(), &[]).map(|r| r.len()));
    // Mid-read: the node holds its group table and batches.
    let held = wait_until(Duration::from_secs(20), || !temp_segments(&mut c).is_empty());
    c.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    let ended = runner.join().expect("the query's thread");
    assert!(held, "the node held no temporary segment while it read");
    assert!(ended.is_err(), "the query ended by itself: {ended:?}");
    let gone = wait_until(Duration::from_secs(10), || temp_segments(&mut c).is_empty());
    assert!(gone, "temporary segments left: {:?}", temp_segments(&mut c));
    let back = wait_until(Duration::from_secs(10), || memfd_count(broker) <= before);
    assert!(back, "the broker holds {} chunks, {before} before the query", memfd_count(broker));
    c.batch_execute(&format!("DROP TABLE {t}")).unwrap();
}

/// In parallel: every participant reads its share and lays it out, the workers hand their
/// batches to the leader, which runs the program over all of them; PostgreSQL's groups.
#[test]
fn workers_hand_their_batches_to_the_leader() {
    let mut c = connect();
    let t = fact(&mut c, "hg_par", 2_000_000);
    c.batch_execute(PARALLEL).unwrap();
    let q = format!("SELECT k, count(*), sum(v), min(w) FROM {t} WHERE w <> 3 GROUP BY k");
    let plan = plan_of(&mut c, &q);
    assert!(plan.contains("Parallel Custom Scan (UvmGpuGroupAgg)"), "not the node in parallel:\n{plan}");
    let (got, want) = node_and_postgres(&mut c, &q);
    assert_eq!(got, want, "the node's groups differ from PostgreSQL's");
    // How many batches the workers read depends on when they start; on a busy machine the
    // leader may read them all. A few tries, each with workers launched.
    let mut seen = Vec::new();
    for _ in 0..5 {
        let plan = explain_analyze(&mut c, &q);
        let handed = figure(&plan, "Batches From Workers:").unwrap_or(0);
        seen.push((handed, figure(&plan, "Heap Rows:")));
        if handed > 0 {
            break;
        }
    }
    assert!(seen.iter().any(|s| s.0 > 0), "the workers handed no batch (batches, rows): {seen:?}");
    assert!(seen.iter().all(|s| s.1 == Some(2_000_000)), "the leader did not fold every row: {seen:?}");
    c.batch_execute(&format!("DROP TABLE {t}")).unwrap();
}

/// A statement timeout in parallel, the leader running the program while the workers wait for
/// room to hand their batches: the workers go with the query.
#[test]
fn a_timeout_in_parallel_leaves_nothing() {
    timeout_leaves_nothing(PARALLEL, "hg_par_slow", "Parallel Custom Scan (UvmGpuGroupAgg)");
}
