-- In-place upgrades: CREATE EXTENSION at an earlier version, then ALTER EXTENSION UPDATE, must
-- give exactly the catalog of a fresh install of the current version. Both are compared as a
-- snapshot free of OIDs: the members, every function's and aggregate's attributes (strictness,
-- volatility, parallel safety, source symbol, arguments, ACL, comment), types, relations and
-- view definitions, columns, dependencies and initial privileges (what pg_dump relies on).
-- A difference prints the rows only in one of the two; fix the upgrade script
-- (sql/pg_uvm_share--<old>--<new>.sql), never this test.
CREATE DATABASE uvm_upgrade;
\c uvm_upgrade
SET client_min_messages = warning;

CREATE TEMP VIEW ext_snapshot AS
WITH RECURSIVE ext AS (
  SELECT oid, extname, extnamespace, extrelocatable, extconfig, extcondition
    FROM pg_extension WHERE extname = 'pg_uvm_share'
), member AS (
  SELECT d.classid, d.objid FROM pg_depend d, ext
   WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
), obj(classid, objid) AS (  -- members and what belongs to them (row and array types, rules)
  SELECT classid, objid FROM member
  UNION
  SELECT d.classid, d.objid FROM pg_depend d JOIN obj ON d.refclassid = obj.classid AND d.refobjid = obj.objid
   WHERE d.deptype = 'i'
)
SELECT 'extension' AS kind, extname::text AS object,
       concat_ws(' | ', 'schema=' || extnamespace::regnamespace, 'relocatable=' || extrelocatable,
                 'config=' || coalesce(extconfig::regclass[]::text, ''), 'condition=' || coalesce(extcondition::text, '')) AS attributes
  FROM ext
UNION ALL
SELECT 'member', pg_describe_object(classid, objid, 0), '' FROM member
UNION ALL
SELECT 'schema', n.nspname::text,
       concat_ws(' | ', 'owner=' || pg_get_userbyid(n.nspowner), 'acl=' || coalesce(n.nspacl::text, 'default'),
                 'comment=' || coalesce(obj_description(n.oid, 'pg_namespace'), ''))
  FROM pg_namespace n WHERE n.oid IN (SELECT objid FROM obj WHERE classid = 'pg_namespace'::regclass)
UNION ALL
SELECT 'function', p.oid::regprocedure::text,
       concat_ws(' | ', 'kind=' || p.prokind::text, 'language=' || l.lanname, 'owner=' || pg_get_userbyid(p.proowner),
                 'strict=' || p.proisstrict, 'volatility=' || p.provolatile::text, 'parallel=' || p.proparallel::text,
                 'security_definer=' || p.prosecdef, 'leakproof=' || p.proleakproof, 'retset=' || p.proretset,
                 'cost=' || p.procost, 'rows=' || p.prorows, 'support=' || p.prosupport,
                 'variadic=' || p.provariadic::regtype, 'arguments=' || pg_get_function_arguments(p.oid),
                 'result=' || pg_get_function_result(p.oid), 'src=' || p.prosrc, 'bin=' || coalesce(p.probin, ''),
                 'config=' || coalesce(p.proconfig::text, ''), 'acl=' || coalesce(p.proacl::text, 'default'),
                 'comment=' || coalesce(obj_description(p.oid, 'pg_proc'), ''))
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.oid IN (SELECT objid FROM obj WHERE classid = 'pg_proc'::regclass)
UNION ALL
SELECT 'aggregate', a.aggfnoid::regprocedure::text,
       concat_ws(' | ', 'kind=' || a.aggkind::text, 'direct_args=' || a.aggnumdirectargs,
                 'transfn=' || a.aggtransfn::oid::regprocedure, 'finalfn=' || a.aggfinalfn::oid::regprocedure,
                 'combinefn=' || a.aggcombinefn::oid::regprocedure, 'serialfn=' || a.aggserialfn::oid::regprocedure,
                 'deserialfn=' || a.aggdeserialfn::oid::regprocedure, 'mtransfn=' || a.aggmtransfn::oid::regprocedure,
                 'minvtransfn=' || a.aggminvtransfn::oid::regprocedure, 'mfinalfn=' || a.aggmfinalfn::oid::regprocedure,
                 'finalextra=' || a.aggfinalextra, 'mfinalextra=' || a.aggmfinalextra,
                 'finalmodify=' || a.aggfinalmodify::text, 'mfinalmodify=' || a.aggmfinalmodify::text,
                 'sortop=' || a.aggsortop::regoperator, 'transtype=' || a.aggtranstype::regtype,
                 'transspace=' || a.aggtransspace, 'mtranstype=' || a.aggmtranstype::regtype,
                 'mtransspace=' || a.aggmtransspace, 'initval=' || coalesce(a.agginitval, '<null>'),
                 'minitval=' || coalesce(a.aggminitval, '<null>'))
  FROM pg_aggregate a
 WHERE a.aggfnoid IN (SELECT objid FROM obj WHERE classid = 'pg_proc'::regclass)
