//! Comparisons of integer expressions in a scan program: `a + b < 5`, `a % 7 = 3`, `x = y`.
//!
//! An expression is a postfix list of [`Step`]s over the row's column words (integer-like
//! columns, sign-extended: `cache`'s words), evaluated on a stack of at most [`MAX_DEPTH`]
//! values with PostgreSQL's integer arithmetic: each operator's result type ([`Width`]:
//! `int2`, `int4`, `int8`, as the operator PostgreSQL resolved) bounds its result, past it
//! the type's ERROR 22003 ("integer out of range"); `/` and `%` truncate toward zero, by zero an
//! ERROR 22012, and `x % -1` is 0 (as `int4mod`); a NULL operand makes the expression NULL, and
//! a comparison with NULL passes no filter. A [`Compare`] is a test as a range is: one
//! alternative of a clause.
//!
//! Bounded: at most [`MAX_STEPS`] steps a side, the stack depth checked when the program is
//! decoded ([`Compare::check`]), so evaluation never indexes past its stack.

use crate::error::{Code, Result, UvmError};

/// Steps of one side of a comparison, and the stack they may use.
pub const MAX_STEPS: usize = 32;
pub const MAX_DEPTH: usize = 16;

/// The result type of an operator: its bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    Int2,
    Int4,
    Int8,
}

impl Width {
    /// `v` (`None`: it overflowed `i64`) if the type holds it, else the type's ERROR.
    fn check(self, v: Option<i64>) -> Result<i64> {
        let (ok, name) = match self {
            Width::Int2 => (v.is_some_and(|v| i16::try_from(v).is_ok()), "smallint"),
            Width::Int4 => (v.is_some_and(|v| i32::try_from(v).is_ok()), "integer"),
            Width::Int8 => (v.is_some(), "bigint"),
        };
        match v {
            Some(v) if ok => Ok(v),
            _ => Err(UvmError::new(Code::NumericValueOutOfRange, format!("{name} out of range"))),
        }
    }

    pub fn code(self) -> u32 {
        match self {
            Width::Int2 => 2,
            Width::Int4 => 4,
            Width::Int8 => 8,
        }
    }

    pub fn from_code(c: u32) -> Option<Width> {
        Some(match c {
            2 => Width::Int2,
            4 => Width::Int4,
            8 => Width::Int8,
            _ => return None,
        })
    }
}

/// A binary operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

/// One step of a postfix expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Push column `c`'s word (NULL: a NULL).
    Col(usize),
    Const(i64),
    /// Pop two, push `a op b` (a below b).
    Bin(Op, Width),
    /// Pop one, push its negation.
    Neg(Width),
}

/// A comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Lt,
    Le,
    Eq,
    Ne,
    Ge,
    Gt,
}

impl Cmp {
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn from_code(c: u32) -> Option<Cmp> {
        [Cmp::Lt, Cmp::Le, Cmp::Eq, Cmp::Ne, Cmp::Ge, Cmp::Gt].get(c as usize).copied()
    }

    pub fn symbol(self) -> &'static str {
        ["<", "<=", "=", "<>", ">=", ">"][self as usize]
    }
}

/// `lhs cmp rhs`, both sides integer expressions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub lhs: Vec<Step>,
    pub cmp: Cmp,
    pub rhs: Vec<Step>,
}

fn bad(why: String) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, why)
}

/// The depth a postfix side reaches, or why it is no expression.
fn depth(steps: &[Step]) -> Result<usize> {
    if steps.is_empty() || steps.len() > MAX_STEPS {
        return Err(bad(format!("an expression of {} steps (1 to {MAX_STEPS})", steps.len())));
    }
    let (mut d, mut max) = (0usize, 0usize);
    for s in steps {
        match s {
            Step::Col(_) | Step::Const(_) => d += 1,
            Step::Bin(..) if d >= 2 => d -= 1,
            Step::Neg(_) if d >= 1 => {}
            _ => return Err(bad("an expression's operator lacks its operands".into())),
        }
        max = max.max(d);
    }
    if d != 1 || max > MAX_DEPTH {
        return Err(bad(format!("an expression leaves {d} values and needs a stack of {max} (at most {MAX_DEPTH})")));
    }
    Ok(max)
}

