//! GpuGroupAgg: `GROUP BY`, aggregates and star joins computed from a fact table's column
//! cache, or from its heap where it has none (issue 27, points 1 to 3).
//!
//! # Why
//!
//! PostgreSQL aggregates a table row by row from the heap: every page read, every tuple
//! deformed, a transition call per aggregate, and a star join builds a hash table per
//! dimension and hands every joined row up. Where the fact table has a current column cache
//! (`crate::caches`), its rows' words are already laid out column by column in segments, and a
//! scan program (`crate::scan`, run as `ScanGroups` requests where the segments are: the GPU
//! service, or the backend in process mode) filters them, probes each dimension's join table
//! and folds what is left into a group table in a segment, which grows when the groups
//! outnumber its room. No tuple is formed below the groups (Crystal's model).
//!
//! # Plan
//!
//! ```text
//! Custom Scan (UvmGpuGroupAgg)
//!   Column Cache: lineorder
//!   Cached Columns: lo_revenue, lo_orderdate, lo_partkey
//!   Dimensions: date ON lo_orderdate = date.d_datekey, part ON lo_partkey = part.p_partkey
//!   Cached Dimensions: date, part     (those with a program over a cache of their own)
//!   Group Keys: date.d_year, part.p_brand1
//!   Cache Filters: lo_quantity <= 24
//!   ->  HashAggregate                 (PostgreSQL's, run where the cache is not current)
//!         ->  Hash Join ...
//!   ->  Seq Scan on date              (each dimension's own plan, its conditions included)
//!   ->  Seq Scan on part
//!         Filter: (p_category = 'MFGR#12'::text)
//! ```
//!
//! - **Planner** (`plan.rs`, the `WHERE` in `clauses.rs`; `create_upper_paths_hook` at
//!   `UPPERREL_GROUP_AGG`, after PostgreSQL added its own grouping paths): for a query level
//!   with no grouping sets,
//!   `HAVING` or set-returning functions whose `FROM` is plain tables (no inheritance
//!   children, no sample) joined by inner joins only, one of them (the fact) with a ready cache
//!   holding every column the level reads of it, where ([`Shape::of`])
//!   - every other table (a dimension) is joined to the fact by one equivalence class of
//!     plain columns (integer types across widths, or `date`), and no join clause lies outside
//!     the classes (no dimension joined to another);
//!   - each fact conjunct is a clause of the program's (`crate::scan`: alternatives, each a
//!     test of one column), one of
//!     - a column compared with a constant (`=`, `<>`, `<`, `<=`, `>`, `>=`, so `BETWEEN` too:
//!       integer types across widths, `date`, `timestamp[tz]` with their own type, and
//!       `numeric(p, s)` with a numeric constant of any scale, scaled to the column's words and
//!       rounded the way the comparison needs): ranges of the column's words (`<>`: the two
//!       below and above); `float4`/`float8` with a constant of their own type: the runs of
//!       words PostgreSQL's order maps the comparison onto (`crate::scan::floats`: NaNs, signed
//!       zeros; no kernel change, they are plain ranges), and their `IN` and `NOT IN` lists; `= ANY` of a constant array
//!       (`IN (...)`, numerics too): a range per run of consecutive values; `<> ALL` (`NOT
//!       IN`, without a NULL element): a clause per element; `IS NULL`, `IS NOT NULL`; a
//!       boolean column or its `NOT`; an `OR` of these, and of `AND`s of them (distributed,
//!       a clause implied by another dropped, an arm that is never true, such as a numeric
//!       the column's scale cannot hold, dropped; `(A AND B) OR C` is
//!       `(A OR C) AND (B OR C)`, which holds in three-valued logic too; PostgreSQL has pushed
//!       `NOT` down already, so the tests answer SQL's three-valued logic exactly: the scan
//!       module's essay says why);
//!     - a comparison of two integer expressions (`+ - * / %` and unary minus of PostgreSQL's
//!       built-in `int2/int4/int8` operators, widening casts, columns, constants; `a + b < 5`,
//!       `w % 7 = 3`, `a = b`) or of two columns of one `date`/`timestamp[tz]` type: the
//!       program's `scan::expr` comparison, raising PostgreSQL's 22003 and 22012 where its
//!       arithmetic would. Clauses holding one go last, so that a cheaper condition drops a row
//!       before its arithmetic runs, as PostgreSQL orders conditions by cost;
//!     - any condition whose only column is one dictionary-encoded `text`/`varchar` column of
//!       the fact, built of comparisons, `IN`, `LIKE`/`ILIKE`, `IS NULL`, `AND`/`OR`/`NOT` and
//!       other calls that raise no ERROR for any string (leakproof functions; `clauses::error_free`
//!       says why), constants and a generic plan's parameters: a text condition, which the executor
//!       has PostgreSQL evaluate once per distinct string of the column's dictionary and once
//!       for NULL, the program testing each row's code against the bitmap of the codes that
//!       passed (and `IS NULL` where NULL did);
//!
//!     a dimension's conjuncts are its own plan's; where the dimension has a ready cache of
//!     its own holding its key, its grouping columns and every column its conjuncts read, and
//!     each conjunct is such a clause over its columns, the plan also holds them as the
//!     dimension's own program ([`DimCache`]: `Cached Dimensions` in `EXPLAIN`);
//!   - each `GROUP BY` item is a column of the fact of an integer-like type (`int2/4/8`,
//!     `bool`, `date`, `timestamp[tz]`, `numeric(p, s)` by its scaled words) or
//!     dictionary-encoded `text`/`varchar` (its codes:
//!     one per distinct string; the strings are read from the dictionary for the groups
//!     returned), or a column of a dimension of a type whose equal values are equal bytes
//!     (those, and `text`/`varchar` with a deterministic collation), and every column the
//!     target uses outside an aggregate is one of them;
//!   - each aggregate is `count(*)`, `count(x)`, or `sum`, `min`, `max`, `avg` of an `int2/4/8`
//!     column of the fact or of the difference or product of two `int4`/`int8` ones (PostgreSQL's
//!     `int8` operators), or `sum(float8)`, `avg`, `min`, `max` of a `float4`/`float8` column
//!     (not `sum(float4)`, which PostgreSQL adds in `float4`), or `sum`, `avg`, `min`, `max` of
//!     a `numeric(p, s)` column (its scaled words summed exactly in 128 bits, the results
//!     numerics of scale `s` as PostgreSQL's), plain (no DISTINCT, ORDER BY or FILTER);
//!
//!   it adds a path priced at the cache's scan and the dimensions' plans ([`cost`]) whose first
//!   child is an aggregation by PostgreSQL (hashed, or plain without GROUP BY) over the input's
//!   cheapest path, and whose other children are the dimensions' cheapest paths. Anything else:
//!   no path.
//! - **Executor** (`run.rs`; a program's run over a cache in `run/program.rs`, the
//!   dimensions' rows in `run/dims.rs`, `EXPLAIN`'s text of the program in `run/explain.rs`;
//!   results and text conditions in `values.rs`): at the first call
//!   the node checks the cache against the query's snapshot (`caches::usable_in_query`, the
//!   reader's rule) and that it still holds the
//!   planned columns with the planned encodings; has PostgreSQL evaluate each text condition
//!   over its column's dictionary (a bitmap of the codes that pass). It gathers each
//!   dimension's rows into a temporary join table of (key, index of the row's distinct
//!   grouping values), keeping those values (text copied) in a context of its own: from a
//!   program over the dimension's own cache where the plan holds one and that cache is current
//!   for the snapshot too, else by draining the dimension's plan (`run/dims.rs`; `EXPLAIN
//!   ANALYZE`'s `Dimensions Read From` says which, and why a planned cache was not read); puts
//!   the joins in the order of the rows they let pass, fewest first (the share of each
//!   dimension's rows in its join table; `Join Order`); runs the program (`exec::scan_groups`)
//!   into a temporary group table, growing it into a segment of twice the slots whenever the
//!   program stops full (`exec::groups_grow`); folds the rows that inserts appended to the
//!   cache and the snapshot sees (`caches::visible_tail`, by the same program's
//!   [`crate::scan::fold_row`] over the join tables read back) into a table of their own; and
//!   returns one row per group, reading the group table's slots a window at a time (a quarter
//!   of `work_mem`, 64 kB to 8 MB; the first window comes with the table's header, in the
//!   same read), combining into each group the appended rows' states of its
//!   key, then the appended rows' groups no slot had: the scan tuple is the grouping columns
//!   (a fact key's word as a datum, a dimension's value by its payload) then the aggregates,
//!   and the node's target list (the query's expressions over them) is projected from it. The temporary segments are dropped
//!   when read, and however the query ends (`super::cleanup`). Where the cache is not current,
//!   or is dropped before the program pins it, or the engine runs no scan programs (0A000), the node returns its first child's rows instead:
//!   nothing was returned yet, so the fallback is whole.
//!
//! Results are PostgreSQL's: counts `int8`, `sum(int2/int4)` `int8` (past its range an ERROR
//! 22003, as `int4_sum`'s), `sum(int8)` `numeric` (128-bit sums), `min`/`max` of the
//! argument's type, `avg` the exact sum divided by the count by PostgreSQL's `numeric_div`
//! (as `int8_avg` and `numeric_avg` finish, so the same digits), float sums and averages
//! `float8` (added in the cache's order, so the last digits may differ from PostgreSQL's heap
//! order; an overflow of finite values 22003 as `float8pl`'s; PostgreSQL's `avg` of floats
//! also keeps a sum of squared deviations for the variance, which may overflow for values
//! beyond about 1e154 and raise 22003 where the node, keeping none, answers: an order-dependent
//! error PostgreSQL's own parallel plans share), NULL over no rows; an ungrouped query over no rows returns one row; a
//! difference or product past `int8` an ERROR 22003. `pg_uvm_share.enable_cache = off` (no
//! cache read) or `pg_uvm_share.enable_gpugroupagg = off` keep the planner from offering the
//! node.
//!
//! # Over the heap
//!
//! Where no member of the level has a ready cache holding what the level reads of it and
//! `pg_uvm_share.gpugroupagg_heap` allows it (off by default: see "Measured over the heap"
//! below; `auto`: under CUDA; `on`: any provider, for tests), the planner tries the members as the fact, largest first, with the columns a heap
//! batch can hold in place of a cache's ([`plan`]'s `heap_columns`: the fixed-width types whose
//! datum is the cache's word; not `numeric`, whose words are scaled, nor text, which would need
//! a dictionary per batch, so text and numeric columns of the fact decline), and not where the
//! query's own conditions on the fact sit beside a row-level security policy's or a security
//! barrier's (PostgreSQL tests those first, and the query's may raise an ERROR; the program has
//! an order of its own). The same rules apply otherwise, and the plan gets one more child, last: a serial scan of the fact whose
//! target is the program's columns in [`Shape::columns`]' order and whose conditions are
//! taken off (every one is the program's). The path is priced at that scan without its
//! conditions, [`DEFORM_FACTOR`] per row and column, and the dimensions, not at the program's
//! per-row cost, which a batch on the GPU hides behind the laying out of the next. The executor
//! (`run/program.rs`, `run_heap_program`) reads the scan's rows into blocks of the cache's
//! format ([`crate::cache::BlockBuilder`]; up to [`HEAP_BLOCK_ROWS`] rows, within `work_mem`
//! and [`HEAP_BATCH_BYTES`]), writes each to one of two temporary segments as a cache of one
//! block, and starts the program over it into the one group table, then fills the next block
//! while it runs: one scan in flight at a time, so that a table that fills grows and the
//! program resumes in that batch before the next one starts. `EXPLAIN` shows `Fact Heap`,
//! `Batch Columns` and `Program Filters`, and with `ANALYZE` `Read From: heap`, `Heap Rows`,
//! `Batches` and `Batching Time` (reading the rows, laying them out and writing the batches).
//!
//! In parallel (`parallel.rs`): where the fact has a partial scan, the planner also offers
//! `Gather` over the node with a `Parallel Seq Scan` of the fact as its last child, and as
//! the other children the fallback over the input's cheapest parallel-safe path and each
//! dimension's cheapest parallel-safe path (a dimension's cheapest may be a Gather of its own,
//! which no worker may run: with it the parallel plan would never be offered), priced with
//! the scan's and the laying out's shares per participant. Every participant reads its share
//! and lays it out; one of them, the runner (the leader, or worker 0 where the leader
//! does not run the plan: `parallel_leader_participation`), runs the program over its own
//! batches and every one the others hand it through the query's DSM and DSA area, into its one
//! group table, and returns the groups; the others return no row. No group table is merged and
//! no partial state is kept, and only the runner touches the GPU (in process mode, no worker
//! starts a CUDA context). `EXPLAIN ANALYZE` adds `Batches From Workers`.
//!
//! Measured over the heap (SSB at SF 10, service mode, an H100, every answer PostgreSQL's):
//! at first (`bench/gpu-report-heap-groupagg-h100.md`) the node took 120 s for the 13 queries,
//! 5.1x PostgreSQL 15's parallel plans. Six queries, each with a selective dimension filter,
//! read the heap serially (13-18.6 s): that dimension's cheapest path was a Gather of its own,
//! which no worker may run, so no Gather over the node was offered. The plan in parallel now
//! takes each dimension's cheapest parallel-safe path. A slot's datums go into the block as
//! they are (`BlockBuilder::push_raw`), and the runner looks at the exchange every
//! `parallel::POLL_ROWS` rows of its own share, not once per block (the exchange holds 4
//! batches in flight: they could fill while it laid out one of its own, and up to 8 workers
//! then waited). After those (`bench/gpu-report-heap-groupagg-parallel-h100.md`): 27.9 s
//! for the 13, 1.09x PostgreSQL's 25.6 s in the same run, each query 1.8-2.3 s (0.62x-1.59x;
//! Q3.1, Q4.1 and Q4.3 faster than PostgreSQL). The serial form takes what a serial read of
//! the same columns takes (17.6 s against 18.4 s for Q1.1), the kernels a few ms of it: over
//! the heap the node is as fast as PostgreSQL's scan lets it be, which is why the issue's 3x
//! over the heap is out of reach for any plan that reads the heap through that scan
//! (`bench/probes/heap_floor.sql`).
//! [`DEFORM_FACTOR`] is the laying out's measured cost. With it the node's cost and
//! PostgreSQL's plans' are close, as their times are: at SSB SF 1 with 8 workers allowed (this
//! VM's planner, `gpugroupagg_heap = on`), the node's parallel plan costs 0.06 % less to 16 %
//! more than PostgreSQL's, and the planner keeps PostgreSQL's plan for all 13 (Q1.2 and Q1.3
//! within `add_path`'s 1 % fuzz). The queries the node runs faster on the GPU (Q4.3: 0.62x) are
//! those whose PostgreSQL plans take longer than their costs say; where the costs tie it may
//! take 1.3-1.4x (Q1.2, Q1.3). So `gpugroupagg_heap` stays off by default.
//!
//! # Limits (the next steps of issue 27)
//!
//! - Keys on float columns, float arithmetic, arithmetic of numerics, `sum(float4)`, `min`/`max` of
//!   text, an `OR` of tests of several columns one of which is text, a condition that is never
//!   true, an `OR` of `AND`s distributing into more than 16 clauses, more than
//!   `exec::scan::MAX_FILTERS` alternatives in all: declined for now.
//! - Each dimension's rows are gathered in the backend before its join table is built, and
//!   its distinct grouping values kept for the output, within `work_mem` ×
//!   `hash_mem_multiplier` for all the dimensions together (past it the node reads its child:
//!   `run/dims.rs`). From a cache, the dimension's (key, values) groups are read back and
//!   inserted by the backend: a kernel building the join table in place is the next step. The
//!   group table in its segment grows without limit but memory; the backend reads it back a
//!   window at a time (a quarter of `work_mem`), and holds the appended rows' groups whole.
//! - Over the heap, each participant reads its rows through PostgreSQL's scan and its
//!   projection (the program's columns, in order), then lays them out. A scan with the table's
//!   own target list would spare the projection (the slot's attributes read by number);
//!   reading pages as they are and laying out their tuples in bulk (PG-Strom's block format)
//!   would spare the executor's per-tuple steps. Neither reaches the issue's 3x: PostgreSQL's
//!   bare parallel `count(*)` of `lineorder` takes more than a third of its plans' time for 12
//!   of the 13 queries, and PG-Strom 6.1, which reads pages so, ran SSB at SF 10 only 1.33x
//!   faster than PostgreSQL (21.0 s against 28.0 s on the H200: the issue's figures).
//!
//! # Cost
//!
//! [`SETUP_COST`], and per row of the fact [`ROW_FACTOR`] x `cpu_operator_cost` for each
//! column the program reads and each join, plus `cpu_tuple_cost` per group; each dimension's
//! plan at its own cost (a dimension with a program over its cache: that program's, as the
//! fact's) and `cpu_tuple_cost` per row it hands over: a column's word costs a
//! fraction of what a heap tuple costs PostgreSQL. Issue 27's sweep (`auto` within 1.25x of the
//! faster plan; the GPU suite's step "GpuGroupAgg planner sweep": a cached fact of 20 K to 50 M
//! rows, 10 groups, a group per 10 rows, a filter with `avg` and `max`, a star join) found the
//! node the faster plan at all 20 points in both modes on an H100, 1.8x to 211x, and the
//! defaults picking it at each (`bench/gpu-report-groupagg-sweep-h100.md`, `-process-h100.md`):
//! the constants need only keep it below PostgreSQL's plans there, which they do by 2.3x to 12x.
//! Not measured: facts under 20 K rows, where the node's start-up (about 1 ms) can lose and
//! [`SETUP_COST`] hands small tables to PostgreSQL, and the H200.

