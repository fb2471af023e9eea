-- Appends (issue 26, point 2): INSERT and COPY keep a cached table's cache current. cache_table
-- gives the table a statement-level AFTER INSERT trigger whose transition table carries each
-- statement's rows into the cache's append tail, each row with its inserting transaction; a
-- reader takes the tail rows its snapshot sees, so the cache stays ready and exact. What the
-- tail cannot follow (an abort, a rollback to a savepoint, a full tail, a NaN, an update) makes
-- the cache stale, as before. Every answer is checked against the heap. Both execution modes.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;
SET pg_uvm_share.enable_gpujoin = on;
SET max_parallel_workers_per_gather = 0;
CREATE TABLE ap (id int8, k int4, v int8, n numeric(12, 2), f float8, b bool);
INSERT INTO ap SELECT g, g % 1000, g * 3, g / 100.0, g / 7.0, g % 2 = 0 FROM generate_series(1, 50000) g;
CREATE TABLE apd (k int8, w int8);
INSERT INTO apd SELECT g, g * 10 FROM generate_series(0, 999) g;
ANALYZE ap, apd;

-- a column's fold from the cache (where the snapshot may read it) and from the heap
CREATE FUNCTION ap_fold(colname text) RETURNS TABLE (col text, source text, rows bigint, same_as_heap boolean)
LANGUAGE plpgsql AS $$
DECLARE c record; h record;
BEGIN
  SELECT * INTO c FROM uvm.cache_fold('ap', colname);
  PERFORM set_config('pg_uvm_share.enable_cache', 'off', true);
  SELECT * INTO h FROM uvm.cache_fold('ap', colname);
  PERFORM set_config('pg_uvm_share.enable_cache', 'on', true);
  RETURN QUERY SELECT colname, c.source, c.rows, (c.rows, c.non_null, c.sum) IS NOT DISTINCT FROM (h.rows, h.non_null, h.sum);
END $$;
-- the join from the caches (where the plan reads them) and PostgreSQL's own
CREATE FUNCTION ap_join() RETURNS TABLE (read_from text, answer text, same_as_heap boolean)
LANGUAGE plpgsql AS $$
DECLARE q text := 'SELECT count(*), sum(d.w) FROM ap f JOIN apd d ON f.k = d.k';
        c text; h text; line text; src text := 'none';
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (ANALYZE, BUFFERS OFF, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    IF line LIKE '%Read From:%' THEN src := trim(split_part(line, 'Read From:', 2)); END IF;
  END LOOP;
  EXECUTE 'SELECT row(t.*)::text FROM (' || q || ') t' INTO c;
  PERFORM set_config('pg_uvm_share.enable_cache', 'off', true);
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'off', true);
  EXECUTE 'SELECT row(t.*)::text FROM (' || q || ') t' INTO h;
  PERFORM set_config('pg_uvm_share.enable_cache', 'on', true);
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'on', true);
  RETURN QUERY SELECT src, c, c IS NOT DISTINCT FROM h;
END $$;
CREATE FUNCTION ap_state() RETURNS text LANGUAGE sql AS $$ SELECT state FROM uvm.caches WHERE relation = 'ap'::regclass $$;

SELECT uvm.cache_table('ap', ARRAY['id', 'k', 'v', 'n', 'f', 'b']) AS rows;
SELECT uvm.cache_table('apd') AS rows;
-- the trigger, and each cache's tail segment
SELECT tgrelid::regclass, tgname, tgenabled, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname LIKE 'pg_uvm_share%' ORDER BY 1;
SELECT count(*) AS tails FROM uvm.segments s JOIN uvm.caches c ON s.name = c.segment || '_tail';
SELECT * FROM ap_join();

