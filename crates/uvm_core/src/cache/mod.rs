//! The columnar cache's format: chosen columns of a table, kept column by column in one shared
//! segment, for GPU kernels and CPU code in every process (issue 26). This module is the format
//! alone (layout, encodings, the bounded CPU reader and writer); building a cache from a table,
//! keeping it current and using it in plans sit above it, in the extension.
//!
//! # Layout
//!
//! A cache is one segment, laid out as:
//!
//! | offset | bytes | what |
//! | --- | --- | --- |
//! | 0 | [`HEADER_BYTES`] | [`Header`]: magic, version, columns, rows per block, block size, blocks, rows |
//! | [`HEADER_BYTES`] | [`COLUMN_BYTES`] × columns | a [`ColumnDesc`] per column: encoding, width, scale, where its values and NULL bitmap lie in a block |
//! | `data_offset` | `block_bytes` × blocks | the blocks, block `b` at `data_offset + b × block_bytes`: a [`BlockHeader`], then each column's values and NULL bitmap |
//!
//! A block holds up to `block_rows` rows (a power of two from [`MIN_BLOCK_ROWS`] to
//! [`MAX_BLOCK_ROWS`]). It starts with a [`BlockHeader`] ([`ALIGN`] bytes: the rows it holds,
//! room for per-block summaries), then each column's values, `width` bytes each,
//! little-endian, row `r` of the block at `values_at + r × width`, then that column's NULL
//! bitmap, bit `r % 8` of byte `r / 8` set where row `r` is NULL (its value bytes are then
//! zero). Every area starts at a multiple of [`ALIGN`] bytes, and so does `data_offset`, so
//! that a kernel reads one column of one block as one aligned array; one `int4` column without
//! NULLs costs 1.03x its values (the bitmap) plus 256 bytes a block. A scan of a few columns
//! reads those columns' bytes and no others.
//!
//! Blocks are the unit of work and of growth. Each block says how many rows it holds, so
//! writers fill blocks independently (the parallel build hands each worker whole blocks, and
//! each worker's last block is partly full), and appends go into a block of their own at the
//! end: the segment grows, nothing written moves. A writer fills a block's rows first and sets
//! its count last, and the header's `blocks` is raised only over blocks whose counts are set;
//! the extension makes each of those stores a release, so a reader that reads `blocks`, then a
//! block's count, sees every row below them. The header's `rows` is the blocks' total, kept
//! for statistics.
//!
//! # Encodings
//!
//! Each cached type has one fixed-width encoding ([`Encoding`]), the same bits as PostgreSQL's
//! own datum where it has one, so that the extension encodes a datum by copying it:
//!
//! | encoding | PostgreSQL type | width | value |
//! | --- | --- | --- | --- |
//! | `Bool` | `bool` | 1 | 0 or 1 |
//! | `Int2`, `Int4`, `Int8` | `int2`, `int4`, `int8` | 2, 4, 8 | two's complement |
//! | `Float4`, `Float8` | `float4`, `float8` | 4, 8 | IEEE 754 bits |
//! | `Date` | `date` | 4 | days since 2000-01-01 |
//! | `Timestamp`, `TimestampTz` | `timestamp`, `timestamptz` | 8 | microseconds since 2000-01-01 (UTC for tz) |
//! | `Numeric` | `numeric(p, s)`, p ≤ 18 | 8 | the value × 10^`scale`, an `int8` |
//! | `DictCode` | `text`, `varchar` | 4 | the string's code in the column's dictionary ([`dict`]) |
//!
//! Values cross this module as raw 64-bit words ([`Encoding::to_word`] of what a column holds:
//! integers sign-extended, floats' bits zero-extended), so one reader and one writer serve
//! every encoding.
//!
//! # Untrusted bytes
//!
//! A cache lives in a segment that any process with its owner's privileges can overwrite. So
//! [`Layout::parse`] checks every field of the header and of each column against the
//! segment's size before anything past them is read: the magic and version, a column count
//! from 1 to [`MAX_COLUMNS`], a known encoding of its width per column, and offsets equal to
//! those [`Layout::plan`] computes from the encodings and `block_rows` (so no two areas overlap
//! and every area lies inside its block), blocks that end inside the segment, and `rows` at
//! most the blocks' rows. A block's count is read where it is used and refused above
//! `block_rows`. The CPU reader ([`Layout::get`], [`Layout::fold_ints`]) addresses only
//! through a parsed layout, so its loops are bounded by the rows the segment holds, and checks
//! for interrupts every [`interrupt::EVERY`] rows.

