-- Registry capacity comes from the GUCs; exceeding it is an ERROR with a hint, and nothing leaks.
-- This suite runs on a cluster with max_segments = 3, max_chunks = 5.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SHOW pg_uvm_share.max_segments;
SHOW pg_uvm_share.max_chunks;
-- the prefix is reserved: unknown settings under it are refused
SELECT pg_temp.try($$SET pg_uvm_share.no_such_setting = 1$$);

SELECT uvm.create_segment('lim_a', 100) > 0, uvm.create_segment('lim_b', 100) > 0, uvm.create_segment('lim_c', 100) > 0;
SELECT pg_temp.try($$SELECT uvm.create_segment('lim_d', 100)$$);

-- chunks: 3 used, 2 left; growing lim_a in two small steps takes them, the third step fails
SELECT uvm.grow_segment('lim_a', 2097153);
SELECT uvm.grow_segment('lim_a', 4194305);
SELECT pg_temp.try($$SELECT uvm.grow_segment('lim_a', 8388609)$$);
SELECT name, size, chunks FROM uvm.segments ORDER BY name;

-- a failed growth left no pending chunk behind: dropping one segment makes room again
SELECT uvm.drop_segment('lim_c');
SELECT uvm.grow_segment('lim_a', 8388609);
-- two segments of three, but all five chunks in use: a new segment needs a chunk
SELECT pg_temp.try($$SELECT uvm.create_segment('lim_d', 100)$$);
SELECT uvm.drop_segment('lim_b');
SELECT uvm.create_segment('lim_d', 100) > 0 AS created_after_drop;
SELECT name, size, chunks FROM uvm.segments ORDER BY name;

SELECT uvm.drop_segment(name) FROM uvm.segments;
SELECT count(*) FROM uvm.segments;
