//! A cache's append tail: the rows that `INSERT` and `COPY` added to a cached table after the
//! build, kept beside the cache (a segment of its own) instead of making it stale, each with the
//! transaction that inserted it, so that a reader takes exactly the rows its snapshot sees.
//!
//! # Why a tail, and why rows
//!
//! The cache's blocks are read by kernels in place and hold rows every reader sees (the
//! build's). Appended rows are not yet visible to everyone: a reader must test each row's
//! inserting transaction against its snapshot, which kernels cannot do. So appended rows go
//! apart, into a bounded tail that the reader (a backend, with its snapshot) decodes on the CPU
//! and hands to the kernels as staged rows; a rebuild folds the tail into the blocks. Small
//! transactions are the common writer (one row each), so rows are kept one after the other,
//! not a block per transaction, and each row carries its own transaction id.
//!
//! # Layout
//!
//! | offset | bytes | what |
//! | --- | --- | --- |
//! | 0 | [`TAIL_HEADER_BYTES`] | [`TailHeader`]: magic, version, columns, capacity, table, generation |
//! | [`TAIL_HEADER_BYTES`] | 4 × capacity, rounded up to 8 | a stamp per row: the inserting top transaction's id, 0 while no row is there |
//! | `records_at` | (8 + 8 × columns) × capacity | a record per row: a NULL mask (bit `c` for column `c`) and a 64-bit word per column |
//!
//! Words are the cache's ([`super::Encoding`]: integers sign-extended, floats' bits), columns in
//! the cache's order; a NULL's word is 0. At most [`MAX_TAIL_COLUMNS`] columns (the mask's
//! bits): a cache of more columns has no tail.
//!
//! # Concurrency
//!
//! Appenders take disjoint ranges of rows from a counter in the cache directory (trusted
//! shared memory, `directory::Directory::reserve_tail`), write their records, and then their
//! stamps, in two writes: a reader that reads the stamps first and the records after finds a
//! written record behind every non-zero stamp. A stamp still 0 is a row whose transaction has
//! not ended (it is inside the statement that appends), which no snapshot sees.
//!
//! # Untrusted bytes
//!
//! [`Tail::parse`] checks the header against what the directory and the cache say (columns,
//! capacity, table, generation) and the segment's size, so that every row the reader decodes
//! lies inside the segment; a row's index is bounded by the capacity.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{overwritten, Encoding};
use crate::error::{Code, Result, UvmError};

pub const TAIL_MAGIC: u64 = u64::from_le_bytes(*b"UVMTAIL1");
pub const TAIL_VERSION: u32 = 1;
pub const TAIL_HEADER_BYTES: u64 = 64;
/// Columns a tail holds at most (the bits of a row's NULL mask).
pub const MAX_TAIL_COLUMNS: u32 = 64;
/// Rows a tail holds at most (a tail is decoded whole by one backend).
pub const MAX_TAIL_ROWS: u64 = 1 << 26;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct TailHeader {
    pub magic: u64,
    pub version: u32,
    pub columns: u32,
    pub capacity: u64,
    pub relid: u32,
    pub _pad: u32,
    pub generation: u64,
    pub _reserved: [u64; 3],
}

const _: () = assert!(std::mem::size_of::<TailHeader>() as u64 == TAIL_HEADER_BYTES);

/// A tail's geometry (only [`Tail::new`] and [`Tail::parse`] make one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tail {
    columns: u32,
    capacity: u64,
}

fn bad(why: String) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, why)
}

impl Tail {
    /// A tail of `columns` columns and `capacity` rows.
    pub fn new(columns: u32, capacity: u64) -> Result<Tail> {
        if !(1..=MAX_TAIL_COLUMNS).contains(&columns) {
            return Err(bad(format!("a cache's tail holds 1 to {MAX_TAIL_COLUMNS} columns, not {columns}")));
        }
        if !(1..=MAX_TAIL_ROWS).contains(&capacity) {
            return Err(bad(format!("a cache's tail holds 1 to {MAX_TAIL_ROWS} rows, not {capacity}")));
        }
        Ok(Tail { columns, capacity })
    }

