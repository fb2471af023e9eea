//! The planner's reading of a query level's `WHERE` on the fact table: each conjunct as the
//! scan program's clauses of alternatives (ranges, `IS NULL`, comparisons of integer
//! expressions), or as a text condition the executor evaluates over a dictionary; anything
//! else is `None`, and the node declines (see the module essay).

use super::*;

/// A by-value constant of an integer-like type as its value, if the node reads the type.
///
/// # Safety
/// `c` is a Const.
unsafe fn const_value(c: *const pg_sys::Const) -> Option<i64> {
    // SAFETY: forwarded contract; by-value datums of the listed types.
    unsafe {
        if (*c).constisnull {
            return None;
        }
        let d = (*c).constvalue.value();
        Some(match (*c).consttype {
            pg_sys::INT2OID => d as i16 as i64,
            pg_sys::INT4OID | pg_sys::DATEOID => d as i32 as i64,
            pg_sys::INT8OID | pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID => d as i64,
            _ => return None,
        })
    }
}

pub(super) fn is_integer(t: pg_sys::Oid) -> bool {
    matches!(t, pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID)
}

/// The plain column `n` of relation `relid` (range table index `varno`) as a cached column of a
/// type the node reads, if it is one.
///
/// # Safety
/// `n` is null or a node.
pub(super) unsafe fn column(n: *mut pg_sys::Node, varno: u32, cached: &[(i16, Encoding)]) -> Option<(Col, pg_sys::Oid)> {
    // SAFETY: forwarded contract.
    unsafe {
        let v = gpujoin::as_var(n)?;
        if (*v).varno as u32 != varno || (*v).varattno <= 0 {
            return None;
        }
        let encoding = encoding_of_type((*v).vartype)?;
        let att = (*v).varattno;
        let scale = if encoding == Encoding::Numeric { numeric_scale((*v).vartypmod)? } else { 0 };
        cached.iter().any(|&(a, e)| a == att && e == encoding).then_some((Col { attnum: att, encoding, scale }, (*v).vartype))
    }
}

/// The plain column `n` of relation `varno` as a cached `float4`/`float8` column.
///
/// # Safety
/// `n` is null or a node.
unsafe fn float_column(n: *mut pg_sys::Node, varno: u32, cached: &[(i16, Encoding)]) -> Option<(Col, pg_sys::Oid)> {
    // SAFETY: forwarded contract.
    unsafe {
        let v = gpujoin::as_var(n)?;
        let encoding = match (*v).vartype {
            pg_sys::FLOAT4OID => Encoding::Float4,
            pg_sys::FLOAT8OID => Encoding::Float8,
            _ => return None,
        };
        let att = (*v).varattno;
        ((*v).varno as u32 == varno && att > 0 && cached.contains(&(att, encoding)))
            .then_some((Col::new(att, encoding), (*v).vartype))
    }
}

/// `float column <strategy> constant` (the constant of the column's type) as alternatives over
/// the column's words ([`crate::scan::floats`]: PostgreSQL's order, NaNs and signed zeros
/// included).
///
/// # Safety
/// `c` is a non-NULL Const of the column's type.
unsafe fn float_ranges(col: Col, strategy: i32, c: *const pg_sys::Const) -> Option<Vec<Atom>> {
    use crate::scan::floats::FloatCmp;
    let cmp = match strategy {
        1 => FloatCmp::Lt,
        2 => FloatCmp::Le,
        3 => FloatCmp::Eq,
        4 => FloatCmp::Ge,
        5 => FloatCmp::Gt,
        6 => FloatCmp::Ne,
        _ => return None,
    };
    // SAFETY: forwarded contract; float4 and float8 are by-value datums of their bits.
    let d = unsafe { (*c).constvalue.value() } as u64;
    let (double, v) = match col.encoding {
        Encoding::Float8 => (true, f64::from_bits(d)),
        _ => (false, f64::from(f32::from_bits(d as u32))),
    };
    let ranges = crate::scan::floats::float_ranges(double, cmp, v);
    Some(ranges.into_iter().map(|(lo, hi)| Atom { col, check: Check::Range { lo, hi } }).collect())
}

