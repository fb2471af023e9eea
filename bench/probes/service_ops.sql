-- What each request costs inside the GPU service (uvm.stat_service's run time, per operation),
-- for the temporary segments a cached star join makes: created, written, read back, dropped.
-- Run against a service-mode cluster (scripts/gpu-suite run with GPU_SUITE_SQL set to this
-- file, or psql -X -f): per variant, 200 cycles, and each operation's mean time in the
-- service. The variants tell apart what a first touch costs (a segment's first write against
-- its later ones), what the tier and the size change, and what Create and Drop cost alone.
\set ON_ERROR_STOP 0
SET client_min_messages = warning;
-- (reads and writes as requests on every provider: a backend maps no device chunk anyway)
SET pg_uvm_share.map_host_tier = off;
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;
CREATE FUNCTION pg_temp.ops() RETURNS TABLE (operation text, requests numeric, run_ms numeric)
  LANGUAGE sql AS $$ SELECT operation, sum(requests), sum(run_ms) FROM uvm.stat_service GROUP BY 1 $$;
-- n cycles: create a segment of `size` bytes in `tier`, write `writes` times and read `reads`
-- times 16 kB at its start, drop it; returns per operation the requests and the mean
-- microseconds the service ran each, and the cycle's mean wall time in the backend.
CREATE FUNCTION pg_temp.cycles(label text, tier text, size bigint, writes int, reads int, n int)
  RETURNS TABLE (variant text, operation text, requests numeric, us_each numeric, cycle_us numeric)
  LANGUAGE plpgsql AS $$
DECLARE
  data bytea := decode(repeat('ab', 16384), 'hex');
  t0 timestamptz;
  wall numeric;
BEGIN
  CREATE TEMP TABLE IF NOT EXISTS ops_before (operation text, requests numeric, run_ms numeric);
  TRUNCATE ops_before;
  INSERT INTO ops_before SELECT * FROM pg_temp.ops();
  t0 := clock_timestamp();
  FOR i IN 1..n LOOP
    PERFORM uvm.create_segment('probe_service_ops', size, NULL, tier);
    FOR w IN 1..writes LOOP PERFORM uvm.write_segment('probe_service_ops', 0, data); END LOOP;
    FOR r IN 1..reads LOOP PERFORM uvm.read_segment('probe_service_ops', 0, 16384); END LOOP;
    PERFORM uvm.drop_segment('probe_service_ops');
  END LOOP;
  wall := extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
  RETURN QUERY
    SELECT label, a.operation, a.requests - b.requests,
           round((a.run_ms - b.run_ms) * 1000 / (a.requests - b.requests), 1), round(wall, 1)
      FROM pg_temp.ops() a JOIN ops_before b USING (operation)
     WHERE a.requests > b.requests ORDER BY 2;
END $$;
SELECT value AS provider FROM uvm.device_info() WHERE property = 'provider';
SHOW pg_uvm_share.gpu_execution;
SELECT * FROM pg_temp.cycles('device 64 kB: create, drop', 'device', 65536, 0, 0, 200);
SELECT * FROM pg_temp.cycles('device 64 kB: 1 write, 1 read', 'device', 65536, 1, 1, 200);
SELECT * FROM pg_temp.cycles('device 64 kB: 4 writes, 4 reads', 'device', 65536, 4, 4, 200);
SELECT * FROM pg_temp.cycles('device 4 MB: 1 write, 1 read', 'device', 4194304, 1, 1, 200);
SELECT * FROM pg_temp.cycles('host 64 kB: 1 write, 1 read', 'host', 65536, 1, 1, 200);
SELECT * FROM pg_temp.cycles('auto 64 kB: 4 writes, 4 reads', 'auto', 65536, 4, 4, 200);
