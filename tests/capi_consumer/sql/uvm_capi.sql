-- pg_uvm_share's C API, used by uvm_consumer, a C extension built with PGXS against the installed
-- header (tests/capi_consumer). The same expected output in process and in service mode: no
-- address, pid or mode-specific message is printed.
\set VERBOSITY terse
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;
RESET client_min_messages;
CREATE SCHEMA uvm_consumer;
CREATE EXTENSION uvm_consumer SCHEMA uvm_consumer;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
-- only the SQLSTATE, where the message depends on the mode (GPU work without a GPU)
CREATE FUNCTION pg_temp.sqlstate(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE;
END $$;
-- the pins this backend holds on a segment, as the registry counts them
CREATE FUNCTION pg_temp.my_pins(seg text) RETURNS bigint LANGUAGE sql AS $$
  SELECT coalesce(sum(pins), 0) FROM uvm.attachments WHERE pid = pg_backend_pid() AND segment = seg
$$;

-- create, look up: 2 MiB (one chunk of pg_uvm_share.min_chunk_size), growable to 16 MiB
SELECT uvm_consumer.create_segment('cap_a', 2097152, 16777216) > 0 AS created;
SELECT uvm_consumer.lookup_size('cap_a') AS size, uvm_consumer.lookup_size('cap_none') IS NULL AS no_such;
SELECT chunks FROM uvm.segments WHERE name = 'cap_a';

-- write it from parallel workers, a part each, through the PARALLEL SAFE write_part; the leader
-- does not take part, so every part must be written by a worker
CREATE TABLE cap_parts AS SELECT i FROM generate_series(0, 3) i;
ALTER TABLE cap_parts SET (parallel_workers = 2);
ANALYZE cap_parts;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
SET parallel_leader_participation = off;
EXPLAIN (COSTS OFF) SELECT uvm_consumer.write_part('cap_a', i, 4) FROM cap_parts;
SELECT pg_backend_pid() AS leader_pid \gset
SELECT count(*) AS parts, bool_and(w <> :leader_pid) AS all_written_by_workers
  FROM (SELECT uvm_consumer.write_part('cap_a', i, 4) AS w FROM cap_parts) s;
-- word i holds i + 1: 262144 words sum to 262144 * 262145 / 2
SELECT uvm_consumer.read_sum('cap_a', 0, 2097152) AS sum, 262144::bigint * 262145 / 2 AS expected;
SELECT uvm_consumer.read_sum('cap_a', 8, 16) AS words_1_and_2;
-- every process maps the host tier's memfds, in service mode too: a base at the segment's address,
-- every chunk dereferenceable (and its bytes the same as api->read() gives)
SELECT uvm_consumer.mapping('cap_a');
SELECT uvm_consumer.read_sum('cap_a', 2097152, 0) AS empty_at_end;

-- grow it in another session while this one holds a pin for its whole transaction
BEGIN;
SELECT uvm_consumer.pin_for_transaction('cap_a') AS pinned_size;
SELECT pg_temp.my_pins('cap_a') AS my_pins;
-- a second session (psql started by this one, on the same server and database)
\setenv PGDATABASE :DBNAME
\set other_session `psql -X -q -A -t -c "SELECT uvm_consumer.grow('cap_a', 4194304)" 2>&1`
SELECT :'other_session' AS grown_by_other_session;
SELECT size, chunks FROM uvm.segments WHERE name = 'cap_a';
-- the pin still sees the segment as pinned: its bytes, and not one byte more
SELECT uvm_consumer.read_sum('cap_a', 0, 2097152, true) AS sum_through_pin;
SELECT pg_temp.try($$SELECT uvm_consumer.read_sum('cap_a', 2097152, 8, true)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.drop_segment('cap_a')$$);
SELECT uvm_consumer.unpin_all() AS unpinned;
COMMIT;
SELECT pg_temp.my_pins('cap_a') AS my_pins;
SELECT uvm_consumer.lookup_size('cap_a') AS size_after_commit;
-- the workers write the grown segment (mapping its new chunk); 524288 words sum to
-- 524288 * 524289 / 2
SELECT count(*) AS parts, bool_and(w <> :leader_pid) AS all_written_by_workers
  FROM (SELECT uvm_consumer.write_part('cap_a', i, 4) AS w FROM cap_parts) s;
SELECT uvm_consumer.read_sum('cap_a', 0, 4194304) AS sum, 524288::bigint * 524289 / 2 AS expected;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;
RESET max_parallel_workers_per_gather;
RESET parallel_leader_participation;

-- an ERROR releases the pins taken before it: of the statement ...
SELECT uvm_consumer.pin_and_fail('cap_a');
SELECT pg_temp.my_pins('cap_a') AS pins_after_error;
-- ... of a subtransaction (a PL/pgSQL exception block) ...
SELECT pg_temp.try($$SELECT uvm_consumer.pin_and_fail('cap_a')$$);
SELECT pg_temp.my_pins('cap_a') AS pins_after_subtransaction;
-- ... and of the transaction
BEGIN;
SELECT uvm_consumer.pin_for_transaction('cap_a') AS pinned_size;
SELECT pg_temp.my_pins('cap_a') AS pins_in_transaction;
SELECT uvm_consumer.pin_and_fail('cap_a');
ROLLBACK;
SELECT pg_temp.my_pins('cap_a') AS pins_after_rollback, uvm_consumer.unpin_all() AS left_to_unpin;
-- a pin never given back is released with a WARNING when its owner is released: the
-- statement's, or the transaction's at commit
SELECT uvm_consumer.leak_pin('cap_a') AS pinned_size;
SELECT pg_temp.my_pins('cap_a') AS pins_after_leak;
BEGIN;
SELECT uvm_consumer.pin_for_transaction('cap_a') AS pinned_size;
COMMIT;
SELECT pg_temp.my_pins('cap_a') AS pins_after_commit;

-- handles: released (its number holds the pid: masked), never issued, 0
SELECT regexp_replace(pg_temp.try($$SELECT uvm_consumer.read_after_unpin('cap_a')$$), '[0-9]{6,}', 'H') AS released;
SELECT pg_temp.try($$SELECT uvm_consumer.unpin_handle(0)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.unpin_handle(987654321)$$);

-- expectations: the id and generation a caller looked up earlier
SELECT id AS cap_id, generation AS cap_gen FROM uvm.segments WHERE name = 'cap_a' \gset
SELECT uvm_consumer.pin_expect('cap_a', :cap_id, :cap_gen) = :cap_gen AS same_generation,
       uvm_consumer.pin_expect('cap_a', :cap_id, 0) = :cap_gen AS any_generation;
SELECT uvm_consumer.grow('cap_a', 6291456);
SELECT pg_temp.sqlstate(format('SELECT uvm_consumer.pin_expect(%L, %s, %s)', 'cap_a', :cap_id, :cap_gen)) AS stale_generation;
SELECT uvm_consumer.pin_expect('cap_a', :cap_id, 0) > :cap_gen AS generation_moved;
SELECT uvm_consumer.create_segment('cap_b', 4096) > 0 AS created;
SELECT id AS cap_b_id FROM uvm.segments WHERE name = 'cap_b' \gset
SELECT uvm_consumer.drop_segment('cap_b');
SELECT uvm_consumer.create_segment('cap_b', 4096) > :cap_b_id AS created_again;
SELECT pg_temp.sqlstate(format('SELECT uvm_consumer.pin_expect(%L, %s, 0)', 'cap_b', :cap_b_id)) AS dropped_and_created_again;
SELECT uvm_consumer.drop_segment('cap_b');

-- bad input: NULLs, names, sizes, ranges
SELECT pg_temp.try($$SELECT uvm_consumer.create_segment(NULL, 10)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.create_segment('cap_x', NULL)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.write_part(NULL, 0, 1)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.read_sum('cap_a', NULL, 8)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.lookup_size(NULL)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.create_segment('', 10)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.create_segment(repeat('x', 64), 10)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.create_segment('cap_a', 10)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.create_segment('cap_x', 0)$$);
-- the plan nodes' temporary names (pg_temp_...) are reserved, through the C API too
SELECT pg_temp.try($$SELECT uvm_consumer.create_segment('pg_temp_gpujoin_1_1_inner', 4096)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.lookup_size('pg_temp_gpujoin_1_1_inner')$$);
SELECT pg_temp.try($$SELECT uvm_consumer.read_sum('pg_temp_gpujoin_1_1_inner', 0, 8)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.grow('pg_temp_gpujoin_1_1_inner', 8192)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.drop_segment('pg_temp_gpujoin_1_1_inner')$$);
SELECT pg_temp.try($$SELECT uvm_consumer.create_segment('cap_x', 100, 10)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.create_segment('cap_x', 100, -1, 'gpu')$$);
SELECT pg_temp.try($$SELECT uvm_consumer.read_sum('no_such', 0, 8)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.grow('no_such', 10)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.drop_segment('no_such')$$);
SELECT pg_temp.try($$SELECT uvm_consumer.grow('cap_a', 4096)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.grow('cap_a', 33554432)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.read_sum('cap_a', 6291448, 16)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.read_sum('cap_a', 6291464, 0)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.read_sum('cap_a', 4, 8)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.read_sum('cap_a', 0, 8, true)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.write_part('cap_a', 4, 4)$$);
-- a role without the owner's privileges
CREATE ROLE uvm_capi_other;
SET ROLE uvm_capi_other;
SELECT pg_temp.try($$SELECT uvm_consumer.read_sum('cap_a', 0, 8)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.drop_segment('cap_a')$$);
SELECT pg_temp.try($$SELECT uvm_consumer.launch_source('cap_a', 'x', 'k', false, 1, 1, 0, 0)$$);
RESET ROLE;
DROP ROLE uvm_capi_other;

-- the ABI: this module's major works; another major, or a table smaller than the module needs,
-- is an ERROR (version numbers masked: they move with releases)
SELECT uvm_consumer.abi_check(1) AS abi_major;
SELECT regexp_replace(pg_temp.try($$SELECT uvm_consumer.abi_check(2)$$), '[0-9]+\.[0-9]+(\.[0-9]+)?', 'V', 'g') AS other_major;
SELECT regexp_replace(pg_temp.try($$SELECT uvm_consumer.abi_check(1, 4096)$$), '[0-9]+\.[0-9]+(\.[0-9]+)?', 'V', 'g') AS larger_table;

-- GPU work without a GPU: 0A000, synchronous or not; the segment is left as it was
SELECT pg_temp.sqlstate($$SELECT uvm_consumer.launch_add('cap_a', 16, 1, false)$$) AS launch;
SELECT pg_temp.sqlstate($$SELECT uvm_consumer.launch_add('cap_a', 16, 1, true)$$) AS launch_start_wait;
SELECT pg_temp.sqlstate($$SELECT uvm_consumer.launch_range('cap_a', 8, 16, 1)$$) AS launch_at_offset;
SELECT pg_temp.sqlstate($$SELECT uvm_consumer.launch_source('cap_a', 'extern "C" __global__ void k(unsigned long long *p, unsigned long long n, unsigned long long v) { }', 'k', false, 1, 1, 0, 0)$$) AS launch_source;
SELECT pg_temp.sqlstate($$SELECT uvm_consumer.device_address('cap_a')$$) AS device_address;
-- what the caller gets wrong is an ERROR before any GPU is needed
SELECT pg_temp.try($$SELECT uvm_consumer.launch_source('cap_a', 'extern "C" __global__ void k(unsigned long long *p, unsigned long long n, unsigned long long v) { }', 'k', false, 1, 0, 0, 0)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.launch_source('cap_a', '', 'k', false, 1, 1, 0, 0)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.launch_add('cap_a', 786433, 1)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.launch_range('cap_a', 786430, 7, 1)$$);
SELECT pg_temp.try($$SELECT uvm_consumer.launch_add('cap_a', -1, 1)$$);
SELECT uvm_consumer.read_sum('cap_a', 0, 4194304) AS sum_unchanged;
SELECT pg_temp.my_pins('cap_a') AS pins_left;

-- column caches (ABI 1.1): cache_pin() under the query's snapshot; NULL where no cache may be
-- read (none, stale, enable_cache off); the answers are the heap's; a role without SELECT on the
-- table gets 42501; no pin is left behind
CREATE TABLE cap_ct AS
SELECT g::int8 AS k, (g % 1000 - 500)::int4 AS a, date '2020-01-01' + g % 400 AS d,
       CASE WHEN g % 4 = 0 THEN NULL ELSE 'word ' || (g % 50) END AS t
  FROM generate_series(1, 100000) g;
SELECT uvm_consumer.cache_fold('cap_ct', 'k') IS NULL AS no_cache;
SELECT uvm.cache_table('cap_ct') AS rows;
SELECT c, uvm_consumer.cache_fold('cap_ct', c) = h AS same_as_heap
  FROM (VALUES ('k', (SELECT format('rows=%s non_null=%s sum=%s', count(*), count(k), sum(k)) FROM cap_ct)),
               ('a', (SELECT format('rows=%s non_null=%s sum=%s', count(*), count(a), sum(a)) FROM cap_ct)),
               ('d', (SELECT format('rows=%s non_null=%s sum=%s', count(*), count(d), sum(d - date '2000-01-01')) FROM cap_ct)),
               ('t', (SELECT format('rows=%s non_null=%s sum=%s', count(*), count(t), sum(octet_length(t))) FROM cap_ct))) v(c, h);
SET pg_uvm_share.enable_cache = off;
SELECT uvm_consumer.cache_fold('cap_ct', 'k') IS NULL AS cache_off;
RESET pg_uvm_share.enable_cache;
CREATE ROLE uvm_capi_other;
SET ROLE uvm_capi_other;
SELECT pg_temp.try($$SELECT uvm_consumer.cache_fold('cap_ct', 'k')$$);
RESET ROLE;
DROP ROLE uvm_capi_other;
-- (an insert appends to the cache's tail, whose rows need a test per row against the
-- snapshot: the C API hands out no cache with tail rows)
INSERT INTO cap_ct VALUES (0, 0, NULL, NULL);
SELECT uvm_consumer.cache_fold('cap_ct', 'k') IS NULL AS not_handed_out;
SELECT count(*) AS cache_pins_left FROM uvm.attachments a WHERE a.pid = pg_backend_pid() AND a.segment LIKE 'pg_temp_cache_%' AND a.pins > 0;
SELECT uvm.cache_drop('cap_ct');
DROP TABLE cap_ct;

-- drop
SELECT uvm_consumer.drop_segment('cap_a');
SELECT uvm_consumer.lookup_size('cap_a') IS NULL AS dropped;
SELECT pg_temp.try($$SELECT uvm_consumer.read_sum('cap_a', 0, 8)$$);
SELECT count(*) AS segments_left FROM uvm.segments WHERE name LIKE 'cap_%';
DROP TABLE cap_parts;
DROP EXTENSION uvm_consumer;
DROP SCHEMA uvm_consumer;
