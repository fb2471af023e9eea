use std::collections::BTreeMap;

use proptest::prelude::*;
use zerocopy::IntoBytes;

use super::*;
use crate::cache::{BlockBuilder, ColumnSpec, Encoding, MIN_BLOCK_ROWS};
use crate::gpujoin::table::{build, table_bytes, KeyType};
use crate::groups::{grow, init, Shape, Table as Groups};
use crate::testing::proptest_cases;

/// A fact row: (a, b, qty, price, region code); `None` is NULL.
type Row = (Option<i64>, Option<i64>, Option<i64>, Option<i64>, Option<u64>);

/// The fact table cached: blocks of MIN_BLOCK_ROWS rows.
fn cache(rows: &[Row]) -> (Layout, Vec<u8>) {
    let specs = [Encoding::Int4, Encoding::Int4, Encoding::Int4, Encoding::Int8, Encoding::DictCode].map(|encoding| ColumnSpec {
        encoding,
        attnum: 1,
        scale: 0,
    });
    let mut l = Layout::plan(1, &specs, MIN_BLOCK_ROWS).unwrap();
    let blocks: Vec<Vec<u8>> = rows
        .chunks(MIN_BLOCK_ROWS as usize)
        .map(|part| {
            let mut b = BlockBuilder::new(&l);
            for r in part {
                let w = |v: Option<i64>| v.map(|v| v as u64);
                b.push(&[w(r.0), w(r.1), w(r.2), w(r.3), r.4]).unwrap();
            }
            b.finish()
        })
        .collect();
    l.set_extent(blocks.len() as u64, rows.len() as u64).unwrap();
    let mut seg = vec![0u8; l.bytes_for(blocks.len() as u64) as usize];
    seg[..l.prefix().len()].copy_from_slice(&l.prefix());
    for (i, b) in blocks.iter().enumerate() {
        let (at, _) = l.block_at(i as u64).unwrap();
        seg[at as usize..at as usize + b.len()].copy_from_slice(b);
    }
    (l, seg)
}

/// A dimension's table of (key, payload) in 8-byte aligned memory.
fn dim(rows: &[(i64, i64)]) -> Vec<u64> {
    let mut mem = vec![0u64; (table_bytes(rows.len() as u64) as usize).div_ceil(8)];
    let r: Vec<(Option<i64>, i64)> = rows.iter().map(|&(k, p)| (Some(k), p)).collect();
    build(mem.as_mut_bytes(), KeyType::Int8, &r, 7).unwrap();
    mem
}

type Answers = BTreeMap<(i64, u64), (u64, i128, u64, Option<i64>)>;

/// The query the program stands for, as nested loops: qty in [lo, hi], region in `codes`,
/// a = dim A's key, b = dim B's key; group by (A's payload, region); count(*),
/// sum(price * qty), count(price), min(price - qty).
fn reference(rows: &[Row], a: &[(i64, i64)], b: &[(i64, i64)], (lo, hi): (i64, i64), codes: &[u64]) -> Answers {
    let mut m = Answers::new();
    for r in rows {
        let (Some(q), Some(c)) = (r.2, r.4) else { continue };
        if !(lo..=hi).contains(&q) || !codes.contains(&c) {
            continue;
        }
        for &(_, pa) in a.iter().filter(|d| Some(d.0) == r.0) {
            for _ in b.iter().filter(|d| Some(d.0) == r.1) {
                let e = m.entry((pa, c)).or_default();
                e.0 += 1;
                if let Some(p) = r.3 {
                    e.1 += i128::from(p * q);
                    e.2 += 1;
                    e.3 = Some(e.3.map_or(p - q, |x| x.min(p - q)));
                }
            }
        }
    }
    m
}