UNION ALL
SELECT 'type', t.oid::regtype::text,
       concat_ws(' | ', 'type=' || t.typtype::text, 'len=' || t.typlen, 'byval=' || t.typbyval, 'category=' || t.typcategory::text,
                 'align=' || t.typalign::text, 'storage=' || t.typstorage::text, 'input=' || t.typinput, 'output=' || t.typoutput,
                 'receive=' || t.typreceive, 'send=' || t.typsend, 'element=' || t.typelem::regtype,
                 'array=' || t.typarray::regtype, 'relation=' || coalesce(t.typrelid::regclass::text, ''),
                 'owner=' || pg_get_userbyid(t.typowner), 'acl=' || coalesce(t.typacl::text, 'default'),
                 'comment=' || coalesce(obj_description(t.oid, 'pg_type'), ''))
  FROM pg_type t
 WHERE t.oid IN (SELECT objid FROM obj WHERE classid = 'pg_type'::regclass)
UNION ALL
SELECT 'relation', c.oid::regclass::text,
       concat_ws(' | ', 'kind=' || c.relkind::text, 'owner=' || pg_get_userbyid(c.relowner),
                 'acl=' || coalesce(c.relacl::text, 'default'), 'options=' || coalesce(c.reloptions::text, ''),
                 'comment=' || coalesce(obj_description(c.oid, 'pg_class'), ''),
                 'definition=' || coalesce(pg_get_viewdef(c.oid), ''))
  FROM pg_class c
 WHERE c.oid IN (SELECT objid FROM obj WHERE classid = 'pg_class'::regclass)
UNION ALL
SELECT 'column', a.attrelid::regclass || '.' || a.attname,
       concat_ws(' | ', 'position=' || row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum),
                 'type=' || format_type(a.atttypid, a.atttypmod), 'not_null=' || a.attnotnull,
                 'acl=' || coalesce(a.attacl::text, 'default'),
                 'comment=' || coalesce(col_description(a.attrelid, a.attnum), ''))
  FROM pg_attribute a
 WHERE a.attrelid IN (SELECT objid FROM obj WHERE classid = 'pg_class'::regclass)
   AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'dependency', pg_describe_object(d.classid, d.objid, d.objsubid) || ' -> ' ||
                     pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid),
       'type=' || d.deptype::text
  FROM pg_depend d
 WHERE (d.classid, d.objid) IN (SELECT classid, objid FROM obj) AND d.deptype <> 'e'
UNION ALL
SELECT 'initial privileges', pg_describe_object(ip.classoid, ip.objoid, ip.objsubid),
       'type=' || ip.privtype::text || ' | ' || ip.initprivs::text
  FROM pg_init_privs ip
 WHERE (ip.classoid, ip.objoid) IN (SELECT classid, objid FROM obj);

-- A fresh install of the default (current) version.
CREATE EXTENSION pg_uvm_share;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share') AS is_default
  FROM pg_extension WHERE extname = 'pg_uvm_share';
CREATE TEMP TABLE fresh AS SELECT * FROM ext_snapshot;
-- (every kind of row present: the snapshot sees the objects)
SELECT count(DISTINCT kind) AS kinds, count(*) > 150 AS many_rows FROM fresh;
DROP EXTENSION pg_uvm_share;

