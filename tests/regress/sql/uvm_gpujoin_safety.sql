-- The GpuJoin plan node's safety (issue 22): joins on several keys hash every key together
-- (no runaway pair formation), only a type's own equality is taken as the key's, a failed
-- allocation is ERROR 53200 with the server up, and the node's temporary segment names are
-- reserved. The plan node's coexistence with PG-Strom's names is checked by the strom suites
-- (scripts/regress.sh), which run the node battery beside a module registering "GpuJoin".
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

-- whether EXPLAIN (COSTS OFF) of q has a line matching re
CREATE FUNCTION pg_temp.plan_has(q text, re text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP
    IF l ~ re THEN RETURN true; END IF;
  END LOOP;
  RETURN false;
END $$;

-- the node, for the rest of the session: 'forced' (PostgreSQL's joins off), 'offered' (the
-- planner chooses) or 'off'
CREATE FUNCTION pg_temp.mode(m text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('pg_uvm_share.enable_gpujoin', CASE WHEN m = 'off' THEN 'off' ELSE 'on' END, false);
  PERFORM set_config('enable_hashjoin', CASE WHEN m = 'forced' THEN 'off' ELSE 'on' END, false);
  PERFORM set_config('enable_mergejoin', CASE WHEN m = 'forced' THEN 'off' ELSE 'on' END, false);
  PERFORM set_config('enable_nestloop', CASE WHEN m = 'forced' THEN 'off' ELSE 'on' END, false);
END $$;

-- the best of three runs of q in mode m, in milliseconds
CREATE FUNCTION pg_temp.best_ms(q text, m text) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE t timestamptz; best float8 := 'infinity';
BEGIN
  PERFORM pg_temp.mode(m);
  FOR i IN 1..3 LOOP
    t := clock_timestamp();
    EXECUTE q;
    best := least(best, 1000 * extract(epoch FROM clock_timestamp() - t));
  END LOOP;
  RETURN best;
END $$;

-- q forced, offered and off: whether the node is in the forced plan, and whether the answers
-- agree (as multisets; whether the planner picks the node when offered is up to the cost)
CREATE FUNCTION pg_temp.check(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE p_forced boolean; d bigint; n bigint;
BEGIN
  PERFORM pg_temp.mode('forced');
  p_forced := pg_temp.plan_has(q, 'Custom Scan \(UvmGpuJoin');
  EXECUTE 'CREATE TEMP TABLE gjs_r_forced AS ' || q;
  PERFORM pg_temp.mode('offered');
  EXECUTE 'CREATE TEMP TABLE gjs_r_offered AS ' || q;
  PERFORM pg_temp.mode('off');
  EXECUTE 'CREATE TEMP TABLE gjs_r_off AS ' || q;
  SELECT count(*) INTO n FROM gjs_r_off;
  SELECT (SELECT count(*) FROM (SELECT * FROM gjs_r_forced EXCEPT ALL SELECT * FROM gjs_r_off) x)
       + (SELECT count(*) FROM (SELECT * FROM gjs_r_off EXCEPT ALL SELECT * FROM gjs_r_forced) x)
       + (SELECT count(*) FROM (SELECT * FROM gjs_r_offered EXCEPT ALL SELECT * FROM gjs_r_off) x)
       + (SELECT count(*) FROM (SELECT * FROM gjs_r_off EXCEPT ALL SELECT * FROM gjs_r_offered) x) INTO d;
  DROP TABLE gjs_r_forced, gjs_r_offered, gjs_r_off;
  RETURN format('rows %s diff %s node forced %s', n, d, p_forced);
END $$;

CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

CREATE FUNCTION pg_temp.leftovers() RETURNS bigint LANGUAGE sql AS
  $$SELECT count(*) FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin%'$$;

-- 1. Several equality clauses form one key. The issue's case: 200,000 rows a side, a = i % 10,
-- b = i. Hashing a alone formed 4 billion pairs (still running after 90 s); with both
-- clauses in the key the node forms the 200,000 real ones. int4 + int4 pack into one int8
-- (exact: the aggregate is folded in the node); int8 + int8 are hashed and checked again.
CREATE TABLE gjs_mk1 AS SELECT i AS id, i % 10 AS a, i AS b, (i % 10)::int8 AS a8, i::int8 AS b8,
  (i % 10)::int2 AS a2, (i % 7)::int2 AS c2, (i % 13)::int2 AS d2 FROM generate_series(1, 200000) i;
CREATE TABLE gjs_mk2 AS SELECT i AS id, i % 10 AS a, CASE WHEN i % 1000 = 0 THEN NULL ELSE i END AS b,
  (i % 10)::int8 AS a8, CASE WHEN i % 1000 = 0 THEN NULL ELSE i::int8 END AS b8, i % 100 AS w,
  (i % 10)::int2 AS a2, (i % 7)::int2 AS c2, (i % 13)::int2 AS d2 FROM generate_series(1, 200000) i;
ANALYZE gjs_mk1;
ANALYZE gjs_mk2;
SET statement_timeout = '120s';
SELECT pg_temp.check('SELECT count(*), sum(mk2.w) FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a = mk2.a AND mk1.b = mk2.b')
  AS packed_aggregate;
SELECT pg_temp.check('SELECT mk1.id AS i1, mk2.id AS i2, mk2.w FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a = mk2.a AND mk1.b = mk2.b')
  AS packed_rows;
SELECT pg_temp.check('SELECT count(*), sum(mk2.w) FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a8 = mk2.a8 AND mk1.b8 = mk2.b8')
  AS hashed_aggregate;
SELECT pg_temp.check('SELECT mk1.id AS i1, mk2.w FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a8 = mk2.a8 AND mk2.b8 = mk1.b8 AND mk1.id > mk2.w')
  AS hashed_rows_and_qual;
-- three int2 keys (48 bits, packed); an int2, an int4 and an int8 key (hashed)
SELECT pg_temp.check('SELECT mk1.id AS i1, mk2.id AS i2 FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2
  ON mk1.a2 = mk2.a2 AND mk1.c2 = mk2.c2 AND mk1.d2 = mk2.d2 WHERE mk1.id < 300 AND mk2.id < 300') AS three_int2;
SELECT pg_temp.check('SELECT mk1.id AS i1, mk2.id AS i2 FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2
  ON mk1.a2 = mk2.a2 AND mk1.b = mk2.b AND mk1.b8 = mk2.b8') AS mixed_widths;
-- across integer types (int4 = int8, int2 = int4): the numbers are compared
SELECT pg_temp.check('SELECT count(*), sum(mk2.w) FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a = mk2.a8 AND mk1.b = mk2.b8')
  AS cross_type;
SELECT pg_temp.check('SELECT mk1.id AS i1, mk2.id AS i2 FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a2 = mk2.a AND mk1.id = mk2.b')
  AS cross_type_int2;
-- a weak key beside a clause the node cannot hash (an expression): it would form 4 billion
-- pairs for 200,000 joined rows, and is declined, forced or offered (forced, PostgreSQL's own
-- plan is a nested loop that takes minutes: only planned here)
SELECT pg_temp.mode('forced');
SELECT pg_temp.plan_has('SELECT count(*) FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a = mk2.a AND mk1.b = mk2.b + 0', 'UvmGpuJoin')
  AS weak_key_forced_node;
SELECT pg_temp.mode('offered');
SELECT pg_temp.plan_has('SELECT count(*) FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a = mk2.a AND mk1.b = mk2.b + 0', 'UvmGpuJoin')
  AS weak_key_offered_node;
SELECT count(*) FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a = mk2.a AND mk1.b = mk2.b + 0;
-- what EXPLAIN shows (serial plans: in process mode under CUDA the planner prices each
-- worker's CUDA context and may not go parallel, which the GPU suite runs this battery in)
SELECT pg_temp.mode('forced');
SET max_parallel_workers_per_gather = 0;
EXPLAIN (COSTS OFF) SELECT count(*), sum(mk2.w) FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a = mk2.a AND mk1.b = mk2.b;
EXPLAIN (COSTS OFF) SELECT mk1.id, mk2.w FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a8 = mk2.a8 AND mk1.b8 = mk2.b8;
RESET max_parallel_workers_per_gather;
-- the time: forced and offered, no more than 1.5 times PostgreSQL's plus 1 s (best of three
-- each; the runaway took more than 90 s)
SELECT m, pg_temp.best_ms(q, m) <= 1.5 * pg_temp.best_ms(q, 'off') + 1000 AS within_bound
FROM (VALUES ('SELECT count(*), sum(mk2.w) FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a = mk2.a AND mk1.b = mk2.b'),
             ('SELECT count(*), sum(mk2.w) FROM gjs_mk1 mk1 JOIN gjs_mk2 mk2 ON mk1.a8 = mk2.a8 AND mk1.b8 = mk2.b8')) q(q),
     (VALUES ('forced'), ('offered')) m(m);
RESET statement_timeout;

-- 2. Only the type's own equality: an operator that PostgreSQL may hash, in an operator class
-- of its own, whose equality is not the value's (a % 1000 = b % 1000), is left to PostgreSQL
CREATE SCHEMA gjs;
CREATE FUNCTION gjs.mod_eq(int8, int8) RETURNS boolean IMMUTABLE STRICT LANGUAGE sql AS 'SELECT $1 % 1000 = $2 % 1000';
CREATE FUNCTION gjs.mod_hash(int8) RETURNS int4 IMMUTABLE STRICT LANGUAGE sql AS 'SELECT hashint8($1 % 1000)';
CREATE OPERATOR gjs.=== (LEFTARG = int8, RIGHTARG = int8, FUNCTION = gjs.mod_eq, COMMUTATOR = OPERATOR(gjs.===),
  RESTRICT = eqsel, JOIN = eqjoinsel, HASHES);
CREATE OPERATOR CLASS gjs.mod_ops FOR TYPE int8 USING hash AS OPERATOR 1 gjs.===, FUNCTION 1 gjs.mod_hash(int8);
CREATE TABLE gjs_o AS SELECT g AS id, g::int8 AS k FROM generate_series(1, 1000) g;
CREATE TABLE gjs_i AS SELECT g AS id, (1000 * g + 7)::int8 AS k FROM generate_series(1, 100) g;
SELECT pg_temp.check('SELECT o.id AS oid_, i.id AS iid FROM gjs_o o JOIN gjs_i i ON o.k OPERATOR(gjs.===) i.k') AS own_operator;
SELECT count(*) AS pairs_by_mod FROM gjs_o o JOIN gjs_i i ON o.k OPERATOR(gjs.===) i.k;
-- beside the type's own equality, the user's clause is checked on each pair
SELECT pg_temp.check('SELECT o.id AS oid_, i.id AS iid FROM gjs_o o JOIN gjs_i i ON o.k OPERATOR(gjs.===) i.k AND o.id = i.id')
  AS own_operator_beside_equality;

-- 3. A failed allocation (injected by the test-only setting) is ERROR 53200: the query ends,
-- the server and the session stay up, nothing is left behind
\set VERBOSITY terse
SELECT pg_temp.mode('forced');
CREATE TABLE gjs_many AS SELECT g AS id, (g % 50)::int4 AS k FROM generate_series(1, 20000) g;
SET pg_uvm_share.test_alloc_limit = '64kB';
-- a batch's matches read back (20,000 pairs of 16 bytes) for the joined rows; the aggregate,
-- computed in the probe, reads none back (the inner side's pairs are kept in pages within the
-- node's hash memory, or past it in the host tier: uvm_gpujoin_memory), and runs
CREATE TABLE gjs_many2 AS SELECT * FROM gjs_many;
SELECT pg_temp.try('SELECT count(*) FROM (SELECT a.id, b.id FROM gjs_many a JOIN gjs_many2 b ON a.id = b.k OFFSET 0) s') AS inner_keys;
SELECT pg_temp.try('SELECT count(*) FROM gjs_many a JOIN gjs_many2 b ON a.id = b.k') AS inner_keys_aggregate;
SELECT pg_temp.leftovers() AS after_53200;
RESET pg_uvm_share.test_alloc_limit;
SELECT count(*) FROM (SELECT a.id, b.id FROM gjs_many a JOIN gjs_many2 b ON a.id = b.k OFFSET 0) s;
-- only a superuser sets it
CREATE ROLE gjs_user;
SET ROLE gjs_user;
SELECT pg_temp.try($$SET pg_uvm_share.test_alloc_limit = '1kB'$$) AS user_setting;
RESET ROLE;

-- 4. The node's temporary names (pg_temp_gpujoin_<pid>_<n>_<what>) are reserved: no user
-- creates, drops, reads, writes, pins or attaches a segment whose name starts with pg_temp_
SELECT replace(pg_temp.try(format($$SELECT uvm.create_segment('pg_temp_gpujoin_%s_1_inner', 4096)$$, pg_backend_pid())),
               '_' || pg_backend_pid() || '_', '_<pid>_') AS create_own_next;
SELECT pg_temp.try($$SELECT uvm.create_segment('pg_temp_gpujoin_2147483646_1_pairs', 4096)$$) AS create_dead_pid;
SELECT pg_temp.try($$SELECT uvm.create_segment('pg_temp_anything', 4096)$$) AS create_prefix;
SELECT pg_temp.try($$SELECT uvm.drop_segment('pg_temp_gpujoin_1_1_inner')$$) AS drop_;
SELECT pg_temp.try($$SELECT uvm.read_segment('pg_temp_gpujoin_1_1_inner', 0, 1)$$) AS read_;
SELECT pg_temp.try($$SELECT uvm.write_segment('pg_temp_gpujoin_1_1_inner', 0, '\x00')$$) AS write_;
SELECT pg_temp.try($$SELECT uvm.checksum_segment('pg_temp_gpujoin_1_1_inner', 0, 1)$$) AS checksum_;
SELECT pg_temp.try($$SELECT uvm.pin_segment('pg_temp_gpujoin_1_1_inner')$$) AS pin_;
SELECT pg_temp.try($$SELECT uvm.unpin_segment('pg_temp_gpujoin_1_1_inner')$$) AS unpin_;
SELECT pg_temp.try($$SELECT uvm.attach_segment('pg_temp_gpujoin_1_1_inner')$$) AS attach_;
SELECT pg_temp.try($$SELECT uvm.grow_segment('pg_temp_gpujoin_1_1_inner', 8192)$$) AS grow_;
SELECT pg_temp.try($$SELECT uvm.gpujoin_build('pg_temp_gpujoin_1_1_inner', 'SELECT 1::int8, 1::int8')$$) AS build_;
-- a name that merely contains it is the user's; it outlives an aborted transaction's sweep
SELECT uvm.create_segment('my_pg_temp_gpujoin_1_1_inner', 4096) > 0 AS created;
SELECT pg_temp.try('SELECT count(*) FROM gjs_o o JOIN gjs_many i ON o.id = i.k WHERE 1 / (o.id - i.id) > -5') AS aborted_join;
SELECT count(*) AS user_segment_kept FROM uvm.segments WHERE name = 'my_pg_temp_gpujoin_1_1_inner';
SELECT uvm.drop_segment('my_pg_temp_gpujoin_1_1_inner');
-- the node's own segments still work under the reservation, and none is left
SELECT count(*) FROM gjs_o o JOIN gjs_many i ON o.id = i.k;
SELECT pg_temp.leftovers() AS leftovers;
\set VERBOSITY default

-- 5. Planning (issue 24): the node computes its own target list (a sort key and casts over
-- both sides) with no Result node above it, and the same answer
SELECT pg_temp.mode('forced');
SET max_parallel_workers_per_gather = 0;
SELECT pg_temp.plan_has('SELECT (o.id + i.id)::text AS s FROM gjs_o o JOIN gjs_many i ON o.id = i.k ORDER BY o.id + i.id DESC LIMIT 3',
                        '->  Result') AS result_node_above;
SELECT pg_temp.check('SELECT (o.id + i.id)::text AS s, i.k * 2 AS k2 FROM gjs_o o JOIN gjs_many i ON o.id = i.k') AS projected;
-- a key repeated many times is not the side the table is built on: open addressing chains a
-- key's duplicates, so 10,000 rows of one key walk 50 million slots to insert (PostgreSQL's
-- hash join chains them in O(1)); the planner builds on the larger side with unique keys
CREATE TABLE gjs_skew AS SELECT g AS id, (g % 2)::int8 AS k FROM generate_series(1, 20000) g;
CREATE TABLE gjs_uniq AS SELECT g AS id, g::int8 AS k FROM generate_series(0, 199999) g;
ANALYZE gjs_skew, gjs_uniq;
SELECT pg_temp.mode('forced');
SELECT pg_temp.plan_has('SELECT count(*), sum(u.id) FROM gjs_skew s JOIN gjs_uniq u ON s.k = u.k',
                        'Inner Relation: gjs_uniq') AS built_on_unique_side;
SELECT count(*), sum(u.id) FROM gjs_skew s JOIN gjs_uniq u ON s.k = u.k;
RESET max_parallel_workers_per_gather;

DROP ROLE gjs_user;
DROP SCHEMA gjs CASCADE;
DROP TABLE gjs_mk1, gjs_mk2, gjs_o, gjs_i, gjs_many, gjs_many2, gjs_skew, gjs_uniq;
