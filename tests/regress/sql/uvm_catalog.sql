-- The extension's catalog entries against PostgreSQL's own rules: the checks of PostgreSQL 15's
-- src/test/regress/sql/{opr_sanity,type_sanity,misc_sanity}.sql that apply to the kinds of
-- objects pg_uvm_share creates (functions, aggregates, a composite type, views, a schema),
-- restricted to the extension's objects. As in PostgreSQL's suite, every query must return
-- no rows; a row names the offending object. The queries are PostgreSQL's, with "FROM pg_proc"
-- (etc.) replaced by the extension's subset; objects they reference (a transition function, a
-- type's I/O function) are still looked up in the whole catalog.
CREATE DATABASE uvm_catalog;
\c uvm_catalog
SET client_min_messages = warning;
CREATE EXTENSION pg_uvm_share;
RESET client_min_messages;

-- The extension's objects: its members, and the objects that belong to a member (the row type
-- and array type of a composite type, a view's row type and rewrite rule).
CREATE TEMP VIEW ext_member AS
SELECT d.classid, d.objid
  FROM pg_depend d
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_uvm_share');
CREATE TEMP VIEW ext_obj AS
WITH RECURSIVE o(classid, objid) AS (
  SELECT classid, objid FROM ext_member
  UNION
  SELECT d.classid, d.objid
    FROM pg_depend d JOIN o ON d.refclassid = o.classid AND d.refobjid = o.objid
   WHERE d.deptype = 'i'
)
SELECT classid, objid FROM o;
CREATE TEMP VIEW ext_proc AS
SELECT * FROM pg_proc WHERE oid IN (SELECT objid FROM ext_obj WHERE classid = 'pg_proc'::regclass);
CREATE TEMP VIEW ext_aggregate AS
SELECT * FROM pg_aggregate WHERE aggfnoid IN (SELECT oid FROM ext_proc);
CREATE TEMP VIEW ext_type AS
SELECT * FROM pg_type WHERE oid IN (SELECT objid FROM ext_obj WHERE classid = 'pg_type'::regclass);
CREATE TEMP VIEW ext_class AS
SELECT * FROM pg_class WHERE oid IN (SELECT objid FROM ext_obj WHERE classid = 'pg_class'::regclass);

-- The checks below cover these kinds of objects. An extension object of another kind (an
-- operator, a cast, an operator class...) needs the checks of its section of opr_sanity.sql
-- added here first.
SELECT classid::regclass, count(*)
  FROM ext_obj
 WHERE classid NOT IN ('pg_proc'::regclass, 'pg_type'::regclass, 'pg_class'::regclass,
                       'pg_namespace'::regclass, 'pg_rewrite'::regclass)
 GROUP BY 1;
-- ... and the sets are not empty (the restriction works):
SELECT (SELECT count(*) FROM ext_proc) > 20 AS procs, (SELECT count(*) FROM ext_aggregate) > 0 AS aggregates,
       (SELECT count(*) FROM ext_type) > 0 AS types, (SELECT count(*) FROM ext_class) > 0 AS classes;

-- opr_sanity's helper (PostgreSQL 15 defines it in test_setup.sql).
-- This should match IsBinaryCoercible() in parse_coerce.c.
create function pg_temp.binary_coercible(oid, oid) returns bool as $$
begin
  if $1 = $2 then return true; end if;
  if EXISTS(select 1 from pg_catalog.pg_cast where
            castsource = $1 and casttarget = $2 and
            castmethod = 'b' and castcontext = 'i') then
    return true;
  end if;
  if $2 = 'pg_catalog.any'::pg_catalog.regtype then return true; end if;
  if $2 = 'pg_catalog.anyarray'::pg_catalog.regtype then
    if EXISTS(select 1 from pg_catalog.pg_type where
              oid = $1 and typelem != 0 and
              typsubscript = 'pg_catalog.array_subscript_handler'::pg_catalog.regproc)
    then return true; end if;
  end if;
  if $2 = 'pg_catalog.anyrange'::pg_catalog.regtype then
    if (select typtype from pg_catalog.pg_type where oid = $1) = 'r' then
      return true;
    end if;
  end if;
  if $2 = 'pg_catalog.anymultirange'::pg_catalog.regtype then
    if (select typtype from pg_catalog.pg_type where oid = $1) = 'm' then
      return true;
    end if;
  end if;
  return false;
