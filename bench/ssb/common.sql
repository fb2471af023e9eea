-- The Star Schema Benchmark generator's draws and row counts at scale factor :sf, for
-- generate.sql and lineorder.sql (each session that loads rows needs the function).

-- A pseudo-random integer in [0, n) for (seed, i): the same for the same arguments everywhere
-- (n well under 2^32, so the modulo's bias is below 0.1 %).
CREATE OR REPLACE FUNCTION pg_temp.ssb_draw(seed bigint, i bigint, n bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT (hashint8(i * 1000003 + seed)::bigint + 2147483648) % n $$;

-- The row counts (below 1, the specification defines no scale: every table but date scales
-- down linearly, at least one row).
SELECT greatest(1, (30000 * :sf)::int) AS customers,
       greatest(1, (2000 * :sf)::int) AS suppliers,
       CASE WHEN :sf >= 1 THEN (200000 * floor(1 + log(2, (:sf)::numeric)))::int
            ELSE greatest(1, (200000 * :sf)::int) END AS parts,
       greatest(1, (1500000 * :sf)::bigint) AS orders
\gset
