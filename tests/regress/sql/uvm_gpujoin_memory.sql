-- The GpuJoin plan node's memory is bounded by work_mem × hash_mem_multiplier, as PostgreSQL's
-- hash join's is (issue 24, point 1): an inner side more than ten times that keeps only its
-- hash memory in the node's own memory (a memory context, or the parallel query's DSA area:
-- the hash memory times the participants) and spills the rest (to the cpu tier); a batch's
-- matches are read back a window at a time. The answers are PostgreSQL's, serially and in
-- parallel workers, for joined rows with by-reference inner columns, the aggregate computed in
-- the probe, and a left join. The spill is a segment of the cpu tier, which every process maps
-- under every provider; where a process does not (service mode with
-- pg_uvm_share.map_host_tier off) nothing spills: the planner
-- does not take an inner side it estimates past the hash memory, and one that outgrows it
-- anyway ends the query with 53200.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

-- Runs q with the node forced and with it off: whether the plan used the node, the rows the
-- node's run returned and how many differ between the two runs (as multisets).
CREATE FUNCTION pg_temp.check_join(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  l text;
  used text := 'not used';
  n bigint;
  diff bigint;
BEGIN
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'on', true);
  PERFORM set_config('enable_hashjoin', 'off', true);
  PERFORM set_config('enable_mergejoin', 'off', true);
  PERFORM set_config('enable_nestloop', 'off', true);
  FOR l IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP
    IF l LIKE '%UvmGpuJoin%' THEN used := 'used'; END IF;
  END LOOP;
  EXECUTE 'CREATE TEMP TABLE r_on AS ' || q;
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'off', true);
  PERFORM set_config('enable_hashjoin', 'on', true);
  PERFORM set_config('enable_mergejoin', 'on', true);
  PERFORM set_config('enable_nestloop', 'on', true);
  EXECUTE 'CREATE TEMP TABLE r_off AS ' || q;
  SELECT count(*) INTO n FROM r_on;
  SELECT count(*) INTO diff FROM ((TABLE r_on EXCEPT ALL TABLE r_off) UNION ALL (TABLE r_off EXCEPT ALL TABLE r_on)) x;
  DROP TABLE r_on;
  DROP TABLE r_off;
  RETURN format('node %s: %s rows, %s differ', used, n, diff);
END $$;

-- EXPLAIN ANALYZE's memory figures of the node for q, against the hash memory (times the
-- participants, for a parallel plan): within it, and whether anything spilled.
CREATE FUNCTION pg_temp.memory(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  l text;
  held bigint;
  spilled bigint := 0;
  workers int := 0;
  hash_kb numeric := pg_size_bytes(current_setting('work_mem')) / 1024 * current_setting('hash_mem_multiplier')::numeric;
BEGIN
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'on', true);
  PERFORM set_config('enable_hashjoin', 'off', true);
  PERFORM set_config('enable_mergejoin', 'off', true);
  PERFORM set_config('enable_nestloop', 'off', true);
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    IF l ~ 'Memory Usage: ' THEN held := substring(l from 'Memory Usage: (\d+) kB'); END IF;
    IF l ~ 'Spilled to Host Tier: ' THEN spilled := substring(l from 'Spilled to Host Tier: (\d+) kB'); END IF;
    IF l ~ 'Workers Planned: ' THEN workers := substring(l from 'Workers Planned: (\d+)'); END IF;
  END LOOP;
  IF held IS NULL THEN RETURN 'the node did not run'; END IF;
  RETURN format('within hash memory: %s, spilled: %s, spilled past ten times it: %s',
                held <= hash_kb * (workers + 1), spilled > 0, held + spilled > 10 * hash_kb);
END $$;

CREATE FUNCTION pg_temp.leftovers() RETURNS bigint LANGUAGE sql AS
  $$SELECT count(*) FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin%'$$;

-- 2 MB of hash memory; an inner side of 100,000 rows with a text column (30 MB as the node keeps
-- it), keys 0..49,999 twice each; outer keys over twice that range, so that half match.
SET work_mem = '1MB';
SET hash_mem_multiplier = 2;
CREATE TABLE gjmem_inner AS
  SELECT g % 50000 AS k, g AS v, repeat(chr(97 + g % 26), 200 + g % 100) || g AS t FROM generate_series(1, 100000) g;
CREATE TABLE gjmem_outer AS
  SELECT g AS id, (g * 7) % 100000 AS k, CASE WHEN g % 101 = 0 THEN NULL ELSE g END AS w FROM generate_series(1, 200000) g;
