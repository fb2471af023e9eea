-- GpuJoin against corrupted segments and failing builds (issue 8): every overwritten header
-- or slot array gives a clear ERROR at once (never a hang: the timeout below ends the suite
-- if one comes back), and a build that fails leaves no segment behind.
SET statement_timeout = '5s';
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

CREATE TABLE gjh_dim AS SELECT i::bigint AS k, (i * 3)::bigint AS v FROM generate_series(1, 10000) i;
CREATE TABLE gjh_fact AS SELECT (i % 12000)::bigint AS k FROM generate_series(1, 20000) i;
-- one build to copy a valid table from
SELECT uvm.gpujoin_build('gjh_ok', 'SELECT k, v FROM gjh_dim') AS rows_read;
SELECT (uvm.gpujoin_probe('gjh_ok', k)).* FROM gjh_fact;

-- the issue's reproduction: slot count 1 and slot 0 occupied. It used to spin forever,
-- immune to cancel; now the header check refuses it.
SELECT uvm.gpujoin_build('ht1', 'SELECT k, v FROM gjh_dim WHERE k <= 100') AS rows_read;
SELECT uvm.write_segment('ht1', 16, '\x0100000000000000');
SELECT uvm.write_segment('ht1', 64, '\x0100000000000000');
SELECT pg_temp.try($$SELECT (uvm.gpujoin_probe('ht1', k)).* FROM gjh_fact$$);
SELECT pg_temp.try($$SELECT (uvm.gpujoin_probe('ht1', 5::bigint)).*$$);

-- a valid header over slots that are all occupied: no probe chain ends, so every walk stops
-- after slot_count steps with an ERROR, on the probe and the materializing append alike
SELECT uvm.gpujoin_build('gjh_full', 'SELECT k, v FROM gjh_dim WHERE false') AS rows_read;
SELECT count(uvm.write_segment('gjh_full', 64 + 24 * i, '\x0700000000000000')) FROM generate_series(0, 15) i;
SELECT pg_temp.try($$SELECT (uvm.gpujoin_probe('gjh_full', k)).* FROM gjh_fact$$);
SELECT uvm.gpujoin_pairs_create('gjh_pairs', 16) AS capacity;
SELECT pg_temp.try($$SELECT (uvm.gpujoin_materialize('gjh_full', 'gjh_pairs', k)).* FROM gjh_fact$$);

-- every header field is checked: a copy of gjh_ok's table with one field overwritten
CREATE FUNCTION pg_temp.corrupt(seg text, at bigint, bytes bytea) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  PERFORM uvm.drop_segment(name) FROM uvm.segments WHERE name = seg;
  PERFORM uvm.create_segment(seg, (SELECT size FROM uvm.segments WHERE name = 'gjh_ok'));
  PERFORM uvm.write_segment(seg, 0, uvm.read_segment('gjh_ok', 0, 64));
  PERFORM uvm.write_segment(seg, at, bytes);
  RETURN pg_temp.try(format('SELECT (uvm.gpujoin_probe(%L, k)).* FROM gjh_fact', seg));
END $$;
SELECT pg_temp.corrupt('gjh_c', 0, '\x00');                       -- magic
SELECT pg_temp.corrupt('gjh_c', 8, '\x02000000');                 -- version
SELECT pg_temp.corrupt('gjh_c', 12, '\x03000000');                -- key type
SELECT pg_temp.corrupt('gjh_c', 16, '\x0800000000000000');        -- slot count below 16
SELECT pg_temp.corrupt('gjh_c', 16, '\x0050000000000000');        -- not a power of two
SELECT pg_temp.corrupt('gjh_c', 16, '\x0000000000010000');        -- slots past the segment's end
SELECT pg_temp.corrupt('gjh_c', 24, '\x0100010000000000');        -- row count above half the slots
SELECT pg_temp.corrupt('gjh_c', 24, '\xffffffffffffffff');        -- row count overflowing
SELECT pg_temp.corrupt('gjh_c', 40, '\x02000000');                -- hash function
SELECT pg_temp.corrupt('gjh_c', 56, '\x4800000000000000');        -- slots offset
-- the key type says int4: then it is a type mismatch, not a crash
SELECT pg_temp.corrupt('gjh_c', 12, '\x04000000');
-- a truncated table: the header of a 10000-row table in a segment of 4096 bytes
SELECT uvm.create_segment('gjh_trunc', 4096) > 0 AS created;
SELECT uvm.write_segment('gjh_trunc', 0, uvm.read_segment('gjh_ok', 0, 64));
SELECT pg_temp.try($$SELECT (uvm.gpujoin_probe('gjh_trunc', k)).* FROM gjh_fact$$);
SELECT pg_temp.try($$SELECT (uvm.gpujoin_materialize('gjh_trunc', 'gjh_pairs', k)).* FROM gjh_fact$$);