mod clauses;
mod parallel;
mod plan;
mod run;
mod values;

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::PgList;

use super::agg::{self, Arg, Kind, Out, Value};
use super::cleanup;
use super::gpujoin;
use crate::cache::dict::Dict;
use crate::cache::Encoding;
use crate::caches;
use crate::customscan::{self, JoinScan, Methods};
use crate::error::{Code, Result, UvmError};
use crate::exec::{self, scan::Spec, SegRef};
use crate::gpujoin::table::KeyType;
use crate::groups::{self, AggKind};
use crate::registry::TierPref;
use crate::runtime::{current_user, now, report, try_executor};
use crate::scan::expr::{Cmp, Compare, Op, Step, Width};
use crate::scan::{Filter, Input, Program, Progress, Row, Source, Test};

/// Setting up a program: the requests, a group table.
pub const SETUP_COST: f64 = 100.0;
/// Per row and column read, in `cpu_operator_cost`.
pub const ROW_FACTOR: f64 = 0.25;
/// Per row and column laid out from a heap tuple into a batch, in `cpu_operator_cost`: measured
/// (87afde6, this 2-core VM, PostgreSQL 15) at about 10 ns a value over the scan's own time
/// (3 M rows of 4 columns laid out in 125 ms), where one unit of PostgreSQL's costs took about
/// 4.2 µs of its serial scan (so `cpu_operator_cost`, 0.0025, about 10 ns).
pub const DEFORM_FACTOR: f64 = 1.0;
/// Rows of a heap batch at most (a block of the cache's format; fewer where the columns are
/// wide: `run::heap_block_rows`).
const HEAP_BLOCK_ROWS: u64 = 1 << 20;
/// Bytes of a heap batch's block at most (and at most `work_mem`): two such segments are
/// written and scanned in turn, and one block is built in the backend.
const HEAP_BATCH_BYTES: u64 = 32 << 20;
/// The group table's first size, in groups: the planner's estimate within these bounds (it
/// grows as needed; an estimate far too high must not allocate a huge table at once).
const MIN_GROUPS: u64 = 64;
const MAX_FIRST_GROUPS: u64 = 1 << 20;
/// A cached dimension's distinct grouping tuples its first table is sized for at most (its
/// table grows past them): few in a star query (years, nations, brands).
const FIRST_TUPLES: u64 = 1024;

