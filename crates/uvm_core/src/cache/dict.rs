//! A dictionary-encoded column's dictionary: its distinct strings, each stored once, numbered by
//! a `u32` code in first-seen order; the column itself holds the codes (`Encoding::DictCode`).
//!
//! # Layout
//!
//! A dictionary is one segment (its column's entry names it: `ColumnDesc::dictionary`):
//!
//! | offset | bytes | what |
//! | --- | --- | --- |
//! | 0 | [`DICT_HEADER_BYTES`] | [`DictHeader`]: magic, version, entries, string bytes, where the offsets and the strings start |
//! | `offsets_at` | 8 × (entries + 1) | the start of each string in the string area, then its end |
//! | `strings_at` | `bytes` | the strings, back to back, as PostgreSQL stores them (no terminator) |
//!
//! String `c` is `strings[offsets[c]..offsets[c + 1]]`. Codes follow no order of the strings, so
//! a predicate on the column (`=`, `IN`, `BETWEEN`, `LIKE`, under the column's collation) is
//! evaluated by PostgreSQL once per distinct string, over the dictionary, and a kernel tests the
//! codes against the set it yields (a bitmap of codes): the dictionary decides nothing about
//! collations. Equal strings are equal bytes, which holds for deterministic collations only;
//! the extension does not dictionary-encode a column of a nondeterministic one.
//!
//! # Untrusted bytes
//!
//! [`Dict::parse`] checks the header against the segment's size and every offset (rising, inside
//! the string area) before a string is read, so a parsed dictionary hands out only slices of the
//! bytes it was given, in time bounded by its entries.

use std::collections::HashMap;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::error::{Code, Result, UvmError};

pub const DICT_MAGIC: u64 = u64::from_le_bytes(*b"UVMDICT1");
pub const DICT_VERSION: u32 = 1;
pub const DICT_HEADER_BYTES: u64 = 64;
/// Distinct strings a dictionary holds at most: codes are `u32`, and one is kept back.
pub const MAX_ENTRIES: u64 = u32::MAX as u64 - 1;

/// The dictionary segment's header (the module's table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DictHeader {
    pub magic: u64,
    pub version: u32,
    pub _pad: u32,
    pub entries: u64,
    /// Bytes of the string area in use.
    pub bytes: u64,
    pub offsets_at: u64,
    pub strings_at: u64,
    pub _reserved: [u64; 2],
}

const _: () = assert!(std::mem::size_of::<DictHeader>() as u64 == DICT_HEADER_BYTES);

fn not_a_dict(name: &str, why: &str) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, format!("segment \"{name}\" holds no column dictionary ({why})"))
        .hint("The segment was overwritten or is not a dictionary; drop the cache and build it again.")
}

/// Builds a dictionary in memory: strings interned as they come, then laid out whole.
#[derive(Default)]
pub struct DictBuilder {
    codes: HashMap<Vec<u8>, u32>,
    offsets: Vec<u64>,
    strings: Vec<u8>,
}

impl DictBuilder {
    /// The code of `s`, a new one (the next in order) the first time it is seen; 54000 past
    /// [`MAX_ENTRIES`] distinct strings.
    pub fn intern(&mut self, s: &[u8]) -> Result<u32> {
        if let Some(&c) = self.codes.get(s) {
            return Ok(c);
        }
        let code = self.offsets.len() as u64;
        if code >= MAX_ENTRIES {
            return Err(UvmError::new(
                Code::ProgramLimitExceeded,
                format!("a column dictionary holds at most {MAX_ENTRIES} strings"),
            ));
        }
        self.offsets.push(self.strings.len() as u64);
        self.strings.extend_from_slice(s);
        self.codes.insert(s.to_vec(), code as u32);
        Ok(code as u32)
    }

