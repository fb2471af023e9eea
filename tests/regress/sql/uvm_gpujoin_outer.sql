-- Left, semi and anti joins on the GpuJoin plan node (issue 24, point 2): on every key type the
-- node takes, and across int4/int8, with NULL keys and duplicates on both sides and outer keys
-- that match nothing, the node's answer is PostgreSQL's, serially and in parallel workers. The
-- joins it does not take (an ON clause outside the key, a hashed key, NOT IN) run as
-- PostgreSQL plans them, with the same answer.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

-- Runs q with the node forced (PostgreSQL's joins off) and with it off; says whether the plan
-- used the node, as which join ('Join Type: ' in EXPLAIN; none for an inner join), how many
-- rows the node's run returned and how many rows differ between the two runs (as multisets).
CREATE FUNCTION pg_temp.check_join(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  l text;
  used text := 'not used';
  kind text := '';
  n bigint;
  diff bigint;
BEGIN
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'on', true);
  PERFORM set_config('enable_hashjoin', 'off', true);
  PERFORM set_config('enable_mergejoin', 'off', true);
  PERFORM set_config('enable_nestloop', 'off', true);
  FOR l IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP
    IF l LIKE '%UvmGpuJoin%' THEN used := 'used'; END IF;
    IF l ~ 'Join Type: ' THEN kind := ' (' || substring(l from 'Join Type: (\w+)') || ')'; END IF;
  END LOOP;
  EXECUTE 'CREATE TEMP TABLE r_on AS ' || q;
  PERFORM set_config('pg_uvm_share.enable_gpujoin', 'off', true);
  PERFORM set_config('enable_hashjoin', 'on', true);
  PERFORM set_config('enable_mergejoin', 'on', true);
  PERFORM set_config('enable_nestloop', 'on', true);
  EXECUTE 'CREATE TEMP TABLE r_off AS ' || q;
  SELECT count(*) INTO n FROM r_on;
  SELECT count(*) INTO diff FROM ((TABLE r_on EXCEPT ALL TABLE r_off) UNION ALL (TABLE r_off EXCEPT ALL TABLE r_on)) x;
  DROP TABLE r_on;
  DROP TABLE r_off;
  RETURN format('node %s%s: %s rows, %s differ', used, kind, n, diff);
END $$;

-- outer keys -50..649 (NULL every 97th row), inner keys 0..399 with 0..199 twice (NULL every
-- 53rd row): unmatched outer rows on both ends, duplicate matches, NULLs on both sides
CREATE TABLE oj_o AS
SELECT i AS id, (i % 700 - 50)::int2 AS k2, i % 700 - 50 AS k4, (i % 700 - 50)::int8 * 1000000007 AS k8,
       date '2000-01-01' + (i % 700 - 50) AS kd,
       timestamp '2000-01-01' + (i % 700 - 50) * interval '1 hour' AS kts,
       timestamptz '2000-01-01 00:00+00' + (i % 700 - 50) * interval '1 minute' AS ktz
FROM generate_series(1, 20000) i;
UPDATE oj_o SET k2 = NULL, k4 = NULL, k8 = NULL, kd = NULL, kts = NULL, ktz = NULL WHERE id % 97 = 0;
CREATE TABLE oj_d AS
SELECT i AS v, (i % 400)::int2 AS k2, i % 400 AS k4, (i % 400)::int8 * 1000000007 AS k8,
       date '2000-01-01' + (i % 400) AS kd,
       timestamp '2000-01-01' + (i % 400) * interval '1 hour' AS kts,
       timestamptz '2000-01-01 00:00+00' + (i % 400) * interval '1 minute' AS ktz
FROM generate_series(1, 600) i;
UPDATE oj_d SET k2 = NULL, k4 = NULL, k8 = NULL, kd = NULL, kts = NULL, ktz = NULL WHERE v % 53 = 0;
ANALYZE oj_o, oj_d;

-- serially
SET max_parallel_workers_per_gather = 0;
SELECT c, pg_temp.check_join(format('SELECT o.id, d.v FROM oj_o o LEFT JOIN oj_d d ON o.%1$s = d.%1$s', c)) AS left_join
FROM unnest(ARRAY['k2', 'k4', 'k8', 'kd', 'kts', 'ktz']) c;
SELECT c, pg_temp.check_join(format('SELECT o.id, o.%1$s FROM oj_o o WHERE EXISTS (SELECT 1 FROM oj_d d WHERE d.%1$s = o.%1$s)', c)) AS semi_join
FROM unnest(ARRAY['k2', 'k4', 'k8', 'kd', 'kts', 'ktz']) c;
SELECT c, pg_temp.check_join(format('SELECT o.id FROM oj_o o WHERE NOT EXISTS (SELECT 1 FROM oj_d d WHERE d.%1$s = o.%1$s)', c)) AS anti_join
FROM unnest(ARRAY['k2', 'k4', 'k8', 'kd', 'kts', 'ktz']) c;
-- across integer types (int4 = int2, int4 = int8, int2 = int4)
SELECT pg_temp.check_join('SELECT o.id, d.v FROM oj_o o LEFT JOIN oj_d d ON o.k4 = d.k2');
SELECT pg_temp.check_join('SELECT o.id FROM oj_o o WHERE EXISTS (SELECT 1 FROM oj_d d WHERE d.k8 = o.k4)');
SELECT pg_temp.check_join('SELECT o.id FROM oj_o o WHERE NOT EXISTS (SELECT 1 FROM oj_d d WHERE d.k2 = o.k4)');
-- a LEFT JOIN whose WHERE keeps the rows without a match: PostgreSQL makes it an anti join
SELECT pg_temp.check_join('SELECT o.id FROM oj_o o LEFT JOIN oj_d d ON o.k8 = d.k8 WHERE d.k8 IS NULL');
-- IN (SELECT ...): a semi join, or an inner join over the subquery made unique
SELECT pg_temp.check_join('SELECT o.id FROM oj_o o WHERE o.k4 IN (SELECT d.k4 FROM oj_d d)');
-- two keys packed side by side: exact, taken
SELECT pg_temp.check_join('SELECT o.id, d.v FROM oj_o o LEFT JOIN oj_d d ON o.k4 = d.k4 AND o.kd = d.kd');
-- an empty inner side: every outer row once (left, anti), none (semi)
SELECT pg_temp.check_join('SELECT o.id, d.v FROM oj_o o LEFT JOIN (SELECT * FROM oj_d WHERE v < 0) d ON o.k4 = d.k4');
SELECT pg_temp.check_join('SELECT o.id FROM oj_o o WHERE NOT EXISTS (SELECT 1 FROM oj_d d WHERE d.k4 = o.k4 AND d.v < 0)');
-- declined, PostgreSQL runs them: an ON clause over both sides outside the key; a key hashed
-- (three 64-bit columns, 192 bits), whose clauses would be checked after a row found its match; NOT IN, whose
-- NULLs make it no anti join
SELECT pg_temp.check_join('SELECT o.id, d.v FROM oj_o o LEFT JOIN oj_d d ON o.k4 = d.k4 AND o.id > d.v');
-- (one on the inner side alone is PostgreSQL's to push into the inner scan: the node runs it)
SELECT pg_temp.check_join('SELECT o.id, d.v FROM oj_o o LEFT JOIN oj_d d ON o.k4 = d.k4 AND d.v > 300');
SELECT pg_temp.check_join('SELECT o.id, d.v FROM oj_o o LEFT JOIN oj_d d ON o.k8 = d.k8 AND o.kts = d.kts AND o.ktz = d.ktz');
SELECT pg_temp.check_join('SELECT o.id FROM oj_o o WHERE o.k4 NOT IN (SELECT d.k4 FROM oj_d d)');
SELECT pg_temp.check_join('SELECT o.id FROM oj_o o WHERE o.k4 NOT IN (SELECT d.k4 FROM oj_d d WHERE d.k4 IS NOT NULL)');

-- in parallel workers (the outer side split among them, the inner table shared)
SET max_parallel_workers_per_gather = 2;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SELECT c, pg_temp.check_join(format('SELECT o.id, d.v FROM oj_o o LEFT JOIN oj_d d ON o.%1$s = d.%1$s', c)) AS left_join
FROM unnest(ARRAY['k2', 'k4', 'k8', 'kd', 'kts', 'ktz']) c;
SELECT c, pg_temp.check_join(format('SELECT o.id, o.%1$s FROM oj_o o WHERE EXISTS (SELECT 1 FROM oj_d d WHERE d.%1$s = o.%1$s)', c)) AS semi_join
FROM unnest(ARRAY['k2', 'k4', 'k8', 'kd', 'kts', 'ktz']) c;
SELECT c, pg_temp.check_join(format('SELECT o.id FROM oj_o o WHERE NOT EXISTS (SELECT 1 FROM oj_d d WHERE d.%1$s = o.%1$s)', c)) AS anti_join
FROM unnest(ARRAY['k2', 'k4', 'k8', 'kd', 'kts', 'ktz']) c;
SELECT pg_temp.check_join('SELECT o.id, d.v FROM oj_o o LEFT JOIN (SELECT * FROM oj_d WHERE v < 0) d ON o.k4 = d.k4');
-- the aggregate above a left join is PostgreSQL's (the node folds inner joins' aggregates only)
SELECT pg_temp.check_join('SELECT count(*) AS n, count(d.v) AS nv, sum(d.v) AS s FROM oj_o o LEFT JOIN oj_d d ON o.k4 = d.k4');
-- EXPLAIN names the join
SET pg_uvm_share.enable_gpujoin = on;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_nestloop = off;
SET max_parallel_workers_per_gather = 0;
EXPLAIN (COSTS OFF) SELECT o.id, d.v FROM oj_o o LEFT JOIN oj_d d ON o.k4 = d.k4;
EXPLAIN (COSTS OFF) SELECT o.id FROM oj_o o WHERE NOT EXISTS (SELECT 1 FROM oj_d d WHERE d.k4 = o.k4);
RESET ALL;
DROP TABLE oj_o, oj_d;
