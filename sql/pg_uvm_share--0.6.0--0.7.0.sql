-- pg_uvm_share 0.6.0 -> 0.7.0, run by ALTER EXTENSION pg_uvm_share UPDATE.
--
-- Every change to an SQL object between the two versions goes here, so that an updated
-- installation has exactly the catalog of a fresh 0.7.0 install (tests/regress/sql/
-- uvm_upgrade.sql compares the two). The objects live in schema @extschema@ (uvm).
--
-- Inserts appended to column caches (issue 26): uvm.cache_append(), the function of the append
-- trigger that uvm.cache_table gives a cached table from 0.7.0 on. Caches built by 0.6.0 have no
-- trigger: inserts make them stale, as in 0.6.0, until uvm.cache_table rebuilds them. Nothing is
-- changed or dropped.
\echo Use "ALTER EXTENSION pg_uvm_share UPDATE TO '0.7.0'" to load this file. \quit

CREATE FUNCTION @extschema@.cache_append() RETURNS trigger
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'uvm_cache_append';
COMMENT ON FUNCTION @extschema@.cache_append() IS 'The function of the statement-level AFTER INSERT trigger pg_uvm_share_cache_append that uvm.cache_table gives a cached table: appends each statement''s new rows to the table''s column cache, so that INSERT and COPY keep it current.';
