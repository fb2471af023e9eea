-- Several GPUs (issue 13), with the host provider simulating two (pg_uvm_share.simulated_devices
-- = 2: their device chunks are memfds), a device budget of 8 MB per GPU, every operation in the
-- GPU service: placement, per-GPU budgets, migration between GPUs, and the views.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

CREATE FUNCTION pg_temp.placed() RETURNS TABLE (name text, size bigint, device_bytes bigint, gpu_bytes bigint[],
                                               host_bytes bigint, chunks int)
LANGUAGE sql AS $$
  SELECT name, size, device_bytes, gpu_bytes, host_bytes, chunks FROM uvm.segments WHERE name LIKE 'g\_%' ORDER BY name
$$;

SELECT property, value FROM uvm.device_info()
 WHERE property IN ('execution', 'provider', 'tiers', 'simulated_devices', 'gpus', 'gpu0_bytes', 'gpu1_bytes')
 ORDER BY property;
SHOW pg_uvm_share.device_memory_limit;

-- The host pool (pg_uvm_share.host_pool_size = 4 MB in pieces of 2 MB): the service fills it
-- after start-up and after every migration that took pieces, a piece at a time (pinned on a thread
-- of its own).
CREATE FUNCTION pg_temp.pool_full() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..500 LOOP
    IF (SELECT value::bigint FROM uvm.device_info() WHERE property = 'host_pool_bytes') = 4 * 1024 * 1024 THEN
      RETURN true;
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RETURN false;
END $$;
SELECT pg_temp.pool_full();

-- device: a segment larger than one GPU's budget spreads over both, chunk by chunk
SELECT uvm.create_segment('g_wide', 12 * 1024 * 1024, NULL, 'device') > 0 AS created;
SELECT * FROM pg_temp.placed();
SELECT uvm.fill_segment('g_wide', 0, 12 * 1024 * 1024, 7);
SELECT uvm.checksum_segment('g_wide', 0, 12 * 1024 * 1024) AS wide_sum \gset

-- device:N: that GPU only; past its budget, or a GPU the cluster lacks, is an error
SELECT uvm.create_segment('g_one', 2 * 1024 * 1024, NULL, 'device:1') > 0 AS created;
SELECT pg_temp.try($$SELECT uvm.create_segment('g_big', 4 * 1024 * 1024, NULL, 'device:1')$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('g_big', 1, NULL, 'device:2')$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('g_big', 1, NULL, 'device:x')$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('g_big', 1, NULL, 'device:-1')$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('g_big', 16 * 1024 * 1024, NULL, 'device')$$);
SELECT count(*) AS nothing_left_behind FROM uvm.segments WHERE name = 'g_big';

-- auto: the GPU with the most room, then the host tier once every GPU is full
SELECT uvm.create_segment('g_auto', 4 * 1024 * 1024) > 0 AS created;
SELECT * FROM pg_temp.placed();
SELECT property, value FROM uvm.device_info() WHERE property IN ('device_bytes', 'gpu0_bytes', 'gpu1_bytes', 'host_bytes')
 ORDER BY property;

-- migration: to the host, between GPUs, to any GPU; a move past a budget moves nothing
SELECT pg_temp.try($$SELECT uvm.prefetch_segment('g_auto', 0, 4 * 1024 * 1024, 'device:0')$$);
SELECT * FROM pg_temp.placed();
SELECT uvm.drop_segment('g_one');
-- g_wide's first chunk (8 MB) goes to the host tier as the pool's two pieces and one fresh
-- chunk for the rest: three chunks where there was one (and its chunk on GPU 1); the service
-- refills the pool
SELECT uvm.prefetch_segment('g_wide', 0, 1, 'host') AS moved_gpu0_to_host;
SELECT chunks, host_bytes FROM uvm.segments WHERE name = 'g_wide';
SELECT pg_temp.pool_full();
SELECT uvm.prefetch_segment('g_auto', 0, 4 * 1024 * 1024, 'device:0') AS moved_gpu1_and_host_to_gpu0;
SELECT * FROM pg_temp.placed();
-- g_wide's 8 MB on the host (chunks of 2, 2 and 4 MB) do not fit in the 4 MB free on each
-- GPU (its 4 MB chunk fits no GPU whole once the 2 MB ones are placed): refused, nothing moves
SELECT pg_temp.try($$SELECT uvm.prefetch_segment('g_wide', 0, 12 * 1024 * 1024, 'device')$$);
SELECT uvm.prefetch_segment('g_auto', 0, 4 * 1024 * 1024, 'host') AS moved_to_host;
-- now they fit GPU 0; the chunk already on GPU 1 stays
SELECT uvm.prefetch_segment('g_wide', 0, 12 * 1024 * 1024, 'device') AS moved_to_any_gpu;
SELECT pg_temp.pool_full();
SELECT * FROM pg_temp.placed();
SELECT uvm.checksum_segment('g_wide', 0, 12 * 1024 * 1024) = :wide_sum AS same_bytes_after_moves;
SELECT pg_temp.try($$SELECT uvm.prefetch_segment('g_wide', 0, 1, 'auto')$$);
SELECT pg_temp.try($$SELECT uvm.prefetch_segment('g_wide', 0, 1, 'device:16')$$);

