-- GpuJoin as a plan node (serial; the CPU path here): plain SQL inner equi-joins planned as
-- Custom Scan (UvmGpuJoin) when pg_uvm_share.enable_gpujoin = on, compared with PostgreSQL's own
-- joins as multisets (both EXCEPT ALL differences empty, same row counts), for every key type
-- and data shape, with the plans checked. Then quals, projections, aggregates, sorts,
-- limits, rescans, cursors, prepared statements, EXPLAIN, and no segment left after an ERROR
-- or a cancel.
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

-- settings for the rest of the statement: the node forced, or off
CREATE FUNCTION pg_temp.mode(forced boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('pg_uvm_share.enable_gpujoin', CASE WHEN forced THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_hashjoin', CASE WHEN forced THEN 'off' ELSE 'on' END, true);
  PERFORM set_config('enable_mergejoin', CASE WHEN forced THEN 'off' ELSE 'on' END, true);
  PERFORM set_config('enable_nestloop', CASE WHEN forced THEN 'off' ELSE 'on' END, true);
END $$;

-- runs q forced and off: row counts, both multiset differences, whether each plan has GpuJoin
CREATE FUNCTION pg_temp.check(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE p_on boolean; p_off boolean; n_on bigint; n_off bigint; d1 bigint; d2 bigint;
BEGIN
  PERFORM pg_temp.mode(true);
  p_on := pg_temp.plan_has(q, 'Custom Scan \(UvmGpuJoin\)');
  EXECUTE 'CREATE TEMP TABLE gjn_r_on AS ' || q;
  PERFORM pg_temp.mode(false);
  p_off := pg_temp.plan_has(q, 'Custom Scan \(UvmGpuJoin\)');
  EXECUTE 'CREATE TEMP TABLE gjn_r_off AS ' || q;
  SELECT count(*) INTO n_on FROM gjn_r_on;
  SELECT count(*) INTO n_off FROM gjn_r_off;
  SELECT count(*) INTO d1 FROM (SELECT * FROM gjn_r_on EXCEPT ALL SELECT * FROM gjn_r_off) x;
  SELECT count(*) INTO d2 FROM (SELECT * FROM gjn_r_off EXCEPT ALL SELECT * FROM gjn_r_on) x;
  DROP TABLE gjn_r_on, gjn_r_off;
  RETURN format('rows %s/%s diff %s/%s gpujoin %s/%s', n_on, n_off, d1, d2, p_on, p_off);
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

-- Tables per key type: gjn_i_<t> (inner: keys 1..500 once, 1..50 three more times, 20 NULL
-- keys) and one outer table per data shape, gjn_o_<t>_<shape>. The key of integer g is
-- format(expr, g). Payloads: text, numeric and int columns with NULLs.
CREATE FUNCTION pg_temp.make(t text, expr text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE k text := format(expr, 'g');
BEGIN
  EXECUTE format($q$CREATE TABLE gjn_i_%s AS
    SELECT row_number() OVER () AS id, %s AS k,
           CASE WHEN g %% 7 = 0 THEN NULL ELSE 'v' || g END AS v,
           CASE WHEN g %% 5 = 0 THEN NULL ELSE g / 3.0 END AS n,
           (g %% 100)::int AS x
    FROM (SELECT g FROM generate_series(1, 500) g
          UNION ALL SELECT g FROM generate_series(1, 50) g, generate_series(1, 3)) s$q$, t, k);
  EXECUTE format('INSERT INTO gjn_i_%s SELECT 1000 + g, NULL, ''null key'', 0, 1 FROM generate_series(1, 20) g', t);
  EXECUTE format($q$CREATE TABLE gjn_o_%s_uniform AS
    SELECT g AS id, %s AS k, 'o' || g AS w FROM (SELECT g, 1 + (g * 7919) %% 1000 AS h FROM generate_series(1, 3000) g) s$q$,
    t, format(expr, 'h'));
  EXECUTE format($q$CREATE TABLE gjn_o_%s_skewed AS
    SELECT g AS id, %s AS k, 'o' || g AS w FROM (SELECT g, 1 + 60 / (1 + g %% 61) AS h FROM generate_series(1, 3000) g) s$q$,
    t, format(expr, 'h'));
  EXECUTE format($q$CREATE TABLE gjn_o_%s_miss AS
    SELECT g AS id, %s AS k, 'o' || g AS w FROM (SELECT g, 600 + g AS h FROM generate_series(1, 2000) g) s$q$,
    t, format(expr, 'h'));
  EXECUTE format($q$CREATE TABLE gjn_o_%s_hit AS
    SELECT g AS id, %s AS k, 'o' || g AS w FROM (SELECT g, 1 + g %% 500 AS h FROM generate_series(1, 2000) g) s$q$,
    t, format(expr, 'h'));
  EXECUTE format($q$CREATE TABLE gjn_o_%s_dup AS
    SELECT g AS id, %s AS k, 'o' || g AS w FROM (SELECT g, 1 + g %% 40 AS h FROM generate_series(1, 2000) g) s$q$,
    t, format(expr, 'h'));
  EXECUTE format($q$CREATE TABLE gjn_o_%s_nulls AS
    SELECT g AS id, CASE WHEN g %% 3 = 0 THEN NULL ELSE %s END AS k, NULL::text AS w
    FROM (SELECT g, 1 + g %% 700 AS h FROM generate_series(1, 2000) g) s$q$,
    t, format(expr, 'h'));
END $$;

SELECT pg_temp.make('int2', '(%s)::int2');
SELECT pg_temp.make('int4', '(%s)::int4 - 250');
SELECT pg_temp.make('int8', '(%s)::int8 * 10000000019');
SELECT pg_temp.make('date', 'date ''2000-01-01'' + (%s)::int');
SELECT pg_temp.make('ts', 'timestamp ''2000-01-01'' + (%s) * interval ''1 hour 1 second''');
SELECT pg_temp.make('tstz', 'timestamptz ''2000-01-01 00:00+00'' + (%s) * interval ''1 day 1 microsecond''');
SELECT pg_temp.leftovers() AS leftovers_before;

-- every key type and data shape: the same rows with the node forced and off
SELECT t, s, pg_temp.check(format(
         'SELECT o.id AS oid_, o.k AS ok, o.w, i.id AS iid, i.v, i.n FROM gjn_o_%s_%s o JOIN gjn_i_%s i ON o.k = i.k', t, s, t))
FROM unnest(ARRAY['int2', 'int4', 'int8', 'date', 'ts', 'tstz']) WITH ORDINALITY a(t, ta),
     unnest(ARRAY['uniform', 'skewed', 'miss', 'hit', 'dup', 'nulls']) WITH ORDINALITY b(s, sb)
ORDER BY ta, sb;

-- the inner side as the smaller table written first, and as the outer relation
SELECT pg_temp.check('SELECT i.id AS iid, o.id AS oid_ FROM gjn_i_int4 i JOIN gjn_o_int4_dup o ON i.k = o.k');
-- quals on either side and across both sides
SELECT pg_temp.check($$SELECT o.id AS oid_, i.id AS iid, i.v FROM gjn_o_int8_uniform o JOIN gjn_i_int8 i
  ON o.k = i.k AND o.id % 3 = 0 AND i.x > 10 AND o.id > i.x * 5$$);
SELECT pg_temp.check($$SELECT o.id AS oid_, i.n FROM gjn_o_date_hit o, gjn_i_date i
  WHERE o.k = i.k AND (i.v IS NULL OR o.w LIKE 'o1%')$$);
-- expressions over both sides' columns in the target list
SELECT pg_temp.check($$SELECT o.w || '/' || coalesce(i.v, '-') AS both_, i.n * o.id AS product, i.n IS NULL AS no_n
  FROM gjn_o_ts_skewed o JOIN gjn_i_ts i ON o.k = i.k$$);
-- under an aggregate, a sort and a limit
SELECT pg_temp.check($$SELECT count(*) AS c, sum(i.n) AS s, count(i.v) AS cv, min(o.w) AS mw
  FROM gjn_o_int2_uniform o JOIN gjn_i_int2 i ON o.k = i.k$$);
SELECT pg_temp.check($$SELECT i.x, count(*) AS c FROM gjn_o_int4_skewed o JOIN gjn_i_int4 i ON o.k = i.k GROUP BY i.x$$);
SELECT pg_temp.check($$SELECT o.id AS oid_, i.id AS iid FROM gjn_o_tstz_dup o JOIN gjn_i_tstz i ON o.k = i.k
  ORDER BY o.id DESC, i.id LIMIT 25$$);
-- a three-way join: GpuJoin under (or over) another join
SELECT pg_temp.check($$SELECT o.id AS oid_, i.id AS iid, o2.id AS o2id FROM gjn_o_int4_hit o
  JOIN gjn_i_int4 i ON o.k = i.k JOIN gjn_o_int4_dup o2 ON o2.id = o.id$$);
-- a join across integer types (int4 = int8) compares the numbers; a left join runs on the node
-- too (uvm_gpujoin_outer has the left, semi and anti joins' battery)
SELECT pg_temp.check('SELECT o.id AS oid_, i.id AS iid FROM gjn_o_int4_hit o JOIN gjn_i_int8 i ON o.id = i.id');
SELECT pg_temp.check('SELECT o.id AS oid_, i.id AS iid FROM gjn_o_int4_hit o LEFT JOIN gjn_i_int4 i ON o.k = i.k');

-- rescans: the join inside a correlated subquery, with the parameter on the outer side (the
-- inner table is kept) and on the inner side (it is built again)
SELECT pg_temp.check($$SELECT s.g, (SELECT count(*) FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k
  WHERE o.id % 10 = s.g) AS c FROM generate_series(0, 9) s(g)$$);
SELECT pg_temp.check($$SELECT s.g, (SELECT count(*) FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k
  WHERE i.x = s.g) AS c FROM generate_series(0, 9) s(g)$$);
SELECT pg_temp.check($$SELECT s.g, (SELECT max(o.id) FROM gjn_o_int8_hit o JOIN gjn_i_int8 i ON o.k = i.k
  WHERE i.x = s.g AND o.id % 7 = s.g % 7) AS m FROM generate_series(0, 20) s(g)$$);
-- the inner side of a nested loop (LATERAL: rescanned with a new parameter per outer row)
SELECT pg_temp.check($$SELECT s.g, x.c FROM generate_series(0, 9) s(g),
  LATERAL (SELECT count(*) AS c FROM gjn_o_int2_dup o JOIN gjn_i_int2 i ON o.k = i.k WHERE i.x = s.g OR o.id = s.g) x$$);

-- the plan and EXPLAIN ANALYZE's figures (the tier depends on the provider)
SET pg_uvm_share.enable_gpujoin = on;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_nestloop = off;
EXPLAIN (COSTS OFF) SELECT o.id, i.v FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k AND o.id > i.x;
EXPLAIN (COSTS OFF, VERBOSE) SELECT o.w, i.v FROM gjn_o_int8_hit o JOIN gjn_i_int8 i ON o.k = i.k;
CREATE FUNCTION pg_temp.explain_analyze(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  -- the GpuJoin node's lines only, without the figures whose format varies by version
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, BUFFERS OFF, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    CONTINUE WHEN l !~ '(GpuJoin|Inner|Batches|Aggregated)';
    l := regexp_replace(l, ' *\(actual.*\)', '');
    RETURN NEXT regexp_replace(l, 'Inner Table Tier: \S+', 'Inner Table Tier: (tier)');
  END LOOP;
END $$;
SELECT pg_temp.explain_analyze('SELECT count(*) FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
-- more than one batch (BATCH_TUPLES = 65536 outer tuples with a key)
CREATE TABLE gjn_big AS SELECT g AS id, (1 + g % 700)::int4 - 250 AS k FROM generate_series(1, 140000) g;
SELECT pg_temp.explain_analyze('SELECT count(*) FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.check('SELECT o.id AS oid_, i.id AS iid FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
-- joined rows probe every outer tuple's key (a pair is then a joined row) until a batch's pairs
-- outgrow the result buffer's first size (65536 pairs): repeated inner keys, after which
-- the scan probes each batch's distinct keys ("Outer Keys"); the answers as PostgreSQL's
CREATE FUNCTION pg_temp.outer_keys(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, BUFFERS OFF, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    IF l ~ 'Outer Keys' THEN RETURN trim(l); END IF;
  END LOOP;
  RETURN 'no line';
END $$;
CREATE TABLE gjn_rep AS SELECT g AS id, -249 + g % 2 AS k FROM generate_series(1, 70000) g;
SELECT pg_temp.outer_keys('SELECT o.id, i.id FROM gjn_big o JOIN gjn_i_int8 i ON o.id = i.id');
SELECT pg_temp.outer_keys('SELECT o.id, i.id FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.outer_keys('SELECT o.id, i.id FROM gjn_rep o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.outer_keys('SELECT count(*) FROM gjn_rep o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.check('SELECT o.id AS oid_, i.id AS iid FROM gjn_big o JOIN gjn_i_int8 i ON o.id = i.id');
SELECT pg_temp.check('SELECT o.id AS oid_, i.id AS iid, i.x FROM gjn_rep o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.check('SELECT o.id AS oid_, i.x FROM gjn_rep o LEFT JOIN gjn_i_int4 i ON o.k = i.k');
DROP TABLE gjn_rep;
-- the next batch is read (into a second memory context) and its pairs formed while a batch's
-- rows are returned: by-reference outer values of consecutive batches stay apart, semi and
-- anti joins span the batches, and a scan stopped with a batch read ahead (LIMIT) leaves
-- nothing behind
CREATE TABLE gjn_ahead AS
  SELECT g AS id, (1 + g % 700)::int4 - 250 AS k, 'o' || g || repeat('x', g % 40) AS t
  FROM generate_series(1, 200000) g;
SELECT pg_temp.check('SELECT o.id AS oid_, o.t, i.id AS iid FROM gjn_ahead o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.check('SELECT o.t FROM gjn_ahead o WHERE EXISTS (SELECT 1 FROM gjn_i_int4 i WHERE i.k = o.k)');
SELECT pg_temp.check('SELECT o.t FROM gjn_ahead o WHERE NOT EXISTS (SELECT 1 FROM gjn_i_int4 i WHERE i.k = o.k)');
SELECT pg_temp.check('SELECT o.t, i.x FROM gjn_ahead o LEFT JOIN gjn_i_int4 i ON o.k = i.k');
SELECT count(*) FROM (SELECT o.t FROM gjn_ahead o JOIN gjn_i_int4 i ON o.k = i.k LIMIT 70000) s;
SELECT pg_temp.leftovers() AS after_limit;
DROP TABLE gjn_ahead;
-- an inner side without a non-NULL key: no segment, no row
SELECT count(*) FROM gjn_o_int4_hit o JOIN (SELECT * FROM gjn_i_int4 WHERE k IS NULL) i ON o.k = i.k;
-- the node's two segments exist while it runs (the InitPlan runs at the first joined row),
-- and are gone after
SELECT DISTINCT (SELECT count(*) FROM uvm.segments WHERE name LIKE 'pg_temp_gpujoin%') AS during
FROM gjn_o_int4_hit o JOIN gjn_i_int4 i ON o.k = i.k;
SELECT pg_temp.leftovers() AS after;

-- cursors: fetched in pieces, moved back and forth (SCROLL adds a Materialize above it)
CREATE FUNCTION pg_temp.scroll(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE c refcursor := 'gjn_scroll'; a bigint; b bigint; d bigint; r record;
BEGIN
  OPEN c SCROLL FOR EXECUTE q;
  MOVE FORWARD 10 IN c;
  MOVE FORWARD ALL IN c;
  GET DIAGNOSTICS a = ROW_COUNT;
  MOVE BACKWARD ALL IN c;
  GET DIAGNOSTICS b = ROW_COUNT;
  FETCH RELATIVE 5 FROM c INTO r;
  MOVE FORWARD ALL IN c;
  GET DIAGNOSTICS d = ROW_COUNT;
  CLOSE c;
  RETURN format('10 + %s forward, %s back, 5 + %s forward again', a, b, d);
END $$;
SELECT pg_temp.scroll('SELECT o.id, i.id FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT count(*) FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k;
BEGIN;
DECLARE c1 SCROLL CURSOR FOR SELECT o.id, i.id FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k;
MOVE FORWARD 10 IN c1;
DECLARE c2 CURSOR FOR SELECT o.id, i.id AS iid FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k ORDER BY 1, 2;
FETCH 3 FROM c2;
FETCH 2 FROM c2;
SELECT pg_temp.leftovers() AS while_open;
CLOSE c1;
CLOSE c2;
SELECT pg_temp.leftovers() AS closed;
COMMIT;

-- prepared statements, custom and generic plans
PREPARE gjn_p(int) AS SELECT count(*), sum(i.n) FROM gjn_o_int4_skewed o JOIN gjn_i_int4 i ON o.k = i.k WHERE i.x < $1;
EXECUTE gjn_p(10);
EXECUTE gjn_p(20);
EXECUTE gjn_p(30);
EXECUTE gjn_p(40);
EXECUTE gjn_p(50);
EXECUTE gjn_p(60);
EXECUTE gjn_p(100);
SET pg_uvm_share.enable_gpujoin = off;
RESET enable_hashjoin;
SELECT count(*), sum(i.n) FROM gjn_o_int4_skewed o JOIN gjn_i_int4 i ON o.k = i.k WHERE i.x < 60;
SELECT count(*), sum(i.n) FROM gjn_o_int4_skewed o JOIN gjn_i_int4 i ON o.k = i.k WHERE i.x < 100;
DEALLOCATE gjn_p;

-- auto, the default, follows the cluster's provider: on under CUDA (the GPU suite runs this
-- battery), off on the host provider (CI); PostgreSQL's joins off so that cost does not decide
-- (and left off for the node's ERROR, cursor and cancel cases below)
SET pg_uvm_share.enable_gpujoin = auto;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_nestloop = off;
SELECT pg_temp.plan_has('SELECT * FROM gjn_o_int4_hit o JOIN gjn_i_int4 i ON o.k = i.k', 'GpuJoin')
       = ((SELECT value FROM uvm.device_info() WHERE property = 'provider') = 'cuda') AS auto_follows_the_provider;

-- an ERROR in the middle of the join, at top level and in a subtransaction: nothing is left
-- (terse: an environment with RUST_BACKTRACE set shows a backtrace as the DETAIL)
\set VERBOSITY terse
SET pg_uvm_share.enable_gpujoin = on;
SELECT count(*) FROM gjn_o_int4_hit o JOIN gjn_i_int4 i ON o.k = i.k WHERE 1 / (o.id - 1000) > -5;
SELECT pg_temp.leftovers() AS after_error;
SELECT pg_temp.try('SELECT count(*) FROM gjn_o_int4_hit o JOIN gjn_i_int4 i ON o.k = i.k WHERE 1 / (o.id - 1000) > -5');
SELECT pg_temp.leftovers() AS after_subxact_error;
BEGIN;
DECLARE c3 CURSOR FOR SELECT o.id FROM gjn_o_int4_hit o JOIN gjn_i_int4 i ON o.k = i.k;
FETCH 1 FROM c3 \g /dev/null
SELECT pg_temp.leftovers() AS cursor_open;
SELECT pg_temp.try('SELECT count(*) FROM gjn_o_int4_hit o JOIN gjn_i_int4 i ON o.k = i.k WHERE 1 / (o.id - 1000) > -5');
SELECT pg_temp.leftovers() AS cursor_kept_after_subxact_error;
ROLLBACK;
SELECT pg_temp.leftovers() AS after_rollback;
-- a cancel (statement_timeout) in the middle of the join
SET statement_timeout = '300ms';
SELECT count(*) FROM gjn_o_int4_hit o JOIN gjn_i_int4 i ON o.k = i.k WHERE pg_sleep(0.01) IS NOT NULL;
RESET statement_timeout;
\set VERBOSITY default
SELECT pg_temp.leftovers() AS after_cancel;

-- Aggregates computed in the node: an ungrouped query of count(*), count(x) and sum, min and
-- max of int2/int4/int8 columns over a join with no other clause is planned as
-- Custom Scan (UvmGpuJoinAgg) over the GpuJoin node, which folds its matches itself; the same
-- answers as PostgreSQL's (NULL sums and zero counts where nothing matches), for every key
-- type and data shape
CREATE FUNCTION pg_temp.acheck(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r text := pg_temp.check(q);
BEGIN
  PERFORM pg_temp.mode(true);
  RETURN r || ' agg ' || pg_temp.plan_has(q, 'Custom Scan \(UvmGpuJoinAgg\)');
END $$;
SELECT t, s, pg_temp.acheck(format(
         'SELECT count(*) AS c, count(i.v) AS cv, sum(i.x) AS sx, sum(i.id) AS si, min(o.id) AS mo, max(i.x) AS mx,
                 count(*) * 2 + coalesce(sum(o.id), 0) AS e FROM gjn_o_%s_%s o JOIN gjn_i_%s i ON o.k = i.k', t, s, t))
FROM unnest(ARRAY['int2', 'int4', 'int8', 'date', 'ts', 'tstz']) WITH ORDINALITY a(t, ta),
     unnest(ARRAY['uniform', 'skewed', 'miss', 'hit', 'dup', 'nulls']) WITH ORDINALITY b(s, sb)
ORDER BY ta, sb;
-- int2 and int8 arguments (the keys themselves: an int8 sum beyond int8, as numeric)
SELECT pg_temp.acheck('SELECT sum(o.k) AS s, min(i.k) AS mi, max(o.k) AS ma FROM gjn_o_int2_dup o JOIN gjn_i_int2 i ON o.k = i.k');
SELECT pg_temp.acheck('SELECT sum(o.k) AS s, min(i.k) AS mi, max(o.k) AS ma, sum(o.k) > 9223372036854775807 AS big
  FROM gjn_o_int8_dup o JOIN gjn_i_int8 i ON o.k = i.k');
-- what the node does not compute stays with PostgreSQL's Aggregate above the GpuJoin: other
-- aggregates, DISTINCT, FILTER, GROUP BY, HAVING, another clause on the join
SELECT pg_temp.acheck('SELECT avg(i.x) AS a FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.acheck('SELECT sum(i.n) AS s FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.acheck('SELECT count(DISTINCT i.x) AS c FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.acheck('SELECT count(*) FILTER (WHERE i.x > 5) AS c FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.acheck('SELECT i.x, count(*) AS c FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k GROUP BY i.x');
SELECT pg_temp.acheck('SELECT count(*) AS c FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k HAVING count(*) > 1');
SELECT pg_temp.acheck('SELECT count(*) AS c FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k AND o.id > i.x');
-- restrictions on either side run in the scans below, so the node still computes the aggregates
SELECT pg_temp.acheck('SELECT count(*) AS c, sum(o.id) AS s FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k
  WHERE i.x < 30 AND o.id % 2 = 0');
-- rescans with a new parameter per row (of the outer side, of the inner side)
SELECT pg_temp.acheck($$SELECT s.g, (SELECT count(*) FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k
  WHERE o.id % 10 = s.g) AS c FROM generate_series(0, 9) s(g)$$);
SELECT pg_temp.acheck($$SELECT s.g, (SELECT sum(o.id) FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k
  WHERE i.x = s.g) AS c FROM generate_series(0, 9) s(g)$$);
-- an inner side without a non-NULL key: a count of 0 and a NULL sum
SELECT pg_temp.acheck('SELECT count(*) AS c, sum(i.x) AS s FROM gjn_o_int4_hit o JOIN (SELECT * FROM gjn_i_int4 WHERE k IS NULL) i ON o.k = i.k');
-- the probe mode: count(*), and count and sum of one inner column, come from the probes' match
-- counts and payload sums (the table's payloads are that column's values: "Aggregated: in the
-- probe"); a NULL in the column keeps row ids as payloads and forms the matches ("per match")
CREATE TABLE gjn_i_nx AS SELECT k, NULLIF(x, 3) AS x FROM gjn_i_int4;
ANALYZE gjn_i_nx;
SELECT pg_temp.acheck('SELECT count(*) AS c, sum(i.x) AS s, count(i.x) AS cx FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.acheck('SELECT count(*) AS c, sum(i.x) AS s, count(i.x) AS cx FROM gjn_o_int4_dup o JOIN gjn_i_nx i ON o.k = i.k');
SELECT pg_temp.acheck('SELECT count(*) AS c FROM gjn_o_int8_skewed o JOIN gjn_i_int8 i ON o.k = i.k');
-- the plan
SET pg_uvm_share.enable_gpujoin = on;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_nestloop = off;
SELECT pg_temp.explain_analyze('SELECT count(*), sum(i.x) FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.explain_analyze('SELECT count(*), sum(i.x) FROM gjn_o_int4_dup o JOIN gjn_i_nx i ON o.k = i.k');
EXPLAIN (COSTS OFF) SELECT count(*), sum(i.x) FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k;
EXPLAIN (COSTS OFF, VERBOSE) SELECT count(*) + 1, sum(i.id) FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k;
SELECT pg_temp.explain_analyze('SELECT count(*) FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.leftovers() AS after_aggregates;

-- joined rows whose inner columns are key columns of the outer key's type and one by-value
-- column more: the table's payloads are that column's values, and a row is made from the outer
-- tuple and its pair ("Inner Columns: in the table"); a NULL among the values keeps row ids
-- ("in the rows"); across types (int4 = int8) the inner key is that column; a by-reference
-- column keeps row ids (no line)
SELECT pg_temp.explain_analyze('SELECT o.id, i.k, i.x FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.explain_analyze('SELECT o.id, i.k, i.x FROM gjn_o_int4_dup o JOIN gjn_i_nx i ON o.k = i.k');
SELECT pg_temp.explain_analyze('SELECT o.id, i.id FROM gjn_o_int4_hit o JOIN gjn_i_int8 i ON o.id = i.id');
SELECT pg_temp.explain_analyze('SELECT o.id, i.v FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.check('SELECT o.id AS oid_, o.k AS ok, i.k AS ik, i.x FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.check('SELECT o.id AS oid_, i.k AS ik, i.x FROM gjn_o_int4_dup o JOIN gjn_i_nx i ON o.k = i.k');
SELECT pg_temp.check('SELECT o.id AS oid_, i.id AS iid FROM gjn_o_int4_hit o JOIN gjn_i_int8 i ON o.id = i.id');
SELECT pg_temp.check('SELECT o.id AS oid_, i.x, i.k AS ik FROM gjn_o_int4_nulls o LEFT JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.check('SELECT o.w, i.k AS ik FROM gjn_o_tstz_dup o JOIN gjn_i_tstz i ON o.k = i.k WHERE i.k > o.k - interval ''1 day''');

RESET pg_uvm_share.enable_gpujoin;
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET enable_nestloop;

-- Parallel: "Parallel Custom Scan (UvmGpuJoin)" under a Gather, the outer side split among the
-- participants, the inner side built once for all of them by whichever participant comes
-- first. The same comparisons, with the parallel plan checked.
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
CREATE FUNCTION pg_temp.inner_loops_text(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, BUFFERS OFF, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    RETURN NEXT regexp_replace(l, ' *\(actual.*\)', '');
  END LOOP;
END $$;
CREATE FUNCTION pg_temp.pcheck(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r text := pg_temp.check(q);
BEGIN
  PERFORM pg_temp.mode(true);
  RETURN r || ' parallel ' || pg_temp.plan_has(q, 'Parallel Custom Scan \(UvmGpuJoin\)')
           || ' gather ' || pg_temp.plan_has(q, 'Gather');
END $$;
SELECT t, s, pg_temp.pcheck(format(
         'SELECT o.id AS oid_, o.k AS ok, o.w, i.id AS iid, i.v, i.n FROM gjn_o_%s_%s o JOIN gjn_i_%s i ON o.k = i.k', t, s, t))
FROM unnest(ARRAY['int2', 'int4', 'int8', 'date', 'ts', 'tstz']) WITH ORDINALITY a(t, ta),
     unnest(ARRAY['uniform', 'skewed', 'miss', 'hit', 'dup', 'nulls']) WITH ORDINALITY b(s, sb)
ORDER BY ta, sb;
-- the workers alone (the leader only gathers): a worker builds the inner side, the others wait
SET parallel_leader_participation = off;
SELECT t, s, pg_temp.pcheck(format(
         'SELECT o.id AS oid_, o.w, i.id AS iid, i.v, i.n FROM gjn_o_%s_%s o JOIN gjn_i_%s i ON o.k = i.k', t, s, t))
FROM unnest(ARRAY['int4', 'int8']) WITH ORDINALITY a(t, ta),
     unnest(ARRAY['uniform', 'skewed', 'dup', 'nulls']) WITH ORDINALITY b(s, sb)
ORDER BY ta, sb;
SELECT pg_temp.pcheck('SELECT o.id AS oid_, i.id AS iid FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
RESET parallel_leader_participation;
-- quals, projections, aggregates (partial aggregates in the workers), sort and limit
SELECT pg_temp.check($$SELECT o.id AS oid_, i.id AS iid, i.v FROM gjn_big o JOIN gjn_i_int4 i
  ON o.k = i.k AND o.id % 3 = 0 AND i.x > 10 AND o.id > i.x * 5$$);
SELECT pg_temp.pcheck($$SELECT count(*) AS c, sum(i.n) AS s, count(i.v) AS cv, min(i.v || o.id) AS mv
  FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k$$);
SELECT pg_temp.pcheck($$SELECT i.x, count(*) AS c FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k GROUP BY i.x$$);
SELECT pg_temp.pcheck($$SELECT o.id AS oid_, i.id AS iid FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k
  ORDER BY o.id DESC, i.id LIMIT 25$$);
-- aggregates computed in the node, each participant's partial results gathered and merged by
-- GpuJoinAgg, with and without the leader, every key type and data shape
CREATE FUNCTION pg_temp.pacheck(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r text := pg_temp.acheck(q);
BEGIN
  PERFORM pg_temp.mode(true);
  RETURN r || ' parallel ' || pg_temp.plan_has(q, 'Parallel Custom Scan \(UvmGpuJoin\)');
END $$;
SELECT t, s, pg_temp.pacheck(format(
         'SELECT count(*) AS c, count(i.v) AS cv, sum(i.x) AS sx, sum(i.id) AS si, min(o.id) AS mo, max(i.x) AS mx
          FROM gjn_o_%s_%s o JOIN gjn_i_%s i ON o.k = i.k', t, s, t))
FROM unnest(ARRAY['int2', 'int4', 'int8', 'date', 'ts', 'tstz']) WITH ORDINALITY a(t, ta),
     unnest(ARRAY['uniform', 'skewed', 'miss', 'hit', 'dup', 'nulls']) WITH ORDINALITY b(s, sb)
ORDER BY ta, sb;
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(o.id) AS s, max(o.k) AS m FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
SET parallel_leader_participation = off;
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(o.id) AS s, max(o.k) AS m FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
RESET parallel_leader_participation;
-- the probe mode in parallel (the builder picks the payloads for every participant)
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(i.x) AS s FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(i.x) AS s FROM gjn_big o JOIN gjn_i_nx i ON o.k = i.k');
SET parallel_leader_participation = off;
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(i.x) AS s FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
RESET parallel_leader_participation;
-- the probe mode's workers handing their keys to the leader, which builds the table and probes
-- every batch (pg_uvm_share.gpujoin_leader_probes; auto: where each worker would start a CUDA
-- context of its own): the same answers for every key type and data shape, in the probe and per
-- match (a NULL in the summed column), over an empty inner side, and not without the leader
-- (nobody would take the keys)
SET pg_uvm_share.gpujoin_leader_probes = on;
SELECT t, s, pg_temp.pacheck(format(
         'SELECT count(*) AS c, count(i.x) AS cx, sum(i.x) AS sx FROM gjn_o_%s_%s o JOIN gjn_i_%s i ON o.k = i.k', t, s, t))
FROM unnest(ARRAY['int2', 'int4', 'int8', 'date', 'ts', 'tstz']) WITH ORDINALITY a(t, ta),
     unnest(ARRAY['uniform', 'skewed', 'miss', 'hit', 'dup', 'nulls']) WITH ORDINALITY b(s, sb)
ORDER BY ta, sb;
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(i.x) AS s FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(i.x) AS s FROM gjn_big o JOIN gjn_i_nx i ON o.k = i.k');
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(i.x) AS s FROM gjn_big o JOIN (SELECT * FROM gjn_i_int4 WHERE k IS NULL) i ON o.k = i.k');
-- (not where the node computes other aggregates: the workers need more than the keys)
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(o.id) AS s FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
SET pg_uvm_share.enable_gpujoin = on;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_nestloop = off;
SELECT l FROM pg_temp.inner_loops_text('SELECT count(*), sum(i.x) FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k') l
WHERE l ~ '(Probed By|Aggregated|Inner Rows)';
SELECT count(*) AS probed_by_lines FROM pg_temp.inner_loops_text('SELECT count(*), sum(o.id) FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k') l
WHERE l ~ 'Probed By';
RESET pg_uvm_share.enable_gpujoin;
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET enable_nestloop;
SET parallel_leader_participation = off;
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(i.x) AS s FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
RESET parallel_leader_participation;
RESET pg_uvm_share.gpujoin_leader_probes;
SET pg_uvm_share.enable_gpujoin = on;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_nestloop = off;
EXPLAIN (COSTS OFF) SELECT count(*), sum(o.id) FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k;
RESET pg_uvm_share.enable_gpujoin;
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET enable_nestloop;
-- the inner side was read once per scan, whatever the number of participants: its rows
-- (Inner Rows) once, shared among the participants by a parallel scan, or read whole by the
-- first participant when the inner plan is not partial (its loops; the other figures depend
-- on how many workers started and how the rows were shared)
CREATE FUNCTION pg_temp.inner_loops(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, BUFFERS OFF, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    CONTINUE WHEN l !~ '(GpuJoin|Inner Rows|Scan|Gather|Aggregate|Loop)';
    IF l ~ 'Seq Scan on gjn_i_np' THEN
      RETURN NEXT regexp_replace(l, 'rows=[0-9.]+ ', '');
    ELSE
      RETURN NEXT regexp_replace(l, ' *\(actual.*\)', '');
    END IF;
  END LOOP;
END $$;
SET pg_uvm_share.enable_gpujoin = on;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_nestloop = off;
SELECT pg_temp.inner_loops('SELECT count(*) FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k');
-- a larger inner side, its parallel scan shared among the participants: each one's rows, the
-- table built from all of them
CREATE TABLE gjn_big_i AS SELECT g AS id, g - 250 AS k, 'i' || g AS v FROM generate_series(1, 30000) g;
ANALYZE gjn_big_i;
SELECT pg_temp.pcheck('SELECT o.k AS ok, count(*) AS c, sum(i.id) AS s, max(i.v) AS mv
  FROM gjn_big o JOIN gjn_big_i i ON o.k = i.k GROUP BY o.k');
SET parallel_leader_participation = off;
SELECT pg_temp.pcheck('SELECT o.k AS ok, count(*) AS c, sum(i.id) AS s, max(i.v) AS mv
  FROM gjn_big o JOIN gjn_big_i i ON o.k = i.k GROUP BY o.k');
RESET parallel_leader_participation;
DROP TABLE gjn_big_i;
-- an inner side without a partial plan (its table allows no parallel scan): the first
-- participant reads it whole, the others wait
CREATE TABLE gjn_i_np AS SELECT * FROM gjn_i_int4;
ALTER TABLE gjn_i_np SET (parallel_workers = 0);
ANALYZE gjn_i_np;
SELECT pg_temp.inner_loops('SELECT count(*) FROM gjn_big o JOIN gjn_i_np i ON o.k = i.k');
SELECT pg_temp.pcheck('SELECT o.id AS oid_, i.id AS iid, i.v, i.n FROM gjn_big o JOIN gjn_i_np i ON o.k = i.k');
SET parallel_leader_participation = off;
SELECT pg_temp.pcheck('SELECT o.id AS oid_, i.id AS iid, i.v, i.n FROM gjn_big o JOIN gjn_i_np i ON o.k = i.k');
RESET parallel_leader_participation;
-- the probe mode reads outer keys ahead while another participant reads the inner side (here a
-- slow one, which the first participant reads whole) or builds the table: the same answer, and
-- batches read ahead wherever a worker started (EXPLAIN ANALYZE's Batches Read Ahead; each
-- participant probing its own keys: where the leader probes for the workers, they read none)
SET pg_uvm_share.gpujoin_leader_probes = off;
CREATE FUNCTION pg_temp.read_ahead(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE l text; n bigint := -1; w bigint := 0;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF) ' || q LOOP
    IF l ~ 'Batches Read Ahead:' THEN n := substring(l from 'Batches Read Ahead: (\d+)')::bigint; END IF;
    IF l ~ 'Workers Launched:' THEN w := substring(l from 'Workers Launched: (\d+)')::bigint; END IF;
  END LOOP;
  RETURN CASE WHEN n > 0 OR (w = 0 AND n = 0) THEN 'read ahead where a worker started'
              ELSE format('%s batches read ahead, %s workers launched', n, w) END;
END $$;
SELECT pg_temp.read_ahead('SELECT count(*), sum(i.x) FROM gjn_big o
  JOIN (SELECT * FROM gjn_i_np WHERE pg_sleep(0.0005) IS NOT NULL) i ON o.k = i.k');
RESET pg_uvm_share.gpujoin_leader_probes;
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(i.x) AS s FROM gjn_big o
  JOIN (SELECT * FROM gjn_i_np WHERE pg_sleep(0.0005) IS NOT NULL) i ON o.k = i.k');
SET parallel_leader_participation = off;
SELECT pg_temp.pacheck('SELECT count(*) AS c, sum(i.x) AS s FROM gjn_big o
  JOIN (SELECT * FROM gjn_i_np WHERE pg_sleep(0.0005) IS NOT NULL) i ON o.k = i.k');
RESET parallel_leader_participation;
DROP TABLE gjn_i_np;
-- rescans: a Gather over the node on the inner side of a nested loop, started again per outer
-- row (the leader resets the shared state, the inner side is built again: the same rows, the
-- same answer, three times)
SET enable_nestloop = on;
SET enable_material = off;
SELECT pg_temp.inner_loops($$SELECT v.x, ss.c FROM (SELECT count(*) AS c, sum(i.x) AS s
  FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k) ss RIGHT JOIN (VALUES (1), (2), (3)) v(x) ON true$$);
SELECT v.x, ss.c, ss.s FROM (SELECT count(*) AS c, sum(i.x) AS s
  FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k) ss RIGHT JOIN (VALUES (1), (2), (3)) v(x) ON true;
-- the same where the workers hand their keys to the leader (its exchange is set back too)
SET pg_uvm_share.gpujoin_leader_probes = on;
SELECT v.x, ss.c, ss.s FROM (SELECT count(*) AS c, sum(i.x) AS s
  FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k) ss RIGHT JOIN (VALUES (1), (2), (3)) v(x) ON true;
RESET pg_uvm_share.gpujoin_leader_probes;
RESET enable_material;
SET pg_uvm_share.enable_gpujoin = off;
SELECT count(*) AS c, sum(i.x) AS s FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k;
SET pg_uvm_share.enable_gpujoin = on;
SET enable_nestloop = off;
-- an ERROR in a worker and a cancel: nothing is left by the leader or the workers
\set VERBOSITY terse
SET parallel_leader_participation = off;
SELECT count(*) FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k WHERE 1 / (o.id + i.x - 100101) > -5;
SELECT pg_temp.leftovers() AS after_worker_error;
SELECT pg_temp.try('SELECT count(*) FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k WHERE 1 / (o.id + i.x - 100101) > -5');
SELECT pg_temp.leftovers() AS after_worker_subxact_error;
SET statement_timeout = '300ms';
SELECT count(*) FROM gjn_big o JOIN gjn_i_int4 i ON o.k = i.k WHERE pg_sleep(0.0001) IS NOT NULL;
RESET statement_timeout;
RESET parallel_leader_participation;
\set VERBOSITY default
SELECT pg_temp.leftovers() AS after_parallel_cancel;
-- a cancel while the probe mode has a batch in flight (probes are started and collected one
-- batch later; the outer scan's md5 makes it last long enough for a few batches): the request
-- is given up, nothing is left, and the next probe-mode join works, in parallel and serially
CREATE TABLE gjn_huge AS SELECT (1 + g % 700)::int4 - 250 AS k FROM generate_series(1, 2000000) g;
ANALYZE gjn_huge;
EXPLAIN (COSTS OFF) SELECT count(*), sum(i.x) FROM gjn_huge o JOIN gjn_i_int4 i ON o.k = i.k
  WHERE md5(o.k::text) <> '';
\set VERBOSITY terse
SET statement_timeout = '150ms';
SELECT count(*), sum(i.x) FROM gjn_huge o JOIN gjn_i_int4 i ON o.k = i.k WHERE md5(o.k::text) <> '';
SET max_parallel_workers_per_gather = 0;
SELECT count(*), sum(i.x) FROM gjn_huge o JOIN gjn_i_int4 i ON o.k = i.k WHERE md5(o.k::text) <> '';
RESET statement_timeout;
SET max_parallel_workers_per_gather = 2;
\set VERBOSITY default
SELECT pg_temp.leftovers() AS after_probe_cancel;
SELECT count(*), sum(i.x) FROM gjn_o_int4_dup o JOIN gjn_i_int4 i ON o.k = i.k;
DROP TABLE gjn_huge;

RESET pg_uvm_share.enable_gpujoin;
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET enable_nestloop;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;
RESET max_parallel_workers_per_gather;
DROP TABLE gjn_big;
