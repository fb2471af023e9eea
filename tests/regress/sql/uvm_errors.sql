-- Every bad input gets an ERROR with a specific SQLSTATE, and leaves the segment intact.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT uvm.create_segment('err_a', 4096, 4194304) > 0 AS created;
SELECT uvm.write_segment('err_a', 0, 'intact'::bytea);

-- names
SELECT pg_temp.try($$SELECT uvm.create_segment('', 10)$$);
SELECT pg_temp.try($$SELECT uvm.create_segment(repeat('x', 64), 10)$$);
SELECT pg_temp.try($$SELECT uvm.create_segment(repeat('x', 63), 10)$$);
SELECT uvm.drop_segment(repeat('x', 63));
SELECT pg_temp.try($$SELECT uvm.create_segment('err_a', 10)$$);
SELECT pg_temp.try($$SELECT uvm.read_segment('no_such', 0, 1)$$);
SELECT pg_temp.try($$SELECT uvm.drop_segment('no_such')$$);
SELECT pg_temp.try($$SELECT uvm.grow_segment('no_such', 10)$$);
SELECT pg_temp.try($$SELECT uvm.read_segment('', 0, 1)$$);
SELECT pg_temp.try($$SELECT uvm.create_segment(NULL, 10)$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('err_n', NULL)$$);
SELECT uvm.read_segment(NULL, 0, 1) IS NULL AS strict_null;

-- sizes
SELECT pg_temp.try($$SELECT uvm.create_segment('err_b', 0)$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('err_b', -1)$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('err_b', 9223372036854775807)$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('err_b', 100, 10)$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('err_b', 100, -10)$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('err_b', 100, 9223372036854775807)$$);

-- tiers
SELECT pg_temp.try($$SELECT uvm.create_segment('err_b', 100, NULL, 'gpu')$$);
SELECT pg_temp.try($$SELECT uvm.create_segment('err_b', 100, NULL, 'device')$$);
SELECT pg_temp.try($$SELECT uvm.prefetch_segment('err_a', 0, 10, 'auto')$$);
SELECT pg_temp.try($$SELECT uvm.prefetch_segment('err_a', 0, 10, 'device')$$);
SELECT pg_temp.try($$SELECT uvm.prefetch_segment('err_a', 0, 10, 'nvme')$$);
SELECT pg_temp.try($$SELECT uvm.prefetch_segment('err_a', 4000, 1000, 'host')$$);

-- the cpu tier: host memory that every process maps and no kernel reads; it never moves to a
-- GPU, and a GpuJoin table or result buffer (kernels' memory) cannot live there
SELECT uvm.create_segment('err_cpu', 4096, 8388608, 'cpu') > 0 AS created;
SELECT host_bytes, device_bytes FROM uvm.segments WHERE name = 'err_cpu';
SELECT uvm.write_segment('err_cpu', 10, '\xcafe'::bytea), uvm.read_segment('err_cpu', 9, 4);
SELECT uvm.grow_segment('err_cpu', 4194304), uvm.checksum_segment('err_cpu', 0, 4194304) = uvm.checksum_segment('err_cpu', 0, 4194304) AS stable;
SELECT pg_temp.try($$SELECT uvm.prefetch_segment('err_cpu', 0, 10, 'device')$$);
SELECT pg_temp.try($$SELECT uvm.prefetch_segment('err_cpu', 0, 10, 'cpu')$$);
SELECT uvm.prefetch_segment('err_cpu', 0, 10, 'host');
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('err_cpu_t', 'SELECT 1::int8, 2::int8', 'cpu')$$);
SELECT count(*) FROM uvm.segments WHERE name = 'err_cpu_t';
SELECT uvm.drop_segment('err_cpu');

-- GPU benchmarks need the CUDA provider
SELECT pg_temp.try($$SELECT uvm.bench_segment_read('err_a', 1)$$);
SELECT pg_temp.try($$SELECT uvm.bench_private_read(1048576, 1)$$);
SELECT pg_temp.try($$SELECT uvm.fill_segment('err_a', 4000, 100, 1)$$);