pub mod dict;
pub mod directory;
pub mod tail;
#[cfg(test)]
mod tests;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::error::{Code, Result, UvmError};
use crate::interrupt;

/// The ERROR (22023) of a cache segment whose bytes are not what its build wrote: a cache's
/// segments are memory any process with the owner's privileges can write, so every reader
/// that finds its words contradict each other, the directory or the catalog says so with this
/// hint (the cache's own checks here, its tail's and dictionaries', the readers' in the
/// extension).
pub fn overwritten(message: impl Into<String>) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, message)
        .hint("The segment was overwritten. Drop the cache with uvm.cache_drop and build it again.")
}

pub const MAGIC: u64 = u64::from_le_bytes(*b"UVMCOLS1");
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: u64 = 128;
pub const COLUMN_BYTES: u64 = 32;
/// Alignment of every area: the blocks' start, each column's values and NULL bitmap.
pub const ALIGN: u64 = 256;
/// PostgreSQL's `MaxHeapAttributeNumber`: no table has more columns to cache.
pub const MAX_COLUMNS: u32 = 1600;
pub const MIN_BLOCK_ROWS: u64 = 1 << 10;
pub const MAX_BLOCK_ROWS: u64 = 1 << 24;
/// Rows per block unless the builder asks otherwise: 1 Mi rows, 4 MiB of an `int4` column.
pub const DEFAULT_BLOCK_ROWS: u64 = 1 << 20;
/// The largest scale of a `Numeric` column: 10^18 fits an `int8`.
pub const MAX_NUMERIC_SCALE: i16 = 18;

crate::wire_enum! {
    /// How a column's values are stored (the module's table). The numbers are the format's:
    /// fixed, append only.
    pub enum Encoding: u16 {
        Bool = 1,
        Int2 = 2,
        Int4 = 3,
        Int8 = 4,
        Float4 = 5,
        Float8 = 6,
        Date = 7,
        Timestamp = 8,
        TimestampTz = 9,
        Numeric = 10,
        DictCode = 11,
    }
}

impl Encoding {
    /// Bytes per value.
    pub fn width(self) -> u64 {
        match self {
            Encoding::Bool => 1,
            Encoding::Int2 => 2,
            Encoding::Int4 | Encoding::Float4 | Encoding::Date | Encoding::DictCode => 4,
            Encoding::Int8 | Encoding::Float8 | Encoding::Timestamp | Encoding::TimestampTz | Encoding::Numeric => 8,
        }
    }

    /// Whether the stored bits are a signed integer (sign-extended into a word).
    pub fn signed(self) -> bool {
        !matches!(self, Encoding::Bool | Encoding::Float4 | Encoding::Float8 | Encoding::DictCode)
    }

    /// The word of the stored little-endian bytes `b` (`width` of them).
    fn to_word(self, b: &[u8]) -> u64 {
        let mut w = [0u8; 8];
        let n = b.len().min(8);
        w[..n].copy_from_slice(&b[..n]);
        let raw = u64::from_le_bytes(w);
        if self.signed() && n < 8 {
            let shift = 64 - 8 * n as u32;
            (((raw << shift) as i64) >> shift) as u64
        } else {
            raw
        }
    }

    /// The word of a value whose bits are the low `width` bytes of `raw` (a PostgreSQL datum
    /// of a by-value type: the extension encodes such a datum by this call alone).
    pub fn word_of_raw(self, raw: u64) -> u64 {
        self.to_word(&raw.to_le_bytes()[..self.width() as usize])
    }

