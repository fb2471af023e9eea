-- Star joins over cached dimensions with their programs begun together and one after another
-- (pg_uvm_share.enable_async_dimensions on and off), in one session, alternating: per query
-- the best execution time and the node's Dimensions Time of each. Needs the SSB tables
-- (bench/ssb/run made them in this database) and runs from the tree's root (psql's backticks
-- read the queries); builds the caches bench/ssb/run's setting dims builds, and drops them.
-- In the GPU suite: GPU_SUITE_SSB_SF=N GPU_SUITE_SQL=bench/probes/dims_overlap.sql.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
SELECT uvm.cache_table('lineorder', ARRAY['lo_orderdate', 'lo_discount', 'lo_quantity', 'lo_extendedprice',
  'lo_custkey', 'lo_partkey', 'lo_suppkey', 'lo_revenue', 'lo_supplycost']) AS lineorder_rows;
SELECT uvm.cache_table('date', ARRAY['d_datekey', 'd_year', 'd_yearmonthnum', 'd_yearmonth', 'd_weeknuminyear']) AS date_rows,
       uvm.cache_table('customer', ARRAY['c_custkey', 'c_city', 'c_nation', 'c_region']) AS customer_rows,
       uvm.cache_table('supplier', ARRAY['s_suppkey', 's_city', 's_nation', 's_region']) AS supplier_rows,
       uvm.cache_table('part', ARRAY['p_partkey', 'p_mfgr', 'p_category', 'p_brand1']) AS part_rows;
CREATE FUNCTION pg_temp.times(q text, together boolean, OUT exec_ms numeric, OUT dims_ms numeric)
  LANGUAGE plpgsql AS $$
DECLARE
  plan json;
BEGIN
  PERFORM set_config('pg_uvm_share.enable_async_dimensions', together::text, false);
  EXECUTE 'EXPLAIN (ANALYZE, FORMAT JSON) ' || q INTO plan;
  exec_ms := (plan -> 0 ->> 'Execution Time')::numeric;
  dims_ms := (SELECT m[1]::numeric FROM regexp_matches(plan::text, '"Dimensions Time": ([0-9.]+)') m LIMIT 1);
END $$;
CREATE FUNCTION pg_temp.ab(label text, q text, runs int DEFAULT 5)
  RETURNS TABLE (query text, together_ms numeric, together_dims_ms numeric, serial_ms numeric, serial_dims_ms numeric, ratio numeric)
  LANGUAGE plpgsql AS $$
DECLARE
  a record;
  b record;
  best_a numeric := 'Infinity';
  best_b numeric := 'Infinity';
  dims_a numeric;
  dims_b numeric;
BEGIN
  FOR i IN 0..runs LOOP
    a := pg_temp.times(q, true);
    b := pg_temp.times(q, false);
    CONTINUE WHEN i = 0; -- (a first run of each: warming)
    IF a.exec_ms < best_a THEN best_a := a.exec_ms; dims_a := a.dims_ms; END IF;
    IF b.exec_ms < best_b THEN best_b := b.exec_ms; dims_b := b.dims_ms; END IF;
  END LOOP;
  RESET pg_uvm_share.enable_async_dimensions;
  RETURN QUERY SELECT label, best_a, dims_a, best_b, dims_b, round(best_a / best_b, 2);
END $$;
\set q21 `cat bench/ssb/queries/q2.1.sql`
\set q31 `cat bench/ssb/queries/q3.1.sql`
\set q32 `cat bench/ssb/queries/q3.2.sql`
\set q41 `cat bench/ssb/queries/q4.1.sql`
\set q42 `cat bench/ssb/queries/q4.2.sql`
\set q43 `cat bench/ssb/queries/q4.3.sql`
SELECT value AS provider FROM uvm.device_info() WHERE property = 'provider';
SHOW pg_uvm_share.gpu_execution;
SELECT * FROM pg_temp.ab('Q2.1', :'q21')
UNION ALL SELECT * FROM pg_temp.ab('Q3.1', :'q31')
UNION ALL SELECT * FROM pg_temp.ab('Q3.2', :'q32')
UNION ALL SELECT * FROM pg_temp.ab('Q4.1', :'q41')
UNION ALL SELECT * FROM pg_temp.ab('Q4.2', :'q42')
UNION ALL SELECT * FROM pg_temp.ab('Q4.3', :'q43');
SELECT uvm.cache_drop(t) FROM unnest(ARRAY['lineorder', 'date', 'customer', 'supplier', 'part']) t;