-- Every version a user may have installed, each updated in place to the current one.
SELECT version FROM pg_available_extension_versions
 WHERE name = 'pg_uvm_share' AND version <> (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share')
 ORDER BY string_to_array(version, '.')::int[];

-- 0.1.0 (the first release) -> current
CREATE EXTENSION pg_uvm_share VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_uvm_share';
-- what the update path will run
SELECT path FROM pg_extension_update_paths('pg_uvm_share') WHERE source = '0.1.0'
   AND target = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share');
-- the old catalog is different (else this test would prove nothing)
SELECT count(*) > 0 AS old_catalog_differs
  FROM ((SELECT * FROM ext_snapshot EXCEPT SELECT * FROM fresh) UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM ext_snapshot)) d;
ALTER EXTENSION pg_uvm_share UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share') AS is_default
  FROM pg_extension WHERE extname = 'pg_uvm_share';
CREATE TEMP TABLE upgraded AS SELECT * FROM ext_snapshot;
-- only in the upgraded catalog (expected: none)
SELECT * FROM upgraded EXCEPT SELECT * FROM fresh ORDER BY 1, 2, 3;
-- only in a fresh install (expected: none)
SELECT * FROM fresh EXCEPT SELECT * FROM upgraded ORDER BY 1, 2, 3;

DROP EXTENSION pg_uvm_share;

-- 0.2.0 -> current
CREATE EXTENSION pg_uvm_share VERSION '0.2.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_uvm_share';
-- what the update path will run
SELECT path FROM pg_extension_update_paths('pg_uvm_share') WHERE source = '0.2.0'
   AND target = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share');
-- the old catalog is different (else this test would prove nothing)
SELECT count(*) > 0 AS old_catalog_differs
  FROM ((SELECT * FROM ext_snapshot EXCEPT SELECT * FROM fresh) UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM ext_snapshot)) d;
ALTER EXTENSION pg_uvm_share UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share') AS is_default
  FROM pg_extension WHERE extname = 'pg_uvm_share';
CREATE TEMP TABLE upgraded2 AS SELECT * FROM ext_snapshot;
-- only in the upgraded catalog (expected: none)
SELECT * FROM upgraded2 EXCEPT SELECT * FROM fresh ORDER BY 1, 2, 3;
-- only in a fresh install (expected: none)
SELECT * FROM fresh EXCEPT SELECT * FROM upgraded2 ORDER BY 1, 2, 3;

DROP EXTENSION pg_uvm_share;

-- 0.3.0 -> current
CREATE EXTENSION pg_uvm_share VERSION '0.3.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_uvm_share';
-- what the update path will run
SELECT path FROM pg_extension_update_paths('pg_uvm_share') WHERE source = '0.3.0'
   AND target = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share');
-- the old catalog is different (else this test would prove nothing)
SELECT count(*) > 0 AS old_catalog_differs
  FROM ((SELECT * FROM ext_snapshot EXCEPT SELECT * FROM fresh) UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM ext_snapshot)) d;
ALTER EXTENSION pg_uvm_share UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share') AS is_default
  FROM pg_extension WHERE extname = 'pg_uvm_share';
CREATE TEMP TABLE upgraded3 AS SELECT * FROM ext_snapshot;
-- only in the upgraded catalog (expected: none)
SELECT * FROM upgraded3 EXCEPT SELECT * FROM fresh ORDER BY 1, 2, 3;
-- only in a fresh install (expected: none)
SELECT * FROM fresh EXCEPT SELECT * FROM upgraded3 ORDER BY 1, 2, 3;

DROP EXTENSION pg_uvm_share;

-- 0.4.0 -> current
CREATE EXTENSION pg_uvm_share VERSION '0.4.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_uvm_share';
-- what the update path will run
SELECT path FROM pg_extension_update_paths('pg_uvm_share') WHERE source = '0.4.0'
   AND target = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share');
-- the old catalog is different (else this test would prove nothing)
SELECT count(*) > 0 AS old_catalog_differs
  FROM ((SELECT * FROM ext_snapshot EXCEPT SELECT * FROM fresh) UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM ext_snapshot)) d;
