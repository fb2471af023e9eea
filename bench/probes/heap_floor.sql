-- How fast can any plan over lineorder's heap be? PostgreSQL's own parallel scan of the table
-- with nothing else to do, against which issue 27's target for the nodes over the heap (each
-- SSB query at most a third of PostgreSQL's time) can be weighed: a plan that reads the heap
-- through PostgreSQL's scan takes at least this.
-- Run against a cluster with the SSB tables loaded (scripts/gpu-suite run with GPU_SUITE_SQL
-- set to this file after the SSB step, or psql -X -f): the best of three EXPLAIN ANALYZE
-- execution times of a bare count(*), and of the sum of one column (the tuples deformed up to
-- it), with the cluster's parallel settings.
\set ON_ERROR_STOP 0
SET client_min_messages = warning;
CREATE FUNCTION pg_temp.best_ms(q text, n int DEFAULT 3) RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
  best numeric;
  l text;
  ms numeric;
BEGIN
  FOR i IN 1..n LOOP
    FOR l IN EXECUTE 'EXPLAIN (ANALYZE, TIMING OFF) ' || q LOOP
      IF l LIKE 'Execution Time:%' THEN
        ms := substring(l FROM '([0-9.]+) ms')::numeric;
        best := least(coalesce(best, ms), ms);
      END IF;
    END LOOP;
  END LOOP;
  RETURN round(best, 1);
END $$;
SELECT count(*) AS lineorder_rows, pg_size_pretty(pg_relation_size('lineorder')) AS heap FROM lineorder;
SHOW max_parallel_workers_per_gather;
SELECT 'count(*)' AS query, pg_temp.best_ms('SELECT count(*) FROM lineorder') AS best_ms
UNION ALL
SELECT 'sum(lo_revenue)', pg_temp.best_ms('SELECT sum(lo_revenue) FROM lineorder')
UNION ALL
SELECT 'sum(lo_supplycost)', pg_temp.best_ms('SELECT sum(lo_supplycost) FROM lineorder');
