-- pg_uvm_share 0.2.0 -> 0.3.0, run by ALTER EXTENSION pg_uvm_share UPDATE.
--
-- Every change to an SQL object between the two versions goes here, so that an updated
-- installation has exactly the catalog of a fresh 0.3.0 install (tests/regress/sql/
-- uvm_upgrade.sql compares the two). The objects live in schema @extschema@ (uvm).
\echo Use "ALTER EXTENSION pg_uvm_share UPDATE TO '0.3.0'" to load this file. \quit

-- The GPU service's round-trip benchmark (issue 9): empty requests to wherever the cluster
-- runs its work, timed one by one.
CREATE FUNCTION @extschema@."bench_roundtrip"(
	"requests" INT /* i32 */
) RETURNS TABLE (
	"median_us" double precision,  /* f64 */
	"p99_us" double precision  /* f64 */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'bench_roundtrip_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.bench_roundtrip(integer) FROM PUBLIC;
