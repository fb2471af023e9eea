use proptest::prelude::*;

use super::dict::{concat, in_use_len, Dict, DictBuilder, DictHeader, Reserved, DICT_HEADER_BYTES};
use super::*;
use crate::testing::proptest_cases;

fn spec(encoding: Encoding) -> ColumnSpec {
    ColumnSpec { encoding, attnum: 1, scale: if encoding == Encoding::Numeric { 2 } else { 0 } }
}

/// A laid-out cache of `blocks` blocks in fresh bytes (prefix written).
fn laid_out(specs: &[ColumnSpec], block_rows: u64, blocks: u64, rows: u64) -> (Layout, Vec<u8>) {
    let mut l = Layout::plan(42, specs, block_rows).unwrap();
    l.set_extent(blocks, rows).unwrap();
    let mut seg = vec![0u8; l.bytes_for(blocks) as usize];
    let p = l.prefix();
    seg[..p.len()].copy_from_slice(&p);
    (l, seg)
}

#[test]
fn every_area_is_aligned_apart_and_inside_its_block() {
    let all: Vec<ColumnSpec> = Encoding::ALL.iter().map(|&e| spec(e)).collect();
    let l = Layout::plan(1, &all, MIN_BLOCK_ROWS).unwrap();
    let h = l.header();
    assert_eq!(h.data_offset % ALIGN, 0);
    assert_eq!(h.block_bytes % ALIGN, 0);
    let mut areas: Vec<(u64, u64)> = Vec::new();
    for c in l.columns() {
        assert_eq!(c.values_at % ALIGN, 0);
        assert_eq!(c.nulls_at % ALIGN, 0);
        areas.push((c.values_at, c.values_at + MIN_BLOCK_ROWS * u64::from(c.width)));
        areas.push((c.nulls_at, c.nulls_at + MIN_BLOCK_ROWS / 8));
    }
    areas.sort_unstable();
    for w in areas.windows(2) {
        assert!(w[0].1 <= w[1].0, "{:?} overlaps {:?}", w[0], w[1]);
    }
    assert!(areas.last().unwrap().1 <= h.block_bytes);
    assert!(areas[0].0 >= BLOCK_HEADER_BYTES, "the block's header comes first");
    // one int4 column of a full block: the block's header, its values, its bitmap (1/32 of
    // them), nothing else
    let one = Layout::plan(1, &[spec(Encoding::Int4)], DEFAULT_BLOCK_ROWS).unwrap();
    assert_eq!(one.header().block_bytes, BLOCK_HEADER_BYTES + DEFAULT_BLOCK_ROWS * 4 + DEFAULT_BLOCK_ROWS / 8);
}

#[test]
fn impossible_plans_are_refused() {
    let int4 = spec(Encoding::Int4);
    assert!(Layout::plan(1, &[], MIN_BLOCK_ROWS).is_err());
    assert!(Layout::plan(1, &vec![int4; MAX_COLUMNS as usize + 1], MIN_BLOCK_ROWS).is_err());
    for rows in [0, 1, MIN_BLOCK_ROWS / 2, MIN_BLOCK_ROWS + 1, MAX_BLOCK_ROWS * 2] {
        assert!(Layout::plan(1, &[int4], rows).is_err(), "{rows} rows per block");
    }
    for scale in [-1, MAX_NUMERIC_SCALE + 1] {
        let e = Layout::plan(1, &[ColumnSpec { encoding: Encoding::Numeric, attnum: 1, scale }], MIN_BLOCK_ROWS).unwrap_err();
        assert_eq!(e.code, Code::InvalidParameterValue);
    }
    let mut l = Layout::plan(1, &[int4], MIN_BLOCK_ROWS).unwrap();
    assert!(l.set_extent(1, MIN_BLOCK_ROWS + 1).is_err());
}