    /// Whether `word` is a value of this encoding (fits its width as it is read back).
    pub fn holds(self, word: u64) -> bool {
        let n = self.width() as usize;
        match self {
            Encoding::Bool => word <= 1,
            _ if n == 8 => true,
            _ => self.to_word(&word.to_le_bytes()[..n]) == word,
        }
    }

    /// Whether `word` is a value PostgreSQL's type could hold: [`Encoding::holds`], and for
    /// dates and timestamps their ranges (PostgreSQL's `IS_VALID_DATE`, `IS_VALID_TIMESTAMP`)
    /// or their infinities, for numerics fewer than 19 digits (the most a cached `numeric(p, s)`
    /// has). A word from a segment (untrusted) that fails is a corrupted cache, not a value.
    pub fn valid(self, word: u64) -> bool {
        /// Days from 2000-01-01 to the Julian day 0 and to PostgreSQL's `DATE_END_JULIAN`.
        const DATE_MIN: i64 = -2_451_545;
        const DATE_END: i64 = 2_145_031_949;
        /// Microseconds: PostgreSQL's `MIN_TIMESTAMP` and `END_TIMESTAMP`.
        const TIMESTAMP_MIN: i64 = -211_813_488_000_000_000;
        const TIMESTAMP_END: i64 = 9_223_371_331_200_000_000;
        let w = word as i64;
        self.holds(word)
            && match self {
                Encoding::Date => w == i64::from(i32::MIN) || w == i64::from(i32::MAX) || (DATE_MIN..DATE_END).contains(&w),
                Encoding::Timestamp | Encoding::TimestampTz => {
                    w == i64::MIN || w == i64::MAX || (TIMESTAMP_MIN..TIMESTAMP_END).contains(&w)
                }
                Encoding::Numeric => w.unsigned_abs() < 1_000_000_000_000_000_000,
                _ => true,
            }
    }
}

/// The segment's header (the module's table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Header {
    pub magic: u64,
    pub version: u32,
    pub columns: u32,
    pub block_rows: u64,
    pub block_bytes: u64,
    pub data_offset: u64,
    /// Blocks laid out (the segment holds them).
    pub blocks: u64,
    /// Rows published.
    pub rows: u64,
    /// The cached table's OID (the extension's; not checked here).
    pub relid: u32,
    pub _pad: u32,
    /// What the extension keeps about the build and later writes (the snapshot the cache is
    /// current for, a generation raised at each change); not checked here.
    pub built_xmax: u64,
    pub generation: u64,
    pub _reserved: [u64; 6],
}

const _: () = assert!(std::mem::size_of::<Header>() as u64 == HEADER_BYTES);

/// The start of every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct BlockHeader {
    /// Rows the block holds (rows 0 to `rows - 1` of each column).
    pub rows: u64,
    pub _reserved: [u64; 31],
}

pub const BLOCK_HEADER_BYTES: u64 = ALIGN;
const _: () = assert!(std::mem::size_of::<BlockHeader>() as u64 == BLOCK_HEADER_BYTES);

/// One column's entry of the directory after the header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ColumnDesc {
    pub encoding: u16,
    pub width: u16,
    /// A `Numeric` column's scale (0 for the others).
    pub scale: i16,
    /// The column's number in the table (the extension's; not checked here).
    pub attnum: i16,
    /// In a block: where the values and the NULL bitmap start.
    pub values_at: u64,
    pub nulls_at: u64,
    /// The dictionary of a `DictCode` column (the extension's reference; 0 for the others).
    pub dictionary: u64,
}

const _: () = assert!(std::mem::size_of::<ColumnDesc>() as u64 == COLUMN_BYTES);

/// A column to cache: its encoding, its number in the table, and a `Numeric` one's scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnSpec {
    pub encoding: Encoding,
    pub attnum: i16,
    pub scale: i16,
}

