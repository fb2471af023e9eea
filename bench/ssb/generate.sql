-- The Star Schema Benchmark's tables at scale factor :sf, in the current schema (issue 27).
--
--     psql -v sf=10 -f bench/ssb/generate.sql        (bench/ssb/run does this)
--
-- The Star Schema Benchmark (P. O'Neil, E. O'Neil, X. Chen, "Star Schema Benchmark", revision
-- 3, 2009) is TPC-H's lineitem and orders folded into one fact table, LINEORDER, with four
-- dimensions. This script makes its tables with the specification's cardinalities and value
-- domains in plain SQL, without dbgen:
--
--   table      rows                              key
--   lineorder  about 6,000,000 x SF              lo_orderkey, lo_linenumber (1.5 M x SF orders
--                                                of 1 to 7 lines, 4 on average)
--   customer   30,000 x SF                       c_custkey
--   supplier   2,000 x SF                        s_suppkey
--   part       200,000 x floor(1 + log2 SF)      p_partkey (below SF 1: 200,000 x SF)
--   date       2,556 days from 1992-01-01        d_datekey, yyyymmdd
--
-- Every value is a hash of the row's number (hashint8), not random(), so that a scale factor
-- always gives the same rows: answers can be compared between runs, plans and machines. The
-- string columns the queries filter on follow the specification's domains: 25 nations in 5
-- regions (TPC-H's), cities as the nation's first 9 characters and a digit, p_mfgr 'MFGR#1' to
-- 'MFGR#5', p_category the mfgr and a digit 1 to 5, p_brand1 the category and 1 to 40. Prices
-- are integers (cents; dbgen's files carry them so), and what the queries never read
-- (addresses, phones, comments) is short filler. Not dbgen's: the orders' keys are dense, and
-- the exact draw of each value.
--
-- Memory and time: SF 10 is about 60 M lineorder rows, 6 GB of heap; the INSERT runs in one
-- backend here (225 s on the H200 machine), in one per CPU under bench/ssb/run.

\set ON_ERROR_STOP on
SET client_min_messages = warning;

DROP TABLE IF EXISTS lineorder, customer, supplier, part, date, nation_list;

-- The draws and the row counts (common.sql: lineorder.sql, which loads lineorder's rows, needs
-- them too).
\ir common.sql

CREATE TABLE nation_list (n int PRIMARY KEY, name text, region text);
INSERT INTO nation_list VALUES
  (0, 'ALGERIA', 'AFRICA'), (1, 'ARGENTINA', 'AMERICA'), (2, 'BRAZIL', 'AMERICA'),
  (3, 'CANADA', 'AMERICA'), (4, 'EGYPT', 'MIDDLE EAST'), (5, 'ETHIOPIA', 'AFRICA'),
  (6, 'FRANCE', 'EUROPE'), (7, 'GERMANY', 'EUROPE'), (8, 'INDIA', 'ASIA'),
  (9, 'INDONESIA', 'ASIA'), (10, 'IRAN', 'MIDDLE EAST'), (11, 'IRAQ', 'MIDDLE EAST'),
  (12, 'JAPAN', 'ASIA'), (13, 'JORDAN', 'MIDDLE EAST'), (14, 'KENYA', 'AFRICA'),
  (15, 'MOROCCO', 'AFRICA'), (16, 'MOZAMBIQUE', 'AFRICA'), (17, 'PERU', 'AMERICA'),
  (18, 'CHINA', 'ASIA'), (19, 'ROMANIA', 'EUROPE'), (20, 'SAUDI ARABIA', 'MIDDLE EAST'),
  (21, 'VIETNAM', 'ASIA'), (22, 'RUSSIA', 'EUROPE'), (23, 'UNITED KINGDOM', 'EUROPE'),
  (24, 'UNITED STATES', 'AMERICA');

CREATE TABLE date (
  d_datekey int PRIMARY KEY,        -- yyyymmdd
  d_date text NOT NULL,             -- 'January 1, 1992'
  d_dayofweek text NOT NULL,        -- 'Wednesday'
  d_month text NOT NULL,            -- 'January'
  d_year int NOT NULL,
  d_yearmonthnum int NOT NULL,      -- 199201
  d_yearmonth text NOT NULL,        -- 'Jan1992'
  d_daynuminweek int NOT NULL,      -- 1 (Sunday) to 7
  d_daynuminmonth int NOT NULL,
  d_daynuminyear int NOT NULL,
  d_monthnuminyear int NOT NULL,
  d_weeknuminyear int NOT NULL,     -- (d_daynuminyear - 1) / 7 + 1
  d_sellingseason text NOT NULL,
  d_lastdayinweekfl bool NOT NULL,
  d_lastdayinmonthfl bool NOT NULL,
  d_holidayfl bool NOT NULL,
  d_weekdayfl bool NOT NULL
);
INSERT INTO date
SELECT to_char(d, 'YYYYMMDD')::int,
       trim(to_char(d, 'FMMonth')) || ' ' || extract(day FROM d) || ', ' || extract(year FROM d),
       trim(to_char(d, 'FMDay')),
       trim(to_char(d, 'FMMonth')),
       extract(year FROM d)::int,
       to_char(d, 'YYYYMM')::int,
       to_char(d, 'Mon') || to_char(d, 'YYYY'),
       extract(dow FROM d)::int + 1,
       extract(day FROM d)::int,
       extract(doy FROM d)::int,
       extract(month FROM d)::int,
       (extract(doy FROM d)::int - 1) / 7 + 1,
       CASE WHEN extract(month FROM d) = 12 THEN 'Christmas'
            WHEN extract(month FROM d) IN (1, 2) THEN 'Winter'
            WHEN extract(month FROM d) IN (3, 4, 5) THEN 'Spring'
            WHEN extract(month FROM d) IN (6, 7, 8) THEN 'Summer'
            ELSE 'Fall' END,
       extract(dow FROM d) = 6,
       extract(month FROM d + 1) <> extract(month FROM d),
       to_char(d, 'MMDD') IN ('0101', '0704', '1225', '1231'),
       extract(dow FROM d) BETWEEN 1 AND 5
FROM generate_series(timestamp '1992-01-01', timestamp '1992-01-01' + interval '2555 days', interval '1 day') AS g(t),
     LATERAL (SELECT t::date AS d) x;

CREATE TABLE customer (
  c_custkey int PRIMARY KEY,
  c_name text NOT NULL,
  c_address text NOT NULL,
  c_city text NOT NULL,
  c_nation text NOT NULL,
  c_region text NOT NULL,
  c_phone text NOT NULL,
  c_mktsegment text NOT NULL
);
INSERT INTO customer
SELECT i, 'Customer#' || lpad(i::text, 9, '0'), 'addr' || (i * 7 % 100003),
       rpad(substr(n.name, 1, 9), 9) || pg_temp.ssb_draw(2, i, 10),
       n.name, n.region, (10 + n.n) || '-' || lpad(pg_temp.ssb_draw(3, i, 10000000)::text, 7, '0'),
       (ARRAY['AUTOMOBILE', 'BUILDING', 'FURNITURE', 'MACHINERY', 'HOUSEHOLD'])[1 + pg_temp.ssb_draw(4, i, 5)]
FROM generate_series(1, :customers) i
JOIN nation_list n ON n.n = pg_temp.ssb_draw(1, i, 25);

CREATE TABLE supplier (
  s_suppkey int PRIMARY KEY,
  s_name text NOT NULL,
  s_address text NOT NULL,
  s_city text NOT NULL,
  s_nation text NOT NULL,
  s_region text NOT NULL,
  s_phone text NOT NULL
);
INSERT INTO supplier
SELECT i, 'Supplier#' || lpad(i::text, 9, '0'), 'addr' || (i * 13 % 100003),
       rpad(substr(n.name, 1, 9), 9) || pg_temp.ssb_draw(12, i, 10),
       n.name, n.region, (10 + n.n) || '-' || lpad(pg_temp.ssb_draw(13, i, 10000000)::text, 7, '0')
FROM generate_series(1, :suppliers) i
JOIN nation_list n ON n.n = pg_temp.ssb_draw(11, i, 25);

CREATE TABLE part (
  p_partkey int PRIMARY KEY,
  p_name text NOT NULL,
  p_mfgr text NOT NULL,             -- 'MFGR#1' to 'MFGR#5'
  p_category text NOT NULL,         -- p_mfgr and 1 to 5: 'MFGR#11' to 'MFGR#55'
  p_brand1 text NOT NULL,           -- p_category and 1 to 40: 'MFGR#111' to 'MFGR#5540'
  p_color text NOT NULL,
  p_type text NOT NULL,
  p_size int NOT NULL,              -- 1 to 50
  p_container text NOT NULL
);
INSERT INTO part
SELECT i, 'part ' || i, 'MFGR#' || m, 'MFGR#' || m || c, 'MFGR#' || m || c || b,
       (ARRAY['almond', 'antique', 'aquamarine', 'azure', 'beige', 'bisque', 'black', 'blanched',
              'blue', 'blush', 'brown', 'burlywood', 'chartreuse', 'chocolate', 'coral'])[1 + pg_temp.ssb_draw(24, i, 15)],
       (ARRAY['STANDARD', 'SMALL', 'MEDIUM', 'LARGE', 'ECONOMY', 'PROMO'])[1 + pg_temp.ssb_draw(25, i, 6)]
         || ' ' || (ARRAY['ANODIZED', 'BURNISHED', 'PLATED', 'POLISHED', 'BRUSHED'])[1 + pg_temp.ssb_draw(26, i, 5)]
         || ' ' || (ARRAY['TIN', 'NICKEL', 'BRASS', 'STEEL', 'COPPER'])[1 + pg_temp.ssb_draw(27, i, 5)],
       1 + pg_temp.ssb_draw(28, i, 50),
       (ARRAY['SM', 'LG', 'MED', 'JUMBO', 'WRAP'])[1 + pg_temp.ssb_draw(29, i, 5)]
         || ' ' || (ARRAY['CASE', 'BOX', 'BAG', 'JAR', 'PKG', 'PACK', 'CAN', 'DRUM'])[1 + pg_temp.ssb_draw(30, i, 8)]
FROM generate_series(1, :parts) i,
     LATERAL (SELECT 1 + pg_temp.ssb_draw(21, i, 5) AS m, 1 + pg_temp.ssb_draw(22, i, 5) AS c,
                     1 + pg_temp.ssb_draw(23, i, 40) AS b) x;

-- lineorder: 1.5 M x SF orders of 1 to 7 lines. An order's customer, date and priority are
-- its own; each line draws its part, supplier, quantity, discount and tax. Prices are in cents:
-- a part's retail price is TPC-H's (90,000 + partkey / 10 mod 20,001 + 100 x (partkey mod
-- 1,000)), the supply cost 60 % of it.
CREATE TABLE lineorder (
  lo_orderkey bigint NOT NULL,
  lo_linenumber int NOT NULL,
  lo_custkey int NOT NULL,
  lo_partkey int NOT NULL,
  lo_suppkey int NOT NULL,
  lo_orderdate int NOT NULL,
  lo_orderpriority text NOT NULL,
  lo_shippriority int NOT NULL,
  lo_quantity int NOT NULL,         -- 1 to 50
  lo_extendedprice bigint NOT NULL,
  lo_ordtotalprice bigint NOT NULL,
  lo_discount int NOT NULL,         -- 0 to 10 (percent)
  lo_revenue bigint NOT NULL,
  lo_supplycost bigint NOT NULL,
  lo_tax int NOT NULL,              -- 0 to 8
  lo_commitdate int NOT NULL,
  lo_shipmode text NOT NULL
);
-- Its rows: all of them here, unless the caller loads them itself in several sessions at once
-- (bench/ssb/run, with -v lineorder_apart=1: lineorder.sql per range of orders).
\if :{?lineorder_apart}
\else
\set o_lo 1
\set o_hi :orders
\ir lineorder.sql
\endif

DROP TABLE nation_list;
ANALYZE lineorder, customer, supplier, part, date;
RESET client_min_messages;