/// A `numeric` value as a scaled integer at `scale`: its floor and whether it is exact
/// (`None`: NaN, an infinity, or past `i64`).
///
/// # Safety
/// `d` is a numeric datum.
unsafe fn scaled_numeric(d: pg_sys::Datum, scale: i16) -> Option<(i64, bool)> {
    // SAFETY: forwarded contract; numeric_out of a numeric datum returns a palloc'd string.
    let text = unsafe {
        let p = pg_sys::OidOutputFunctionCall(pg_sys::Oid::from(pg_sys::F_NUMERIC_OUT), d);
        CStr::from_ptr(p).to_str().ok()?.to_owned()
    };
    let (neg, digits) = match text.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, text.as_str()),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None; // NaN, Infinity
    }
    let s = scale.max(0) as usize;
    let kept: String = frac.chars().chain(std::iter::repeat('0')).take(s).collect();
    let exact = frac.chars().skip(s).all(|d| d == '0');
    let magnitude: i128 = format!("{int}{kept}").parse().ok()?;
    let floor = if neg { -magnitude - i128::from(!exact) } else { magnitude };
    Some((i64::try_from(floor).ok()?, exact))
}

/// The alternatives `numeric column <strategy> constant` is, over the column's scaled words.
///
/// # Safety
/// `c` is a non-NULL numeric Const.
unsafe fn numeric_ranges(col: Col, strategy: i32, c: *const pg_sys::Const) -> Option<Vec<Atom>> {
    // SAFETY: forwarded contract.
    let (floor, exact) = unsafe { scaled_numeric((*c).constvalue, col.scale)? };
    let r = |lo, hi| Atom { col, check: Check::Range { lo, hi } };
    if exact {
        return ranges(col, strategy, floor);
    }
    // an inexact constant lies strictly between floor and floor + 1
    let ceil = floor.checked_add(1)?;
    Some(match strategy {
        1 | 2 => vec![r(i64::MIN, floor)],
        3 => vec![],
        4 | 5 => vec![r(ceil, i64::MAX)],
        6 => vec![r(i64::MIN, i64::MAX)],
        _ => return None,
    })
}

/// The btree strategy of `opno` on a column of type `vtype` (1 `<` to 5 `>`), commuted where
/// the constant is on the left; 6 for `<>` (the negator of the family's `=`).
///
/// # Safety
/// Catalog lookups.
unsafe fn strategy_of(opno: pg_sys::Oid, vtype: pg_sys::Oid, commuted: bool) -> Option<i32> {
    // SAFETY: catalog lookups of existing operators and types.
    unsafe {
        let opclass = pg_sys::GetDefaultOpClass(vtype, pg_sys::BTREE_AM_OID);
        if opclass == pg_sys::InvalidOid {
            return None;
        }
        let family = pg_sys::get_opclass_family(opclass);
        let strategy = pg_sys::get_op_opfamily_strategy(opno, family);
        if strategy == 0 {
            // `<>`: a built-in operator (a user's could name any function) negating the
            // family's `=`
            let neg = pg_sys::get_negator(opno);
            let builtin = u32::from(opno) < pg_sys::FirstGenbkiObjectId;
            return (builtin && neg != pg_sys::InvalidOid && pg_sys::get_op_opfamily_strategy(neg, family) == 3).then_some(6);
        }
        // < and >, <= and >= trade places; = stays
        Some(if commuted { 6 - strategy } else { strategy })
    }
}

/// The alternatives `column <strategy> value` is: one range, two for `<>`, none where it is
/// never true.
fn ranges(col: Col, strategy: i32, value: i64) -> Option<Vec<Atom>> {
    let r = |lo, hi| Atom { col, check: Check::Range { lo, hi } };
    Some(match strategy {
        1 => value.checked_sub(1).map(|v| r(i64::MIN, v)).into_iter().collect(),
        2 => vec![r(i64::MIN, value)],
        3 => vec![r(value, value)],
        4 => vec![r(value, i64::MAX)],
        5 => value.checked_add(1).map(|v| r(v, i64::MAX)).into_iter().collect(),
        6 => [value.checked_sub(1).map(|v| r(i64::MIN, v)), value.checked_add(1).map(|v| r(v, i64::MAX))]
            .into_iter()
            .flatten()
            .collect(),
        _ => return None,
    })
}

