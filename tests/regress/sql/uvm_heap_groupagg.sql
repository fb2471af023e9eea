-- GpuGroupAgg over the heap (issue 27, point 1): where the fact table has no ready column
-- cache, the node scans its heap serially, lays the rows out in column batches of the cache's
-- format and runs the same scan program over each (conditions, star joins, groups and
-- aggregates). Every answer is compared with PostgreSQL's (the node off); each query also
-- says whether the planner used the node. `gpugroupagg_heap = on` offers it on any provider
-- (off by default; auto: under CUDA only). Both modes.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;
SET max_parallel_workers_per_gather = 0;
SET pg_uvm_share.gpugroupagg_heap = on;
CREATE TABLE ha (id int8, a int4, b int2, d date, ts timestamp, ok bool, v int8, w int4, f float8, y float4,
                 t text, n numeric(10, 2));
INSERT INTO ha SELECT i, i % 7, (i % 5)::int2, date '2020-01-01' + (i % 11),
       timestamp '2020-01-01 00:00' + (i % 3) * interval '1 hour', i % 4 = 0, i * 3,
       CASE WHEN i % 13 = 0 THEN NULL ELSE i % 100 END, i / 3.0, ((i % 300) - 150) / 3.0, 'x' || (i % 9), i / 7.0
  FROM generate_series(1, 30000) i;
