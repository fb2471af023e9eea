//! Column caches whose segments were overwritten (a cache's segments are memory any process
//! holding their fds can write, so their bytes are not trusted): each test writes into the
//! broker's memfds (the host provider's chunks, as in CI) in ways the format alone cannot tell,
//! and checks that readers answer with 22023 naming the cache, never with a wrong answer, and
//! answer as before once the bytes are put back. (`cache.rs` holds the caches' concurrency
//! tests.)

use pg_uvm_share_tests::*;
use std::time::Duration;

/// A cache's segments are memory, not trusted: a dictionary string that is not valid in the
/// database's encoding (written into the broker's memfd here, as any process holding the fd
/// could) must not reach a result. It did: `GROUP BY` over the cache returned the bytes as
/// `text`, and `CREATE TABLE AS` stored them, after which every read of that table failed with
/// "invalid byte sequence" (an adversarial session's finding). Now it is an ERROR (22023) naming
/// the corrupted cache; put back, the same query answers. Likewise a dictionary holding one
/// string under two codes.
#[test]
fn a_corrupted_dictionary_string_is_an_error_not_a_stored_value() {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut c = connect();
    let broker = wait_broker(&mut c, Duration::from_secs(10));
    let t = unique_name("dict_bad");
    c.batch_execute(&format!(
        "CREATE TABLE {t} (k int4, s text); \
         INSERT INTO {t} SELECT g, CASE WHEN g % 2 = 0 THEN '{t}-even' ELSE '{t}-oddy' END \
         FROM generate_series(1, 1000) g; ANALYZE {t}"
    ))
    .unwrap();
    c.query_one(&format!("SELECT uvm.cache_table('{t}')"), &[]).unwrap();
    // (a table this small is PostgreSQL's by cost: its own grouping is turned off)
    c.batch_execute("SET enable_hashagg = off; SET enable_sort = off").unwrap();
    let q = format!("SELECT s, count(*) FROM {t} GROUP BY s");
    let plan: Vec<String> = c.query(&format!("EXPLAIN (COSTS OFF) {q}"), &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert!(plan.iter().any(|l| l.contains("UvmGpuGroupAgg")), "the node reads the cache: {plan:?}");
    let answer = |c: &mut postgres::Client| -> Result<Vec<(String, i64)>, String> {
        let mut rows: Vec<(String, i64)> =
            c.query(&q, &[]).map(|rows| rows.iter().map(|r| (r.get(0), r.get(1))).collect()).map_err(|e| describe(&e))?;
        rows.sort();
        Ok(rows)
    };
    let want = vec![(format!("{t}-even"), 500), (format!("{t}-oddy"), 500)];
    assert_eq!(answer(&mut c).unwrap(), want);

    // The dictionary's memfd at the broker: the one whose header is a dictionary's and whose
    // strings are this table's (its name is in them). Its first string's first byte ('i', of
    // the name) becomes 0xF0.
    let (mut f, at) = broker_memfd(broker, b"UVMDICT1", |f, head| {
        let word = |i: usize| u64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().unwrap());
        let (bytes, strings_at) = (word(3), word(5));
        let mut strings = vec![0u8; bytes.min(4096) as usize];
        (f.seek(SeekFrom::Start(strings_at)).is_ok() && f.read_exact(&mut strings).is_ok() && strings.starts_with(t.as_bytes()))
            .then_some(strings_at)
    })
    .expect("the cache's dictionary among the broker's memfds");
    let poke = |f: &mut std::fs::File, b: u8| {
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&[b]).unwrap();
    };
    poke(&mut f, 0xF0);
    let got = answer(&mut c);
    let stored = c.batch_execute(&format!("CREATE TABLE {t}_copy AS {q}")).map_err(|e| describe(&e));
    poke(&mut f, t.as_bytes()[0]);
    let err = got.expect_err("GROUP BY over a dictionary with an invalid string");
    assert!(err.contains("22023") && err.contains("dictionary is corrupted"), "{err}");
    let err = stored.expect_err("CREATE TABLE AS over a dictionary with an invalid string");
    assert!(err.contains("22023"), "{err}");
    // Put back: the same answer as before.
    assert_eq!(answer(&mut c).unwrap(), want);
    // The second string (of the same length) overwritten with the first: two codes of one
    // string, whose groups came out twice under one key. Now 22023 too.
    let len = t.len() as u64 + 5;
    let mut first = vec![0u8; len as usize];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut first).unwrap();
    let was = poke_bytes(&mut f, at + len, &first);
    let got = answer(&mut c);
    poke_bytes(&mut f, at + len, &was);
    let err = got.expect_err("GROUP BY over a dictionary holding one string twice");
    assert!(err.contains("22023") && err.contains("hold one string"), "{err}");
    assert_eq!(answer(&mut c).unwrap(), want);
    c.batch_execute(&format!("SELECT uvm.cache_drop('{t}'); DROP TABLE {t}")).unwrap();
}