/// Whether a constant of type `ctype` compares exactly with a column of type `vtype`: integers
/// across widths (one operator family), other types with their own type only (date against
/// timestamp converts).
fn comparable(ctype: pg_sys::Oid, vtype: pg_sys::Oid) -> bool {
    ctype == vtype || is_integer(ctype) && is_integer(vtype)
}

/// The element type of the constant array `c` and its elements, NULL ones as `None`: the array
/// detoasted and deconstructed in the current (the planner's) memory.
///
/// # Safety
/// `c` is a non-NULL Const of an array type.
unsafe fn array_elements(c: *const pg_sys::Const) -> (pg_sys::Oid, Vec<Option<pg_sys::Datum>>) {
    // SAFETY: forwarded contract.
    unsafe {
        let elem = pg_sys::get_element_type((*c).consttype);
        let arr = pg_sys::pg_detoast_datum((*c).constvalue.cast_mut_ptr()) as *mut pg_sys::ArrayType;
        let (mut len, mut byval, mut align) = (0i16, false, 0 as std::ffi::c_char);
        pg_sys::get_typlenbyvalalign(elem, &mut len, &mut byval, &mut align);
        let (mut values, mut nulls, mut n) = (std::ptr::null_mut(), std::ptr::null_mut(), 0i32);
        pg_sys::deconstruct_array(arr, elem, len as i32, byval, align, &mut values, &mut nulls, &mut n);
        let out = (0..n.max(0) as usize).map(|i| (!*nulls.add(i)).then(|| *values.add(i))).collect();
        (elem, out)
    }
}

/// The elements of a constant array of an integer-like type, NULL ones as `None`, each with
/// whether it is exact; a `numeric` array's elements scaled to `scale` (the floor of an inexact
/// one, which no column word equals).
///
/// # Safety
/// `c` is a non-NULL Const of an array type.
unsafe fn array_values(c: *const pg_sys::Const, scale: i16) -> Option<Vec<Option<(i64, bool)>>> {
    // SAFETY: forwarded contract; elements of the element type, by value (numerics by
    // reference).
    unsafe {
        let elem = pg_sys::get_element_type((*c).consttype);
        if !matches!(
            elem,
            pg_sys::INT2OID
                | pg_sys::INT4OID
                | pg_sys::INT8OID
                | pg_sys::DATEOID
                | pg_sys::TIMESTAMPOID
                | pg_sys::TIMESTAMPTZOID
                | pg_sys::NUMERICOID
        ) {
            return None;
        }
        let mut out = Vec::new();
        for v in array_elements(c).1 {
            let Some(v) = v else {
                out.push(None);
                continue;
            };
            if elem == pg_sys::NUMERICOID {
                out.push(Some(scaled_numeric(v, scale)?));
                continue;
            }
            let d = v.value();
            out.push(Some((
                match elem {
                    pg_sys::INT2OID => d as i16 as i64,
                    pg_sys::INT4OID | pg_sys::DATEOID => d as i32 as i64,
                    _ => d as i64,
                },
                true,
            )));
        }
        Some(out)
    }
}

/// The elements of a constant `float4[]` or `float8[]` as `f64`s (a `float4` widened exactly),
/// NULL ones as `None`.
///
/// # Safety
/// `c` is a non-NULL Const of an array type.
unsafe fn float_array_values(c: *const pg_sys::Const) -> Option<Vec<Option<f64>>> {
    // SAFETY: forwarded contract; elements by-value floats of the element type.
    unsafe {
        let (elem, values) = array_elements(c);
        if !matches!(elem, pg_sys::FLOAT4OID | pg_sys::FLOAT8OID) {
            return None;
        }
        let value = |d: pg_sys::Datum| match elem {
            pg_sys::FLOAT8OID => f64::from_bits(d.value() as u64),
            _ => f64::from(f32::from_bits(d.value() as u32)),
        };
        Some(values.into_iter().map(|v| v.map(value)).collect())
    }
}