/// Runs the program over `rows`, from a group table of 16 slots grown whenever it is full: the
/// first `split` rows cached and scanned by [`run`], the others folded one by one by
/// [`fold_row`] (as the extension folds the rows appended to a cache).
fn scanned(
    rows: &[Row],
    a: &[(i64, i64)],
    b: &[(i64, i64)],
    (lo, hi): (i64, i64),
    codes: &[u64],
    split: usize,
) -> Result<Answers> {
    let (cached, appended) = rows.split_at(split.min(rows.len()));
    let (layout, seg) = cache(cached);
    let (da, db) = (dim(a), dim(b));
    let mut bits = vec![0u8; 8];
    for &c in codes {
        bits[c as usize / 8] |= 1 << (c % 8);
    }
    let program = Program {
        filters: vec![Filter::and(2, Test::Range { lo, hi }), Filter::and(4, Test::Codes(bits))],
        joins: vec![
            Join { col: 0, table: DimTable::view("a", da.as_bytes()).unwrap() },
            Join { col: 1, table: DimTable::view("b", db.as_bytes()).unwrap() },
        ],
        keys: vec![Source::Payload(0), Source::Col(4)],
        aggs: vec![
            (AggKind::CountStar, Input::Star),
            (AggKind::SumInt, Input::Mul(3, 2)),
            (AggKind::Count, Input::Col(3)),
            (AggKind::MinInt, Input::Sub(3, 2)),
        ],
    };
    let shape = Shape { key_words: program.key_words(), aggs: program.aggs.iter().map(|a| a.0).collect(), slot_count: 16 };
    let mut bytes = vec![0u8; shape.bytes() as usize];
    init(&mut bytes, &shape, 3).unwrap();
    let mut start = (0, 0);
    loop {
        let mut g = Groups::parse("g", &mut bytes).unwrap();
        match run(&program, &layout, &seg, &mut g, start)? {
            Progress::Done => break,
            Progress::Full { block, row, slots } => {
                let mut bigger = vec![0u8; g.shape().with_slots(slots).bytes() as usize];
                grow(&mut g, &mut bigger, slots).unwrap();
                bytes = bigger;
                start = (block, row);
            }
        }
    }
    let mut scratch = Scratch::default();
    for r in appended {
        let w = |v: Option<i64>| v.map(|v| v as u64);
        let words = [w(r.0), w(r.1), w(r.2), w(r.3), r.4];
        loop {
            let mut g = Groups::parse("g", &mut bytes).unwrap();
            match fold_row(&program, &mut g, &mut scratch, |c| Ok(words[c]))? {
                super::Row::Full(slots) => {
                    let mut bigger = vec![0u8; g.shape().with_slots(slots).bytes() as usize];
                    grow(&mut g, &mut bigger, slots).unwrap();
                    bytes = bigger;
                }
                super::Row::Folded | super::Row::Dropped => break,
            }
        }
    }
    let mut g = Groups::parse("g", &mut bytes).unwrap();
    Ok(g.groups()?
        .into_iter()
        .map(|(k, s)| {
            assert_eq!(k[2], 0, "no NULL key: the region is never NULL past its filter");
            ((k[0] as i64, k[1]), (s[0].0, groups::sum_int(s[1]), s[2].0, (s[3].1 != 0).then_some(s[3].0 as i64)))
        })
        .collect())
}

#[test]
fn a_star_join_with_filters_and_groups_is_the_nested_loops_answer() {
    // 3,000 rows over three blocks; dim B has a key twice (its rows count twice), and keys
    // without a match
    let rows: Vec<Row> = (0..3000i64)
        .map(|i| {
            let null = |v: i64, n: i64| (i % n != 0).then_some(v);
            (null(i % 50, 13), Some(i % 7), null(i % 40, 11), null(i * 1000, 17), Some((i % 5) as u64))
        })
        .collect();
    let a: Vec<(i64, i64)> = (0..45).map(|k| (k, k / 10)).collect();
    let b = vec![(0, 0), (1, 0), (1, 0), (2, 0), (3, 0), (5, 0)];
    let want = reference(&rows, &a, &b, (5, 30), &[0, 2, 3]);
    assert!(want.len() > 8, "groups enough to grow the table from 16 slots: {}", want.len());
    assert_eq!(scanned(&rows, &a, &b, (5, 30), &[0, 2, 3], rows.len()).unwrap(), want);
    // the last 1,200 rows appended: folded one by one into the scanned rows' table
    assert_eq!(scanned(&rows, &a, &b, (5, 30), &[0, 2, 3], rows.len() - 1200).unwrap(), want);
}

#[test]
fn an_overflowing_product_is_an_error() {
    let rows: Vec<Row> = vec![(Some(1), Some(1), Some(3), Some(i64::MAX / 2), Some(0))];
    for split in [0, 1] {
        let e = scanned(&rows, &[(1, 1)], &[(1, 0)], (0, 10), &[0], split).unwrap_err();
        assert_eq!(e.code, Code::NumericValueOutOfRange);
    }
}

