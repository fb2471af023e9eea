//! The aggregates a GpuJoin computes itself, in plain Rust (no PostgreSQL types but the
//! planner's test of a plain call, [`plain`]).
//!
//! # Why
//!
//! `SELECT count(*), sum(d.v) FROM fact f JOIN dim d ON f.k = d.k` through the plan node alone
//! hands every joined row up to PostgreSQL's Partial Aggregate: per row a tuple formed, a call
//! of the node's exec, a transition function. On the H200 that per-row work is most of the
//! node's time (the GPU report before the push-down, `bench/gpu-report-gpujoin-node.md` in git
//! history: 1.68 s, of which 0.39 s is the bare scan).
//! When the query above the join is an ungrouped aggregate of a few simple aggregates, the
//! node can fold each match into a handful of integers instead, and hand up one row per
//! participant: what PG-Strom's GpuPreAgg does above its GpuJoin.
//!
//! # What
//!
//! [`Kind`] × [`Arg`]: `count(*)`, `count(x)` of any type, and `sum`, `min`, `max` of `int2`,
//! `int4` and `int8` ([`spec_of`] maps PostgreSQL's aggregate functions, by their fixed OIDs).
//! An [`Acc`] folds matches ([`Acc::add`]) and merges partial results ([`Acc::merge`]); its
//! [`Value`] is at once the partial result a participant hands up and the final result, of
//! the aggregate's own result type: `int8` for counts and for sums of `int2`/`int4`, `numeric`
//! for sums of `int8` (folded in 128 bits, as PostgreSQL's `int8` sum does), the argument's
//! type for `min`/`max`. So the partial rows need no state type of PostgreSQL's (whose
//! serialized forms differ between majors) and the final combine is plain arithmetic.
//!
//! Semantics are PostgreSQL's: a count is 0 over no rows, a sum, min or max NULL; NULL
//! arguments are skipped; a sum of `int2`/`int4` beyond `int8` is an error (22003, "bigint out
//! of range", as `int4_sum` raises), and so is a 128-bit overflow of an `int8` sum (which would
//! take 2^64 rows).

use crate::error::{Code, Result, UvmError};

/// What an aggregate computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    CountStar,
    Count,
    Sum,
    Min,
    Max,
}

/// The argument's type, as the node reads it (`Any` for counts, which only look at NULLs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    Any,
    Int2,
    Int4,
    Int8,
}

/// The aggregate function `aggfnoid` (pg_proc's OID) as a kind and argument type, if the node
/// computes it. These OIDs are fixed in PostgreSQL's catalog (`pg_proc.dat`), the same in 14
/// to 18.
pub fn spec_of(aggfnoid: u32) -> Option<(Kind, Arg)> {
    Some(match aggfnoid {
        2803 => (Kind::CountStar, Arg::Any), // count()
        2147 => (Kind::Count, Arg::Any),     // count("any")
        2107 => (Kind::Sum, Arg::Int8),
        2108 => (Kind::Sum, Arg::Int4),
        2109 => (Kind::Sum, Arg::Int2),
        2115 => (Kind::Max, Arg::Int8),
        2116 => (Kind::Max, Arg::Int4),
        2117 => (Kind::Max, Arg::Int2),
        2131 => (Kind::Min, Arg::Int8),
        2132 => (Kind::Min, Arg::Int4),
        2133 => (Kind::Min, Arg::Int2),
        _ => return None,
    })
}

/// Whether `a` is a plain call: no DISTINCT, ORDER BY, FILTER, variadic or split form, of this
/// query level (what the nodes compute, given [`spec_of`]'s function).
///
/// # Safety
/// `a` is an Aggref.
pub unsafe fn plain(a: *const pgrx::pg_sys::Aggref) -> bool {
    use pgrx::pg_sys;
    // SAFETY: forwarded contract.
    unsafe {
        (*a).agglevelsup == 0
            && (*a).aggfilter.is_null()
            && (*a).aggdistinct.is_null()
            && (*a).aggorder.is_null()
            && (*a).aggkind as u8 == b'n' // AGGKIND_NORMAL
            && !(*a).aggvariadic
            && (*a).aggsplit == pg_sys::AggSplit::AGGSPLIT_SIMPLE
    }
}

/// The type of an aggregate's result (and of its partial result).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    Int2,
    Int4,
    Int8,
    Numeric,
}

/// The result type of `kind` over `arg`.
pub fn out_of(kind: Kind, arg: Arg) -> Out {
    match (kind, arg) {
        (Kind::CountStar | Kind::Count, _) => Out::Int8,
        (Kind::Sum, Arg::Int8) => Out::Numeric,
        (Kind::Sum, _) => Out::Int8,
        (_, Arg::Int2) => Out::Int2,
        (_, Arg::Int4) => Out::Int4,
        (_, _) => Out::Int8,
    }
}

/// A partial or final result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    Null,
    /// An `int2`, `int4` or `int8` value.
    Int(i64),
    /// A `numeric` holding an integer.
    Big(i128),
}