/// `column op constant` (or commuted) of an integer-like column as one clause of ranges.
///
/// # Safety
/// `op` is a planner OpExpr.
unsafe fn range_clause(op: *mut pg_sys::OpExpr, varno: u32, cached: &[(i16, Encoding)]) -> Option<Vec<Vec<Atom>>> {
    // SAFETY: forwarded contract; nodes are read by their tags.
    unsafe {
        let args = PgList::<pg_sys::Node>::from_pg((*op).args);
        if args.len() != 2 {
            return None;
        }
        let (a, b) = (args.get_ptr(0)?, args.get_ptr(1)?);
        // column op constant, or constant op column (the strategy commuted)
        let (var, konst, commuted) = if (*b).type_ == pg_sys::NodeTag::T_Const {
            (a, b as *const pg_sys::Const, false)
        } else if (*a).type_ == pg_sys::NodeTag::T_Const {
            (b, a as *const pg_sys::Const, true)
        } else {
            return None;
        };
        let (col, vtype) = column(var, varno, cached).or_else(|| float_column(var, varno, cached))?;
        if col.encoding == Encoding::Bool || !comparable((*konst).consttype, vtype) || (*konst).constisnull {
            return None;
        }
        let strategy = strategy_of((*op).opno, vtype, commuted)?;
        let alts = if matches!(col.encoding, Encoding::Float4 | Encoding::Float8) {
            float_ranges(col, strategy, konst)?
        } else if col.encoding == Encoding::Numeric {
            numeric_ranges(col, strategy, konst)?
        } else {
            ranges(col, strategy, const_value(konst)?)?
        };
        // (never true: a clause of no alternative, which an OR drops and `clauses_of` declines)
        Some(vec![alts])
    }
}

/// The built-in integer arithmetic operators and widening casts (`int2`, `int4`, `int8`): an
/// operator is built in (an OID below `FirstGenbkiObjectId`: a user's operator of the same
/// name, in another schema, could call any function), its name one of `+ - * / %` and its
/// result an integer.
///
/// # Safety
/// `n` is a planner expression.
unsafe fn int_expr(
    n: *mut pg_sys::Node,
    varno: u32,
    cached: &[(i16, Encoding)],
    cols: &mut Vec<Col>,
    out: &mut Vec<Step>,
) -> Option<()> {
    // SAFETY: forwarded contract; nodes are read by their tags, operators looked up.
    unsafe {
        if out.len() > crate::scan::expr::MAX_STEPS {
            return None;
        }
        let width = |t: pg_sys::Oid| match t {
            pg_sys::INT2OID => Some(Width::Int2),
            pg_sys::INT4OID => Some(Width::Int4),
            pg_sys::INT8OID => Some(Width::Int8),
            _ => None,
        };
        match (*n).type_ {
            pg_sys::NodeTag::T_Var => {
                let (col, _) = column(n, varno, cached)?;
                if !matches!(col.encoding, Encoding::Int2 | Encoding::Int4 | Encoding::Int8) {
                    return None;
                }
                let i = cols.iter().position(|c| *c == col).unwrap_or_else(|| {
                    cols.push(col);
                    cols.len() - 1
                });
                out.push(Step::Col(i));
            }
            pg_sys::NodeTag::T_Const => {
                width((*(n as *mut pg_sys::Const)).consttype)?;
                out.push(Step::Const(const_value(n as *const pg_sys::Const)?));
            }
            // int2 -> int4, int4 -> int8, int2 -> int8: the value unchanged
            pg_sys::NodeTag::T_FuncExpr => {
                let f = n as *mut pg_sys::FuncExpr;
                let args = PgList::<pg_sys::Node>::from_pg((*f).args);
                if !matches!(u32::from((*f).funcid), 313 | 481 | 754) || args.len() != 1 {
                    return None;
                }
                int_expr(args.get_ptr(0)?, varno, cached, cols, out)?;
            }
            pg_sys::NodeTag::T_OpExpr => {
                let op = n as *mut pg_sys::OpExpr;
                let w = width((*op).opresulttype)?;
                if u32::from((*op).opno) >= pg_sys::FirstGenbkiObjectId {
                    return None;
                }
                let name = pg_sys::get_opname((*op).opno);
                if name.is_null() {
                    return None;
                }
                let name = CStr::from_ptr(name).to_bytes();
                let args = PgList::<pg_sys::Node>::from_pg((*op).args);
                for a in args.iter_ptr() {
                    width(pg_sys::exprType(a))?;
                    int_expr(a, varno, cached, cols, out)?;
                }
                out.push(match (args.len(), name) {
                    (2, b"+") => Step::Bin(Op::Add, w),
                    (2, b"-") => Step::Bin(Op::Sub, w),
                    (2, b"*") => Step::Bin(Op::Mul, w),
                    (2, b"/") => Step::Bin(Op::Div, w),
                    (2, b"%") => Step::Bin(Op::Mod, w),
                    (1, b"-") => Step::Neg(w),
                    (1, b"+") => return Some(()),
                    _ => return None,
                });
            }
            _ => return None,
        }
        Some(())
    }
}