pub(super) use plan::add_path;
pub use run::GpuGroupAggScan;

static METHODS: Methods = customscan::methods::<GpuGroupAggScan>();

/// Registers the scan methods (the planner reaches [`add_path`] through `super`'s upper-paths
/// hook).
pub fn install() {
    customscan::register::<GpuGroupAggScan>();
}

/// A cached column: its attribute number, the encoding the plan expects of its cache, and for
/// `numeric` its scale (the words are the values times 10^scale; 0 for the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Col {
    attnum: i16,
    encoding: Encoding,
    scale: i16,
}

impl Col {
    fn new(attnum: i16, encoding: Encoding) -> Col {
        Col { attnum, encoding, scale: 0 }
    }
}

/// A test of a fact column in a `WHERE` clause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// `lo <= word <= hi` (inclusive; `IS NOT NULL` is the whole range).
    Range { lo: i64, hi: i64 },
    /// `IS NULL`.
    Null,
    /// Text condition `n` of the plan's (`Shape::texts`): a condition on one dictionary-encoded
    /// column, evaluated by PostgreSQL once per distinct string of the dictionary.
    Text(usize),
    /// Comparison `n` of the plan's (`Shape::compares`): integer expressions over columns.
    Compare(usize),
}

/// A comparison of integer expressions (`crate::scan::expr`) whose steps name columns by their
/// index in `cols`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PlanCompare {
    cols: Vec<Col>,
    expr: Compare,
}

