//! Scan programs as requests (issue 27): a star query's program (`crate::scan`) over a column
//! cache, folding into a group table in a segment, run where the segments are (the GPU service,
//! or a backend in process mode), so that no fact row crosses to the client.
//!
//! # The request
//!
//! `ScanGroups` names the fact cache and the group table; the program rides in the request's
//! bulk bytes (a program names more segments than a request's two references: one dimension
//! table per join), encoded here as plain little-endian data, decoded totally (bytes that are
//! not a program are a 22023 or 08P01 error, never a panic: staging is shared memory):
//!
//! | bytes | what |
//! | --- | --- |
//! | 32 | header: magic, version, and the counts of segments, filters, joins, keys, aggregates, data bytes (`u32` each) |
//! | 80 × segments | the dimension tables (`SegRef`, as requests carry them) |
//! | 24 × filters | column (`u32`), kind (`u16`: 1 a range, 2 codes, 3 `IS NULL`, 4 a comparison), whether it is an alternative of the filter before it (`u16`, 0 or 1), then `lo`, `hi` (a range) or the offset and length of its bitmap or its comparison in the data bytes |
//! | 8 × joins | fact column, dimension table (an index into the segments) |
//! | 8 × keys | kind (1: a fact column, 2: a join's payload), index |
//! | 12 × aggregates | aggregate kind, input kind (0: none, 1: a column, 2: a difference, 3: a product, 4: a `float4` column widened), two columns |
//! | data bytes | the code bitmaps of the filters on dictionary columns; the comparisons: the comparison (`u32`), each side's steps (`u32` twice), a `u32` 0, then 16 bytes a step (kind `u32`: 1 a column, 2 a constant, 3 a binary operator, 4 a negation; for an operator its kind `u16` (1 `+` to 5 `%`) and result width `u16` (2, 4, 8); then the column, constant or 0 as `i64`) |
//!
//! `ScanBuild` carries a program the same way (of no joins; its one segment, `dims[0]`, is the
//! group table of that program run before) and builds a dimension's join table from it
//! (`crate::scan::build`); its answer is the pairs inserted.
//!
//! The answer is the program's `Progress`: every row folded, or the row to resume at and the
//! slots the group table needs; the client grows the table (`GroupsGrow`: a bigger segment,
//! the groups moved over) and asks again from that row. The client builds the dimension tables
//! (GpuJoin tables: `BuildBegin`, `BuildInsert`, `BuildFinish`) and reads the groups out of the
//! table's segment when done.
//!
//! # Where it runs
//!
//! The CPU engine runs `scan::run` over the pinned segments' bytes; the CUDA engine runs the
//! kernels (`scan::gpu`: a key pass and a fold pass per launch, so a full table answers
//! `Full` at a launch's first row).

use zerocopy::{FromBytes, IntoBytes};

use super::SegRef;
use crate::error::{Code, Result, UvmError};
use crate::groups::AggKind;
use crate::scan::expr::{Cmp, Compare, Op, Step, Width};
use crate::scan::{Filter, Input, Source, Test};

const MAGIC: u32 = 0x5053_5655; // "UVSP"
const VERSION: u32 = 2;
const HEADER_BYTES: usize = 32;
const SEG_BYTES: usize = std::mem::size_of::<SegRef>();
const FILTER_BYTES: usize = 24;
const JOIN_BYTES: usize = 8;
const KEY_BYTES: usize = 8;
const AGG_BYTES: usize = 12;
/// Limits of a program (a star query stays far below each).
pub const MAX_FILTERS: usize = 64;
pub const MAX_JOINS: usize = 8;
pub const MAX_KEYS: usize = 31;
pub const MAX_AGGS: usize = 64;
/// Data bytes (code bitmaps, 32 Mi codes, and comparisons).
pub const MAX_BITMAP_BYTES: usize = 1 << 22;

