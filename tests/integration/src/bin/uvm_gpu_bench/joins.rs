//! The GpuJoin measurements: the SQL functions and the plan node at 50 M x 5 M, the planner
//! sweep, two-key joins.

use super::*;

/// One worker count's GpuJoin figures.
pub(crate) struct JoinRun {
    pub(crate) workers: i32,
    pub(crate) launched: i64,
    pub(crate) planned_pg: i64,
    pub(crate) planned_scan: i64,
    pub(crate) gpu: Vec<f64>,
    pub(crate) pg: Vec<f64>,
    pub(crate) scan: Vec<f64>,
    /// `count(k)` of fact: a bare scan that reads the key column, as the probe aggregate must
    /// (a floor for any aggregate over the column; the reference `count(*)` reads no column).
    pub(crate) scan_k: Vec<f64>,
    /// GPU memory used before the probe and at its peak (None where nvidia-smi failed)
    pub(crate) mem: Option<(u64, u64)>,
}

pub(crate) fn time_query(c: &mut Client, q: &str) -> R<(f64, Vec<String>)> {
    let t = Instant::now();
    let row = c.query_one(q, &[]).map_err(err(q))?;
    let vals = (0..row.len()).map(|i| row.get::<_, Option<String>>(i).unwrap_or_default()).collect();
    Ok((t.elapsed().as_secs_f64(), vals))
}

/// The best time of `runs` runs of `q` after `settings`, and its answer.
pub(crate) fn best_of(c: &mut Client, settings: &str, q: &str, runs: usize) -> R<(f64, Vec<String>)> {
    c.batch_execute(settings).map_err(err(settings))?;
    let mut t = f64::INFINITY;
    let mut vals = Vec::new();
    for _ in 0..runs {
        let (s, v) = time_query(c, q)?;
        t = t.min(s);
        vals = v;
    }
    Ok((t, vals))
}

/// A timed answer: the best of 3 runs, and the answer's values.
type Timed = (f64, Vec<String>);

/// `q` three ways: the plan with the default settings, then timed (best of 3) with the
/// defaults (the planner's pick), with the node forced (PostgreSQL's joins off) and with the
/// node off.
pub(crate) fn three_ways(c: &mut Client, q: &str) -> R<(String, Timed, Timed, Timed)> {
    three_ways_n(c, q, 3)
}

/// The GpuJoin node forced: on, with PostgreSQL's own joins off.
pub(crate) const NODE_FORCED: &str =
    "SET pg_uvm_share.enable_gpujoin = on; SET enable_hashjoin = off; SET enable_mergejoin = off; SET enable_nestloop = off";

/// [`three_ways`], best of `runs`.
pub(crate) fn three_ways_n(c: &mut Client, q: &str, runs: usize) -> R<(String, Timed, Timed, Timed)> {
    let defaults = "RESET pg_uvm_share.enable_gpujoin; RESET enable_hashjoin; RESET enable_mergejoin; RESET enable_nestloop";
    c.batch_execute(defaults).map_err(err("defaults"))?;
    let plan = explain(c, q)?;
    let auto = best_of(c, defaults, q, runs)?;
    let node = best_of(c, NODE_FORCED, q, runs)?;
    let pg = best_of(c, &format!("{defaults}; SET pg_uvm_share.enable_gpujoin = off"), q, runs)?;
    Ok((plan, auto, node, pg))
}

/// The estimated total costs of `q`'s plan with the GpuJoin node forced (PostgreSQL's joins off)
/// and with the node off, from EXPLAIN's first line; the settings are reset after.
pub(crate) fn estimated_costs(c: &mut Client, q: &str) -> R<(f64, f64)> {
    let node = top_cost(c, NODE_FORCED, q)?;
    let off = "RESET enable_hashjoin; RESET enable_mergejoin; RESET enable_nestloop; SET pg_uvm_share.enable_gpujoin = off";
    let pg = top_cost(c, off, q)?;
    c.batch_execute("RESET pg_uvm_share.enable_gpujoin").map_err(err("reset"))?;
    Ok((node, pg))
}

/// The estimated total cost of `q`'s plan after `settings`, from EXPLAIN's first line.
pub(crate) fn top_cost(c: &mut Client, settings: &str, q: &str) -> R<f64> {
    c.batch_execute(settings).map_err(err(settings))?;
    let rows = c.query(format!("EXPLAIN {q}").as_str(), &[]).map_err(err("EXPLAIN"))?;
    let top = rows.first().map(|r| r.get::<_, String>(0)).unwrap_or_default();
    top.split("..")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("no cost in EXPLAIN's first line: {top}"))
}

/// `q`'s plan (EXPLAIN, COSTS OFF) with the node forced and with the node off; the settings are
/// reset after.
pub(crate) fn plans(c: &mut Client, q: &str) -> R<(String, String)> {
    c.batch_execute(NODE_FORCED).map_err(err("node forced"))?;
    let node = explain(c, q)?;
    let off = "RESET enable_hashjoin; RESET enable_mergejoin; RESET enable_nestloop; SET pg_uvm_share.enable_gpujoin = off";
    c.batch_execute(off).map_err(err("node off"))?;
    let pg = explain(c, q)?;
    c.batch_execute("RESET pg_uvm_share.enable_gpujoin").map_err(err("reset"))?;
    Ok((node, pg))
}

