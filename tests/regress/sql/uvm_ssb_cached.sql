-- The Star Schema Benchmark's 13 queries over lineorder's column cache (issue 27) at scale
-- factor 0.05: UvmGpuGroupAgg runs each star join with its filters, groups and aggregates as
-- one scan program over the cache, each dimension's rows from its own plan; then again with
-- the four dimensions cached too, each dimension's rows from a program over its own cache.
-- PostgreSQL's joins and aggregates give the answer to compare (the node off). The GPU suite
-- runs it under the CUDA engine too (scripts/gpu-suite: the scan kernels give these same
-- answers).
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;
CREATE SCHEMA ssb;
SET search_path = ssb, public;
\set ECHO none
\set sf 0.05
\i bench/ssb/generate.sql
\set ON_ERROR_STOP off
\set ECHO all
SELECT uvm.cache_table('lineorder') AS lineorder_cached;
CREATE FUNCTION pg_temp.ssb_cached(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  l text;
  node boolean := false;
  read_from text := '';
  dims text := '';
  a_on text;
  a_off text;
  body text := rtrim(q, E'; \n');
BEGIN
  PERFORM set_config('max_parallel_workers_per_gather', '0', true);
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'off', true);
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || body LOOP
    node := node OR l LIKE '%UvmGpuGroupAgg%';
    IF l LIKE '%Dimensions Read From:%' THEN
      dims := format(' (dimensions from caches: %s of %s)',
                     array_length(regexp_split_to_array(l, ': cache'), 1) - 1,
                     array_length(regexp_split_to_array(split_part(l, 'Read From:', 2), ','), 1));
    ELSIF l LIKE '%Read From:%' THEN read_from := trim(split_part(l, 'Read From:', 2)); END IF;
  END LOOP;
  EXECUTE format('SELECT count(*) || '' rows '' || md5(coalesce(string_agg(t::text, '','' ORDER BY t::text), '''')) FROM (%s) t', body)
    INTO a_on;
  PERFORM set_config('pg_uvm_share.enable_gpugroupagg', 'off', true);
  EXECUTE format('SELECT count(*) || '' rows '' || md5(coalesce(string_agg(t::text, '','' ORDER BY t::text), '''')) FROM (%s) t', body)
    INTO a_off;
  PERFORM set_config('pg_uvm_share.enable_gpugroupagg', 'on', true);
  RETURN format('%s, %s rows: %s', CASE WHEN node THEN 'UvmGpuGroupAgg from the ' || read_from || dims ELSE 'PostgreSQL' END,
                split_part(a_on, ' ', 1), CASE WHEN a_on = a_off THEN 'same answer' ELSE 'DIFFERENT answers: ' || a_off END);
END $$;
\set q `cat bench/ssb/queries/q1.1.sql`
SELECT pg_temp.ssb_cached(:'q') AS q1_1;
\set q `cat bench/ssb/queries/q1.2.sql`
SELECT pg_temp.ssb_cached(:'q') AS q1_2;
\set q `cat bench/ssb/queries/q1.3.sql`
SELECT pg_temp.ssb_cached(:'q') AS q1_3;
\set q `cat bench/ssb/queries/q2.1.sql`
SELECT pg_temp.ssb_cached(:'q') AS q2_1;
\set q `cat bench/ssb/queries/q2.2.sql`
SELECT pg_temp.ssb_cached(:'q') AS q2_2;
\set q `cat bench/ssb/queries/q2.3.sql`
SELECT pg_temp.ssb_cached(:'q') AS q2_3;
\set q `cat bench/ssb/queries/q3.1.sql`
SELECT pg_temp.ssb_cached(:'q') AS q3_1;
\set q `cat bench/ssb/queries/q3.2.sql`
SELECT pg_temp.ssb_cached(:'q') AS q3_2;
\set q `cat bench/ssb/queries/q3.3.sql`
SELECT pg_temp.ssb_cached(:'q') AS q3_3;
\set q `cat bench/ssb/queries/q3.4.sql`
SELECT pg_temp.ssb_cached(:'q') AS q3_4;
\set q `cat bench/ssb/queries/q4.1.sql`
SELECT pg_temp.ssb_cached(:'q') AS q4_1;
\set q `cat bench/ssb/queries/q4.2.sql`
SELECT pg_temp.ssb_cached(:'q') AS q4_2;
\set q `cat bench/ssb/queries/q4.3.sql`
SELECT pg_temp.ssb_cached(:'q') AS q4_3;
-- The dimensions cached too: each one's rows (its conditions, key and grouping columns) from
-- a program over its own cache, no plan of its own run.
SELECT uvm.cache_table('date') IS NOT NULL AS date_cached, uvm.cache_table('customer') IS NOT NULL AS customer_cached,
       uvm.cache_table('supplier') IS NOT NULL AS supplier_cached, uvm.cache_table('part') IS NOT NULL AS part_cached;
\set q `cat bench/ssb/queries/q1.1.sql`
SELECT pg_temp.ssb_cached(:'q') AS q1_1_dims_cached;
\set q `cat bench/ssb/queries/q1.2.sql`
SELECT pg_temp.ssb_cached(:'q') AS q1_2_dims_cached;
\set q `cat bench/ssb/queries/q1.3.sql`
SELECT pg_temp.ssb_cached(:'q') AS q1_3_dims_cached;
\set q `cat bench/ssb/queries/q2.1.sql`
SELECT pg_temp.ssb_cached(:'q') AS q2_1_dims_cached;
\set q `cat bench/ssb/queries/q2.2.sql`
SELECT pg_temp.ssb_cached(:'q') AS q2_2_dims_cached;
\set q `cat bench/ssb/queries/q2.3.sql`
SELECT pg_temp.ssb_cached(:'q') AS q2_3_dims_cached;
\set q `cat bench/ssb/queries/q3.1.sql`
SELECT pg_temp.ssb_cached(:'q') AS q3_1_dims_cached;
\set q `cat bench/ssb/queries/q3.2.sql`
SELECT pg_temp.ssb_cached(:'q') AS q3_2_dims_cached;
\set q `cat bench/ssb/queries/q3.3.sql`
SELECT pg_temp.ssb_cached(:'q') AS q3_3_dims_cached;
\set q `cat bench/ssb/queries/q3.4.sql`
SELECT pg_temp.ssb_cached(:'q') AS q3_4_dims_cached;
\set q `cat bench/ssb/queries/q4.1.sql`
SELECT pg_temp.ssb_cached(:'q') AS q4_1_dims_cached;
\set q `cat bench/ssb/queries/q4.2.sql`
SELECT pg_temp.ssb_cached(:'q') AS q4_2_dims_cached;
\set q `cat bench/ssb/queries/q4.3.sql`
SELECT pg_temp.ssb_cached(:'q') AS q4_3_dims_cached;
SELECT uvm.cache_drop('date'), uvm.cache_drop('customer'), uvm.cache_drop('supplier'), uvm.cache_drop('part');
SELECT uvm.cache_drop('lineorder');

-- nothing is left behind
SELECT count(*) AS leftovers FROM uvm.segments WHERE name LIKE 'pg_temp_%';
RESET search_path;
SET client_min_messages = warning;
DROP SCHEMA ssb CASCADE;
RESET client_min_messages;
