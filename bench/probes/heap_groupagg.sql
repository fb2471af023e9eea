-- Where UvmGpuGroupAgg's time over a heap goes (issue 27, point 1; the node's serial form:
-- src/node/groupagg, "Over the heap"), weighed against what the serial scan alone costs and
-- against PostgreSQL's parallel plan. For each SSB query given below: the node's execution time
-- over lineorder's heap and, from EXPLAIN ANALYZE's lines, its batching (reading the rows,
-- laying them out, writing the batches), its scan requests and the scanning itself; beside it
-- a serial sum of the same columns (the tuples read and deformed, the floor of a serial plan),
-- the node in parallel (PostgreSQL's joins off: its runner's batching, its own share and the
-- workers' batches written) and PostgreSQL's own plan with the cluster's parallel settings.
-- Run against a cluster with the SSB tables loaded (scripts/gpu-suite run with GPU_SUITE_SQL
-- set to this file after the SSB step, or psql -X -f from the repository's root): the better of
-- two runs each.
\set ON_ERROR_STOP 0
SET client_min_messages = warning;
CREATE FUNCTION pg_temp.figures(q text, settings text[], n int DEFAULT 3) RETURNS TABLE (total numeric, batching numeric, scan numeric, scanning numeric, node boolean)
LANGUAGE plpgsql AS $$
DECLARE
  l text;
  t numeric; b numeric; s numeric; g numeric; saw boolean; kv text;
BEGIN
  FOREACH kv IN ARRAY settings LOOP
    PERFORM set_config(split_part(kv, '=', 1), split_part(kv, '=', 2), false);
  END LOOP;
  FOR i IN 1..n LOOP
    saw := false; b := NULL; s := NULL; g := NULL;
    FOR l IN EXECUTE 'EXPLAIN (ANALYZE, TIMING ON, COSTS OFF) ' || q LOOP
      saw := saw OR l LIKE '%Read From: heap%';
      IF l LIKE '%Batching Time:%' THEN b := substring(l FROM '([0-9.]+) ms')::numeric; END IF;
      IF l LIKE '% Scan Time:%' THEN s := substring(l FROM '([0-9.]+) ms')::numeric; END IF;
      IF l LIKE '%Scanning Time:%' THEN g := substring(l FROM '([0-9.]+) ms')::numeric; END IF;
      IF l LIKE 'Execution Time:%' THEN t := substring(l FROM '([0-9.]+) ms')::numeric; END IF;
    END LOOP;
    IF total IS NULL OR t < total THEN
      total := round(t, 1); batching := round(b, 1); scan := round(s, 1); scanning := round(g, 1); node := saw;
    END IF;
  END LOOP;
  FOREACH kv IN ARRAY settings LOOP
    EXECUTE format('RESET %s', split_part(kv, '=', 1));
  END LOOP;
  RETURN NEXT;
END $$;
SELECT count(*) AS lineorder_rows, pg_size_pretty(pg_relation_size('lineorder')) AS heap FROM lineorder;
SHOW max_parallel_workers_per_gather;
\set heap '{pg_uvm_share.gpugroupagg_heap=on,max_parallel_workers_per_gather=0,pg_uvm_share.enable_gpujoin=off,enable_hashjoin=off,enable_mergejoin=off,enable_nestloop=off}'
\set serial '{max_parallel_workers_per_gather=0}'
\set postgres '{pg_uvm_share.enable_gpugroupagg=off,pg_uvm_share.enable_gpujoin=off}'
\set parallel '{pg_uvm_share.gpugroupagg_heap=on,pg_uvm_share.enable_gpujoin=off,enable_hashjoin=off,enable_mergejoin=off,enable_nestloop=off}'
WITH q(name, body, cols) AS (VALUES
  ('Q1.1', 'SELECT sum(lo_extendedprice * lo_discount) AS revenue FROM lineorder, date WHERE lo_orderdate = d_datekey AND d_year = 1993 AND lo_discount BETWEEN 1 AND 3 AND lo_quantity < 25',
   'SELECT sum(lo_extendedprice), sum(lo_discount), sum(lo_quantity), sum(lo_orderdate) FROM lineorder'),
  ('Q2.1', 'SELECT sum(lo_revenue), d_year, p_brand1 FROM lineorder, date, part, supplier WHERE lo_orderdate = d_datekey AND lo_partkey = p_partkey AND lo_suppkey = s_suppkey AND p_category = ''MFGR#12'' AND s_region = ''AMERICA'' GROUP BY d_year, p_brand1',
   'SELECT sum(lo_revenue), sum(lo_orderdate), sum(lo_partkey), sum(lo_suppkey) FROM lineorder'),
  ('Q4.1', 'SELECT d_year, c_nation, sum(lo_revenue - lo_supplycost) AS profit FROM date, customer, supplier, part, lineorder WHERE lo_custkey = c_custkey AND lo_suppkey = s_suppkey AND lo_partkey = p_partkey AND lo_orderdate = d_datekey AND c_region = ''AMERICA'' AND s_region = ''AMERICA'' AND (p_mfgr = ''MFGR#1'' OR p_mfgr = ''MFGR#2'') GROUP BY d_year, c_nation',
   'SELECT sum(lo_revenue), sum(lo_supplycost), sum(lo_custkey), sum(lo_suppkey), sum(lo_partkey), sum(lo_orderdate) FROM lineorder')
)
SELECT name,
       n.total AS node_ms, n.node AS on_heap, n.batching AS batching_ms, n.scan AS scan_ms, n.scanning AS scanning_ms,
       f.total AS serial_deform_ms,
       g.total AS parallel_node_ms, g.node AS parallel_on_heap, g.batching AS runner_batching_ms,
       p.total AS postgres_ms,
       round(n.total / nullif(p.total, 0), 2) AS node_over_postgres,
       round(g.total / nullif(p.total, 0), 2) AS parallel_over_postgres,
       round(f.total / nullif(n.total, 0), 2) AS floor_share
  FROM q,
       LATERAL pg_temp.figures(body, :'heap', 2) n,
       LATERAL pg_temp.figures(cols, :'serial', 2) f,
       LATERAL pg_temp.figures(body, :'parallel', 2) g,
       LATERAL pg_temp.figures(body, :'postgres', 2) p;