impl Compare {
    /// Whether evaluating it may raise an ERROR: it has an operator that may overflow or
    /// divide by zero. Only `%` by a constant other than 0 and `/` by one other than 0 and -1
    /// never do (in postfix, a constant right before the operator is its right operand).
    pub fn may_raise(&self) -> bool {
        [&self.lhs, &self.rhs].into_iter().any(|side| {
            side.iter().enumerate().any(|(i, s)| match s {
                Step::Bin(Op::Mod, _) => !matches!(i.checked_sub(1).map(|p| side[p]), Some(Step::Const(c)) if c != 0),
                Step::Bin(Op::Div, _) => !matches!(i.checked_sub(1).map(|p| side[p]), Some(Step::Const(c)) if c != 0 && c != -1),
                Step::Bin(..) | Step::Neg(_) => true,
                Step::Col(_) | Step::Const(_) => false,
            })
        })
    }

    /// Checks both sides are well-formed postfix expressions within the limits.
    pub fn check(&self) -> Result<()> {
        depth(&self.lhs)?;
        depth(&self.rhs)?;
        Ok(())
    }

    /// The columns it reads.
    pub fn columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.lhs.iter().chain(&self.rhs).filter_map(|s| if let Step::Col(c) = s { Some(*c) } else { None })
    }

    /// Whether the row passes: both sides evaluated, NULL failing.
    pub fn passes(&self, col: &mut dyn FnMut(usize) -> Result<Option<u64>>) -> Result<bool> {
        let (Some(a), Some(b)) = (eval(&self.lhs, col)?, eval(&self.rhs, col)?) else { return Ok(false) };
        Ok(match self.cmp {
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Ge => a >= b,
            Cmp::Gt => a > b,
        })
    }
}

/// One side's value (`None`: NULL). The steps were checked ([`Compare::check`]); a malformed
/// list is still an error, never a panic.
pub fn eval(steps: &[Step], col: &mut dyn FnMut(usize) -> Result<Option<u64>>) -> Result<Option<i64>> {
    let mut stack = [None::<i64>; MAX_DEPTH];
    let mut d = 0usize;
    let short = || bad("an expression's operator lacks its operands".into());
    for s in steps.iter().take(MAX_STEPS) {
        match *s {
            Step::Col(c) => {
                *stack.get_mut(d).ok_or_else(short)? = col(c)?.map(|w| w as i64);
                d += 1;
            }
            Step::Const(v) => {
                *stack.get_mut(d).ok_or_else(short)? = Some(v);
                d += 1;
            }
            Step::Neg(w) => {
                let top = stack.get_mut(d.wrapping_sub(1)).ok_or_else(short)?;
                if let Some(v) = *top {
                    *top = Some(w.check(v.checked_neg())?);
                }
            }
            Step::Bin(op, w) => {
                if d < 2 {
                    return Err(short());
                }
                let (a, b) = (stack[d - 2], stack[d - 1]);
                d -= 1;
                stack[d - 1] = match (a, b) {
                    (Some(a), Some(b)) => Some(apply(op, w, a, b)?),
                    _ => None,
                };
            }
        }
    }
    if d != 1 {
        return Err(short());
    }
    Ok(stack[0])
}