ANALYZE gjmem_inner, gjmem_outer;

-- Serially.
SET max_parallel_workers_per_gather = 0;
SELECT pg_temp.check_join('SELECT o.id, o.w, i.v, i.t FROM gjmem_outer o JOIN gjmem_inner i ON o.k = i.k');
SELECT pg_temp.check_join('SELECT count(*), sum(i.v) FROM gjmem_outer o JOIN gjmem_inner i ON o.k = i.k');
SELECT pg_temp.check_join('SELECT o.id, i.t FROM gjmem_outer o LEFT JOIN gjmem_inner i ON o.k = i.k');
SELECT pg_temp.memory('SELECT o.id, i.t FROM gjmem_outer o JOIN gjmem_inner i ON o.k = i.k');
SELECT pg_temp.memory('SELECT count(*), sum(i.v) FROM gjmem_outer o JOIN gjmem_inner i ON o.k = i.k');

-- In parallel: every participant stores its share, within one budget for all of them.
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
SELECT pg_temp.check_join('SELECT o.id, o.w, i.v, i.t FROM gjmem_outer o JOIN gjmem_inner i ON o.k = i.k');
SELECT pg_temp.check_join('SELECT count(*), sum(i.v) FROM gjmem_outer o JOIN gjmem_inner i ON o.k = i.k');
SELECT pg_temp.check_join('SELECT o.id, i.t FROM gjmem_outer o LEFT JOIN gjmem_inner i ON o.k = i.k');
SELECT pg_temp.memory('SELECT o.id, i.t FROM gjmem_outer o JOIN gjmem_inner i ON o.k = i.k');
RESET max_parallel_workers_per_gather;
SELECT pg_temp.leftovers() AS temporary_segments_left;

-- A cancel (statement_timeout) while the spilled inner side is read: nothing is left behind,
-- and the next query runs.
\set VERBOSITY terse
SET max_parallel_workers_per_gather = 0;
SET pg_uvm_share.enable_gpujoin = on;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET statement_timeout = '300ms';
SELECT count(*) FROM (SELECT o.k FROM gjmem_outer o, generate_series(1, 500) s) o JOIN gjmem_inner i ON o.k = i.k;
RESET statement_timeout;
SELECT pg_temp.leftovers() AS temporary_segments_left;
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET pg_uvm_share.enable_gpujoin;

-- Where nothing can spill (service mode with the host tier unmapped; in process mode a backend
-- maps it whatever the setting): the planner keeps an inner side estimated past the hash memory
-- away from the node, and one estimated under it that grows past it ends with 53200.
SET pg_uvm_share.map_host_tier = off;
DO $$
DECLARE
  service boolean := current_setting('pg_uvm_share.gpu_execution') = 'service';
  l text;
  used boolean := false;
  got text := 'no error';
BEGIN
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'on', true);
  PERFORM set_config('enable_hashjoin', 'off', true);
  PERFORM set_config('enable_mergejoin', 'off', true);
  PERFORM set_config('enable_nestloop', 'off', true);
  FOR l IN EXECUTE 'EXPLAIN (COSTS OFF) SELECT o.id, i.t FROM gjmem_outer o JOIN gjmem_inner i ON o.k = i.k' LOOP
    IF l LIKE '%UvmGpuJoin%' THEN used := true; END IF;
  END LOOP;
  -- (k * 1) % 1 = 0 holds for every row; the planner estimates 0.5% of them.
  BEGIN
    PERFORM count(*) FROM gjmem_outer o JOIN (SELECT * FROM gjmem_inner WHERE (k * 1) % 1 = 0) i ON o.k = i.k;
  EXCEPTION WHEN out_of_memory THEN
    got := 'ERROR 53200';
  END;
  RAISE NOTICE 'large inner side on the node: %; inner side grown past its estimate: %',
    CASE WHEN used = NOT service THEN 'as expected' ELSE format('unexpected (%s)', used) END,
    CASE WHEN got = CASE WHEN service THEN 'ERROR 53200' ELSE 'no error' END THEN 'as expected' ELSE got END;
END $$;
RESET pg_uvm_share.map_host_tier;
SELECT pg_temp.leftovers() AS temporary_segments_left;
\set VERBOSITY default

DROP TABLE gjmem_inner, gjmem_outer;
RESET work_mem;
RESET hash_mem_multiplier;
