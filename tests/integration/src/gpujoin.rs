//! GpuJoin: `EXPLAIN ANALYZE`, the fixture tables, and the aggregates compared with PostgreSQL's join.

use crate::*;

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