/// One aggregate's running state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acc {
    pub kind: Kind,
    pub arg: Arg,
    /// Rows counted (counts).
    n: i64,
    /// The sum (sums).
    sum: i128,
    /// The least or greatest value so far (min, max).
    ext: i64,
    /// Some non-NULL value was folded (sums, min, max: NULL otherwise).
    any: bool,
}

fn out_of_range() -> UvmError {
    UvmError::new(Code::NumericValueOutOfRange, "bigint out of range")
}

impl Acc {
    pub fn new(kind: Kind, arg: Arg) -> Acc {
        Acc { kind, arg, n: 0, sum: 0, ext: 0, any: false }
    }

    /// Folds one joined row's argument (`None`: NULL; ignored by `count(*)`).
    #[inline]
    pub fn add(&mut self, v: Option<i64>) -> Result<()> {
        match (self.kind, v) {
            (Kind::CountStar, _) | (Kind::Count, Some(_)) => self.n += 1,
            (_, None) => {}
            (Kind::Sum, Some(v)) => {
                self.sum = self.sum.checked_add(v as i128).ok_or_else(out_of_range)?;
                self.any = true;
            }
            (Kind::Min, Some(v)) => {
                self.ext = if self.any { self.ext.min(v) } else { v };
                self.any = true;
            }
            (Kind::Max, Some(v)) => {
                self.ext = if self.any { self.ext.max(v) } else { v };
                self.any = true;
            }
        }
        Ok(())
    }

    /// Folds the result of probing a batch of keys against a table whose payloads are this
    /// aggregate's argument (never NULL): `n` matches whose payloads sum to `sum`. For
    /// `count(*)`, `count(x)` and `sum(x)` only (min and max need each value).
    pub fn add_matches(&mut self, n: u64, sum: i128) -> Result<()> {
        let n = i64::try_from(n).map_err(|_| out_of_range())?;
        match self.kind {
            Kind::CountStar | Kind::Count => self.n = self.n.checked_add(n).ok_or_else(out_of_range)?,
            Kind::Sum if n > 0 => {
                self.sum = self.sum.checked_add(sum).ok_or_else(out_of_range)?;
                self.any = true;
            }
            Kind::Sum => {}
            Kind::Min | Kind::Max => {
                return Err(UvmError::new(Code::SystemError, "GpuJoin: min or max folded from a probe's sum"));
            }
        }
        Ok(())
    }

    /// Merges a partial result of the same aggregate (as [`Acc::value`] gave it).
    pub fn merge(&mut self, v: Value) -> Result<()> {
        let bad = || UvmError::new(Code::ProtocolViolation, format!("a GpuJoin partial aggregate of the wrong form: {v:?}"));
        match (self.kind, v) {
            (_, Value::Null) => {}
            (Kind::CountStar | Kind::Count, Value::Int(n)) => self.n = self.n.checked_add(n).ok_or_else(out_of_range)?,
            (Kind::Sum, Value::Int(s)) => {
                self.sum = self.sum.checked_add(s as i128).ok_or_else(out_of_range)?;
                self.any = true;
            }
            (Kind::Sum, Value::Big(s)) => {
                self.sum = self.sum.checked_add(s).ok_or_else(out_of_range)?;
                self.any = true;
            }
            (Kind::Min | Kind::Max, Value::Int(x)) => self.add(Some(x))?,
            _ => return Err(bad()),
        }
        Ok(())
    }