/// One alternative of a `WHERE` clause: a test of one fact column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Atom {
    col: Col,
    check: Check,
}

/// What an aggregate reads of a row: nothing (`count(*)`), a column, or the difference or
/// product of two (`int8` arithmetic, as PostgreSQL's `int8mi`/`int8mul` and their mixed-width
/// forms, an overflow an ERROR 22003 in both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AggInput {
    Star,
    Col(Col),
    Sub(Col, Col),
    Mul(Col, Col),
}

impl AggInput {
    fn columns(&self) -> Vec<Col> {
        match *self {
            AggInput::Star => vec![],
            AggInput::Col(c) => vec![c],
            AggInput::Sub(a, b) | AggInput::Mul(a, b) => vec![a, b],
        }
    }
}

/// The numbers an aggregate reads: integers (its `Arg` says which), or floats (its `Arg` is
/// `Any`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    Int,
    Float4,
    Float8,
    /// `numeric(p, s)` columns, as their scaled words (`Arg::Any`).
    Numeric,
}

/// An aggregate: what it computes, over what. `avg` is a `Sum` divided by its count
/// (integers: `numeric_div`, as PostgreSQL's `int8_avg` and `numeric_avg` finish; floats: a
/// `float8` division, as `float8_avg`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AggOf {
    kind: Kind,
    arg: Arg,
    input: AggInput,
    avg: bool,
    num: Num,
}