/// A cache's validated layout: where every column's values and NULLs lie (only [`Layout::plan`]
/// and [`Layout::parse`] make one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    header: Header,
    columns: Vec<ColumnDesc>,
    encodings: Vec<Encoding>,
}

fn align(n: u64) -> Option<u64> {
    n.checked_add(ALIGN - 1).map(|x| x & !(ALIGN - 1))
}

fn not_a_cache(name: &str, why: &str) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, format!("segment \"{name}\" holds no column cache ({why})"))
        .hint("The segment was overwritten or is not a cache; drop the cache and build it again.")
}

impl Layout {
    /// The layout of a new cache of `columns` with `block_rows` rows per block and no block yet.
    pub fn plan(relid: u32, columns: &[ColumnSpec], block_rows: u64) -> Result<Layout> {
        let bad = |why: String| Err(UvmError::new(Code::InvalidParameterValue, why));
        if columns.is_empty() || columns.len() > MAX_COLUMNS as usize {
            return bad(format!("a cache holds 1 to {MAX_COLUMNS} columns, not {}", columns.len()));
        }
        if !block_rows.is_power_of_two() || !(MIN_BLOCK_ROWS..=MAX_BLOCK_ROWS).contains(&block_rows) {
            return bad(format!(
                "rows per block must be a power of two from {MIN_BLOCK_ROWS} to {MAX_BLOCK_ROWS}, not {block_rows}"
            ));
        }
        let mut descs = Vec::with_capacity(columns.len());
        let mut at = BLOCK_HEADER_BYTES;
        for c in columns {
            let scale = match c.encoding {
                Encoding::Numeric if (0..=MAX_NUMERIC_SCALE).contains(&c.scale) => c.scale,
                Encoding::Numeric => {
                    return bad(format!("a numeric column's scale must be 0 to {MAX_NUMERIC_SCALE}, not {}", c.scale))
                }
                _ => 0,
            };
            // Bounded: at most 1600 columns of 2^24 rows of 8 bytes (2^41 bytes).
            let values_at = at;
            let nulls_at = align(values_at + block_rows * c.encoding.width()).expect("bounded");
            at = align(nulls_at + block_rows / 8).expect("bounded");
            descs.push(ColumnDesc {
                encoding: c.encoding as u16,
                width: c.encoding.width() as u16,
                scale,
                attnum: c.attnum,
                values_at,
                nulls_at,
                dictionary: 0,
            });
        }
        let data_offset = align(HEADER_BYTES + COLUMN_BYTES * columns.len() as u64).expect("bounded");
        let header = Header {
            magic: MAGIC,
            version: VERSION,
            columns: columns.len() as u32,
            block_rows,
            block_bytes: at,
            data_offset,
            relid,
            ..Header::default()
        };
        Ok(Layout { header, columns: descs, encodings: columns.iter().map(|c| c.encoding).collect() })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn columns(&self) -> &[ColumnDesc] {
        &self.columns
    }

    pub fn encoding(&self, col: usize) -> Option<Encoding> {
        self.encodings.get(col).copied()
    }

    /// Bytes of the header and the column directory: what [`Layout::parse`] reads.
    pub fn prefix_bytes(columns: u32) -> u64 {
        HEADER_BYTES + COLUMN_BYTES * u64::from(columns)
    }

    /// Bytes a segment needs to hold `blocks` blocks (saturating).
    pub fn bytes_for(&self, blocks: u64) -> u64 {
        blocks.saturating_mul(self.header.block_bytes).saturating_add(self.header.data_offset)
    }

    /// This layout as if the cache were one block at offset 0, holding no published rows: it
    /// addresses the bytes of one block read on their own (a reader's block, a builder's).
    pub fn one_block(&self) -> Layout {
        let mut one = self.clone();
        one.header.data_offset = 0;
        one.header.blocks = 1;
        one.header.rows = 0;
        one
    }

    /// Rows the laid-out blocks hold.
    pub fn capacity(&self) -> u64 {
        self.header.blocks * self.header.block_rows
    }

    /// The header and the column directory, as they go at the segment's start.
    pub fn prefix(&self) -> Vec<u8> {
        let mut out = self.header.as_bytes().to_vec();
        for c in &self.columns {
            out.extend_from_slice(c.as_bytes());
        }
        out
    }

    /// Lays out `blocks` blocks and publishes `rows` rows, in this value (the caller writes
    /// [`Layout::prefix`] to the segment, whose size must be [`Layout::bytes_for`] `blocks`).
    pub fn set_extent(&mut self, blocks: u64, rows: u64) -> Result<()> {
        if rows > blocks.saturating_mul(self.header.block_rows) {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!("{rows} rows do not fit {blocks} blocks of {}", self.header.block_rows),
            ));
        }
        self.header.blocks = blocks;
        self.header.rows = rows;
        Ok(())
    }

    /// Sets column `col`'s dictionary reference (a `DictCode` column's; the extension's).
    pub fn set_dictionary(&mut self, col: usize, reference: u64) {
        if let Some(c) = self.columns.get_mut(col) {
            c.dictionary = reference;
        }
    }

    /// Records what the extension keeps in the header about the build: the snapshot's `xmax`
    /// and the cache's generation (its directory slot's).
    pub fn stamp(&mut self, relid: u32, built_xmax: u64, generation: u64) {
        self.header.relid = relid;
        self.header.built_xmax = built_xmax;
        self.header.generation = generation;
    }

    /// Bytes of the prefix ([`Layout::prefix_bytes`]) that the header at the start of `head`
    /// announces, its column count capped at [`MAX_COLUMNS`]: how much a reader that read the
    /// header alone reads next for [`Layout::parse`]. 22023 when `head` is no cache header.
    pub fn prefix_len(name: &str, head: &[u8]) -> Result<u64> {
        match Header::read_from_prefix(head) {
            Ok((h, _)) if h.magic == MAGIC => Ok(Self::prefix_bytes(h.columns.clamp(1, MAX_COLUMNS))),
            _ => Err(not_a_cache(name, "no cache header")),
        }
    }

    /// Reads and validates the layout at the start of `bytes` (at least the header; the
    /// directory too, [`Layout::prefix_bytes`]) of a segment of `total` bytes (`name` is for
    /// messages). Never reads past `bytes`, never panics.
    pub fn parse(name: &str, bytes: &[u8], total: u64) -> Result<Layout> {
        let Ok((header, rest)) = Header::read_from_prefix(bytes) else {
            return Err(not_a_cache(name, "too small"));
        };
        if header.magic != MAGIC {
            return Err(not_a_cache(name, "no header"));
        }
        if header.version != VERSION || header._pad != 0 {
            return Err(not_a_cache(name, &format!("unknown version {}", header.version)));
        }
        if header.columns == 0 || header.columns > MAX_COLUMNS {
            return Err(not_a_cache(name, &format!("{} columns", header.columns)));
        }
        let need = Layout::prefix_bytes(header.columns) - HEADER_BYTES;
        if (rest.len() as u64) < need {
            return Err(not_a_cache(name, "its column directory is cut off"));
        }
        let mut specs = Vec::with_capacity(header.columns as usize);
        let mut stored = Vec::with_capacity(header.columns as usize);
        for i in 0..header.columns as usize {
            let raw = &rest[i * COLUMN_BYTES as usize..(i + 1) * COLUMN_BYTES as usize];
            let Ok(c) = ColumnDesc::read_from_bytes(raw) else {
                return Err(not_a_cache(name, "its column directory is cut off"));
            };
            let Some(encoding) = Encoding::from_repr(c.encoding) else {
                return Err(not_a_cache(name, &format!("column {} has unknown encoding {}", i + 1, c.encoding)));
            };
            specs.push(ColumnSpec { encoding, attnum: c.attnum, scale: c.scale });
            stored.push(c);
        }
        let mut planned = Layout::plan(header.relid, &specs, header.block_rows)
            .map_err(|e| not_a_cache(name, &format!("its layout is impossible: {}", e.message)))?;
        for (p, s) in planned.columns.iter_mut().zip(&stored) {
            p.dictionary = s.dictionary;
        }
        if planned.columns != stored
            || planned.header.block_bytes != header.block_bytes
            || planned.header.data_offset != header.data_offset
        {
            return Err(not_a_cache(name, "its column offsets contradict its columns"));
        }
        let end = header.blocks.checked_mul(header.block_bytes).and_then(|b| b.checked_add(header.data_offset));
        if end.is_none_or(|e| e > total) {
            return Err(not_a_cache(name, &format!("{} blocks do not fit a segment of {total} bytes", header.blocks)));
        }
        planned.header = header;
        if header.rows > planned.capacity() {
            return Err(not_a_cache(name, &format!("{} rows in {} blocks of {}", header.rows, header.blocks, header.block_rows)));
        }
        Ok(planned)
    }

    /// Where block `block` lies in the segment: its offset and size; `None` past the laid-out
    /// blocks.
    pub fn block_at(&self, block: u64) -> Option<(u64, u64)> {
        (block < self.header.blocks).then(|| (self.header.data_offset + block * self.header.block_bytes, self.header.block_bytes))
    }

    /// Where row `r` of block `block` has its value of column `col` in the segment, and its
    /// width; `None` outside the laid-out blocks or the column.
    pub fn value_at(&self, col: usize, block: u64, r: u64) -> Option<(u64, u64)> {
        let c = self.columns.get(col)?;
        let (start, _) = self.block_at(block).filter(|_| r < self.header.block_rows)?;
        Some((start + c.values_at + r * u64::from(c.width), u64::from(c.width)))
    }

    /// Where row `r` of block `block` has its NULL bit of column `col`: the byte's offset in
    /// the segment and the bit's mask; `None` outside the laid-out blocks or the column.
    pub fn null_at(&self, col: usize, block: u64, r: u64) -> Option<(u64, u8)> {
        let c = self.columns.get(col)?;
        let (start, _) = self.block_at(block).filter(|_| r < self.header.block_rows)?;
        Some((start + c.nulls_at + r / 8, 1 << (r % 8)))
    }

    /// The rows block `block` holds, from `seg` (the segment's bytes from offset 0); 22023
    /// past the blocks or the bytes, or for a count above `block_rows` (an overwritten block).
    pub fn block_rows(&self, seg: &[u8], block: u64) -> Result<u64> {
        let bytes = self.block_at(block).and_then(|(at, _)| seg.get(at as usize..(at + BLOCK_HEADER_BYTES) as usize));
        let Some(h) = bytes.and_then(|b| BlockHeader::read_from_bytes(b).ok()) else {
            return Err(UvmError::new(Code::InvalidParameterValue, format!("block {block} is outside the cache's bytes")));
        };
        if h.rows > self.header.block_rows {
            return Err(overwritten(format!(
                "block {block} of the cache says it holds {} rows, more than its {}",
                h.rows, self.header.block_rows
            )));
        }
        Ok(h.rows)
    }

    /// Sets the rows block `block` holds (after they are written: see the module's essay).
    pub fn set_block_rows(&self, seg: &mut [u8], block: u64, rows: u64) -> Result<()> {
        let range = self.block_at(block).map(|(at, _)| at as usize..(at + BLOCK_HEADER_BYTES) as usize);
        let Some(bytes) = range.and_then(|r| seg.get_mut(r)).filter(|_| rows <= self.header.block_rows) else {
            return Err(UvmError::new(Code::InvalidParameterValue, format!("block {block} cannot hold {rows} rows")));
        };
        let h = BlockHeader { rows, _reserved: [0; 31] };
        bytes.copy_from_slice(h.as_bytes());
        Ok(())
    }

    /// Writes row `r` of block `block` of column `col` into `seg` (the segment's bytes from
    /// offset 0): the value's word, or `None` for NULL (zero bytes, the NULL bit set). 22023
    /// outside the laid-out blocks or `seg`, or for a word the encoding cannot hold.
    pub fn put(&self, seg: &mut [u8], col: usize, block: u64, r: u64, word: Option<u64>) -> Result<()> {
        let (Some((at, width)), Some((nat, mask)), Some(enc)) =
            (self.value_at(col, block, r), self.null_at(col, block, r), self.encoding(col))
        else {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!("row {r} of block {block}, column {col}, is outside the cache"),
            ));
        };
        if let Some(w) = word.filter(|&w| !enc.holds(w)) {
            return Err(UvmError::new(Code::InvalidParameterValue, format!("{w:#x} is no {enc:?} value")));
        }
        let (at, width, nat) = (at as usize, width as usize, nat as usize);
        if at + width > seg.len() || nat >= seg.len() {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!("row {r} of block {block} lies past the segment's bytes"),
            ));
        }
        seg[at..at + width].copy_from_slice(&word.unwrap_or(0).to_le_bytes()[..width]);
        if word.is_some() {
            seg[nat] &= !mask;
        } else {
            seg[nat] |= mask;
        }
        Ok(())
    }

    /// Row `r` of block `block` of column `col` from `seg`, given the block's count `rows`
    /// ([`Layout::block_rows`]): `Some(None)` for NULL, `None` at or past the count, outside
    /// the blocks or past the bytes.
    pub fn get(&self, seg: &[u8], col: usize, block: u64, rows: u64, r: u64) -> Option<Option<u64>> {
        if r >= rows {
            return None;
        }
        let (at, width) = self.value_at(col, block, r)?;
        let (nat, mask) = self.null_at(col, block, r)?;
        let bytes = seg.get(at as usize..(at + width) as usize)?;
        if seg.get(nat as usize)? & mask != 0 {
            return Some(None);
        }
        Some(Some(self.encodings[col].to_word(bytes)))
    }

    /// Folds the rows of an integer-like column (not a float or a dictionary code) in every
    /// block: the non-NULL values' count and sum, as the CPU counterpart of a kernel's. Bounded
    /// by the blocks and `block_rows` each; checks for interrupts every [`interrupt::EVERY`]
    /// rows.
    pub fn fold_ints(&self, seg: &[u8], col: usize) -> Result<(u64, i128)> {
        let enc = self.encoding(col).ok_or_else(|| UvmError::new(Code::InvalidParameterValue, format!("no column {col}")))?;
        if !enc.signed() && enc != Encoding::Bool {
            return Err(UvmError::new(Code::DatatypeMismatch, format!("a {enc:?} column has no integer sum")));
        }
        let (mut n, mut sum, mut seen) = (0u64, 0i128, 0u64);
        for block in 0..self.header.blocks {
            let rows = self.block_rows(seg, block)?;
            for r in 0..rows {
                interrupt::check_every(seen)?;
                seen += 1;
                match self.get(seg, col, block, rows, r) {
                    Some(Some(w)) => {
                        n += 1;
                        sum += i128::from(w as i64);
                    }
                    Some(None) => {}
                    None => {
                        return Err(UvmError::new(
                            Code::InvalidParameterValue,
                            format!("the cache's bytes end inside block {block}"),
                        ))
                    }
                }
            }
        }
        Ok((n, sum))
    }
}