/// `expr op expr` of integer expressions (at least one column), or of two columns of the same
/// `date`/`timestamp[tz]` type, as a comparison, if it is one.
///
/// # Safety
/// `op` is a planner OpExpr.
unsafe fn compare_of(op: *mut pg_sys::OpExpr, varno: u32, cached: &[(i16, Encoding)]) -> Option<PlanCompare> {
    // SAFETY: forwarded contract.
    unsafe {
        let args = PgList::<pg_sys::Node>::from_pg((*op).args);
        let (a, b) = (args.get_ptr(0)?, args.get_ptr(1)?);
        if args.len() != 2 {
            return None;
        }
        let (ta, tb) = (pg_sys::exprType(a), pg_sys::exprType(b));
        let (mut cols, mut lhs, mut rhs) = (Vec::new(), Vec::new(), Vec::new());
        if is_integer(ta) && is_integer(tb) {
            int_expr(a, varno, cached, &mut cols, &mut lhs)?;
            int_expr(b, varno, cached, &mut cols, &mut rhs)?;
        } else {
            // two columns of one date or timestamp type: their words compare as the values
            let (ca, _) = column(a, varno, cached)?;
            let (cb, _) = column(b, varno, cached)?;
            if ta != tb || !matches!(ca.encoding, Encoding::Date | Encoding::Timestamp | Encoding::TimestampTz) {
                return None;
            }
            cols = vec![ca, cb];
            (lhs, rhs) = (vec![Step::Col(0)], vec![Step::Col(1)]);
        }
        if cols.is_empty() {
            return None;
        }
        let cmp = match strategy_of((*op).opno, ta, false)? {
            1 => Cmp::Lt,
            2 => Cmp::Le,
            3 => Cmp::Eq,
            4 => Cmp::Ge,
            5 => Cmp::Gt,
            6 => Cmp::Ne,
            _ => return None,
        };
        let expr = Compare { lhs, cmp, rhs };
        expr.check().ok()?;
        Some(PlanCompare { cols, expr })
    }
}

/// The clauses an `OR` of `AND`s may distribute into.
const MAX_DISTRIBUTED: usize = 16;