/// A grouping column: a cached column of the fact table, or grouping column `idx` of
/// dimension `dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Fact(Col),
    Dim { dim: usize, idx: usize },
}

/// A column of a dimension the query groups by (its values are taken from the dimension's
/// rows, not from a cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DimCol {
    attnum: i16,
    /// Its place in the rows of the dimension's plan.
    pos: usize,
    typid: pg_sys::Oid,
    typmod: i32,
    collation: pg_sys::Oid,
}

/// A dimension: a table joined to the fact by one equality of integer-like columns, whose rows
/// (those that pass its own conditions, a plan of its own) the executor drains into a join
/// table: its key, and as payload the index of its distinct grouping values.
#[derive(Clone, Debug, PartialEq)]
struct Dim {
    relid: pg_sys::Oid,
    varno: u32,
    /// The fact's column it joins on.
    fact_col: Col,
    /// Its key column: attribute number, type, and place in the rows of its plan.
    key: (i16, pg_sys::Oid),
    key_pos: usize,
    groups: Vec<DimCol>,
    /// Its program over its own cache, where one can stand in for its plan.
    cached: Option<DimCache>,
}

/// A dimension's rows as a program over its cache: the rows that pass `filters` (its own
/// conditions, as the fact's, over its cached columns; comparisons by their index in
/// `compares`, text conditions in the plan's `Shape::texts`), their key and grouping columns
/// (`groups` in `Dim::groups`' order) read from the cache.
#[derive(Clone, Debug, PartialEq)]
struct DimCache {
    key: Col,
    groups: Vec<Col>,
    filters: Vec<Vec<Atom>>,
    compares: Vec<PlanCompare>,
}

impl DimCache {
    /// The dimension's columns its program reads (each once).
    fn columns(&self) -> Vec<Col> {
        let mut out: Vec<Col> = Vec::new();
        let all = std::iter::once(self.key)
            .chain(self.groups.iter().copied())
            .chain(self.filters.iter().flatten().map(|a| a.col))
            .chain(self.compares.iter().flat_map(|c| c.cols.iter().copied()));
        for c in all {
            if !out.contains(&c) {
                out.push(c);
            }
        }
        out
    }
}

/// What the node computes: the plan's private data.
#[derive(Clone, Debug, PartialEq)]
struct Shape {
    /// The fact table: its OID and range table index.
    relid: pg_sys::Oid,
    varno: u32,
    keys: Vec<Key>,
    /// The fact's `WHERE` as a conjunction of clauses, each a disjunction of atoms.
    filters: Vec<Vec<Atom>>,
    /// The text conditions `Check::Text` names: expressions over one column of the fact (its
    /// Vars as the planner made them), kept in the plan's private list.
    texts: Vec<*mut pg_sys::Node>,
    compares: Vec<PlanCompare>,
    aggs: Vec<AggOf>,
    dims: Vec<Dim>,
    /// The planner's estimate of the groups (the group table's first size).
    groups: u64,
    /// Whether the fact's rows come from its heap (the node's last child, a scan of the fact
    /// without its conditions, whose rows the node lays out in column batches of the cache's
    /// format: [`HEAP_BLOCK_ROWS`]), not from a column cache.
    heap: bool,
}

impl Shape {
    /// The (range table index, attribute number) of grouping column `k`.
    fn key_column(&self, k: &Key) -> (u32, i16) {
        match *k {
            Key::Fact(c) => (self.varno, c.attnum),
            Key::Dim { dim, idx } => (self.dims[dim].varno, self.dims[dim].groups[idx].attnum),
        }
    }

