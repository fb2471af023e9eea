-- The GpuJoin node over column caches (issue 26, point 3): the probe mode of a serial node whose
-- two sides are plain scans of cached tables reads the caches' columns in place instead of its
-- children; EXPLAIN names the caches, and with ANALYZE what was read. Every answer is checked
-- against PostgreSQL's own join (the node and cache reading off). Runs in both execution modes.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;
SET pg_uvm_share.enable_gpujoin = on;
CREATE TABLE cj_fact AS
SELECT CASE WHEN g % 97 = 0 THEN NULL ELSE (g % 5000)::int8 END AS k, (g % 3000)::int4 AS k4, g AS x
  FROM generate_series(1, 300000) g;
CREATE TABLE cj_dim AS
SELECT g::int8 AS k, g::int4 AS k4, (g * 7 - 9000)::int4 AS v, g::int8 * 1000000007 AS w,
       CASE WHEN g % 10 = 0 THEN NULL ELSE g END::int4 AS vn
  FROM generate_series(1, 4000) g;
INSERT INTO cj_dim VALUES (NULL, NULL, 5, 5, 5);
INSERT INTO cj_dim SELECT k + 1000, k4 + 1000, v, w, 1 FROM cj_dim WHERE k % 3 = 0;   -- repeated keys
ANALYZE cj_fact, cj_dim;

-- The join's answer from the caches (where the plan reads them), and PostgreSQL's own (the node
-- and cache reading off), with what the node read (EXPLAIN ANALYZE's Read From).
CREATE FUNCTION cj_check(q text) RETURNS TABLE (read_from text, same_as_heap boolean)
LANGUAGE plpgsql AS $$
DECLARE c text; h text; line text; src text := 'none';
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (ANALYZE, BUFFERS OFF, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    IF line LIKE '%Read From:%' THEN src := trim(split_part(line, 'Read From:', 2)); END IF;
  END LOOP;
  EXECUTE 'SELECT row(t.*)::text FROM (' || q || ') t' INTO c;
  PERFORM set_config('pg_uvm_share.enable_cache', 'off', true);
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'off', true);
  EXECUTE 'SELECT row(t.*)::text FROM (' || q || ') t' INTO h;
  PERFORM set_config('pg_uvm_share.enable_cache', 'on', true);
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'on', true);
  RETURN QUERY SELECT src, c IS NOT DISTINCT FROM h;
END $$;

