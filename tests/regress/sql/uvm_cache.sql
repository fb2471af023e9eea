-- Column caches (issue 26): uvm.cache_table copies chosen columns of a table into a shared
-- segment; every write marks the cache stale before it changes the table; a reader
-- (uvm.cache_fold) reads the cache only where it answers exactly what the heap would under the
-- reader's snapshot, and the heap otherwise. Runs in both execution modes.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;
CREATE TABLE ct (id int8, a int4, s int2, n numeric(10, 2), f float8, b bool, d date, ts timestamptz, t text, v varchar(20), c char(3));
INSERT INTO ct
SELECT g, CASE WHEN g % 10 = 0 THEN NULL ELSE g % 1000 - 300 END, (g % 100)::int2, (g % 997) / 100.0 - 2,
       CASE WHEN g % 7 = 0 THEN NULL ELSE g / 3.0 END, g % 2 = 0, date '2020-01-01' + (g % 365),
       timestamptz '2020-01-01 00:00+00' + g * interval '1 minute', 'x' || g,
       CASE WHEN g % 11 = 0 THEN NULL ELSE 'region ' || (g % 5) END, 'c'
  FROM generate_series(1, 150000) g;

-- cache vs heap for one column: the cache's answer, then the heap's (cache use off)
CREATE FUNCTION fold_check(colname text) RETURNS TABLE (col text, source text, same_as_heap boolean)
LANGUAGE plpgsql AS $$
DECLARE c record; h record;
BEGIN
  SELECT * INTO c FROM uvm.cache_fold('ct', colname);
  PERFORM set_config('pg_uvm_share.enable_cache', 'off', true);
  SELECT * INTO h FROM uvm.cache_fold('ct', colname);
  PERFORM set_config('pg_uvm_share.enable_cache', 'on', true);
  RETURN QUERY SELECT colname, c.source, (c.rows, c.non_null, c.sum) IS NOT DISTINCT FROM (h.rows, h.non_null, h.sum) AND h.source = 'heap';
END $$;

-- Build: 150000 rows in three blocks of 64 Ki; every cached type (text and varchar as
-- dictionary codes, each dictionary a segment of its own)
SELECT uvm.cache_table('ct', ARRAY['id', 'a', 's', 'n', 'f', 'b', 'd', 'ts', 't', 'v']);
SELECT relation, state, columns, rows, device_bytes + host_bytes > 0 AS has_bytes, built_at IS NOT NULL AS built,
       segment LIKE 'pg_temp_cache_%' AS reserved_name
  FROM uvm.caches;
