-- GpuJoin (CPU path): an inner hash table built once in a segment, probed by every parallel
-- worker through the uvm.gpujoin_probe aggregate, and the materializing mode, where every
-- worker appends the matched pairs to one shared result buffer that grows on demand. Every
-- result is compared with PostgreSQL's own join: count(*), sum(payload), and the pairs as a
-- multiset.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- inner side: 20000 unique int8 keys, 2000 keys duplicated 3 more times, some NULL keys,
-- some NULL payloads, and extreme key values
CREATE TABLE gj_dim (k bigint, v bigint);
INSERT INTO gj_dim SELECT i, i * 7 FROM generate_series(1, 20000) i;
INSERT INTO gj_dim SELECT i, -i FROM generate_series(1, 2000) i, generate_series(1, 3);
INSERT INTO gj_dim VALUES (NULL, 5), (NULL, 6), (9223372036854775807, 1), (-9223372036854775808, 2), (0, NULL);
-- outer sides
CREATE TABLE gj_uniform AS SELECT ((i::bigint * 2654435761) % 40000) AS k FROM generate_series(1, 200000) i;
-- skewed: Zipf-like, key 1000/r for rank r
CREATE TABLE gj_skewed AS SELECT (1000 / (1 + (i % 997)))::bigint AS k FROM generate_series(1, 200000) i;
CREATE TABLE gj_all_miss AS SELECT (100000 + i)::bigint AS k FROM generate_series(1, 50000) i;
CREATE TABLE gj_all_hit AS SELECT (1 + i % 20000)::bigint AS k FROM generate_series(1, 50000) i;
CREATE TABLE gj_nulls AS SELECT CASE WHEN i % 3 = 0 THEN NULL ELSE (i % 25000)::bigint END AS k FROM generate_series(1, 60000) i;
INSERT INTO gj_uniform VALUES (9223372036854775807), (-9223372036854775808), (0), (NULL);
ANALYZE gj_dim, gj_uniform, gj_skewed, gj_all_miss, gj_all_hit, gj_nulls;

SELECT uvm.gpujoin_build('gj_ht8', 'SELECT k, v FROM gj_dim') AS rows_read;
SELECT name, size > 0 AS has_size, host_bytes > 0 AS in_memory FROM uvm.segments WHERE name = 'gj_ht8';

SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;

