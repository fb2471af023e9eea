-- pg_uvm_share 0.6.0 -> 0.7.0, run by ALTER EXTENSION pg_uvm_share UPDATE.
--
-- Every change to an SQL object between the two versions goes here, so that an updated
-- installation has exactly the catalog of a fresh 0.7.0 install (tests/regress/sql/
-- uvm_upgrade.sql compares the two). The objects live in schema @extschema@ (uvm).
--
-- Inserts appended to column caches (issue 26): uvm.cache_append(), the function of the append
-- trigger that uvm.cache_table gives a cached table from 0.7.0 on. Caches built by 0.6.0 have no
-- trigger: inserts make them stale, as in 0.6.0, until uvm.cache_table rebuilds them. The view
-- uvm.caches gains appended_rows and append_capacity (after rows), so it and its row function
-- caches_internal() are dropped and made again (a view of a user's over uvm.caches would stop
-- the update: drop it first).
\echo Use "ALTER EXTENSION pg_uvm_share UPDATE TO '0.7.0'" to load this file. \quit

CREATE FUNCTION @extschema@.cache_append() RETURNS trigger
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'uvm_cache_append';
COMMENT ON FUNCTION @extschema@.cache_append() IS 'The function of the statement-level AFTER INSERT trigger pg_uvm_share_cache_append that uvm.cache_table gives a cached table: appends each statement''s new rows to the table''s column cache, so that INSERT and COPY keep it current.';

DROP VIEW @extschema@.caches;
DROP FUNCTION @extschema@.caches_internal();

CREATE FUNCTION @extschema@."caches_internal"() RETURNS TABLE (
	"relation" oid,  /* pg_sys :: Oid */
	"state" TEXT,  /* String */
	"columns" TEXT[],  /* :: std :: option :: Option < Vec < String > > */
	"rows" bigint,  /* i64 */
	"appended_rows" bigint,  /* i64 */
	"append_capacity" bigint,  /* i64 */
	"device_bytes" bigint,  /* i64 */
	"host_bytes" bigint,  /* i64 */
	"build_workers" INT,  /* i32 */
	"built_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"last_used" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"segment" TEXT  /* String */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'caches_internal_wrapper';

CREATE VIEW @extschema@.caches AS
SELECT c.relation::regclass AS relation, c.state, c.columns, c.rows, c.appended_rows, c.append_capacity,
       c.device_bytes, c.host_bytes, c.build_workers, c.built_at, c.last_used, c.segment
  FROM @extschema@.caches_internal() c;
COMMENT ON VIEW @extschema@.caches IS 'The column caches of this database (uvm.cache_table): table, cached columns, rows built, rows inserts appended since (of the append tail''s capacity), bytes per tier, parallel workers that built it beside the builder, state (ready: read where current; stale: a write changed the table since the build, readers use the heap until uvm.cache_table rebuilds it; building; dropping), when built and last read, its segment.';
GRANT SELECT ON @extschema@.caches TO PUBLIC;