end
$$ language plpgsql strict stable;

-- **************** pg_proc (opr_sanity.sql) ****************

-- Look for illegal values in pg_proc fields.
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE p1.prolang = 0 OR p1.prorettype = 0 OR
       p1.pronargs < 0 OR
       p1.pronargdefaults < 0 OR
       p1.pronargdefaults > p1.pronargs OR
       array_lower(p1.proargtypes, 1) != 0 OR
       array_upper(p1.proargtypes, 1) != p1.pronargs-1 OR
       0::oid = ANY (p1.proargtypes) OR
       procost <= 0 OR
       CASE WHEN proretset THEN prorows <= 0 ELSE prorows != 0 END OR
       prokind NOT IN ('f', 'a', 'w', 'p') OR
       provolatile NOT IN ('i', 's', 'v') OR
       proparallel NOT IN ('s', 'r', 'u');

-- prosrc should never be null; it can be empty only if prosqlbody isn't null
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE prosrc IS NULL;
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE (prosrc = '' OR prosrc = '-') AND prosqlbody IS NULL;

-- proretset should only be set for normal functions
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc AS p1
WHERE proretset AND prokind != 'f';

-- no SECURITY DEFINER functions (PostgreSQL's rule for built-in functions; the extension's
-- functions run with the caller's rights and check the segment owner themselves)
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc AS p1
WHERE prosecdef
ORDER BY 1;

-- pronargdefaults should be 0 iff proargdefaults is null
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc AS p1
WHERE (pronargdefaults <> 0) != (proargdefaults IS NOT NULL);

-- probin should be non-empty for C functions, null everywhere else
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE prolang = 13 AND (probin IS NULL OR probin = '' OR probin = '-');

SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE prolang != 13 AND probin IS NOT NULL;

-- Look for conflicting proc definitions (same names and input datatypes).
SELECT p1.oid::regprocedure, p1.proname, p2.oid::regprocedure, p2.proname
FROM ext_proc AS p1, pg_proc AS p2
WHERE p1.oid != p2.oid AND
    p1.proname = p2.proname AND
    p1.pronamespace = p2.pronamespace AND
    p1.pronargs = p2.pronargs AND
    p1.proargtypes = p2.proargtypes;

-- Look for functions that return type "internal" and do not have any
-- "internal" argument.  Such a function would be a security hole since
-- it might be used to call an internal function from an SQL command.
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE p1.prorettype = 'internal'::regtype AND NOT
    'internal'::regtype = ANY (p1.proargtypes);

-- Look for functions that return a polymorphic type and do not have any
-- polymorphic argument.  Calls of such functions would be unresolvable
-- at parse time.
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE p1.prorettype IN
    ('anyelement'::regtype, 'anyarray'::regtype, 'anynonarray'::regtype,
     'anyenum'::regtype)
  AND NOT
    ('anyelement'::regtype = ANY (p1.proargtypes) OR
     'anyarray'::regtype = ANY (p1.proargtypes) OR
     'anynonarray'::regtype = ANY (p1.proargtypes) OR
     'anyenum'::regtype = ANY (p1.proargtypes) OR
     'anyrange'::regtype = ANY (p1.proargtypes) OR
     'anymultirange'::regtype = ANY (p1.proargtypes))
ORDER BY 2;

SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE p1.prorettype IN ('anyrange'::regtype, 'anymultirange'::regtype)
  AND NOT
    ('anyrange'::regtype = ANY (p1.proargtypes) OR
      'anymultirange'::regtype = ANY (p1.proargtypes))
ORDER BY 2;

SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE p1.prorettype IN
    ('anycompatible'::regtype, 'anycompatiblearray'::regtype,
     'anycompatiblenonarray'::regtype)
  AND NOT
    ('anycompatible'::regtype = ANY (p1.proargtypes) OR
     'anycompatiblearray'::regtype = ANY (p1.proargtypes) OR
     'anycompatiblenonarray'::regtype = ANY (p1.proargtypes) OR
     'anycompatiblerange'::regtype = ANY (p1.proargtypes))
ORDER BY 2;

SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE p1.prorettype = 'anycompatiblerange'::regtype
  AND NOT
     'anycompatiblerange'::regtype = ANY (p1.proargtypes)
ORDER BY 2;

-- Look for functions that accept cstring and are neither datatype input
-- functions nor encoding conversion functions.
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE 'cstring'::regtype = ANY (p1.proargtypes)
    AND NOT EXISTS(SELECT 1 FROM pg_type WHERE typinput = p1.oid)
    AND NOT EXISTS(SELECT 1 FROM pg_conversion WHERE conproc = p1.oid)
ORDER BY 1;

-- Likewise, look for functions that return cstring and aren't datatype output
-- functions nor typmod output functions.
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE  p1.prorettype = 'cstring'::regtype
    AND NOT EXISTS(SELECT 1 FROM pg_type WHERE typoutput = p1.oid)
    AND NOT EXISTS(SELECT 1 FROM pg_type WHERE typmodout = p1.oid)
ORDER BY 1;

-- Check for length inconsistencies between the various argument-info arrays.
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE proallargtypes IS NOT NULL AND
    array_length(proallargtypes,1) < array_length(proargtypes,1);

SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE proargmodes IS NOT NULL AND
    array_length(proargmodes,1) < array_length(proargtypes,1);

SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE proargnames IS NOT NULL AND
    array_length(proargnames,1) < array_length(proargtypes,1);

SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE proallargtypes IS NOT NULL AND proargmodes IS NOT NULL AND
    array_length(proallargtypes,1) <> array_length(proargmodes,1);

SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE proallargtypes IS NOT NULL AND proargnames IS NOT NULL AND
    array_length(proallargtypes,1) <> array_length(proargnames,1);

SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc as p1
WHERE proargmodes IS NOT NULL AND proargnames IS NOT NULL AND
    array_length(proargmodes,1) <> array_length(proargnames,1);

-- Check that proallargtypes matches proargtypes
SELECT p1.oid::regprocedure, p1.proname, p1.proargtypes, p1.proallargtypes, p1.proargmodes
FROM ext_proc as p1
WHERE proallargtypes IS NOT NULL AND
  ARRAY(SELECT unnest(proargtypes)) <>
  ARRAY(SELECT proallargtypes[i]
        FROM generate_series(1, array_length(proallargtypes, 1)) g(i)
        WHERE proargmodes IS NULL OR proargmodes[i] IN ('i', 'b', 'v'));

-- Check for type of the variadic array parameter's elements.
SELECT oid::regprocedure, provariadic::regtype, proargtypes::regtype[]
FROM ext_proc
WHERE provariadic != 0
AND case proargtypes[array_length(proargtypes, 1)-1]
	WHEN '"any"'::regtype THEN '"any"'::regtype
	WHEN 'anyarray'::regtype THEN 'anyelement'::regtype
	WHEN 'anycompatiblearray'::regtype THEN 'anycompatible'::regtype
	ELSE (SELECT t.oid
		  FROM pg_type t
		  WHERE t.typarray = proargtypes[array_length(proargtypes, 1)-1])
	END  != provariadic;

-- Check that all and only those functions with a variadic type have
-- a variadic argument.
SELECT oid::regprocedure, proargmodes, provariadic
FROM ext_proc
WHERE (proargmodes IS NOT NULL AND 'v' = any(proargmodes))
    IS DISTINCT FROM
    (provariadic != 0);

-- Check for prosupport functions with the wrong signature
SELECT p1.oid::regprocedure, p1.proname, p2.oid::regprocedure, p2.proname
FROM ext_proc AS p1, pg_proc AS p2
WHERE p2.oid = p1.prosupport AND
    (p2.prorettype != 'internal'::regtype OR p2.proretset OR p2.pronargs != 1
     OR p2.proargtypes[0] != 'internal'::regtype);

-- Check that all immutable functions are marked parallel safe
SELECT p1.oid::regprocedure, p1.proname
FROM ext_proc AS p1
WHERE provolatile = 'i' AND proparallel = 'u';

-- **************** pg_aggregate (opr_sanity.sql) ****************

-- Look for illegal values in pg_aggregate fields.
SELECT aggfnoid::regprocedure
FROM ext_aggregate as a
WHERE aggfnoid = 0 OR aggtransfn = 0 OR
    aggkind NOT IN ('n', 'o', 'h') OR
    aggnumdirectargs < 0 OR
    (aggkind = 'n' AND aggnumdirectargs > 0) OR
    aggfinalmodify NOT IN ('r', 's', 'w') OR
    aggmfinalmodify NOT IN ('r', 's', 'w') OR
    aggtranstype = 0 OR aggtransspace < 0 OR aggmtransspace < 0;

-- Make sure the matching pg_proc entry is sensible, too.
SELECT a.aggfnoid::regprocedure, p.proname
FROM ext_aggregate as a, pg_proc as p
WHERE a.aggfnoid = p.oid AND
    (p.prokind != 'a' OR p.proretset OR p.pronargs < a.aggnumdirectargs);

-- Make sure there are no prokind = PROKIND_AGGREGATE pg_proc entries without matches.
SELECT oid::regprocedure, proname
FROM ext_proc as p
WHERE p.prokind = 'a' AND
    NOT EXISTS (SELECT 1 FROM pg_aggregate a WHERE a.aggfnoid = p.oid);

-- If there is no finalfn then the output type must be the transtype.
SELECT a.aggfnoid::regprocedure, p.proname
FROM ext_aggregate as a, pg_proc as p
WHERE a.aggfnoid = p.oid AND
    a.aggfinalfn = 0 AND p.prorettype != a.aggtranstype;

-- Cross-check transfn against its entry in pg_proc.
SELECT a.aggfnoid::regprocedure, p.proname, ptr.oid::regprocedure, ptr.proname
FROM ext_aggregate AS a, pg_proc AS p, pg_proc AS ptr
WHERE a.aggfnoid = p.oid AND
    a.aggtransfn = ptr.oid AND
    (ptr.proretset
     OR NOT (ptr.pronargs =
             CASE WHEN a.aggkind = 'n' THEN p.pronargs + 1
             ELSE greatest(p.pronargs - a.aggnumdirectargs, 1) + 1 END)
     OR NOT pg_temp.binary_coercible(ptr.prorettype, a.aggtranstype)
     OR NOT pg_temp.binary_coercible(a.aggtranstype, ptr.proargtypes[0])
     OR (p.pronargs > 0 AND
         NOT pg_temp.binary_coercible(p.proargtypes[0], ptr.proargtypes[1]))
     OR (p.pronargs > 1 AND
         NOT pg_temp.binary_coercible(p.proargtypes[1], ptr.proargtypes[2]))
     OR (p.pronargs > 2 AND
         NOT pg_temp.binary_coercible(p.proargtypes[2], ptr.proargtypes[3]))
     OR (p.pronargs > 3 AND
         NOT pg_temp.binary_coercible(p.proargtypes[3], ptr.proargtypes[4]))
     -- we could carry the check further, but 4 args is enough for now
     OR (p.pronargs > 4)
    );

-- Cross-check finalfn (if present) against its entry in pg_proc.
SELECT a.aggfnoid::regprocedure, p.proname, pfn.oid::regprocedure, pfn.proname
FROM ext_aggregate AS a, pg_proc AS p, pg_proc AS pfn
WHERE a.aggfnoid = p.oid AND
    a.aggfinalfn = pfn.oid AND
    (pfn.proretset OR
     NOT pg_temp.binary_coercible(pfn.prorettype, p.prorettype) OR
     NOT pg_temp.binary_coercible(a.aggtranstype, pfn.proargtypes[0]) OR
     CASE WHEN a.aggfinalextra THEN pfn.pronargs != p.pronargs + 1
          ELSE pfn.pronargs != a.aggnumdirectargs + 1 END
     OR (pfn.pronargs > 1 AND
         NOT pg_temp.binary_coercible(p.proargtypes[0], pfn.proargtypes[1]))
     OR (pfn.pronargs > 2 AND
         NOT pg_temp.binary_coercible(p.proargtypes[1], pfn.proargtypes[2]))
     OR (pfn.pronargs > 3 AND
         NOT pg_temp.binary_coercible(p.proargtypes[2], pfn.proargtypes[3]))
     -- we could carry the check further, but 4 args is enough for now
     OR (pfn.pronargs > 4)
    );

-- If transfn is strict then either initval should be non-NULL, or
-- input type should match transtype so that the first non-null input
-- can be assigned as the state value.
SELECT a.aggfnoid::regprocedure, p.proname, ptr.oid::regprocedure, ptr.proname
FROM ext_aggregate AS a, pg_proc AS p, pg_proc AS ptr
WHERE a.aggfnoid = p.oid AND
    a.aggtransfn = ptr.oid AND ptr.proisstrict AND
    a.agginitval IS NULL AND
    NOT pg_temp.binary_coercible(p.proargtypes[0], a.aggtranstype);

-- Check for inconsistent specifications of moving-aggregate columns.
SELECT aggfnoid::regprocedure
FROM ext_aggregate as a
WHERE aggmtranstype != 0 AND
    (aggmtransfn = 0 OR aggminvtransfn = 0);

SELECT aggfnoid::regprocedure
FROM ext_aggregate as a
WHERE aggmtranstype = 0 AND
    (aggmtransfn != 0 OR aggminvtransfn != 0 OR aggmfinalfn != 0 OR
     aggmtransspace != 0 OR aggminitval IS NOT NULL);

-- Check that all combine functions have signature
-- combine(transtype, transtype) returns transtype
SELECT a.aggfnoid::regprocedure, p.proname
FROM ext_aggregate as a, pg_proc as p
WHERE a.aggcombinefn = p.oid AND
    (p.pronargs != 2 OR
     p.prorettype != p.proargtypes[0] OR
     p.prorettype != p.proargtypes[1] OR
     NOT pg_temp.binary_coercible(a.aggtranstype, p.proargtypes[0]));

-- Check that no combine function for an INTERNAL transtype is strict.
SELECT a.aggfnoid::regprocedure, p.proname
FROM ext_aggregate as a, pg_proc as p
WHERE a.aggcombinefn = p.oid AND
    a.aggtranstype = 'internal'::regtype AND p.proisstrict;

-- serialize/deserialize functions should be specified only for aggregates
-- with transtype internal and a combine function, and we should have both
-- or neither of them.
SELECT aggfnoid::regprocedure, aggtranstype, aggserialfn, aggdeserialfn
FROM ext_aggregate
WHERE (aggserialfn != 0 OR aggdeserialfn != 0)
  AND (aggtranstype != 'internal'::regtype OR aggcombinefn = 0 OR
       aggserialfn = 0 OR aggdeserialfn = 0);

-- Check that all serialization functions have signature
-- serialize(internal) returns bytea
-- Also insist that they be strict; it's wasteful to run them on NULLs.
SELECT a.aggfnoid::regprocedure, p.proname
FROM ext_aggregate as a, pg_proc as p
WHERE a.aggserialfn = p.oid AND
    (p.prorettype != 'bytea'::regtype OR p.pronargs != 1 OR
     p.proargtypes[0] != 'internal'::regtype OR
     NOT p.proisstrict);

-- Check that all deserialization functions have signature
-- deserialize(bytea, internal) returns internal
-- Also insist that they be strict; it's wasteful to run them on NULLs.
SELECT a.aggfnoid::regprocedure, p.proname
FROM ext_aggregate as a, pg_proc as p
WHERE a.aggdeserialfn = p.oid AND
    (p.prorettype != 'internal'::regtype OR p.pronargs != 2 OR
     p.proargtypes[0] != 'bytea'::regtype OR
     p.proargtypes[1] != 'internal'::regtype OR
     NOT p.proisstrict);

-- Check that aggregates which have the same transition function also have
-- the same combine, serialization, and deserialization functions.
SELECT a.aggfnoid::regprocedure, a.aggcombinefn, a.aggserialfn, a.aggdeserialfn,
       b.aggfnoid::regprocedure, b.aggcombinefn, b.aggserialfn, b.aggdeserialfn
FROM
    ext_aggregate a, pg_aggregate b
WHERE
    a.aggfnoid != b.aggfnoid AND a.aggtransfn = b.aggtransfn AND
    (a.aggcombinefn != b.aggcombinefn OR a.aggserialfn != b.aggserialfn
     OR a.aggdeserialfn != b.aggdeserialfn);

-- Check that there are not aggregates with the same name and different
-- numbers of arguments (PostgreSQL's policy against misplaced ORDER BY confusion).
SELECT p1.oid::regprocedure, p2.oid::regprocedure
FROM ext_proc AS p1, pg_proc AS p2
WHERE p1.oid < p2.oid AND p1.proname = p2.proname AND
    p1.pronamespace = p2.pronamespace AND
    p1.prokind = 'a' AND p2.prokind = 'a' AND
    array_dims(p1.proargtypes) != array_dims(p2.proargtypes)
ORDER BY 1;

-- For the same reason, aggregates with default arguments are no good.
SELECT oid::regprocedure, proname
FROM ext_proc AS p
WHERE prokind = 'a' AND proargdefaults IS NOT NULL;

-- For the same reason, we avoid creating variadic aggregates.
SELECT p.oid::regprocedure, proname
FROM ext_proc AS p JOIN pg_aggregate AS a ON a.aggfnoid = p.oid
WHERE prokind = 'a' AND provariadic != 0 AND a.aggkind = 'n';

-- **************** pg_type (type_sanity.sql) ****************

-- Look for illegal values in pg_type fields.
SELECT t1.oid::regtype, t1.typname
FROM ext_type as t1
WHERE t1.typnamespace = 0 OR
    (t1.typlen <= 0 AND t1.typlen != -1 AND t1.typlen != -2) OR
    (t1.typtype not in ('b', 'c', 'd', 'e', 'm', 'p', 'r')) OR
    NOT t1.typisdefined OR
    (t1.typalign not in ('c', 's', 'i', 'd')) OR
    (t1.typstorage not in ('p', 'x', 'e', 'm'));

-- Look for "pass by value" types that can't be passed by value.
SELECT t1.oid::regtype, t1.typname
FROM ext_type as t1
WHERE t1.typbyval AND
    (t1.typlen != 1 OR t1.typalign != 'c') AND
    (t1.typlen != 2 OR t1.typalign != 's') AND
    (t1.typlen != 4 OR t1.typalign != 'i') AND
    (t1.typlen != 8 OR t1.typalign != 'd');

-- Look for "toastable" types that aren't varlena.
SELECT t1.oid::regtype, t1.typname
FROM ext_type as t1
WHERE t1.typstorage != 'p' AND
    (t1.typbyval OR t1.typlen != -1);

-- Look for complex types that do not have a typrelid entry,
-- or basic types that do.
SELECT t1.oid::regtype, t1.typname
FROM ext_type as t1
WHERE (t1.typtype = 'c' AND t1.typrelid = 0) OR
    (t1.typtype != 'c' AND t1.typrelid != 0);

-- Look for types that should have an array type but don't.
-- Generally anything that's not a pseudotype should have an array type.
-- However, we do have a small number of exceptions.
SELECT t1.oid::regtype, t1.typname
FROM ext_type as t1
WHERE t1.typtype not in ('p') AND t1.typname NOT LIKE E'\\_%'
    AND NOT EXISTS
    (SELECT 1 FROM pg_type as t2
     WHERE t2.typname = ('_' || t1.typname)::name AND
           t2.typelem = t1.oid and t1.typarray = t2.oid)
ORDER BY t1.oid;

-- Make sure typarray points to a "true" array type of our own base
SELECT t1.oid::regtype, t1.typname as basetype, t2.typname as arraytype,
       t2.typsubscript
FROM   ext_type t1 LEFT JOIN pg_type t2 ON (t1.typarray = t2.oid)
WHERE  t1.typarray <> 0 AND
       (t2.oid IS NULL OR
        t2.typsubscript != 'array_subscript_handler'::regproc);

-- Text conversion routines must be provided.
SELECT t1.oid::regtype, t1.typname
FROM ext_type as t1
WHERE (t1.typinput = 0 OR t1.typoutput = 0);

-- typinput, typoutput, typreceive and typsend routines should not be volatile
SELECT t1.oid::regtype, t1.typname, p1.oid::regprocedure, p1.proname
FROM ext_type AS t1, pg_proc AS p1
WHERE p1.oid IN (t1.typinput, t1.typoutput, t1.typreceive, t1.typsend) AND p1.provolatile NOT IN ('i', 's');

-- Composites, domains, enums, multiranges, ranges should all use the same
-- input, output, receive and send routines (PostgreSQL lists them with SELECT DISTINCT;
-- here: those of PostgreSQL's own types of the same kind).
SELECT t1.oid::regtype, t1.typtype, t1.typinput, t1.typoutput, t1.typreceive, t1.typsend
FROM ext_type AS t1
WHERE t1.typtype NOT IN ('b', 'p') AND
    (t1.typinput, t1.typoutput, t1.typreceive, t1.typsend) NOT IN
    (SELECT typinput, typoutput, typreceive, typsend FROM pg_type
      WHERE oid < 16384 AND typtype = t1.typtype);

-- Array types should have same typdelim as their element types
SELECT t1.oid::regtype, t1.typname, t2.oid::regtype, t2.typname
FROM ext_type AS t1, pg_type AS t2
WHERE t1.typarray = t2.oid AND NOT (t1.typdelim = t2.typdelim);

-- Look for array types whose typalign isn't sufficient
SELECT t1.oid::regtype, t1.typname, t1.typalign, t2.typname, t2.typalign
FROM ext_type AS t1, pg_type AS t2
WHERE t1.typarray = t2.oid AND
    t2.typalign != (CASE WHEN t1.typalign = 'd' THEN 'd'::"char"
                         ELSE 'i'::"char" END);

-- Array types should have same typmodin/out as their element types
SELECT t1.oid::regtype, t1.typname, t2.oid::regtype, t2.typname
FROM ext_type AS t1, pg_type AS t2
WHERE t1.typelem = t2.oid AND NOT
    (t1.typmodin = t2.typmodin AND t1.typmodout = t2.typmodout);

-- Check for bogus typanalyze routines
SELECT t1.oid::regtype, t1.typname, p1.oid::regprocedure, p1.proname
FROM ext_type AS t1, pg_proc AS p1
WHERE t1.typanalyze = p1.oid AND NOT
    (p1.pronargs = 1 AND
     p1.proargtypes[0] = 'internal'::regtype AND
     p1.prorettype = 'bool'::regtype AND NOT p1.proretset);

-- array_typanalyze should be used for all and only array types
SELECT t.oid::regtype, t.typname, t.typanalyze
FROM ext_type t
WHERE t.typbasetype = 0 AND
    (t.typanalyze = 'array_typanalyze'::regproc) !=
    (t.typsubscript = 'array_subscript_handler'::regproc)
ORDER BY 1;

-- **************** pg_class (type_sanity.sql) ****************

-- Look for illegal values in pg_class fields
SELECT c1.oid::regclass, c1.relname
FROM ext_class as c1
WHERE relkind NOT IN ('r', 'i', 'S', 't', 'v', 'm', 'c', 'f', 'p', 'I') OR
    relpersistence NOT IN ('p', 'u', 't') OR
    relreplident NOT IN ('d', 'n', 'f', 'i');

-- All tables, indexes, partitioned indexes and matviews should have an
-- access method.
SELECT c1.oid::regclass, c1.relname
FROM ext_class as c1
WHERE c1.relkind NOT IN ('S', 'v', 'f', 'c', 'p') and
    c1.relam = 0;

-- Conversely, sequences, views, foreign tables, types and partitioned
-- tables shouldn't have them.
SELECT c1.oid::regclass, c1.relname
FROM ext_class as c1
WHERE c1.relkind IN ('S', 'v', 'f', 'c', 'p') and
    c1.relam != 0;

-- (added here) Every relation's row type exists and points back to it
SELECT c1.oid::regclass, c1.relname
FROM ext_class as c1
WHERE NOT EXISTS (SELECT 1 FROM pg_type t WHERE t.oid = c1.reltype AND t.typrelid = c1.oid);

-- **************** pg_attribute (type_sanity.sql) ****************

-- Look for illegal values in pg_attribute fields (attcacheoff is gone in PostgreSQL 18,
-- whose own type_sanity dropped it: read through to_jsonb where the column exists)
SELECT a1.attrelid::regclass, a1.attname
FROM pg_attribute as a1
WHERE a1.attrelid IN (SELECT oid FROM ext_class) AND
    (a1.attrelid = 0 OR a1.atttypid = 0 OR a1.attnum = 0 OR
     coalesce((to_jsonb(a1) ->> 'attcacheoff')::int, -1) != -1 OR a1.attinhcount < 0 OR
     (a1.attinhcount = 0 AND NOT a1.attislocal));

-- Cross-check attnum against parent relation
SELECT a1.attrelid::regclass, a1.attname, c1.oid::regclass, c1.relname
FROM pg_attribute AS a1, ext_class AS c1
WHERE a1.attrelid = c1.oid AND a1.attnum > c1.relnatts;

-- Detect missing pg_attribute entries: should have as many non-system
-- attributes as parent relation expects
SELECT c1.oid::regclass, c1.relname
FROM ext_class AS c1
WHERE c1.relnatts != (SELECT count(*) FROM pg_attribute AS a1
                      WHERE a1.attrelid = c1.oid AND a1.attnum > 0);

-- Cross-check against pg_type entry
-- NOTE: we allow attstorage to be 'plain' even when typstorage is not;
-- this is mainly for toast tables.
SELECT a1.attrelid::regclass, a1.attname, t1.oid::regtype, t1.typname
FROM pg_attribute AS a1, pg_type AS t1
WHERE a1.attrelid IN (SELECT oid FROM ext_class) AND
    a1.atttypid = t1.oid AND
    (a1.attlen != t1.typlen OR
     a1.attalign != t1.typalign OR
     a1.attbyval != t1.typbyval OR
     (a1.attstorage != t1.typstorage AND a1.attstorage != 'p'));

-- (added here) A composite type's relation has a composite row type
SELECT c1.oid::regclass, c1.relname, t1.oid::regtype, t1.typname
FROM ext_class AS c1, pg_type AS t1
WHERE c1.reltype = t1.oid AND c1.relkind = 'c' AND t1.typtype != 'c';

-- **************** pg_depend, pg_shdepend (misc_sanity.sql) ****************

-- Look for illegal values in pg_depend fields.
SELECT *
FROM pg_depend as d1
WHERE (d1.classid, d1.objid) IN (SELECT classid, objid FROM ext_obj) AND
     (refclassid = 0 OR refobjid = 0 OR
      classid = 0 OR objid = 0 OR
      deptype NOT IN ('a', 'e', 'i', 'n', 'x', 'P', 'S'));

-- Look for illegal values in pg_shdepend fields.
SELECT *
FROM pg_shdepend as d1
WHERE (d1.classid, d1.objid) IN (SELECT classid, objid FROM ext_obj) AND
     (refclassid = 0 OR refobjid = 0 OR
      classid = 0 OR objid = 0 OR
      deptype NOT IN ('a', 'o', 'r', 't'));

\c postgres
DROP DATABASE uvm_catalog;
