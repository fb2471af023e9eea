-- pg_uvm_share 0.4.0 -> 0.5.0, run by ALTER EXTENSION pg_uvm_share UPDATE.
--
-- Every change to an SQL object between the two versions goes here, so that an updated
-- installation has exactly the catalog of a fresh 0.5.0 install (tests/regress/sql/
-- uvm_upgrade.sql compares the two). The objects live in schema @extschema@ (uvm).
\echo Use "ALTER EXTENSION pg_uvm_share UPDATE TO '0.5.0'" to load this file. \quit

-- Statistics (issue 28): the cumulative counters of segments, the GPU service and the GpuJoin
-- plan node, as views over their row functions, uvm.stat_reset() (superusers, as
-- pg_stat_reset()), and uvm.progress (long operations running now).
CREATE FUNCTION @extschema@."stat_segments_internal"() RETURNS TABLE (
	"name" TEXT,  /* String */
	"id" bigint,  /* i64 */
	"pins" bigint,  /* i64 */
	"bytes_read" bigint,  /* i64 */
	"bytes_written" bigint,  /* i64 */
	"migrations" bigint,  /* i64 */
	"bytes_migrated" bigint,  /* i64 */
	"last_used" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'stat_segments_internal_wrapper';

CREATE FUNCTION @extschema@."stat_service_internal"() RETURNS TABLE (
	"gpu" INT,  /* Option < i32 > */
	"operation" TEXT,  /* String */
	"requests" bigint,  /* i64 */
	"errors" bigint,  /* i64 */
	"abandoned" bigint,  /* i64 */
	"queue_ms" double precision,  /* f64 */
	"run_ms" double precision  /* f64 */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'stat_service_internal_wrapper';

CREATE FUNCTION @extschema@."stat_gpujoin_internal"() RETURNS TABLE (
	"queries" bigint,  /* i64 */
	"rows" bigint,  /* i64 */
	"batches" bigint,  /* i64 */
	"gpu_ms" double precision,  /* f64 */
	"inner_rows" bigint,  /* i64 */
	"paths_offered" bigint,  /* i64 */
	"plans" bigint,  /* i64 */
	"paths_declined" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'stat_gpujoin_internal_wrapper';

CREATE FUNCTION @extschema@."stat_gpujoin_declined_internal"() RETURNS TABLE (
	"reason" TEXT,  /* String */
	"paths" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'stat_gpujoin_declined_internal_wrapper';

CREATE FUNCTION @extschema@."stat_reset"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'stat_reset_wrapper';

CREATE FUNCTION @extschema@."progress_internal"() RETURNS TABLE (
	"pid" INT,  /* i32 */
	"kind" TEXT,  /* String */
	"phase" TEXT,  /* String */
	"segment" TEXT,  /* Option < String > */
	"done" bigint,  /* i64 */
	"total" bigint,  /* i64 */
	"unit" TEXT,  /* String */
	"started" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'progress_internal_wrapper';

CREATE VIEW @extschema@.stat_segments AS
SELECT s.name, s.id, s.pins, s.bytes_read, s.bytes_written, s.migrations, s.bytes_migrated, s.last_used
  FROM @extschema@.stat_segments_internal() s;
COMMENT ON VIEW @extschema@.stat_segments IS 'Cumulative counters per segment since its creation or uvm.stat_reset(): pins, bytes read (read_segment, checksum_segment) and written (write_segment, fill_segment), migrations and bytes moved, last use.';

CREATE VIEW @extschema@.stat_service AS
SELECT s.gpu, s.operation, s.requests, s.errors, s.abandoned, s.queue_ms, s.run_ms
  FROM @extschema@.stat_service_internal() s;
COMMENT ON VIEW @extschema@.stat_service IS 'Cumulative counters of the GPU service per GPU (NULL: its main thread) and operation: requests completed, errors, requests their clients abandoned, milliseconds queued and run.';

CREATE VIEW @extschema@.stat_gpujoin AS
SELECT s.queries, s.rows, s.batches, s.gpu_ms, s.inner_rows, s.paths_offered, s.plans, s.paths_declined
  FROM @extschema@.stat_gpujoin_internal() s;
COMMENT ON VIEW @extschema@.stat_gpujoin IS 'Cumulative counters of the GpuJoin plan node: queries, rows returned, batches, GPU milliseconds, inner rows, join paths offered to the planner, plans made with it, paths declined (why: uvm.stat_gpujoin_declined).';

CREATE VIEW @extschema@.stat_gpujoin_declined AS
SELECT s.reason, s.paths FROM @extschema@.stat_gpujoin_declined_internal() s;
COMMENT ON VIEW @extschema@.stat_gpujoin_declined IS 'Join paths the GpuJoin plan node declined, per reason (cumulative).';

CREATE VIEW @extschema@.progress AS
SELECT s.pid, s.kind, s.phase, s.segment, s.done, s.total, s.unit, s.started
  FROM @extschema@.progress_internal() s;
COMMENT ON VIEW @extschema@.progress IS 'Long operations running now, in the style of pg_stat_progress_*: migrations (bytes) and the GpuJoin plan node''s inner-side builds (rows read against the estimate, then pairs inserted), with their phase.';

GRANT SELECT ON @extschema@.stat_segments, @extschema@.stat_service, @extschema@.stat_gpujoin,
  @extschema@.stat_gpujoin_declined, @extschema@.progress TO PUBLIC;
REVOKE EXECUTE ON FUNCTION @extschema@.stat_reset() FROM PUBLIC;