    /// The fact's columns the program reads (each once).
    fn columns(&self) -> Vec<Col> {
        let mut out: Vec<Col> = Vec::new();
        let keys = self.keys.iter().filter_map(|k| if let Key::Fact(c) = k { Some(*c) } else { None });
        let all = keys
            .chain(self.filters.iter().flatten().map(|a| a.col))
            .chain(self.compares.iter().flat_map(|c| c.cols.iter().copied()))
            .chain(self.aggs.iter().flat_map(|a| a.input.columns()))
            .chain(self.dims.iter().map(|d| d.fact_col));
        for c in all {
            if !out.contains(&c) {
                out.push(c);
            }
        }
        out
    }

    /// The plan's private list: a list of int8 constants, then the list of text conditions.
    fn to_private(&self) -> *mut pg_sys::List {
        let mut v: Vec<i64> = vec![u32::from(self.relid) as i64, i64::from(self.varno), self.groups as i64, i64::from(self.heap)];
        let col = put_col;
        v.push(self.keys.len() as i64);
        for k in &self.keys {
            match k {
                Key::Fact(c) => {
                    v.push(0);
                    col(&mut v, c);
                }
                Key::Dim { dim, idx } => v.extend([1, *dim as i64, *idx as i64]),
            }
        }
        put_clauses(&mut v, &self.filters, &self.compares);
        v.push(self.aggs.len() as i64);
        for a in &self.aggs {
            let num = match a.num {
                Num::Int => 0,
                Num::Float4 => 1,
                Num::Float8 => 2,
                Num::Numeric => 3,
            };
            v.push(kind_code(a.kind, a.arg) + if a.avg { AVG_CODE } else { 0 } + num * NUM_CODE);
            let (which, cols) = match a.input {
                AggInput::Star => (0, vec![]),
                AggInput::Col(c) => (1, vec![c]),
                AggInput::Sub(x, y) => (2, vec![x, y]),
                AggInput::Mul(x, y) => (3, vec![x, y]),
            };
            v.push(which);
            for c in &cols {
                col(&mut v, c);
            }
        }
        v.push(self.dims.len() as i64);
        for d in &self.dims {
            v.extend([u32::from(d.relid) as i64, i64::from(d.varno)]);
            col(&mut v, &d.fact_col);
            v.extend([d.key.0 as i64, u32::from(d.key.1) as i64, d.key_pos as i64, d.groups.len() as i64]);
            for g in &d.groups {
                v.extend([
                    g.attnum as i64,
                    g.pos as i64,
                    u32::from(g.typid) as i64,
                    g.typmod as i64,
                    u32::from(g.collation) as i64,
                ]);
            }
            match &d.cached {
                None => v.push(0),
                Some(dc) => {
                    v.push(1);
                    col(&mut v, &dc.key);
                    for g in &dc.groups {
                        col(&mut v, g);
                    }
                    put_clauses(&mut v, &dc.filters, &dc.compares);
                }
            }
        }
        let mut ints = PgList::<pg_sys::Node>::new();
        for x in v {
            ints.push(gpujoin::int_node(x));
        }
        let mut texts = PgList::<pg_sys::Node>::new();
        for &t in &self.texts {
            texts.push(t);
        }
        let mut l = PgList::<pg_sys::Node>::new();
        l.push(ints.into_pg() as *mut pg_sys::Node);
        l.push(texts.into_pg() as *mut pg_sys::Node);
        l.into_pg()
    }

    /// The plan's private list read back (`None`: not a list this module wrote).
    ///
    /// # Safety
    /// `list` is what [`Shape::to_private`] made (or a copy of it).
    unsafe fn from_private(list: *mut pg_sys::List) -> Option<Shape> {
        // SAFETY: forwarded contract.
        let (v, texts): (Vec<i64>, Vec<*mut pg_sys::Node>) = unsafe {
            let outer = PgList::<pg_sys::Node>::from_pg(list);
            let ints = PgList::<pg_sys::Node>::from_pg(outer.get_ptr(0)? as *mut pg_sys::List);
            let texts = PgList::<pg_sys::Node>::from_pg(outer.get_ptr(1)? as *mut pg_sys::List);
            (
                ints.iter_ptr().map(|n| (*(n as *mut pg_sys::Const)).constvalue.value() as i64).collect(),
                texts.iter_ptr().collect(),
            )
        };
        let mut it = v.into_iter();
        let mut next = || it.next();
        let col = get_col;
        let oid = |x: i64| u32::try_from(x).ok().map(pg_sys::Oid::from);
        let relid = oid(next()?)?;
        let varno = u32::try_from(next()?).ok()?;
        let groups = u64::try_from(next()?).ok()?;
        let heap = next()? != 0;
        let mut keys = Vec::new();
        for _ in 0..next()? {
            keys.push(match next()? {
                0 => Key::Fact(col(&mut next)?),
                _ => Key::Dim { dim: usize::try_from(next()?).ok()?, idx: usize::try_from(next()?).ok()? },
            });
        }
        let (filters, compares) = get_clauses(&mut next, texts.len())?;
        let mut aggs = Vec::new();
        for _ in 0..next()? {
            let code = next()?;
            let num = match code / NUM_CODE {
                0 => Num::Int,
                1 => Num::Float4,
                2 => Num::Float8,
                3 => Num::Numeric,
                _ => return None,
            };
            let avg = code % NUM_CODE >= AVG_CODE;
            let (kind, arg) = kind_of(code % AVG_CODE)?;
            let input = match next()? {
                0 => AggInput::Star,
                1 => AggInput::Col(col(&mut next)?),
                2 => AggInput::Sub(col(&mut next)?, col(&mut next)?),
                3 => AggInput::Mul(col(&mut next)?, col(&mut next)?),
                _ => return None,
            };
            aggs.push(AggOf { kind, arg, input, avg, num });
        }
        let mut dims = Vec::new();
        for _ in 0..next()? {
            let (relid, varno) = (oid(next()?)?, u32::try_from(next()?).ok()?);
            let fact_col = col(&mut next)?;
            let key = (i16::try_from(next()?).ok()?, oid(next()?)?);
            let key_pos = usize::try_from(next()?).ok()?;
            let mut groups = Vec::new();
            for _ in 0..next()? {
                let attnum = i16::try_from(next()?).ok()?;
                let pos = usize::try_from(next()?).ok()?;
                let typid = oid(next()?)?;
                let typmod = i32::try_from(next()?).ok()?;
                groups.push(DimCol { attnum, pos, typid, typmod, collation: oid(next()?)? });
            }
            let cached = match next()? {
                0 => None,
                _ => {
                    let key = col(&mut next)?;
                    let mut cols = Vec::new();
                    for _ in 0..groups.len() {
                        cols.push(col(&mut next)?);
                    }
                    let (filters, compares) = get_clauses(&mut next, texts.len())?;
                    Some(DimCache { key, groups: cols, filters, compares })
                }
            };
            dims.push(Dim { relid, varno, fact_col, key, key_pos, groups, cached });
        }
        Some(Shape { relid, varno, keys, filters, texts, compares, aggs, dims, groups, heap })
    }
}