/// A `WHERE` conjunct over integer-like fact columns as clauses of alternatives (the module
/// comment lists the forms), if it is one.
///
/// # Safety
/// `clause` is a planner expression.
pub(super) unsafe fn int_clauses(
    clause: *mut pg_sys::Node,
    varno: u32,
    cached: &[(i16, Encoding)],
    compares: &mut Vec<PlanCompare>,
) -> Option<Vec<Vec<Atom>>> {
    // SAFETY: forwarded contract; nodes are read by their tags.
    unsafe {
        match (*clause).type_ {
            pg_sys::NodeTag::T_BoolExpr => {
                let b = clause as *mut pg_sys::BoolExpr;
                let args = PgList::<pg_sys::Node>::from_pg((*b).args);
                match (*b).boolop {
                    // (A1 AND A2) OR B is (A1 OR B) AND (A2 OR B): the arms' clauses distributed,
                    // one clause per choice of a clause from each arm, within bounds
                    pg_sys::BoolExprType::OR_EXPR => {
                        let mut cnf: Vec<Vec<Atom>> = vec![Vec::new()];
                        for arm in args.iter_ptr() {
                            let clauses = int_clauses(arm, varno, cached, compares)?;
                            // An arm that is an AND of clauses, one of them a comparison whose
                            // arithmetic may raise an ERROR (`(b <> 0 AND 10 / b > 0) OR a = 1`):
                            // distributed, the comparison would be tested on rows where
                            // PostgreSQL, stopping at the arm's first false condition, never
                            // evaluates it. PostgreSQL answers.
                            let raises = |a: &Atom| match a.check {
                                Check::Compare(i) => compares.get(i).is_none_or(|c| c.expr.may_raise()),
                                _ => false,
                            };
                            if clauses.len() > 1 && clauses.iter().flatten().any(raises) {
                                return None;
                            }
                            let mut next = Vec::new();
                            for c in &cnf {
                                for d in &clauses {
                                    let mut clause: Vec<Atom> = Vec::with_capacity(c.len() + d.len());
                                    for a in c.iter().chain(d) {
                                        if !clause.contains(a) {
                                            clause.push(*a);
                                        }
                                    }
                                    next.push(clause);
                                }
                            }
                            // (absorption: a clause holding every alternative of another
                            // is implied by it, and goes; of equal ones the first stays: each
                            // dropped clause is implied by one of a smaller (length, place), so
                            // by one kept. An arm never true leaves the others as they are.)
                            let mut kept: Vec<Vec<Atom>> = Vec::new();
                            for (i, c) in next.iter().enumerate() {
                                let implied = next
                                    .iter()
                                    .enumerate()
                                    .any(|(j, d)| j != i && d.iter().all(|a| c.contains(a)) && (d.len() < c.len() || j < i));
                                if !implied {
                                    kept.push(c.clone());
                                }
                            }
                            let next = kept;
                            let atoms: usize = next.iter().map(Vec::len).sum();
                            if next.len() > MAX_DISTRIBUTED || atoms > exec::scan::MAX_FILTERS {
                                return None;
                            }
                            cnf = next;
                        }
                        Some(cnf)
                    }
                    pg_sys::BoolExprType::AND_EXPR => {
                        let mut all = Vec::new();
                        for arm in args.iter_ptr() {
                            all.extend(int_clauses(arm, varno, cached, compares)?);
                        }
                        Some(all)
                    }
                    // NOT of a boolean column
                    _ => {
                        let (col, _) = column(args.get_ptr(0)?, varno, cached)?;
                        (col.encoding == Encoding::Bool).then(|| vec![vec![Atom { col, check: Check::Range { lo: 0, hi: 0 } }]])
                    }
                }
            }
            // a boolean column alone
            pg_sys::NodeTag::T_Var => {
                let (col, _) = column(clause, varno, cached)?;
                (col.encoding == Encoding::Bool).then(|| vec![vec![Atom { col, check: Check::Range { lo: 1, hi: 1 } }]])
            }
            pg_sys::NodeTag::T_NullTest => {
                let t = clause as *mut pg_sys::NullTest;
                if (*t).argisrow {
                    return None;
                }
                let arg = (*t).arg as *mut pg_sys::Node;
                let (col, _) = column(arg, varno, cached).or_else(|| float_column(arg, varno, cached))?;
                let check = match (*t).nulltesttype {
                    pg_sys::NullTestType::IS_NULL => Check::Null,
                    _ => Check::Range { lo: i64::MIN, hi: i64::MAX },
                };
                Some(vec![vec![Atom { col, check }]])
            }
            pg_sys::NodeTag::T_OpExpr => range_clause(clause as *mut pg_sys::OpExpr, varno, cached).or_else(|| {
                let c = compare_of(clause as *mut pg_sys::OpExpr, varno, cached)?;
                compares.push(c);
                let col = compares.last()?.cols[0];
                Some(vec![vec![Atom { col, check: Check::Compare(compares.len() - 1) }]])
            }),
            // column = ANY (constant array): one alternative per element; column <> ALL (...):
            // one clause per element
            pg_sys::NodeTag::T_ScalarArrayOpExpr => {
                let op = clause as *mut pg_sys::ScalarArrayOpExpr;
                let args = PgList::<pg_sys::Node>::from_pg((*op).args);
                let (var, arr) = (args.get_ptr(0)?, args.get_ptr(1)?);
                if args.len() != 2 || (*arr).type_ != pg_sys::NodeTag::T_Const || (*(arr as *mut pg_sys::Const)).constisnull {
                    return None;
                }
                let konst = arr as *const pg_sys::Const;
                if let Some((col, vtype)) = float_column(var, varno, cached) {
                    // a float column: each element's runs of words
                    if pg_sys::get_element_type((*konst).consttype) != vtype {
                        return None;
                    }
                    let values = float_array_values(konst)?;
                    let strategy = strategy_of((*op).opno, vtype, false)?;
                    let atoms = |cmp: crate::scan::floats::FloatCmp, v: f64| -> Vec<Atom> {
                        let double = col.encoding == Encoding::Float8;
                        let runs = crate::scan::floats::float_ranges(double, cmp, v);
                        runs.into_iter().map(|(lo, hi)| Atom { col, check: Check::Range { lo, hi } }).collect()
                    };
                    return match ((*op).useOr, strategy) {
                        // (NULL elements match nothing)
                        (true, 3) => Some(vec![values
                            .into_iter()
                            .flatten()
                            .flat_map(|v| atoms(crate::scan::floats::FloatCmp::Eq, v))
                            .collect()]),
                        // (a NULL element makes `<> ALL` never true: PostgreSQL answers)
                        (false, 6) if values.iter().all(|v| v.is_some()) => {
                            Some(values.into_iter().flatten().map(|v| atoms(crate::scan::floats::FloatCmp::Ne, v)).collect())
                        }
                        _ => None,
                    };
                }
                let (col, vtype) = column(var, varno, cached)?;
                if col.encoding == Encoding::Bool || !comparable(pg_sys::get_element_type((*konst).consttype), vtype) {
                    return None;
                }
                let values = array_values(konst, col.scale)?;
                let strategy = strategy_of((*op).opno, vtype, false)?;
                if (*op).useOr {
                    if strategy != 3 {
                        return None;
                    }
                    // equal values as ranges of consecutive ones (NULL elements, and numerics
                    // the column's scale cannot hold, match nothing)
                    let mut v: Vec<i64> = values.into_iter().flatten().filter(|x| x.1).map(|x| x.0).collect();
                    v.sort_unstable();
                    v.dedup();
                    let mut alts: Vec<Atom> = Vec::new();
                    for x in v {
                        match alts.last_mut() {
                            Some(Atom { check: Check::Range { hi, .. }, .. }) if hi.checked_add(1) == Some(x) => *hi = x,
                            _ => alts.push(Atom { col, check: Check::Range { lo: x, hi: x } }),
                        }
                    }
                    Some(vec![alts])
                } else {
                    // (a NULL element makes `<> ALL` never true: PostgreSQL answers)
                    if strategy != 6 || values.iter().any(|x| x.is_none()) {
                        return None;
                    }
                    // (a numeric the column's scale cannot hold differs from every value: the
                    // row needs one, IS NOT NULL)
                    let all = |x: (i64, bool)| {
                        if x.1 {
                            ranges(col, 6, x.0)
                        } else {
                            Some(vec![Atom { col, check: Check::Range { lo: i64::MIN, hi: i64::MAX } }])
                        }
                    };
                    values.into_iter().flatten().map(|x| all(x).filter(|a| !a.is_empty())).collect()
                }
            }
            _ => None,
        }
    }
}

