//! What the executor computes outside the scan program: the group table's aggregates for the
//! plan's and their results from the states (PostgreSQL's types and digits), and the code
//! bitmaps of text conditions, which PostgreSQL evaluates over a column's dictionary (see the
//! module essay).

use super::*;
use crate::cache::dict::DictLookup;

/// A string of a cache's dictionary as a `text` datum, made in the current memory context.
/// The string is a segment's, not trusted: one that is not valid in the database's encoding (a
/// NUL byte included) is a corrupted cache, an ERROR (22023) rather than a datum that a
/// `CREATE TABLE AS` would store and every later read of it refuse.
///
/// # Safety
/// Called in a backend, inside a transaction (the datum is palloc'd).
pub(super) unsafe fn text_datum(s: &[u8]) -> Result<pg_sys::Datum> {
    let corrupted = || {
        crate::cache::overwritten(format!(
            "a column cache's dictionary is corrupted: a string of {} bytes is not valid in the database's encoding",
            s.len()
        ))
    };
    let len = i32::try_from(s.len()).map_err(|_| corrupted())?;
    // SAFETY: `s` is `len` readable bytes; the check reads them only (noError: no ERROR here);
    // the text is a palloc'd copy (forwarded contract).
    unsafe {
        let p = s.as_ptr() as *const std::ffi::c_char;
        if !pg_sys::pg_verify_mbstr(pg_sys::GetDatabaseEncoding(), p, len, true) {
            return Err(corrupted());
        }
        Ok(pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(p, len)))
    }
}

/// The strings a grouping column's codes were decoded to, per column (a number the caller
/// picks), by the string's hash: a dictionary holds each string once, so two codes of one string
/// are a corrupted cache, whose groups would come out twice under one key. Only the codes of the
/// groups returned are seen (O(groups), where the strings are made anyway), not the whole
/// dictionary, and at most `limit` of them are kept (the groups are returned a window at a time
/// so that memory stays bounded: past the limit, later codes are checked against those kept).
pub(super) struct SeenStrings {
    seen: std::collections::HashMap<(usize, u64), u32>,
    limit: usize,
}

impl SeenStrings {
    /// Keeping at most `limit` codes.
    pub(super) fn limited(limit: usize) -> SeenStrings {
        SeenStrings { seen: std::collections::HashMap::new(), limit }
    }

    /// Notes that `code` of column `col` is `s`; 22023 where another code of `lookup` (the
    /// column's dictionary) holds the same string.
    pub(super) fn note(&mut self, col: usize, code: u32, s: &[u8], lookup: &DictLookup<'_>) -> Result<()> {
        use std::collections::hash_map::Entry;
        use std::hash::{BuildHasher, RandomState};
        thread_local! { static HASHER: RandomState = RandomState::new(); }
        let h = HASHER.with(|r| r.hash_one(s));
        let full = self.seen.len() >= self.limit;
        match self.seen.entry((col, h)) {
            Entry::Occupied(o) if *o.get() != code && lookup.get(*o.get()) == Some(s) => Err(crate::cache::overwritten(format!(
                "a column cache's dictionary is corrupted: codes {} and {code} hold one string",
                o.get()
            ))),
            // (the same code again, or another string of the same hash: nothing to tell)
            Entry::Occupied(_) => Ok(()),
            Entry::Vacant(v) => {
                if !full {
                    v.insert(code);
                }
                Ok(())
            }
        }
    }

    pub(super) fn clear(&mut self) {
        self.seen.clear();
    }
}

/// The group table's aggregates for `aggs`: one state each, then a count beside each sum.
pub(super) fn table_aggs(aggs: &[AggOf], cols: &dyn Fn(&Col) -> usize) -> Vec<(AggKind, Input)> {
    let mut out: Vec<(AggKind, Input)> = aggs
        .iter()
        .map(|a| {
            let input = match (a.num, a.input) {
                (Num::Float4, AggInput::Col(c)) => Input::Float4(cols(&c)),
                _ => input_of(&a.input, cols),
            };
            let float = matches!(a.num, Num::Float4 | Num::Float8);
            let kind = match a.kind {
                Kind::CountStar => AggKind::CountStar,
                Kind::Count => AggKind::Count,
                Kind::Sum if float => AggKind::SumFloat,
                Kind::Min if float => AggKind::MinFloat,
                Kind::Max if float => AggKind::MaxFloat,
                Kind::Sum => AggKind::SumInt,
                Kind::Min => AggKind::MinInt,
                Kind::Max => AggKind::MaxInt,
            };
            (kind, input)
        })
        .collect();
    for a in aggs.iter().filter(|a| a.kind == Kind::Sum) {
        out.push((AggKind::Count, input_of(&a.input, cols)));
    }
    out
}

