use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::testing::proptest_cases;

/// Per key: count(*), count(v), sum(v), min(v), max(v).
type Answers = BTreeMap<u64, (u64, u64, i128, Option<i64>, Option<i64>)>;

const AGGS: [AggKind; 5] = [AggKind::CountStar, AggKind::Count, AggKind::SumInt, AggKind::MinInt, AggKind::MaxInt];

/// A table of `shape` in fresh bytes.
fn fresh(shape: &Shape) -> Vec<u8> {
    let mut b = vec![0u8; shape.bytes() as usize];
    init(&mut b, shape, 42).unwrap();
    b
}

/// Folds `rows` ((key, input)) into a table that starts at 16 slots and grows whenever full:
/// the final table's bytes.
fn fill(rows: &[(u64, Option<i64>)]) -> Vec<u8> {
    let mut bytes = fresh(&Shape { key_words: 1, aggs: AGGS.to_vec(), slot_count: MIN_SLOTS });
    for &(k, v) in rows {
        let inputs = [None, v.map(|v| v as u64), v.map(|v| v as u64), v.map(|v| v as u64), v.map(|v| v as u64)];
        loop {
            let mut t = Table::parse("g", &mut bytes).unwrap();
            match t.update(&[k], &inputs).unwrap() {
                Update::Done => break,
                Update::Full(slots) => {
                    let mut bigger = vec![0u8; t.shape().with_slots(slots).bytes() as usize];
                    grow(&mut t, &mut bigger, slots).unwrap();
                    bytes = bigger;
                }
            }
        }
    }
    bytes
}

/// What PostgreSQL answers.
fn reference(rows: &[(u64, Option<i64>)]) -> Answers {
    let mut m = Answers::new();
    for &(k, v) in rows {
        let e = m.entry(k).or_default();
        e.0 += 1;
        if let Some(v) = v {
            e.1 += 1;
            e.2 += i128::from(v);
            e.3 = Some(e.3.map_or(v, |m| m.min(v)));
            e.4 = Some(e.4.map_or(v, |m| m.max(v)));
        }
    }
    m
}

fn answers(bytes: &mut [u8]) -> Answers {
    let mut t = Table::parse("g", bytes).unwrap();
    t.groups()
        .unwrap()
        .into_iter()
        .map(|(k, s)| {
            let ext = |st: (u64, u64)| (st.1 != 0).then_some(st.0 as i64);
            (k[0], (s[0].0, s[1].0, sum_int(s[2]), ext(s[3]), ext(s[4])))
        })
        .collect()
}

#[test]
fn groups_grow_from_sixteen_slots_and_sums_do_not_overflow() {
    // 1,000 groups from a table of 16 slots; int8 extremes whose sum leaves 64 bits
    let rows: Vec<(u64, Option<i64>)> = (0..5000u64)
        .map(|i| (i % 1000, if i % 7 == 0 { None } else { Some(if i % 2 == 0 { i64::MAX } else { i64::MIN + 1 }) }))
        .collect();
    let mut bytes = fill(&rows);
    assert_eq!(answers(&mut bytes), reference(&rows));
    let t = Table::parse("g", &mut bytes).unwrap();
    assert_eq!(t.header().groups, 1000);
    assert_eq!(t.header().slot_count, Shape::slots_for(1000));
    let big = reference(&[(1, Some(i64::MAX)), (1, Some(i64::MAX)), (1, Some(i64::MAX))]);
    assert_eq!(answers(&mut fill(&[(1, Some(i64::MAX)), (1, Some(i64::MAX)), (1, Some(i64::MAX))])), big);
    assert_eq!(big[&1].2, 3 * i128::from(i64::MAX));
}

#[test]
fn float_states_follow_postgresql_order_and_flag_overflow() {
    let shape = Shape { key_words: 2, aggs: vec![AggKind::SumFloat, AggKind::MinFloat, AggKind::MaxFloat], slot_count: 16 };
    let mut bytes = fresh(&shape);
    let mut t = Table::parse("g", &mut bytes).unwrap();
    let f = |x: f64| Some(x.to_bits());
    for x in [1.5, f64::NAN, -2.0, -0.0] {
        assert_eq!(t.update(&[7, 8], &[f(x), f(x), f(x)]).unwrap(), Update::Done);
    }
    t.update(&[7, 9], &[f(f64::MAX), None, None]).unwrap();
    t.update(&[7, 9], &[f(f64::MAX), None, None]).unwrap();
    let g: BTreeMap<Vec<u64>, Vec<(u64, u64)>> = t.groups().unwrap().into_iter().collect();
    let a = &g[&vec![7, 8]];
    assert!(f64::from_bits(a[0].0).is_nan(), "a NaN makes the sum NaN");
    assert_eq!(f64::from_bits(a[1].0), -2.0);
    assert!(f64::from_bits(a[2].0).is_nan(), "NaN is above every number");
    let b = &g[&vec![7, 9]];
    assert_eq!((f64::from_bits(b[0].0), b[0].1), (f64::INFINITY, SEEN | OVERFLOWED));
    assert_eq!(b[1].1, 0, "no value seen: NULL");
}