pub(crate) fn explain(c: &mut Client, q: &str) -> R<String> {
    let rows = c.query(format!("EXPLAIN (COSTS OFF) {q}").as_str(), &[]).map_err(err("EXPLAIN"))?;
    Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n"))
}

/// The probe, PostgreSQL's hash join and a bare count(*), with `w` workers on fact. The first
/// answer of PostgreSQL's join becomes `want`, which every later answer must equal.
pub(crate) fn gpujoin_with_workers(
    c: &mut Client,
    w: i32,
    gpu_q: &str,
    pg_q: &str,
    scan_q: &str,
    want: &mut Option<Vec<String>>,
) -> R<JoinRun> {
    c.batch_execute(&format!("ALTER TABLE bench_fact SET (parallel_workers = {w}); SET max_parallel_workers_per_gather = {w}"))
        .map_err(err("set the workers"))?;
    // Launched workers, and GPU memory in use before the probe and at its peak (the workers'
    // CUDA contexts in process mode): one EXPLAIN ANALYZE, which also warms up.
    let mem_before = try_gpu_memory_used_mib().ok();
    let (plan, mem_peak) = with_peak_memory(|| try_explain_analyze(c, gpu_q));
    let mem = mem_before.map(|m| (m, mem_peak));
    let plan = plan.map_err(err("EXPLAIN ANALYZE of the probe"))?;
    let launched = workers_launched(&plan).iter().sum();
    // PostgreSQL's own join: the plan node off (`auto` turns it on under CUDA).
    c.batch_execute("SET pg_uvm_share.enable_gpujoin = off").map_err(err("enable_gpujoin"))?;
    let pg_plan = explain(c, pg_q)?;
    if pg_plan.contains("GpuJoin") || !pg_plan.contains("Hash Join") {
        return Err(format!("{w} workers: PostgreSQL's plan is not a hash join: {}", pg_plan.replace('\n', " / ")));
    }
    let planned_pg = workers_planned(&pg_plan).iter().sum();
    let planned_scan = workers_planned(&explain(c, scan_q)?).iter().sum();
    let (mut gpu, mut pg, mut scan) = (Vec::new(), Vec::new(), Vec::new());
    time_query(c, scan_q)?; // warm the buffers
    for _ in 0..HASH_JOIN_REPEATS {
        let (s, v) = time_query(c, pg_q)?;
        match want {
            None => *want = Some(v),
            Some(w0) if *w0 != v => return Err(format!("{w} workers: PostgreSQL's join answered {v:?}, earlier {w0:?}")),
            Some(_) => {}
        }
        pg.push(s);
    }
    c.batch_execute("RESET pg_uvm_share.enable_gpujoin").map_err(err("enable_gpujoin"))?;
    let mut scan_k = Vec::new();
    let scan_k_q = scan_q.replace("count(*)", "count(k)");
    for _ in 0..JOIN_REPEATS {
        scan.push(time_query(c, scan_q)?.0);
        scan_k.push(time_query(c, &scan_k_q)?.0);
        let (s, v) = time_query(c, gpu_q)?;
        if Some(&v) != want.as_ref() {
            return Err(format!("{w} workers: GpuJoin answered {v:?}, PostgreSQL {want:?}"));
        }
        gpu.push(s);
    }
    Ok(JoinRun { workers: w, launched, planned_pg, planned_scan, gpu, pg, scan, scan_k, mem })
}

