//! GpuJoin through a real client, on whatever provider the cluster has (CI: the host provider,
//! so the CPU path; the GPU suite runs the same checks on the GPU in gpu.rs): the probe
//! aggregate and the materializing join against PostgreSQL's own join on uniform, Zipf,
//! all-miss, all-hit and NULL-containing outer sides, int8 and int4 keys, with parallel workers.

use pg_uvm_share_tests::*;

#[test]
fn materialized_pairs_equal_the_join_as_a_multiset() {
    let p = unique_name("gjm");
    let mut c = connect();
    gpujoin_tables(&mut c, &p, 20_000, 150_000);
    let (inner, inner4, result) = (format!("{p}_ht"), format!("{p}_ht4"), format!("{p}_pairs"));
    let _guard = SegmentGuard::with(&[&inner, &inner4, &result]);
    let dim = format!("{p}_dim");
    c.query_one("SELECT uvm.gpujoin_build($1, $2)", &[&inner, &format!("SELECT k, v FROM {dim}")]).expect("build int8");
    c.query_one("SELECT uvm.gpujoin_build($1, $2)", &[&inner4, &format!("SELECT k::int, v FROM {dim} WHERE k BETWEEN -2147483648 AND 2147483647 OR k IS NULL")])
        .expect("build int4");
    let small = PairsBuffer { name: &result, initial: 16, tier: "auto" };
    for suffix in GPUJOIN_OUTERS {
        let outer = format!("{p}_{suffix}");
        let matches = probe_and_compare(&mut c, &inner, &outer, &dim, "k");
        // a buffer of 16 pairs: every worker has to grow it, more than once
        let m = materialize_and_compare(&mut c, &inner, small, &outer, &dim, "k");
        assert_eq!(m.pairs as i64, matches, "{outer}: pairs vs the probe's matches");
        assert!(m.workers > 0, "{outer}: no parallel workers launched");
        if m.pairs > 16 {
            assert!(m.buffer_bytes >= 64 + 16 * m.pairs as i64, "{outer}: buffer of {} bytes for {} pairs", m.buffer_bytes, m.pairs);
        }
        eprintln!("{outer}: {} pairs, {} workers, buffer {} bytes, {:.0} ms", m.pairs, m.workers, m.buffer_bytes, m.ms);
    }
    let m = materialize_and_compare(&mut c, &inner4, small, &format!("{p}_all_hit"), &dim, "k::int");
    assert!(m.pairs > 150_000 && m.workers > 0, "{m:?}");
    // a large buffer from the start needs no growth
    let m = materialize_and_compare(&mut c, &inner, PairsBuffer { initial: 1 << 20, ..small }, &format!("{p}_uniform"), &dim, "k");
    assert_eq!(m.buffer_bytes, 64 + (16i64 << 20));
    drop_gpujoin_tables(&mut c, &p);
}
