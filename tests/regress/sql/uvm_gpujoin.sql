-- GpuJoin (CPU path): an inner hash table built once in a segment, probed by every parallel
-- worker through the uvm.gpujoin_probe aggregate. Every result is compared with PostgreSQL's
-- own join: count(*) and sum(payload).
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
SELECT count(*) FROM uvm.segments WHERE name = 'gj_bad';

SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name LIKE 'gj_%' ORDER BY name;
DROP TABLE gj_dim, gj_uniform, gj_skewed, gj_all_miss, gj_all_hit, gj_nulls;