-- the result buffer's header: counters that would overflow, counters past its capacity,
-- and other fields
SELECT uvm.write_segment('gjh_pairs', 16, '\xffffffffffffff7f');
SELECT pg_temp.try($$SELECT (uvm.gpujoin_materialize('gjh_ok', 'gjh_pairs', k)).* FROM gjh_fact$$);
SELECT pg_temp.try($$SELECT count(*) FROM uvm.gpujoin_pairs('gjh_pairs')$$);
SELECT uvm.write_segment('gjh_pairs', 16, '\x0010000000000000');
SELECT uvm.write_segment('gjh_pairs', 24, '\x0010000000000000');
SELECT pg_temp.try($$SELECT count(*) FROM uvm.gpujoin_pairs('gjh_pairs')$$);
SELECT uvm.write_segment('gjh_pairs', 12, '\x08000000');
SELECT pg_temp.try($$SELECT count(*) FROM uvm.gpujoin_pairs('gjh_pairs')$$);
SELECT pg_temp.try($$SELECT (uvm.gpujoin_materialize('gjh_ok', 'gjh_pairs', k)).* FROM gjh_fact$$);
-- a new buffer works again
SELECT uvm.drop_segment('gjh_pairs');
SELECT uvm.gpujoin_pairs_create('gjh_pairs', 16) AS capacity;
SELECT (uvm.gpujoin_materialize('gjh_ok', 'gjh_pairs', k)).* FROM gjh_fact;
SELECT count(*) FROM uvm.gpujoin_pairs('gjh_pairs');

-- build queries of the wrong shape: exactly two integer columns
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gjh_bad', 'SELECT k, v, v FROM gjh_dim')$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gjh_bad', 'SELECT k FROM gjh_dim')$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gjh_bad', 'SELECT')$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gjh_bad', 'UPDATE gjh_dim SET v = v')$$);
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gjh_bad', 'SELECT k, v::int FROM gjh_dim; SELECT 1')$$);

-- builds that fail halfway leave no segment behind: a division by zero on the first read of
-- the query, then one on its second read (after the segment was made and half filled: the
-- sequence makes the second read differ), and a second read with more rows than the first
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gjh_fail', 'SELECT k, 100 / (k - 5000) FROM gjh_dim')$$);
CREATE SEQUENCE gjh_seq;
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gjh_fail', 'SELECT k, CASE WHEN nextval(''gjh_seq'') > 15000 THEN v / (v - v) ELSE v END FROM gjh_dim')$$);
SELECT nextval('gjh_seq') > 15000 AS second_read_happened;
SELECT setval('gjh_seq', 1);
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('gjh_fail', 'SELECT k, v FROM gjh_dim WHERE nextval(''gjh_seq'') > 5000')$$);
SELECT count(*) AS half_made_segments FROM uvm.segments WHERE name = 'gjh_fail';
SELECT count(*) AS pins_held FROM uvm.attachments WHERE pid = pg_backend_pid() AND pins > 0;
-- and the name is free for a build that works
SELECT uvm.gpujoin_build('gjh_fail', 'SELECT k::int, v FROM gjh_dim WHERE k % 2 = 0') AS rows_read;
SELECT (uvm.gpujoin_probe('gjh_fail', k::int)).* FROM gjh_fact;
SELECT count(*), sum(d.v) FROM gjh_fact f JOIN gjh_dim d ON f.k = d.k AND d.k % 2 = 0;

SELECT uvm.drop_segment(name) FROM uvm.segments WHERE name LIKE 'gjh_%' OR name = 'ht1' ORDER BY name;
DROP TABLE gjh_dim, gjh_fact;
DROP SEQUENCE gjh_seq;