/// The program's input for an aggregate's, its columns by their index in the cache.
pub(super) fn input_of(i: &AggInput, cols: &dyn Fn(&Col) -> usize) -> Input {
    match i {
        AggInput::Star => Input::Star,
        AggInput::Col(c) => Input::Col(cols(c)),
        AggInput::Sub(x, y) => Input::Sub(cols(x), cols(y)),
        AggInput::Mul(x, y) => Input::Mul(cols(x), cols(y)),
    }
}

/// The count the group table keeps beside sum `i` (after every aggregate, one per sum in
/// their order: [`table_aggs`]).
fn count_beside(aggs: &[AggOf], i: usize, states: &[(u64, u64)]) -> Result<u64> {
    let nth = aggs[..i].iter().filter(|a| a.kind == Kind::Sum).count();
    states.get(aggs.len() + nth).map(|c| c.0).ok_or_else(|| UvmError::new(Code::SystemError, "a sum without its count"))
}

/// `sum / count` as PostgreSQL's averages of integers and numerics finish (`numeric_div`).
fn numeric_avg(sum: pg_sys::Datum, count: u64) -> (pg_sys::Datum, bool) {
    let (n, _) = gpujoin::datum_of_value(Value::Big(i128::from(count)), Out::Numeric);
    // SAFETY: numeric_div of two numeric datums; callers answer a zero count before.
    let d = unsafe { pgrx::direct_function_call_as_datum(pg_sys::numeric_div, &[Some(sum), Some(n)]) };
    (d.unwrap_or(pg_sys::Datum::from(0)), d.is_none())
}

/// Aggregate `i` of a group as the datum of PostgreSQL's result type (and whether it is NULL),
/// from the group's states (`states[i]`, and for a sum the count beside it).
pub(super) fn datum_of(aggs: &[AggOf], i: usize, states: &[(u64, u64)]) -> Result<(pg_sys::Datum, bool)> {
    let a = aggs[i];
    let (lo, hi) = *states.get(i).ok_or_else(|| UvmError::new(Code::SystemError, "a group without its aggregates"))?;
    let null = (pg_sys::Datum::from(0), true);
    let datum = |x: Option<pg_sys::Datum>| (x.unwrap_or(pg_sys::Datum::from(0)), false);
    let count = || count_beside(aggs, i, states);
    Ok(match (a.kind, a.num) {
        (Kind::CountStar | Kind::Count, _) => datum(pgrx::IntoDatum::into_datum(lo as i64)),
        (Kind::Min | Kind::Max, _) if hi == 0 => null,
        (Kind::Sum, _) if count()? == 0 => null,
        // integers: sum(int2/int4) bigint (22003 past it, as int4_sum), sum(int8) numeric,
        // avg numeric by PostgreSQL's division, min and max of the argument's type
        (Kind::Sum, Num::Int) if a.avg => {
            numeric_avg(gpujoin::datum_of_value(Value::Big(groups::sum_int((lo, hi))), Out::Numeric).0, count()?)
        }
        (Kind::Sum, Num::Int) => {
            let sum = groups::sum_int((lo, hi));
            let v = match agg::out_of(a.kind, a.arg) {
                Out::Numeric => Value::Big(sum),
                _ => Value::Int(
                    i64::try_from(sum).map_err(|_| UvmError::new(Code::NumericValueOutOfRange, "bigint out of range"))?,
                ),
            };
            gpujoin::datum_of_value(v, agg::out_of(a.kind, a.arg))
        }
        (Kind::Min | Kind::Max, Num::Int) => gpujoin::datum_of_value(Value::Int(lo as i64), agg::out_of(a.kind, a.arg)),
        // floats: float8 sums and averages (a sum of finite values that reached an infinity is
        // PostgreSQL's 22003), min and max of the argument's type
        (Kind::Sum, Num::Float4 | Num::Float8) if hi & groups::OVERFLOWED != 0 => {
            return Err(UvmError::new(Code::NumericValueOutOfRange, "value out of range: overflow"));
        }
        (Kind::Sum, Num::Float4 | Num::Float8) => {
            let s = f64::from_bits(lo);
            datum(pgrx::IntoDatum::into_datum(if a.avg { s / count()? as f64 } else { s }))
        }
        (Kind::Min | Kind::Max, Num::Float4) => datum(pgrx::IntoDatum::into_datum(f64::from_bits(lo) as f32)),
        (Kind::Min | Kind::Max, Num::Float8) => datum(pgrx::IntoDatum::into_datum(f64::from_bits(lo))),
        // numeric(p, s): numerics of the column's display scale, as PostgreSQL's over inputs
        // that all have it; avg by numeric_div
        (Kind::Sum | Kind::Min | Kind::Max, Num::Numeric) => {
            let scale = if let AggInput::Col(c) = a.input { c.scale } else { 0 };
            let v = if a.kind == Kind::Sum { groups::sum_int((lo, hi)) } else { i128::from(lo as i64) };
            let d = numeric_of_scaled(v, scale);
            if a.avg {
                numeric_avg(d, count()?)
            } else {
                (d, false)
            }
        }
    })
}

