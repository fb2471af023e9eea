//! The GpuJoin node's join key: every equality clause the node hashes, folded into the one
//! 64-bit key its table holds. Plain Rust.
//!
//! A join `ON o.a = i.a AND o.b = i.b` must hash both clauses together: hashing the first alone
//! forms every pair of the first key (200,000 rows a side with ten values of `a` are 4 billion
//! pairs) before the second clause filters them. The node therefore takes every clause it can
//! hash (a plain column of each side, one of the integer-like types, the type's own equality)
//! into one key, in one of three forms:
//!
//! - [`Form::Single`]: one clause; the key is the column's value (the table's key type is the
//!   column's: int4 for int2, int4 and date, int8 for int8, timestamp and timestamptz).
//! - [`Form::Packed`]: several clauses whose widths add up to at most 64 bits (two int4, four
//!   int2, an int4 and two int2...): the values side by side in one int8. Packing is injective,
//!   so equal keys mean equal columns: the join needs no recheck, and the aggregate mode (which
//!   counts matches without looking at the rows) may run.
//! - [`Form::Hashed`]: wider combinations: a 64-bit hash of all the values. Equal columns give
//!   equal keys; unequal columns collide with probability about 2^-64 per pair, so every key
//!   clause is checked again on each pair (the node's qual keeps them), and the aggregate mode
//!   is declined.
//!
//! The outer and inner sides compose their keys with the same function, so a batch of outer
//! keys meets the table's keys exactly as single-column keys do.

use crate::checksum::mix;
use crate::gpujoin::table::KeyType;

/// How the key columns form the table's key (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    Single,
    Packed,
    Hashed,
}

impl Form {
    /// The form for key columns of `bits` widths (in the order of the clauses).
    pub fn of(bits: &[u32]) -> Form {
        match bits {
            [_] => Form::Single,
            _ if bits.iter().sum::<u32>() <= 64 => Form::Packed,
            _ => Form::Hashed,
        }
    }

    /// Whether equal keys mean equal columns (no recheck of the key clauses is needed).
    pub fn exact(self) -> bool {
        self != Form::Hashed
    }

    /// Stored in a plan's private list.
    pub fn code(self) -> i64 {
        match self {
            Form::Single => 0,
            Form::Packed => 1,
            Form::Hashed => 2,
        }
    }

    pub fn from_code(c: i64) -> Option<Form> {
        [Form::Single, Form::Packed, Form::Hashed].into_iter().find(|f| f.code() == c)
    }

    /// EXPLAIN's word for it.
    pub fn label(self) -> &'static str {
        match self {
            Form::Single => "single",
            Form::Packed => "packed",
            Form::Hashed => "hashed, rechecked",
        }
    }
}

/// The key of one row, from its key columns' values (each sign-extended from its width), in
/// the order of the clauses.
#[derive(Clone, Debug)]
pub struct Composer {
    form: Form,
    bits: Vec<u32>,
}

/// The starting value of a hashed key (any constant: both sides use the same).
const HASH_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

impl Composer {
    pub fn new(bits: Vec<u32>) -> Composer {
        Composer { form: Form::of(&bits), bits }
    }

    pub fn form(&self) -> Form {
        self.form
    }

    /// The table's key type: the column's for a single clause, int8 for a composite key.
    pub fn key_type(&self) -> KeyType {
        match (self.form, self.bits.as_slice()) {
            (Form::Single, [b]) if *b <= 32 => KeyType::Int4,
            _ => KeyType::Int8,
        }
    }

    /// Key columns.
    pub fn len(&self) -> usize {
        self.bits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }

    /// Folds the value `v` of key column `i` into `acc` (start from [`Composer::start`]).
    #[inline]
    pub fn add(&self, acc: u64, i: usize, v: i64) -> u64 {
        match self.form {
            Form::Single => v as u64,
            Form::Packed => {
                let b = self.bits[i];
                let mask = if b >= 64 { u64::MAX } else { (1u64 << b) - 1 };
                (acc << b.min(63)) | (v as u64 & mask)
            }
            Form::Hashed => mix(acc ^ mix(v as u64 ^ (i as u64).wrapping_mul(HASH_SEED))),
        }
    }

    #[inline]
    pub fn start(&self) -> u64 {
        match self.form {
            Form::Hashed => HASH_SEED,
            _ => 0,
        }
    }

    /// The key of `vals` (one value per key column).
    pub fn key(&self, vals: &[i64]) -> i64 {
        vals.iter().enumerate().fold(self.start(), |acc, (i, &v)| self.add(acc, i, v)) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_follow_the_widths() {
        assert_eq!(Form::of(&[64]), Form::Single);
        assert_eq!(Form::of(&[32, 32]), Form::Packed);
        assert_eq!(Form::of(&[16, 16, 32]), Form::Packed);
        assert_eq!(Form::of(&[32, 64]), Form::Hashed);
        assert_eq!(Form::of(&[32, 32, 16]), Form::Hashed);
        for f in [Form::Single, Form::Packed, Form::Hashed] {
            assert_eq!(Form::from_code(f.code()), Some(f));
        }
        assert_eq!(Form::from_code(3), None);
        assert_eq!(Composer::new(vec![16]).key_type(), KeyType::Int4);
        assert_eq!(Composer::new(vec![64]).key_type(), KeyType::Int8);
        assert_eq!(Composer::new(vec![16, 16]).key_type(), KeyType::Int8);
    }

    #[test]
    fn a_single_key_is_the_value() {
        let c = Composer::new(vec![32]);
        for v in [0, -1, i32::MIN as i64, i32::MAX as i64] {
            assert_eq!(c.key(&[v]), v);
        }
        assert_eq!(Composer::new(vec![64]).key(&[i64::MIN]), i64::MIN);
    }

    #[test]
    fn packed_keys_are_injective_over_the_columns_ranges() {
        let c = Composer::new(vec![32, 32]);
        let vals = [i32::MIN as i64, -2, -1, 0, 1, 2, i32::MAX as i64];
        let mut seen = std::collections::HashMap::new();
        for &a in &vals {
            for &b in &vals {
                assert_eq!(seen.insert(c.key(&[a, b]), (a, b)), None, "{a} {b}");
            }
        }
        // Order matters: (1, 2) and (2, 1) differ.
        assert_ne!(c.key(&[1, 2]), c.key(&[2, 1]));
        let c = Composer::new(vec![16, 16, 16]);
        assert_ne!(c.key(&[-1, 0, 0]), c.key(&[0, -1, -1]));
        assert_eq!(c.key(&[0, 0, -1]), 0xffff);
    }

    #[test]
    fn hashed_keys_agree_on_equal_values_and_spread_the_rest() {
        let c = Composer::new(vec![64, 64]);
        assert_eq!(c.form(), Form::Hashed);
        assert_eq!(c.key(&[5, 7]), c.key(&[5, 7]));
        assert_ne!(c.key(&[5, 7]), c.key(&[7, 5]));
        let mut seen = std::collections::HashSet::new();
        for a in -300..300i64 {
            for b in [i64::MIN, -1, 0, 1, a, a << 40] {
                seen.insert((a, b, c.key(&[a, b])));
            }
        }
        let keys: std::collections::HashSet<i64> = seen.iter().map(|x| x.2).collect();
        let pairs: std::collections::HashSet<(i64, i64)> = seen.iter().map(|x| (x.0, x.1)).collect();
        assert_eq!(keys.len(), pairs.len(), "no collision among these");
    }
}