/// The same join written as plain SQL, planned as the parallel GpuJoin plan node (issue 12),
/// 5 workers, against PostgreSQL's parallel hash join measured just before with the same
/// workers and a bare parallel count(*) of fact timed between the node's runs (the same
/// moment's machine: runs on different leases saw count(*) anywhere from 0.44 to 0.61 s);
/// then a query returning columns of both sides (a top-N sort over the join), node on vs off.
/// PostgreSQL's joins are turned off while the node runs, as in the regression tests, so that
/// the node is what is timed whatever the planner would pick (its pick is noted).
pub(crate) fn bench_gpujoin_node(
    b: &mut Bench,
    c: &mut Client,
    pg_q: &str,
    scan_q: &str,
    hash_s: f64,
    want: &Option<Vec<String>>,
) {
    const KH: &str = "gj_node_hash";
    const MH: &str =
        "plain SQL join through the parallel GpuJoin plan node, 50 M x 5 M, 5 workers, vs PostgreSQL's parallel hash join (s)";
    const KS: &str = "gj_node_scan";
    const MS: &str =
        "plain SQL join through the parallel GpuJoin plan node, 50 M x 5 M, 5 workers, vs a bare parallel count(*) of fact (s)";
    const KT: &str = "gj_node_topn";
    const MT: &str =
        "columns of both sides through the plan node (join, ORDER BY d.v DESC, f.k LIMIT 10), 5 workers, node on vs off (s)";
    const KR: &str = "gj_node_rows";
    const MR: &str = "the same join with PostgreSQL's aggregate above the node (sum(d.v + 0): not computed in the node), \
                      5 workers, vs PostgreSQL's parallel hash join (s)";
    if !b.has_time(&[(KH, MH), (KS, MS), (KT, MT), (KR, MR)]) {
        return;
    }
    // The aggregate is not one the node computes (an expression as its argument), so the joined
    // rows go up to PostgreSQL's Partial Aggregate: the node as it ran before the push-down.
    let rows_q = "SELECT count(*)::text, sum(d.v + 0)::text FROM bench_fact f JOIN bench_dim d ON f.k = d.k";
    // One row (time_query reads one): the ten rows folded into a text.
    let topn_q = "SELECT string_agg(k::text || '/' || v::text, ' ') FROM (SELECT f.k, d.v FROM bench_fact f \
                  JOIN bench_dim d ON f.k = d.k ORDER BY d.v DESC, f.k LIMIT 10) t";
    // (node runs, workers launched, top-N with the node, top-N without, node with the rows
    // going up to PostgreSQL's aggregate, count(*) runs between the node's)
    type NodeRuns = (Vec<f64>, i64, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);
    let r = (|| -> R<NodeRuns> {
        // What the planner picks by itself with the node allowed and PostgreSQL's joins too, and
        // the estimated costs of both plans (for the cost model, src/node/gpujoin/plan.rs).
        c.batch_execute(
            "ALTER TABLE bench_fact SET (parallel_workers = 5); SET max_parallel_workers_per_gather = 5; \
             SET pg_uvm_share.enable_gpujoin = on",
        )
        .map_err(err("enable_gpujoin"))?;
        let top_cost = |c: &mut Client, q: &str| -> R<String> {
            let rows = c.query(format!("EXPLAIN {q}").as_str(), &[]).map_err(err("EXPLAIN"))?;
            Ok(rows.first().map(|r| r.get::<_, String>(0)).unwrap_or_default().trim().to_string())
        };
        let chosen = top_cost(c, pg_q)?;
        let chosen_rows = top_cost(c, rows_q)?;
        c.batch_execute("SET pg_uvm_share.enable_gpujoin = off").map_err(err("enable_gpujoin"))?;
        let own = top_cost(c, pg_q)?;
        b.note(format!(
            "planner, PostgreSQL's joins allowed: with enable_gpujoin = on it picks `{chosen}` for the count/sum query and \
             `{chosen_rows}` for the sum(d.v + 0) one; with it off, `{own}`"
        ));
        c.batch_execute(NODE_FORCED).map_err(err("enable_gpujoin"))?;
        let plan = try_explain_analyze(c, pg_q).map_err(err("EXPLAIN ANALYZE through the node"))?;
        if !plan.contains("Parallel Custom Scan (UvmGpuJoin)") || !plan.contains("UvmGpuJoinAgg") {
            return Err(format!(
                "the planner did not choose the parallel GpuJoin with its aggregates: {}",
                plan.replace('\n', " / ")
            ));
        }
        let launched: i64 = workers_launched(&plan).iter().sum();
        let (mut node, mut scan) = (Vec::new(), Vec::new());
        for _ in 0..NODE_REPEATS {
            scan.push(time_query(c, scan_q)?.0);
            let (s, vals) = time_query(c, pg_q)?;
            if want.as_ref().is_some_and(|w| *w != vals) {
                return Err(format!("the plan node answered {vals:?}, the other joins {want:?}"));
            }
            node.push(s);
        }
        // Where the node's time goes: EXPLAIN ANALYZE with timing, the node's lines, for the
        // aggregate in the node and for the joined rows.
        for (what, q) in [("the plan node", pg_q), ("the plan node returning rows (sum(d.v + 0))", rows_q)] {
            let rows = c.query(format!("EXPLAIN (ANALYZE, COSTS OFF) {q}").as_str(), &[]).map_err(err("EXPLAIN ANALYZE"))?;
            let lines: Vec<String> = rows
                .iter()
                .map(|r| r.get::<_, String>(0))
                .filter(|l| {
                    ["GpuJoin", "Inner", "Outer Keys", "Batches", "GPU Time", "Seq Scan", "Aggregate", "Execution"]
                        .iter()
                        .any(|w| l.contains(w))
                })
                .map(|l| l.trim().to_string())
                .collect();
            b.note(format!("{what}, EXPLAIN ANALYZE (GPU Time: summed over the participants): {}", lines.join(" / ")));
        }
        let rows_plan = explain(c, rows_q)?;
        if !rows_plan.contains("Parallel Custom Scan (UvmGpuJoin)") || rows_plan.contains("UvmGpuJoinAgg") {
            return Err(format!("the sum(d.v + 0) query is not planned as the node alone: {}", rows_plan.replace('\n', " / ")));
        }
        let mut rows_runs = Vec::new();
        for _ in 0..JOIN_REPEATS {
            let (s, vals) = time_query(c, rows_q)?;
            if want.as_ref().is_some_and(|w| *w != vals) {
                return Err(format!(
                    "the plan node (rows up to PostgreSQL's aggregate) answered {vals:?}, the other joins {want:?}"
                ));
            }
            rows_runs.push(s);
        }
        let (mut on, mut off) = (Vec::new(), Vec::new());
        let mut top: Option<Vec<String>> = None;
        for _ in 0..HASH_JOIN_REPEATS {
            c.batch_execute("SET pg_uvm_share.enable_gpujoin = on; SET enable_hashjoin = off").map_err(err("enable_gpujoin"))?;
            let (s, v) = time_query(c, topn_q)?;
            on.push(s);
            c.batch_execute("SET pg_uvm_share.enable_gpujoin = off; RESET enable_hashjoin").map_err(err("enable_gpujoin"))?;
            let (s2, v2) = time_query(c, topn_q)?;
            off.push(s2);
            if v != v2 || top.as_ref().is_some_and(|t| *t != v) {
                return Err(format!("top-N through the node {v:?}, without {v2:?}"));
            }
            top = Some(v);
        }
        c.batch_execute(
            "RESET pg_uvm_share.enable_gpujoin; RESET max_parallel_workers_per_gather; RESET enable_hashjoin; \
             RESET enable_mergejoin; RESET enable_nestloop",
        )
        .map_err(err("reset"))?;
        Ok((node, launched, on, off, rows_runs, scan))
    })();
    match r {
        Ok((node, launched, on, off, rows_runs, scan)) => {
            let nr = median(&rows_runs);
            b.row(
                KR,
                MR,
                format!("{nr:.2} s = {:.2}x the hash join", nr / hash_s),
                format!("{nr:.2} ({})", list(&rows_runs, 2)),
                format!("{hash_s:.2} PostgreSQL's parallel hash join, 5 workers"),
                Some(nr / hash_s),
                Target::info(),
            );
            let n = median(&node);
            let detail = format!("{n:.2} ({}; {launched} workers launched)", list(&node, 2));
            b.row(
                KH,
                MH,
                format!("{n:.2} s = {:.2}x the hash join", n / hash_s),
                detail.clone(),
                format!("{hash_s:.2} PostgreSQL's parallel hash join, 5 workers"),
                Some(n / hash_s),
                Target::service(Goal::AtMost(NODE_HASH_TARGET)),
            );
            let scan_s = median(&scan);
            b.row(
                KS,
                MS,
                format!("{n:.2} s = {:.2}x count(*)", n / scan_s),
                detail,
                format!("{scan_s:.2} bare parallel count(*), 5 workers, between the node's runs ({})", list(&scan, 2)),
                Some(n / scan_s),
                Target::service(Goal::AtMost(NODE_SCAN_TARGET)),
            );
            let (t_on, t_off) = (median(&on), median(&off));
            b.row(
                KT,
                MT,
                format!("{t_on:.2} s = {:.2}x without the node", t_on / t_off),
                format!("{t_on:.2} ({})", list(&on, 2)),
                format!("{t_off:.2} PostgreSQL's own plan ({})", list(&off, 2)),
                Some(t_on / t_off),
                Target::info(),
            );
        }
        Err(e) => {
            for (k, m) in [(KH, MH), (KS, MS), (KT, MT), (KR, MR)] {
                b.error(k, m, e.clone());
            }
        }
    }
}

