//! Scan programs: filters, star joins and grouped aggregates over a columnar cache in one pass,
//! the CPU reference of the kernels that will run them (issue 27, points 1 to 3).
//!
//! # What a program is
//!
//! A [`Program`] reads a fact table's cache ([`crate::cache`]) block by block and, for each row:
//!
//! 1. tests its [`Filter`]s, each on one cached column: an inclusive range of the column's
//!    integer-like words, a set of dictionary codes (a text predicate PostgreSQL evaluated
//!    per distinct string: `cache::dict::Dict::select`), or `IS NULL`; or a comparison of
//!    integer expressions over several columns ([`expr`]: `a + b < 5`). A NULL passes no other
//!    test, as a comparison with NULL is not true in SQL. The filters form a conjunction of
//!    clauses, each a disjunction of consecutive filters (a filter marked `or` belongs to the
//!    clause of the one before it): `x IN (1, 5) AND (y < 0 OR z IS NULL)` is four filters in
//!    two clauses. Any condition in negation normal form over single columns is such a
//!    conjunction, and evaluating its tests as false on NULL gives SQL's answer, true or not:
//!    with no `NOT` left, the three-valued result is true exactly where the two-valued one is;
//! 2. probes each [`Join`]'s dimension table (a GpuJoin table, `crate::gpujoin::table`, built
//!    from the dimension's rows that pass the dimension's own filters, its payload the value the
//!    query groups by or 0): a row without a match is dropped (an inner join), a row with
//!    several goes on once per match;
//! 3. folds what is left into the group table ([`crate::groups`]) under its key: words taken
//!    from fact columns or join payloads ([`Source`]), plus a last word with a bit per source
//!    that was NULL (NULL is a group of its own), with one input per aggregate ([`Input`]: a
//!    column, or the difference or product of two, computed as PostgreSQL's `int8` arithmetic,
//!    an overflow an ERROR 22003).
//!
//! Nothing is materialised between the steps: that is the point of running a star join in one
//! pass (Crystal's model, `../shared/notes/prior-art.md`). The SQL side (the plan node) decides
//! which queries a program can express and declines the others, so that PostgreSQL runs them.
//!
//! # A dimension's join table from its cache
//!
//! The dimensions' tables themselves can come from programs too ([`build`], `ScanBuild`): a
//! program of no joins over a dimension's cache, grouped by its grouping columns with a count,
//! gives a small table of a slot per distinct tuple; then [`build`] runs the same filters
//! again and inserts a pair per row that passes into the dimension's join table, its payload
//! the slot of the row's tuple. So a star join's dimensions are built where their caches lie,
//! and the fact's program groups by those slots.
//!
//! # Bounded, resumable
//!
//! Every loop is bounded by the cache's blocks and their validated counts, and by the
//! dimension tables' slots; interrupts are checked every [`interrupt::EVERY`] rows. Before a
//! row touches the group table, [`run`] makes sure the table has room for every group the row
//! could add (one per combination of its joins' matches); where it has not, it stops there and
//! answers [`Progress::Full`] with the row to resume at and the slots the table needs: the
//! caller grows the table (`groups::grow`) and runs again from that row, and no row is folded
//! twice or lost.

pub mod expr;
pub mod floats;
// kernel launches over pinned segments' device addresses, and copies from them.
#[allow(unsafe_code)]
pub mod gpu;
#[cfg(test)]
mod tests;

use crate::cache::Layout;
use crate::error::{Code, Result, UvmError};
use crate::gpujoin::table::Table as DimTable;
use crate::groups::{self, AggKind, Update};
use crate::interrupt;

/// A test on one cached column of the fact table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Test {
    /// `lo <= value <= hi`, on the column's word as a signed integer.
    Range { lo: i64, hi: i64 },
    /// The value is a dictionary code whose bit is set in the bitmap (bit `c % 8` of byte
    /// `c / 8`; a code past the bitmap fails).
    Codes(Vec<u8>),
    /// The value is NULL (the one test a NULL passes).
    Null,
    /// A comparison of integer expressions over the row's columns ([`expr`]; the filter's own
    /// column is the first it reads). Its arithmetic may raise PostgreSQL's errors (22003,
    /// 22012).
    Compare(expr::Compare),
}