/// The first memfd the broker holds (the host provider's chunks: CI's) whose first 64 bytes
/// start with `magic` and for which `pick` (the file, those bytes) answers: opened to read and
/// write, with that answer.
fn broker_memfd<T>(
    broker: i32,
    magic: &[u8; 8],
    mut pick: impl FnMut(&mut std::fs::File, &[u8; 64]) -> Option<T>,
) -> Option<(std::fs::File, T)> {
    use std::io::Read;
    for e in std::fs::read_dir(format!("/proc/{broker}/fd")).unwrap().flatten() {
        let is_memfd = std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:"));
        let Ok(mut f) = std::fs::OpenOptions::new().read(true).write(true).open(e.path()) else { continue };
        let mut head = [0u8; 64];
        if !is_memfd || f.read_exact(&mut head).is_err() || &head[..8] != magic {
            continue;
        }
        if let Some(v) = pick(&mut f, &head) {
            return Some((f, v));
        }
    }
    None
}

/// Writes `bytes` at `at` of `f`, returning what was there.
fn poke_bytes(f: &mut std::fs::File, at: u64, bytes: &[u8]) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut was = vec![0u8; bytes.len()];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut was).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(bytes).unwrap();
    was
}

/// A cache segment overwritten in ways its format alone cannot tell (every offset still in
/// bounds) must fail with 22023 naming the cache, never answer (an adversarial session's
/// findings: a header whose `rows` was 0 made the GpuJoin node's join over the cache empty; a
/// column entry whose encoding or attribute number changed was read as that column; a block's
/// count lowered dropped rows; an appended row's words were taken whatever they held, a bool of 7
/// included). Each case is
/// put back, and the same query answers as before. The layout is read once per process, so
/// each case asks from a fresh connection.
#[test]
fn a_cache_overwritten_within_its_bounds_is_an_error_not_an_answer() {
    use std::io::{Read, Seek, SeekFrom};
    let mut c = connect();
    let broker = wait_broker(&mut c, Duration::from_secs(10));
    let t = unique_name("cache_bad");
    c.batch_execute(&format!(
        "CREATE TABLE {t} (k int4, b bool, d date); \
         INSERT INTO {t} SELECT g, g % 3 = 0, date '2000-01-01' + g FROM generate_series(1, 1000) g"
    ))
    .unwrap();
    c.query_one(&format!("SELECT uvm.cache_table('{t}')"), &[]).unwrap();
    let oid: u32 = c.query_one(&format!("SELECT '{t}'::regclass::oid"), &[]).unwrap().get(0);
    let fold = |col: &str| -> Result<(i64, i64, Option<String>, String), String> {
        let mut c = connect();
        let r = c
            .query_one(&format!("SELECT rows, non_null, sum::text, source FROM uvm.cache_fold('{t}', '{col}')"), &[])
            .map_err(|e| describe(&e))?;
        Ok((r.get(0), r.get(1), r.get(2), r.get(3)))
    };
    let want_k = (1000, 1000, Some("500500".to_string()), "cache".to_string());
    assert_eq!(fold("k").unwrap(), want_k);
    // The cache's segment: the column cache whose header names this table (relid at 56).
    let (mut f, data_offset) = broker_memfd(broker, b"UVMCOLS1", |_, head| {
        let relid = u32::from_le_bytes(head[56..60].try_into().unwrap());
        (relid == oid).then(|| u64::from_le_bytes(head[32..40].try_into().unwrap()))
    })
    .expect("the cache's segment among the broker's memfds");
    let expect_corrupted = |f: &mut std::fs::File, what: &str, at: u64, bytes: &[u8], col: &str| {
        let was = poke_bytes(f, at, bytes);
        let got = fold(col);
        poke_bytes(f, at, &was);
        let err = got.expect_err(what);
        assert!(err.contains("22023") && err.contains("overwritten"), "{what}: {err}");
        assert_eq!(fold("k").unwrap(), want_k, "{what}, put back");
    };
    // the header's rows (at 48): 0, and one short
    expect_corrupted(&mut f, "header rows 0", 48, &0u64.to_le_bytes(), "k");
    expect_corrupted(&mut f, "header rows 999", 48, &999u64.to_le_bytes(), "k");
    // block 0's count (its first word) one short: the fold counts the blocks' rows
    let mut count = [0u8; 8];
    f.seek(SeekFrom::Start(data_offset)).unwrap();
    f.read_exact(&mut count).unwrap();
    let n = u64::from_le_bytes(count);
    assert!(n > 0, "block 0 holds rows");
    expect_corrupted(&mut f, "block 0 one row short", data_offset, &(n - 1).to_le_bytes(), "k");

    // The GpuJoin node over both caches, the dimension's block 0 one row short: its table
    // from the cache counts the rows it read (the kernels too).
    c.batch_execute(&format!(
        "CREATE TABLE {t}_d AS SELECT g::int4 AS k, g::int8 AS v FROM generate_series(1, 100) g; \
         SELECT uvm.cache_table('{t}_d')"
    ))
    .unwrap();
    let doid: u32 = c.query_one(&format!("SELECT '{t}_d'::regclass::oid"), &[]).unwrap().get(0);
    let join = "SET pg_uvm_share.enable_gpujoin = on; SET enable_hashjoin = off; SET enable_mergejoin = off; \
                SET enable_nestloop = off; SET max_parallel_workers_per_gather = 0";
    let q = format!("SELECT count(*), sum(d.v)::int8 FROM {t} f JOIN {t}_d d ON f.k = d.k");
    let joined = |q: &str| -> Result<(i64, i64), String> {
        let mut c = connect();
        c.batch_execute(join).unwrap();
        c.query_one(q, &[]).map(|r| (r.get(0), r.get(1))).map_err(|e| describe(&e))
    };
    let plan: Vec<String> = {
        let mut c = connect();
        c.batch_execute(join).unwrap();
        c.query(&format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {q}"), &[]).unwrap().iter().map(|r| r.get(0)).collect()
    };
    assert!(plan.iter().any(|l| l.contains("Read From: column caches")), "the node reads both caches: {plan:?}");
    assert_eq!(joined(&q).unwrap(), (100, 5050));
    let (mut df, d_data) = broker_memfd(broker, b"UVMCOLS1", |_, head| {
        (u32::from_le_bytes(head[56..60].try_into().unwrap()) == doid)
            .then(|| u64::from_le_bytes(head[32..40].try_into().unwrap()))
    })
    .expect("the dimension's cache among the broker's memfds");
    let was = poke_bytes(&mut df, d_data, &99u64.to_le_bytes());
    let got = joined(&q);
    poke_bytes(&mut df, d_data, &was);
    let err = got.expect_err("the join over a block one row short");
    assert!(err.contains("22023") && err.contains("blocks hold 99 rows"), "{err}");
    assert_eq!(joined(&q).unwrap(), (100, 5050), "put back");

    // An appended row's words (the tail's records, read on the CPU): b's word 7, d's a day
    // past PostgreSQL's dates.
    c.batch_execute(&format!("INSERT INTO {t} VALUES (1001, true, date '2030-01-01')")).unwrap();
    let want_b = fold("b").unwrap();
    assert_eq!((want_b.0, want_b.1, want_b.3.as_str()), (1001, 1001, "cache"), "the row appended to the tail");
    let (mut tail, record_at) = broker_memfd(broker, b"UVMTAIL1", |_, head| {
        let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap());
        let relid = u32::from_le_bytes(head[24..28].try_into().unwrap());
        let (columns, capacity) = (u32::from_le_bytes(head[12..16].try_into().unwrap()) as u64, word(16));
        // (row 0's record: after the header's 64 bytes and the stamps, 8-aligned; the mask word,
        // then a word per column)
        (relid == oid && columns == 3).then(|| 64 + (4 * capacity).div_ceil(8) * 8)
    })
    .expect("the cache's tail among the broker's memfds");
    for (what, col, word) in [("a bool of 7", 1u64, 7u64), ("a date past the last", 2, 2_145_031_949)] {
        let at = record_at + 8 + 8 * col;
        let was = poke_bytes(&mut tail, at, &word.to_le_bytes());
        let got = fold(if col == 1 { "b" } else { "d" });
        poke_bytes(&mut tail, at, &was);
        let err = got.expect_err(what);
        assert!(err.contains("22023") && err.contains("appended row 0"), "{what}: {err}");
    }
    assert_eq!(fold("b").unwrap(), want_b, "put back");

    // Column 0's entry (at 128) whose encoding Int4 (3) reads as Date (7), of the same width:
    // a column the catalog does not have, as in a cache of the table as it was before an
    // ALTER TABLE (see `a_cache_built_before_an_alter_it_waited_for_is_stale`). The cache is
    // made stale and the heap answers, the same rows.
    let was = poke_bytes(&mut f, 128, &7u16.to_le_bytes());
    let got = fold("k");
    poke_bytes(&mut f, 128, &was);
    assert_eq!(got.unwrap(), (1001, 1001, Some("501501".to_string()), "heap".to_string()), "column 0 read as a date");
    assert_eq!(cache_state(&mut c, &t).map(|s| s.0).as_deref(), Some("stale"));
    c.batch_execute(&format!("SELECT uvm.cache_drop('{t}'); SELECT uvm.cache_drop('{t}_d'); DROP TABLE {t}, {t}_d")).unwrap();
}