/// Makes bench_fact (50 M random int8 keys in [0, 20 M)) and bench_dim (5 M unique keys with a
/// payload), unless an earlier mode's run left them complete.
pub(crate) fn gpujoin_tables(b: &mut Bench, c: &mut Client) -> R<()> {
    let exist: bool = c
        .query_one("SELECT to_regclass('bench_fact') IS NOT NULL AND to_regclass('bench_dim') IS NOT NULL", &[])
        .map_err(err("to_regclass"))?
        .get(0);
    if exist {
        let r = c
            .query_one("SELECT (SELECT count(*) FROM bench_fact), (SELECT count(*) FROM bench_dim)", &[])
            .map_err(err("count the tables"))?;
        let (f, d): (i64, i64) = (r.get(0), r.get(1));
        if (f, d) == (FACT_ROWS, DIM_ROWS) {
            b.note(format!("fact ({FACT_ROWS} rows) and dim ({DIM_ROWS}): the tables of the earlier mode's run, the same data"));
            return Ok(());
        }
        b.note(format!("fact and dim found with {f} and {d} rows (reset by a crash restart?): made again"));
    }
    let t = Instant::now();
    for q in [
        "DROP TABLE IF EXISTS bench_fact, bench_dim".to_string(),
        format!("CREATE UNLOGGED TABLE bench_dim AS SELECT i::bigint AS k, i::bigint AS v FROM generate_series(1, {DIM_ROWS}) i"),
        format!(
            "CREATE UNLOGGED TABLE bench_fact AS SELECT (random() * {KEY_RANGE})::bigint AS k FROM generate_series(1, {FACT_ROWS})"
        ),
        "VACUUM ANALYZE bench_dim".into(),
        "VACUUM ANALYZE bench_fact".into(),
    ] {
        c.batch_execute(&q).map_err(err(&q))?;
    }
    b.note(format!("generated fact ({FACT_ROWS} rows) and dim ({DIM_ROWS}) in {:.0} s", t.elapsed().as_secs_f64()));
    Ok(())
}