SELECT f.* FROM unnest(ARRAY['id', 'a', 's', 'n', 'f', 'b', 'd', 'ts', 't', 'v']) c, fold_check(c) f;
SELECT count(*) AS dictionaries FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%_d%' AND name NOT LIKE '%_more';
-- (and each one's room for strings appends add)
SELECT count(*) AS rooms_for_added_strings FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%_d%_more';
SELECT * FROM uvm.cache_fold('ct', 'n');
SELECT count(*), count(n), sum(n) FROM ct;
SELECT last_used IS NOT NULL AS used FROM uvm.caches;
-- a column the cache does not hold: the heap
SELECT source FROM uvm.cache_fold('ct', 'c');

-- Statements that keep the rows keep the cache
EXPLAIN (COSTS OFF) UPDATE ct SET a = 0;
VACUUM ct;
VACUUM FULL ct;
CREATE INDEX ct_id ON ct (id);
CLUSTER ct USING ct_id;
ANALYZE ct;
SELECT state FROM uvm.caches;
SELECT * FROM fold_check('a');

-- Every write marks it stale before it writes (an insert the tail can take appends instead:
-- uvm_cache_append; a numeric NaN it cannot); readers then use the heap; a rebuild is current
INSERT INTO ct (id, a, n) VALUES (-1, 5, 'NaN');
SELECT state FROM uvm.caches;
SELECT * FROM fold_check('a');
SELECT uvm.cache_table('ct', ARRAY['id', 'a']);
SELECT * FROM fold_check('a');
UPDATE ct SET a = a + 1 WHERE id = 5;
SELECT state FROM uvm.caches;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
DELETE FROM ct WHERE id = 6;
SELECT state FROM uvm.caches;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
-- a write that aborts leaves it stale (never wrong, a rebuild later)
BEGIN;
DELETE FROM ct WHERE id < 100;
ROLLBACK;
SELECT state FROM uvm.caches;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
-- a write inside a function, through SPI
DO $$ BEGIN UPDATE ct SET a = 1 WHERE id = 7; END $$;
SELECT state FROM uvm.caches;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
-- a data-modifying CTE under a SELECT
WITH d AS (DELETE FROM ct WHERE id = 8 RETURNING id) SELECT count(*) FROM d;
SELECT state FROM uvm.caches;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
-- COPY FROM appends its rows instead (the uvm_cache_append suite): the cache stays ready
COPY ct (id, a) FROM stdin;
-2	7
\.
SELECT state FROM uvm.caches;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
-- The hooks pass PostgreSQL's errors through untouched: the position of a utility statement's
-- error and the context of COPY's
ALTER TABLE ct ADD COLUMN zz no_such_type;
COPY ct (id) FROM stdin;
x
\.
-- ALTER TABLE and TRUNCATE
ALTER TABLE ct ALTER COLUMN s TYPE int4;
SELECT state FROM uvm.caches;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
TRUNCATE ct;
SELECT state FROM uvm.caches;
SELECT * FROM fold_check('a');
INSERT INTO ct (id, a) SELECT g, g FROM generate_series(1, 1000) g;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
SELECT * FROM fold_check('a');

-- Snapshots: a build in a transaction that wrote the table is read by no snapshot until that
-- transaction commits, and never if it aborts (the cache holds rows nobody will see: the
-- abort marks it stale)
BEGIN;
INSERT INTO ct (id, a) VALUES (1001, 1000000);
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
SELECT source, rows, sum FROM uvm.cache_fold('ct', 'a');
ROLLBACK;
SELECT state FROM uvm.caches;
SELECT source, rows, sum FROM uvm.cache_fold('ct', 'a');
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
-- the same build committed: its commit lets readers in
BEGIN;
INSERT INTO ct (id, a) VALUES (1001, 1000000);
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
COMMIT;
SELECT source, rows, sum FROM uvm.cache_fold('ct', 'a');
DELETE FROM ct WHERE id = 1001;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
-- a build in a subtransaction that aborts, after a write in it, while the transaction commits:
-- the build saw the write the abort undoes, so the abort marks the cache stale (and the same
-- for a build in a subtransaction released into one that aborts)
BEGIN;
SAVEPOINT s;
DELETE FROM ct WHERE id <= 10;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
ROLLBACK TO s;
COMMIT;
SELECT state FROM uvm.caches;
SELECT * FROM fold_check('a');
BEGIN;
SAVEPOINT s1;
SAVEPOINT s2;
DELETE FROM ct WHERE id <= 10;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
RELEASE s2;
ROLLBACK TO s1;
COMMIT;
SELECT state FROM uvm.caches;
SELECT * FROM fold_check('a');
-- a build in a transaction that is prepared: stale at PREPARE TRANSACTION (this backend never
-- learns the outcome), and stays so when it is rolled back (or committed) later
BEGIN;
UPDATE ct SET a = 0 WHERE id <= 10;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
PREPARE TRANSACTION 'uvm_cache_prepared';
SELECT state FROM uvm.caches;
ROLLBACK PREPARED 'uvm_cache_prepared';
SELECT state FROM uvm.caches;
SELECT * FROM fold_check('a');
-- released all the way, it stands
BEGIN;
SAVEPOINT s;
SELECT uvm.cache_table('ct', ARRAY['id', 'a']) AS rows;
RELEASE s;
COMMIT;
SELECT state FROM uvm.caches;
SELECT * FROM fold_check('a');
-- under SERIALIZABLE the heap (the cache takes no predicate locks)
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT source FROM uvm.cache_fold('ct', 'a');
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT source, rows FROM uvm.cache_fold('ct', 'a');
COMMIT;
SET pg_uvm_share.enable_cache = off;
SELECT source FROM uvm.cache_fold('ct', 'a');
RESET pg_uvm_share.enable_cache;

-- Refusals, each with its SQLSTATE; a failed build leaves no slot and no segment
\set VERBOSITY sqlstate
SELECT uvm.cache_table('ct', ARRAY['c']);
SELECT uvm.cache_table('ct', ARRAY['nope']);
SELECT uvm.cache_table('ct', ARRAY['a', 'a']);
SELECT uvm.cache_table(NULL);
CREATE VIEW ctv AS SELECT * FROM ct;
SELECT uvm.cache_table('ctv');
CREATE TEMP TABLE ctt (a int);
SELECT uvm.cache_table('ctt');
CREATE TABLE ctn (a numeric);
SELECT uvm.cache_table('ctn');
CREATE TABLE ctp (a int) PARTITION BY RANGE (a);
CREATE TABLE ctp1 PARTITION OF ctp FOR VALUES FROM (0) TO (10);
SELECT uvm.cache_table('ctp1');
CREATE TABLE ctnan (a numeric(5, 1));
INSERT INTO ctnan VALUES (1.5), ('NaN');
SELECT uvm.cache_table('ctnan');
CREATE ROLE uvm_cache_reader;
SET ROLE uvm_cache_reader;
SELECT uvm.cache_table('ct');
SELECT uvm.cache_fold('ct', 'a');
SELECT uvm.cache_drop('ct');
RESET ROLE;
\set VERBOSITY default
SELECT relation, state FROM uvm.caches ORDER BY 1;
SELECT count(*) AS cache_segments FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%';

-- Row-level security: refused at build; enabling it later leaves the caches stale (an ALTER
-- TABLE marks every cache of the database)
CREATE TABLE ctrls (a int);
INSERT INTO ctrls VALUES (1), (2);
ALTER TABLE ctrls ENABLE ROW LEVEL SECURITY;
SELECT uvm.cache_table('ctrls');
ALTER TABLE ctrls DISABLE ROW LEVEL SECURITY;
SELECT uvm.cache_table('ctrls') AS rows;
ALTER TABLE ctrls ENABLE ROW LEVEL SECURITY;
SELECT state FROM uvm.caches WHERE relation = 'ctrls'::regclass;
SELECT uvm.cache_drop('ctrls');

-- Parallel build (every type but text): the leader and parallel workers each fill whole blocks
-- of their own from the table's parallel scan (each one's last block partly full); the answers
-- are the heap's. Without workers the leader scans alone.
CREATE TABLE ctpar AS
SELECT g::int8 AS k, (g % 97)::int4 AS v, CASE WHEN g % 5 = 0 THEN NULL ELSE (g % 13)::int2 END AS s,
       g % 3 = 0 AS b, date '2000-01-01' + g % 1000 AS d, g / 7.0::float8 AS f,
       CASE WHEN g % 9 = 0 THEN NULL ELSE (g % 100000) / 100.0 - 20 END::numeric(10, 2) AS n
  FROM generate_series(1, 300000) g;