/// A build that took its table's lock before an `ALTER TABLE` or a `TRUNCATE` that had already
/// marked the database's caches (its mark runs before the statement takes its lock) published a
/// cache of the table as it was: `k` cached as `int4` while the catalog, once the ALTER
/// committed, says `int8`; 101 rows cached of a table truncated. Such a cache stayed ready
/// (found by a review). The statement now marks its table again when it ends, under its lock:
/// the cache is stale, and the heap answers.
#[test]
fn a_cache_built_before_an_alter_it_waited_for_is_stale() {
    built_before("ALTER TABLE {t} ALTER COLUMN k TYPE int8", (101, Some("5151")));
    built_before("TRUNCATE {t}", (0, None));
}

/// The race above, with `statement` (`{t}`: the table) as the one that queues behind the build;
/// `want`: the table's rows and sum of `k` after it.
fn built_before(statement: &str, want: (i64, Option<&str>)) {
    let mut c = connect();
    let t = unique_name("cache_alter");
    c.batch_execute(&format!(
        "CREATE TABLE {t} (k int4); INSERT INTO {t} SELECT generate_series(1, 100); \
         CREATE TABLE {t}_other (k int4); INSERT INTO {t}_other VALUES (1); SELECT uvm.cache_table('{t}_other')"
    ))
    .unwrap();
    // W holds the table's RowExclusiveLock, so that the build (B) waits for it; the ALTER (A)
    // queues behind B, and runs once B has published.
    let mut w = connect();
    w.batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES (101)")).unwrap();
    let pid_of = |c: &mut postgres::Client| -> i32 { c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0) };
    let waiting = |c: &mut postgres::Client, pid: i32| -> bool {
        c.query_one("SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .unwrap()
            .get(0)
    };
    let mut b = connect();
    let bpid = pid_of(&mut b);
    let tb = t.clone();
    let builder = std::thread::spawn(move || {
        b.query_one(&format!("SELECT uvm.cache_table('{tb}')"), &[]).map(|_| ()).map_err(|e| describe(&e))
    });
    let until = |c: &mut postgres::Client, pid: i32| {
        let t0 = std::time::Instant::now();
        while !waiting(c, pid) {
            assert!(t0.elapsed() < Duration::from_secs(30), "backend {pid} never waited for the lock");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    until(&mut c, bpid);
    let mut a = connect();
    let apid = pid_of(&mut a);
    let ta = t.clone();
    let sql = statement.replace("{t}", &ta);
    let alter = std::thread::spawn(move || a.batch_execute(&sql).map_err(|e| describe(&e)));
    until(&mut c, apid);
    w.batch_execute("COMMIT").unwrap();
    builder.join().unwrap().expect("the build");
    alter.join().unwrap().expect(statement);
    let state = cache_state(&mut c, &t).map(|s| s.0);
    assert!(state.as_deref() != Some("ready"), "the cache of the table before `{statement}` stayed ready: {state:?}");
    let r = connect().query_one(&format!("SELECT rows, sum::text FROM uvm.cache_fold('{t}', 'k')"), &[]).unwrap();
    assert_eq!((r.get::<_, i64>(0), r.get::<_, Option<String>>(1)), (want.0, want.1.map(String::from)), "after `{statement}`");
    c.batch_execute(&format!("SELECT uvm.cache_drop('{t}'); SELECT uvm.cache_drop('{t}_other'); DROP TABLE {t}, {t}_other"))
        .unwrap();
}