-- parallel workers read a segment whose chunks lie on both GPUs
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
CREATE TABLE g_parts AS SELECT i FROM generate_series(0, 11) i;
ALTER TABLE g_parts SET (parallel_workers = 2);
SELECT count(*) AS parts, sum(length(uvm.read_segment('g_wide', i * 1024 * 1024, 1024 * 1024))) AS bytes
  FROM g_parts;
SELECT bool_and(uvm.read_segment('g_wide', i * 1024 * 1024, 16) = uvm.read_segment('g_wide', i * 1024 * 1024, 16))
  AS consistent FROM g_parts;
RESET ALL;
DROP TABLE g_parts;

-- routing: the service runs a request on the GPU that holds most of the bytes it reads
-- (g_wide: 8 MB on GPU 0, 4 MB on GPU 1; g_auto: all on the host tier), else on the least
-- loaded GPU (an idle service: GPU 0). Host-tier requests go to the service too here
-- (a backend of the host provider runs them itself otherwise: pg_uvm_share.map_host_tier).
SET pg_uvm_share.map_host_tier = off;
SELECT uvm.create_segment('g_on1', 2 * 1024 * 1024, NULL, 'device:1') > 0 AS created;
CREATE TEMP TABLE routed0 AS
  SELECT property, value::bigint AS n FROM uvm.device_info() WHERE property LIKE 'gpu%\_requests';
SELECT uvm.checksum_segment('g_on1', 0, 4096) IS NOT NULL AS ran FROM generate_series(1, 3);
SELECT uvm.checksum_segment('g_wide', 0, 4096) IS NOT NULL AS ran FROM generate_series(1, 2);
SELECT uvm.checksum_segment('g_auto', 0, 4096) IS NOT NULL AS ran;
SELECT d.property, d.value::bigint - r.n AS routed_here
  FROM uvm.device_info() d JOIN routed0 r USING (property) ORDER BY 1;

-- pg_uvm_share.service_gpus = 1 (reloadable): every request runs on GPU 0, g_on1's too (read
-- over the interconnect); back to all GPUs, g_on1's run on GPU 1 again. The service applies a
-- reload at its next turn: wait until a checksum lands where it should.
CREATE FUNCTION pg_temp.lands_on(seg text, prop text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  before bigint;
BEGIN
  FOR i IN 1..500 LOOP
    before := (SELECT value::bigint FROM uvm.device_info() WHERE property = prop);
    PERFORM uvm.checksum_segment(seg, 0, 4096);
    IF (SELECT value::bigint FROM uvm.device_info() WHERE property = prop) > before THEN
      RETURN true;
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RETURN false;
END $$;
ALTER SYSTEM SET pg_uvm_share.service_gpus = 1;
SELECT pg_reload_conf();
SELECT pg_temp.lands_on('g_on1', 'gpu0_requests') AS g_on1_runs_on_gpu0;
ALTER SYSTEM RESET pg_uvm_share.service_gpus;
SELECT pg_reload_conf();
SELECT pg_temp.lands_on('g_on1', 'gpu1_requests') AS g_on1_runs_on_gpu1_again;

-- everything dropped: every GPU's count is back to zero
SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name LIKE 'g\_%' ORDER BY name;
SELECT property, value FROM uvm.device_info() WHERE property IN ('device_bytes', 'gpu0_bytes', 'gpu1_bytes', 'host_bytes')
 ORDER BY property;
