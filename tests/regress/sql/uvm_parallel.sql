-- Parallel workers attach to a segment on their own and read it inside a Gather plan.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

SELECT uvm.create_segment('par_a', 65536) > 0 AS created;
SELECT uvm.write_segment('par_a', 0, decode(repeat('0102030405060708', 16), 'hex'));

CREATE TABLE par_t AS SELECT i FROM generate_series(1, 20000) i;
ANALYZE par_t;

SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
-- force_parallel_mode (PostgreSQL 14, 15) is called debug_parallel_query from 16 on
SELECT set_config(name, 'on', false) AS forced FROM pg_settings
 WHERE name IN ('force_parallel_mode', 'debug_parallel_query');

EXPLAIN (COSTS OFF)
SELECT count(*) FROM par_t WHERE uvm.read_segment('par_a', (i % 128)::bigint, 1) = '\x01'::bytea;

-- the workers really ran (row counts per worker vary, so only this line is shown)
CREATE FUNCTION pg_temp.workers_launched(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    IF l ~ 'Workers Launched' THEN RETURN trim(l); END IF;
  END LOOP;
  RETURN 'no workers launched';
END $$;
SELECT pg_temp.workers_launched($$SELECT count(*) FROM par_t WHERE uvm.read_segment('par_a', (i % 128)::bigint, 1) = '\x01'::bytea$$);

-- every 8th byte is 0x01: 20000 rows, offsets i % 128, 16 of 128 offsets match
SELECT count(*) FROM par_t WHERE uvm.read_segment('par_a', (i % 128)::bigint, 1) = '\x01'::bytea;
SELECT sum(length(uvm.read_segment('par_a', (i % 1024)::bigint, 64))) FROM par_t;

-- every worker computes the same checksum as the leader
SELECT uvm.checksum_segment('par_a', 0, 65536) AS leader \gset
SELECT count(DISTINCT uvm.checksum_segment('par_a', 0, 65536)) AS distinct_values,
       min(uvm.checksum_segment('par_a', 0, 65536)) = :leader AS same_as_leader
  FROM par_t WHERE i % 100 = 0;

SELECT set_config(name, 'off', false) AS forced FROM pg_settings
 WHERE name IN ('force_parallel_mode', 'debug_parallel_query');
DROP TABLE par_t;
SELECT uvm.drop_segment('par_a');
