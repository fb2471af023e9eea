//! Comparisons of a `float4`/`float8` column with a constant as ranges of the column's words,
//! so that a program's plain range test (`Test::Range`, the kernels' too) filters floats.
//!
//! A cache keeps a float's bits as its word (`cache::Encoding`: a `float8`'s 64 bits, a
//! `float4`'s 32 zero-extended), and a range test compares words as signed integers. Bits are
//! not ordered as values are: negative values count down as their bits count up, `-0` and `+0`
//! are two words of one value, and NaNs are many words. But PostgreSQL's order of floats (every
//! NaN equal to every other and above `+Infinity`, `-0 = +0`) maps each comparison with a
//! constant onto at most four runs of words: a value range's non-negative part (words rising
//! with the value, `+0` from word 0), its non-positive part (the sign bit and the magnitude
//! falling as the value rises, `-0` the magnitude 0), and the two runs of NaN words (positive
//! and negative). The mapping goes through a key, `±magnitude`, which orders every non-NaN
//! value as PostgreSQL does and gives `-0` and `+0` one key (0).

/// A comparison's operator (a btree strategy and `<>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatCmp {
    Lt,
    Le,
    Eq,
    Ge,
    Gt,
    Ne,
}

/// The words of a float width: the sign bit, the magnitude of infinity.
struct Width {
    sign: u64,
    inf: i64,
}

const DOUBLE: Width = Width { sign: 1 << 63, inf: 0x7FF0_0000_0000_0000 };
const SINGLE: Width = Width { sign: 1 << 31, inf: 0x7F80_0000 };

impl Width {
    fn key(&self, bits: u64) -> i64 {
        let mag = (bits & (self.sign - 1)) as i64;
        if bits & self.sign != 0 {
            -mag
        } else {
            mag
        }
    }

    /// The words of the non-NaN keys `a..=b` (`a <= b`): at most two runs.
    fn keys(&self, a: i64, b: i64, out: &mut Vec<(i64, i64)>) {
        // (a float8's word is its bits as a signed integer; a float4's its 32 bits, zero-extended)
        let word = |x: u64| x as i64;
        // non-negative values: the word is the key
        if a.max(0) <= b {
            out.push((a.max(0), b));
        }
        // non-positive values: the sign bit and the magnitude, which falls as the key rises
        if a <= b.min(0) {
            let (lo, hi) = ((-b.min(0)) as u64, (-a) as u64);
            out.push((word(self.sign | lo), word(self.sign | hi)));
        }
    }

    /// The NaN words: positive ones (above infinity's) and negative ones.
    fn nans(&self, out: &mut Vec<(i64, i64)>) {
        let top = self.sign - 1; // every bit but the sign
        let word = |x: u64| -> i64 { x as i64 };
        out.push((self.inf + 1, word(top)));
        out.push((word(self.sign | (self.inf as u64 + 1)), word(self.sign | top)));
    }
}

/// The ranges of words (inclusive, compared as signed integers) of a `float8` column (`double`)
/// or a `float4` one whose values satisfy `column <cmp> c` by PostgreSQL's rules; `c` is the
/// constant in the column's type (a `float4` constant widened exactly). Empty: never true.
pub fn float_ranges(double: bool, cmp: FloatCmp, c: f64) -> Vec<(i64, i64)> {
    let w = if double { DOUBLE } else { SINGLE };
    let mut out = Vec::new();
    let (lo, hi) = (-w.inf, w.inf);
    if c.is_nan() {
        // NaN is above every other value and equal to every NaN
        match cmp {
            FloatCmp::Lt | FloatCmp::Ne => w.keys(lo, hi, &mut out),
            FloatCmp::Le => {
                w.keys(lo, hi, &mut out);
                w.nans(&mut out);
            }
            FloatCmp::Eq | FloatCmp::Ge => w.nans(&mut out),
            FloatCmp::Gt => {}
        }
        return out;
    }
    let bits = if double { c.to_bits() } else { u64::from((c as f32).to_bits()) };
    let k = w.key(bits);
    match cmp {
        FloatCmp::Lt => {
            if k > lo {
                w.keys(lo, k - 1, &mut out)
            }
        }
        FloatCmp::Le => w.keys(lo, k, &mut out),
        FloatCmp::Eq => w.keys(k, k, &mut out),
        FloatCmp::Ge => {
            w.keys(k, hi, &mut out);
            w.nans(&mut out);
        }
        FloatCmp::Gt => {
            if k < hi {
                w.keys(k + 1, hi, &mut out);
            }
            w.nans(&mut out);
        }
        FloatCmp::Ne => {
            if k > lo {
                w.keys(lo, k - 1, &mut out);
            }
            if k < hi {
                w.keys(k + 1, hi, &mut out);
            }
            w.nans(&mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PostgreSQL's comparison of floats: NaNs equal and above everything, -0 = +0.
    fn pg_cmp(a: f64, b: f64) -> std::cmp::Ordering {
        match (a.is_nan(), b.is_nan()) {
            (true, true) => std::cmp::Ordering::Equal,
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            _ => a.partial_cmp(&b).expect("not NaN"),
        }
    }

    fn holds(cmp: FloatCmp, o: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::*;
        match cmp {
            FloatCmp::Lt => o == Less,
            FloatCmp::Le => o != Greater,
            FloatCmp::Eq => o == Equal,
            FloatCmp::Ge => o != Less,
            FloatCmp::Gt => o == Greater,
            FloatCmp::Ne => o != Equal,
        }
    }

    #[test]
    fn ranges_of_words_answer_as_postgresql_compares() {
        let cmps = [FloatCmp::Lt, FloatCmp::Le, FloatCmp::Eq, FloatCmp::Ge, FloatCmp::Gt, FloatCmp::Ne];
        let nan_neg = f64::from_bits(f64::NAN.to_bits() | (1 << 63));
        let other_nan = f64::from_bits(0x7FF0_0000_0000_0001);
        let mut values = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            3.5,
            -3.5,
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            5e-324,
            -5e-324,
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            nan_neg,
            other_nan,
            1e300,
            -2.25e-10,
        ];
        // and a spread of others (a fixed generator: the test is the same every run)
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..400 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(f64::from_bits(x));
        }
        for double in [true, false] {
            let vals: Vec<f64> = values.iter().map(|&v| if double { v } else { f64::from(v as f32) }).collect();
            for &c in &vals {
                for cmp in cmps {
                    let ranges = float_ranges(double, cmp, c);
                    assert!(ranges.len() <= 6);
                    for &v in &vals {
                        let word = if double { v.to_bits() as i64 } else { i64::from((v as f32).to_bits()) };
                        let inside = ranges.iter().any(|&(lo, hi)| lo <= word && word <= hi);
                        assert_eq!(
                            inside,
                            holds(cmp, pg_cmp(v, c)),
                            "{v:e} {cmp:?} {c:e} (float{}): word {word:#x}, ranges {ranges:x?}",
                            if double { 8 } else { 4 }
                        );
                    }
                }
            }
        }
    }
}
