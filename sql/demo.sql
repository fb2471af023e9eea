-- pg_uvm_share demo: run by `make run` against a throwaway cluster (psql -X -v ON_ERROR_STOP=1 -f sql/demo.sql).
\echo '== pg_uvm_share demo'
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

\echo '== provider and broker'
SELECT property, value FROM uvm.device_info() ORDER BY property;

-- start from a clean slate if an earlier run left the segment behind
\o /dev/null
SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name = 'demo';
\o

\echo '== create an 8 MiB segment that may grow to 64 MiB'
SELECT uvm.create_segment('demo', 8 * 1024 * 1024, 64 * 1024 * 1024) AS segment_id;

\echo '== write and read back'
SELECT uvm.write_segment('demo', 0, convert_to('hello from pg_uvm_share', 'UTF8')) AS bytes_written;
SELECT convert_from(uvm.read_segment('demo', 0, 23), 'UTF8') AS read_back;

\echo '== grow to 32 MiB and write past the old end'
SELECT uvm.grow_segment('demo', 32 * 1024 * 1024) AS new_size;
SELECT uvm.write_segment('demo', 20 * 1024 * 1024, '\xdeadbeef'::bytea) AS bytes_written;
SELECT uvm.read_segment('demo', 20 * 1024 * 1024, 4) AS read_back;
SELECT uvm.checksum_segment('demo', 0, 32 * 1024 * 1024) AS checksum;

\echo '== parallel workers read the segment: each one attaches to it on its own'
DROP TABLE IF EXISTS uvm_demo_rows;
CREATE TABLE uvm_demo_rows AS SELECT i FROM generate_series(1, 100000) i;
ANALYZE uvm_demo_rows;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
SELECT count(*) FROM uvm_demo_rows WHERE uvm.read_segment('demo', (i % 23)::bigint, 1) = '\x6c'::bytea;
SELECT count(*) AS rows_whose_byte_is_l FROM uvm_demo_rows
 WHERE uvm.read_segment('demo', (i % 23)::bigint, 1) = '\x6c'::bytea;
RESET ALL;
DROP TABLE uvm_demo_rows;

\echo '== GpuJoin: an inner hash table built once in a segment, probed by every parallel worker'
DROP TABLE IF EXISTS uvm_demo_dim, uvm_demo_fact;
CREATE TABLE uvm_demo_dim AS SELECT i::bigint AS k, (i % 1000)::bigint AS v FROM generate_series(1, 100000) i;
CREATE TABLE uvm_demo_fact AS SELECT ((i::bigint * 2654435761) % 200000) AS k FROM generate_series(1, 1000000) i;
ANALYZE uvm_demo_dim, uvm_demo_fact;
SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name = 'demo_dim';
SELECT uvm.gpujoin_build('demo_dim', 'SELECT k, v FROM uvm_demo_dim') AS inner_rows;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
\timing on
SELECT 'gpujoin_probe' AS method, (uvm.gpujoin_probe('demo_dim', f.k)).* FROM uvm_demo_fact f;
SELECT 'PostgreSQL join' AS method, count(*) AS matches, sum(d.v) AS payload_sum
  FROM uvm_demo_fact f JOIN uvm_demo_dim d ON f.k = d.k;
\timing off
EXPLAIN (COSTS OFF) SELECT (uvm.gpujoin_probe('demo_dim', f.k)).* FROM uvm_demo_fact f;
\echo '== GpuJoin, materializing: every worker appends the matched pairs to one result buffer'
\echo '   that starts at 1024 pairs and grows while they run'
SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name = 'demo_pairs';
SELECT uvm.gpujoin_pairs_create('demo_pairs', 1024) AS initial_pairs;
SELECT 'gpujoin_materialize' AS method, (uvm.gpujoin_materialize('demo_dim', 'demo_pairs', f.k)).* FROM uvm_demo_fact f;
SELECT size AS result_buffer_bytes, chunks FROM uvm.segments WHERE name = 'demo_pairs';
SELECT key, payload FROM uvm.gpujoin_pairs('demo_pairs') ORDER BY key, payload LIMIT 3;
SELECT (SELECT count(*) FROM (SELECT key, payload FROM uvm.gpujoin_pairs('demo_pairs')
          EXCEPT ALL SELECT f.k, d.v FROM uvm_demo_fact f JOIN uvm_demo_dim d ON f.k = d.k) x) AS pairs_not_in_join,
       (SELECT count(*) FROM (SELECT f.k, d.v FROM uvm_demo_fact f JOIN uvm_demo_dim d ON f.k = d.k
          EXCEPT ALL SELECT key, payload FROM uvm.gpujoin_pairs('demo_pairs')) x) AS join_rows_missing;
\echo '== GpuJoin as a plan node: the same join written as plain SQL, the node on and off'
\echo '   (pg_uvm_share.enable_gpujoin: auto, the default, offers it where the cluster runs on a GPU and'
\echo '    the planner picks it by cost; here it is forced: on, with PostgreSQL''s joins off. The'
\echo '    aggregates are computed in the node: Custom Scan (UvmGpuJoinAgg). See README)'
SET pg_uvm_share.enable_gpujoin = on;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_nestloop = off;
EXPLAIN (COSTS OFF) SELECT count(*) AS matches, sum(d.v) AS payload_sum
  FROM uvm_demo_fact f JOIN uvm_demo_dim d ON f.k = d.k;
\timing on
SELECT 'plan node on' AS method, count(*) AS matches, sum(d.v) AS payload_sum
  FROM uvm_demo_fact f JOIN uvm_demo_dim d ON f.k = d.k;
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET enable_nestloop;
SET pg_uvm_share.enable_gpujoin = off;
SELECT 'plan node off' AS method, count(*) AS matches, sum(d.v) AS payload_sum
  FROM uvm_demo_fact f JOIN uvm_demo_dim d ON f.k = d.k;
\timing off
EXPLAIN (COSTS OFF) SELECT count(*) AS matches, sum(d.v) AS payload_sum
  FROM uvm_demo_fact f JOIN uvm_demo_dim d ON f.k = d.k;
RESET ALL;
SELECT uvm.drop_segment('demo_pairs');
SELECT uvm.drop_segment('demo_dim');
DROP TABLE uvm_demo_dim, uvm_demo_fact;

\echo '== the registry and this session''s attachment'
SELECT name, size, max_size, host_bytes, device_bytes, chunks, generation, attached_processes
  FROM uvm.segments ORDER BY name;
SELECT pid = pg_backend_pid() AS this_session, segment, same_address, mapped_generation, pins
  FROM uvm.attachments ORDER BY pid;

\echo '== drop'
SELECT uvm.drop_segment('demo');
SELECT count(*) AS segments_left FROM uvm.segments;