    /// The result so far, of the aggregate's result type ([`out_of`]).
    pub fn value(&self) -> Result<Value> {
        Ok(match self.kind {
            Kind::CountStar | Kind::Count => Value::Int(self.n),
            _ if !self.any => Value::Null,
            Kind::Sum if self.arg == Arg::Int8 => Value::Big(self.sum),
            Kind::Sum => Value::Int(i64::try_from(self.sum).map_err(|_| out_of_range())?),
            Kind::Min | Kind::Max => Value::Int(self.ext),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: PostgreSQL's semantics over a plain list of values.
    fn reference(kind: Kind, arg: Arg, vals: &[Option<i64>]) -> Value {
        let some: Vec<i64> = vals.iter().flatten().copied().collect();
        match kind {
            Kind::CountStar => Value::Int(vals.len() as i64),
            Kind::Count => Value::Int(some.len() as i64),
            _ if some.is_empty() => Value::Null,
            Kind::Sum if arg == Arg::Int8 => Value::Big(some.iter().map(|&v| v as i128).sum()),
            Kind::Sum => Value::Int(some.iter().sum()),
            Kind::Min => Value::Int(*some.iter().min().expect("non-empty")),
            Kind::Max => Value::Int(*some.iter().max().expect("non-empty")),
        }
    }

    const ALL: [(Kind, Arg); 8] = [
        (Kind::CountStar, Arg::Any),
        (Kind::Count, Arg::Any),
        (Kind::Sum, Arg::Int4),
        (Kind::Sum, Arg::Int8),
        (Kind::Min, Arg::Int8),
        (Kind::Max, Arg::Int2),
        (Kind::Min, Arg::Int4),
        (Kind::Max, Arg::Int8),
    ];

    #[test]
    fn folds_and_merges_agree_with_the_reference_however_rows_are_split() {
        let vals: Vec<Option<i64>> = (0..200).map(|i| if i % 7 == 0 { None } else { Some((i * 37 % 101) - 50) }).collect();
        for (kind, arg) in ALL {
            let want = reference(kind, arg, &vals);
            // One participant.
            let mut one = Acc::new(kind, arg);
            for &v in &vals {
                one.add(v).unwrap();
            }
            assert_eq!(one.value().unwrap(), want, "{kind:?} {arg:?} folded");
            // Several participants (one of them empty), merged by a final one.
            for parts in [1usize, 3, 6] {
                let mut fin = Acc::new(kind, arg);
                for chunk in vals.chunks(vals.len() / parts + 1).chain(std::iter::once(&[][..])) {
                    let mut p = Acc::new(kind, arg);
                    for &v in chunk {
                        p.add(v).unwrap();
                    }
                    fin.merge(p.value().unwrap()).unwrap();
                }
                assert_eq!(fin.value().unwrap(), want, "{kind:?} {arg:?} over {parts} parts");
            }
        }
    }

    #[test]
    fn a_probes_matches_and_sum_are_the_same_as_each_match_folded() {
        let vals = [4i64, -9, 12, 0, 7];
        for (kind, arg) in [(Kind::CountStar, Arg::Any), (Kind::Count, Arg::Any), (Kind::Sum, Arg::Int4), (Kind::Sum, Arg::Int8)]
        {
            let (mut each, mut probe) = (Acc::new(kind, arg), Acc::new(kind, arg));
            for &v in &vals {
                each.add(Some(v)).unwrap();
            }
            probe.add_matches(3, vals[..3].iter().map(|&v| v as i128).sum()).unwrap();
            probe.add_matches(0, 0).unwrap();
            probe.add_matches(2, vals[3..].iter().map(|&v| v as i128).sum()).unwrap();
            assert_eq!(each.value().unwrap(), probe.value().unwrap(), "{kind:?} {arg:?}");
            let mut none = Acc::new(kind, arg);
            none.add_matches(0, 0).unwrap();
            assert_eq!(none.value().unwrap(), Acc::new(kind, arg).value().unwrap());
        }
        assert_eq!(Acc::new(Kind::Min, Arg::Int4).add_matches(1, 1).unwrap_err().code, Code::SystemError);
    }

    #[test]
    fn nothing_folded_is_zero_for_counts_and_null_otherwise() {
        for (kind, arg) in ALL {
            let v = Acc::new(kind, arg).value().unwrap();
            match kind {
                Kind::CountStar | Kind::Count => assert_eq!(v, Value::Int(0)),
                _ => assert_eq!(v, Value::Null),
            }
        }
    }

    #[test]
    fn int4_sums_beyond_int8_are_22003_and_int8_sums_go_to_128_bits() {
        let mut s4 = Acc::new(Kind::Sum, Arg::Int4);
        s4.merge(Value::Int(i64::MAX)).unwrap();
        s4.add(Some(1)).unwrap();
        assert_eq!(s4.value().unwrap_err().code, Code::NumericValueOutOfRange);
        let mut s8 = Acc::new(Kind::Sum, Arg::Int8);
        for _ in 0..4 {
            s8.add(Some(i64::MAX)).unwrap();
        }
        assert_eq!(s8.value().unwrap(), Value::Big(4 * i64::MAX as i128));
        let mut huge = Acc::new(Kind::Sum, Arg::Int8);
        huge.merge(Value::Big(i128::MAX)).unwrap();
        assert_eq!(huge.add(Some(1)).unwrap_err().code, Code::NumericValueOutOfRange);
    }

    #[test]
    fn a_partial_of_the_wrong_form_is_an_error() {
        let mut c = Acc::new(Kind::Count, Arg::Any);
        assert_eq!(c.merge(Value::Big(3)).unwrap_err().code, Code::ProtocolViolation);
        let mut m = Acc::new(Kind::Min, Arg::Int4);
        assert_eq!(m.merge(Value::Big(3)).unwrap_err().code, Code::ProtocolViolation);
    }

    #[test]
    fn result_types_are_postgresqls() {
        assert_eq!(out_of(Kind::CountStar, Arg::Any), Out::Int8);
        assert_eq!(out_of(Kind::Sum, Arg::Int2), Out::Int8);
        assert_eq!(out_of(Kind::Sum, Arg::Int4), Out::Int8);
        assert_eq!(out_of(Kind::Sum, Arg::Int8), Out::Numeric);
        assert_eq!(out_of(Kind::Min, Arg::Int2), Out::Int2);
        assert_eq!(out_of(Kind::Max, Arg::Int4), Out::Int4);
        assert_eq!(spec_of(2803), Some((Kind::CountStar, Arg::Any)));
        assert_eq!(spec_of(2100), None); // avg(int8)
    }
}