-- INSERT appends: the cache stays ready, and answers with the new rows (NULLs included)
INSERT INTO ap VALUES (50001, 5, 7, 1.25, 0.5, true), (50002, NULL, NULL, NULL, NULL, NULL);
INSERT INTO ap SELECT g, g % 1000, -g, -1.5, 1.0, false FROM generate_series(50003, 52000) g;
SELECT ap_state();
SELECT rows, appended_rows, append_capacity FROM uvm.caches WHERE relation = 'ap'::regclass;
SELECT f.* FROM unnest(ARRAY['id', 'k', 'v', 'n', 'b']) c, ap_fold(c) f;
SELECT * FROM ap_join();
-- into the inner side too: its appended keys and payloads join
INSERT INTO apd VALUES (5, 1000000), (NULL, 3), (1000, 77);
SELECT * FROM ap_join();
-- COPY appends too
COPY ap FROM stdin;
60001	7	70	0.07	0.5	t
60002	\N	\N	\N	\N	\N
\.
SELECT ap_state();
SELECT * FROM ap_fold('v');
SELECT * FROM ap_join();
-- INSERT ... ON CONFLICT DO NOTHING appends what it inserted
CREATE UNIQUE INDEX apd_w ON apd (w);
INSERT INTO apd VALUES (5, 10), (7, 5) ON CONFLICT DO NOTHING;
SELECT count(*) FROM apd WHERE k = 7;
SELECT state FROM uvm.caches WHERE relation = 'apd'::regclass;
SELECT * FROM ap_join();

-- A transaction's own appended rows make it read the heap (their command ids are not kept);
-- other sessions' snapshots are tests/integration's (tests/cache.rs: writers beside READ
-- COMMITTED and REPEATABLE READ readers)
BEGIN;
INSERT INTO ap VALUES (70001, 1, 1, 1, 1, true);
SELECT * FROM ap_fold('id');
SELECT * FROM ap_join();
COMMIT;
SELECT ap_state();
SELECT * FROM ap_fold('id');
SELECT * FROM ap_join();

-- A savepoint that appended and committed into its transaction keeps the cache
BEGIN;
SAVEPOINT s1;
INSERT INTO ap VALUES (70002, 2, 2, 2, 2, true);
RELEASE SAVEPOINT s1;
COMMIT;
SELECT ap_state();
SELECT * FROM ap_fold('id');
-- a rollback to a savepoint that appended makes it stale (its rows must never count)
BEGIN;
INSERT INTO ap VALUES (70003, 3, 3, 3, 3, true);
SAVEPOINT s1;
INSERT INTO ap VALUES (70004, 4, 4, 4, 4, true);
ROLLBACK TO SAVEPOINT s1;
COMMIT;
SELECT ap_state();
SELECT * FROM ap_fold('id');
SELECT uvm.cache_table('ap', ARRAY['id', 'k', 'v', 'n', 'f', 'b']) AS rows;
-- an aborted insert makes it stale
BEGIN;
INSERT INTO ap VALUES (70005, 5, 5, 5, 5, true);
ROLLBACK;
SELECT ap_state();
SELECT * FROM ap_fold('id');
SELECT uvm.cache_table('ap', ARRAY['id', 'k', 'v', 'n', 'f', 'b']) AS rows;
-- a failed statement in a plpgsql block (a subtransaction) after an append in it
DO $$ BEGIN
  BEGIN
    INSERT INTO ap VALUES (70006, 6, 6, 6, 6, true);
    PERFORM 1 / 0;
  EXCEPTION WHEN division_by_zero THEN NULL;
  END;
END $$;
SELECT ap_state();
SELECT * FROM ap_fold('id');
SELECT uvm.cache_table('ap', ARRAY['id', 'k', 'v', 'n', 'f', 'b']) AS rows;

