-- uvm_consumer 1.0: SQL entry points to the C functions of uvm_consumer.c, each a thin wrapper
-- around one use of pg_uvm_share's C API. None is STRICT: a NULL argument is an ERROR (22004).
\echo Use "CREATE EXTENSION uvm_consumer" to load this file. \quit

-- Everyone may call them; what a role may do to a segment, pg_uvm_share decides (its owner's
-- privileges), as for the SQL functions.
GRANT USAGE ON SCHEMA @extschema@ TO PUBLIC;

CREATE FUNCTION create_segment(name text, size bigint, max_size bigint DEFAULT -1, tier text DEFAULT 'auto')
RETURNS bigint AS 'MODULE_PATHNAME', 'uvm_consumer_create' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION drop_segment(name text)
RETURNS void AS 'MODULE_PATHNAME', 'uvm_consumer_drop' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION grow(name text, new_size bigint)
RETURNS bigint AS 'MODULE_PATHNAME', 'uvm_consumer_grow' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION lookup_size(name text)
RETURNS bigint AS 'MODULE_PATHNAME', 'uvm_consumer_lookup' LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION write_part(name text, part integer, nparts integer)
RETURNS integer AS 'MODULE_PATHNAME', 'uvm_consumer_write_part' LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION read_sum(name text, "offset" bigint, length bigint, through_transaction_pin boolean DEFAULT false)
RETURNS bigint AS 'MODULE_PATHNAME', 'uvm_consumer_read_sum' LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION mapping(name text)
RETURNS text AS 'MODULE_PATHNAME', 'uvm_consumer_mapping' LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION pin_for_transaction(name text)
RETURNS bigint AS 'MODULE_PATHNAME', 'uvm_consumer_pin_for_transaction' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION unpin_all()
RETURNS integer AS 'MODULE_PATHNAME', 'uvm_consumer_unpin_all' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION pin_and_fail(name text)
RETURNS void AS 'MODULE_PATHNAME', 'uvm_consumer_pin_and_fail' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION leak_pin(name text)
RETURNS bigint AS 'MODULE_PATHNAME', 'uvm_consumer_leak_pin' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION read_after_unpin(name text)
RETURNS bigint AS 'MODULE_PATHNAME', 'uvm_consumer_read_after_unpin' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION unpin_handle(handle bigint)
RETURNS void AS 'MODULE_PATHNAME', 'uvm_consumer_unpin_handle' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION pin_expect(name text, id bigint, generation bigint)
RETURNS bigint AS 'MODULE_PATHNAME', 'uvm_consumer_pin_expect' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION abi_check(major integer, extra_size integer DEFAULT 0)
RETURNS integer AS 'MODULE_PATHNAME', 'uvm_consumer_abi_check' LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION launch_add(name text, n bigint, v bigint, async boolean DEFAULT false)
RETURNS void AS 'MODULE_PATHNAME', 'uvm_consumer_launch_add' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION launch_range(name text, first bigint, n bigint, v bigint)
RETURNS void AS 'MODULE_PATHNAME', 'uvm_consumer_launch_range' LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Any kernel on the cluster's GPU: not for everyone.
CREATE FUNCTION launch_source(name text, source text, entry text, is_ptx boolean, grid integer, block integer, n bigint, v bigint)
RETURNS void AS 'MODULE_PATHNAME', 'uvm_consumer_launch_source' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE EXECUTE ON FUNCTION launch_source(text, text, text, boolean, integer, integer, bigint, bigint) FROM PUBLIC;

CREATE FUNCTION device_address(name text)
RETURNS bigint AS 'MODULE_PATHNAME', 'uvm_consumer_device_address' LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Column caches (ABI 1.1): a fold over a table's cached column through cache_pin(), NULL where no
-- cache may be read under the query's snapshot.
CREATE FUNCTION cache_fold(rel regclass, colname text)
RETURNS text AS 'MODULE_PATHNAME', 'uvm_consumer_cache_fold' LANGUAGE C VOLATILE PARALLEL UNSAFE;