/// GpuJoin on the data of shared/notes/gpu-facts.md: PostgreSQL's parallel hash join, the GPU
/// probe aggregate and a bare parallel count(*) of fact, with 5 and with 8 workers; the probe
/// kernel alone; the materializing join.
/// Whether `enable_gpujoin = auto` (the default) picks a plan within 1.25x of the faster of the
/// GpuJoin plan node and PostgreSQL's own (issue 24, point 5): fact tables of 20 K to 50 M rows,
/// dims a tenth of that, keys uniform (a quarter of fact's keys match) or Zipf-like
/// (log-uniform over the same range: small keys, which match, dominate); three query shapes:
/// the count/sum join whose aggregates the node computes in its probe, an aggregate it cannot
/// compute (`sum(d.v + 0)`, over the joined rows it returns), and columns of both sides under
/// ORDER BY ... LIMIT. Each point timed with the node forced (PostgreSQL's joins off), with
/// PostgreSQL's plan (node off), and as `auto` plans it; best of 5 up to 2 M rows (a few
/// milliseconds each, where one slow run would decide), 3 at 20 M, 2 at 50 M. Where `auto`'s
/// plan is the same as one of the other two (EXPLAIN's text), its time is that plan's best over
/// both series. Each point also
/// notes both plans' estimated total costs, from which the cost model's constants are fitted
/// (src/node/gpujoin/plan.rs).
///
/// The row-returning shape orders by an expression over both sides (`f.k + d.v`), so that every
/// plan forms the whole join. Ordered by `d.v DESC, f.k` instead (the first sweep), PostgreSQL
/// walks the dim in that order under a nested loop over the materialized fact and stops at the
/// first match: its time is a draw on the data (330 ms at 50 M Zipf, 6 s at 20 M Zipf, with
/// estimates alike), which no cost model can place.
pub(crate) fn bench_gpujoin_planner(b: &mut Bench) {
    const K: &str = "gj_auto";
    const M: &str = "enable_gpujoin = auto within 1.25x of the faster plan: fact 20 K to 50 M rows, dim a tenth, uniform and \
                     Zipf keys, the aggregate in the node, above it, and joined rows under ORDER BY ... LIMIT";
    if !b.has_time(&[(K, M)]) {
        return;
    }
    const SIZES: [i64; 5] = [20_000, 200_000, 2_000_000, 20_000_000, 50_000_000];
    const SHAPES: [(&str, &str); 3] = [
        ("count/sum", "SELECT count(*)::text, sum(d.v)::text FROM gj_sw_f f JOIN gj_sw_d d ON f.k = d.k"),
        ("sum(d.v + 0)", "SELECT count(*)::text, sum(d.v + 0)::text FROM gj_sw_f f JOIN gj_sw_d d ON f.k = d.k"),
        (
            "rows, ORDER BY ... LIMIT",
            "SELECT f.k::text, d.v::text FROM gj_sw_f f JOIN gj_sw_d d ON f.k = d.k ORDER BY f.k + d.v DESC, f.k LIMIT 1",
        ),
    ];
    let r = (|| -> R<SweepTally> {
        let mut c = fresh()?;
        let mut tally = SweepTally::default();
        for n in SIZES {
            let d = n / 10;
            for (dist, keys) in [
                ("uniform", format!("(random() * {})::bigint", 4 * d)),
                ("Zipf", format!("floor(exp(random() * ln({})))::bigint", 4 * d)),
            ] {
                // One statement per call: VACUUM cannot run in the implicit transaction of a batch.
                for sql in [
                    "DROP TABLE IF EXISTS gj_sw_f, gj_sw_d".to_string(),
                    format!(
                        "CREATE UNLOGGED TABLE gj_sw_d AS SELECT i::bigint AS k, i::bigint AS v FROM generate_series(1, {d}) i"
                    ),
                    format!("CREATE UNLOGGED TABLE gj_sw_f AS SELECT {keys} AS k FROM generate_series(1, {n})"),
                    "VACUUM ANALYZE gj_sw_d".into(),
                    "VACUUM ANALYZE gj_sw_f".into(),
                ] {
                    c.batch_execute(&sql).map_err(err("sweep tables"))?;
                }
                for (shape, q) in SHAPES {
                    let runs = sweep_runs(n);
                    let (node_cost, pg_cost) = estimated_costs(&mut c, q)?;
                    let (node_plan, pg_plan) = plans(&mut c, q)?;
                    let (plan, (auto_t, auto_v), (node_t, node_v), (pg_t, pg_v)) = three_ways_n(&mut c, q, runs)?;
                    if node_v != pg_v || auto_v != pg_v {
                        return Err(format!("{n} x {d}, {dist}, {shape}: node {node_v:?}, auto {auto_v:?}, PostgreSQL {pg_v:?}"));
                    }
                    let point = SweepPoint { plan: &plan, node_plan: &node_plan, pg_plan: &pg_plan, auto_t, node_t, pg_t };
                    let (ratio, line) = point.judge(&format!("{n} x {d}, {dist}, {shape}"), "GpuJoin", (node_cost, pg_cost));
                    tally.add(ratio, line);
                }
            }
        }
        c.batch_execute("DROP TABLE IF EXISTS gj_sw_f, gj_sw_d; RESET ALL").map_err(err("drop sweep tables"))?;
        Ok(tally)
    })();
    match r {
        Ok(tally) => tally.report(b, K, M),
        Err(e) => b.error(K, M, e),
    }
}

/// The runs of each plan at a sweep point of `n` fact rows, the best of which counts: 5 up to
/// 2 M rows, 3 up to 20 M, 2 beyond.
pub(crate) fn sweep_runs(n: i64) -> usize {
    if n <= 2_000_000 {
        5
    } else if n <= 20_000_000 {
        3
    } else {
        2
    }
}

/// A planner sweep's points so far: how many, how many within 1.25x, the worst ratio, and
/// each point's line for the report.
#[derive(Default)]
pub(crate) struct SweepTally {
    points: usize,
    within: usize,
    worst: f64,
    lines: Vec<String>,
}