    pub fn len(&self) -> u64 {
        self.offsets.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Bytes the builder holds, roughly (strings twice: the area and the map's keys; the
    /// offsets; the map's own overhead): what a caller bounds.
    pub fn memory(&self) -> u64 {
        2 * self.strings.len() as u64 + 64 * self.offsets.len() as u64
    }

    /// The dictionary's bytes, as its segment holds them from offset 0.
    pub fn to_bytes(&self) -> Vec<u8> {
        let entries = self.offsets.len() as u64;
        let len = DICT_HEADER_BYTES + 8 * (entries + 1) + self.strings.len() as u64;
        let ends = std::iter::once(self.strings.len() as u64);
        lay_out(Vec::with_capacity(len as usize), entries, self.offsets.iter().copied().chain(ends), &[&self.strings])
    }
}

/// A dictionary's bytes into `out` (room reserved): the header of `entries` strings, their
/// `entries + 1` offsets, then the string areas `strings` back to back.
fn lay_out(mut out: Vec<u8>, entries: u64, offsets: impl Iterator<Item = u64>, strings: &[&[u8]]) -> Vec<u8> {
    let offsets_at = DICT_HEADER_BYTES;
    let h = DictHeader {
        magic: DICT_MAGIC,
        version: DICT_VERSION,
        entries,
        bytes: strings.iter().map(|s| s.len() as u64).sum(),
        offsets_at,
        strings_at: offsets_at + 8 * (entries + 1),
        ..DictHeader::default()
    };
    out.extend_from_slice(h.as_bytes());
    for o in offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
    for s in strings {
        out.extend_from_slice(s);
    }
    out
}

/// A parsed dictionary over its segment's bytes (only [`Dict::parse`] makes one).
pub struct Dict<'a> {
    offsets: &'a [u8],
    strings: &'a [u8],
    entries: u64,
}

/// A dictionary whose header and areas are checked, and its first and last offsets, but not
/// those between: for looking up the codes of a few rows in a large dictionary without walking
/// all of it ([`Dict::parse`] walks every offset). An entry whose offsets are out of order or
/// past the strings answers `None`.
pub struct DictLookup<'a> {
    dict: Dict<'a>,
}

impl<'a> DictLookup<'a> {
    /// The string of `code`; `None` for a code past the entries or a damaged entry. O(1).
    pub fn get(&self, code: u32) -> Option<&'a [u8]> {
        let c = u64::from(code);
        if c >= self.dict.entries {
            return None;
        }
        let (a, b) = (self.dict.offset(c), self.dict.offset(c + 1));
        self.dict.strings.get(usize::try_from(a).ok()?..usize::try_from(b).ok()?)
    }
}