/// A test of one column, in a clause of its own or (`or`) in the clause of the filter before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    pub col: usize,
    pub test: Test,
    /// Whether this filter is an alternative of the one before it (the same clause).
    pub or: bool,
}

impl Filter {
    /// A filter that starts a clause.
    pub fn and(col: usize, test: Test) -> Filter {
        Filter { col, test, or: false }
    }

    /// A filter in the clause of the one before it.
    pub fn or(col: usize, test: Test) -> Filter {
        Filter { col, test, or: true }
    }
}

/// A star join: the fact column `col` probed against a dimension's table.
pub struct Join<'a> {
    pub col: usize,
    pub table: DimTable<'a>,
}

/// Where a group key word comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A fact column's word (NULL: 0, and its bit set in the key's last word).
    Col(usize),
    /// The payload of join `j`'s match.
    Payload(usize),
}

/// An aggregate's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// None: `count(*)`.
    Star,
    Col(usize),
    /// `a - b`, `a * b` of two integer-like columns, as `int8` arithmetic (NULL if either is).
    Sub(usize, usize),
    Mul(usize, usize),
    /// A `float4` column's value widened to a `float8`'s bits (what the float states take).
    Float4(usize),
}

impl Input {
    /// Its number and columns as a request's bytes and the kernels' words carry it: 0 none,
    /// 1 a column, 2 a difference, 3 a product, 4 a `float4` column widened (unused columns 0).
    pub fn code(self) -> (u16, usize, usize) {
        match self {
            Input::Star => (0, 0, 0),
            Input::Col(c) => (1, c, 0),
            Input::Sub(a, b) => (2, a, b),
            Input::Mul(a, b) => (3, a, b),
            Input::Float4(c) => (4, c, 0),
        }
    }

    /// The input of [`Input::code`]'s number and columns; `None` for an unknown number.
    pub fn of_code(kind: u16, a: usize, b: usize) -> Option<Input> {
        Some(match kind {
            0 => Input::Star,
            1 => Input::Col(a),
            2 => Input::Sub(a, b),
            3 => Input::Mul(a, b),
            4 => Input::Float4(a),
            _ => return None,
        })
    }
}

pub struct Program<'a> {
    pub filters: Vec<Filter>,
    pub joins: Vec<Join<'a>>,
    pub keys: Vec<Source>,
    pub aggs: Vec<(AggKind, Input)>,
}

/// Where [`run`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Every row from the start position on was folded.
    Done,
    /// The group table needs `slots` slots before row `row` of block `block` (and the rows
    /// after it) can be folded: grow it and run again from there.
    Full { block: u64, row: u64, slots: u64 },
}

fn bad(why: String) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, why)
}

impl Program<'_> {
    /// The group table's key words for this program: one per source and the NULL bits.
    pub fn key_words(&self) -> u16 {
        self.keys.len() as u16 + 1
    }

    fn check(&self, layout: &Layout) -> Result<()> {
        let join_cols: Vec<usize> = self.joins.iter().map(|j| j.col).collect();
        check_parts(layout, &self.filters, &join_cols, &self.keys, &self.aggs)
    }
}