fn apply(op: Op, w: Width, a: i64, b: i64) -> Result<i64> {
    let zero = || UvmError::new(Code::DivisionByZero, "division by zero");
    match op {
        Op::Add => w.check(a.checked_add(b)),
        Op::Sub => w.check(a.checked_sub(b)),
        Op::Mul => w.check(a.checked_mul(b)),
        Op::Div if b == 0 => Err(zero()),
        Op::Div => w.check(a.checked_div(b)),
        Op::Mod if b == 0 => Err(zero()),
        // (PostgreSQL answers 0 where the quotient would overflow)
        Op::Mod if b == -1 => Ok(0),
        Op::Mod => w.check(a.checked_rem(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(steps: &[Step], row: &[Option<i64>]) -> Result<Option<i64>> {
        eval(steps, &mut |c| Ok(row[c].map(|v| v as u64)))
    }

    #[test]
    fn only_operators_may_raise() {
        use Step::*;
        let plain = Compare { lhs: vec![Col(0)], cmp: Cmp::Lt, rhs: vec![Const(5)] };
        assert!(!plain.may_raise());
        let two_cols = Compare { lhs: vec![Col(0)], cmp: Cmp::Eq, rhs: vec![Col(1)] };
        assert!(!two_cols.may_raise());
        let div = Compare { lhs: vec![Const(10), Col(0), Bin(Op::Div, Width::Int4)], cmp: Cmp::Gt, rhs: vec![Const(0)] };
        assert!(div.may_raise());
        let neg = Compare { lhs: vec![Col(0)], cmp: Cmp::Gt, rhs: vec![Col(1), Neg(Width::Int2)] };
        assert!(neg.may_raise());
        let add = Compare { lhs: vec![Col(0), Const(1), Bin(Op::Add, Width::Int4)], cmp: Cmp::Gt, rhs: vec![Const(0)] };
        assert!(add.may_raise());
        // by a constant: % never raises but by 0; / but by 0 and -1 (MIN / -1 overflows)
        let by = |op, c| Compare { lhs: vec![Col(0), Const(c), Bin(op, Width::Int8)], cmp: Cmp::Eq, rhs: vec![Const(0)] };
        assert!(!by(Op::Mod, 2).may_raise());
        assert!(!by(Op::Mod, -1).may_raise());
        assert!(by(Op::Mod, 0).may_raise());
        assert!(!by(Op::Div, 1000).may_raise());
        assert!(by(Op::Div, -1).may_raise());
        assert!(by(Op::Div, 0).may_raise());
    }

    #[test]
    fn arithmetic_is_postgresqls() {
        use Step::*;
        let i4 = Width::Int4;
        let row = [Some(7), Some(-2), None, Some(i64::from(i32::MIN)), Some(0)];
        assert_eq!(run(&[Col(0), Col(1), Bin(Op::Add, i4)], &row).unwrap(), Some(5));
        assert_eq!(run(&[Col(0), Col(1), Bin(Op::Div, i4)], &row).unwrap(), Some(-3), "truncated toward zero");
        assert_eq!(run(&[Col(0), Col(1), Bin(Op::Mod, i4)], &row).unwrap(), Some(1));
        assert_eq!(run(&[Col(1), Col(0), Bin(Op::Mod, i4)], &row).unwrap(), Some(-2));
        assert_eq!(run(&[Col(3), Const(-1), Bin(Op::Mod, i4)], &row).unwrap(), Some(0));
        assert_eq!(run(&[Col(0), Col(2), Bin(Op::Mul, i4)], &row).unwrap(), None, "NULL in, NULL out");
        let e = run(&[Col(3), Const(-1), Bin(Op::Div, i4)], &row).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (Code::NumericValueOutOfRange, "integer out of range"));
        let e = run(&[Col(3), Neg(i4)], &row).unwrap_err();
        assert_eq!(e.message, "integer out of range");
        let e = run(&[Col(0), Col(4), Bin(Op::Div, i4)], &row).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (Code::DivisionByZero, "division by zero"));
        let e = run(&[Const(300), Const(200), Bin(Op::Mul, Width::Int2)], &row).unwrap_err();
        assert_eq!(e.message, "smallint out of range");
        let e = run(&[Const(i64::MAX), Const(1), Bin(Op::Add, Width::Int8)], &row).unwrap_err();
        assert_eq!(e.message, "bigint out of range");
        assert_eq!(run(&[Const(i64::MIN), Const(-1), Bin(Op::Mod, Width::Int8)], &row).unwrap(), Some(0));
        let e = run(&[Const(i64::MIN), Const(-1), Bin(Op::Div, Width::Int8)], &row).unwrap_err();
        assert_eq!(e.message, "bigint out of range");
        // (the division by zero of a NULL row is not reached: NULL in, NULL out)
        assert_eq!(run(&[Col(2), Col(4), Bin(Op::Div, i4)], &row).unwrap(), None);
    }

    #[test]
    fn malformed_expressions_are_refused_not_panicked() {
        use Step::*;
        let row = [Some(1)];
        for bad in [vec![], vec![Bin(Op::Add, Width::Int8)], vec![Col(0), Col(0)], vec![Neg(Width::Int8)]] {
            let c = Compare { lhs: bad.clone(), cmp: Cmp::Eq, rhs: vec![Const(1)] };
            assert!(c.check().is_err(), "{bad:?}");
            assert!(run(&bad, &row).is_err(), "{bad:?}");
        }
        let deep: Vec<Step> = std::iter::repeat_n(Const(1), MAX_DEPTH + 1)
            .chain(std::iter::repeat_n(Bin(Op::Add, Width::Int8), MAX_DEPTH))
            .collect();
        assert!(Compare { lhs: deep.clone(), cmp: Cmp::Eq, rhs: vec![Const(1)] }.check().is_err());
        assert!(run(&deep, &row).is_err());
        let ok = Compare { lhs: vec![Col(0), Const(2), Bin(Op::Mul, Width::Int8)], cmp: Cmp::Gt, rhs: vec![Const(1)] };
        ok.check().unwrap();
        assert!(ok.passes(&mut |_| Ok(Some(1))).unwrap());
        assert!(!ok.passes(&mut |_| Ok(None)).unwrap(), "NULL passes no comparison");
    }
}
