-- pg_uvm_share 0.5.0 -> 0.6.0, run by ALTER EXTENSION pg_uvm_share UPDATE.
--
-- Every change to an SQL object between the two versions goes here, so that an updated
-- installation has exactly the catalog of a fresh 0.6.0 install (tests/regress/sql/
-- uvm_upgrade.sql compares the two). The objects live in schema @extschema@ (uvm).
--
-- Column caches (issue 26): uvm.cache_table, uvm.cache_drop, uvm.cache_fold, uvm.caches_internal
-- and the view uvm.caches. Nothing is changed or dropped.
\echo Use "ALTER EXTENSION pg_uvm_share UPDATE TO '0.6.0'" to load this file. \quit

CREATE FUNCTION @extschema@.cache_drop(rel regclass) RETURNS boolean
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'cache_drop_wrapper';

CREATE FUNCTION @extschema@.cache_fold(rel regclass, "column" text)
RETURNS TABLE (source text, rows bigint, non_null bigint, sum numeric)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'cache_fold_wrapper';

CREATE FUNCTION @extschema@.cache_table(rel regclass, columns text[] DEFAULT NULL) RETURNS bigint
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'cache_table_wrapper';

CREATE FUNCTION @extschema@."caches_internal"() RETURNS TABLE (
	"relation" oid,  /* pg_sys :: Oid */
	"state" TEXT,  /* String */
	"columns" TEXT[],  /* :: std :: option :: Option < Vec < String > > */
	"rows" bigint,  /* i64 */
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
SELECT c.relation::regclass AS relation, c.state, c.columns, c.rows, c.device_bytes, c.host_bytes,
       c.build_workers, c.built_at, c.last_used, c.segment
  FROM @extschema@.caches_internal() c;
COMMENT ON VIEW @extschema@.caches IS 'The column caches of this database (uvm.cache_table): table, cached columns, rows, bytes per tier, parallel workers that built it beside the builder, state (ready: read where current; stale: a write changed the table since the build, readers use the heap until uvm.cache_table rebuilds it; building; dropping), when built and last read, its segment.';
GRANT SELECT ON @extschema@.caches TO PUBLIC;