/// A program as the client describes it and the executor receives it: the program's parts
/// with each join's dimension table named by its index in `dims`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    pub dims: Vec<SegRef>,
    pub filters: Vec<Filter>,
    /// (fact column, index into `dims`) per join.
    pub joins: Vec<(usize, usize)>,
    pub keys: Vec<Source>,
    pub aggs: Vec<(AggKind, Input)>,
}

fn invalid(what: impl Into<String>) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, what)
}

fn u32_of(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| invalid(format!("{what} out of range: {n}")))
}

impl Spec {
    /// Checks what a caller can get wrong (22023), before anything is encoded or run.
    pub fn validate(&self) -> Result<()> {
        let over = |n: usize, max: usize, what: &str| -> Result<()> {
            if n > max {
                return Err(invalid(format!("a scan program has at most {max} {what}, not {n}")));
            }
            Ok(())
        };
        over(self.filters.len(), MAX_FILTERS, "filters")?;
        over(self.joins.len(), MAX_JOINS, "joins")?;
        over(self.dims.len(), MAX_JOINS, "dimension tables")?;
        over(self.keys.len(), MAX_KEYS, "group keys")?;
        over(self.aggs.len(), MAX_AGGS, "aggregates")?;
        let data: usize = self
            .filters
            .iter()
            .map(|f| match &f.test {
                Test::Codes(b) => b.len(),
                Test::Compare(c) => 16 + 16 * (c.lhs.len() + c.rhs.len()),
                _ => 0,
            })
            .sum();
        over(data, MAX_BITMAP_BYTES, "bytes of code bitmaps and comparisons")?;
        for f in &self.filters {
            if let Test::Compare(c) = &f.test {
                c.check()?;
            }
        }
        if let Some(&(_, d)) = self.joins.iter().find(|j| j.1 >= self.dims.len()) {
            return Err(invalid(format!("a join on dimension table {d} of {}", self.dims.len())));
        }
        if let Some(Source::Payload(j)) = self.keys.iter().find(|k| matches!(k, Source::Payload(j) if *j >= self.joins.len())) {
            return Err(invalid(format!("a group key from join {j} of {}", self.joins.len())));
        }
        if let Some(f) = self.filters.iter().find(|f| matches!(f.test, Test::Range { lo, hi } if lo > hi)) {
            return Err(invalid(format!("an empty range on column {}", f.col)));
        }
        if self.filters.first().is_some_and(|f| f.or) {
            return Err(invalid("a scan program's first filter is an alternative of none"));
        }
        Ok(())
    }