-- What appends do not follow marks the cache stale, as before
-- an upsert that may update
INSERT INTO apd VALUES (6, 1) ON CONFLICT (w) DO UPDATE SET k = excluded.k;
SELECT state FROM uvm.caches WHERE relation = 'apd'::regclass;
SELECT * FROM ap_join();
SELECT uvm.cache_table('apd') AS rows;
-- an insert in a data-modifying CTE (the marker cannot tell the statement's rows apart)
WITH i AS (INSERT INTO ap VALUES (70007, 7, 7, 7, 7, true) RETURNING id) SELECT count(*) FROM i;
SELECT ap_state();
SELECT uvm.cache_table('ap', ARRAY['id', 'k', 'v', 'n', 'f', 'b']) AS rows;
-- a numeric NaN, which no scaled integer holds: the insert succeeds, the cache goes stale
CREATE TABLE apn (n numeric(6, 2));
SELECT uvm.cache_table('apn') AS rows;
INSERT INTO apn VALUES (1.5);
SELECT state FROM uvm.caches WHERE relation = 'apn'::regclass;
INSERT INTO apn VALUES ('NaN');
SELECT state FROM uvm.caches WHERE relation = 'apn'::regclass;
SELECT count(*), count(n) FROM apn;
DROP TABLE apn;
-- triggers off for replication (session_replication_role = replica): the trigger does not
-- fire, so the insert marks the cache stale
SET session_replication_role = replica;
INSERT INTO ap VALUES (70008, 8, 8, 8, 8, true);
RESET session_replication_role;
SELECT ap_state();
SELECT * FROM ap_fold('id');
SELECT uvm.cache_table('ap', ARRAY['id', 'k', 'v', 'n', 'f', 'b']) AS rows;
-- a disabled trigger: the same
ALTER TABLE ap DISABLE TRIGGER pg_uvm_share_cache_append;
SELECT uvm.cache_table('ap', ARRAY['id', 'k', 'v', 'n', 'f', 'b']) AS rows;
INSERT INTO ap VALUES (70009, 9, 9, 9, 9, true);
SELECT ap_state();
SELECT * FROM ap_fold('id');
ALTER TABLE ap ENABLE TRIGGER pg_uvm_share_cache_append;
SELECT uvm.cache_table('ap', ARRAY['id', 'k', 'v', 'n', 'f', 'b']) AS rows;
-- a full tail: the insert that does not fit makes it stale (the tail's size is read at build)
SET pg_uvm_share.cache_append_rows = 10;
SELECT uvm.cache_table('ap', ARRAY['id', 'k', 'v', 'n', 'f', 'b']) AS rows;
RESET pg_uvm_share.cache_append_rows;
INSERT INTO ap SELECT g, 1, 1, 1, 1, true FROM generate_series(80001, 80006) g;
SELECT state, appended_rows, append_capacity FROM uvm.caches WHERE relation = 'ap'::regclass;
INSERT INTO ap SELECT g, 1, 1, 1, 1, true FROM generate_series(80007, 80012) g;
SELECT ap_state();
SELECT * FROM ap_fold('id');
SELECT * FROM ap_join();
-- appends off (0 rows): no tail, and the cache has no trigger to keep
SET pg_uvm_share.cache_append_rows = 0;
SELECT uvm.cache_table('ap', ARRAY['id', 'k', 'v', 'n', 'f', 'b']) AS rows;
RESET pg_uvm_share.cache_append_rows;
SELECT tgrelid::regclass, tgname FROM pg_trigger WHERE tgname LIKE 'pg_uvm_share%' ORDER BY 1;
INSERT INTO ap VALUES (80013, 1, 1, 1, 1, true);
SELECT ap_state();
-- a cache with text columns: a row's strings append as their codes in their columns'
-- dictionaries, a string a dictionary lacks as a code past them (its column's added strings:
-- equal strings one code, in one statement or several), NULLs and COPY too; GpuGroupAgg
-- groups and filters the appended rows by them; past the room for added strings (4,096 a
-- column) the cache goes stale (the next build takes them in)
CREATE TABLE apt (id int4, t text, u varchar(8));
INSERT INTO apt SELECT g, 'tag' || (g % 5), CASE WHEN g % 3 = 0 THEN NULL ELSE 'u' || (g % 2) END
  FROM generate_series(1, 20000) g;
ANALYZE apt;
SELECT uvm.cache_table('apt') AS rows;
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'apt'::regclass;
INSERT INTO apt VALUES (20001, 'tag1', 'u0'), (20002, 'tag4', NULL), (20003, NULL, 'u1');
COPY apt FROM stdin;
20004	tag2	u1
20005	tag9	u9
\.
INSERT INTO apt VALUES (20006, 'tag9', 'u9'), (20007, 'tág10', 'u0'), (20008, 'tag9', NULL), (20009, '', 'u9');
INSERT INTO apt SELECT 20010 + g, 'new' || (g % 3), 'u' || (g % 4) FROM generate_series(0, 8) g;
SELECT state, appended_rows FROM uvm.caches WHERE relation = 'apt'::regclass;
-- q from the cache (where the plan has GpuGroupAgg) and from the heap: where it read, whether
-- it folded appended rows, whether the answers are the same
CREATE FUNCTION apt_groups(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE line text; src text := 'postgres'; appended text := ''; a text; b text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    IF line LIKE '%Read From:%' THEN src := trim(split_part(line, 'Read From:', 2)); END IF;
    IF line LIKE '%Appended Rows:%' THEN appended := ', appended rows ' || trim(split_part(line, 'Appended Rows:', 2)); END IF;
  END LOOP;
  EXECUTE format('SELECT string_agg(r::text, '';'' ORDER BY r::text) FROM (%s) r', q) INTO a;
  PERFORM set_config('pg_uvm_share.enable_cache', 'off', true);
  EXECUTE format('SELECT string_agg(r::text, '';'' ORDER BY r::text) FROM (%s) r', q) INTO b;
  PERFORM set_config('pg_uvm_share.enable_cache', 'on', true);
  RETURN src || appended || CASE WHEN a IS NOT DISTINCT FROM b THEN ', same as the heap' ELSE ', DIFFERENT: ' || a || ' vs ' || b END;
END $$;
SELECT apt_groups('SELECT t, u, count(*), sum(id) FROM apt GROUP BY t, u');
SELECT apt_groups('SELECT t, count(*) FROM apt WHERE id > 20000 GROUP BY t');
SELECT apt_groups('SELECT u, count(*), max(id) FROM apt WHERE t IN (''tag1'', ''tag9'', ''new2'') OR t IS NULL GROUP BY u');
SELECT apt_groups('SELECT count(*) FROM apt WHERE u = ''u9'' AND t LIKE ''t%''');
SELECT apt_groups('SELECT count(*) FROM apt WHERE u = ''u1'' AND id > 19990');
SELECT source, rows, non_null FROM uvm.cache_fold('apt', 't');
-- (the added strings' room: 4,096 strings a column)
INSERT INTO apt SELECT 30000 + g, 'many' || g, 'u0' FROM generate_series(1, 4090) g;
SELECT state, appended_rows FROM uvm.caches WHERE relation = 'apt'::regclass;
SELECT apt_groups('SELECT count(*), count(t), min(id) FROM apt WHERE t <> ''tag0''');
SELECT apt_groups('SELECT t, count(*) FROM apt WHERE t LIKE ''many40%'' GROUP BY t');
INSERT INTO apt SELECT 40000 + g, 'more' || g, 'u0' FROM generate_series(1, 10) g;
SELECT state FROM uvm.caches WHERE relation = 'apt'::regclass;
SELECT apt_groups('SELECT t, count(*) FROM apt GROUP BY t');
DROP FUNCTION apt_groups(text);
DROP TABLE apt;

-- The trigger function is only a trigger
SELECT uvm.cache_append();
-- a user who may only read the table builds the cache; the trigger is the owner's
SELECT uvm.cache_table('ap', ARRAY['id', 'k']) AS rows;
CREATE ROLE uvm_ap_reader;
GRANT SELECT ON ap TO uvm_ap_reader;
SET ROLE uvm_ap_reader;
SELECT uvm.cache_drop('ap');
SELECT uvm.cache_table('ap', ARRAY['id', 'k']) AS rows;
RESET ROLE;
SELECT tgrelid::regclass, tgname FROM pg_trigger WHERE tgname LIKE 'pg_uvm_share%' ORDER BY 1;
-- a table another role owns: its trigger is made with the owner's rights
CREATE TABLE apo (k int8);
ALTER TABLE apo OWNER TO uvm_ap_reader;
SELECT uvm.cache_table('apo') AS rows;
INSERT INTO apo VALUES (1), (NULL);
SELECT state FROM uvm.caches WHERE relation = 'apo'::regclass;
SELECT * FROM uvm.cache_fold('apo', 'k');
DROP TABLE apo;
-- an owner without USAGE on the table's schema cannot make the trigger: 42501 says whose
-- privilege is missing, and nothing is left
CREATE SCHEMA ap_s;
CREATE TABLE ap_s.t (k int8);
ALTER TABLE ap_s.t OWNER TO uvm_ap_reader;
SELECT uvm.cache_table('ap_s.t') AS rows;
SELECT count(*) AS caches FROM uvm.caches WHERE relation = 'ap_s.t'::regclass;
DROP SCHEMA ap_s CASCADE;
-- a trigger of another name calling the append function (a user's, or ours renamed) never
-- appends: ours may fire for the same statement, so an insert makes the cache stale instead
SELECT uvm.cache_table('ap', ARRAY['id', 'k']) AS rows;
CREATE TRIGGER ap_extra AFTER INSERT ON ap REFERENCING NEW TABLE AS n FOR EACH STATEMENT EXECUTE FUNCTION uvm.cache_append();
INSERT INTO ap VALUES (90001, 1, 1, 1, 1, true);
SELECT ap_state();
SELECT * FROM ap_fold('id');
DROP TRIGGER ap_extra ON ap;
-- ours renamed: a rebuild adds no second trigger, and inserts make the cache stale until it is
-- named back
ALTER TRIGGER pg_uvm_share_cache_append ON ap RENAME TO ap_renamed;
SELECT uvm.cache_table('ap', ARRAY['id', 'k']) AS rows;
SELECT tgname FROM pg_trigger WHERE tgrelid = 'ap'::regclass ORDER BY 1;
INSERT INTO ap VALUES (90002, 1, 1, 1, 1, true);
SELECT ap_state();
SELECT * FROM ap_fold('id');
ALTER TRIGGER ap_renamed ON ap RENAME TO pg_uvm_share_cache_append;
SELECT uvm.cache_table('ap', ARRAY['id', 'k']) AS rows;
INSERT INTO ap VALUES (90003, 1, 1, 1, 1, true);
SELECT ap_state();
SELECT * FROM ap_fold('id');
-- cache_drop drops a renamed one too
ALTER TRIGGER pg_uvm_share_cache_append ON ap RENAME TO ap_renamed;
SELECT uvm.cache_drop('ap');
SELECT count(*) AS triggers FROM pg_trigger WHERE tgrelid = 'ap'::regclass;
SELECT uvm.cache_table('ap', ARRAY['id', 'k']) AS rows;
-- cache_drop removes the trigger and the tail
SELECT uvm.cache_drop('ap');
SELECT tgrelid::regclass, tgname FROM pg_trigger WHERE tgname LIKE 'pg_uvm_share%' ORDER BY 1;
-- (the tail left is apd's)
SELECT count(*) AS tails_left FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%_tail';
DROP TABLE ap, apd;
DROP OWNED BY uvm_ap_reader;
DROP ROLE uvm_ap_reader;
SELECT count(*) AS caches_left FROM uvm.caches;
SELECT count(*) AS cache_segments_left FROM uvm.segments WHERE name LIKE 'pg_temp_cache_%';
