-- Without shared_preload_libraries, a module that uses the C API gets a clear ERROR with a hint,
-- never a crash: pg_uvm_share_api() loads the library, which refuses to start so late.
\set VERBOSITY default
-- PostgreSQL 18 adds a CONTEXT line; the rest is the same
\set SHOW_CONTEXT never
SHOW shared_preload_libraries;
CREATE SCHEMA uvm_consumer;
CREATE EXTENSION uvm_consumer SCHEMA uvm_consumer;
SELECT uvm_consumer.abi_check(1);
SELECT uvm_consumer.lookup_size('cap_noload');
-- the SQLSTATE is 55000 (object_not_in_prerequisite_state), every time
DO $$
BEGIN
  PERFORM uvm_consumer.lookup_size('cap_noload');
EXCEPTION WHEN object_not_in_prerequisite_state THEN
  RAISE NOTICE 'SQLSTATE %: %', SQLSTATE, SQLERRM;
END $$;
DROP EXTENSION uvm_consumer;
DROP SCHEMA uvm_consumer;