-- Without caches: the node reads its children, and EXPLAIN names no cache (serially here, as
-- in process mode under CUDA, where the planner prices each worker's CUDA context)
SET max_parallel_workers_per_gather = 0;
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
RESET max_parallel_workers_per_gather;
SELECT uvm.cache_table('cj_fact', ARRAY['k', 'k4']) AS rows;
SELECT uvm.cache_table('cj_dim', ARRAY['k', 'k4', 'v', 'w', 'vn']) AS rows;

-- With both caches: the serial plan reading them is cheaper than a parallel one over the heap
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
EXPLAIN (COSTS OFF) SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k;
-- (EXPLAIN ANALYZE without the figures that depend on the provider and on the caches' blocks,
-- which a parallel build lays out as its workers come, nor the row counts, which PostgreSQL 18
-- prints with decimals)
CREATE FUNCTION pg_temp.cj_explain(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, BUFFERS OFF, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    IF l !~ '(Batches|Tier|Memory Usage|Inner Table):' THEN RETURN NEXT regexp_replace(l, ' \(actual [^)]*\)', ''); END IF;
  END LOOP;
END $$;
SELECT * FROM pg_temp.cj_explain('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k;
-- count(*) alone, count and sum of int4 and int8 columns (a count before the sum once made the
-- node's heap path sum payloads of 0), int4 keys, an int4 key against an int8 one, the sides
-- swapped
SELECT * FROM cj_check('SELECT count(*) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
SELECT * FROM cj_check('SELECT count(d.v), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
SELECT * FROM cj_check('SELECT sum(d.w), count(*) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k4 = d.k4');
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k4 = d.k');
SELECT * FROM cj_check('SELECT count(*) FROM cj_dim d JOIN cj_fact f ON f.k = d.k');
-- a NULL in the aggregated column: the probe's sum cannot skip it, so the children are read
SELECT * FROM cj_check('SELECT count(d.vn), sum(d.vn) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
-- shapes the caches do not serve: a filter on a side, an outer column aggregated, a column not
-- cached, a left join (each reads its children, or is planned otherwise)
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k WHERE f.x > 10');
SELECT * FROM cj_check('SELECT count(*), sum(f.x) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
EXPLAIN (COSTS OFF) SELECT count(*) FROM cj_fact f JOIN cj_dim d ON f.x = d.k;
-- the node over the heap, with a count before the sum (the fixed case) and its parallel plan
SET pg_uvm_share.enable_cache = off;
SELECT * FROM cj_check('SELECT count(d.v), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
RESET pg_uvm_share.enable_cache;
-- a rescan (the subquery runs again for each outer row) reads the caches each time
SELECT g, (SELECT count(*) FROM cj_fact f JOIN cj_dim d ON f.k = d.k WHERE g > 0) FROM generate_series(0, 2) g;
-- dropping another table (RESTRICT) leaves the caches current; with CASCADE (which may drop
-- columns of its row type elsewhere) every cache of the database goes stale
CREATE TABLE cj_other (a int);
DROP TABLE cj_other;
SELECT * FROM cj_check('SELECT count(*) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
CREATE TABLE cj_other (a int);
DROP TABLE cj_other CASCADE;
SELECT * FROM cj_check('SELECT count(*) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
SELECT relation, state FROM uvm.caches ORDER BY 1;
SELECT uvm.cache_table('cj_fact', ARRAY['k', 'k4']) AS rows;
SELECT uvm.cache_table('cj_dim', ARRAY['k', 'k4', 'v', 'w', 'vn']) AS rows;
-- cache reading off: the plan over the heap, no cache named
SET pg_uvm_share.enable_cache = off;
EXPLAIN (COSTS OFF) SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k;
RESET pg_uvm_share.enable_cache;
SET max_parallel_workers_per_gather = 0;

-- An insert appends its rows to the cache (the uvm_cache_append suite): the plan reads the
-- caches and the appended rows
INSERT INTO cj_fact VALUES (1, 1, 0), (2, 2, 0);
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
SELECT uvm.cache_table('cj_fact', ARRAY['k', 'k4']) AS rows;
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
-- in a transaction that wrote the table (marked stale before the write), and after its abort
BEGIN;
DELETE FROM cj_dim WHERE k < 100;
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
ROLLBACK;
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
-- an inheritance child made after the cache (CREATE TABLE marks no cache stale): a scan of
-- cj_dim is then an Append of its own rows and its child's, and its cache holds its own only:
-- the node reads its children; with ONLY it reads the caches
SELECT uvm.cache_table('cj_dim', ARRAY['k', 'k4', 'v', 'w', 'vn']) AS rows;
CREATE TABLE cj_dim_child () INHERITS (cj_dim);
INSERT INTO cj_dim_child SELECT * FROM ONLY cj_dim WHERE k < 10;
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN ONLY cj_dim d ON f.k = d.k');
DROP TABLE cj_dim_child;
-- a dropped cache: the heap
SELECT uvm.cache_drop('cj_dim');
SELECT * FROM cj_check('SELECT count(*), sum(d.v) FROM cj_fact f JOIN cj_dim d ON f.k = d.k');
-- an empty inner table's cache: no match, no table
CREATE TABLE cj_empty (k int8, v int4);
SELECT uvm.cache_table('cj_empty') AS rows;
SELECT * FROM cj_check('SELECT count(*), sum(e.v) FROM cj_fact f JOIN cj_empty e ON f.k = e.k');
-- a user with SELECT on the join's columns only reads the caches too
CREATE ROLE uvm_cj_reader;
GRANT SELECT (k) ON cj_fact TO uvm_cj_reader;
GRANT SELECT (k, v) ON cj_empty TO uvm_cj_reader;
SET ROLE uvm_cj_reader;
SELECT * FROM cj_check('SELECT count(*), sum(e.v) FROM cj_fact f JOIN cj_empty e ON f.k = e.k');
RESET ROLE;
SELECT count(*) AS node_segments_left FROM uvm.segments WHERE name LIKE 'pg_temp_%' AND name NOT LIKE 'pg_temp_cache_%';
DROP TABLE cj_fact, cj_dim, cj_empty;
DROP OWNED BY uvm_cj_reader;
DROP ROLE uvm_cj_reader;
DROP FUNCTION cj_check(text);
SELECT count(*) AS caches_left FROM uvm.caches;