impl<'a> Dict<'a> {
    /// Reads the dictionary in `bytes` for lookups ([`DictLookup`]): its header and areas
    /// checked, in time independent of its entries. Never reads past `bytes`, never panics.
    pub fn open(name: &str, bytes: &'a [u8]) -> Result<DictLookup<'a>> {
        Ok(DictLookup { dict: Dict::layout(name, bytes)? })
    }

    /// Reads and validates the dictionary in `bytes` (the segment's bytes from offset 0; `name`
    /// is for messages). Never reads past `bytes`, never panics; time bounded by the entries
    /// `bytes` can hold.
    pub fn parse(name: &str, bytes: &'a [u8]) -> Result<Dict<'a>> {
        let d = Dict::layout(name, bytes)?;
        // Rising offsets, from 0 to the string area's end.
        let mut prev = 0u64;
        let end = d.strings.len() as u64;
        for i in 0..=d.entries {
            let o = d.offset(i);
            if o < prev || o > end || (i == 0 && o != 0) || (i == d.entries && o != end) {
                return Err(not_a_dict(name, &format!("offset {i} ({o}) is out of order")));
            }
            prev = o;
        }
        Ok(d)
    }

    /// The header and areas of the dictionary in `bytes`, checked, and its first and last
    /// offsets (0 and the strings' length); the others not.
    fn layout(name: &str, bytes: &'a [u8]) -> Result<Dict<'a>> {
        let Ok((h, _)) = DictHeader::read_from_prefix(bytes) else {
            return Err(not_a_dict(name, "too small"));
        };
        if h.magic != DICT_MAGIC {
            return Err(not_a_dict(name, "no header"));
        }
        if h.version != DICT_VERSION || h._pad != 0 {
            return Err(not_a_dict(name, &format!("unknown version {}", h.version)));
        }
        let total = bytes.len() as u64;
        let offsets_end = h.entries.checked_add(1).and_then(|n| n.checked_mul(8)).and_then(|n| n.checked_add(h.offsets_at));
        let strings_end = h.strings_at.checked_add(h.bytes);
        let (Some(offsets_end), Some(strings_end)) = (offsets_end, strings_end) else {
            return Err(not_a_dict(name, "its sizes overflow"));
        };
        if h.entries > MAX_ENTRIES || h.offsets_at < DICT_HEADER_BYTES || offsets_end > h.strings_at || strings_end > total {
            return Err(not_a_dict(name, &format!("{} entries of {} bytes do not fit {total} bytes", h.entries, h.bytes)));
        }
        let d = Dict {
            offsets: &bytes[h.offsets_at as usize..offsets_end as usize],
            strings: &bytes[h.strings_at as usize..strings_end as usize],
            entries: h.entries,
        };
        // The first and last offsets, in O(1) (a lookup's string is then never a shifted one
        // at either end; `parse` checks every one between).
        if d.offset(0) != 0 || d.offset(d.entries) != h.bytes {
            return Err(not_a_dict(
                name,
                &format!("its offsets run from {} to {}, its strings from 0 to {}", d.offset(0), d.offset(d.entries), h.bytes),
            ));
        }
        Ok(d)
    }

    fn offset(&self, i: u64) -> u64 {
        let at = i as usize * 8;
        u64::from_le_bytes(self.offsets[at..at + 8].try_into().expect("8 bytes"))
    }

    pub fn len(&self) -> u64 {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The string of `code`; `None` for a code past the entries.
    pub fn get(&self, code: u32) -> Option<&'a [u8]> {
        let c = u64::from(code);
        (c < self.entries).then(|| &self.strings[self.offset(c) as usize..self.offset(c + 1) as usize])
    }

    /// Every (code, string), in code order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &'a [u8])> + '_ {
        (0..self.entries as u32).map(move |c| (c, self.get(c).expect("inside")))
    }

    /// The codes whose strings satisfy `keep` (a predicate PostgreSQL evaluates per distinct
    /// string), as a bitmap of `len()` bits, bit `c % 8` of byte `c / 8`: what a kernel tests a
    /// code against.
    pub fn select(&self, mut keep: impl FnMut(&[u8]) -> bool) -> Vec<u8> {
        let mut bits = vec![0u8; (self.entries as usize).div_ceil(8)];
        for (c, s) in self.iter() {
            if keep(s) {
                bits[c as usize / 8] |= 1 << (c % 8);
            }
        }
        bits
    }
}

/// How far from a dictionary segment's start its header, offsets and strings in use reach, by
/// its header alone (`header`: the segment's first [`DICT_HEADER_BYTES`]), so that a dictionary
/// with room reserved ([`Reserved`]) is read that far and not whole; `None` where it holds no
/// string (nothing past the header to read). Checked only for overflow: [`Dict::parse`] checks
/// the bytes then read.
pub fn in_use_len(name: &str, header: &[u8]) -> Result<Option<u64>> {
    let Ok((h, _)) = DictHeader::read_from_prefix(header) else {
        return Err(not_a_dict(name, "too small"));
    };
    if h.magic == DICT_MAGIC && h.entries == 0 {
        return Ok(None);
    }
    let offsets_end = h.entries.checked_add(1).and_then(|n| n.checked_mul(8)).and_then(|n| n.checked_add(h.offsets_at));
    let strings_end = h.strings_at.checked_add(h.bytes);
    match (offsets_end, strings_end) {
        (Some(o), Some(s)) => Ok(Some(o.max(s).max(DICT_HEADER_BYTES))),
        _ => Err(not_a_dict(name, "its sizes overflow")),
    }
}

/// A dictionary's strings then another's, laid out as one: codes `0..base.len()` are `base`'s,
/// `base.len()..` are `more`'s in their order (a column's dictionary and the strings appends
/// added after its build, [`Reserved`]).
pub fn concat(base: &Dict<'_>, more: &Dict<'_>) -> Result<Vec<u8>> {
    let entries = base.entries + more.entries;
    if entries > MAX_ENTRIES {
        return Err(UvmError::new(
            Code::ProgramLimitExceeded,
            format!("a column dictionary holds at most {MAX_ENTRIES} strings"),
        ));
    }
    let bb = base.strings.len() as u64;
    let len = DICT_HEADER_BYTES + 8 * (entries + 1) + bb + more.strings.len() as u64;
    let mut out = Vec::new();
    out.try_reserve_exact(len as usize).map_err(|_| UvmError::new(Code::OutOfMemory, "out of memory for a column dictionary"))?;
    let offsets = (0..base.entries).map(|i| base.offset(i)).chain((0..=more.entries).map(|i| bb + more.offset(i)));
    Ok(lay_out(out, entries, offsets, &[base.strings, more.strings]))
}

/// A dictionary segment with room reserved for strings added after it was made: the layout of
/// the module's table with the offsets' area sized for `entries` strings and the string area
/// for `bytes`, the header counting those in use. An appender (holding the column's lock)
/// writes a string's bytes and its end offset past the ones in use, then the header, so a
/// reader that reads the header first sees only whole strings ([`Dict::parse`] accepts the
/// unused room).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserved {
    pub entries: u64,
    pub bytes: u64,
}

/// What [`Reserved::append`] asks to be written: the strings' bytes at `strings`' offset, their
/// end offsets at `offsets`', then the header.
pub struct Appended {
    pub strings: (u64, Vec<u8>),
    pub offsets: (u64, Vec<u8>),
    pub header: Vec<u8>,
}

impl Reserved {
    fn strings_at(&self) -> u64 {
        DICT_HEADER_BYTES + 8 * (self.entries + 1)
    }