#[test]
fn a_table_that_contradicts_itself_is_an_error_not_a_hang() {
    let shape = Shape { key_words: 1, aggs: vec![AggKind::CountStar], slot_count: 16 };
    let good = fresh(&shape);
    let fails = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        Table::parse("g", &mut b).map(|_| ()).unwrap_err().code
    };
    assert_eq!(fails(&|b| b.truncate(10)), Code::InvalidParameterValue);
    assert_eq!(fails(&|b| b[0] ^= 1), Code::InvalidParameterValue);
    assert_eq!(fails(&|b| b.truncate(b.len() - 1)), Code::InvalidParameterValue);
    assert_eq!(fails(&|b| b[12] = 0), Code::InvalidParameterValue, "no key words");
    assert_eq!(fails(&|b| b[16] = 17), Code::InvalidParameterValue, "slots not a power of two");
    assert_eq!(fails(&|b| b[24] = 9), Code::InvalidParameterValue, "more groups than half the slots");
    assert_eq!(fails(&|b| b[HEADER_BYTES as usize] = 99), Code::InvalidParameterValue, "an unknown aggregate");
    // every slot's tag set behind the header's back: a probe walks the table once and stops
    let mut b = good.clone();
    let t = Table::parse("g", &mut b).unwrap();
    let (at, step) = (t.header().slots_at as usize, t.header().slot_bytes as usize);
    for i in 0..16 {
        b[at + i * step..at + i * step + 8].copy_from_slice(&(u64::MAX - i as u64).to_le_bytes());
    }
    let mut t = Table::parse("g", &mut b).unwrap();
    assert_eq!(t.update(&[5], &[None]).unwrap_err().code, Code::InvalidParameterValue);
    assert!(t.groups().is_err(), "16 slots in use, the header says 0");
    // rows that do not match the shape
    let mut b = good.clone();
    let mut t = Table::parse("g", &mut b).unwrap();
    assert!(t.update(&[1, 2], &[None]).is_err());
    assert!(t.update(&[1], &[]).is_err());
    assert!(init(&mut [0u8; 8], &shape, 0).is_err());
    assert!(init(&mut vec![0u8; 1 << 12], &Shape { slot_count: 15, ..shape.clone() }, 0).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(proptest_cases(128)))]

    /// Any rows: the table's groups and states are PostgreSQL's answer, however often it grew;
    /// split between two participants and merged, the same.
    #[test]
    fn groups_are_the_reference_grown_or_merged(
        rows in proptest::collection::vec((0u64..200, proptest::option::of(any::<i64>())), 0..600),
        split in 0usize..600,
    ) {
        let want = reference(&rows);
        let mut whole = fill(&rows);
        prop_assert_eq!(answers(&mut whole), want.clone());
        let cut = split.min(rows.len());
        let (mut a, mut b) = (fill(&rows[..cut]), fill(&rows[cut..]));
        let groups = Table::parse("a", &mut a).unwrap().header().groups + Table::parse("b", &mut b).unwrap().header().groups;
        let shape = Shape { key_words: 1, aggs: AGGS.to_vec(), slot_count: Shape::slots_for(groups) };
        let mut into = fresh(&shape);
        {
            let mut to = Table::parse("m", &mut into).unwrap();
            for part in [&mut a, &mut b] {
                let mut from = Table::parse("p", part).unwrap();
                prop_assert_eq!(merge(&mut from, &mut to).unwrap(), Update::Done);
            }
        }
        prop_assert_eq!(answers(&mut into), want);
    }
}