CREATE FUNCTION par_check() RETURNS TABLE (col text, source text, same_as_heap boolean)
LANGUAGE plpgsql AS $$
DECLARE c text; f record; h record;
BEGIN
  FOREACH c IN ARRAY ARRAY['k', 'v', 's', 'b', 'd', 'f', 'n'] LOOP
    SELECT * INTO f FROM uvm.cache_fold('ctpar', c);
    PERFORM set_config('pg_uvm_share.enable_cache', 'off', true);
    SELECT * INTO h FROM uvm.cache_fold('ctpar', c);
    PERFORM set_config('pg_uvm_share.enable_cache', 'on', true);
    RETURN QUERY SELECT c, f.source, (f.rows, f.non_null, f.sum) IS NOT DISTINCT FROM (h.rows, h.non_null, h.sum) AND h.source = 'heap';
  END LOOP;
END $$;
SET min_parallel_table_scan_size = 0;
SET max_parallel_maintenance_workers = 2;
SELECT uvm.cache_table('ctpar') AS rows;
SELECT build_workers > 0 AS parallel, rows, columns FROM uvm.caches WHERE relation = 'ctpar'::regclass;
SELECT * FROM par_check();
SET max_parallel_maintenance_workers = 0;
SELECT uvm.cache_table('ctpar') AS rows;
SELECT build_workers FROM uvm.caches WHERE relation = 'ctpar'::regclass;
SELECT * FROM par_check();
-- a cancelled parallel build (statement_timeout) leaves no cache and no segment
SET max_parallel_maintenance_workers = 2;
SELECT uvm.cache_drop('ctpar');
INSERT INTO ctpar SELECT * FROM ctpar;
INSERT INTO ctpar SELECT * FROM ctpar;
SET statement_timeout = '5ms';
\set VERBOSITY terse
SELECT uvm.cache_table('ctpar');
\set VERBOSITY default
RESET statement_timeout;
SELECT count(*) AS caches FROM uvm.caches WHERE relation = 'ctpar'::regclass;
SELECT count(*) AS cache_segments FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%';
RESET max_parallel_maintenance_workers;
RESET min_parallel_table_scan_size;
DROP TABLE ctpar;
DROP FUNCTION par_check();