    /// The segment's size.
    pub fn size(&self) -> u64 {
        self.strings_at() + self.bytes
    }

    fn header(&self, entries: u64, bytes: u64) -> Vec<u8> {
        let h = DictHeader {
            magic: DICT_MAGIC,
            version: DICT_VERSION,
            entries,
            bytes,
            offsets_at: DICT_HEADER_BYTES,
            strings_at: self.strings_at(),
            ..DictHeader::default()
        };
        h.as_bytes().to_vec()
    }

    /// The bytes an empty one starts with: its header and the first offset (0).
    pub fn empty(&self) -> Vec<u8> {
        let mut out = self.header(0, 0);
        out.extend_from_slice(&0u64.to_le_bytes());
        out
    }

    /// An empty one's bytes as far as [`Dict::parse`] reads them (its header and its offsets'
    /// area, up to where the strings start): what an appender parses where a reader found no
    /// string in use ([`in_use_len`]) and read no further.
    pub fn empty_parsable(&self) -> Vec<u8> {
        let mut out = self.empty();
        out.resize(self.strings_at() as usize, 0);
        out
    }

    /// The writes that add `strings` after the `entries` strings of `used` bytes a parsed one
    /// holds (`dict`); `None` where they do not fit its room.
    pub fn append(&self, dict: &Dict<'_>, strings: &[&[u8]]) -> Option<Appended> {
        let (entries, used) = (dict.entries, dict.strings.len() as u64);
        let add: u64 = strings.iter().map(|s| s.len() as u64).sum();
        if entries + strings.len() as u64 > self.entries || used + add > self.bytes {
            return None;
        }
        let mut bytes = Vec::with_capacity(add as usize);
        let mut offsets = Vec::with_capacity(8 * strings.len());
        for s in strings {
            bytes.extend_from_slice(s);
            offsets.extend_from_slice(&(used + bytes.len() as u64).to_le_bytes());
        }
        Some(Appended {
            strings: (self.strings_at() + used, bytes),
            offsets: (DICT_HEADER_BYTES + 8 * (entries + 1), offsets),
            header: self.header(entries + strings.len() as u64, used + add),
        })
    }
}
