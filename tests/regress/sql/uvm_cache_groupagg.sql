-- GpuGroupAgg (issue 27, steps 2 and 3 for one table): GROUP BY and aggregates of a table
-- computed from its column cache by a scan program, with PostgreSQL's grouping plan below it
-- for executions where the cache is not current. Every answer is compared with PostgreSQL's
-- (the node off); each query also says whether the planner used the node. Both modes.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;
SET max_parallel_workers_per_gather = 0;
CREATE TABLE ga (id int8, a int4, b int2, d date, ts timestamp, ok bool, v int8, w int4, f float8, t text);
INSERT INTO ga SELECT i, i % 7, (i % 5)::int2, date '2020-01-01' + (i % 11),
       timestamp '2020-01-01 00:00' + (i % 3) * interval '1 hour', i % 4 = 0, i * 3,
       CASE WHEN i % 13 = 0 THEN NULL ELSE i % 100 END, i / 3.0, 'x' || (i % 9)
  FROM generate_series(1, 30000) i;
INSERT INTO ga VALUES (0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
ANALYZE ga;
SELECT uvm.cache_table('ga');

CREATE FUNCTION pg_temp.explain_lines(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    RETURN NEXT line;
  END LOOP;
END $$;
-- q with the node allowed and with it off: whether the plan has the node, where an execution
-- of it read from, and whether both answers are the same multiset of rows.
CREATE FUNCTION pg_temp.ga(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  node boolean := false;
  read_from text := '';
  line text;
  a text[];
  b text[];
BEGIN
  FOR line IN SELECT * FROM pg_temp.explain_lines(q) LOOP
    node := node OR line LIKE '%UvmGpuGroupAgg%';
    -- (where a dimension has a program over its own cache: where each one's rows came from)
    IF line LIKE '%Dimensions Read From:%' THEN
      IF line LIKE '%: cache%' OR line LIKE '%: plan (%' THEN
        read_from := read_from || ' (' || trim(split_part(line, 'Read From:', 2)) || ')';
      END IF;
    ELSIF line LIKE '%Read From:%' THEN
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

EXPLAIN (COSTS OFF)
SELECT a, count(*), sum(v), min(w), max(b) FROM ga WHERE d >= '2020-01-03' AND w BETWEEN 10 AND 50 GROUP BY a ORDER BY a;
SELECT a, count(*), sum(v), min(w), max(b) FROM ga WHERE d >= '2020-01-03' AND w BETWEEN 10 AND 50 GROUP BY a ORDER BY a;

-- what the node computes: every key type, NULL groups, the aggregates with NULLs, ranges of
-- every comparison, constants on either side, expressions over the groups
SELECT pg_temp.ga('SELECT a, count(*), count(w), sum(w), sum(v), sum(b), min(w), max(w), min(v), max(b) FROM ga GROUP BY a');
SELECT pg_temp.ga('SELECT b, d, count(*) FROM ga GROUP BY b, d');
SELECT pg_temp.ga('SELECT ts, ok, count(*), sum(w) FROM ga GROUP BY ts, ok');
SELECT pg_temp.ga('SELECT d FROM ga GROUP BY d');
SELECT pg_temp.ga('SELECT count(*), sum(v), min(w), max(w) FROM ga');
SELECT pg_temp.ga('SELECT count(*), sum(v), min(w), max(w), count(w) FROM ga WHERE a = 100');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE a = 100 GROUP BY a');
SELECT pg_temp.ga('SELECT a, sum(w) FROM ga WHERE 10 < w AND 40 >= w AND b <> 0 GROUP BY a');
SELECT pg_temp.ga('SELECT a, sum(w) FROM ga WHERE 10 < w AND 40 >= w GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE w IS NOT NULL AND id > 100 AND id <= 20000 AND b < 3 GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE v >= 300::int2 AND b = 2::int8 GROUP BY a');
SELECT pg_temp.ga('SELECT ts, count(*) FROM ga WHERE ts > ''2020-01-01 00:30'' AND d < ''2020-01-05'' GROUP BY ts');
SELECT pg_temp.ga('SELECT a + 1, sum(w) * 2 + count(*), max(w) - min(w) FROM ga GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga GROUP BY a ORDER BY count(*) DESC, a LIMIT 3');
SELECT pg_temp.ga('SELECT count(*) FROM ga GROUP BY a, b, d, ts, ok');
SELECT pg_temp.ga('SELECT id, count(*) FROM ga WHERE id < 5000 GROUP BY id');
SELECT pg_temp.ga('SELECT id, count(*) FROM ga WHERE id < 5 GROUP BY id, a');
-- the groups returned a window of the table's slots at a time (a quarter of work_mem, at
-- least 64 kB): many windows, text keys decoded per window
SET work_mem = '64kB';
SELECT pg_temp.ga('SELECT id, count(*), sum(w) FROM ga GROUP BY id');
SELECT pg_temp.ga('SELECT t, id, count(*) FROM ga WHERE id % 3 = 0 GROUP BY t, id');
SELECT count(*) FROM (SELECT id, count(*) FROM ga GROUP BY id LIMIT 10) x;
RESET work_mem;
-- sum(int8) is numeric past bigint; sum(int4) bigint
CREATE TABLE gb (k int4, v int8, w int4);
INSERT INTO gb SELECT i % 3, 9000000000000000000, 2147483647 FROM generate_series(1, 30000) i;
ANALYZE gb;
SELECT uvm.cache_table('gb');
SELECT pg_temp.ga('SELECT k, sum(v), sum(w), min(v), max(v) FROM gb GROUP BY k');
SELECT k, sum(v), sum(w) FROM gb GROUP BY k ORDER BY k;

-- clauses of alternatives: IN lists, <>, NOT IN, OR of tests of integer-like columns, IS
-- NULL, boolean columns
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE a = 1 OR a = 2 GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*), sum(w) FROM ga WHERE a IN (1, 2, 3, 6) AND b IN (0, 4, NULL) GROUP BY a');
SELECT pg_temp.ga('SELECT b, count(*) FROM ga WHERE a <> 3 AND a NOT IN (1, 5) GROUP BY b');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE w IS NULL OR w < 3 OR id IN (7, 8, 9) GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE w IS NULL GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE (a < 2 OR b > 3) AND (d = ''2020-01-02'' OR ts IS NULL) GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE ok GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE NOT ok AND ts IN (''2020-01-01 01:00'', ''2020-01-01 02:00'') GROUP BY a');
SELECT pg_temp.ga('SELECT count(*) FROM ga WHERE a IN (100, 200)');
-- (an OR of ANDs distributed into clauses)
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE (a = 1 AND b = 2) OR a = 3 GROUP BY a');
SELECT pg_temp.ga('SELECT a, b, count(*) FROM ga WHERE (a < 2 AND (w IS NULL OR b = 1)) OR (a > 5 AND id % 2 = 0) GROUP BY a, b');
-- numeric(p, s) columns as their scaled words: sum, avg, min, max with PostgreSQL's digits;
-- group keys; comparisons with constants of any scale (an inexact one rounded the right way)
CREATE TABLE gn (k int4, p numeric(10, 2), q numeric(12, 0), r numeric(18, 4));
INSERT INTO gn SELECT i % 6, CASE WHEN i % 23 = 0 THEN NULL ELSE ((i % 2000) - 700) / 100.0 END,
       (i % 50) * 1000 - 2, CASE WHEN i % 29 = 0 THEN NULL ELSE i * 12345.6789 END
  FROM generate_series(1, 30000) i;
INSERT INTO gn VALUES (NULL, NULL, NULL, NULL), (99, 99999999.99, -999999999999, 99999999999999.9999);
ANALYZE gn;
SELECT uvm.cache_table('gn');
SELECT pg_temp.ga('SELECT k, sum(p), avg(p), min(p), max(p), count(p), sum(q), avg(q), sum(r), avg(r), min(r) FROM gn GROUP BY k');
SELECT pg_temp.ga('SELECT p, count(*), sum(q) FROM gn WHERE k = 1 GROUP BY p');
SELECT pg_temp.ga('SELECT sum(p), avg(r) FROM gn WHERE k = 100');
SELECT pg_temp.ga('SELECT k, count(*) FROM gn WHERE p > 10.5 AND p <= 12.555 GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gn WHERE p >= -1.005 AND p < 3.145 AND p <> 2.5 GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gn WHERE p = 3.14 OR p = 3.145 OR q > 1.5 AND q < 2 GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gn WHERE p = 1 OR r < 0 OR q = 998 OR p > 12.345 GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gn WHERE q <> 48.5 AND p < 1e3 GROUP BY k');
EXPLAIN (COSTS OFF) SELECT k, sum(p) FROM gn WHERE p > 10.5 AND p <= 12.555 AND q <> 48.5 GROUP BY k;
SELECT pg_temp.ga('SELECT k, count(*) FROM gn WHERE p IN (1.5, 2.5) GROUP BY k');
-- IN and NOT IN lists of numerics (an element the column's scale cannot hold equals no value;
-- NOT IN of it needs a value), an OR's arms that are never true dropped
SELECT pg_temp.ga('SELECT k, count(*), sum(q) FROM gn WHERE p IN (1.5, 2.255, -3.1, NULL) GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gn WHERE p NOT IN (1.5, 2.255) AND q NOT IN (48, 998) GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gn WHERE q NOT IN (48.5) GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gn WHERE p IN (2.255, 3.145) GROUP BY k');
EXPLAIN (COSTS OFF) SELECT k, count(*) FROM gn WHERE p = 3.145 OR p IN (1.5, 2.255) OR (q = 0.5 AND p > 0) GROUP BY k;
SELECT pg_temp.ga('SELECT k, sum(p * q) FROM gn GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gn WHERE p = 3.145 GROUP BY k');
DROP TABLE gn;

-- float4 and float8 columns compared with a constant of their type: runs of the words, in
-- PostgreSQL's order (NaNs equal and above Infinity, -0 = +0), so -0, NaNs of both signs,
-- infinities, subnormals and NULLs answer as PostgreSQL's comparisons do
CREATE TABLE gx (k int4, x float8, y float4);
INSERT INTO gx SELECT i % 5, (i - 5000) / 7.0, ((i % 300) - 150) / 3.0 FROM generate_series(1, 30000) i;
INSERT INTO gx VALUES (1, '-0', '-0'), (2, '0', '0'), (3, 'NaN', 'NaN'), (4, '-NaN', '-NaN'), (0, 'Infinity', 'Infinity'),
  (1, '-Infinity', '-Infinity'), (2, '5e-324', '1e-45'), (3, '-5e-324', '-1e-45'), (4, NULL, NULL), (0, 1e308, 3e38);
ANALYZE gx;
SELECT uvm.cache_table('gx');
EXPLAIN (COSTS OFF) SELECT k, count(*) FROM gx WHERE x < 0.5 AND y <> 'NaN' GROUP BY k;
-- (a float sum's last digits depend on the order the rows are added in, which the GPU's
-- atomics do not keep: compared at 4 decimals)
SELECT pg_temp.ga('SELECT k, c, round(s::numeric, 4) FROM (SELECT k, count(*) c, sum(x) s FROM gx WHERE x < 0.5 GROUP BY k) t');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x <= 0 AND x >= 0 GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x = 0 OR y = ''-0'' GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x > 1e300 GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x >= ''Infinity'' GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x = ''NaN'' GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x <> ''NaN'' AND y < ''NaN'' GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x <= ''NaN'' GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x > ''NaN'' GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*), max(y) FROM gx WHERE x BETWEEN -1 AND 1 GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE y > -2.5::float4 AND y <= 40::float4 GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x IS NULL OR y > ''Infinity'' GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x <> 0 AND y IS NOT NULL GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x < -5e-324 OR x > 5e-324 GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x IN (0, ''NaN'', 3.5, -1, NULL) GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE y NOT IN (''-0'', 1.5, ''-Infinity'') GROUP BY k');
SELECT pg_temp.ga('SELECT k, count(*) FROM gx WHERE x NOT IN (1, NULL) GROUP BY k');
DROP TABLE gx;
-- comparisons of integer expressions: PostgreSQL's int2/int4/int8 arithmetic, NULL in NULL
-- out; an overflow or a division by zero its ERROR; such clauses last, so that a cheaper
-- condition drops a row first as PostgreSQL's order does
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE a + b < 5 GROUP BY a');
SELECT pg_temp.ga('SELECT b, count(*), sum(w) FROM ga WHERE w % 7 = 3 AND id / 1000 <> 5 GROUP BY b');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE v - id * 3 = 0 AND a = b GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE -a < -3 OR a::int8 * 2 > 11 OR w IS NULL GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE (w - 50) * (w - 50) <= 100 GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE a = 100 AND 10 / (b - b) = 1 GROUP BY a');
-- bounds next to an infinity (a range from -infinity + 1, which is no date or timestamp) are
-- shown by the infinity, strictly
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE ts > ''-infinity'' AND d < ''infinity'' GROUP BY a');
EXPLAIN (COSTS OFF) SELECT a, count(*) FROM ga WHERE ts > '-infinity' AND d < 'infinity' AND d > '-infinity' GROUP BY a;
-- an OR of an AND that holds such a comparison: PostgreSQL stops at the AND's first false
-- condition, which distributed clauses cannot, so it answers; an OR whose arm is the
-- comparison alone is the node's (tested in the arms' order, as PostgreSQL's OR)
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE (b <> 0 AND 10 / b > 0) OR a = 1 GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE (a = 1 AND b = 2) OR a + b > 7 GROUP BY a');
EXPLAIN (COSTS OFF) SELECT a, count(*) FROM ga WHERE 10 / (b - b) = 1 AND a + 1 > 2 GROUP BY a;
SELECT a, count(*) FROM ga WHERE 10 / (b - b) = 1 AND a + 1 > 2 GROUP BY a;
SELECT count(*) FROM ga WHERE w * 100000000 > 5;
SELECT count(*) FROM ga WHERE b * 10000::int2 > 5;
SET pg_uvm_share.enable_gpugroupagg = off;
SELECT a, count(*) FROM ga WHERE 10 / (b - b) = 1 AND a + 1 > 2 GROUP BY a;
SELECT count(*) FROM ga WHERE w * 100000000 > 5;
SELECT count(*) FROM ga WHERE b * 10000::int2 > 5;
RESET pg_uvm_share.enable_gpugroupagg;
-- text: conditions on one dictionary-encoded column, evaluated once per distinct string (and
-- once for NULL); groups by its strings
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE t = ''x1'' GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE t IN (''x1'', ''x4'', ''none'') AND a < 5 GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE t <> ''x1'' AND t LIKE ''x%'' AND t >= ''x3'' GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE t IS NULL OR t = ''x2'' GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE t ILIKE ''X1%'' OR t NOT LIKE ''%5'' AND t > ''x7'' GROUP BY a');
SELECT pg_temp.ga('SELECT t, count(*), sum(w) FROM ga GROUP BY t');
SELECT pg_temp.ga('SELECT t, a, count(*) FROM ga WHERE t NOT IN (''x0'', ''x8'') GROUP BY t, a');
SELECT pg_temp.ga('SELECT upper(t), count(*) FROM ga GROUP BY t');
-- avg: the sum divided by the count as PostgreSQL's numeric division; NULL over no value
SELECT pg_temp.ga('SELECT a, avg(w), avg(v), avg(b), avg(w) + 1 FROM ga GROUP BY a');
SELECT pg_temp.ga('SELECT avg(w), avg(v) FROM ga WHERE a = 100');
SELECT pg_temp.ga('SELECT k, avg(v), avg(w) FROM gb GROUP BY k');
-- floats: sum, avg (float8), min, max (their type) of float4 and float8 columns, PostgreSQL's
-- NaN and infinities, an overflow of finite values its ERROR; sums of exact values (the
-- order of additions is the cache's), else rounded
CREATE TABLE gf (a int4, r float4, d float8);
INSERT INTO gf SELECT i % 5, CASE WHEN i % 17 = 0 THEN NULL ELSE (i % 100) / 4.0 END,
       CASE WHEN i % 19 = 0 THEN NULL ELSE (i % 1000) / 8.0 - 20 END FROM generate_series(1, 20000) i;
INSERT INTO gf VALUES (7, 'NaN', 1), (7, 2, 'NaN'), (8, '-Infinity', 'Infinity'), (8, 1, 3), (9, NULL, NULL);
ANALYZE gf;
SELECT uvm.cache_table('gf');
SELECT pg_temp.ga('SELECT a, sum(d), avg(d), avg(r), min(r), max(r), min(d), max(d), count(r), count(d) FROM gf GROUP BY a');
SELECT pg_temp.ga('SELECT sum(d), avg(r), min(d), max(r) FROM gf WHERE a < 5');
SELECT pg_temp.ga('SELECT sum(d), avg(r), min(d), max(r) FROM gf WHERE a = 100');
SELECT pg_temp.ga('SELECT a, round(sum(f)::numeric, 6), round(avg(f)::numeric, 6), min(f), max(f) FROM ga GROUP BY a');
CREATE TABLE gg (a int4, d float8);
INSERT INTO gg SELECT 1, 1e308 FROM generate_series(1, 30000);
ANALYZE gg;
SELECT uvm.cache_table('gg');
EXPLAIN (COSTS OFF) SELECT a, sum(d) FROM gg GROUP BY a;
SELECT a, sum(d) FROM gg GROUP BY a;
SELECT a, avg(d) FROM gg GROUP BY a;
SET pg_uvm_share.enable_gpugroupagg = off;
SELECT a, sum(d) FROM gg GROUP BY a;
RESET pg_uvm_share.enable_gpugroupagg;
DROP TABLE gg;
EXPLAIN (COSTS OFF)
SELECT t, count(*), avg(w) FROM ga WHERE (a IN (1, 2, 9) OR w IS NULL) AND ok AND t <> 'x1' GROUP BY t;

-- what it declines: PostgreSQL plans these
SELECT pg_temp.ga('SELECT a + 1, count(*) FROM ga GROUP BY a + 1');
SELECT pg_temp.ga('SELECT f, count(*) FROM ga WHERE id < 10 GROUP BY f');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga GROUP BY a HAVING count(*) > 4285');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE a = 1 OR t = ''x1'' GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE a NOT IN (1, NULL) GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE t = ''x'' || a GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE t > random()::text GROUP BY a');
-- (text conditions that could raise an ERROR for a string: evaluated over the whole
-- dictionary, they might fail where PostgreSQL's plan, dropping rows first, would not)
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE length(t) > 5 GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE coalesce(t, ''x2'') = ''x2'' GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE a = 100 AND substr(t, 2)::int > 3 GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE f * 2 IN (2, 4) GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE a + f > 3 GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE abs(a) > 3 GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE d > ts GROUP BY a');
-- a user's operator named + that subtracts, first on the search path: not the built-in +
CREATE SCHEMA gops;
CREATE OPERATOR gops.+ (LEFTARG = int4, RIGHTARG = int2, FUNCTION = int42mi);
SET search_path = gops, pg_catalog, public;
SELECT pg_temp.ga('SELECT a, count(*) FROM ga WHERE a + b < 3 GROUP BY a');
RESET search_path;
-- (dropped at the end: a DROP other than of tables marks every cache of the database stale)
SELECT pg_temp.ga('SELECT a, sum(r) FROM gf GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FROM gf WHERE d + 1 > 2 GROUP BY a');
SELECT pg_temp.ga('SELECT d, count(*) FROM gf GROUP BY d');
SELECT pg_temp.ga('SELECT a, min(t) FROM ga GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(DISTINCT w) FROM ga GROUP BY a');
SELECT pg_temp.ga('SELECT a, count(*) FILTER (WHERE w > 5) FROM ga GROUP BY a');
SELECT pg_temp.ga('SELECT a, sum(w + 1) FROM ga GROUP BY a');
SELECT pg_temp.ga('SELECT g.a, count(*) FROM ga g JOIN (VALUES (1), (2)) k(k) ON g.a = k.k GROUP BY g.a');
SELECT pg_temp.ga('SELECT a, b, count(*) FROM ga GROUP BY GROUPING SETS ((a), (b))');
-- a cache without a column the query reads
CREATE TABLE gc AS SELECT a, b FROM ga;
SELECT uvm.cache_table('gc', ARRAY['a']);
SELECT pg_temp.ga('SELECT a, count(*) FROM gc GROUP BY a');
SELECT pg_temp.ga('SELECT a, max(b) FROM gc GROUP BY a');
SET pg_uvm_share.enable_cache = off;
SELECT pg_temp.ga('SELECT a, count(*) FROM ga GROUP BY a');
RESET pg_uvm_share.enable_cache;
-- a generic plan's parameter is no constant
PREPARE gp(int) AS SELECT count(*) FROM ga WHERE a = $1;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE gp(3);
EXECUTE gp(3);
RESET plan_cache_mode;
EXPLAIN (COSTS OFF) EXECUTE gp(3);
EXECUTE gp(3);
DEALLOCATE gp;
-- a text condition is evaluated by PostgreSQL at run time: a generic plan's parameter is fine
PREPARE gt(text) AS SELECT count(*) FROM ga WHERE t = $1;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE gt('x3');
EXECUTE gt('x3');
RESET plan_cache_mode;
EXECUTE gt('x3');
DEALLOCATE gt;

-- star joins: dimension tables joined to the cached fact by one equality each, their rows
-- (those their own conditions pass) drained from their own plans; groups from the fact and
-- the dimensions (text included), NULL keys and values, duplicate and missing dimension keys,
-- differences and products of fact columns
CREATE TABLE gk (k int4, name text, grp int2, day date);
INSERT INTO gk SELECT i, CASE WHEN i % 5 = 0 THEN NULL ELSE 'n' || (i % 4) END, (i % 3)::int2, date '2021-01-01' + i
  FROM generate_series(-2, 5) i;
INSERT INTO gk VALUES (3, 'dup', 9, NULL), (NULL, 'nokey', 1, NULL);
CREATE TABLE gl (k int8, region text);
INSERT INTO gl SELECT i, CASE WHEN i % 2 = 0 THEN 'east' ELSE 'west' END FROM generate_series(0, 99) i;
ANALYZE gk, gl;
SELECT pg_temp.ga('SELECT gk.name, count(*), sum(ga.v), min(ga.w) FROM ga, gk WHERE ga.a = gk.k GROUP BY gk.name');
SELECT pg_temp.ga('SELECT gk.name, ga.b, count(*) FROM ga JOIN gk ON ga.a = gk.k GROUP BY gk.name, ga.b');
SELECT pg_temp.ga('SELECT gk.grp, gk.day, gl.region, sum(ga.w) FROM ga, gk, gl WHERE ga.a = gk.k AND ga.w = gl.k AND ga.b < 3 GROUP BY gk.grp, gk.day, gl.region');
SELECT pg_temp.ga('SELECT gl.region, count(*) FROM ga, gk, gl WHERE ga.a = gk.k AND ga.w = gl.k AND gk.name LIKE ''n%'' GROUP BY gl.region');
SELECT pg_temp.ga('SELECT count(*), sum(ga.v) FROM ga, gk WHERE ga.a = gk.k AND gk.grp = 1');
SELECT pg_temp.ga('SELECT count(*), sum(ga.v) FROM ga, gk WHERE ga.a = gk.k AND gk.grp = 7');
SELECT pg_temp.ga('SELECT gk.k, count(*) FROM ga, gk WHERE ga.a = gk.k GROUP BY gk.k');
SELECT pg_temp.ga('SELECT ga.a, sum(ga.v * ga.w), sum(ga.v - ga.w), max(ga.id * ga.a), min(ga.w - ga.v) FROM ga GROUP BY ga.a');
SELECT pg_temp.ga('SELECT gl.region, sum(ga.v * ga.b) FROM ga, gl WHERE ga.w = gl.k GROUP BY gl.region');
SELECT pg_temp.ga('SELECT gl.region, sum(ga.w * ga.a) FROM ga, gl WHERE ga.w = gl.k GROUP BY gl.region');
CREATE TABLE gm (k int4, v int8, two int4, four int8);
INSERT INTO gm SELECT i % 3, 3000000000000000000, 2, 4 FROM generate_series(1, 30000) i;
ANALYZE gm;
SELECT uvm.cache_table('gm');
EXPLAIN (COSTS OFF) SELECT k, sum(v * two) FROM gm GROUP BY k;
SELECT k, sum(v * two) FROM gm GROUP BY k ORDER BY k;
SELECT k, sum(v * four) FROM gm GROUP BY k;
SELECT pg_temp.ga('SELECT k, sum(v - k), max(k * v) FROM gm GROUP BY k');
-- what star joins decline: a dimension joined by no equality with the fact, or by two, or to
-- another dimension; an outer join; an aggregate of a dimension's column; a float group
SELECT pg_temp.ga('SELECT gk.name, count(*) FROM ga, gk WHERE ga.a < gk.k GROUP BY gk.name');
SELECT pg_temp.ga('SELECT gk.name, count(*) FROM ga, gk WHERE ga.a = gk.k AND ga.b = gk.grp GROUP BY gk.name');
SELECT pg_temp.ga('SELECT gl.region, count(*) FROM ga, gk, gl WHERE ga.a = gk.k AND gk.grp = gl.k GROUP BY gl.region');
SELECT pg_temp.ga('SELECT gk.name, count(*) FROM ga LEFT JOIN gk ON ga.a = gk.k GROUP BY gk.name');
SELECT pg_temp.ga('SELECT gk.name, sum(gk.grp) FROM ga, gk WHERE ga.a = gk.k GROUP BY gk.name');
SELECT pg_temp.ga('SELECT gk.name, count(*) FROM ga, gk WHERE ga.a = gk.k OR ga.b = 1 GROUP BY gk.name');

-- the dimensions cached too: each one's rows from a program over its own cache (its
-- conditions, key and grouping columns; NULL keys joining nothing, a duplicate key joining
-- twice, NULL and text grouping values); a condition that is no program's clause keeps the
-- dimension's plan; appended rows are read, the inserting transaction and a stale cache read
-- the plan
SELECT uvm.cache_table('gk') AS gk_cached, uvm.cache_table('gl') AS gl_cached;
EXPLAIN (COSTS OFF) SELECT gk.name, count(*) FROM ga, gk WHERE ga.a = gk.k AND gk.grp < 2 GROUP BY gk.name;
SELECT pg_temp.ga('SELECT gk.name, count(*), sum(ga.v), min(ga.w) FROM ga, gk WHERE ga.a = gk.k GROUP BY gk.name');
SELECT pg_temp.ga('SELECT gk.name, ga.b, count(*) FROM ga JOIN gk ON ga.a = gk.k GROUP BY gk.name, ga.b');
SELECT pg_temp.ga('SELECT gk.grp, gk.day, gl.region, sum(ga.w) FROM ga, gk, gl WHERE ga.a = gk.k AND ga.w = gl.k AND ga.b < 3 GROUP BY gk.grp, gk.day, gl.region');
SELECT pg_temp.ga('SELECT gl.region, count(*) FROM ga, gk, gl WHERE ga.a = gk.k AND ga.w = gl.k AND gk.name LIKE ''n%'' GROUP BY gl.region');
SELECT pg_temp.ga('SELECT count(*), sum(ga.v) FROM ga, gk WHERE ga.a = gk.k AND gk.grp = 1');
SELECT pg_temp.ga('SELECT count(*), sum(ga.v) FROM ga, gk WHERE ga.a = gk.k AND gk.grp = 7');
SELECT pg_temp.ga('SELECT gk.k, count(*) FROM ga, gk WHERE ga.a = gk.k GROUP BY gk.k');
SELECT pg_temp.ga('SELECT gk.name, gk.day, count(*) FROM ga, gk WHERE ga.a = gk.k AND (gk.day IS NULL OR gk.grp IN (0, 2)) GROUP BY gk.name, gk.day');
SELECT pg_temp.ga('SELECT gk.grp, count(*) FROM ga, gk WHERE ga.a = gk.k AND gk.k + gk.grp < 5 AND gk.name IS NOT NULL GROUP BY gk.grp');
SELECT pg_temp.ga('SELECT gl.region, count(*) FROM ga, gl WHERE ga.w = gl.k AND gl.region IN (''east'', ''north'') AND gl.k % 3 <> 0 GROUP BY gl.region');
SELECT pg_temp.ga('SELECT gk.name, count(*) FROM ga, gk WHERE ga.a = gk.k AND gk.k::float8 > 0.5 GROUP BY gk.name');
-- (appends: a cache without text columns takes them; a text column's makes it stale)
SELECT uvm.cache_drop('gk') AS gk_dropped, uvm.cache_table('gk', ARRAY['k', 'grp', 'day']) AS gk_cached_without_text;
INSERT INTO gk VALUES (4, 'appended', 2, date '2021-06-01'), (5, NULL, 7, NULL), (NULL, NULL, 2, NULL);
SELECT pg_temp.ga('SELECT gk.grp, gk.day, count(*), sum(ga.v) FROM ga, gk WHERE ga.a = gk.k GROUP BY gk.grp, gk.day');
SELECT pg_temp.ga('SELECT gk.grp, count(*) FROM ga, gk WHERE ga.a = gk.k AND gk.grp > 1 GROUP BY gk.grp');
BEGIN;
INSERT INTO gk VALUES (6, 'mine', 1, NULL);
SELECT pg_temp.ga('SELECT gk.grp, count(*) FROM ga, gk WHERE ga.a = gk.k GROUP BY gk.grp');
ROLLBACK;
DELETE FROM gk WHERE name = 'appended' OR grp = 7 OR (k IS NULL AND name IS NULL);
SELECT pg_temp.ga('SELECT gk.grp, count(*) FROM ga, gk WHERE ga.a = gk.k GROUP BY gk.grp');
SELECT uvm.cache_drop('gk') AS gk_dropped, uvm.cache_drop('gl') AS gl_dropped;
-- every GROUP BY key fixed to a constant by WHERE (PostgreSQL 16 on leaves such keys out of
-- its grouping), the node reading its child (the transaction's own insert): still a grouped
-- aggregate, so no group for no row (a plain one read its key from no tuple: a crash)
CREATE TABLE gfix (k int4, t text);
INSERT INTO gfix SELECT i % 10, 'a' || (i % 5) FROM generate_series(1, 30000) i;
ANALYZE gfix;
SELECT uvm.cache_table('gfix') AS rows;
BEGIN;
INSERT INTO gfix VALUES (1, 'a1');
SELECT pg_temp.ga('SELECT t, count(*) FROM gfix WHERE t = ''zzz'' GROUP BY t');
SELECT pg_temp.ga('SELECT t, count(*) FROM gfix WHERE t = ''a1'' GROUP BY t');
SELECT pg_temp.ga('SELECT k, t, count(*) FROM gfix WHERE t = ''zzz'' AND k = 1 GROUP BY k, t');
ROLLBACK;
SELECT uvm.cache_table('gfix') AS rows;
SELECT pg_temp.ga('SELECT t, count(*) FROM gfix WHERE t = ''zzz'' GROUP BY t');
DROP TABLE gfix;
-- the dimensions' rows within work_mem x hash_mem_multiplier: a plan's rows past it make the
-- child (PostgreSQL's plan, whose hash join batches) answer; a cache's are built into their
-- join table where the cache lies, so only their distinct grouping values count, and past it
-- the child answers too
CREATE TABLE gw (k int4, tag int4, u int4);
INSERT INTO gw SELECT i, i % 7, i FROM generate_series(1, 20000) i;
ANALYZE gw;
SET work_mem = '64kB';
SELECT pg_temp.ga('SELECT gw.tag, count(*), sum(ga.v) FROM ga, gw WHERE ga.id = gw.k GROUP BY gw.tag');
SELECT uvm.cache_table('gw') AS gw_cached;
SELECT pg_temp.ga('SELECT gw.tag, count(*), sum(ga.v) FROM ga, gw WHERE ga.id = gw.k GROUP BY gw.tag');
SELECT pg_temp.ga('SELECT gw.tag, count(*), sum(ga.v) FROM ga, gw WHERE ga.id = gw.k AND gw.k < 2000 GROUP BY gw.tag');
SELECT pg_temp.ga('SELECT gw.u, count(*), sum(ga.v) FROM ga, gw WHERE ga.id = gw.k GROUP BY gw.u');
-- two cached dimensions, their programs begun together: one's grouping values past the budget
-- make the child answer while the other's program may still run (waited for, its table
-- dropped with the statement: temporary_segments_left at the end), in either order
CREATE TABLE gx (k int4, grp int4);
INSERT INTO gx SELECT i, i % 3 FROM generate_series(0, 99) i;
ANALYZE gx;
SELECT uvm.cache_table('gx') AS gx_cached;
SELECT pg_temp.ga('SELECT gx.grp, count(*) FROM ga, gx WHERE ga.a = gx.k GROUP BY gx.grp');
SELECT pg_temp.ga('SELECT gw.u, gx.grp, count(*) FROM ga, gw, gx WHERE ga.id = gw.k AND ga.a = gx.k GROUP BY gw.u, gx.grp');
SELECT pg_temp.ga('SELECT gx.grp, gw.u, count(*) FROM ga, gx, gw WHERE ga.a = gx.k AND ga.id = gw.k GROUP BY gx.grp, gw.u');
-- within the budget, begun together and one after another (enable_async_dimensions)
SELECT pg_temp.ga('SELECT gw.tag, gx.grp, count(*), sum(ga.v) FROM ga, gw, gx WHERE ga.id = gw.k AND ga.a = gx.k GROUP BY gw.tag, gx.grp');
SET pg_uvm_share.enable_async_dimensions = off;
SELECT pg_temp.ga('SELECT gw.tag, gx.grp, count(*), sum(ga.v) FROM ga, gw, gx WHERE ga.id = gw.k AND ga.a = gx.k GROUP BY gw.tag, gx.grp');
SELECT pg_temp.ga('SELECT gw.u, gx.grp, count(*) FROM ga, gw, gx WHERE ga.id = gw.k AND ga.a = gx.k GROUP BY gw.u, gx.grp');
RESET pg_uvm_share.enable_async_dimensions;
SELECT count(*) AS temporary_segments_now FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin_%';
SELECT uvm.cache_drop('gx') AS gx_dropped;
DROP TABLE gx;
RESET work_mem;
SELECT pg_temp.ga('SELECT gw.tag, count(*), sum(ga.v) FROM ga, gw WHERE ga.id = gw.k GROUP BY gw.tag');
SELECT uvm.cache_drop('gw') AS gw_dropped;
DROP TABLE gw;

-- in a parallel query (Gathers among the node's children: the executor runs in parallel mode,
-- where the node's checks must not write)
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
SELECT pg_temp.ga('SELECT gk.name, count(*), sum(ga.v) FROM ga, gk WHERE ga.a = gk.k GROUP BY gk.name');
SELECT pg_temp.ga('SELECT gl.region, gk.grp, count(*) FROM ga, gk, gl WHERE ga.a = gk.k AND ga.w = gl.k GROUP BY gl.region, gk.grp');
SELECT pg_temp.ga('SELECT a, count(*), max(w) FROM ga WHERE b > 1 GROUP BY a');
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;
SET max_parallel_workers_per_gather = 0;

-- the cache's currency at execution: appended rows folded in (new groups growing the table);
-- the inserting transaction and a stale cache read the child (a prepared statement keeps its
-- plan); without a cache, or for a small table, PostgreSQL plans
-- (the statistics say 10 groups, so the group table starts small; autovacuum kept off them)
CREATE TABLE gd (k int8, v int4) WITH (autovacuum_enabled = off);
INSERT INTO gd SELECT i % 10, i FROM generate_series(1, 20000) i;
ANALYZE gd;
SELECT uvm.cache_table('gd');
INSERT INTO gd SELECT i, i FROM generate_series(101, 3100) i;
SELECT pg_temp.ga('SELECT k, count(*), sum(v) FROM gd GROUP BY k');
SELECT pg_temp.ga('SELECT gl.region, count(*), sum(gd.v) FROM gd, gl WHERE gd.k = gl.k GROUP BY gl.region');
PREPARE gq AS SELECT k, count(*), sum(v) FROM gd GROUP BY k ORDER BY k LIMIT 3;
-- (the node's own EXPLAIN ANALYZE lines: the rest of the plan's differ between majors)
SELECT line FROM (SELECT trim(l) AS line FROM pg_temp.explain_lines('EXECUTE gq') l) x
 WHERE line LIKE 'Read From:%' OR line LIKE 'Groups:%' OR line LIKE 'Appended Rows:%' OR line LIKE 'Group Table Grown:%';
EXECUTE gq;
BEGIN;
INSERT INTO gd VALUES (5, 5), (NULL, 1);
SELECT pg_temp.ga('SELECT k, count(*), sum(v) FROM gd GROUP BY k');
COMMIT;
SELECT pg_temp.ga('SELECT k, count(*), sum(v) FROM gd GROUP BY k');
-- a rebuild whose estimate is low: the program's table grows
SELECT uvm.cache_table('gd');
SELECT pg_temp.ga('SELECT k, count(*), sum(v) FROM gd GROUP BY k');
-- (how often depends on the engine: the CPU grows at a row, the kernels at a launch's rows)
SELECT regexp_replace(line, '^Group Table Grown: [1-9][0-9]*$', 'Group Table Grown: yes') AS line
  FROM (SELECT trim(l) AS line FROM pg_temp.explain_lines('EXECUTE gq') l) x
 WHERE line LIKE 'Group Table Grown:%' OR line LIKE 'Read From:%' OR line LIKE 'Appended Rows:%';
UPDATE gd SET v = v + 1 WHERE k = 1;
SELECT line FROM (SELECT trim(l) AS line FROM pg_temp.explain_lines('EXECUTE gq') l) x
 WHERE line LIKE 'Read From:%';
EXECUTE gq;
SELECT pg_temp.ga('SELECT k, count(*), sum(v) FROM gd GROUP BY k');
SELECT uvm.cache_table('gd');
SELECT pg_temp.ga('SELECT k, count(*), sum(v) FROM gd GROUP BY k');
DEALLOCATE gq;
SELECT uvm.cache_drop('gd');
SELECT pg_temp.ga('SELECT k, count(*), sum(v) FROM gd GROUP BY k');
CREATE TABLE ge AS SELECT i AS k FROM generate_series(1, 50) i;
SELECT uvm.cache_table('ge');
SELECT pg_temp.ga('SELECT k, count(*) FROM ge GROUP BY k');

-- a statement cancelled (statement_timeout) while the node runs leaves nothing behind
CREATE TABLE gt AS SELECT i::int8 AS k, (i % 5000)::int4 AS g FROM generate_series(1, 2000000) i;
ANALYZE gt;
SELECT uvm.cache_table('gt');
SET statement_timeout = '2ms';
\set VERBOSITY terse
SELECT count(*) FROM (SELECT g, count(*), sum(k) FROM gt GROUP BY g) x;
\set VERBOSITY default
RESET statement_timeout;
SELECT pg_temp.ga('SELECT g, count(*), sum(k) FROM gt GROUP BY g');
SELECT uvm.cache_drop('gt');
DROP TABLE gt;

-- random conditions (a fixed seed): clauses of one to three alternatives, one to three
-- clauses, from every form the node takes and some it declines; every answer must be
-- PostgreSQL's, and a third at least must run on the node
CREATE FUNCTION pg_temp.random_where(n int) RETURNS TABLE (queries int, different int, on_node_enough boolean)
LANGUAGE plpgsql AS $$
DECLARE
  forms text[] := ARRAY['a = #', 'a <> #', 'b < #', 'w >= #', 'w IS NULL', 'w IS NOT NULL', 'ok', 'NOT ok',
    'a IN (#, #, #)', 'b NOT IN (#, #)', 'id BETWEEN # AND # * 3000', 'd > date ''2020-01-01'' + #',
    'a + b < #', 'w % 7 = #', 't = ''x#''', 't IN (''x#'', ''x#'')', 't LIKE ''x%#''', 'v - id * 3 = #',
    '(a = # AND b >= #)', 'ts < timestamp ''2020-01-01 01:00'' + # * interval ''1 minute''', 'a * w > # * 40',
    'upper(t) = ''X#''', 'a = # OR t = ''x#''', 'f < #.5', 'f >= # * 2', 'f <> #'];
  q text;
  r text;
  w text;
  c text;
  node int := 0;
BEGIN
  queries := 0;
  different := 0;
  PERFORM setseed(0.27);
  FOR i IN 1..n LOOP
    w := '';
    FOR j IN 1..1 + floor(random() * 3)::int LOOP
      c := '';
      FOR k IN 1..1 + floor(random() * 3)::int LOOP
        c := c || CASE WHEN k > 1 THEN ' OR ' ELSE '' END
             || regexp_replace(forms[1 + floor(random() * array_length(forms, 1))::int], '#',
                               (floor(random() * 9))::int::text, 'g');
      END LOOP;
      w := w || CASE WHEN j > 1 THEN ' AND ' ELSE '' END || '(' || c || ')';
    END LOOP;
    q := 'SELECT a, count(*), sum(w), avg(v), min(b), max(b) FROM ga WHERE ' || w || ' GROUP BY a';
    IF random() < 0.3 THEN
      q := 'SELECT t, count(*), sum(v), max(w) FROM ga WHERE ' || w || ' GROUP BY t';
    END IF;
    r := pg_temp.ga(q);
    queries := queries + 1;
    IF r LIKE 'node%' THEN
      node := node + 1;
    END IF;
    IF r NOT LIKE '%, same' THEN
      different := different + 1;
      RAISE NOTICE '%: %', q, r;
    END IF;
  END LOOP;
  on_node_enough := node * 3 >= queries;
  RETURN NEXT;
END $$;
SELECT * FROM pg_temp.random_where(400);

-- nothing is left behind: the group tables are temporary segments
SELECT count(*) AS temporary_segments_left FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin_%';
SELECT uvm.cache_drop('ga'), uvm.cache_drop('gb'), uvm.cache_drop('gc'), uvm.cache_drop('ge'), uvm.cache_drop('gf'), uvm.cache_drop('gm');
DROP TABLE ga, gb, gc, gd, ge, gf, gk, gl, gm;
DROP SCHEMA gops CASCADE;