-- Drop: cache_drop, and a dropped table's cache is reclaimed
SELECT uvm.cache_drop('ct'), uvm.cache_drop('ct');
SELECT uvm.cache_table('ct', ARRAY['a']) AS rows;
DROP TABLE ct CASCADE;
SELECT count(*) AS caches_left FROM uvm.caches;
SELECT count(*) AS cache_segments FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%';
DROP TABLE ctn, ctp, ctnan, ctrls;
DROP FUNCTION fold_check(text);
DROP ROLE uvm_cache_reader;

-- A user's event trigger that writes a cached table when cache_table makes another table's
-- append trigger: marked as any write (only the extension's own DDL statement is not)
CREATE TABLE ctev (k int, n int);
INSERT INTO ctev SELECT g, 0 FROM generate_series(1, 10) g;
CREATE TABLE ctev2 (a int);
SELECT uvm.cache_table('ctev') AS rows;
CREATE FUNCTION ctev_fn() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE ctev SET n = n + 1; END $$;
CREATE EVENT TRIGGER ctev_et ON ddl_command_end EXECUTE FUNCTION ctev_fn();
SELECT uvm.cache_table('ctev') AS rows;
SELECT state FROM uvm.caches WHERE relation = 'ctev'::regclass;
SELECT uvm.cache_table('ctev2') AS rows;
SELECT state FROM uvm.caches WHERE relation = 'ctev'::regclass;
SELECT source, rows, sum FROM uvm.cache_fold('ctev', 'n');
DROP EVENT TRIGGER ctev_et;
SELECT uvm.cache_drop('ctev'), uvm.cache_drop('ctev2');
DROP TABLE ctev, ctev2;
DROP FUNCTION ctev_fn();

-- cache_table inside a statement that writes its table: its mark was made when it began, and
-- a cache built inside it would miss its later writes, so the build is refused (55006), in a
-- subquery and in a trigger alike; another table's builds. An error caught in a savepoint ends
-- its statement: the table's cache builds after it in the same transaction.
CREATE TABLE ctw (k int, n int);
INSERT INTO ctw SELECT g, 1 FROM generate_series(1, 10) g;
CREATE TABLE ctw2 (a int);
INSERT INTO ctw2 VALUES (1), (2);
UPDATE ctw SET n = n + 1 WHERE k = (SELECT uvm.cache_table('ctw')::int);
UPDATE ctw SET n = n + 1 WHERE k = (SELECT uvm.cache_table('ctw2')::int);
SELECT relation::regclass, state FROM uvm.caches WHERE relation IN ('ctw'::regclass, 'ctw2'::regclass) ORDER BY 1;
CREATE FUNCTION ctw_trg() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM uvm.cache_table('ctw'); RETURN NULL; END $$;
CREATE TRIGGER ctw_t AFTER UPDATE ON ctw FOR EACH ROW EXECUTE FUNCTION ctw_trg();
UPDATE ctw SET n = n + 1 WHERE k = 3;
DROP TRIGGER ctw_t ON ctw;
DO $$ BEGIN
  BEGIN
    UPDATE ctw SET n = n + 1 WHERE k = (SELECT uvm.cache_table('ctw')::int);
  EXCEPTION WHEN object_in_use THEN RAISE NOTICE 'caught %', SQLSTATE;
  END;
  PERFORM uvm.cache_table('ctw');
END $$;
SELECT state FROM uvm.caches WHERE relation = 'ctw'::regclass;
SELECT source, rows, sum FROM uvm.cache_fold('ctw', 'n');
-- A utility statement that changes rows and has a build inside it (here before it rewrites the
-- table, in a ddl_command_start event trigger) marks again when it ends: the cache is stale and
-- readers get the heap's new values.
CREATE FUNCTION ctw_et() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM uvm.cache_table('ctw'); END $$;
CREATE EVENT TRIGGER ctw_et ON ddl_command_start WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION ctw_et();
ALTER TABLE ctw ALTER COLUMN n TYPE int USING n + 100;
SELECT state FROM uvm.caches WHERE relation = 'ctw'::regclass;
SELECT source, rows, sum FROM uvm.cache_fold('ctw', 'n');
DROP EVENT TRIGGER ctw_et;
-- CREATE TABLE AS and SELECT INTO fill their new table through a receiver (no result relation,
-- no trigger): a build of it inside them (here by a function in the query, at the fifth row)
-- is marked when the statement ends
CREATE FUNCTION ctw_build(t text) RETURNS int LANGUAGE plpgsql AS $$ BEGIN PERFORM uvm.cache_table(t::regclass); RETURN 0; END $$;
CREATE TABLE ctas AS SELECT g AS k, CASE WHEN g = 5 THEN ctw_build('ctas') ELSE 1 END AS v FROM generate_series(1, 1000) g;
SELECT state FROM uvm.caches WHERE relation = 'ctas'::regclass;
SELECT source, rows, sum FROM uvm.cache_fold('ctas', 'v');
SELECT g AS k, CASE WHEN g = 5 THEN ctw_build('ctsi') ELSE 1 END AS v INTO ctsi FROM generate_series(1, 1000) g;
SELECT state FROM uvm.caches WHERE relation = 'ctsi'::regclass;
SELECT source, rows, sum FROM uvm.cache_fold('ctsi', 'v');
-- the same under EXPLAIN ANALYZE, which runs them outside their utility statement (its plan
-- not shown: its text differs between majors)
\o /dev/null
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
CREATE TABLE ctex AS SELECT g AS k, CASE WHEN g = 5 THEN ctw_build('ctex') ELSE 1 END AS v FROM generate_series(1, 1000) g;
\o
SELECT state FROM uvm.caches WHERE relation = 'ctex'::regclass;
SELECT source, rows, sum FROM uvm.cache_fold('ctex', 'v');
\o /dev/null
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
SELECT g AS k, CASE WHEN g = 5 THEN ctw_build('ctexi') ELSE 1 END AS v INTO ctexi FROM generate_series(1, 1000) g;
\o
SELECT state FROM uvm.caches WHERE relation = 'ctexi'::regclass;
SELECT source, rows, sum FROM uvm.cache_fold('ctexi', 'v');
SELECT uvm.cache_drop('ctas'), uvm.cache_drop('ctsi'), uvm.cache_drop('ctex'), uvm.cache_drop('ctexi');
DROP TABLE ctas, ctsi, ctex, ctexi;
DROP FUNCTION ctw_build(text);
SELECT uvm.cache_drop('ctw'), uvm.cache_drop('ctw2');
DROP TABLE ctw, ctw2;
DROP FUNCTION ctw_trg();
DROP FUNCTION ctw_et();

-- A dropped database's caches: no session of its own will reclaim them, so a look at the
-- caches from any other database drops them and their segments
\set regress_db :DBNAME
CREATE DATABASE uvm_cache_dropped;
\c uvm_cache_dropped
SET client_min_messages = warning;
CREATE EXTENSION pg_uvm_share;
RESET client_min_messages;
CREATE TABLE t AS SELECT g::int8 AS k FROM generate_series(1, 1000) g;
SELECT uvm.cache_table('t') AS rows;
\c postgres
DROP DATABASE uvm_cache_dropped;
\c :regress_db
SELECT count(*) AS cache_segments_before FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%';
SELECT count(*) AS caches_here FROM uvm.caches;
SELECT count(*) AS cache_segments_after FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%';
