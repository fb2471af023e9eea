//! The aggregate mode's values: the aggregates a plan computes, and their results as datums
//! (shared with `super::super::preagg`'s GpuJoinAgg, which merges the participants').

use super::*;

/// An aggregate the node computes: its state, the index in `Private::map` of its argument
/// (`None` for `count(*)`), and its result type.
pub(super) struct NodeAgg {
    pub(super) acc: Acc,
    pub(super) col: Option<usize>,
    pub(super) out: Out,
}

/// The aggregates of a plan's private list, checked.
pub(super) fn node_aggs(p: &Private) -> Vec<NodeAgg> {
    p.aggs
        .iter()
        .map(|&(fnoid, col)| {
            let Some((kind, arg)) = agg::spec_of(fnoid) else {
                report(UvmError::new(Code::SystemError, format!("GpuJoin: aggregate function {fnoid} in plan")));
            };
            let col = usize::try_from(col).ok().filter(|&c| c < p.map.len());
            if col.is_none() != (kind == Kind::CountStar) {
                report(UvmError::new(Code::SystemError, "GpuJoin: an aggregate's argument is not a column of the join"));
            }
            NodeAgg { acc: Acc::new(kind, arg), col, out: agg::out_of(kind, arg) }
        })
        .collect()
}

/// The probe mode's plan for `aggs` (see `GpuJoinScan::probe`).
pub(super) fn probe_plan(p: &Private, aggs: &[NodeAgg]) -> Option<Option<usize>> {
    let mut col = None;
    for a in aggs {
        match (a.acc.kind, a.col) {
            (Kind::CountStar, _) => {}
            (Kind::Count | Kind::Sum, Some(c)) if p.map[c].0 == 1 && col.is_none_or(|x| x == c) => col = Some(c),
            _ => return None,
        }
    }
    (!aggs.is_empty()).then_some(col)
}

impl GpuJoinScan {
    /// The join mode's payload plan (see `GpuJoinScan::row_payload`), and `from_outer`: for an
    /// inner or left join whose inner columns are key columns with an outer column of the same
    /// type (whose datum is then the same) and at most one by-value column more. Called in
    /// begin, once the columns are known.
    ///
    /// Only an exact key (one column, or several packed) says that a pair's key columns equal
    /// the outer tuple's: a hashed key's pairs include hash collisions, which the qual rechecks
    /// against the inner row's own key columns, so those come from the rows.
    pub(super) fn inner_payload(&mut self) -> Option<Option<usize>> {
        self.from_outer = vec![None; self.p.map.len()];
        if !self.aggs.is_empty() || !matches!(self.p.join, JoinKind::Inner | JoinKind::Left) {
            return None;
        }
        let exact = self.outer_key.composer.form().exact();
        let mut payload = None;
        for (i, &(side, resno)) in self.p.map.iter().enumerate() {
            if side != 1 {
                continue;
            }
            let outer = self.p.keys.iter().find(|k| exact && k.3 == resno && k.0 == k.1);
            if let Some(o) = outer.and_then(|k| self.outer_resnos.iter().position(|&r| r == k.2)) {
                self.from_outer[i] = Some(o);
                continue;
            }
            let c = self.col_index[i];
            if !self.inner_cols[c].byval || payload.is_some_and(|p| p != c) {
                return None;
            }
            payload = Some(c);
        }
        Some(payload)
    }
}

/// An `int2`, `int4` or `int8` datum (`arg`) as an i64 (`Arg::Any`: 0, only its NULL counts).
pub fn int_of_datum(d: pg_sys::Datum, arg: Arg) -> i64 {
    match arg {
        Arg::Any => 0,
        Arg::Int2 => d.value() as i16 as i64,
        Arg::Int4 => d.value() as i32 as i64,
        Arg::Int8 => d.value() as i64,
    }
}

/// An aggregate's value as a datum of its type `out` (a numeric is allocated in the current
/// memory context).
pub fn datum_of_value(v: Value, out: Out) -> (pg_sys::Datum, bool) {
    match (v, out) {
        (Value::Null, _) => (pg_sys::Datum::from(0), true),
        (Value::Int(x), Out::Int2) => (pg_sys::Datum::from(x as i16), false),
        (Value::Int(x), Out::Int4) => (pg_sys::Datum::from(x as i32), false),
        (Value::Int(x), Out::Int8) => (pg_sys::Datum::from(x), false),
        (Value::Int(x), Out::Numeric) => datum_of_value(Value::Big(x as i128), out),
        (Value::Big(x), _) => {
            let n = pgrx::AnyNumeric::from(x);
            (pgrx::IntoDatum::into_datum(n).expect("a numeric datum"), false)
        }
    }
}

/// Returns the aggregates' results as the node's one row: the scan tuple holds them first
/// (the rest NULL), made in the per-tuple memory, checked against the plan's qual if any, then
/// projected (the node's target list over them). Shared by the GpuJoin node's aggregate mode
/// and `super::preagg`'s GpuJoinAgg.
///
/// # Safety
/// `node` is a custom scan state whose scan tuple starts with one column per aggregate, of
/// the aggregate's result type.
pub unsafe fn emit_results<'a>(
    node: *mut pg_sys::CustomScanState,
    results: impl Iterator<Item = (&'a Acc, Out)>,
    qual: Option<*mut pg_sys::ExprState>,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: forwarded contract.
    unsafe {
        let econtext = (*node).ss.ps.ps_ExprContext;
        let scan = (*node).ss.ss_ScanTupleSlot;
        pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
        pg_sys::ExecClearTuple(scan);
        let natts = (*(*scan).tts_tupleDescriptor).natts as usize;
        for i in 0..natts {
            *(*scan).tts_values.add(i) = pg_sys::Datum::from(0);
            *(*scan).tts_isnull.add(i) = true;
        }
        let old = pg_sys::MemoryContextSwitchTo((*econtext).ecxt_per_tuple_memory);
        for (i, (acc, out)) in results.enumerate().take(natts) {
            let v = acc.value().unwrap_or_else(|e| report(e));
            let (d, isnull) = datum_of_value(v, out);
            *(*scan).tts_values.add(i) = d;
            *(*scan).tts_isnull.add(i) = isnull;
        }
        pg_sys::MemoryContextSwitchTo(old);
        pg_sys::ExecStoreVirtualTuple(scan);
        (*econtext).ecxt_scantuple = scan;
        if let Some(q) = qual.filter(|q| !q.is_null()) {
            if !pg_sys::ExecQual(q, econtext) {
                return std::ptr::null_mut();
            }
        }
        let proj = (*node).ss.ps.ps_ProjInfo;
        if proj.is_null() {
            scan
        } else {
            pg_sys::ExecProject(proj)
        }
    }
}

/// A datum of type `out`, as an aggregate's partial value (a numeric must hold an integer).
///
/// # Safety
/// `d` is a datum of type `out` (not NULL).
pub unsafe fn value_of_datum(d: pg_sys::Datum, out: Out) -> Result<Value> {
    Ok(match out {
        Out::Int2 => Value::Int(d.value() as i16 as i64),
        Out::Int4 => Value::Int(d.value() as i32 as i64),
        Out::Int8 => Value::Int(d.value() as i64),
        Out::Numeric => {
            // SAFETY: forwarded contract.
            let n = unsafe { <pgrx::AnyNumeric as pgrx::FromDatum>::from_datum(d, false) }.expect("not NULL");
            let text = n.to_string();
            Value::Big(text.parse::<i128>().map_err(|_| {
                UvmError::new(Code::ProtocolViolation, format!("a GpuJoin partial sum is not an integer: {text}"))
            })?)
        }
    })
}