/// A column as the plan's private list holds it: attribute number, encoding, scale.
fn put_col(v: &mut Vec<i64>, c: &Col) {
    v.extend([c.attnum as i64, c.encoding as u16 as i64, c.scale as i64]);
}

/// A column [`put_col`] wrote.
fn get_col(next: &mut dyn FnMut() -> Option<i64>) -> Option<Col> {
    let attnum = i16::try_from(next()?).ok()?;
    let encoding = Encoding::from_repr(u16::try_from(next()?).ok()?)?;
    let scale = i16::try_from(next()?).ok()?;
    Some(Col { attnum, encoding, scale })
}

/// A `WHERE` as the plan's private list holds it: its clauses of atoms, then the comparisons
/// they name.
fn put_clauses(v: &mut Vec<i64>, filters: &[Vec<Atom>], compares: &[PlanCompare]) {
    v.push(filters.len() as i64);
    for clause in filters {
        v.push(clause.len() as i64);
        for a in clause {
            put_col(v, &a.col);
            match a.check {
                Check::Range { lo, hi } => v.extend([1, lo, hi]),
                Check::Null => v.extend([2, 0, 0]),
                Check::Text(n) => v.extend([3, n as i64, 0]),
                Check::Compare(n) => v.extend([4, n as i64, 0]),
            }
        }
    }
    v.push(compares.len() as i64);
    for c in compares {
        v.push(c.cols.len() as i64);
        for x in &c.cols {
            put_col(v, x);
        }
        v.extend([i64::from(c.expr.cmp.code()), c.expr.lhs.len() as i64, c.expr.rhs.len() as i64]);
        for s in c.expr.lhs.iter().chain(&c.expr.rhs) {
            v.extend(match *s {
                Step::Col(i) => [1, i as i64, 0],
                Step::Const(k) => [2, k, 0],
                Step::Bin(op, w) => [3, op as i64, i64::from(w.code())],
                Step::Neg(w) => [4, 0, i64::from(w.code())],
            });
        }
    }
}

/// A `WHERE` [`put_clauses`] wrote, its text conditions among `ntexts` (`None`: not one, or
/// naming a condition or comparison the plan lacks).
fn get_clauses(next: &mut dyn FnMut() -> Option<i64>, ntexts: usize) -> Option<(Vec<Vec<Atom>>, Vec<PlanCompare>)> {
    let mut filters = Vec::new();
    for _ in 0..next()? {
        let mut clause = Vec::new();
        for _ in 0..next()? {
            let c = get_col(next)?;
            let check = match (next()?, next()?, next()?) {
                (1, lo, hi) => Check::Range { lo, hi },
                (2, _, _) => Check::Null,
                (3, n, _) => Check::Text(usize::try_from(n).ok().filter(|&n| n < ntexts)?),
                (4, n, _) => Check::Compare(usize::try_from(n).ok()?),
                _ => return None,
            };
            clause.push(Atom { col: c, check });
        }
        filters.push(clause);
    }
    let mut compares = Vec::new();
    for _ in 0..next()? {
        let mut cols = Vec::new();
        for _ in 0..next()? {
            cols.push(get_col(next)?);
        }
        let cmp = Cmp::from_code(u32::try_from(next()?).ok()?)?;
        let (nl, nr) = (usize::try_from(next()?).ok()?, usize::try_from(next()?).ok()?);
        let mut steps = Vec::new();
        for _ in 0..nl.checked_add(nr)?.min(2 * crate::scan::expr::MAX_STEPS) {
            let width = |w: i64| Width::from_code(u32::try_from(w).ok()?);
            let ops = [Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Mod];
            steps.push(match (next()?, next()?, next()?) {
                (1, i, _) => Step::Col(usize::try_from(i).ok().filter(|&i| i < cols.len())?),
                (2, k, _) => Step::Const(k),
                (3, op, w) => Step::Bin(*ops.get(usize::try_from(op).ok()?)?, width(w)?),
                (4, _, w) => Step::Neg(width(w)?),
                _ => return None,
            });
        }
        if steps.len() != nl + nr {
            return None;
        }
        let rhs = steps.split_off(nl);
        compares.push(PlanCompare { cols, expr: Compare { lhs: steps, cmp, rhs } });
    }
    if filters.iter().flatten().any(|a| matches!(a.check, Check::Compare(n) if n >= compares.len())) {
        return None;
    }
    Some((filters, compares))
}