ALTER EXTENSION pg_uvm_share UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share') AS is_default
  FROM pg_extension WHERE extname = 'pg_uvm_share';
CREATE TEMP TABLE upgraded4 AS SELECT * FROM ext_snapshot;
-- only in the upgraded catalog (expected: none)
SELECT * FROM upgraded4 EXCEPT SELECT * FROM fresh ORDER BY 1, 2, 3;
-- only in a fresh install (expected: none)
SELECT * FROM fresh EXCEPT SELECT * FROM upgraded4 ORDER BY 1, 2, 3;

DROP EXTENSION pg_uvm_share;

-- 0.5.0 -> current
CREATE EXTENSION pg_uvm_share VERSION '0.5.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_uvm_share';
-- what the update path will run
SELECT path FROM pg_extension_update_paths('pg_uvm_share') WHERE source = '0.5.0'
   AND target = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share');
-- the old catalog is different (else this test would prove nothing)
SELECT count(*) > 0 AS old_catalog_differs
  FROM ((SELECT * FROM ext_snapshot EXCEPT SELECT * FROM fresh) UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM ext_snapshot)) d;
ALTER EXTENSION pg_uvm_share UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share') AS is_default
  FROM pg_extension WHERE extname = 'pg_uvm_share';
CREATE TEMP TABLE upgraded5 AS SELECT * FROM ext_snapshot;
-- only in the upgraded catalog (expected: none)
SELECT * FROM upgraded5 EXCEPT SELECT * FROM fresh ORDER BY 1, 2, 3;
-- only in a fresh install (expected: none)
SELECT * FROM fresh EXCEPT SELECT * FROM upgraded5 ORDER BY 1, 2, 3;

DROP EXTENSION pg_uvm_share;

-- 0.6.0 -> current
CREATE EXTENSION pg_uvm_share VERSION '0.6.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_uvm_share';
-- what the update path will run
SELECT path FROM pg_extension_update_paths('pg_uvm_share') WHERE source = '0.6.0'
   AND target = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share');
-- the old catalog is different (else this test would prove nothing)
SELECT count(*) > 0 AS old_catalog_differs
  FROM ((SELECT * FROM ext_snapshot EXCEPT SELECT * FROM fresh) UNION ALL (SELECT * FROM fresh EXCEPT SELECT * FROM ext_snapshot)) d;
ALTER EXTENSION pg_uvm_share UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_uvm_share') AS is_default
  FROM pg_extension WHERE extname = 'pg_uvm_share';
CREATE TEMP TABLE upgraded6 AS SELECT * FROM ext_snapshot;
-- only in the upgraded catalog (expected: none)
SELECT * FROM upgraded6 EXCEPT SELECT * FROM fresh ORDER BY 1, 2, 3;
-- only in a fresh install (expected: none)
SELECT * FROM fresh EXCEPT SELECT * FROM upgraded6 ORDER BY 1, 2, 3;

-- The upgraded extension works, aggregates included (an empty probe needs no table).
SELECT uvm.create_segment('upgrade_s', 4096) > 0 AS created;
SELECT uvm.fill_segment('upgrade_s', 0, 4096, 3), uvm.checksum_segment('upgrade_s', 0, 4096) <> 0 AS checksum_nonzero;
SELECT (uvm.gpujoin_probe('upgrade_s', k)).* FROM (SELECT 1::bigint AS k WHERE false) t;
SELECT uvm.drop_segment('upgrade_s');
CREATE TABLE upgrade_t AS SELECT g AS a FROM generate_series(1, 10) g;
SELECT uvm.cache_table('upgrade_t') AS cached;
SELECT * FROM uvm.cache_fold('upgrade_t', 'a');
SELECT relation, state, columns FROM uvm.caches;
-- (inserts append: the cache stays ready)
INSERT INTO upgrade_t VALUES (11);
SELECT * FROM uvm.cache_fold('upgrade_t', 'a');
DROP TABLE upgrade_t;

\c postgres
DROP DATABASE uvm_upgrade;