#[test]
fn a_program_that_names_what_is_not_there_is_refused() {
    let (layout, seg) = cache(&[(Some(1), Some(1), Some(1), Some(1), Some(0))]);
    let shape = Shape { key_words: 1, aggs: vec![AggKind::CountStar], slot_count: 16 };
    let mut bytes = vec![0u8; shape.bytes() as usize];
    init(&mut bytes, &shape, 3).unwrap();
    let mut g = Groups::parse("g", &mut bytes).unwrap();
    let p = |filters, keys, aggs| Program { filters, joins: vec![], keys, aggs };
    let bad_filter = p(vec![Filter::and(9, Test::Range { lo: 0, hi: 1 })], vec![], vec![(AggKind::CountStar, Input::Star)]);
    assert!(run(&bad_filter, &layout, &seg, &mut g, (0, 0)).is_err());
    let bad_key = p(vec![], vec![Source::Payload(0)], vec![(AggKind::CountStar, Input::Star)]);
    assert!(run(&bad_key, &layout, &seg, &mut g, (0, 0)).is_err());
    let other_shape = p(vec![], vec![Source::Col(0)], vec![(AggKind::CountStar, Input::Star)]);
    assert!(run(&other_shape, &layout, &seg, &mut g, (0, 0)).is_err(), "two key words against one");
    let ok = p(vec![], vec![], vec![(AggKind::CountStar, Input::Star)]);
    assert_eq!(run(&ok, &layout, &seg, &mut g, (0, 0)).unwrap(), Progress::Done);
    assert_eq!(g.groups().unwrap(), vec![(vec![0], vec![(1, 0)])]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(proptest_cases(64)))]

    /// Any data and filter, any part of it appended: the program's groups are the nested
    /// loops' answer.
    #[test]
    fn scans_are_the_reference(
        rows in proptest::collection::vec(
            (proptest::option::of(0i64..30), proptest::option::of(0i64..6), proptest::option::of(-5i64..40),
             proptest::option::of(-1000i64..1000), proptest::option::of(0u64..6)),
            0..2500),
        a in proptest::collection::vec((0i64..30, 0i64..8), 0..40),
        b in proptest::collection::vec((0i64..6, Just(0i64)), 0..8),
        lo in -5i64..20,
        width in 0i64..30,
        codes in proptest::collection::vec(0u64..6, 0..6),
        split in 0usize..2600,
    ) {
        let want = reference(&rows, &a, &b, (lo, lo + width), &codes);
        prop_assert_eq!(scanned(&rows, &a, &b, (lo, lo + width), &codes, split).unwrap(), want);
    }
}

/// A filter as SQL's three-valued logic answers it: `None` for unknown (a comparison with NULL).
fn sql_test(f: &Filter, words: &[Option<u64>; 5]) -> Option<bool> {
    if let Test::Compare(c) = &f.test {
        let mut col = |i: usize| Ok(words[i]);
        let (a, b) = (expr::eval(&c.lhs, &mut col).unwrap()?, expr::eval(&c.rhs, &mut col).unwrap()?);
        return Some(match c.cmp {
            expr::Cmp::Lt => a < b,
            expr::Cmp::Le => a <= b,
            expr::Cmp::Eq => a == b,
            expr::Cmp::Ne => a != b,
            expr::Cmp::Ge => a >= b,
            expr::Cmp::Gt => a > b,
        });
    }
    match (&f.test, words[f.col]) {
        (Test::Compare(_), _) => unreachable!("answered above"),
        (Test::Null, v) => Some(v.is_none()),
        (_, None) => None,
        (Test::Range { lo, hi }, Some(w)) => Some((*lo..=*hi).contains(&(w as i64))),
        (Test::Codes(bits), Some(c)) => Some(bits.get(c as usize / 8).is_some_and(|b| b & (1 << (c % 8)) != 0)),
    }
}

/// Kleene's AND of ORs: the clauses as SQL evaluates `(f OR f ...) AND (...)`.
fn sql_clauses(filters: &[Filter], words: &[Option<u64>; 5]) -> Option<bool> {
    let mut clauses: Vec<Vec<Option<bool>>> = Vec::new();
    for f in filters {
        if !f.or || clauses.is_empty() {
            clauses.push(Vec::new());
        }
        clauses.last_mut().unwrap().push(sql_test(f, words));
    }
    let or = |c: &Vec<Option<bool>>| {
        if c.contains(&Some(true)) {
            Some(true)
        } else if c.contains(&None) {
            None
        } else {
            Some(false)
        }
    };
    let ors: Vec<Option<bool>> = clauses.iter().map(or).collect();
    if ors.contains(&Some(false)) {
        Some(false)
    } else if ors.contains(&None) {
        None
    } else {
        Some(true)
    }
}

