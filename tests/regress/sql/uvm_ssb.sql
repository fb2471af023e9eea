-- The Star Schema Benchmark (bench/ssb: the generator and the 13 queries as the specification
-- writes them; issue 27) at scale factor 0.05 on the GpuJoin plan node: each query with every
-- join the node can take on it (PostgreSQL's joins off) gives PostgreSQL's own answer, serially
-- and in parallel workers. bench/ssb/run times the same queries at larger scales.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;
CREATE SCHEMA ssb;
SET search_path = ssb, public;
\set ECHO none
\set sf 0.05
\i bench/ssb/generate.sql
\set ON_ERROR_STOP off
\set ECHO all
SELECT (SELECT count(*) FROM lineorder) AS lineorder, (SELECT count(*) FROM customer) AS customer,
       (SELECT count(*) FROM supplier) AS supplier, (SELECT count(*) FROM part) AS part,
       (SELECT count(*) FROM date) AS date;

-- Runs q with the node forced and with it off (parallel plans allowed when par): the GpuJoin
-- nodes in the forced plan, whether a Gather is above them, the rows and whether both answers
-- are the same multiset of rows.
CREATE FUNCTION pg_temp.ssb(q text, par boolean DEFAULT false) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  l text;
  nodes int := 0;
  gather boolean := false;
  a_on text;
  a_off text;
  body text := rtrim(q, E'; \n');
BEGIN
  IF par THEN
    PERFORM set_config('parallel_setup_cost', '0', true);
    PERFORM set_config('parallel_tuple_cost', '0', true);
    PERFORM set_config('min_parallel_table_scan_size', '0', true);
    PERFORM set_config('max_parallel_workers_per_gather', '2', true);
  ELSE
    PERFORM set_config('max_parallel_workers_per_gather', '0', true);
  END IF;
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'on', true);
  PERFORM set_config('enable_hashjoin', 'off', true);
  PERFORM set_config('enable_mergejoin', 'off', true);
  PERFORM set_config('enable_nestloop', 'off', true);
  FOR l IN EXECUTE 'EXPLAIN (COSTS OFF) ' || body LOOP
    IF l LIKE '%Custom Scan (UvmGpuJoin)%' THEN nodes := nodes + 1; END IF;
    IF l LIKE '%Gather%' THEN gather := true; END IF;
  END LOOP;
  EXECUTE format('SELECT count(*) || '' rows '' || md5(coalesce(string_agg(t::text, '','' ORDER BY t::text), '''')) FROM (%s) t', body)
    INTO a_on;
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'off', true);
  PERFORM set_config('enable_hashjoin', 'on', true);
  PERFORM set_config('enable_mergejoin', 'on', true);
  PERFORM set_config('enable_nestloop', 'on', true);
  EXECUTE format('SELECT count(*) || '' rows '' || md5(coalesce(string_agg(t::text, '','' ORDER BY t::text), '''')) FROM (%s) t', body)
    INTO a_off;
  RETURN format('%s GpuJoin nodes%s, %s rows: %s', nodes, CASE WHEN gather THEN ' under a Gather' ELSE '' END,
                split_part(a_on, ' ', 1), CASE WHEN a_on = a_off THEN 'same answer' ELSE 'DIFFERENT answers: ' || a_off END);
END $$;

\set q `cat bench/ssb/queries/q1.1.sql`
SELECT pg_temp.ssb(:'q') AS q1_1, pg_temp.ssb(:'q', true) AS q1_1_parallel;
\set q `cat bench/ssb/queries/q1.2.sql`
SELECT pg_temp.ssb(:'q') AS q1_2, pg_temp.ssb(:'q', true) AS q1_2_parallel;
\set q `cat bench/ssb/queries/q1.3.sql`
SELECT pg_temp.ssb(:'q') AS q1_3, pg_temp.ssb(:'q', true) AS q1_3_parallel;
\set q `cat bench/ssb/queries/q2.1.sql`
SELECT pg_temp.ssb(:'q') AS q2_1, pg_temp.ssb(:'q', true) AS q2_1_parallel;
\set q `cat bench/ssb/queries/q2.2.sql`
SELECT pg_temp.ssb(:'q') AS q2_2, pg_temp.ssb(:'q', true) AS q2_2_parallel;
\set q `cat bench/ssb/queries/q2.3.sql`
SELECT pg_temp.ssb(:'q') AS q2_3, pg_temp.ssb(:'q', true) AS q2_3_parallel;
\set q `cat bench/ssb/queries/q3.1.sql`
SELECT pg_temp.ssb(:'q') AS q3_1, pg_temp.ssb(:'q', true) AS q3_1_parallel;
\set q `cat bench/ssb/queries/q3.2.sql`
SELECT pg_temp.ssb(:'q') AS q3_2, pg_temp.ssb(:'q', true) AS q3_2_parallel;
\set q `cat bench/ssb/queries/q3.3.sql`
SELECT pg_temp.ssb(:'q') AS q3_3, pg_temp.ssb(:'q', true) AS q3_3_parallel;
\set q `cat bench/ssb/queries/q3.4.sql`
SELECT pg_temp.ssb(:'q') AS q3_4, pg_temp.ssb(:'q', true) AS q3_4_parallel;
\set q `cat bench/ssb/queries/q4.1.sql`
SELECT pg_temp.ssb(:'q') AS q4_1, pg_temp.ssb(:'q', true) AS q4_1_parallel;
\set q `cat bench/ssb/queries/q4.2.sql`
SELECT pg_temp.ssb(:'q') AS q4_2, pg_temp.ssb(:'q', true) AS q4_2_parallel;
\set q `cat bench/ssb/queries/q4.3.sql`
SELECT pg_temp.ssb(:'q') AS q4_3, pg_temp.ssb(:'q', true) AS q4_3_parallel;

-- nothing of the node's is left behind
SELECT count(*) AS leftovers FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin%';
RESET search_path;
SET client_min_messages = warning;
DROP SCHEMA ssb CASCADE;
RESET client_min_messages;
