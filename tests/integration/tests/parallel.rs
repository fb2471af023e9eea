//! Parallel workers read segments: uvm.read_segment is evaluated inside a parallel scan, and
//! the workers show up in uvm.attachments while they run, in service mode too where the segment
//! is in the host tier and its chunks are memfds (the host provider; `pg_uvm_share.map_host_tier`);
//! otherwise they map nothing and send every read to the GPU service, which alone is attached.

use pg_uvm_share_tests::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROWS: i64 = 200_000;

/// Byte k of the test segment.
fn byte_at(k: i64) -> i64 {
    (k * 7 + 3) % 256
}

fn setup_parallel(c: &mut Client) {
    c.batch_execute(
        "SET parallel_setup_cost = 0;
         SET parallel_tuple_cost = 0;
         SET min_parallel_table_scan_size = 0;
         SET max_parallel_workers_per_gather = 2;",
    )
    .and_then(|()| c.batch_execute(FORCE_PARALLEL_SQL))
    .expect("parallel settings");
}

/// The query that reads the segment once per row; every row matches when the data is right.
fn count_query(seg: &str, table: &str, extra: &str) -> String {
    format!(
        "SELECT count(*) FROM {table} \
          WHERE get_byte(uvm.read_segment({seg}, (i % 16)::bigint, 1), 0) = ((i % 16) * 7 + 3) % 256 {extra}",
        seg = quote_literal(seg)
    )
}

#[test]
fn parallel_workers_read_segments() {
    let seg = unique_name("par");
    let table = unique_name("par_t");
    let _guard = SegmentGuard::with(&[&seg]);
    let mut a = connect();
    let seg_id = create_segment(&mut a, &seg, MIB as i64);
    let bytes: Vec<u8> = (0..16).map(|k| byte_at(k) as u8).collect();
    write_segment(&mut a, &seg, 0, &bytes);

    a.batch_execute(&format!(
        "DROP TABLE IF EXISTS {table};
         CREATE TABLE {table} (i int NOT NULL);
         INSERT INTO {table} SELECT g FROM generate_series(1, {ROWS}) g;
         ANALYZE {table};"
    ))
    .expect("create test table");

    setup_parallel(&mut a);

    // The plan is parallel, workers are launched, and every row sees the right byte.
    let q = count_query(&seg, &table, "");
    let n: i64 = a.query_one(q.as_str(), &[]).expect("parallel count").get(0);
    assert_eq!(n, ROWS, "rows whose byte matched");

    let plan = explain_analyze(&mut a, &q);
    let launched = workers_launched(&plan);
    assert!(launched.iter().any(|&w| w > 0), "no parallel workers launched (is uvm.read_segment PARALLEL SAFE?):\n{plan}");

    // Sum over all rows as a second check of the values the workers read.
    let sum: i64 = a
        .query_one(
            format!(
                "SELECT sum(get_byte(uvm.read_segment({}, (i % 16)::bigint, 1), 0))::bigint FROM {table}",
                quote_literal(&seg)
            )
            .as_str(),
            &[],
        )
        .unwrap()
        .get(0);
    let want: i64 = (1..=ROWS).map(|i| byte_at(i % 16)).sum();
    assert_eq!(sum, want, "sum of bytes read in the parallel scan");

    // A slow parallel query in session A (on a thread); session B must see a parallel worker
    // attached to the segment while it runs. One row in 20 sleeps 1 ms: a few seconds in all.
    let slow_q = count_query(&seg, &table, "AND (i % 20 <> 0 OR pg_sleep(0.001) IS NOT NULL)");
    // Session B, and the service's counters, before the query starts (else its first reads
    // would fall before the snapshot).
    let mut b = connect();
    let mode = execution(&mut b);
    // Whether the workers read the (host-tier) segment through their own mappings: always in
    // process mode, and in service mode on the host provider (`pg_uvm_share.map_host_tier`).
    let local = maps_host_tier(&mut b);
    let requests_before = service_requests(&mut b);
    let reads_before = service_ops(&mut b, BYTE_OPS);
    let done = Arc::new(AtomicBool::new(false));
    let done2 = done.clone();
    let worker = std::thread::spawn(move || {
        let r = a.query_one(slow_q.as_str(), &[]).map(|r| r.get::<_, i64>(0));
        done2.store(true, Ordering::SeqCst);
        (a, r)
    });

    let start = Instant::now();
    let mut seen: Option<(i32, String)> = None;
    let mut polls = 0;
    while !done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(120) {
        polls += 1;
        let rows = b
            .query(
                "SELECT a.pid, s.backend_type::text \
                   FROM uvm.attachments a JOIN pg_stat_activity s ON s.pid = a.pid \
                  WHERE (a.segment::text = $1 OR a.segment::text = $2) \
                    AND s.backend_type = 'parallel worker'",
                &[&seg, &seg_id.to_string()],
            )
            .expect("poll uvm.attachments");
        if let Some(r) = rows.first() {
            seen = Some((r.get(0), r.get(1)));
            if local {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut a, r) = worker.join().expect("slow query thread panicked");
    let n = r.expect("slow parallel query failed");
    assert_eq!(n, ROWS, "slow parallel query result");
    match mode {
        _ if local => {
            assert!(
                seen.is_some(),
                "no 'parallel worker' row in uvm.attachments for {seg} during the slow query \
                 ({polls} polls over {:?})",
                start.elapsed()
            );
            if mode == Execution::Process {
                assert_eq!(service_requests(&mut b), requests_before, "process mode: requests went to the GPU service");
            } else {
                assert_eq!(
                    service_ops(&mut b, BYTE_OPS),
                    reads_before,
                    "the workers' reads of host-tier bytes went to the service"
                );
            }
        }
        Execution::Process => unreachable!("a process-mode session maps the host tier"),
        Execution::Service => {
            assert!(seen.is_none(), "service mode: a parallel worker mapped {seg}: {seen:?} ({polls} polls)");
            // Every row's read went to the service (one request each), and the service alone
            // maps the segment.
            let after = service_requests(&mut b);
            assert!(
                after.completed - requests_before.completed >= ROWS,
                "service mode: {} requests completed during a query of {ROWS} reads",
                after.completed - requests_before.completed
            );
            let service = service_pid(&mut b);
            let attached: Vec<i32> = b
                .query("SELECT pid FROM uvm.attachments WHERE segment::text = $1", &[&seg])
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            assert_eq!(attached, vec![service], "service mode: the processes attached to {seg}");
        }
    }

    // Workers are gone afterwards; their attachment rows too.
    let gone = wait_until(Duration::from_secs(10), || {
        let n: i64 = b
            .query_one(
                "SELECT count(*) FROM uvm.attachments a JOIN pg_stat_activity s ON s.pid = a.pid \
                  WHERE (a.segment::text = $1 OR a.segment::text = $2) AND s.backend_type = 'parallel worker'",
                &[&seg, &seg_id.to_string()],
            )
            .unwrap()
            .get(0);
        n == 0
    });
    assert!(gone, "parallel workers still listed as attached after the query finished");

    a.batch_execute(&format!("DROP TABLE {table}")).unwrap();
    drop_segment(&mut a, &seg);
}
