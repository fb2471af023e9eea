//! GpuJoin through a real client, on whatever provider the cluster has (CI: the host provider,
//! so the CPU path; the GPU suite runs the same checks on the GPU in gpu.rs): the probe
//! aggregate and the materializing join against PostgreSQL's own join on uniform, Zipf,
//! all-miss, all-hit and NULL-containing outer sides, int8 and int4 keys, with parallel workers.

use pg_uvm_share_tests::*;

#[test]
fn materialized_pairs_equal_the_join_as_a_multiset() {
    let mut c = connect();
    let f = GpujoinFixture::new(&mut c, "gjm", 20_000, 150_000);
    let _guard = SegmentGuard::with(&f.segments());
    let (inner, inner4, dim) = (&f.inner, &f.inner4, &f.dim);
    let small = PairsBuffer { name: &f.result, initial: 16, tier: "auto" };
    for suffix in GPUJOIN_OUTERS {
        let outer = f.outer(suffix);
        let matches = probe_and_compare(&mut c, inner, &outer, dim, "k");
        // a buffer of 16 pairs: every worker has to grow it, more than once
        let m = materialize_and_compare(&mut c, inner, small, &outer, dim, "k");
        assert_eq!(m.pairs as i64, matches, "{outer}: pairs vs the probe's matches");
        assert!(m.workers > 0, "{outer}: no parallel workers launched");
        if m.pairs > 16 {
            assert!(
                m.buffer_bytes >= 64 + 16 * m.pairs as i64,
                "{outer}: buffer of {} bytes for {} pairs",
                m.buffer_bytes,
                m.pairs
            );
        }
        eprintln!("{outer}: {} pairs, {} workers, buffer {} bytes, {:.0} ms", m.pairs, m.workers, m.buffer_bytes, m.ms);
    }
    let m = materialize_and_compare(&mut c, inner4, small, &f.outer("all_hit"), dim, "k::int");
    assert!(m.pairs > 150_000 && m.workers > 0, "{m:?}");
    // a large buffer from the start needs no growth
    let m = materialize_and_compare(&mut c, inner, PairsBuffer { initial: 1 << 20, ..small }, &f.outer("uniform"), dim, "k");
    assert_eq!(m.buffer_bytes, 64 + (16i64 << 20));
    f.drop_tables(&mut c);
}

/// Two sessions append to one result buffer at the same time, each with parallel workers: the
/// buffer grows under both, and holds exactly both joins' pairs.
#[test]
fn two_sessions_materialize_into_one_buffer() {
    let mut c = connect();
    let f = GpujoinFixture::new(&mut c, "gj2", 20_000, 150_000);
    let _guard = SegmentGuard::with(&f.segments());
    let (inner, result, p) = (&f.inner, &f.result, &f.p);
    c.query_one("SELECT uvm.gpujoin_pairs_create($1, 16)", &[&result]).expect("pairs_create");
    let sessions: Vec<_> = ["zipf", "all_hit"]
        .into_iter()
        .map(|suffix| {
            let q = format!(
                "SELECT (uvm.gpujoin_materialize({}, {}, k)).matches FROM {p}_{suffix}",
                quote_literal(inner),
                quote_literal(result)
            );
            std::thread::spawn(move || {
                let mut s = connect();
                s.batch_execute(
                    "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
                     SET max_parallel_workers_per_gather = 2;",
                )
                .unwrap();
                s.query_one(q.as_str(), &[]).unwrap_or_else(|e| panic!("{q}: {}", describe(&e))).get::<_, i64>(0)
            })
        })
        .collect();
    let matches: i64 = sessions.into_iter().map(|t| t.join().expect("session")).sum();
    let ours: Vec<(i64, i64)> = c
        .query("SELECT key, payload FROM uvm.gpujoin_pairs($1) ORDER BY 1, 2", &[result])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let theirs: Vec<(i64, i64)> = c
        .query(
            format!(
                "SELECT o.k, coalesce(d.v, 0) FROM (SELECT k FROM {p}_zipf UNION ALL SELECT k FROM {p}_all_hit) o
                   JOIN {p}_dim d ON o.k = d.k ORDER BY 1, 2"
            )
            .as_str(),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(matches as usize, theirs.len());
    assert!(ours == theirs, "two sessions' pairs: {} in the buffer, {} in the joins", ours.len(), theirs.len());
    f.drop_tables(&mut c);
}