impl SweepTally {
    pub(crate) fn add(&mut self, ratio: f64, line: String) {
        self.points += 1;
        self.within += usize::from(ratio <= 1.25);
        self.worst = self.worst.max(ratio);
        self.lines.push(line);
    }

    /// The sweep's row in the report (`key`, `metric`).
    pub(crate) fn report(self, b: &mut Bench, key: &str, metric: &str) {
        let SweepTally { points, within, worst, lines } = self;
        b.row(
            key,
            metric,
            format!("{within} of {points} points within 1.25x (worst {worst:.2}x)"),
            lines.join("; "),
            "the faster of the node forced and PostgreSQL's plan, best of 5 (3 at 20 M rows, 2 at 50 M) each".into(),
            Some(within as f64 / points as f64),
            Target::info(),
        );
    }
}

/// One point of a planner sweep: the plan the defaults chose and its time, against the node
/// forced and the node off (plans and best times).
pub(crate) struct SweepPoint<'a> {
    pub plan: &'a str,
    pub node_plan: &'a str,
    pub pg_plan: &'a str,
    pub auto_t: f64,
    pub node_t: f64,
    pub pg_t: f64,
}

impl SweepPoint<'_> {
    /// The defaults' time over the faster plan's, and the point's line for the report (`node`:
    /// the node's name in plans; `costs`: both plans' estimates). Where the defaults' plan is
    /// one of the two timed (the same EXPLAIN), its time is that plan's, best of both series:
    /// at a few milliseconds, two series of one plan differ by more than 1.25x from run-to-run
    /// noise alone.
    pub(crate) fn judge(&self, label: &str, node: &str, (node_cost, pg_cost): (f64, f64)) -> (f64, String) {
        let picks = self.plan.contains(node);
        let same = if self.plan == self.node_plan {
            Some(self.node_t)
        } else if self.plan == self.pg_plan {
            Some(self.pg_t)
        } else {
            None
        };
        let pick_t = same.map_or(self.auto_t, |t| t.min(self.auto_t));
        let ratio = pick_t / self.node_t.min(self.pg_t);
        let line = format!(
            "{label}: node {:.1} ms, PostgreSQL's plan {:.1} ms (estimated {node_cost:.0} and {pg_cost:.0}); auto picks {}{} \
             ({:.1} ms as auto ran it, {ratio:.2}x){}",
            self.node_t * 1e3,
            self.pg_t * 1e3,
            if picks { node } else { "PostgreSQL's plan" },
            if same.is_some() { ", the same plan" } else { ", another plan" },
            self.auto_t * 1e3,
            if ratio <= 1.25 { "" } else { ": **past 1.25x**" }
        );
        (ratio, line)
    }
}

/// Issue 22's join on two keys, 2 M rows a side (`a = i % 10`, `b = i`): hashing `a` alone
/// formed 400 billion pairs and ran past 90 s under the default `auto`. Timed with the defaults
/// (the planner's pick), the node forced and PostgreSQL's plan, best of 3 each; the ratio is
/// the slower of the first two against `1.5 x PostgreSQL's + 1 s`, the bound.
pub(crate) fn bench_gpujoin_two_keys(b: &mut Bench) {
    const K: &str = "gj_two_keys";
    const M: &str = "a join on two keys (a = a AND b = b), 2 M rows a side: default settings and the node forced, \
                     against 1.5 x PostgreSQL's plan + 1 s";
    if !b.has_time(&[(K, M)]) {
        return;
    }
    let r = (|| -> R<(f64, String)> {
        let mut c = fresh()?;
        for sql in [
            "DROP TABLE IF EXISTS gj_mk1, gj_mk2",
            "CREATE UNLOGGED TABLE gj_mk1 AS SELECT i % 10 AS a, i AS b FROM generate_series(1, 2000000) i",
            "CREATE UNLOGGED TABLE gj_mk2 AS SELECT i % 10 AS a, i AS b, i % 100 AS w FROM generate_series(1, 2000000) i",
            "VACUUM ANALYZE gj_mk1",
            "VACUUM ANALYZE gj_mk2",
            "SET statement_timeout = '60s'",
        ] {
            c.batch_execute(sql).map_err(err("two-key tables"))?;
        }
        let q = "SELECT count(*)::text, sum(mk2.w)::text FROM gj_mk1 mk1 JOIN gj_mk2 mk2 ON mk1.a = mk2.a AND mk1.b = mk2.b";
        let (plan, (auto_t, auto_v), (node_t, node_v), (pg_t, pg_v)) = three_ways(&mut c, q)?;
        let picks = plan.contains("UvmGpuJoin");
        c.batch_execute("DROP TABLE IF EXISTS gj_mk1, gj_mk2; RESET ALL").map_err(err("drop two-key tables"))?;
        if node_v != pg_v || auto_v != pg_v {
            return Err(format!("node {node_v:?}, auto {auto_v:?}, PostgreSQL {pg_v:?}"));
        }
        let bound = 1.5 * pg_t + 1.0;
        let key = plan.lines().find(|l| l.contains("GpuJoin Key")).map_or(String::new(), |l| format!(" ({})", l.trim()));
        Ok((
            auto_t.max(node_t) / bound,
            format!(
                "auto picks {} ({:.1} ms){key}; node forced {:.1} ms; PostgreSQL's plan {:.1} ms ({:.2}x)",
                if picks { "UvmGpuJoin" } else { "PostgreSQL's plan" },
                auto_t * 1e3,
                node_t * 1e3,
                pg_t * 1e3,
                node_t / pg_t
            ),
        ))
    })();
    match r {
        Ok((ratio, value)) => b.row(
            K,
            M,
            format!("{ratio:.2} of the bound"),
            value,
            "PostgreSQL's plan, best of 3".into(),
            Some(ratio),
            Target::both(Goal::AtMost(1.0)).saying("≤ 1.5x PostgreSQL + 1 s"),
        ),
        Err(e) => b.error(K, M, e),
    }
}