/// One block built in the builder's own memory, a row at a time, then copied to its place in
/// the segment whole ([`Layout::block_at`]): how a builder fills blocks without touching the
/// segment per value, and how a parallel worker fills the blocks it claimed.
pub struct BlockBuilder {
    /// The cache's layout as if it were one block at offset 0: `put` then addresses `bytes`.
    one: Layout,
    /// Per column: where its values and its NULL bitmap start in `bytes`, its width and its
    /// encoding (the layout's, looked up once: a row's push writes each value in place).
    cols: Vec<(usize, usize, usize, Encoding)>,
    bytes: Vec<u8>,
    rows: u64,
}

impl BlockBuilder {
    /// An empty block of `layout`'s shape (`block_bytes` zeroed bytes).
    pub fn new(layout: &Layout) -> BlockBuilder {
        let one = layout.one_block();
        let cols = one
            .columns
            .iter()
            .zip(&one.encodings)
            .map(|(c, &e)| (c.values_at as usize, c.nulls_at as usize, usize::from(c.width), e))
            .collect();
        BlockBuilder { bytes: vec![0; one.header.block_bytes as usize], one, cols, rows: 0 }
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn is_full(&self) -> bool {
        self.rows == self.one.header.block_rows
    }

    /// Appends a row: one word per column (`None` for NULL). 22023 when the block is full,
    /// the row has another number of columns, or a word does not fit its column's encoding
    /// (the row is then not added).
    pub fn push(&mut self, row: &[Option<u64>]) -> Result<()> {
        if self.is_full() || row.len() != self.one.columns.len() {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!(
                    "a row of {} columns does not go into a block of {} columns holding {} rows",
                    row.len(),
                    self.one.columns.len(),
                    self.rows
                ),
            ));
        }
        if let Some((col, w)) = row.iter().enumerate().find_map(|(c, w)| w.filter(|&w| !self.cols[c].3.holds(w)).map(|w| (c, w)))
        {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!("{w:#x} is no {:?} value (column {col})", self.cols[col].3),
            ));
        }
        // Within the block (`Layout::plan` laid every area out inside it, and `rows` is below
        // `block_rows`); a fresh block's bytes are zero, so a NULL only sets its bit.
        let r = self.rows as usize;
        for (&(values_at, nulls_at, width, _), &w) in self.cols.iter().zip(row) {
            match w {
                Some(w) => {
                    self.bytes[values_at + r * width..values_at + (r + 1) * width].copy_from_slice(&w.to_le_bytes()[..width])
                }
                None => self.bytes[nulls_at + r / 8] |= 1 << (r % 8),
            }
        }
        self.rows += 1;
        Ok(())
    }

    /// Appends a row of raw values as a PostgreSQL slot holds a by-value type's datums: column
    /// `c`'s value is the low `width` bytes of `raw[c]` (the bits [`Encoding::word_of_raw`]
    /// reads, so every value fits its column; a `Bool` is 1 where its datum is not 0, as
    /// `DatumGetBool` reads it), NULL where `nulls[c]`. The heap's per-row path: no word is
    /// made or checked, each value is one store. 22023 when the block is full or the row has
    /// another number of columns (the row is then not added).
    pub fn push_raw(&mut self, raw: &[u64], nulls: &[bool]) -> Result<()> {
        if self.is_full() || raw.len() != self.cols.len() || nulls.len() != raw.len() {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!(
                    "a row of {} columns does not go into a block of {} columns holding {} rows",
                    raw.len(),
                    self.cols.len(),
                    self.rows
                ),
            ));
        }
        // Within the block, as in `push`.
        let r = self.rows as usize;
        for ((&(values_at, nulls_at, width, _), &v), &null) in self.cols.iter().zip(raw).zip(nulls) {
            if null {
                self.bytes[nulls_at + r / 8] |= 1 << (r % 8);
                continue;
            }
            let at = values_at + r * width;
            let b = v.to_le_bytes();
            match width {
                1 => self.bytes[at] = u8::from(v != 0),
                2 => self.bytes[at..at + 2].copy_from_slice(&b[..2]),
                4 => self.bytes[at..at + 4].copy_from_slice(&b[..4]),
                _ => self.bytes[at..at + 8].copy_from_slice(&b),
            }
        }
        self.rows += 1;
        Ok(())
    }

    /// The block's bytes, its count set: to be written at [`Layout::block_at`] of its block.
    pub fn finish(mut self) -> Vec<u8> {
        self.one.set_block_rows(&mut self.bytes, 0, self.rows).expect("a block's own count fits it");
        self.bytes
    }
}
