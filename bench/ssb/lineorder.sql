-- lineorder's rows of orders :o_lo to :o_hi at scale factor :sf (generate.sql made the table;
-- bench/ssb/run loads disjoint ranges in several sessions at once). The rows of an order depend
-- on its number alone, so any split gives the same table.

\set ON_ERROR_STOP on
SET client_min_messages = warning;
\ir common.sql

INSERT INTO lineorder
SELECT o, l, cust, part, 1 + pg_temp.ssb_draw(43, o * 8 + l, :suppliers),
       to_char(odate, 'YYYYMMDD')::int,
       (ARRAY['1-URGENT', '2-HIGH', '3-MEDIUM', '4-NOT SPECI', '5-LOW'])[1 + pg_temp.ssb_draw(34, o, 5)],
       0, qty, qty * price, qty * price * lines, disc, qty * price * (100 - disc) / 100,
       price * 6 / 10, pg_temp.ssb_draw(46, o * 8 + l, 9),
       to_char(odate + (30 + pg_temp.ssb_draw(47, o * 8 + l, 61))::int, 'YYYYMMDD')::int,
       (ARRAY['REG AIR', 'AIR', 'RAIL', 'SHIP', 'TRUCK', 'MAIL', 'FOB'])[1 + pg_temp.ssb_draw(48, o * 8 + l, 7)]
FROM generate_series(:o_lo::bigint, :o_hi::bigint) o,
     LATERAL (SELECT 1 + pg_temp.ssb_draw(31, o, 7) AS lines,
                     1 + pg_temp.ssb_draw(32, o, :customers) AS cust,
                     date '1992-01-01' + pg_temp.ssb_draw(33, o, 2556 - 151)::int AS odate) ord,
     LATERAL generate_series(1, ord.lines) l,
     LATERAL (SELECT 1 + pg_temp.ssb_draw(41, o * 8 + l, :parts) AS part,
                     1 + pg_temp.ssb_draw(44, o * 8 + l, 50) AS qty,
                     pg_temp.ssb_draw(45, o * 8 + l, 11) AS disc) li,
     LATERAL (SELECT 90000 + (li.part / 10) % 20001 + 100 * (li.part % 1000) AS price) pr;