#[test]
fn values_of_every_encoding_round_trip_with_nulls_across_blocks() {
    let specs: Vec<ColumnSpec> = Encoding::ALL.iter().map(|&e| spec(e)).collect();
    let rows = MIN_BLOCK_ROWS * 2 + 7;
    let (l, mut seg) = laid_out(&specs, MIN_BLOCK_ROWS, 3, rows);
    let word = |e: Encoding, r: u64| -> Option<u64> {
        (r % 5 != 3).then(|| match e {
            Encoding::Bool => r & 1,
            Encoding::Int2 => (r as i16).wrapping_sub(1000) as i64 as u64,
            Encoding::Float4 => (r as f32 * -0.5).to_bits() as u64,
            Encoding::Float8 => (r as f64 * 1.25).to_bits(),
            Encoding::DictCode => r * 3,
            _ => (r as i64 - 5000) as u64,
        })
    };
    // rows dense from block 0; the last block partly full
    let at = |i: u64| (i / MIN_BLOCK_ROWS, i % MIN_BLOCK_ROWS);
    for i in 0..rows {
        let (b, r) = at(i);
        for (c, &e) in Encoding::ALL.iter().enumerate() {
            l.put(&mut seg, c, b, r, word(e, i)).unwrap();
        }
    }
    for b in 0..3 {
        l.set_block_rows(&mut seg, b, (rows - b * MIN_BLOCK_ROWS).min(MIN_BLOCK_ROWS)).unwrap();
    }
    let parsed = Layout::parse("c", &seg, seg.len() as u64).unwrap();
    assert_eq!(parsed, l);
    assert_eq!(parsed.block_rows(&seg, 2).unwrap(), 7);
    for i in 0..rows {
        let (b, r) = at(i);
        let n = parsed.block_rows(&seg, b).unwrap();
        for (c, &e) in Encoding::ALL.iter().enumerate() {
            assert_eq!(parsed.get(&seg, c, b, n, r), Some(word(e, i)), "row {i}, {e:?}");
        }
    }
    assert_eq!(parsed.get(&seg, 0, 2, 7, 7), None, "past the block's rows");
    assert_eq!(parsed.get(&seg, 0, 3, MIN_BLOCK_ROWS, 0), None, "past the blocks");
    // the CPU fold over an int8 column
    let c8 = Encoding::ALL.iter().position(|&e| e == Encoding::Int8).unwrap();
    let want: Vec<i64> = (0..rows).filter_map(|i| word(Encoding::Int8, i)).map(|w| w as i64).collect();
    assert_eq!(parsed.fold_ints(&seg, c8).unwrap(), (want.len() as u64, want.iter().map(|&v| i128::from(v)).sum()));
    let cf = Encoding::ALL.iter().position(|&e| e == Encoding::Float8).unwrap();
    assert_eq!(parsed.fold_ints(&seg, cf).unwrap_err().code, Code::DatatypeMismatch);
    // a block that claims more rows than it can hold (overwritten): an error, not a long walk
    let (b1, _) = l.block_at(1).unwrap();
    let mut bad = seg.clone();
    bad[b1 as usize..b1 as usize + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(parsed.block_rows(&bad, 1).unwrap_err().code, Code::InvalidParameterValue);
    assert!(parsed.fold_ints(&bad, c8).is_err());
    assert!(l.set_block_rows(&mut seg, 0, MIN_BLOCK_ROWS + 1).is_err());
    assert!(l.set_block_rows(&mut seg, 3, 1).is_err());
    // a word an encoding cannot hold, a row outside the blocks or the bytes
    let c2 = Encoding::ALL.iter().position(|&e| e == Encoding::Int2).unwrap();
    assert!(l.put(&mut seg, c2, 0, 0, Some(1 << 20)).is_err());
    assert!(l.put(&mut seg, 0, 0, 0, Some(2)).is_err(), "a bool is 0 or 1");
    assert!(l.put(&mut seg, 0, 3, 0, Some(1)).is_err());
    assert!(l.put(&mut seg, 0, 0, MIN_BLOCK_ROWS, Some(1)).is_err());
    let last = Encoding::ALL.len() - 1;
    let (nat, _) = l.null_at(last, 2, 6).unwrap();
    assert!(l.put(&mut seg[..nat as usize], last, 2, 6, None).is_err());
    assert_eq!(l.get(&seg[..nat as usize], last, 2, 7, 6), None);
    // a NULL written over a value and a value over a NULL
    l.put(&mut seg, c8, 0, 1, None).unwrap();
    assert_eq!(l.get(&seg, c8, 0, 2, 1), Some(None));
    l.put(&mut seg, c8, 0, 1, Some(7)).unwrap();
    assert_eq!(l.get(&seg, c8, 0, 2, 1), Some(Some(7)));
}

#[test]
fn blocks_built_apart_and_copied_into_place_read_back() {
    let specs = [spec(Encoding::Int4), spec(Encoding::Numeric), spec(Encoding::Bool)];
    let mut l = Layout::plan(7, &specs, MIN_BLOCK_ROWS).unwrap();
    let row = |i: u64| [Some((i as i64 - 100) as u64), (!i.is_multiple_of(3)).then_some(i * 100), Some(i & 1)];
    // two workers' blocks: one full, one partly
    let mut blocks = Vec::new();
    for (first, n) in [(0u64, MIN_BLOCK_ROWS), (MIN_BLOCK_ROWS, 10)] {
        let mut b = BlockBuilder::new(&l);
        for i in first..first + n {
            b.push(&row(i)).unwrap();
        }
        assert_eq!(b.is_full(), n == MIN_BLOCK_ROWS);
        if b.is_full() {
            assert!(b.push(&row(0)).is_err(), "a full block takes no more rows");
        }
        blocks.push(b.finish());
    }
    l.set_extent(2, MIN_BLOCK_ROWS + 10).unwrap();
    let mut seg = vec![0u8; l.bytes_for(2) as usize];
    seg[..l.prefix().len()].copy_from_slice(&l.prefix());
    for (b, bytes) in blocks.iter().enumerate() {
        let (at, size) = l.block_at(b as u64).unwrap();
        assert_eq!(bytes.len() as u64, size);
        seg[at as usize..(at + size) as usize].copy_from_slice(bytes);
    }
    let p = Layout::parse("c", &seg, seg.len() as u64).unwrap();
    assert_eq!(p.block_rows(&seg, 1).unwrap(), 10);
    for i in 0..MIN_BLOCK_ROWS + 10 {
        let (b, r) = (i / MIN_BLOCK_ROWS, i % MIN_BLOCK_ROWS);
        let n = p.block_rows(&seg, b).unwrap();
        let got: Vec<Option<u64>> = (0..3).map(|c| p.get(&seg, c, b, n, r).unwrap()).collect();
        assert_eq!(got, row(i));
    }
    // a row that does not fit is refused whole
    let mut b = BlockBuilder::new(&l);
    assert!(b.push(&[Some(1), Some(2)]).is_err());
    assert!(b.push(&[Some(1), Some(2), Some(5)]).is_err());
    assert_eq!(b.rows(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(proptest_cases(64)))]

    /// The heap's per-row path lays a row of raw datums out as `push` lays out their words:
    /// every encoding, any bits above a value's width, NULLs; a bool datum is true where not 0.
    #[test]
    fn raw_datums_are_laid_out_as_their_words(
        rows in prop::collection::vec(prop::collection::vec((any::<u64>(), any::<bool>()), Encoding::ALL.len()), 1..40)
    ) {
        let specs: Vec<ColumnSpec> = Encoding::ALL.iter().map(|&e| spec(e)).collect();
        let l = Layout::plan(3, &specs, MIN_BLOCK_ROWS).unwrap();
        let (mut by_raw, mut by_word) = (BlockBuilder::new(&l), BlockBuilder::new(&l));
        for row in &rows {
            let raw: Vec<u64> = row.iter().zip(Encoding::ALL.iter().copied()).map(|(&(v, _), e)| if e == Encoding::Bool { v & 0xff } else { v }).collect();
            let nulls: Vec<bool> = row.iter().map(|&(_, n)| n).collect();
            by_raw.push_raw(&raw, &nulls).unwrap();
            let words: Vec<Option<u64>> = raw
                .iter()
                .zip(&nulls)
                .zip(Encoding::ALL.iter().copied())
                .map(|((&v, &n), e)| (!n).then(|| if e == Encoding::Bool { u64::from(v != 0) } else { e.word_of_raw(v) }))
                .collect();
            by_word.push(&words).unwrap();
        }
        prop_assert_eq!(by_raw.rows(), rows.len() as u64);
        prop_assert!(by_raw.finish() == by_word.finish());
    }
}

#[test]
fn a_raw_row_that_does_not_fit_is_refused() {
    let l = Layout::plan(3, &[spec(Encoding::Int4), spec(Encoding::Int8)], MIN_BLOCK_ROWS).unwrap();
    let mut b = BlockBuilder::new(&l);
    assert_eq!(b.push_raw(&[1], &[false]).unwrap_err().code, Code::InvalidParameterValue);
    assert!(b.push_raw(&[1, 2], &[false]).is_err());
    for i in 0..MIN_BLOCK_ROWS {
        b.push_raw(&[i, i], &[false, true]).unwrap();
    }
    assert!(b.push_raw(&[1, 2], &[false, false]).is_err(), "a full block takes no more rows");
    assert_eq!(b.rows(), MIN_BLOCK_ROWS);
}

#[test]
fn a_layout_that_contradicts_itself_or_its_segment_is_refused() {
    let specs = [spec(Encoding::Int4), spec(Encoding::Numeric), spec(Encoding::DictCode)];
    let (l, seg) = laid_out(&specs, MIN_BLOCK_ROWS, 2, 100);
    let total = seg.len() as u64;
    let fails = |bytes: &[u8], total: u64| Layout::parse("c", bytes, total).unwrap_err().code;
    assert_eq!(fails(&seg[..10], total), Code::InvalidParameterValue);
    assert_eq!(fails(&seg[..HEADER_BYTES as usize + 5], total), Code::InvalidParameterValue);
    assert_eq!(fails(&seg, total - 1), Code::InvalidParameterValue, "blocks past the segment");
    let field = |f: &dyn Fn(&mut Header)| {
        let mut h = *l.header();
        f(&mut h);
        let mut s = seg.clone();
        s[..HEADER_BYTES as usize].copy_from_slice(h.as_bytes());
        Layout::parse("c", &s, total).map(|_| ()).unwrap_err().code
    };
    for f in [
        &(|h: &mut Header| h.magic ^= 1) as &dyn Fn(&mut Header),
        &|h| h.version = 2,
        &|h| h.columns = 0,
        &|h| h.columns = MAX_COLUMNS + 1,
        &|h| h.columns = 4,
        &|h| h.block_rows = MIN_BLOCK_ROWS + 8,
        &|h| h.block_bytes += ALIGN,
        &|h| h.data_offset += ALIGN,
        &|h| h.blocks = 3,
        &|h| h.blocks = u64::MAX,
        &|h| h.rows = 2 * MIN_BLOCK_ROWS + 1,
    ] {
        assert_eq!(field(f), Code::InvalidParameterValue);
    }
    let col = |i: usize, f: &dyn Fn(&mut ColumnDesc)| {
        let mut c = l.columns()[i];
        f(&mut c);
        let mut s = seg.clone();
        let at = (HEADER_BYTES + COLUMN_BYTES * i as u64) as usize;
        s[at..at + COLUMN_BYTES as usize].copy_from_slice(c.as_bytes());
        Layout::parse("c", &s, total).map(|_| ())
    };
    assert!(col(0, &|c| c.encoding = 99).is_err());
    assert!(col(0, &|c| c.width = 8).is_err());
    assert!(col(0, &|c| c.values_at += ALIGN).is_err());
    assert!(col(2, &|c| c.nulls_at = 0).is_err());
    assert!(col(1, &|c| c.scale = 40).is_err());
    assert!(col(1, &|c| c.scale = 3).is_ok(), "any scale up to 18 is the column's own");
    assert!(col(2, &|c| c.dictionary = 77).is_ok(), "the dictionary is the extension's");
}

#[test]
fn a_dictionary_numbers_strings_in_first_seen_order_and_selects_codes() {
    let mut b = DictBuilder::default();
    let words: [&[u8]; 6] = [b"ASIA", b"EUROPE", b"ASIA", b"", b"AMERICA", b"EUROPE"];
    let codes: Vec<u32> = words.iter().map(|w| b.intern(w).unwrap()).collect();
    assert_eq!(codes, [0, 1, 0, 2, 3, 1]);
    assert_eq!(b.len(), 4);
    let bytes = b.to_bytes();
    let d = Dict::parse("d", &bytes).unwrap();
    assert_eq!(d.len(), 4);
    for (w, c) in words.iter().zip(&codes) {
        assert_eq!(d.get(*c), Some(*w));
    }
    assert_eq!(d.get(4), None);
    // opened for lookups alone (its offsets not walked): the same strings
    let l = Dict::open("d", &bytes).unwrap();
    for (w, c) in words.iter().zip(&codes) {
        assert_eq!(l.get(*c), Some(*w));
    }
    assert_eq!(l.get(4), None);
    // a predicate evaluated once per distinct string: the codes that pass
    let bits = d.select(|s| s.starts_with(b"A"));
    assert_eq!(bits, [0b1001]);
    // empty
    let empty = DictBuilder::default().to_bytes();
    let e = Dict::parse("d", &empty).unwrap();
    assert!(e.is_empty() && e.select(|_| true).is_empty());
}

#[test]
fn strings_appended_into_a_reserved_dictionary_follow_the_base_codes() {
    let mut b = DictBuilder::default();
    for w in [&b"ASIA"[..], b"EUROPE"] {
        b.intern(w).unwrap();
    }
    let base_bytes = b.to_bytes();
    let base = Dict::parse("d", &base_bytes).unwrap();
    // room for 3 strings of 12 bytes: empty, then two appends, then one that does not fit
    let r = Reserved { entries: 3, bytes: 12 };
    let mut seg = vec![0xa5u8; r.size() as usize];
    let empty = r.empty();
    seg[..empty.len()].copy_from_slice(&empty);
    let apply = |seg: &mut Vec<u8>, strings: &[&[u8]]| -> bool {
        let d = Dict::parse("more", seg).unwrap();
        let Some(a) = r.append(&d, strings) else { return false };
        for (at, bytes) in [a.strings, a.offsets, (0, a.header)] {
            seg[at as usize..at as usize + bytes.len()].copy_from_slice(&bytes);
        }
        true
    };
    assert_eq!(Dict::parse("more", &seg).unwrap().len(), 0);
    assert!(apply(&mut seg, &[b"AFRICA", b""]));
    assert!(apply(&mut seg, &[b"OCEA"]));
    assert!(!apply(&mut seg, &[b"X"]), "a fourth string");
    let more = Dict::parse("more", &seg).unwrap();
    // read as far as its header says (the strings in use), it is the same dictionary
    let len = in_use_len("more", &seg[..DICT_HEADER_BYTES as usize]).unwrap().unwrap() as usize;
    assert_eq!(len, r.size() as usize - 2, "all but the 2 unused bytes");
    let prefix = Dict::parse("more", &seg[..len]).unwrap();
    assert_eq!(prefix.iter().collect::<Vec<_>>(), more.iter().collect::<Vec<_>>());
    assert!(Dict::parse("more", &seg[..len - 1]).is_err(), "a byte short");
    assert!(in_use_len("more", &seg[..8]).is_err(), "a short header");
    assert_eq!(in_use_len("e", &r.empty()).unwrap(), None, "an empty one: nothing past its header");
    assert_eq!(Dict::parse("e", &r.empty_parsable()).unwrap().len(), 0);
    assert_eq!(
        (more.len(), more.get(0), more.get(1), more.get(2)),
        (3, Some(&b"AFRICA"[..]), Some(&b""[..]), Some(&b"OCEA"[..]))
    );
    let r2 = Reserved { entries: 9, bytes: 10 };
    let mut seg2 = r2.empty();
    seg2.resize(r2.size() as usize, 0);
    assert!(r2.append(&Dict::parse("m", &seg2).unwrap(), &[b"0123456789", b"a"]).is_none(), "past the bytes");
    // the two as one: codes 0 and 1 the base's, 2.. the appended strings'
    let all_bytes = concat(&base, &more).unwrap();
    let all = Dict::parse("all", &all_bytes).unwrap();
    let strings: Vec<&[u8]> = all.iter().map(|(_, s)| s).collect();
    assert_eq!(strings, [&b"ASIA"[..], b"EUROPE", b"AFRICA", b"", b"OCEA"]);
    let mut e = r.empty();
    e.resize(r.size() as usize, 0);
    let none = concat(&base, &Dict::parse("e", &e).unwrap()).unwrap();
    assert_eq!(Dict::parse("b", &none).unwrap().iter().count(), 2);
}

#[test]
fn a_dictionary_that_contradicts_itself_is_refused() {
    let mut b = DictBuilder::default();
    for w in [&b"one"[..], b"two", b"three"] {
        b.intern(w).unwrap();
    }
    let bytes = b.to_bytes();
    let fails = |bytes: &[u8]| Dict::parse("d", bytes).map(|_| ()).unwrap_err().code;
    assert_eq!(fails(&bytes[..10]), Code::InvalidParameterValue);
    assert_eq!(fails(&bytes[..bytes.len() - 1]), Code::InvalidParameterValue, "strings cut off");
    let header = |f: &dyn Fn(&mut DictHeader)| {
        let mut h = DictHeader::read_from_prefix(&bytes).unwrap().0;
        f(&mut h);
        let mut s = bytes.clone();
        s[..DICT_HEADER_BYTES as usize].copy_from_slice(h.as_bytes());
        fails(&s)
    };
    for f in [
        &(|h: &mut DictHeader| h.magic ^= 1) as &dyn Fn(&mut DictHeader),
        &|h| h.version = 9,
        &|h| h.entries = 4,
        &|h| h.entries = u64::MAX,
        &|h| h.bytes += 1,
        &|h| h.offsets_at = 8,
        &|h| h.strings_at -= 8,
        &|h| h.strings_at = u64::MAX,
    ] {
        assert_eq!(header(f), Code::InvalidParameterValue);
    }
    // offsets out of order: refused by a parse; opened for lookups, the entries they bound
    // answer None, the others their strings
    let mut s = bytes.clone();
    let at = DICT_HEADER_BYTES as usize + 8;
    s[at..at + 8].copy_from_slice(&100u64.to_le_bytes());
    assert_eq!(fails(&s), Code::InvalidParameterValue);
    let l = Dict::open("d", &s).unwrap();
    assert_eq!((l.get(0), l.get(1), l.get(2)), (None, None, Some(&b"three"[..])));
    // the first offset past 0 or the last short of the strings' end: refused by a lookup's
    // open too (a shifted first or last string, which no lookup could tell from the true one)
    let first = DICT_HEADER_BYTES as usize;
    let last = first + 3 * 8;
    for (at, v) in [(first, 1u64), (last, 10)] {
        let mut s = bytes.clone();
        s[at..at + 8].copy_from_slice(&v.to_le_bytes());
        assert_eq!(fails(&s), Code::InvalidParameterValue);
        assert_eq!(Dict::open("d", &s).map(|_| ()).unwrap_err().code, Code::InvalidParameterValue, "offset at {at} = {v}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(proptest_cases(256)))]

    /// Whatever the bytes, parsing answers (a layout or 22023) and never panics; a layout it
    /// accepts addresses only inside the segment.
    #[test]
    fn parse_never_panics_and_what_it_accepts_stays_inside(
        flips in proptest::collection::vec((0usize..HEADER_BYTES as usize + 3 * COLUMN_BYTES as usize, any::<u8>()), 0..6),
        total_cut in 0u64..4096,
    ) {
        let specs = [spec(Encoding::Int8), spec(Encoding::Bool), spec(Encoding::Float4)];
        let (_, mut seg) = laid_out(&specs, MIN_BLOCK_ROWS, 2, 1500);
        for (at, v) in flips {
            seg[at] = v;
        }
        let total = (seg.len() as u64).saturating_sub(total_cut);
        if let Ok(l) = Layout::parse("c", &seg, total) {
            let (block, r) = (l.header().blocks.saturating_sub(1), l.header().block_rows - 1);
            for col in 0..l.columns().len() {
                if let Some((at, w)) = l.value_at(col, block, r) {
                    prop_assert!(at + w <= total);
                }
                if let Some((at, _)) = l.null_at(col, block, r) {
                    prop_assert!(at < total);
                }
            }
            if let Some((at, size)) = l.block_at(block) {
                prop_assert!(at + size <= total);
            }
        }
    }

    /// Whatever the bytes, a dictionary parses or is refused, and what it hands out lies inside
    /// the bytes.
    #[test]
    fn a_dictionary_parse_never_panics(
        flips in proptest::collection::vec((0usize..160, any::<u8>()), 0..6),
        cut in 0usize..40,
    ) {
        let mut b = DictBuilder::default();
        for i in 0..8u32 {
            b.intern(format!("s{i}").as_bytes()).unwrap();
        }
        let mut bytes = b.to_bytes();
        let len = bytes.len();
        for (at, v) in flips {
            bytes[at % len] = v;
        }
        bytes.truncate(len.saturating_sub(cut));
        if let Ok(d) = Dict::parse("d", &bytes) {
            let total: usize = d.iter().map(|(_, s)| s.len()).sum();
            prop_assert!(total <= bytes.len());
        }
        if let Ok(l) = Dict::open("d", &bytes) {
            for c in 0..12 {
                prop_assert!(l.get(c).is_none_or(|s| s.len() <= bytes.len()));
            }
        }
    }
}

/// A by-value datum's bits become the column's word: sign-extended for the signed encodings,
/// whatever lies above the type's width ignored.
#[test]
fn datums_become_words_by_their_low_bytes() {
    assert_eq!(Encoding::Int2.word_of_raw(0xffff_ffff_ffff_fffb), (-5i64) as u64);
    assert_eq!(Encoding::Int2.word_of_raw(0xfffb), (-5i64) as u64, "zero-extended datum");
    assert_eq!(Encoding::Int4.word_of_raw(0x1_0000_0007), 7);
    assert_eq!(Encoding::Float4.word_of_raw(0xdead_beef_3f80_0000), 0x3f80_0000);
    assert_eq!(Encoding::Bool.word_of_raw(0x101), 1);
    assert_eq!(Encoding::Int8.word_of_raw(u64::MAX), u64::MAX);
    // (a bool datum is 0 or 1: any other byte is no bool)
    for e in Encoding::ALL.iter().filter(|&&e| e != Encoding::Bool) {
        assert!(e.holds(e.word_of_raw(0x8765_4321_0fed_cba9)), "{e:?}");
    }
}

/// A block read on its own folds as the whole cache does: what a reader that fetches one
/// block at a time relies on.
#[test]
fn one_block_read_alone_folds_like_the_cache() {
    let specs = [spec(Encoding::Int4), spec(Encoding::Int8)];
    let mut l = Layout::plan(7, &specs, MIN_BLOCK_ROWS).unwrap();
    let mut b = BlockBuilder::new(&l);
    for i in 0..300u64 {
        let v = (i as i64 - 100) as u64;
        b.push(&[(i % 7 != 0).then_some(Encoding::Int4.word_of_raw(v)), Some(v)]).unwrap();
    }
    let block = b.finish();
    let one = l.one_block();
    let (n, sum) = one.fold_ints(&block, 0).unwrap();
    let want: Vec<i64> = (0..300i64).filter(|i| i % 7 != 0).map(|i| i - 100).collect();
    assert_eq!((n, sum), (want.len() as u64, want.iter().map(|&v| i128::from(v)).sum()));
    // the same block placed in a cache of two blocks, the second empty
    l.set_extent(2, 300).unwrap();
    let mut seg = vec![0u8; l.bytes_for(2) as usize];
    let p = l.prefix();
    seg[..p.len()].copy_from_slice(&p);
    let (at, len) = l.block_at(0).unwrap();
    seg[at as usize..(at + len) as usize].copy_from_slice(&block);
    assert_eq!(l.fold_ints(&seg, 0).unwrap(), (n, sum));
    assert_eq!(one.fold_ints(&block, 1).unwrap().0, 300);
}