/// The encodings a grouping column or a range may have: words whose equality and order are the
/// values'.
fn keyable(e: Encoding) -> bool {
    matches!(
        e,
        Encoding::Bool
            | Encoding::Int2
            | Encoding::Int4
            | Encoding::Int8
            | Encoding::Date
            | Encoding::Timestamp
            | Encoding::TimestampTz
            | Encoding::Numeric
    )
}

/// The encoding a column of type `typid` has in a cache, for the types the node reads.
fn encoding_of_type(typid: pg_sys::Oid) -> Option<Encoding> {
    Some(match typid {
        pg_sys::BOOLOID => Encoding::Bool,
        pg_sys::INT2OID => Encoding::Int2,
        pg_sys::INT4OID => Encoding::Int4,
        pg_sys::INT8OID => Encoding::Int8,
        pg_sys::DATEOID => Encoding::Date,
        pg_sys::TIMESTAMPOID => Encoding::Timestamp,
        pg_sys::TIMESTAMPTZOID => Encoding::TimestampTz,
        pg_sys::NUMERICOID => Encoding::Numeric,
        _ => return None,
    })
}

/// The scale of a `numeric(p, s)` column of typmod `typmod` as the cache encodes it (`None`
/// without a precision, which the cache does not hold).
fn numeric_scale(typmod: i32) -> Option<i16> {
    let vh = pg_sys::VARHDRSZ as i32;
    // the scale's 11 bits, sign-extended (PostgreSQL 15 allows negative scales)
    (typmod >= vh).then(|| ((((typmod - vh) & 0x7ff) ^ 1024) - 1024) as i16).filter(|s| (0..=18).contains(s))
}

/// `v / 10^scale` as a `numeric` of that display scale (what a `numeric(p, scale)` column
/// holds: its sums, minimums and maximums print with `scale` digits, as PostgreSQL's do),
/// made in the current memory context.
fn numeric_of_scaled(v: i128, scale: i16) -> pg_sys::Datum {
    let digits = v.unsigned_abs().to_string();
    let s = scale.max(0) as usize;
    let padded = format!("{digits:0>width$}", width = s + 1);
    let (int, frac) = padded.split_at(padded.len() - s);
    let text = format!("{}{int}{}{frac}", if v < 0 { "-" } else { "" }, if s > 0 { "." } else { "" });
    let c = std::ffi::CString::new(text).expect("digits");
    // SAFETY: numeric_in of a decimal literal, typmod -1 (its scale is its digits').
    unsafe { pg_sys::InputFunctionCall(&mut numeric_input(), c.as_ptr() as *mut std::ffi::c_char, pg_sys::Oid::from(0), -1) }
}

/// The FmgrInfo of numeric_in.
fn numeric_input() -> pg_sys::FmgrInfo {
    // SAFETY: looks up a built-in function's call info into a zeroed struct (current context).
    unsafe {
        let mut f: pg_sys::FmgrInfo = std::mem::zeroed();
        pg_sys::fmgr_info(pg_sys::Oid::from(pg_sys::F_NUMERIC_IN), &mut f);
        f
    }
}

/// A word of column `c` as a datum (by value, or a numeric made in the current context).
fn datum_of_word(w: u64, c: Col) -> pg_sys::Datum {
    match c.encoding {
        Encoding::Bool => pg_sys::Datum::from(w != 0),
        Encoding::Int2 => pg_sys::Datum::from(w as i64 as i16),
        Encoding::Int4 | Encoding::Date => pg_sys::Datum::from(w as i64 as i32),
        Encoding::Numeric => numeric_of_scaled(i128::from(w as i64), c.scale),
        _ => pg_sys::Datum::from(w as i64),
    }
}

/// Added to an aggregate's code for `avg`, and times its `Num` (0 to 3).
const AVG_CODE: i64 = 100;
const NUM_CODE: i64 = 1000;
const KINDS: [Kind; 5] = [Kind::CountStar, Kind::Count, Kind::Sum, Kind::Min, Kind::Max];
const ARGS: [Arg; 4] = [Arg::Any, Arg::Int2, Arg::Int4, Arg::Int8];

fn kind_code(kind: Kind, arg: Arg) -> i64 {
    let k = KINDS.iter().position(|&x| x == kind).unwrap_or(0);
    let a = ARGS.iter().position(|&x| x == arg).unwrap_or(0);
    (k * 8 + a) as i64
}

fn kind_of(code: i64) -> Option<(Kind, Arg)> {
    let code = usize::try_from(code).ok()?;
    Some((*KINDS.get(code / 8)?, *ARGS.get(code % 8)?))
}