    pub fn columns(&self) -> u32 {
        self.columns
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of one record.
    pub fn record_bytes(&self) -> u64 {
        8 + 8 * u64::from(self.columns)
    }

    /// Where row `row`'s stamp lies.
    pub fn stamp_at(&self, row: u64) -> u64 {
        TAIL_HEADER_BYTES + 4 * row
    }

    /// Where row `row`'s record lies.
    pub fn record_at(&self, row: u64) -> u64 {
        TAIL_HEADER_BYTES + (4 * self.capacity).next_multiple_of(8) + self.record_bytes() * row
    }

    /// The segment's size (bounded: 2^26 rows of 65 words).
    pub fn bytes(&self) -> u64 {
        self.record_at(self.capacity)
    }

    /// The header of a new tail of the cache of table `relid` at `generation`.
    pub fn header(&self, relid: u32, generation: u64) -> TailHeader {
        TailHeader {
            magic: TAIL_MAGIC,
            version: TAIL_VERSION,
            columns: self.columns,
            capacity: self.capacity,
            relid,
            generation,
            ..TailHeader::default()
        }
    }

    /// [`Tail::header`]'s bytes.
    pub fn header_bytes(&self, relid: u32, generation: u64) -> Vec<u8> {
        self.header(relid, generation).as_bytes().to_vec()
    }

    /// Checks a tail's header (`head`, its first [`TAIL_HEADER_BYTES`]) against what the cache
    /// and its directory slot say, and against the segment's `total` bytes.
    pub fn parse(name: &str, head: &[u8], total: u64, relid: u32, generation: u64, columns: u32, capacity: u64) -> Result<Tail> {
        let wrong = |why: &str| overwritten(format!("segment \"{name}\" holds no tail of this cache ({why})"));
        let h = TailHeader::read_from_prefix(head).map_err(|_| wrong("too short"))?.0;
        if h.magic != TAIL_MAGIC || h.version != TAIL_VERSION {
            return Err(wrong("magic or version"));
        }
        if h.relid != relid || h.generation != generation {
            return Err(wrong("another table or generation"));
        }
        if h.columns != columns || h.capacity != capacity {
            return Err(wrong("columns or capacity"));
        }
        let t = Tail::new(columns, capacity).map_err(|_| wrong("columns or capacity out of range"))?;
        if t.bytes() > total {
            return Err(wrong("rows past the segment's end"));
        }
        Ok(t)
    }

    /// The records of `rows` (each `columns` words or NULLs), as they go at a row's record.
    pub fn encode(&self, rows: &[Vec<Option<u64>>]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(rows.len() * self.record_bytes() as usize);
        for r in rows {
            if r.len() != self.columns as usize {
                return Err(bad(format!("a row of {} columns for a tail of {}", r.len(), self.columns)));
            }
            let mask = r.iter().enumerate().filter(|(_, w)| w.is_none()).fold(0u64, |m, (c, _)| m | 1 << c);
            out.extend_from_slice(&mask.to_le_bytes());
            for w in r {
                out.extend_from_slice(&w.unwrap_or(0).to_le_bytes());
            }
        }
        Ok(out)
    }

    /// The stamps of `n` rows inserted by `xid`.
    pub fn stamps(xid: u32, n: usize) -> Vec<u8> {
        xid.to_le_bytes().repeat(n)
    }

    /// The rows of `stamps` (the stamps of rows 0 to n - 1, as read) and `records` (their
    /// records) whose stamp is set, in row order; bounded by the shorter of the two.
    pub fn rows(&self, stamps: Vec<u8>, records: Vec<u8>) -> TailRows {
        let n = (stamps.len() / 4).min(records.len() / self.record_bytes() as usize);
        let taken = (0..n as u32).filter(|&i| stamp(&stamps, i as usize) != 0).collect();
        TailRows { tail: *self, stamps, records, taken }
    }
}

fn stamp(stamps: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(stamps[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

/// Rows read from a tail, kept as read (no copy per row), and which of them a reader takes.
#[derive(Clone, Debug)]
pub struct TailRows {
    tail: Tail,
    stamps: Vec<u8>,
    records: Vec<u8>,
    /// The rows taken, by their index in the tail (each below the bytes read).
    taken: Vec<u32>,
}

impl TailRows {
    /// No rows.
    pub fn none() -> TailRows {
        TailRows { tail: Tail { columns: 1, capacity: 1 }, stamps: Vec::new(), records: Vec::new(), taken: Vec::new() }
    }

    pub fn len(&self) -> usize {
        self.taken.len()
    }

    pub fn is_empty(&self) -> bool {
        self.taken.is_empty()
    }

    /// The inserting transaction of the `i`-th row taken.
    pub fn xid(&self, i: usize) -> u32 {
        stamp(&self.stamps, self.taken[i] as usize)
    }

    /// Column `col` of the `i`-th row taken: its word, or `None` for NULL (and for a column the
    /// tail does not have).
    pub fn word(&self, i: usize, col: usize) -> Option<u64> {
        if col >= self.tail.columns as usize {
            return None;
        }
        let at = self.taken[i] as usize * self.tail.record_bytes() as usize;
        let w = |o: usize| u64::from_le_bytes(self.records[at + o..at + o + 8].try_into().expect("8 bytes"));
        (w(0) & 1 << col == 0).then(|| w(8 + 8 * col))
    }

    /// Keeps the rows whose transaction `keep` says yes to (called once per row, in order).
    pub fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) {
        let stamps = &self.stamps;
        self.taken.retain(|&i| keep(stamp(stamps, i as usize)));
    }

    /// `Ok` where every taken row's every word is a value of its column's encoding
    /// (`encodings`, the cache's columns in order: [`Encoding::valid`]); else 22023 naming the
    /// tail `name`, whose records were overwritten. O(rows × columns), over bytes already read.
    pub fn check(&self, name: &str, encodings: &[Encoding]) -> Result<()> {
        let columns = encodings.len().min(self.tail.columns as usize);
        for i in 0..self.len() {
            for (c, enc) in encodings.iter().enumerate().take(columns) {
                if let Some(w) = self.word(i, c).filter(|&w| !enc.valid(w)) {
                    return Err(overwritten(format!(
                        "segment \"{name}\": appended row {} holds {w:#x} in column {c}, which is no {enc:?} value",
                        self.taken[i]
                    )));
                }
            }
        }
        Ok(())
    }

    /// The taken rows' words of column `col` (for tests and small readers).
    pub fn column(&self, col: usize) -> Vec<Option<u64>> {
        (0..self.len()).map(|i| self.word(i, col)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_go_through_a_tail_and_back() {
        let t = Tail::new(3, 10).unwrap();
        assert_eq!(t.record_bytes(), 32);
        assert_eq!(t.record_at(0), 64 + 40);
        assert_eq!(t.bytes(), 64 + 40 + 320);
        let rows = vec![vec![Some(1), None, Some(u64::MAX)], vec![None, None, None], vec![Some(7), Some(8), Some(9)]];
        let rec = t.encode(&rows).unwrap();
        let mut stamps = Tail::stamps(42, 2);
        stamps.extend_from_slice(&0u32.to_le_bytes());
        let got = t.rows(stamps.clone(), rec.clone());
        assert_eq!(got.len(), 2, "the third row has no stamp");
        assert_eq!((got.xid(0), got.xid(1)), (42, 42));
        assert_eq!(
            (0..3).map(|c| got.column(c)).collect::<Vec<_>>(),
            vec![vec![Some(1), None], vec![None, None], vec![Some(u64::MAX), None]]
        );
        assert_eq!(got.word(0, 3), None, "a column the tail does not have");
        assert!(t.encode(&[vec![Some(1)]]).is_err(), "a row of the wrong width");
        assert_eq!(t.rows(stamps.clone(), rec[..40].to_vec()).len(), 1, "bounded by the records read");
        let mut two = Tail::stamps(7, 1);
        two.extend_from_slice(&Tail::stamps(8, 1));
        let mut r = t.rows(two, rec[..64].to_vec());
        r.retain(|x| x == 8);
        assert_eq!((r.len(), r.xid(0), r.word(0, 0)), (1, 8, None));
        assert!(TailRows::none().is_empty());
    }

    #[test]
    fn words_their_columns_cannot_hold_are_a_corrupted_tail() {
        use Encoding::*;
        let t = Tail::new(3, 4).unwrap();
        let good = [vec![Some(1), Some(-2_451_545i64 as u64), Some(i64::MAX as u64)], vec![Some(0), None, Some(0)]];
        let read = |rows: &[Vec<Option<u64>>]| t.rows(Tail::stamps(5, rows.len()), t.encode(rows).unwrap());
        let encs = [Bool, Date, Timestamp];
        assert!(read(&good).check("t", &encs).is_ok(), "an infinity and the first date are values");
        for (c, w) in [(0, 7u64), (1, 2_145_031_949), (1, -2_451_546i64 as u64), (1, 1 << 32), (2, (i64::MIN + 1) as u64)] {
            let mut rows = good.to_vec();
            rows[1][c] = Some(w);
            let e = read(&rows).check("t", &encs).unwrap_err();
            assert_eq!(e.code, Code::InvalidParameterValue, "column {c}, {w:#x}");
            assert!(e.message.contains("appended row 1"), "{}", e.message);
        }
        assert!(Numeric.valid((-999_999_999_999_999_999i64) as u64) && !Numeric.valid(1_000_000_000_000_000_000));
        assert!(Float8.valid(u64::MAX) && DictCode.valid(u32::MAX as u64) && !DictCode.valid(1 << 32));
    }

    #[test]
    fn a_tail_is_checked_before_use() {
        let t = Tail::new(2, 100).unwrap();
        let h = t.header(5, 9);
        let ok = |head: &[u8], total| Tail::parse("x", head, total, 5, 9, 2, 100);
        assert_eq!(ok(h.as_bytes(), t.bytes()).unwrap(), t);
        assert!(ok(h.as_bytes(), t.bytes() - 1).is_err(), "too small a segment");
        assert!(ok(&h.as_bytes()[..10], t.bytes()).is_err());
        for bad in [
            TailHeader { magic: 1, ..h },
            TailHeader { version: 2, ..h },
            TailHeader { relid: 6, ..h },
            TailHeader { generation: 10, ..h },
            TailHeader { columns: 3, ..h },
            TailHeader { capacity: 1 << 40, ..h },
        ] {
            assert!(ok(bad.as_bytes(), u64::MAX).is_err(), "{bad:?}");
        }
        assert!(Tail::new(0, 1).is_err() && Tail::new(65, 1).is_err() && Tail::new(1, 0).is_err());
        assert!(Tail::new(1, MAX_TAIL_ROWS + 1).is_err());
    }
}