/// Checks a program's parts against the cache `layout` (every column one of its columns, every
/// payload key one of the joins', at most 63 keys): 22023 otherwise. The CPU's [`run`] and
/// the kernels' host side ([`gpu`]) both check this way before reading a row.
pub fn check_parts(
    layout: &Layout,
    filters: &[Filter],
    join_cols: &[usize],
    keys: &[Source],
    aggs: &[(AggKind, Input)],
) -> Result<()> {
    let cols = layout.columns().len();
    let col_ok = |c: usize| c < cols;
    if filters.first().is_some_and(|f| f.or) {
        return Err(bad("the first filter is an alternative of none".into()));
    }
    for f in filters {
        if !col_ok(f.col) {
            return Err(bad(format!("a filter on column {} of a cache of {cols}", f.col)));
        }
        if let Test::Compare(c) = &f.test {
            c.check()?;
            if let Some(x) = c.columns().find(|&x| !col_ok(x)) {
                return Err(bad(format!("a comparison of column {x} of a cache of {cols}")));
            }
        }
    }
    if let Some(&c) = join_cols.iter().find(|&&c| !col_ok(c)) {
        return Err(bad(format!("a join on column {c} of a cache of {cols}")));
    }
    for s in keys {
        match *s {
            Source::Col(c) if !col_ok(c) => return Err(bad(format!("a group key from column {c} of a cache of {cols}"))),
            Source::Payload(j) if j >= join_cols.len() => {
                return Err(bad(format!("a group key from join {j} of {}", join_cols.len())))
            }
            _ => {}
        }
    }
    for (_, i) in aggs {
        let used = match *i {
            Input::Star => vec![],
            Input::Col(c) | Input::Float4(c) => vec![c],
            Input::Sub(a, b) | Input::Mul(a, b) => vec![a, b],
        };
        if let Some(c) = used.into_iter().find(|&c| !col_ok(c)) {
            return Err(bad(format!("an aggregate of column {c} of a cache of {cols}")));
        }
    }
    if keys.len() >= 64 {
        return Err(bad(format!("{} group keys: at most 63", keys.len())));
    }
    Ok(())
}

/// The word of column `col` at row `r` of a block holding `rows` rows, `None` for NULL.
fn value(layout: &Layout, seg: &[u8], col: usize, block: u64, rows: u64, r: u64) -> Result<Option<u64>> {
    layout.get(seg, col, block, rows, r).ok_or_else(|| bad(format!("the cache's bytes end inside block {block}")))
}

/// Whether the row passes `f` (its columns' words from `col`).
fn filter_passes(f: &Filter, col: &mut dyn FnMut(usize) -> Result<Option<u64>>) -> Result<bool> {
    match &f.test {
        Test::Compare(c) => c.passes(col),
        t => Ok(passes(t, col(f.col)?)),
    }
}

fn passes(test: &Test, v: Option<u64>) -> bool {
    match (test, v) {
        (Test::Null, v) => v.is_none(),
        (Test::Compare(_), _) | (_, None) => false,
        (Test::Range { lo, hi }, Some(w)) => (*lo..=*hi).contains(&(w as i64)),
        (Test::Codes(bits), Some(c)) => {
            usize::try_from(c / 8).ok().and_then(|i| bits.get(i)).is_some_and(|b| b & (1 << (c % 8)) != 0)
        }
    }
}

/// Whether the row passes `filters`, clause by clause: it fails at the first clause none of
/// whose filters passes.
fn filters_pass(filters: &[Filter], col: &mut dyn FnMut(usize) -> Result<Option<u64>>) -> Result<bool> {
    let mut clause_passed = true;
    for f in filters {
        if !f.or {
            if !clause_passed {
                return Ok(false);
            }
            clause_passed = false;
        }
        if !clause_passed && filter_passes(f, col)? {
            clause_passed = true;
        }
    }
    Ok(clause_passed)
}

fn overflow(what: &str) -> UvmError {
    UvmError::new(Code::NumericValueOutOfRange, "bigint out of range").detail(format!("In {what} of two columns."))
}

/// One row of [`fold_row`]: dropped (a filter or a join), folded, or not folded because the
/// group table needs this many slots first (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Row {
    Dropped,
    Folded,
    Full(u64),
}

/// Buffers [`fold_row`] reuses from row to row.
#[derive(Default)]
pub struct Scratch {
    payloads: Vec<Vec<i64>>,
    key: Vec<u64>,
    inputs: Vec<Option<u64>>,
    at: Vec<usize>,
}