/// The dictionary of cache column `col` of `u`, read into the backend (Err(why): the cache was
/// dropped meanwhile).
pub(super) fn read_dictionary(u: &caches::Usable, col: usize) -> std::result::Result<Vec<u8>, &'static str> {
    match u.dictionary_bytes(col) {
        Ok(b) => Ok(b),
        Err(e) if e.code == Code::UndefinedObject => Err("the cache was dropped"),
        Err(e) => report(e),
    }
}

/// The codes of `dict` whose strings pass the text condition `expr` (an expression over one
/// text column of the fact, attribute `attnum`), and whether a NULL passes it (`t IS NULL OR
/// ...`: a NULL has no code): PostgreSQL evaluates it once per string and once for NULL, the
/// value as the column's in a scan tuple of its own, in the node's expression context. Answers
/// cancel between strings.
///
/// # Safety
/// `node` is this node's executor state; `expr` a text condition of its plan.
pub(super) unsafe fn text_codes(
    node: *mut pg_sys::CustomScanState,
    dict: &Dict<'_>,
    attnum: i16,
    expr: *mut pg_sys::Node,
) -> (Vec<u8>, bool) {
    // SAFETY: forwarded contract; the slot's descriptor gives every attribute up to the
    // column the Var's own type (the interpreter checks it), the others NULL; values are made
    // in the per-tuple memory, reset per string.
    unsafe {
        let vars = PgList::<pg_sys::Node>::from_pg(pg_sys::pull_var_clause(expr, 0));
        let typid = vars.get_ptr(0).map_or(pg_sys::TEXTOID, |v| (*(v as *mut pg_sys::Var)).vartype);
        let natts = i32::from(attnum.max(1));
        let desc = pg_sys::CreateTemplateTupleDesc(natts);
        for a in 1..=natts {
            pg_sys::TupleDescInitEntry(desc, a as i16, std::ptr::null(), typid, -1, 0);
        }
        let slot = pg_sys::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsVirtual);
        let state = pg_sys::ExecInitExpr(expr as *mut pg_sys::Expr, &mut (*node).ss.ps);
        let econtext = (*node).ss.ps.ps_ExprContext;
        let saved = (*econtext).ecxt_scantuple;
        (*econtext).ecxt_scantuple = slot;
        let per_tuple = (*econtext).ecxt_per_tuple_memory;
        // whether the condition is true with the column's value `s` (None: NULL)
        let passes = |s: Option<&[u8]>| -> bool {
            pg_sys::MemoryContextReset(per_tuple);
            pg_sys::ExecClearTuple(slot);
            let old = pg_sys::MemoryContextSwitchTo(per_tuple);
            for a in 0..natts as usize {
                *(*slot).tts_values.add(a) = pg_sys::Datum::from(0);
                *(*slot).tts_isnull.add(a) = true;
            }
            if let Some(s) = s {
                let text = text_datum(s).unwrap_or_else(|e| report(e));
                *(*slot).tts_values.add(natts as usize - 1) = text;
                *(*slot).tts_isnull.add(natts as usize - 1) = false;
            }
            pg_sys::ExecStoreVirtualTuple(slot);
            let mut isnull = false;
            let eval = (*state).evalfunc.expect("an initialized expression");
            let d = eval(state, econtext, &mut isnull);
            pg_sys::MemoryContextSwitchTo(old);
            !isnull && d.value() & 0xff != 0
        };
        let mut seen = 0u64;
        let bits = dict.select(|s| {
            if seen.is_multiple_of(1024) {
                pg_sys::check_for_interrupts!();
            }
            seen += 1;
            passes(Some(s))
        });
        let null = passes(None);
        pg_sys::MemoryContextReset(per_tuple);
        (*econtext).ecxt_scantuple = saved;
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        (bits, null)
    }
}