    /// The request's bulk bytes.
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.validate()?;
        let mut bitmaps = Vec::new();
        let mut out = Vec::new();
        let header = [
            MAGIC,
            VERSION,
            u32_of(self.dims.len(), "dimension tables")?,
            u32_of(self.filters.len(), "filters")?,
            u32_of(self.joins.len(), "joins")?,
            u32_of(self.keys.len(), "keys")?,
            u32_of(self.aggs.len(), "aggregates")?,
            0, // data bytes (bitmaps and comparisons), set below
        ];
        out.extend_from_slice(header.as_bytes());
        for d in &self.dims {
            out.extend_from_slice(d.as_bytes());
        }
        for f in &self.filters {
            out.extend_from_slice(&u32_of(f.col, "a filter's column")?.to_le_bytes());
            let (kind, a, b) = match &f.test {
                Test::Range { lo, hi } => (1u16, *lo as u64, *hi as u64),
                Test::Codes(b) => {
                    let at = bitmaps.len() as u64;
                    bitmaps.extend_from_slice(b);
                    (2, at, b.len() as u64)
                }
                Test::Null => (3, 0, 0),
                Test::Compare(c) => {
                    let at = bitmaps.len() as u64;
                    encode_compare(c, &mut bitmaps);
                    (4, at, bitmaps.len() as u64 - at)
                }
            };
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&u16::from(f.or).to_le_bytes());
            out.extend_from_slice(&a.to_le_bytes());
            out.extend_from_slice(&b.to_le_bytes());
        }
        for &(col, dim) in &self.joins {
            out.extend_from_slice(&u32_of(col, "a join's column")?.to_le_bytes());
            out.extend_from_slice(&u32_of(dim, "a join's table")?.to_le_bytes());
        }
        for k in &self.keys {
            let (kind, i) = match *k {
                Source::Col(c) => (1u32, c),
                Source::Payload(j) => (2u32, j),
            };
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&u32_of(i, "a key's source")?.to_le_bytes());
        }
        for &(kind, input) in &self.aggs {
            let (ik, a, b) = input.code();
            out.extend_from_slice(&(kind as u16).to_le_bytes());
            out.extend_from_slice(&ik.to_le_bytes());
            out.extend_from_slice(&u32_of(a, "an aggregate's column")?.to_le_bytes());
            out.extend_from_slice(&u32_of(b, "an aggregate's column")?.to_le_bytes());
        }
        let n = u32_of(bitmaps.len(), "data bytes")?;
        out[28..32].copy_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&bitmaps);
        Ok(out)
    }

    /// The program in `bytes` (a request's bulk bytes), checked as [`Spec::validate`] checks.
    pub fn decode(bytes: &[u8]) -> Result<Spec> {
        let short = || invalid("a scan program's bytes end early");
        let head = <[u32; 8]>::read_from_prefix(bytes).map_err(|_| short())?.0;
        let [magic, version, ndims, nfilters, njoins, nkeys, naggs, nbitmap] = head;
        if magic != MAGIC || version != VERSION {
            return Err(UvmError::new(Code::ProtocolViolation, "the request's bytes are not a scan program"));
        }
        let (ndims, nfilters, njoins, nkeys, naggs, nbitmap) =
            (ndims as usize, nfilters as usize, njoins as usize, nkeys as usize, naggs as usize, nbitmap as usize);
        if ndims > MAX_JOINS || nfilters > MAX_FILTERS || njoins > MAX_JOINS || nkeys > MAX_KEYS || naggs > MAX_AGGS {
            return Err(invalid("a scan program's counts are out of range"));
        }
        if nbitmap > MAX_BITMAP_BYTES {
            return Err(invalid("a scan program's bitmaps are too large"));
        }
        // Bounded: every count is small (checked above).
        let need = HEADER_BYTES
            + SEG_BYTES * ndims
            + FILTER_BYTES * nfilters
            + JOIN_BYTES * njoins
            + KEY_BYTES * nkeys
            + AGG_BYTES * naggs
            + nbitmap;
        if bytes.len() != need {
            return Err(invalid(format!("a scan program of {} bytes, not the {need} its counts say", bytes.len())));
        }
        let mut at = HEADER_BYTES;
        let mut take = |n: usize| -> &[u8] {
            let s = &bytes[at..at + n];
            at += n;
            s
        };
        let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let dims =
            (0..ndims).map(|_| SegRef::read_from_bytes(take(SEG_BYTES)).map_err(|_| short())).collect::<Result<Vec<_>>>()?;
        let raw_filters: Vec<&[u8]> = (0..nfilters).map(|_| take(FILTER_BYTES)).collect();
        let joins: Vec<(usize, usize)> = (0..njoins)
            .map(|_| {
                let b = take(JOIN_BYTES);
                (u32_at(b, 0) as usize, u32_at(b, 4) as usize)
            })
            .collect();
        let keys = (0..nkeys)
            .map(|_| {
                let b = take(KEY_BYTES);
                match u32_at(b, 0) {
                    1 => Ok(Source::Col(u32_at(b, 4) as usize)),
                    2 => Ok(Source::Payload(u32_at(b, 4) as usize)),
                    k => Err(invalid(format!("a group key of kind {k}"))),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let aggs = (0..naggs)
            .map(|_| {
                let b = take(AGG_BYTES);
                let kind = u16::from_le_bytes([b[0], b[1]]);
                let kind = AggKind::from_repr(kind).ok_or_else(|| invalid(format!("an aggregate of kind {kind}")))?;
                let (a, c) = (u32_at(b, 4) as usize, u32_at(b, 8) as usize);
                let ik = u16::from_le_bytes([b[2], b[3]]);
                let input = Input::of_code(ik, a, c).ok_or_else(|| invalid(format!("an aggregate input of kind {ik}")))?;
                Ok((kind, input))
            })
            .collect::<Result<Vec<_>>>()?;
        let bitmaps = take(nbitmap);
        let filters = raw_filters
            .iter()
            .map(|b| {
                let col = u32_at(b, 0) as usize;
                let or = match u16::from_le_bytes([b[6], b[7]]) {
                    0 => false,
                    1 => true,
                    v => return Err(invalid(format!("a filter's alternative flag of {v}"))),
                };
                let test = match u16::from_le_bytes([b[4], b[5]]) {
                    1 => Test::Range { lo: u64_at(b, 8) as i64, hi: u64_at(b, 16) as i64 },
                    2 => {
                        let (off, len) = (u64_at(b, 8), u64_at(b, 16));
                        let end = off.checked_add(len).filter(|&e| e <= nbitmap as u64).ok_or_else(|| {
                            invalid(format!("a filter's bitmap at {off} of {len} bytes past the {nbitmap} bytes of bitmaps"))
                        })?;
                        Test::Codes(bitmaps[off as usize..end as usize].to_vec())
                    }
                    3 => Test::Null,
                    4 => {
                        let (off, len) = (u64_at(b, 8), u64_at(b, 16));
                        let end = off.checked_add(len).filter(|&e| e <= nbitmap as u64).ok_or_else(|| {
                            invalid(format!("a filter's comparison at {off} of {len} bytes past the {nbitmap} data bytes"))
                        })?;
                        Test::Compare(decode_compare(&bitmaps[off as usize..end as usize])?)
                    }
                    k => return Err(invalid(format!("a filter of kind {k}"))),
                };
                Ok(Filter { col, test, or })
            })
            .collect::<Result<Vec<_>>>()?;
        let spec = Spec { dims, filters, joins, keys, aggs };
        spec.validate()?;
        Ok(spec)
    }
}

fn encode_compare(c: &Compare, out: &mut Vec<u8>) {
    for w in [c.cmp.code(), c.lhs.len() as u32, c.rhs.len() as u32, 0] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    for s in c.lhs.iter().chain(&c.rhs) {
        let (kind, a, b, v): (u32, u16, u16, i64) = match *s {
            Step::Col(c) => (1, 0, 0, c as i64),
            Step::Const(v) => (2, 0, 0, v),
            Step::Bin(op, w) => (3, op as u16 + 1, w.code() as u16, 0),
            Step::Neg(w) => (4, 0, w.code() as u16, 0),
        };
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// A comparison from its bytes (exactly its bytes), checked.
fn decode_compare(b: &[u8]) -> Result<Compare> {
    let short = || invalid("a comparison's bytes do not hold its steps");
    let u32_at = |i: usize| b.get(i..i + 4).map(|x| u32::from_le_bytes(x.try_into().expect("4 bytes")));
    let (Some(cmp), Some(nl), Some(nr)) = (u32_at(0), u32_at(4), u32_at(8)) else { return Err(short()) };
    let cmp = Cmp::from_code(cmp).ok_or_else(|| invalid(format!("a comparison of kind {cmp}")))?;
    let (nl, nr) = (nl as usize, nr as usize);
    if nl > crate::scan::expr::MAX_STEPS || nr > crate::scan::expr::MAX_STEPS || b.len() != 16 + 16 * (nl + nr) {
        return Err(short());
    }
    let ops = [Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Mod];
    let mut steps = Vec::with_capacity(nl + nr);
    for s in b[16..].chunks_exact(16) {
        let kind = u32::from_le_bytes(s[0..4].try_into().expect("4 bytes"));
        let (op, width) = (u16::from_le_bytes([s[4], s[5]]), u16::from_le_bytes([s[6], s[7]]));
        let v = i64::from_le_bytes(s[8..16].try_into().expect("8 bytes"));
        let width = || Width::from_code(u32::from(width)).ok_or_else(|| invalid(format!("an operator of width {width}")));
        steps.push(match kind {
            1 => Step::Col(usize::try_from(v).map_err(|_| invalid(format!("a step of column {v}")))?),
            2 => Step::Const(v),
            3 => Step::Bin(
                *ops.get(usize::from(op).wrapping_sub(1)).ok_or_else(|| invalid(format!("an operator {op}")))?,
                width()?,
            ),
            4 => Step::Neg(width()?),
            k => return Err(invalid(format!("a step of kind {k}"))),
        });
    }
    let rhs = steps.split_off(nl);
    let c = Compare { lhs: steps, cmp, rhs };
    c.check()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(name: &str, id: u64) -> SegRef {
        SegRef::new(name, id).unwrap()
    }

    fn spec() -> Spec {
        Spec {
            dims: vec![seg("d0", 5), seg("d1", 6)],
            filters: vec![
                Filter::and(2, Test::Range { lo: -3, hi: 25 }),
                Filter::or(4, Test::Codes(vec![0b1010, 0, 1])),
                Filter::and(1, Test::Codes(vec![0xff])),
                Filter::or(3, Test::Null),
                Filter::and(
                    3,
                    Test::Compare(Compare {
                        lhs: vec![Step::Col(3), Step::Const(-7), Step::Bin(Op::Mod, Width::Int4), Step::Neg(Width::Int8)],
                        cmp: Cmp::Ne,
                        rhs: vec![Step::Col(1)],
                    }),
                ),
            ],
            joins: vec![(0, 0), (1, 1), (3, 0)],
            keys: vec![Source::Payload(2), Source::Col(4)],
            aggs: vec![
                (AggKind::CountStar, Input::Star),
                (AggKind::SumInt, Input::Mul(3, 2)),
                (AggKind::MinInt, Input::Sub(3, 2)),
                (AggKind::Count, Input::Col(3)),
                (AggKind::SumFloat, Input::Float4(1)),
            ],
        }
    }

    #[test]
    fn a_program_goes_through_its_bytes_and_back() {
        let s = spec();
        let b = s.encode().unwrap();
        assert_eq!(Spec::decode(&b).unwrap(), s);
        let empty = Spec { dims: vec![], filters: vec![], joins: vec![], keys: vec![], aggs: vec![] };
        assert_eq!(Spec::decode(&empty.encode().unwrap()).unwrap(), empty);
    }

    #[test]
    fn what_is_not_a_program_is_refused() {
        let b = spec().encode().unwrap();
        // every prefix, every byte changed: an error or a valid program, never a panic
        for n in 0..b.len() {
            assert!(Spec::decode(&b[..n]).is_err(), "a prefix of {n} bytes");
        }
        for i in 0..b.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut c = b.clone();
                c[i] = v;
                if let Ok(s) = Spec::decode(&c) {
                    s.validate().unwrap();
                }
            }
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(Spec::decode(&extra).is_err(), "a byte past the end");
        assert_eq!(Spec::decode(&[0u8; 32]).unwrap_err().code, Code::ProtocolViolation);
        // what a caller can get wrong
        let bad = [
            Spec { joins: vec![(0, 2)], ..spec() },
            Spec { keys: vec![Source::Payload(3)], ..spec() },
            Spec { filters: vec![Filter::and(0, Test::Range { lo: 2, hi: 1 })], ..spec() },
            Spec { filters: vec![Filter::or(0, Test::Null)], ..spec() },
            Spec { aggs: vec![(AggKind::CountStar, Input::Star); MAX_AGGS + 1], ..spec() },
        ];
        for s in bad {
            assert_eq!(s.encode().unwrap_err().code, Code::InvalidParameterValue, "{s:?}");
        }
    }
}