/// Folds one row, whose column words `col` answers (`None`: NULL), into `groups` by
/// `program`: the filters, the joins' matches, then every combination of them into the group
/// table, after making sure the table has room for them all. The step [`run`] takes per row of
/// the cache, and what a caller takes for a row kept elsewhere (an appended row of the tail).
pub fn fold_row(
    program: &Program<'_>,
    groups: &mut groups::Table<'_>,
    scratch: &mut Scratch,
    mut col: impl FnMut(usize) -> Result<Option<u64>>,
) -> Result<Row> {
    let Scratch { payloads, key, inputs, at } = scratch;
    payloads.resize_with(program.joins.len(), Vec::new);
    key.resize(program.keys.len() + 1, 0);
    inputs.resize(program.aggs.len(), None);
    if !filters_pass(&program.filters, &mut col)? {
        return Ok(Row::Dropped);
    }
    // Each join's matches (none: the row is dropped).
    let mut combos = 1u64;
    for (j, join) in program.joins.iter().enumerate() {
        payloads[j].clear();
        let Some(k) = col(join.col)? else { return Ok(Row::Dropped) };
        let p = &mut payloads[j];
        join.table.for_each_match(k as i64, |v| p.push(v))?;
        if p.is_empty() {
            return Ok(Row::Dropped);
        }
        combos = combos.saturating_mul(p.len() as u64);
    }
    // Room for every group the row could add, before it touches the table.
    let h = groups.header();
    if h.groups.saturating_add(combos) > h.slot_count / 2 {
        return Ok(Row::Full(groups::Shape::slots_for(h.groups.saturating_add(combos))));
    }
    for (a, (_, input)) in program.aggs.iter().enumerate() {
        inputs[a] = match *input {
            Input::Star => None,
            Input::Col(c) => col(c)?,
            Input::Float4(c) => col(c)?.map(|w| f64::from(f32::from_bits(w as u32)).to_bits()),
            Input::Sub(x, y) => match (col(x)?, col(y)?) {
                (Some(x), Some(y)) => Some((x as i64).checked_sub(y as i64).ok_or_else(|| overflow("a difference"))? as u64),
                _ => None,
            },
            Input::Mul(x, y) => match (col(x)?, col(y)?) {
                (Some(x), Some(y)) => Some((x as i64).checked_mul(y as i64).ok_or_else(|| overflow("a product"))? as u64),
                _ => None,
            },
        };
    }
    // Every combination of the joins' matches (an odometer over their payloads).
    at.clear();
    at.resize(program.joins.len(), 0);
    loop {
        let mut nulls = 0u64;
        for (i, s) in program.keys.iter().enumerate() {
            key[i] = match *s {
                Source::Payload(j) => payloads[j][at[j]] as u64,
                Source::Col(c) => match col(c)? {
                    Some(w) => w,
                    None => {
                        nulls |= 1 << i;
                        0
                    }
                },
            };
        }
        key[program.keys.len()] = nulls;
        if let Update::Full(_) = groups.update(key, inputs)? {
            return Err(bad("the group table filled up after its room was checked".into()));
        }
        // next combination
        let mut j = 0;
        loop {
            if j == at.len() {
                break;
            }
            at[j] += 1;
            if at[j] < payloads[j].len() {
                break;
            }
            at[j] = 0;
            j += 1;
        }
        if j == at.len() {
            return Ok(Row::Folded);
        }
    }
}

/// Checks that `groups` has `program`'s keys and aggregates (22023 otherwise).
pub fn check_table(program: &Program<'_>, groups: &groups::Table<'_>) -> Result<()> {
    let shape = groups.shape();
    if shape.key_words != program.key_words() || shape.aggs != program.aggs.iter().map(|a| a.0).collect::<Vec<_>>() {
        return Err(bad("the group table does not have the program's keys and aggregates".into()));
    }
    Ok(())
}