#[test]
fn a_table_read_a_window_of_slots_at_a_time_has_its_groups_and_states_combine() {
    let rows: Vec<(u64, Option<i64>)> = (0..3000u64).map(|i| (i % 700, (i % 9 != 0).then_some(i as i64 - 1000))).collect();
    let mut bytes = fill(&rows);
    let whole = Table::parse("g", &mut bytes).unwrap().groups().unwrap();
    let head = Head::parse("g", &bytes[..Head::PREFIX_BYTES.min(bytes.len() as u64) as usize], bytes.len() as u64).unwrap();
    let (at, sb, n) = (head.header().slots_at as usize, head.header().slot_bytes as usize, head.header().slot_count as usize);
    let mut streamed = Vec::new();
    for window in bytes[at..at + sb * n].chunks(sb * 37) {
        head.groups_in(window, &mut streamed);
    }
    assert_eq!(streamed, whole);
    assert_eq!(streamed.len() as u64, head.header().groups);
    // a table's header alone, or one whose slots its segment cannot hold, is refused
    assert!(Head::parse("g", &bytes[..40], bytes.len() as u64).is_err());
    assert!(Head::parse("g", &bytes[..Head::PREFIX_BYTES as usize], (at + sb) as u64).is_err());
    // two parts' states combined are the whole's
    let (a, b) = rows.split_at(1234);
    let (mut ta, mut tb) = (fill(a), fill(b));
    let mut parts: BTreeMap<Vec<u64>, Vec<(u64, u64)>> = BTreeMap::new();
    for (k, s) in Table::parse("a", &mut ta)
        .unwrap()
        .groups()
        .unwrap()
        .into_iter()
        .chain(Table::parse("b", &mut tb).unwrap().groups().unwrap())
    {
        match parts.get_mut(&k) {
            Some(x) => combine_states(&AGGS, x, &s),
            None => {
                parts.insert(k, s);
            }
        }
    }
    let mut want: BTreeMap<Vec<u64>, Vec<(u64, u64)>> = whole.into_iter().collect();
    // (min and max of a part without values keep their empty state: compare the values)
    for m in [&mut parts, &mut want] {
        for s in m.values_mut() {
            for st in s.iter_mut().skip(3) {
                if st.1 == 0 {
                    *st = (0, 0);
                }
            }
        }
    }
    assert_eq!(parts, want);
}

/// `prime` gives unseen `min`/`max` states the kernels' identities, and the CPU still reads them
/// as unseen; a state that has seen a value keeps it; folding a value into an identity gives
/// what folding it into an empty state gives.
#[test]
fn prime_gives_unseen_min_max_their_identities() {
    let kinds = [AggKind::MinInt, AggKind::MaxInt, AggKind::MinFloat, AggKind::MaxFloat, AggKind::CountStar];
    let shape = Shape { key_words: 1, aggs: kinds.to_vec(), slot_count: 16 };
    let mut bytes = vec![0u8; shape.bytes() as usize];
    init(&mut bytes, &shape, 7).unwrap();
    let mut t = Table::parse("g", &mut bytes).unwrap();
    assert_eq!(t.update(&[1], &[None, None, None, None, None]).unwrap(), Update::Done);
    let seen = [Some(5u64), Some(-3i64 as u64), Some(2.5f64.to_bits()), Some(f64::NAN.to_bits()), None];
    assert_eq!(t.update(&[2], &seen).unwrap(), Update::Done);
    t.prime().unwrap();
    let mut groups = t.groups().unwrap();
    groups.sort();
    let (unseen, kept) = (&groups[0].1, &groups[1].1);
    let identities: Vec<Option<u64>> = kinds.iter().map(|k| identity(*k)).collect();
    for (a, id) in identities.iter().enumerate() {
        assert_eq!(unseen[a], (id.unwrap_or(if a == 4 { 1 } else { 0 }), 0), "aggregate {a}");
        assert_eq!(unseen[a].1, 0, "still unseen");
    }
    assert_eq!(kept[0], (5, 1));
    assert_eq!(kept[1], (-3i64 as u64, 1));
    assert_eq!(kept[2], (2.5f64.to_bits(), 1));
    assert!(f64::from_bits(kept[3].0).is_nan());
    // The identities are what the kernels' one-atomic folds assume: min(identity, v) = v.
    for v in [i64::MIN, -1, 0, 1, i64::MAX] {
        assert_eq!((identity(AggKind::MinInt).unwrap() as i64).min(v), v);
        assert_eq!((identity(AggKind::MaxInt).unwrap() as i64).max(v), v);
    }
    for v in [f64::NEG_INFINITY, -1.0, -0.0, 0.0, 1.0, f64::INFINITY, f64::NAN] {
        let (lo_min, lo_max) =
            (f64::from_bits(identity(AggKind::MinFloat).unwrap()), f64::from_bits(identity(AggKind::MaxFloat).unwrap()));
        // PostgreSQL's order: NaN above every number.
        let below = |a: f64, b: f64| !a.is_nan() && (b.is_nan() || a < b);
        assert!(v.is_nan() || below(v, lo_min), "{v} below the min identity");
        assert!(v == f64::NEG_INFINITY || below(lo_max, v), "{v} above the max identity");
    }
}