/// `LIKE`, `NOT LIKE`, `ILIKE`, `NOT ILIKE` of text (pg_proc's fixed OIDs): not marked
/// leakproof (an invalid pattern is an ERROR), but nothing in the string they test makes one.
const LIKE_FUNCTIONS: [u32; 4] = [850, 851, 1633, 1634];

/// Whether `n` is built only of nodes a text condition may hold: columns, constants, a generic
/// plan's parameters, relabelings, collations, `AND`/`OR`/`NOT`, `IS [NOT] NULL`, and calls of
/// functions that raise no ERROR for any value of their arguments (leakproof ones, and `LIKE`'s).
/// The executor evaluates a text condition over every string of the column's dictionary, also
/// those of rows that other conditions would have dropped before PostgreSQL evaluated it on
/// them: such an evaluation must not fail where PostgreSQL's plan would not.
///
/// # Safety
/// `n` is null or a planner expression.
unsafe fn error_free(n: *mut pg_sys::Node, depth: u32) -> bool {
    // SAFETY: forwarded contract; nodes read by their tags, catalog lookups of their functions.
    unsafe {
        if n.is_null() {
            return true;
        }
        if depth > 64 {
            return false;
        }
        let args = |l: *mut pg_sys::List| PgList::<pg_sys::Node>::from_pg(l).iter_ptr().all(|a| error_free(a, depth + 1));
        let func = |f: pg_sys::Oid| LIKE_FUNCTIONS.contains(&u32::from(f)) || pg_sys::get_func_leakproof(f);
        match (*n).type_ {
            pg_sys::NodeTag::T_Var | pg_sys::NodeTag::T_Const => true,
            pg_sys::NodeTag::T_Param => (*(n as *mut pg_sys::Param)).paramkind == pg_sys::ParamKind::PARAM_EXTERN,
            pg_sys::NodeTag::T_RelabelType => error_free((*(n as *mut pg_sys::RelabelType)).arg as *mut pg_sys::Node, depth + 1),
            pg_sys::NodeTag::T_CollateExpr => error_free((*(n as *mut pg_sys::CollateExpr)).arg as *mut pg_sys::Node, depth + 1),
            pg_sys::NodeTag::T_NullTest => error_free((*(n as *mut pg_sys::NullTest)).arg as *mut pg_sys::Node, depth + 1),
            pg_sys::NodeTag::T_BoolExpr => args((*(n as *mut pg_sys::BoolExpr)).args),
            pg_sys::NodeTag::T_OpExpr => {
                let op = n as *mut pg_sys::OpExpr;
                func(pg_sys::get_opcode((*op).opno)) && args((*op).args)
            }
            pg_sys::NodeTag::T_ScalarArrayOpExpr => {
                let op = n as *mut pg_sys::ScalarArrayOpExpr;
                func(pg_sys::get_opcode((*op).opno)) && args((*op).args)
            }
            pg_sys::NodeTag::T_FuncExpr => {
                let f = n as *mut pg_sys::FuncExpr;
                func((*f).funcid) && args((*f).args)
            }
            _ => false,
        }
    }
}