/// Runs `program` over the cache `layout` in `seg` (the segment's bytes from offset 0), from
/// row `start.1` of block `start.0` on, folding into `groups` (a table of
/// [`Program::key_words`] key words and the program's aggregates, in that order).
pub fn run(
    program: &Program<'_>,
    layout: &Layout,
    seg: &[u8],
    groups: &mut groups::Table<'_>,
    start: (u64, u64),
) -> Result<Progress> {
    program.check(layout)?;
    check_table(program, groups)?;
    let mut seen = 0u64;
    let mut scratch = Scratch::default();
    for block in start.0..layout.header().blocks {
        let rows = layout.block_rows(seg, block)?;
        let first = if block == start.0 { start.1 } else { 0 };
        for r in first..rows {
            interrupt::check_every(seen)?;
            seen += 1;
            if let Row::Full(slots) = fold_row(program, groups, &mut scratch, |c| value(layout, seg, c, block, rows, r))? {
                return Ok(Progress::Full { block, row: r, slots });
            }
        }
    }
    Ok(Progress::Done)
}

/// A dimension's join table from its cache (`ScanBuild`): a pair per row of the cache that
/// passes `program`'s filters and has a key in column `key_col`, inserted into `table` (an
/// `int8` GpuJoin table being built): the key, and as payload the index of the slot of the
/// row's group in `groups`, the table of the same program grouped by its keys (fact columns
/// only: a program without joins) that ran over the same rows before. So the pairs are the
/// dimension's rows that pass, each naming its distinct grouping values by a slot of a small
/// table, and the fact's program groups by those slots. A row whose group `groups` lacks, or
/// a row past `capacity`, is an ERROR (the table is not that program's). Returns the pairs
/// inserted.
pub fn build(
    program: &Program<'_>,
    key_col: usize,
    layout: &Layout,
    seg: &[u8],
    groups: &mut groups::Table<'_>,
    table: &mut crate::gpujoin::table::Builder<'_>,
    capacity: u64,
) -> Result<u64> {
    if !program.joins.is_empty() {
        return Err(bad("a dimension's build program has no joins".into()));
    }
    check_build(layout, &program.filters, &program.keys, &program.aggs, key_col)?;
    check_table(program, groups)?;
    let mut key = vec![0u64; program.keys.len() + 1];
    let (mut seen, mut inserted) = (0u64, 0u64);
    for block in 0..layout.header().blocks {
        let rows = layout.block_rows(seg, block)?;
        for r in 0..rows {
            interrupt::check_every(seen)?;
            seen += 1;
            let mut col = |c: usize| value(layout, seg, c, block, rows, r);
            if !filters_pass(&program.filters, &mut col)? {
                continue;
            }
            let Some(k) = col(key_col)? else { continue };
            let mut nulls = 0u64;
            for (i, s) in program.keys.iter().enumerate() {
                let Source::Col(c) = *s else { unreachable!("check_build refused payload keys") };
                key[i] = col(c)?.unwrap_or_else(|| {
                    nulls |= 1 << i;
                    0
                });
            }
            key[program.keys.len()] = nulls;
            let Some(slot) = groups.slot_of_existing(&key)? else {
                return Err(bad(format!(
                    "group table in segment \"{}\" lacks a group of the rows it was made from",
                    groups.name()
                )));
            };
            if inserted == capacity {
                return Err(built_past(capacity));
            }
            table.insert(Some(k as i64), slot as i64)?;
            inserted += 1;
        }
    }
    Ok(inserted)
}

/// A build that found more rows than its table was sized for (the group table that counted
/// them is not of these rows).
pub fn built_past(capacity: u64) -> UvmError {
    bad(format!("a dimension's build found more than the {capacity} rows its join table was sized for"))
}

/// Checks a build program's parts (a program of no joins: its filters, keys and aggregates)
/// against the cache `layout`, and its key column, one of the cache's integer-like columns
/// (22023 otherwise). [`build`] and the kernels' host side ([`gpu::build`]) both check this way.
pub fn check_build(
    layout: &Layout,
    filters: &[Filter],
    keys: &[Source],
    aggs: &[(AggKind, Input)],
    key_col: usize,
) -> Result<()> {
    check_parts(layout, filters, &[], keys, aggs)?;
    use crate::cache::Encoding as E;
    match layout.encoding(key_col) {
        Some(E::Int2 | E::Int4 | E::Int8 | E::Date | E::Timestamp | E::TimestampTz) => Ok(()),
        _ => Err(bad(format!("column {key_col} of the cache is not an integer-like join key"))),
    }
}
