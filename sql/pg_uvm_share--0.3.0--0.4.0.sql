-- pg_uvm_share 0.3.0 -> 0.4.0, run by ALTER EXTENSION pg_uvm_share UPDATE.
--
-- Every change to an SQL object between the two versions goes here, so that an updated
-- installation has exactly the catalog of a fresh 0.4.0 install (tests/regress/sql/
-- uvm_upgrade.sql compares the two). The objects live in schema @extschema@ (uvm).
\echo Use "ALTER EXTENSION pg_uvm_share UPDATE TO '0.4.0'" to load this file. \quit

-- Several GPUs (issue 13): uvm.segments shows each segment's device bytes per GPU
-- (gpu_bytes[n + 1] is GPU n). The view's row function gains the column, so both are made
-- again; the view keeps its grant.
DROP VIEW @extschema@.segments;
DROP FUNCTION @extschema@.segments_internal();

CREATE FUNCTION @extschema@."segments_internal"() RETURNS TABLE (
	"name" TEXT,  /* String */
	"id" bigint,  /* i64 */
	"owner_oid" oid,  /* pg_sys :: Oid */
	"size" bigint,  /* i64 */
	"max_size" bigint,  /* i64 */
	"device_bytes" bigint,  /* i64 */
	"gpu_bytes" bigint[],  /* Vec < i64 > */
	"host_bytes" bigint,  /* i64 */
	"chunks" INT,  /* i32 */
	"generation" bigint,  /* i64 */
	"attached_processes" INT,  /* i32 */
	"created_at" timestamp with time zone  /* TimestampWithTimeZone */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'segments_internal_wrapper';

CREATE VIEW @extschema@.segments AS
SELECT s.name, s.id, pg_get_userbyid(s.owner_oid) AS owner, s.size, s.max_size,
       s.device_bytes, s.gpu_bytes, s.host_bytes, s.chunks, s.generation, s.attached_processes, s.created_at
  FROM @extschema@.segments_internal() s;
COMMENT ON VIEW @extschema@.segments IS 'Shared segments of the cluster: size, bytes per tier and per GPU (gpu_bytes[n + 1] is GPU n), chunks, generation, attached processes.';
GRANT SELECT ON @extschema@.segments TO PUBLIC;