-- the plan: Partial Aggregate under Gather, and the workers really run
EXPLAIN (COSTS OFF) SELECT (uvm.gpujoin_probe('gj_ht8', k)).* FROM gj_uniform;
CREATE FUNCTION pg_temp.workers_launched(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    IF l ~ 'Workers Launched' THEN RETURN trim(l); END IF;
  END LOOP;
  RETURN 'no workers launched';
END $$;
SELECT pg_temp.workers_launched($$SELECT (uvm.gpujoin_probe('gj_ht8', k)).* FROM gj_uniform$$);

-- same answers as PostgreSQL's join, on every distribution
CREATE FUNCTION pg_temp.compare(outer_table text, seg text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE ours record; theirs record;
BEGIN
  EXECUTE format('SELECT (uvm.gpujoin_probe(%L, k)).* FROM %I', seg, outer_table) INTO ours;
  EXECUTE format('SELECT count(*) AS matches, sum(d.v) AS payload_sum FROM %I o JOIN gj_dim d ON o.k = d.k', outer_table) INTO theirs;
  RETURN format('%s: %s matches, sum %s, %s', outer_table, ours.matches, ours.payload_sum,
                CASE WHEN ours.matches = theirs.matches AND ours.payload_sum IS NOT DISTINCT FROM theirs.payload_sum
                     THEN 'same as the join' ELSE format('JOIN SAYS %s / %s', theirs.matches, theirs.payload_sum) END);
END $$;
SELECT pg_temp.compare('gj_uniform', 'gj_ht8');
SELECT pg_temp.compare('gj_skewed', 'gj_ht8');
SELECT pg_temp.compare('gj_all_miss', 'gj_ht8');
SELECT pg_temp.compare('gj_all_hit', 'gj_ht8');
SELECT pg_temp.compare('gj_nulls', 'gj_ht8');
-- grouped, and serial (no workers): the same
SELECT k % 3 AS g, (uvm.gpujoin_probe('gj_ht8', k)).* FROM gj_uniform GROUP BY 1 ORDER BY 1;
SELECT o.k % 3 AS g, count(*), sum(d.v) FROM gj_uniform o JOIN gj_dim d ON o.k = d.k GROUP BY 1 ORDER BY 1;
SET max_parallel_workers_per_gather = 0;
SELECT pg_temp.compare('gj_uniform', 'gj_ht8');
RESET max_parallel_workers_per_gather;
-- an empty outer side: no matches, NULL sum (as sum() of the join)
SELECT (uvm.gpujoin_probe('gj_ht8', k)).* FROM gj_uniform WHERE false;

-- int4 keys
SELECT uvm.gpujoin_build('gj_ht4', 'SELECT k::int, v FROM gj_dim WHERE k BETWEEN -2147483648 AND 2147483647 OR k IS NULL') AS rows_read;
SELECT (uvm.gpujoin_probe('gj_ht4', k::int)).* FROM gj_all_hit;
SELECT count(*), sum(d.v) FROM gj_all_hit o JOIN gj_dim d ON o.k = d.k;

-- names that are not constants are checked on every row: the same name passes, two fail
CREATE TABLE gj_names AS SELECT 'gj_ht8'::text AS seg, k FROM gj_all_hit;
SELECT (uvm.gpujoin_probe(seg, k)).* FROM gj_names;
SET max_parallel_workers_per_gather = 0; -- (serial: the first row decides which name the message quotes first)
SELECT pg_temp.try($$SELECT (uvm.gpujoin_probe(CASE WHEN k % 2 = 0 THEN 'gj_ht8' ELSE 'gj_ht4' END, k)).* FROM gj_all_hit$$);
RESET max_parallel_workers_per_gather;

-- materializing mode: a result buffer of 16 pairs that every worker appends to, growing it
-- whenever an append would overflow; the pairs read back equal the join's as a multiset (a
-- NULL payload is stored as 0)
SELECT uvm.gpujoin_pairs_create('gj_pairs', 16) AS capacity;
SELECT name, size FROM uvm.segments WHERE name = 'gj_pairs';
EXPLAIN (COSTS OFF) SELECT (uvm.gpujoin_materialize('gj_ht8', 'gj_pairs', k)).* FROM gj_uniform;
SELECT pg_temp.workers_launched($$SELECT (uvm.gpujoin_materialize('gj_ht8', 'gj_pairs', k)).* FROM gj_uniform$$);
-- what those workers appended, against the join
SELECT size > 64 + 16 * 16 AS grew FROM uvm.segments WHERE name = 'gj_pairs';
SELECT count(*) AS pairs FROM uvm.gpujoin_pairs('gj_pairs');
SELECT count(*) AS not_in_join FROM (SELECT key, payload FROM uvm.gpujoin_pairs('gj_pairs')
  EXCEPT ALL SELECT o.k, coalesce(d.v, 0) FROM gj_uniform o JOIN gj_dim d ON o.k = d.k) x;
SELECT count(*) AS missing FROM (SELECT o.k, coalesce(d.v, 0) FROM gj_uniform o JOIN gj_dim d ON o.k = d.k
  EXCEPT ALL SELECT key, payload FROM uvm.gpujoin_pairs('gj_pairs')) x;
CREATE FUNCTION pg_temp.compare_pairs(outer_table text, seg text, key_expr text DEFAULT 'k') RETURNS text LANGUAGE plpgsql AS $$
DECLARE ours record; n bigint; extra bigint; missing bigint; size0 bigint; size1 bigint;
BEGIN
  PERFORM uvm.drop_segment('gj_pairs');
  PERFORM uvm.gpujoin_pairs_create('gj_pairs', 16);
  SELECT size INTO size0 FROM uvm.segments WHERE name = 'gj_pairs';
  EXECUTE format('SELECT (uvm.gpujoin_materialize(%L, %L, %s)).* FROM %I', seg, 'gj_pairs', key_expr, outer_table) INTO ours;
  SELECT size INTO size1 FROM uvm.segments WHERE name = 'gj_pairs';
  SELECT count(*) INTO n FROM uvm.gpujoin_pairs('gj_pairs');
  EXECUTE format('SELECT count(*) FROM (SELECT key, payload FROM uvm.gpujoin_pairs(%L) EXCEPT ALL
                  SELECT o.k, coalesce(d.v, 0) FROM %I o JOIN gj_dim d ON o.k = d.k) x', 'gj_pairs', outer_table) INTO extra;
  EXECUTE format('SELECT count(*) FROM (SELECT o.k, coalesce(d.v, 0) FROM %I o JOIN gj_dim d ON o.k = d.k EXCEPT ALL
                  SELECT key, payload FROM uvm.gpujoin_pairs(%L)) x', outer_table, 'gj_pairs') INTO missing;
  RETURN format('%s: %s pairs (aggregate: %s, sum %s), %s not in the join, %s of the join missing, buffer grew: %s',
                outer_table, n, ours.matches, ours.payload_sum, extra, missing, size1 > size0 OR n <= 16);
END $$;
SELECT pg_temp.compare_pairs('gj_uniform', 'gj_ht8');
SELECT pg_temp.compare_pairs('gj_skewed', 'gj_ht8');
SELECT pg_temp.compare_pairs('gj_all_miss', 'gj_ht8');
SELECT pg_temp.compare_pairs('gj_all_hit', 'gj_ht8');
SELECT pg_temp.compare_pairs('gj_nulls', 'gj_ht8');
SELECT pg_temp.compare_pairs('gj_all_hit', 'gj_ht4', 'k::int');
SET max_parallel_workers_per_gather = 0;
SELECT pg_temp.compare_pairs('gj_skewed', 'gj_ht8');
RESET max_parallel_workers_per_gather;
-- appending again adds to the buffer
SELECT (uvm.gpujoin_materialize('gj_ht8', 'gj_pairs', k)).matches FROM gj_skewed;
SELECT count(*) FROM uvm.gpujoin_pairs('gj_pairs');
-- a buffer that may not grow enough: the append fails, and the buffer says it is incomplete
-- (serial, so that the numbers in the messages are the same every time)
SELECT uvm.gpujoin_pairs_create('gj_small', 16, 1000) AS capacity;
SET max_parallel_workers_per_gather = 0;
SELECT pg_temp.try($$SELECT (uvm.gpujoin_materialize('gj_ht8', 'gj_small', k)).* FROM gj_all_hit$$);
RESET max_parallel_workers_per_gather;
SELECT pg_temp.try($$SELECT count(*) FROM uvm.gpujoin_pairs('gj_small')$$);

-- bad inputs
SELECT pg_temp.try($$SELECT (uvm.gpujoin_probe('gj_missing', k)).* FROM gj_all_hit$$);
SELECT uvm.create_segment('gj_plain', 4096) > 0 AS created;
SELECT pg_temp.try($$SELECT (uvm.gpujoin_probe('gj_plain', k)).* FROM gj_all_hit$$);
SELECT pg_temp.try($$SELECT (uvm.gpujoin_probe('gj_ht8', k::int)).* FROM gj_all_hit$$);
SELECT pg_temp.try($$SELECT (uvm.gpujoin_probe('gj_ht4', k)).* FROM gj_all_hit$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gj_bad', 'SELECT k::text, v FROM gj_dim')$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gj_bad', 'SELECT k FROM gj_dim')$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gj_bad', 'SELECT k, v::numeric FROM gj_dim')$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gj_ht8', 'SELECT k, v FROM gj_dim')$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gj_bad', 'SELECT k, v FROM no_such_table')$$);
SELECT pg_temp.try($$SELECT (uvm.gpujoin_probe(NULL, k)).* FROM gj_all_hit$$);
SELECT pg_temp.try($$SELECT (uvm.gpujoin_materialize('gj_ht8', 'gj_missing', k)).* FROM gj_all_hit$$);
SELECT pg_temp.try($$SELECT (uvm.gpujoin_materialize('gj_ht8', 'gj_plain', k)).* FROM gj_all_hit$$);
SELECT pg_temp.try($$SELECT (uvm.gpujoin_materialize('gj_ht8', NULL, k)).* FROM gj_all_hit$$);
SELECT pg_temp.try($$SELECT (uvm.gpujoin_materialize('gj_ht4', 'gj_pairs', k)).* FROM gj_all_hit$$);
SELECT pg_temp.try($$SELECT * FROM uvm.gpujoin_pairs('gj_missing')$$);
SELECT pg_temp.try($$SELECT * FROM uvm.gpujoin_pairs('gj_plain')$$);
SELECT pg_temp.try($$SELECT * FROM uvm.gpujoin_pairs('gj_ht8')$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_pairs_create('gj_bad', -1)$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_pairs_create('gj_bad', 100, 10)$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_pairs_create('gj_pairs')$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_pairs_create('gj_bad', 16, NULL, 'nowhere')$$);
SELECT count(*) FROM uvm.segments WHERE name = 'gj_bad';

SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name LIKE 'gj_%' ORDER BY name;
DROP TABLE gj_dim, gj_uniform, gj_skewed, gj_all_miss, gj_all_hit, gj_nulls, gj_names;
