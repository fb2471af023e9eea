//! GpuGroupAgg's planner choice (issue 27, point 5: "the planner picks it by cost, the same rule
//! as the GpuJoin node: `auto` within 1.25x of the faster plan").
//!
//! The sweep mirrors GpuJoin's (`joins::bench_gpujoin_planner`): a fact table of 20 K to 50 M
//! rows with a column cache, and at each size four query shapes the node computes, each timed
//! three ways: with the defaults (the planner's pick), with the node forced (PostgreSQL's
//! `HashAggregate` and sorts off, so the node's path is the only one not disabled) and with the
//! node off. A point is within the rule when the defaults' plan ran within 1.25x of the faster
//! of the other two. Every grouped query sits under an outer `count`/`sum`, so that the time
//! measured is the grouping's, not the client's reading of 5 M groups, and the three answers
//! are compared. The node forced must have read the cache (`EXPLAIN ANALYZE`'s `Read From:
//! cache`), or the point is an error: a node that fell back to its child would time
//! PostgreSQL's plan twice.

use super::*;

/// The defaults: the planner's pick.
const DEFAULTS: &str = "RESET pg_uvm_share.enable_gpugroupagg; RESET enable_hashagg; RESET enable_sort";
/// The node forced: PostgreSQL's hashed and sorted aggregation off (its `HashAggregate` child,
/// the fallback, is not priced into the node's path).
const FORCED: &str = "SET pg_uvm_share.enable_gpugroupagg = on; SET enable_hashagg = off; SET enable_sort = off";
/// The node off, the rest as the defaults.
const OFF: &str = "RESET enable_hashagg; RESET enable_sort; SET pg_uvm_share.enable_gpugroupagg = off";

/// The shapes: a name and the query.
const SHAPES: [(&str, &str); 4] = [
    ("10 groups", "SELECT count(*)::text, sum(s)::text FROM (SELECT g, count(*) AS c, sum(v) AS s FROM gga_f GROUP BY g) t"),
    ("a group per 10 rows", "SELECT count(*)::text, sum(s)::text FROM (SELECT k, sum(v) AS s FROM gga_f GROUP BY k) t"),
    (
        "filter, avg and max",
        "SELECT count(*)::text, sum(a)::text, sum(m)::text FROM \
         (SELECT g, avg(v) AS a, max(q) AS m FROM gga_f WHERE q BETWEEN 10 AND 40 GROUP BY g) t",
    ),
    (
        "star join, cached dimension",
        "SELECT count(*)::text, sum(s)::text FROM \
         (SELECT d.cat, sum(f.v) AS s FROM gga_f f JOIN gga_d d ON f.dk = d.dk WHERE d.cat < 10 GROUP BY d.cat) t",
    ),
];

pub(crate) fn bench_groupagg_planner(b: &mut Bench) {
    const K: &str = "gga_auto";
    const M: &str = "UvmGpuGroupAgg by cost within 1.25x of the faster plan: a cached fact of 20 K to 50 M rows; 10 groups, \
                     a group per 10 rows, a filter with avg and max, a star join with a cached dimension";
    if !b.has_time(&[(K, M)]) {
        return;
    }
    const SIZES: [i64; 5] = [20_000, 200_000, 2_000_000, 20_000_000, 50_000_000];
    let r = (|| -> R<SweepTally> {
        let mut c = fresh()?;
        let mut tally = SweepTally::default();
        for n in SIZES {
            let dims = (n / 100).max(100);
            // One statement per call: VACUUM cannot run in the implicit transaction of a batch.
            for sql in [
                "DROP TABLE IF EXISTS gga_f, gga_d".to_string(),
                format!("CREATE UNLOGGED TABLE gga_d AS SELECT i AS dk, i % 25 AS cat FROM generate_series(1, {dims}) i"),
                format!(
                    "CREATE UNLOGGED TABLE gga_f AS SELECT i % 10 AS g, (random() * {})::int8 AS k, \
                     1 + (random() * {})::int AS dk, (random() * 1000)::int AS v, (random() * 50)::int AS q \
                     FROM generate_series(1, {n}) i",
                    n / 10,
                    dims - 1
                ),
                "VACUUM ANALYZE gga_d".into(),
                "VACUUM ANALYZE gga_f".into(),
            ] {
                c.batch_execute(&sql).map_err(err("sweep tables"))?;
            }
            let cached = simple_value(&mut c, "SELECT uvm.cache_table('gga_f')::text")?;
            if cached != n.to_string() {
                return Err(format!("cache_table('gga_f') returned {cached}, not {n} rows"));
            }
            simple_value(&mut c, "SELECT uvm.cache_table('gga_d')::text")?;
            for (shape, q) in SHAPES {
                let runs = sweep_runs(n);
                let (node_cost, pg_cost) = (top_cost(&mut c, FORCED, q)?, top_cost(&mut c, OFF, q)?);
                c.batch_execute(FORCED).map_err(err("node forced"))?;
                let node_plan = explain(&mut c, q)?;
                let analyzed = try_explain_analyze(&mut c, q).map_err(err("EXPLAIN ANALYZE, node forced"))?;
                if !analyzed.contains("Read From: cache") {
                    return Err(format!(
                        "{n} rows, {shape}: the node forced did not read the cache: {}",
                        analyzed.replace('\n', " / ")
                    ));
                }
                c.batch_execute(OFF).map_err(err("node off"))?;
                let pg_plan = explain(&mut c, q)?;
                c.batch_execute(DEFAULTS).map_err(err("defaults"))?;
                let plan = explain(&mut c, q)?;
                let (auto_t, auto_v) = best_of(&mut c, DEFAULTS, q, runs)?;
                let (node_t, node_v) = best_of(&mut c, FORCED, q, runs)?;
                let (pg_t, pg_v) = best_of(&mut c, OFF, q, runs)?;
                if node_v != pg_v || auto_v != pg_v {
                    return Err(format!("{n} rows, {shape}: node {node_v:?}, auto {auto_v:?}, PostgreSQL {pg_v:?}"));
                }
                let point = SweepPoint { plan: &plan, node_plan: &node_plan, pg_plan: &pg_plan, auto_t, node_t, pg_t };
                let (ratio, line) = point.judge(&format!("{n} rows, {shape}"), "UvmGpuGroupAgg", (node_cost, pg_cost));
                tally.add(ratio, line);
            }
        }
        c.batch_execute("DROP TABLE IF EXISTS gga_f, gga_d; RESET ALL").map_err(err("drop sweep tables"))?;
        Ok(tally)
    })();
    match r {
        Ok(tally) => tally.report(b, K, M),
        Err(e) => {
            // The tables (and their caches) go however the sweep ended.
            if let Ok(mut c) = fresh() {
                let _ = c.batch_execute("DROP TABLE IF EXISTS gga_f, gga_d");
            }
            b.error(K, M, e)
        }
    }
}
