-- Cumulative statistics (issue 28): uvm.stat_segments, uvm.stat_service, uvm.stat_gpujoin and
-- uvm.stat_gpujoin_declined after known work, uvm.stat_reset(), and uvm.progress at rest. The
-- main and the service suites run this file with one expected output: what differs between the
-- modes (the GPU service's rows) is compared with what the mode should give.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;
SELECT uvm.stat_reset();
SELECT current_setting('pg_uvm_share.gpu_execution') = 'service' AS service_mode \gset

-- Segments: 1 MiB filled, checksummed, 1000 bytes read, 2 written. In service mode this session
-- sends them to the GPU service (a backend of the host provider runs them itself otherwise:
-- pg_uvm_share.map_host_tier, below).
SET pg_uvm_share.map_host_tier = off;
SELECT uvm.create_segment('st_a', 1048576) > 0 AS created;
SELECT uvm.fill_segment('st_a', 0, 1048576, 7);
SELECT uvm.checksum_segment('st_a', 0, 1048576) <> 0 AS checksummed;
SELECT length(uvm.read_segment('st_a', 0, 1000)) AS read;
SELECT uvm.write_segment('st_a', 0, '\x0102'::bytea) AS written;
SELECT name, pins >= 4 AS pinned, bytes_read, bytes_written, migrations, bytes_migrated,
       last_used > now() - interval '1 minute' AS used_now
  FROM uvm.stat_segments WHERE name = 'st_a';
-- a segment made again starts from zero
SELECT uvm.drop_segment('st_a');
SELECT uvm.create_segment('st_a', 4096) > 0 AS created;
SELECT pins, bytes_read, bytes_written, last_used FROM uvm.stat_segments WHERE name = 'st_a';

-- The GPU service: in service mode every operation above was its request (fill and checksum
-- once each, on GPU 0's executors here), none in process mode.
SELECT (SELECT coalesce(sum(requests), 0) FROM uvm.stat_service WHERE operation = 'checksum')
       = CASE WHEN :'service_mode'::boolean THEN 1 ELSE 0 END AS checksum_counted,
       (SELECT coalesce(sum(requests), 0) FROM uvm.stat_service WHERE operation = 'fill')
       = CASE WHEN :'service_mode'::boolean THEN 1 ELSE 0 END AS fill_counted,
       (SELECT coalesce(sum(requests), 0) FROM uvm.stat_service WHERE operation = 'drop' AND gpu IS NULL)
       = CASE WHEN :'service_mode'::boolean THEN 1 ELSE 0 END AS drop_on_the_main_thread,
       (SELECT bool_and(queue_ms >= 0 AND run_ms >= 0 AND errors = 0 AND abandoned = 0) IS NOT false FROM uvm.stat_service) AS times_sane;
-- an error is counted as one (in service mode; the request never leaves the backend otherwise)
SELECT uvm.checksum_segment('st_a', 0, 8192);
SELECT (SELECT coalesce(sum(errors), 0) FROM uvm.stat_service WHERE operation = 'checksum')
       = CASE WHEN :'service_mode'::boolean THEN 1 ELSE 0 END AS error_counted;
-- With map_host_tier on (the default), host-tier bytes that this backend maps (the host
-- provider's memfds) are checksummed here, in either mode: no request, the bytes counted all
-- the same.
SELECT coalesce(sum(requests), 0) AS checksums_before FROM uvm.stat_service WHERE operation = 'checksum' \gset
RESET pg_uvm_share.map_host_tier;
SELECT uvm.checksum_segment('st_a', 0, 4096) IS NOT NULL AS checksummed;
SELECT (SELECT coalesce(sum(requests), 0) FROM uvm.stat_service WHERE operation = 'checksum') = :checksums_before
       AS not_a_request,
       bytes_read
  FROM uvm.stat_segments WHERE name = 'st_a';

-- The plan node: one query of 150 joined rows, forced.
CREATE TABLE st_outer AS SELECT g AS k, g AS v FROM generate_series(1, 1000) g;
CREATE TABLE st_inner AS SELECT g * 2 AS k, g AS w FROM generate_series(1, 150) g;
ANALYZE st_outer, st_inner;
SET pg_uvm_share.enable_gpujoin = on;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_nestloop = off;
SET max_parallel_workers_per_gather = 0;
SELECT uvm.stat_reset();
SELECT count(*) FROM (SELECT o.v, i.w FROM st_outer o JOIN st_inner i ON o.k = i.k OFFSET 0) j;
SELECT queries, rows, batches >= 1 AS batched, inner_rows, paths_offered >= 1 AS offered, plans,
       paths_declined, gpu_ms >= 0 AS timed
  FROM uvm.stat_gpujoin;
-- a join on an expression is declined, and says why
SELECT count(*) FROM st_outer o JOIN st_inner i ON o.k + 0 = i.k;
SELECT reason, paths > 0 AS counted FROM uvm.stat_gpujoin_declined ORDER BY reason;
RESET ALL;

-- uvm.stat_reset() zeroes everything; only superusers may run it (as pg_stat_reset()).
SELECT uvm.stat_reset();
SELECT pins, bytes_read FROM uvm.stat_segments WHERE name = 'st_a';
SELECT count(*) AS service_rows FROM uvm.stat_service;
SELECT queries, rows, paths_declined FROM uvm.stat_gpujoin;
CREATE ROLE uvm_stat_reader;
SET ROLE uvm_stat_reader;
SELECT count(*) >= 1 AS can_read FROM uvm.stat_segments;
SELECT uvm.stat_reset();
RESET ROLE;
DROP ROLE uvm_stat_reader;

-- Nothing runs now: uvm.progress is empty (tests/integration/tests/progress.rs watches rows
-- while operations run).
SELECT * FROM uvm.progress;

DROP TABLE st_outer, st_inner;
SELECT uvm.drop_segment('st_a');
