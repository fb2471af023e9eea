-- Without shared_preload_libraries, CREATE EXTENSION fails with a clear error and a hint.
\set VERBOSITY default
-- PostgreSQL 18 adds a CONTEXT line (the extension script's statement); the rest is the same
\set SHOW_CONTEXT never
SHOW shared_preload_libraries;
CREATE EXTENSION pg_uvm_share;
-- the SQLSTATE is 55000 (object_not_in_prerequisite_state)
DO $$
BEGIN
  CREATE EXTENSION pg_uvm_share;
EXCEPTION WHEN object_not_in_prerequisite_state THEN
  RAISE NOTICE 'SQLSTATE %: %', SQLSTATE, SQLERRM;
END $$;
SELECT count(*) FROM pg_extension WHERE extname = 'pg_uvm_share';