-- offsets and lengths
SELECT pg_temp.try($$SELECT uvm.read_segment('err_a', -1, 1)$$);
SELECT pg_temp.try($$SELECT uvm.read_segment('err_a', 0, -1)$$);
SELECT pg_temp.try($$SELECT uvm.read_segment('err_a', 4090, 7)$$);
SELECT pg_temp.try($$SELECT uvm.read_segment('err_a', 4097, 0)$$);
SELECT pg_temp.try($$SELECT uvm.read_segment('err_a', 9223372036854775807, 2147483647)$$);
SELECT pg_temp.try($$SELECT uvm.write_segment('err_a', 4095, '\x0102'::bytea)$$);
SELECT pg_temp.try($$SELECT uvm.write_segment('err_a', -5, '\x01'::bytea)$$);
SELECT pg_temp.try($$SELECT uvm.checksum_segment('err_a', 0, 4097)$$);
SELECT pg_temp.try($$SELECT uvm.checksum_segment('err_a', 9223372036854775807, 9223372036854775807)$$);

-- one read returns at most 1 GB (a bytea's limit); the segment itself may be larger
SELECT uvm.create_segment('err_big', 1100000000) > 0 AS created;
SELECT pg_temp.try($$SELECT length(uvm.read_segment('err_big', 0, 1073741821))$$);
SELECT uvm.drop_segment('err_big');

-- growth: shrinking, past max_size, overflow
SELECT pg_temp.try($$SELECT uvm.grow_segment('err_a', 4095)$$);
SELECT pg_temp.try($$SELECT uvm.grow_segment('err_a', -1)$$);
SELECT pg_temp.try($$SELECT uvm.grow_segment('err_a', 4194305)$$);
SELECT pg_temp.try($$SELECT uvm.grow_segment('err_a', 9223372036854775807)$$);
SELECT uvm.grow_segment('err_a', 4096);

-- pinned segments cannot be dropped (here by this very session)
SELECT uvm.pin_segment('err_a');
SELECT pg_temp.try($$SELECT uvm.drop_segment('err_a')$$);
SELECT uvm.unpin_segment('err_a');

-- privileges: a role without the owner's privileges can neither call the writers nor read
CREATE ROLE uvm_regress_other;
SET ROLE uvm_regress_other;
SELECT pg_temp.try($$SELECT uvm.create_segment('err_c', 10)$$);
SELECT pg_temp.try($$SELECT uvm.write_segment('err_a', 0, '\x00'::bytea)$$);
SELECT pg_temp.try($$SELECT uvm.drop_segment('err_a')$$);
SELECT pg_temp.try($$SELECT uvm.read_segment('err_a', 0, 6)$$);
SELECT pg_temp.try($$SELECT uvm.checksum_segment('err_a', 0, 6)$$);
SELECT pg_temp.try($$SELECT uvm.pin_segment('err_a')$$);
SELECT name FROM uvm.segments WHERE name = 'err_a';
RESET ROLE;
-- granted EXECUTE is not enough: the segment belongs to its owner role
GRANT EXECUTE ON FUNCTION uvm.write_segment(text, bigint, bytea) TO uvm_regress_other;
SET ROLE uvm_regress_other;
SELECT pg_temp.try($$SELECT uvm.write_segment('err_a', 0, '\x00'::bytea)$$);
RESET ROLE;
REVOKE EXECUTE ON FUNCTION uvm.write_segment(text, bigint, bytea) FROM uvm_regress_other;
DROP ROLE uvm_regress_other;

-- after all of that, the data is intact and nothing is pinned or leaked
SELECT convert_from(uvm.read_segment('err_a', 0, 6), 'UTF8') AS data;
SELECT name, size, chunks, host_bytes FROM uvm.segments WHERE name LIKE 'err_%';
SELECT pins FROM uvm.attachments WHERE pid = pg_backend_pid() AND segment = 'err_a';
SELECT uvm.drop_segment('err_a');
SELECT count(*) FROM uvm.segments WHERE name LIKE 'err_%';