/// A `WHERE` conjunct whose only column is a dictionary-encoded text column of the fact, as a
/// text condition (evaluated per distinct string by the executor), if it is one: made of what
/// [`error_free`] allows, without volatile functions. The expression is copied with its
/// operators' functions set (the planner leaves them unset in clauses it derived).
///
/// # Safety
/// `clause` is a planner expression.
pub(super) unsafe fn text_clause(
    clause: *mut pg_sys::Node,
    varno: u32,
    cached: &[(i16, Encoding)],
) -> Option<(Col, *mut pg_sys::Node)> {
    // SAFETY: forwarded contract; pull_var_clause and the contain_ walkers read the tree.
    unsafe {
        if pg_sys::contain_volatile_functions(clause) || !error_free(clause, 0) {
            return None;
        }
        let vars = PgList::<pg_sys::Node>::from_pg(pg_sys::pull_var_clause(clause, pg_sys::PVC_INCLUDE_PLACEHOLDERS as i32));
        let mut attnum = None;
        for n in vars.iter_ptr() {
            let v = gpujoin::as_var(n)?;
            if (*v).varno as u32 != varno
                || (*v).varattno <= 0
                || !matches!((*v).vartype, pg_sys::TEXTOID | pg_sys::VARCHAROID)
                || attnum.is_some_and(|a| a != (*v).varattno)
            {
                return None;
            }
            attnum = Some((*v).varattno);
        }
        let attnum = attnum?;
        cached.iter().find(|c| c.0 == attnum && c.1 == Encoding::DictCode)?;
        let copy = pg_sys::copyObjectImpl(clause as *const std::ffi::c_void) as *mut pg_sys::Node;
        pg_sys::fix_opfuncids(copy);
        Some((Col::new(attnum, Encoding::DictCode), copy))
    }
}
