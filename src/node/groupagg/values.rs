//! What the executor computes outside the scan program: the group table's aggregates for the
//! plan's and their results from the states (PostgreSQL's types and digits), and the code
//! bitmaps of text conditions, which PostgreSQL evaluates over a column's dictionary (see the
//! module essay).

use super::*;

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

/// Aggregate `i`'s value from its group's states (`states[i]`, and for a sum the count the
/// table keeps beside it).
pub(super) fn value_of(aggs: &[AggOf], i: usize, states: &[(u64, u64)]) -> Result<Value> {
    let a = aggs[i];
    let s = *states.get(i).ok_or_else(|| UvmError::new(Code::SystemError, "a group without its aggregates"))?;
    Ok(match a.kind {
        Kind::CountStar | Kind::Count => Value::Int(s.0 as i64),
        Kind::Min | Kind::Max => {
            if s.1 == 0 {
                Value::Null
            } else {
                Value::Int(s.0 as i64)
            }
        }
        Kind::Sum => {
            let nth = aggs[..i].iter().filter(|a| a.kind == Kind::Sum).count();
            let count =
                states.get(aggs.len() + nth).ok_or_else(|| UvmError::new(Code::SystemError, "a sum without its count"))?;
            if count.0 == 0 {
                Value::Null
            } else {
                let sum = groups::sum_int(s);
                match agg::out_of(a.kind, a.arg) {
                    Out::Numeric => Value::Big(sum),
                    _ => Value::Int(
                        i64::try_from(sum).map_err(|_| UvmError::new(Code::NumericValueOutOfRange, "bigint out of range"))?,
                    ),
                }
            }
        }
    })
}

/// A float aggregate of a group (`sum`, `min`, `max`, `avg` of `float4`/`float8`): PostgreSQL's
/// result type (`float8`, but `min`/`max` of `float4` `float4`), NULL over no value; a sum of
/// finite values that reached an infinity is PostgreSQL's ERROR 22003.
pub(super) fn float_datum(aggs: &[AggOf], i: usize, states: &[(u64, u64)]) -> Result<(pg_sys::Datum, bool)> {
    let a = aggs[i];
    let nth = aggs[..i].iter().filter(|a| a.kind == Kind::Sum).count();
    let state = states.get(i).copied();
    let count = states.get(aggs.len() + nth).map(|c| c.0);
    let missing = || UvmError::new(Code::SystemError, "a float aggregate without its state");
    let null = (pg_sys::Datum::from(0), true);
    let f = |x: f64| (pgrx::IntoDatum::into_datum(x).unwrap_or(pg_sys::Datum::from(0)), false);
    let (lo, hi) = state.ok_or_else(missing)?;
    Ok(match a.kind {
        Kind::Min | Kind::Max if hi == 0 => null,
        Kind::Min | Kind::Max if a.num == Num::Float4 => {
            (pgrx::IntoDatum::into_datum(f64::from_bits(lo) as f32).unwrap_or(pg_sys::Datum::from(0)), false)
        }
        Kind::Min | Kind::Max => f(f64::from_bits(lo)),
        Kind::Sum => {
            let n = count.ok_or_else(missing)?;
            if n == 0 {
                null
            } else if hi & groups::OVERFLOWED != 0 {
                return Err(UvmError::new(Code::NumericValueOutOfRange, "value out of range: overflow"));
            } else if a.avg {
                f(f64::from_bits(lo) / n as f64)
            } else {
                f(f64::from_bits(lo))
            }
        }
        Kind::CountStar | Kind::Count => return Err(missing()),
    })
}

/// A `numeric(p, s)` aggregate of a group (`sum`, `min`, `max`, `avg`, over the scaled words):
/// numerics of the column's scale, as PostgreSQL's (whose inputs all have that display scale),
/// `avg` the sum divided by the count by `numeric_div`; NULL over no value.
pub(super) fn numeric_datum(aggs: &[AggOf], i: usize, states: &[(u64, u64)]) -> Result<(pg_sys::Datum, bool)> {
    let a = aggs[i];
    let scale = match a.input {
        AggInput::Col(c) => c.scale,
        _ => 0,
    };
    let nth = aggs[..i].iter().filter(|a| a.kind == Kind::Sum).count();
    let missing = || UvmError::new(Code::SystemError, "a numeric aggregate without its state");
    let (lo, hi) = states.get(i).copied().ok_or_else(missing)?;
    let null = (pg_sys::Datum::from(0), true);
    Ok(match a.kind {
        Kind::Min | Kind::Max if hi == 0 => null,
        Kind::Min | Kind::Max => (numeric_of_scaled(i128::from(lo as i64), scale), false),
        Kind::Sum => {
            let (count, _) = states.get(aggs.len() + nth).copied().ok_or_else(missing)?;
            if count == 0 {
                null
            } else {
                let sum = numeric_of_scaled(groups::sum_int((lo, hi)), scale);
                if a.avg {
                    let (n, _) = gpujoin::datum_of_value(Value::Big(i128::from(count)), Out::Numeric);
                    // SAFETY: numeric_div of two numeric datums, the count not 0.
                    let d = unsafe { pgrx::direct_function_call_as_datum(pg_sys::numeric_div, &[Some(sum), Some(n)]) };
                    (d.unwrap_or(pg_sys::Datum::from(0)), d.is_none())
                } else {
                    (sum, false)
                }
            }
        }
        Kind::CountStar | Kind::Count => return Err(missing()),
    })
}

/// `avg` of a group: its sum divided by its count as PostgreSQL's `int8_avg` and `numeric_avg`
/// finish (`numeric_div`), NULL over no value.
pub(super) fn avg_datum(aggs: &[AggOf], i: usize, states: &[(u64, u64)]) -> Result<(pg_sys::Datum, bool)> {
    let nth = aggs[..i].iter().filter(|a| a.kind == Kind::Sum).count();
    let (Some(&sum), Some(&(count, _))) = (states.get(i), states.get(aggs.len() + nth)) else {
        return Err(UvmError::new(Code::SystemError, "an average without its sum and count"));
    };
    if count == 0 {
        return Ok((pg_sys::Datum::from(0), true));
    }
    let (s, _) = gpujoin::datum_of_value(Value::Big(groups::sum_int(sum)), Out::Numeric);
    let (n, _) = gpujoin::datum_of_value(Value::Big(i128::from(count)), Out::Numeric);
    // SAFETY: numeric_div of two numeric datums (a zero count was answered above).
    let d = unsafe { pgrx::direct_function_call_as_datum(pg_sys::numeric_div, &[Some(s), Some(n)]) };
    Ok((d.unwrap_or(pg_sys::Datum::from(0)), d.is_none()))
}

/// The dictionary of cache column `col` of `u`, read into the backend (Err(why): the cache was
/// dropped meanwhile).
pub(super) fn read_dictionary(u: &caches::Usable, col: usize) -> std::result::Result<Vec<u8>, &'static str> {
    let read = || -> Result<Vec<u8>> {
        let seg = u.dictionary(col)?;
        let (_, info) = crate::runtime::lookup_own(seg.name())?;
        let mut bytes = Vec::new();
        crate::node::fallible::try_resize(&mut bytes, info.size as usize, 0u8, "a text column's dictionary")?;
        try_executor(|ex| exec::read(ex, &seg, 0, &mut bytes))?;
        Ok(bytes)
    };
    match read() {
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
                let text = pg_sys::cstring_to_text_with_len(s.as_ptr() as *const std::ffi::c_char, s.len() as i32);
                *(*slot).tts_values.add(natts as usize - 1) = pg_sys::Datum::from(text);
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