INSERT INTO ha VALUES (0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  (-1, 1, 1, '2020-01-02', NULL, false, -5, 7, 'NaN', '-0', 'x1', 1.5);
ANALYZE ha;

CREATE FUNCTION pg_temp.explain_lines(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    RETURN NEXT line;
  END LOOP;
END $$;
-- q with the node allowed and with it off: whether the plan has the node, where an execution
-- of it read from, and whether both answers are the same multiset of rows.
CREATE FUNCTION pg_temp.ha(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  node boolean := false;
  read_from text := '';
  line text;
  a text[];
  b text[];
BEGIN
  FOR line IN SELECT * FROM pg_temp.explain_lines(q) LOOP
    node := node OR line LIKE '%UvmGpuGroupAgg%';
    IF line LIKE '%Read From:%' AND line NOT LIKE '%Dimensions Read From:%' THEN
      read_from := ', ' || trim(split_part(line, 'Read From:', 2));
    END IF;
  END LOOP;
  EXECUTE format('SELECT coalesce(array_agg(r::text ORDER BY r::text), ''{}'') FROM (%s) r', q) INTO a;
  PERFORM set_config('pg_uvm_share.enable_gpugroupagg', 'off', true);
  EXECUTE format('SELECT coalesce(array_agg(r::text ORDER BY r::text), ''{}'') FROM (%s) r', q) INTO b;
  PERFORM set_config('pg_uvm_share.enable_gpugroupagg', 'on', true);
  RETURN CASE WHEN node THEN 'node' ELSE 'postgres' END || read_from || ', ' || cardinality(a) || ' rows, '
         || CASE WHEN a = b THEN 'same' ELSE 'DIFFERENT: ' || a::text || ' vs ' || b::text END;
END $$;

-- the plan: the fact's scan below the node has no Filter (the program tests the conditions;
-- conditions most rows pass, so that the node, which lays out every row, is the cheaper plan)
EXPLAIN (COSTS OFF)
SELECT a, count(*), sum(v), min(w), max(b) FROM ha WHERE d >= '2020-01-02' AND w BETWEEN 5 AND 99 GROUP BY a ORDER BY a;
SELECT a, count(*), sum(v), min(w), max(b) FROM ha WHERE d >= '2020-01-02' AND w BETWEEN 5 AND 99 GROUP BY a ORDER BY a;
-- (off: PostgreSQL's plan, and only caches are read)
SET pg_uvm_share.gpugroupagg_heap = off;
EXPLAIN (COSTS OFF) SELECT a, count(*) FROM ha GROUP BY a;
SET pg_uvm_share.gpugroupagg_heap = on;
-- PostgreSQL's grouping plans priced out (as its enable_* settings do), so that the node's
-- answer is tested where a selective condition makes PostgreSQL's plan the cheaper one (the
-- node lays out every row's columns before its program tests them)
SET enable_hashagg = off;
SET enable_sort = off;
-- (a plan without the lines PostgreSQL 18 adds for a node its settings disable: the
-- fallback's HashAggregate)
CREATE FUNCTION pg_temp.plan(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP
    IF line NOT LIKE '%Disabled: true%' THEN
      RETURN NEXT line;
    END IF;
  END LOOP;
END $$;

-- every key type, NULL groups, the aggregates with NULLs, every kind of condition
SELECT pg_temp.ha('SELECT a, count(*), count(w), sum(w), sum(v), sum(b), min(w), max(w), min(v), max(b), avg(w), avg(v) FROM ha GROUP BY a');
SELECT pg_temp.ha('SELECT b, d, count(*) FROM ha GROUP BY b, d');
SELECT pg_temp.ha('SELECT ts, ok, count(*), sum(w) FROM ha GROUP BY ts, ok');
SELECT pg_temp.ha('SELECT count(*), sum(v), min(w), max(w) FROM ha');
SELECT pg_temp.ha('SELECT count(*), sum(v), min(w), max(w), count(w) FROM ha WHERE a = 100');
SELECT pg_temp.ha('SELECT a, count(*) FROM ha WHERE a = 100 GROUP BY a');
SELECT pg_temp.ha('SELECT a, sum(w) FROM ha WHERE 10 < w AND 40 >= w AND b <> 0 GROUP BY a');
SELECT pg_temp.ha('SELECT ts, count(*) FROM ha WHERE ts > ''2020-01-01 00:30'' AND d < ''2020-01-05'' GROUP BY ts');
SELECT pg_temp.ha('SELECT a + 1, sum(w) * 2 + count(*), max(w) - min(w) FROM ha GROUP BY a');
SELECT pg_temp.ha('SELECT a, count(*) FROM ha WHERE a IN (1, 2, 3, 6) AND b NOT IN (0, 4) GROUP BY a');
SELECT pg_temp.ha('SELECT a, count(*) FROM ha WHERE w IS NULL OR w < 3 OR id IN (7, 8, 9) GROUP BY a');
SELECT pg_temp.ha('SELECT a, count(*) FROM ha WHERE NOT ok AND ts IN (''2020-01-01 01:00'', ''2020-01-01 02:00'') GROUP BY a');
SELECT pg_temp.ha('SELECT a, b, count(*) FROM ha WHERE (a < 2 AND (w IS NULL OR b = 1)) OR (a > 5 AND id % 2 = 0) GROUP BY a, b');
SELECT pg_temp.ha('SELECT a, count(*) FROM ha WHERE a + b < 5 AND (w - 50) * (w - 50) <= 100 GROUP BY a');
SELECT pg_temp.ha('SELECT a, sum(v - id), max(v * w) FROM ha GROUP BY a');
-- floats: conditions in PostgreSQL's order (NaN, -0), sum(float8), avg, min, max
SELECT pg_temp.ha('SELECT b, count(*), max(y), min(f) FROM ha WHERE f < 5000 AND y <> ''NaN'' AND y >= 0::float4 GROUP BY b');
SELECT pg_temp.ha('SELECT b, count(*), round(sum(f)::numeric, 4), round(avg(y)::numeric, 4) FROM ha WHERE f <> ''NaN'' GROUP BY b');
SELECT pg_temp.ha('SELECT ok, count(*) FROM ha WHERE f = ''NaN'' OR y = 0::float4 GROUP BY ok');
-- sum(int8) is numeric past bigint; sum(int4) bigint
CREATE TABLE hb (k int4, v int8, w int4);
INSERT INTO hb SELECT i % 3, 9000000000000000000, 2147483647 FROM generate_series(1, 30000) i;
ANALYZE hb;
SELECT pg_temp.ha('SELECT k, sum(v), sum(w), min(v), max(v), avg(v) FROM hb GROUP BY k');
-- errors as PostgreSQL's: a division by zero, an overflow of int8 arithmetic
SELECT a, count(*) FROM ha WHERE a = 1 AND 10 / (b - b) = 1 GROUP BY a;
SELECT k, sum(v * w) FROM hb GROUP BY k;
-- what the heap's batches do not hold declines: text and numeric columns
SELECT pg_temp.ha('SELECT t, count(*) FROM ha GROUP BY t');
SELECT pg_temp.ha('SELECT a, count(*) FROM ha WHERE t = ''x1'' GROUP BY a');
SELECT pg_temp.ha('SELECT a, sum(n) FROM ha GROUP BY a');

-- many batches (a batch's block within work_mem) and a group table that grows past the
-- planner's estimate: every group of every batch counted once
SET work_mem = '64kB';
CREATE FUNCTION pg_temp.heap_figures(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE line text; out text := '';
BEGIN
  FOR line IN SELECT * FROM pg_temp.explain_lines(q) LOOP
    IF line ~ '(Read From|Heap Rows|Batches|Groups):' THEN
      out := out || trim(line) || '; ';
    ELSIF line LIKE '%Group Table Grown:%' THEN
      -- (how many times depends on the engine: the kernels ask for more room at once)
      out := out || 'Group Table Grown; ';
    END IF;
  END LOOP;
  RETURN out;
END $$;
SELECT pg_temp.heap_figures('SELECT id, count(*) FROM ha WHERE id % 3 = 0 GROUP BY id');
SELECT pg_temp.ha('SELECT id, count(*), sum(w) FROM ha WHERE id % 3 = 0 GROUP BY id');
SELECT pg_temp.ha('SELECT a, b, d, count(*), sum(v) FROM ha GROUP BY a, b, d');
RESET work_mem;

-- star joins: each dimension's rows from its own plan (its conditions there), probed by the
-- program per batch; a dimension without rows joins nothing
CREATE TABLE hd1 (k int4 PRIMARY KEY, name text, grp int4);
INSERT INTO hd1 SELECT i, 'n' || (i % 3), i % 2 FROM generate_series(0, 6) i;
CREATE TABLE hd2 (dk date PRIMARY KEY, yr int4, q text);
INSERT INTO hd2 SELECT date '2020-01-01' + i, 2020 + i % 2, 'q' || (i % 4) FROM generate_series(0, 10) i;
ANALYZE hd1;
ANALYZE hd2;
SELECT pg_temp.ha('SELECT hd1.name, hd2.yr, count(*), sum(ha.v) FROM ha, hd1, hd2 WHERE ha.a = hd1.k AND ha.d = hd2.dk AND hd2.q <> ''q1'' AND ha.b < 4 GROUP BY hd1.name, hd2.yr');
SELECT pg_temp.ha('SELECT hd1.grp, count(*) FROM ha JOIN hd1 ON ha.a = hd1.k WHERE hd1.name = ''n1'' GROUP BY hd1.grp');
SELECT pg_temp.ha('SELECT ha.a, count(*) FROM ha JOIN hd1 ON ha.a = hd1.k WHERE hd1.name = ''none'' GROUP BY ha.a');
SELECT * FROM pg_temp.plan('SELECT hd1.name, hd2.yr, count(*) FROM ha, hd1, hd2 WHERE ha.a = hd1.k AND ha.d = hd2.dk AND ha.w > 5 GROUP BY hd1.name, hd2.yr');

-- a cached fact is read from its cache; its heap only where no cache is ready
SELECT uvm.cache_table('hb');
SELECT pg_temp.ha('SELECT k, count(*), sum(w) FROM hb GROUP BY k');
SELECT uvm.cache_drop('hb');
SELECT pg_temp.ha('SELECT k, count(*), sum(w) FROM hb GROUP BY k');
-- an empty table; a rescan of the node under a nested loop
CREATE TABLE he (k int4, v int4);
ANALYZE he;
SELECT pg_temp.ha('SELECT k, count(*), sum(v) FROM he GROUP BY k');
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_material = off;
SELECT pg_temp.ha('SELECT g, s.c, s.m FROM generate_series(0, 3) g, (SELECT a, count(*) c, max(v) m FROM ha WHERE b < 3 GROUP BY a) s WHERE s.a = g');
SELECT pg_temp.heap_figures('SELECT g, s.c FROM generate_series(0, 3) g, (SELECT a, count(*) c FROM ha GROUP BY a) s WHERE s.a = g');
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET enable_material;
-- in parallel: every participant reads its share of the fact and lays it out in batches, and
-- one of them, the leader (or worker 0 where the leader does not run the plan), runs the
-- program over its own and every batch the others hand it
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
SELECT * FROM pg_temp.plan('SELECT a, count(*), sum(v) FROM ha WHERE b < 4 GROUP BY a');
SELECT pg_temp.ha('SELECT a, count(*), sum(v), min(w), max(b), avg(v) FROM ha WHERE b < 4 GROUP BY a');
SELECT pg_temp.ha('SELECT hd1.name, hd2.yr, count(*), sum(ha.v) FROM ha, hd1, hd2 WHERE ha.a = hd1.k AND ha.d = hd2.dk AND hd2.q <> ''q1'' GROUP BY hd1.name, hd2.yr');
SELECT pg_temp.ha('SELECT ha.a, count(*) FROM ha JOIN hd1 ON ha.a = hd1.k WHERE hd1.name = ''none'' GROUP BY ha.a');
-- a dimension whose cheapest plan is a Gather of its own (a selective condition, the parallel
-- costs at zero): the plan in parallel reads it through its cheapest parallel-safe plan (the
-- node's own children shown, not its fallback's)
CREATE TABLE hd3 (k int4 PRIMARY KEY, cat int4, pad text);
INSERT INTO hd3 SELECT i, i % 10, repeat('p', 50) FROM generate_series(0, 19999) i;
ANALYZE hd3;
SET enable_nestloop = off;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SELECT line FROM pg_temp.plan('SELECT * FROM hd3 WHERE cat = 3') line WHERE line ~ 'Gather|Seq Scan';
SELECT line FROM pg_temp.plan('SELECT hd3.cat, count(*), sum(ha.v) FROM ha JOIN hd3 ON ha.w = hd3.k WHERE hd3.cat = 3 GROUP BY hd3.cat') line
 WHERE line ~ '^(Gather|  ->  .*UvmGpuGroupAgg|        ->  ((Parallel )?Seq Scan|Gather))';
SELECT pg_temp.ha('SELECT hd3.cat, count(*), sum(ha.v) FROM ha JOIN hd3 ON ha.w = hd3.k WHERE hd3.cat = 3 GROUP BY hd3.cat');
RESET enable_nestloop;
RESET enable_hashjoin;
RESET enable_mergejoin;
SET work_mem = '64kB';
SELECT pg_temp.ha('SELECT id, count(*), sum(w) FROM ha WHERE id % 3 = 0 GROUP BY id');
RESET work_mem;
SET parallel_leader_participation = off;
SELECT pg_temp.ha('SELECT a, b, count(*), sum(v) FROM ha GROUP BY a, b');
RESET parallel_leader_participation;
SELECT a, count(*) FROM ha WHERE a = 1 AND 10 / (b - b) = 1 GROUP BY a;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_material = off;
SELECT pg_temp.ha('SELECT g, s.c, s.m FROM generate_series(0, 3) g, (SELECT a, count(*) c, max(v) m FROM ha WHERE b < 3 GROUP BY a) s WHERE s.a = g');
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET enable_material;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;
SET max_parallel_workers_per_gather = 0;

-- a table with row-level security: the policy's conditions alone may be the program's; with
-- the query's own conditions beside them, PostgreSQL's to test first (the node declines)
CREATE ROLE uvm_heap_reader;
CREATE TABLE hr (k int4, v int4, owner_id int4);
INSERT INTO hr SELECT i % 5, i, i % 3 FROM generate_series(1, 30000) i;
ANALYZE hr;
ALTER TABLE hr ENABLE ROW LEVEL SECURITY;
CREATE POLICY hr_own ON hr USING (owner_id = 1);
GRANT SELECT ON hr TO uvm_heap_reader;
SET ROLE uvm_heap_reader;
SELECT pg_temp.ha('SELECT k, count(*), sum(v) FROM hr GROUP BY k');
SELECT pg_temp.ha('SELECT k, count(*), sum(v) FROM hr WHERE v > 100 GROUP BY k');
RESET ROLE;
SELECT pg_temp.ha('SELECT k, count(*), sum(v) FROM hr GROUP BY k');
DROP TABLE hr;
DROP ROLE uvm_heap_reader;
-- no temporary segment is left
SELECT count(*) FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin%';
DROP TABLE ha, hb, hd1, hd2, hd3, he;