fn a_test() -> impl Strategy<Value = Test> {
    use expr::{Cmp, Compare, Op, Step, Width};
    prop_oneof![
        (-5i64..40, 0i64..20).prop_map(|(lo, w)| Test::Range { lo, hi: lo + w }),
        Just(Test::Null),
        proptest::collection::vec(any::<u8>(), 0..2).prop_map(Test::Codes),
        // (column + column) cmp constant, over the first three (small integer) columns
        (0usize..3, 0usize..3, 0u32..6, -10i64..60).prop_map(|(a, b, cmp, k)| Test::Compare(Compare {
            lhs: vec![Step::Col(a), Step::Col(b), Step::Bin(Op::Add, Width::Int8)],
            cmp: Cmp::from_code(cmp).unwrap(),
            rhs: vec![Step::Const(k)],
        })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(proptest_cases(64)))]

    /// Clauses of alternatives, `IS NULL` among them: a row is folded exactly where SQL's
    /// three-valued `WHERE` is true.
    #[test]
    fn clauses_are_sql_where(
        rows in proptest::collection::vec(
            (proptest::option::of(0i64..30), proptest::option::of(0i64..6), proptest::option::of(-5i64..40),
             proptest::option::of(-1000i64..1000), proptest::option::of(0u64..12)),
            0..600),
        filters in proptest::collection::vec((0usize..5, a_test(), any::<bool>()), 0..7),
    ) {
        let filters: Vec<Filter> =
            filters.into_iter().enumerate().map(|(i, (col, test, or))| Filter { col, test, or: or && i > 0 }).collect();
        let program = Program {
            filters: filters.clone(),
            joins: vec![],
            keys: vec![],
            aggs: vec![(AggKind::CountStar, Input::Star), (AggKind::SumInt, Input::Col(3))],
        };
        let w = |v: Option<i64>| v.map(|v| v as u64);
        let (mut count, mut sum) = (0u64, 0i128);
        for r in &rows {
            if sql_clauses(&filters, &[w(r.0), w(r.1), w(r.2), w(r.3), r.4]) == Some(true) {
                count += 1;
                sum += i128::from(r.3.unwrap_or(0));
            }
        }
        let (layout, seg) = cache(&rows);
        let shape = Shape { key_words: 1, aggs: program.aggs.iter().map(|a| a.0).collect(), slot_count: 16 };
        let mut bytes = vec![0u8; shape.bytes() as usize];
        init(&mut bytes, &shape, 3).unwrap();
        let mut g = Groups::parse("g", &mut bytes).unwrap();
        prop_assert_eq!(run(&program, &layout, &seg, &mut g, (0, 0)).unwrap(), Progress::Done);
        let got = g.groups().unwrap();
        let (c, s) = got.first().map_or((0, 0), |(_, s)| (s[0].0, groups::sum_int(s[1])));
        prop_assert_eq!((c, s), (count, sum));
    }
}

#[test]
fn float4_inputs_are_widened_for_the_float_states() {
    // a cache of one float4 column (its words are f32 bits) and a group key
    let specs = [Encoding::Float4, Encoding::Int4].map(|encoding| ColumnSpec { encoding, attnum: 1, scale: 0 });
    let mut l = Layout::plan(1, &specs, MIN_BLOCK_ROWS).unwrap();
    let values = [Some(1.5f32), Some(-0.25), None, Some(f32::MAX), Some(f32::NAN)];
    let mut b = BlockBuilder::new(&l);
    for (i, v) in values.iter().enumerate() {
        b.push(&[v.map(|f| u64::from(f.to_bits())), Some((i / 2) as u64)]).unwrap();
    }
    let block = b.finish();
    l.set_extent(1, values.len() as u64).unwrap();
    let mut seg = vec![0u8; l.bytes_for(1) as usize];
    seg[..l.prefix().len()].copy_from_slice(&l.prefix());
    let (at, _) = l.block_at(0).unwrap();
    seg[at as usize..at as usize + block.len()].copy_from_slice(&block);
    let program = Program {
        filters: vec![],
        joins: vec![],
        keys: vec![Source::Col(1)],
        aggs: vec![
            (AggKind::SumFloat, Input::Float4(0)),
            (AggKind::MinFloat, Input::Float4(0)),
            (AggKind::MaxFloat, Input::Float4(0)),
        ],
    };
    let shape = Shape { key_words: 2, aggs: program.aggs.iter().map(|a| a.0).collect(), slot_count: 16 };
    let mut bytes = vec![0u8; shape.bytes() as usize];
    init(&mut bytes, &shape, 3).unwrap();
    let mut g = Groups::parse("g", &mut bytes).unwrap();
    assert_eq!(run(&program, &l, &seg, &mut g, (0, 0)).unwrap(), Progress::Done);
    let mut got = g.groups().unwrap();
    got.sort();
    let f = |s: (u64, u64)| f64::from_bits(s.0);
    // group 0: 1.5, -0.25; group 1: NULL, f32::MAX; group 2: NaN
    assert_eq!((f(got[0].1[0]), f(got[0].1[1]), f(got[0].1[2])), (1.25, -0.25, 1.5));
    assert_eq!((f(got[1].1[0]), f(got[1].1[1])), (f64::from(f32::MAX), f64::from(f32::MAX)));
    assert!(f(got[2].1[0]).is_nan() && f(got[2].1[2]).is_nan());
}