pub(crate) fn bench_gpujoin(b: &mut Bench, admin: &mut Client, pid: u32, keep_tables: bool) {
    let keys: Vec<(String, String)> = JOIN_WORKERS
        .iter()
        .flat_map(|w| {
            [
                (
                    format!("gj_scan_{w}"),
                    format!("GpuJoin probe vs a bare parallel count(*) of fact, 50 M x 5 M, {w} workers (s)"),
                ),
                (
                    format!("gj_hash_{w}"),
                    format!("GpuJoin probe vs PostgreSQL's parallel hash join, 50 M x 5 M, {w} workers (s)"),
                ),
            ]
        })
        .collect();
    const K_KERNEL: &str = "gj_kernel";
    const M_KERNEL: &str = "GpuJoin probe kernel alone, 4 Mi keys vs the 5 M-row table (M keys/s)";
    const K_MAT: &str = "gj_mat";
    const M_MAT: &str =
        "GpuJoin materialize (all 12.5 M pairs into a result buffer grown from 64 Ki pairs), 5 workers, vs PostgreSQL's join count (s)";
    let mut figures: Vec<(&str, &str)> = keys.iter().map(|(k, m)| (k.as_str(), m.as_str())).collect();
    figures.extend([(K_KERNEL, M_KERNEL), (K_MAT, M_MAT)]);
    if !b.has_time(&figures) {
        return;
    }
    let fail_all = |b: &mut Bench, e: String| {
        for (k, m) in &figures {
            b.error(k, m, e.clone());
        }
    };
    let seg = format!("gpu_bench_dim_{pid}");
    let mut c = match fresh() {
        Ok(c) => c,
        Err(e) => return fail_all(b, e),
    };
    let setup = (|| -> R<()> {
        gpujoin_tables(b, &mut c)?;
        c.batch_execute("SET work_mem = '1GB'").map_err(err("work_mem"))?;
        drop_if_exists(&mut c, &seg);
        let (build_s, _) = time_query(&mut c, &format!("SELECT uvm.gpujoin_build('{seg}', 'SELECT k, v FROM bench_dim')::text"))?;
        let dev: i64 =
            c.query_one("SELECT device_bytes FROM uvm.segments WHERE name = $1", &[&seg]).map_err(err("segments"))?.get(0);
        b.note(format!("gpujoin_build of dim ({DIM_ROWS} rows) in {build_s:.2} s; inner table {} MiB on the device", dev >> 20));
        Ok(())
    })();
    if let Err(e) = setup {
        fail_all(b, e);
        drop_if_exists(admin, &seg);
        return;
    }
    let mut want: Option<Vec<String>> = None;
    let pg_q = "SELECT count(*)::text, sum(d.v)::text FROM bench_fact f JOIN bench_dim d ON f.k = d.k";
    let gpu_q =
        format!("SELECT m.matches::text, m.payload_sum::text FROM (SELECT (uvm.gpujoin_probe('{seg}', k)).* FROM bench_fact) m");
    let scan_q = "SELECT count(*)::text FROM bench_fact";
    let mut probe_s = None;
    let mut pg_s = None;
    for (i, w) in JOIN_WORKERS.iter().enumerate() {
        let (ks, ms) = &keys[2 * i];
        let (kh, mh) = &keys[2 * i + 1];
        if !b.has_time(&[(ks, ms), (kh, mh)]) {
            continue;
        }
        match gpujoin_with_workers(&mut c, *w, &gpu_q, pg_q, scan_q, &mut want) {
            Ok(r) => {
                let (gm, pgm, sm) = (median(&r.gpu), median(&r.pg), median(&r.scan));
                if r.workers == 5 {
                    probe_s = Some(gm);
                    pg_s = Some(pgm);
                }
                let launched = if r.launched == r.workers as i64 {
                    format!("{} workers launched", r.launched)
                } else {
                    format!("**{} workers launched**", r.launched)
                };
                b.row(
                    ks,
                    ms,
                    format!("{gm:.2} s = {:.2}x count(*)", gm / sm),
                    format!("{gm:.2} ({}; {launched})", list(&r.gpu, 2)),
                    format!("{sm:.2} count(*), {} workers planned ({})", r.planned_scan, list(&r.scan, 2)),
                    Some(gm / sm),
                    Target::service(Goal::AtMost(SCAN_TARGET)),
                );
                b.row(
                    kh,
                    mh,
                    format!("{gm:.2} s = {:.2}x hash join", gm / pgm),
                    format!("{gm:.2}"),
                    format!("{pgm:.2} PostgreSQL, {} workers planned ({})", r.planned_pg, list(&r.pg, 2)),
                    Some(gm / pgm),
                    Target::service(Goal::AtMost(HASH_TARGET)),
                );
                let memory = match r.mem {
                    Some((before, peak)) => {
                        let extra = peak.saturating_sub(before);
                        let per = match r.launched {
                            0 => String::new(),
                            n => format!(", ~{} MiB per worker", extra / n as u64),
                        };
                        format!("GPU memory in use {before} MiB before the query, {peak} MiB at its peak: +{extra} MiB while it ran{per}")
                    }
                    None => "GPU memory not sampled (nvidia-smi failed)".into(),
                };
                b.note(format!(
                    "{w} workers asked, {} launched: probe {gm:.2} s ({:.0} M keys/s end to end); {memory}; \
                     count(k) of fact, which reads the key as the probe does, {:.2} s = {:.2}x count(*) ({}), the probe {:.2}x it",
                    r.launched,
                    FACT_ROWS as f64 / 1e6 / gm,
                    median(&r.scan_k),
                    median(&r.scan_k) / sm,
                    list(&r.scan_k, 2),
                    gm / median(&r.scan_k)
                ));
            }
            Err(e) => {
                b.error(ks, ms, e.clone());
                b.error(kh, mh, e);
            }
        }
    }
    if let Some(pgm) = pg_s {
        bench_gpujoin_node(b, &mut c, pg_q, scan_q, pgm, &want);
    }
    if let Some(w) = &want {
        b.note(format!("every join answered {} matches, payload sum {}", w[0], w.get(1).cloned().unwrap_or_default()));
    }
    let r = (|| -> R<()> {
        c.batch_execute("ALTER TABLE bench_fact SET (parallel_workers = 5); SET max_parallel_workers_per_gather = 5")
            .map_err(err("workers"))?;
        let kq = format!("SELECT uvm.bench_join_probe('{seg}', 4194304, {KEY_RANGE})");
        let kps: f64 = c.query_one(kq.as_str(), &[]).map_err(err("bench_join_probe"))?.get(0);
        let (value, baseline, ratio) = match probe_s {
            Some(gm) => (
                format!("{:.0}", kps / 1e6),
                format!("{:.0} M keys/s end to end, 5 workers", FACT_ROWS as f64 / 1e6 / gm),
                Some(kps / 1e6 / (FACT_ROWS as f64 / 1e6 / gm)),
            ),
            None => (format!("{:.0}", kps / 1e6), "–".into(), None),
        };
        b.row(K_KERNEL, M_KERNEL, format!("{:.0} M keys/s", kps / 1e6), value, baseline, ratio, Target::info());
        Ok(())
    })();
    if let Err(e) = r {
        b.error(K_KERNEL, M_KERNEL, e);
    }
    bench_gpus_sessions(b, &mut c, &seg);
    let res = format!("gpu_bench_pairs_{pid}");
    let r = (|| -> R<()> {
        if !b.has_time(&[(K_MAT, M_MAT)]) {
            return Ok(());
        }
        let want = want.clone().ok_or("no answer of PostgreSQL's join to compare with (it did not run)")?;
        drop_if_exists(&mut c, &res);
        c.query_one("SELECT uvm.gpujoin_pairs_create($1, 65536)", &[&res]).map_err(err("gpujoin_pairs_create"))?;
        let mq = format!(
            "SELECT m.matches::text, m.payload_sum::text FROM (SELECT (uvm.gpujoin_materialize('{seg}', '{res}', k)).* FROM bench_fact) m"
        );
        let (ms, mvals) = time_query(&mut c, &mq)?;
        if mvals != want {
            return Err(format!("materialize: different answers: PostgreSQL {want:?}, GpuJoin {mvals:?}"));
        }
        let r = c
            .query_one("SELECT size, device_bytes, host_bytes, chunks::bigint FROM uvm.segments WHERE name = $1", &[&res])
            .map_err(err("segments"))?;
        let (size, dev, host, chunks): (i64, i64, i64, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
        let r = c
            .query_one("SELECT count(*), sum(payload)::text FROM uvm.gpujoin_pairs($1)", &[&res])
            .map_err(err("gpujoin_pairs"))?;
        let (n, sum): (i64, String) = (r.get(0), r.get(1));
        if n.to_string() != want[0] || Some(&sum) != want.get(1) {
            return Err(format!("materialized pairs read back: {n} pairs, sum {sum}; PostgreSQL {want:?}"));
        }
        let (baseline, ratio) = match pg_s {
            Some(p) => (format!("{p:.2} PostgreSQL's join, count only, 5 workers"), Some(ms / p)),
            None => ("–".into(), None),
        };
        b.row(K_MAT, M_MAT, format!("{ms:.2} s"), format!("{ms:.2}"), baseline, ratio, Target::info());
        b.note(format!(
            "materialized result buffer: {n} pairs read back (same count and sum as PostgreSQL's join); {} MiB in {chunks} chunks ({} MiB device, {} MiB host)",
            size >> 20,
            dev >> 20,
            host >> 20
        ));
        Ok(())
    })();
    if let Err(e) = r {
        b.error(K_MAT, M_MAT, e);
    }
    drop_if_exists(&mut c, &res);
    drop_if_exists(admin, &seg);
    if keep_tables {
        b.note("fact and dim kept for the next mode's run".into());
    } else if let Err(e) = c.batch_execute("DROP TABLE bench_fact, bench_dim") {
        b.other_errors.push(format!("drop the GpuJoin tables: {}", describe(&e)));
    }
}
