-- provider = cuda on a machine without the CUDA driver: a clear ERROR, never a crash.
-- (Run only where libcuda.so.1 cannot be loaded; see scripts/regress.sh.)
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SHOW pg_uvm_share.provider;
SELECT pg_temp.try($$SELECT uvm.create_segment('nc', 100)$$);
-- asked again: the same error (the failed probe is remembered), and the backend is fine
SELECT pg_temp.try($$SELECT uvm.create_segment('nc', 100)$$);
SELECT pg_temp.try($$SELECT * FROM uvm.device_info()$$);
SELECT count(*) FROM uvm.segments;
SELECT 1 AS still_alive;
