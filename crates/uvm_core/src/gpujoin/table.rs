//! The hash table's layout, build and probe (CPU). See the module documentation.
//!
//! # Untrusted bytes
//!
//! A table lives in a shared segment that any process with the owner's privileges may
//! overwrite at any time (`uvm.write_segment`, a buggy client, a concurrent build). So:
//!
//! - [`parse_header`] validates every field of the header against the segment's size before
//!   anything is read past it: magic, version, hash id, key type, a slot count that is a power
//!   of two, at least [`MIN_SLOTS`] and at least twice the rows, the slots' offset, and slots
//!   that end inside the segment.
//! - Slots are read and written through raw pointers with volatile accesses, bounded by the
//!   validated slot count, never through a `&[Slot]` (another process writing while we read
//!   would be a data race on a Rust reference).
//! - Every walk along a probe chain stops after `slot_count` steps. A valid table always has an
//!   empty slot (at most half of them are used), so only a corrupted table reaches the bound;
//!   the probe then fails with 22023 ([`corrupted`]) instead of spinning. A table overwritten
//!   while it is probed gives that ERROR or a wrong but bounded answer, never a hang or a crash.
//! - The walks count their steps ([`Ticks`]) and check for interrupts every
//!   [`interrupt::EVERY`] steps, across keys and inside one long chain alike, so that cancel
//!   and `statement_timeout` act within milliseconds however the work is spread.
//!
//! # Building
//!
//! A [`Builder`] zeroes the header first (so that the half-made table never validates), then
//! the slots, inserts the rows one by one (streamed: the SQL layer feeds it a cursor's batches),
//! and writes the header last ([`Builder::finish`]). The kernels follow the same order.

use std::cell::Cell;
use std::marker::PhantomData;

use crate::checksum::mix;
use crate::error::{Code, Result, UvmError};
use crate::interrupt;
use crate::segment::{Env, Pin};

pub const MAGIC: u64 = u64::from_le_bytes(*b"UVMHASH1");
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: u64 = 64;
pub const SLOT_BYTES: u64 = 24;
/// Hash function ids stored in the header.
pub const HASH_MIX64: u32 = 1;
/// The fewest slots a table has.
pub const MIN_SLOTS: u64 = 16;
/// 8-byte words per slot.
const SLOT_WORDS: usize = 3;

/// Key types a table can hold (the value is the key's width in bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum KeyType {
    Int4 = 4,
    Int8 = 8,
}

impl KeyType {
    pub fn sql_name(self) -> &'static str {
        match self {
            KeyType::Int4 => "integer",
            KeyType::Int8 => "bigint",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Header {
    pub magic: u64,
    pub version: u32,
    pub key_type: u32,
    pub slot_count: u64,
    pub row_count: u64,
    pub null_rows: u64,
    pub hash: u32,
    pub _pad: u32,
    pub seed: u64,
    pub slots_offset: u64,
}

const _: () = assert!(std::mem::size_of::<Header>() as u64 == HEADER_BYTES);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Slot {
    pub tag: u64,
    pub key: i64,
    pub payload: i64,
}

const _: () = assert!(std::mem::size_of::<Slot>() as u64 == SLOT_BYTES);
const _: () = assert!(SLOT_WORDS as u64 * 8 == SLOT_BYTES);

/// Slots for `rows` non-NULL rows: a power of two, at least twice the rows (and [`MIN_SLOTS`]).
/// Saturates at 2^63 for absurd row counts (which no segment can hold).
pub fn slot_count(rows: u64) -> u64 {
    (rows.saturating_mul(2)).max(MIN_SLOTS).checked_next_power_of_two().unwrap_or(1 << 63)
}

/// Bytes a table of `rows` non-NULL rows needs (saturating).
pub fn table_bytes(rows: u64) -> u64 {
    slot_count(rows).saturating_mul(SLOT_BYTES).saturating_add(HEADER_BYTES)
}

#[inline]
pub fn tag(key: i64, seed: u64) -> u64 {
    mix(key as u64 ^ seed) | 1
}

fn not_a_table(name: &str, why: &str) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, format!("segment \"{name}\" holds no GpuJoin hash table ({why})"))
        .hint("Build one with uvm.gpujoin_build first.")
}

/// The error of a table whose slots contradict its header (a probe chain without an empty slot,
/// a build that finds no free slot): the segment was overwritten.
pub fn corrupted(name: &str, why: &str) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, format!("GpuJoin hash table in segment \"{name}\" is corrupted: {why}"))
        .hint("The segment was overwritten; drop it and build the table again with uvm.gpujoin_build.")
}

/// Reads and validates the header at the start of `bytes` for a table in a segment of `total`
/// bytes (`name` is for messages). Never reads past `bytes`, never panics.
pub fn parse_header(name: &str, bytes: &[u8], total: u64) -> Result<Header> {
    if (bytes.len() as u64) < HEADER_BYTES || total < HEADER_BYTES {
        return Err(not_a_table(name, "too small"));
    }
    // SAFETY: `bytes` holds at least a header; read_unaligned copes with any alignment, and
    // every bit pattern is a valid Header (plain integers).
    let header: Header = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const Header) };
    if header.magic != MAGIC {
        return Err(not_a_table(name, "no header"));
    }
    if header.version != VERSION || header.hash != HASH_MIX64 || header._pad != 0 {
        return Err(not_a_table(name, "unknown version"));
    }
    if header.key_type != KeyType::Int4 as u32 && header.key_type != KeyType::Int8 as u32 {
        return Err(not_a_table(name, &format!("unknown key type {}", header.key_type)));
    }
    let n = header.slot_count;
    if !n.is_power_of_two() || n < MIN_SLOTS {
        return Err(not_a_table(name, &format!("slot count {n} is not a power of two of at least {MIN_SLOTS}")));
    }
    if header.row_count.checked_mul(2).is_none_or(|r| r > n) {
        return Err(not_a_table(name, &format!("{} rows do not fit in {n} slots at half load", header.row_count)));
    }
    if header.slots_offset != HEADER_BYTES {
        return Err(not_a_table(name, &format!("slots at offset {}, not {HEADER_BYTES}", header.slots_offset)));
    }
    match n.checked_mul(SLOT_BYTES).and_then(|b| b.checked_add(HEADER_BYTES)) {
        Some(end) if end <= total => Ok(header),
        _ => Err(not_a_table(name, &format!("{n} slots do not fit in {total} bytes"))),
    }
}

/// The header a table of `stored` non-NULL rows (and `null_rows` NULL keys) gets.
pub fn header_for(key_type: KeyType, stored: u64, null_rows: u64, seed: u64) -> Header {
    Header {
        magic: MAGIC,
        version: VERSION,
        key_type: key_type as u32,
        slot_count: slot_count(stored),
        row_count: stored,
        null_rows,
        hash: HASH_MIX64,
        _pad: 0,
        seed,
        slots_offset: HEADER_BYTES,
    }
}

/// The table in a pinned segment (wherever its first chunk lies): its validated header, checked
/// to hold `key_type` keys, and the address of its slots for kernels (`slot_count` slots, inside
/// the pinned segment).
pub fn locate<E: Env>(pin: &Pin<E>, key_type: KeyType) -> Result<(Header, u64)> {
    let name = &pin.info().name;
    let mut raw = [0u8; HEADER_BYTES as usize];
    if pin.info().size < HEADER_BYTES {
        return Err(not_a_table(name, "too small"));
    }
    pin.read_into(0, &mut raw)?;
    let header = parse_header(name, &raw, pin.info().size)?;
    header.check_key_type(name, key_type)?;
    let slots = pin.addr(HEADER_BYTES as i64, (header.slot_count * SLOT_BYTES) as i64)?;
    Ok((header, slots))
}

impl Header {
    /// Fails (42804) unless the table holds keys of `key_type`.
    pub fn check_key_type(&self, name: &str, key_type: KeyType) -> Result<()> {
        let t = self.key_type();
        if t != key_type {
            return Err(UvmError::new(
                Code::DatatypeMismatch,
                format!("segment \"{name}\" holds {} keys, not {}", t.sql_name(), key_type.sql_name()),
            ));
        }
        Ok(())
    }

    pub fn key_type(&self) -> KeyType {
        if self.key_type == KeyType::Int4 as u32 {
            KeyType::Int4
        } else {
            KeyType::Int8
        }
    }

    pub fn as_bytes(&self) -> [u8; HEADER_BYTES as usize] {
        // SAFETY: Header is repr(C) plain data of exactly HEADER_BYTES bytes, without padding.
        unsafe { std::mem::transmute_copy(self) }
    }
}

/// Steps walked, for interrupt checks every [`interrupt::EVERY`] steps, however they are spread
/// over keys: a key's walk adds its steps when it ends (one add and a compare), and a walk that
/// is long by itself checks on its way.
#[derive(Debug, Default)]
struct Ticks(Cell<u64>);

impl Ticks {
    #[inline(always)]
    fn add(&self, steps: u64) -> Result<()> {
        let before = self.0.get();
        let after = before.wrapping_add(steps);
        self.0.set(after);
        if before / interrupt::EVERY != after / interrupt::EVERY {
            interrupt::check()
        } else {
            Ok(())
        }
    }
}

/// A validated table in memory that other processes may write to concurrently: its header
/// (copied once) and a raw pointer to its `slot_count` slots, read with volatile loads.
pub struct Table<'a> {
    header: Header,
    name: &'a str,
    /// `header.slot_count * SLOT_WORDS` 8-byte-aligned words, readable for `'a`.
    slots: *const u64,
    ticks: Ticks,
    _bytes: PhantomData<&'a [u8]>,
}

impl<'a> Table<'a> {
    /// Validates the header against the size of `bytes` and views them as a table (`name` is
    /// the segment's, for messages).
    pub fn view(name: &'a str, bytes: &'a [u8]) -> Result<Table<'a>> {
        let header = parse_header(name, bytes, bytes.len() as u64)?;
        // SAFETY: parse_header checked that HEADER_BYTES + slot_count * SLOT_BYTES <= len.
        let start = unsafe { bytes.as_ptr().add(HEADER_BYTES as usize) };
        if !(start as usize).is_multiple_of(std::mem::align_of::<u64>()) {
            return Err(not_a_table(name, "misaligned"));
        }
        Ok(Table { header, name, slots: start as *const u64, ticks: Ticks::default(), _bytes: PhantomData })
    }

    /// [`Table::view`] of a table's bytes held in words (aligned, as a copy read out of its
    /// segment is).
    pub fn view_words(name: &'a str, words: &'a [u64]) -> Result<Table<'a>> {
        Table::view(name, zerocopy::IntoBytes::as_bytes(words))
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The segment's name (for messages).
    pub fn name(&self) -> &'a str {
        self.name
    }

    pub fn key_type(&self) -> KeyType {
        self.header.key_type()
    }

    /// Word `w` of slot `i` (`i < slot_count`, `w < SLOT_WORDS`), read once.
    #[inline(always)]
    fn word(&self, i: u64, w: usize) -> u64 {
        debug_assert!(i < self.header.slot_count && w < SLOT_WORDS);
        // SAFETY: i < slot_count (every caller masks with slot_count - 1, a power of two) and
        // w < SLOT_WORDS, so the word lies in the validated, aligned slot array, which `'a`
        // keeps mapped. The load is volatile: another process may write it at any time, and
        // any bit pattern is a valid u64.
        unsafe { std::ptr::read_volatile(self.slots.add(i as usize * SLOT_WORDS + w)) }
    }

    /// Walks `key`'s chain, calling `f(payload)` for every row whose key equals `key`. Returns
    /// the steps walked, or `None` when `slot_count` steps found no empty slot (a corrupted
    /// table). A walk longer than [`interrupt::EVERY`] steps checks for interrupts on its way;
    /// the inner loop has no other branch than the bound's.
    #[inline(always)]
    fn walk(&self, key: i64, mut f: impl FnMut(i64)) -> Result<Option<u64>> {
        let t = tag(key, self.header.seed);
        let n = self.header.slot_count;
        let mask = n - 1;
        let mut i = t & mask;
        let mut walked = 0u64;
        loop {
            let lim = (n - walked).min(interrupt::EVERY);
            for step in 0..lim {
                let st = self.word(i, 0);
                if st == 0 {
                    return Ok(Some(walked + step + 1));
                }
                if st == t && self.word(i, 1) as i64 == key {
                    f(self.word(i, 2) as i64);
                }
                i = (i + 1) & mask;
            }
            walked += lim;
            if walked == n {
                return Ok(None);
            }
            interrupt::check()?;
        }
    }

    fn no_empty_slot(&self) -> UvmError {
        corrupted(self.name, &format!("a probe found no empty slot in {} slots", self.header.slot_count))
    }

    /// Calls `f(payload)` for every row whose key equals `key`. Walks at most `slot_count`
    /// slots: a chain without an empty slot is a corrupted table (22023).
    #[inline]
    pub fn for_each_match(&self, key: i64, f: impl FnMut(i64)) -> Result<()> {
        match self.walk(key, f)? {
            Some(steps) => self.ticks.add(steps),
            None => Err(self.no_empty_slot()),
        }
    }

    /// Matches and payload sum of `keys` (non-NULL keys: NULL keys never match). Checks for
    /// interrupts every [`interrupt::EVERY`] steps, however they are spread over the keys.
    pub fn probe(&self, keys: &[i64]) -> Result<(u64, i128)> {
        let (mut matches, mut sum) = (0u64, 0i128);
        let mut ticks = 0u64;
        for k in keys {
            let walked = self.walk(*k, |p| {
                matches += 1;
                sum += p as i128;
            })?;
            ticks += walked.ok_or_else(|| self.no_empty_slot())?;
            if ticks >= interrupt::EVERY {
                ticks = 0;
                interrupt::check()?;
            }
        }
        Ok((matches, sum))
    }
}

/// Builds a table in place, a row at a time: zeroes the header and the slots, inserts, and
/// writes the header last ([`Builder::finish`]), so that the table validates only once whole.
pub struct Builder<'a> {
    name: &'a str,
    seed: u64,
    key_type: KeyType,
    /// The table's first byte; `HEADER_BYTES + slot_count * SLOT_BYTES` writable bytes.
    base: *mut u8,
    slot_count: u64,
    /// Non-NULL rows the table may hold (it is sized for them), and those inserted so far.
    capacity: u64,
    stored: u64,
    null_rows: u64,
    ticks: Ticks,
    _bytes: PhantomData<&'a mut [u8]>,
}

impl<'a> Builder<'a> {
    /// A builder for up to `rows` non-NULL rows into `bytes` (at least `table_bytes(rows)` long,
    /// 8-byte aligned), which it zeroes (`name` is the segment's, for messages).
    pub fn new(name: &'a str, bytes: &'a mut [u8], key_type: KeyType, rows: u64, seed: u64) -> Result<Builder<'a>> {
        let n = slot_count(rows);
        let need = table_bytes(rows);
        if (bytes.len() as u64) < need {
            return Err(UvmError::new(
                Code::ProgramLimitExceeded,
                format!("a hash table of {rows} rows needs {need} bytes, the segment has {}", bytes.len()),
            ));
        }
        if !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<u64>()) {
            return Err(UvmError::new(Code::SystemError, "hash table memory is misaligned"));
        }
        // The header first: from here on the segment is no table until `finish`.
        bytes[..HEADER_BYTES as usize].fill(0);
        for part in bytes[HEADER_BYTES as usize..need as usize].chunks_mut(1 << 20) {
            part.fill(0);
            interrupt::check()?;
        }
        Ok(Builder {
            name,
            seed,
            key_type,
            base: bytes.as_mut_ptr(),
            slot_count: n,
            capacity: rows,
            stored: 0,
            null_rows: 0,
            ticks: Ticks::default(),
            _bytes: PhantomData,
        })
    }

    /// A builder that goes on inserting into the `slot_count` slots of a table in `bytes` that
    /// an earlier builder (or `uvm_join_build`) started: nothing is zeroed, and the rows are
    /// bounded by the caller (who counts them), not by this builder. For inserts that arrive a
    /// batch at a time from another process (the GPU service's build requests).
    pub fn resume(name: &'a str, bytes: &'a mut [u8], key_type: KeyType, slot_count: u64, seed: u64) -> Result<Builder<'a>> {
        let need = slot_count.checked_mul(SLOT_BYTES).and_then(|b| b.checked_add(HEADER_BYTES));
        if !slot_count.is_power_of_two() || need.is_none_or(|n| (bytes.len() as u64) < n) {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!("segment \"{name}\" cannot hold a hash table of {slot_count} slots"),
            ));
        }
        if !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<u64>()) {
            return Err(UvmError::new(Code::SystemError, "hash table memory is misaligned"));
        }
        Ok(Builder {
            name,
            seed,
            key_type,
            base: bytes.as_mut_ptr(),
            slot_count,
            capacity: u64::MAX,
            stored: 0,
            null_rows: 0,
            ticks: Ticks::default(),
            _bytes: PhantomData,
        })
    }

    /// Pointer to word `w` of slot `i` (`i < slot_count`, `w < SLOT_WORDS`).
    #[inline(always)]
    fn word(&self, i: u64, w: usize) -> *mut u64 {
        debug_assert!(i < self.slot_count && w < SLOT_WORDS);
        // SAFETY: `new` checked that the bytes hold HEADER_BYTES + slot_count slots and are
        // 8-byte aligned (HEADER_BYTES and SLOT_BYTES are multiples of 8); i and w are in range.
        unsafe { (self.base.add(HEADER_BYTES as usize) as *mut u64).add(i as usize * SLOT_WORDS + w) }
    }

    /// Inserts a row (a NULL key is only counted). Fails with 22023 when the rows outnumber
    /// those the table was sized for, or when no empty slot is left (the segment was
    /// overwritten while it was being built): the walk is bounded by `slot_count`.
    pub fn insert(&mut self, key: Option<i64>, payload: i64) -> Result<()> {
        let Some(key) = key else {
            self.null_rows += 1;
            return self.ticks.add(1);
        };
        if self.stored >= self.capacity {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!("the gpujoin_build query returned more than the {} rows it counted first", self.capacity),
            )
            .hint("The query must return the same rows when it is read twice; avoid volatile functions in it."));
        }
        let t = tag(key, self.seed);
        let mask = self.slot_count - 1;
        let mut i = t & mask;
        for step in 1..self.slot_count + 1 {
            // SAFETY: `word` points into the table's slots (see there); volatile, because other
            // processes may write the segment concurrently.
            unsafe {
                if std::ptr::read_volatile(self.word(i, 0)) == 0 {
                    std::ptr::write_volatile(self.word(i, 1), key as u64);
                    std::ptr::write_volatile(self.word(i, 2), payload as u64);
                    std::ptr::write_volatile(self.word(i, 0), t);
                    self.stored += 1;
                    return self.ticks.add(step);
                }
            }
            i = (i + 1) & mask;
            interrupt::check_every(step)?;
        }
        Err(corrupted(self.name, &format!("a build found no empty slot in {} slots", self.slot_count)))
    }

    /// Non-NULL rows inserted, and NULL keys counted.
    pub fn rows(&self) -> (u64, u64) {
        (self.stored, self.null_rows)
    }

    /// Writes the header, last: the table is valid from here on. Returns it.
    pub fn finish(self) -> Header {
        let mut header = header_for(self.key_type, self.stored, self.null_rows, self.seed);
        header.slot_count = self.slot_count; // sized for `capacity` rows, maybe more than `stored` needs
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: the first HEADER_BYTES bytes are ours (checked in `new`); write_unaligned
        // copes with any alignment.
        unsafe { std::ptr::write_unaligned(self.base as *mut Header, header) };
        header
    }
}

/// Builds a table of `rows` (key, payload) into `bytes` (at least `table_bytes(non-NULL rows)`
/// long, 8-byte aligned). Returns the header written.
pub fn build(bytes: &mut [u8], key_type: KeyType, rows: &[(Option<i64>, i64)], seed: u64) -> Result<Header> {
    let stored = rows.iter().filter(|r| r.0.is_some()).count() as u64;
    let mut b = Builder::new("(memory)", bytes, key_type, stored, seed)?;
    for (key, payload) in rows {
        b.insert(*key, *payload)?;
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn buffer(bytes: u64) -> Vec<u64> {
        vec![0u64; (bytes as usize).div_ceil(8)]
    }

    fn as_bytes(v: &mut [u64]) -> &mut [u8] {
        // SAFETY: reinterpreting a u64 buffer as its bytes.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 8) }
    }

    /// The reference: a nested-loop join's count and payload sum.
    fn reference(rows: &[(Option<i64>, i64)], keys: &[Option<i64>]) -> (u64, i128) {
        let mut by_key: HashMap<i64, Vec<i64>> = HashMap::new();
        for (k, p) in rows {
            if let Some(k) = k {
                by_key.entry(*k).or_default().push(*p);
            }
        }
        let (mut m, mut s) = (0u64, 0i128);
        for k in keys.iter().flatten() {
            for p in by_key.get(k).into_iter().flatten() {
                m += 1;
                s += *p as i128;
            }
        }
        (m, s)
    }

    fn check(rows: &[(Option<i64>, i64)], keys: &[Option<i64>]) {
        let stored = rows.iter().filter(|r| r.0.is_some()).count() as u64;
        let mut buf = buffer(table_bytes(stored));
        let h = build(as_bytes(&mut buf), KeyType::Int8, rows, 0x1234).unwrap();
        assert_eq!((h.row_count, h.null_rows), (stored, rows.len() as u64 - stored));
        let t = Table::view("t", as_bytes(&mut buf)).unwrap();
        let non_null: Vec<i64> = keys.iter().flatten().copied().collect();
        assert_eq!(t.probe(&non_null).unwrap(), reference(rows, keys));
    }

    #[test]
    fn duplicates_nulls_misses_and_extreme_keys() {
        let rows: Vec<(Option<i64>, i64)> = vec![
            (Some(1), 10),
            (Some(1), 11),
            (Some(2), 20),
            (None, 99),
            (Some(i64::MIN), -5),
            (Some(i64::MAX), 7),
            (Some(0), 0),
            (Some(-1), -100),
        ];
        let keys = vec![Some(1), Some(1), Some(3), None, Some(i64::MIN), Some(i64::MAX), Some(0), Some(-1), Some(2)];
        check(&rows, &keys);
        check(&rows, &[None, None]); // NULL probe keys never match
        check(&[], &[Some(1)]); // empty table
        check(&[(None, 1)], &[None, Some(1)]); // only NULL keys
    }

    #[test]
    fn uniform_skewed_all_hit_all_miss() {
        let mut x = 7u64;
        let mut next = || {
            x = mix(x);
            x
        };
        let rows: Vec<(Option<i64>, i64)> = (0..5000).map(|i| (Some((next() % 3000) as i64), i)).collect();
        let uniform: Vec<Option<i64>> = (0..20000).map(|_| Some((next() % 6000) as i64)).collect();
        check(&rows, &uniform);
        // skewed: most probes hit a handful of keys
        let skewed: Vec<Option<i64>> =
            (0..20000).map(|i| Some(if i % 10 < 8 { (i % 3) as i64 } else { (next() % 3000) as i64 })).collect();
        check(&rows, &skewed);
        let all_miss: Vec<Option<i64>> = (0..1000).map(|i| Some(10_000 + i)).collect();
        check(&rows, &all_miss);
        let all_hit: Vec<Option<i64>> = rows.iter().map(|r| r.0).collect();
        check(&rows, &all_hit);
    }

    #[test]
    fn sizes() {
        assert_eq!(slot_count(0), 16);
        assert_eq!(slot_count(9), 32);
        assert_eq!(slot_count(1 << 20), 1 << 21);
        assert_eq!(slot_count(u64::MAX), 1 << 63);
        assert_eq!(table_bytes(0), 64 + 16 * 24);
        assert_eq!(table_bytes(u64::MAX), u64::MAX);
        let mut small = buffer(100);
        assert_eq!(build(as_bytes(&mut small), KeyType::Int8, &[(Some(1), 1)], 0).unwrap_err().code, Code::ProgramLimitExceeded);
    }

    #[test]
    fn foreign_bytes_are_not_a_table() {
        let mut buf = buffer(4096);
        let e = Table::view("t", as_bytes(&mut buf)).err().unwrap();
        assert_eq!(e.code, Code::InvalidParameterValue);
        assert!(e.message.contains("holds no GpuJoin hash table"), "{e}");
        build(as_bytes(&mut buf), KeyType::Int4, &[(Some(5), 1)], 0).unwrap();
        let t = Table::view("t", as_bytes(&mut buf)).unwrap();
        assert_eq!(t.key_type(), KeyType::Int4);
        // a truncated view is refused
        let b = as_bytes(&mut buf);
        assert!(Table::view("t", &b[..100]).is_err());
        // a header of another version is refused
        b[8] = 9;
        assert!(Table::view("t", b).is_err());
    }

    /// Overwrites the header field at byte `at` of a freshly built table and returns the error.
    fn corrupt_field(at: usize, value: u64) -> UvmError {
        let rows: Vec<(Option<i64>, i64)> = (0..10).map(|i| (Some(i), i)).collect();
        let mut buf = buffer(table_bytes(10) + 4096);
        build(as_bytes(&mut buf), KeyType::Int8, &rows, 3).unwrap();
        let b = as_bytes(&mut buf);
        b[at..at + 8].copy_from_slice(&value.to_le_bytes());
        Table::view("t", b).err().expect("refused")
    }

    #[test]
    fn every_header_field_is_validated() {
        let why = |at, v| corrupt_field(at, v).message;
        assert!(why(16, 1).contains("slot count 1 is not a power of two of at least 16"), "{}", why(16, 1));
        assert!(why(16, 8).contains("slot count 8"));
        assert!(why(16, 48).contains("slot count 48"));
        assert!(why(16, 1 << 40).contains("do not fit in"));
        assert!(why(16, 1 << 63).contains("do not fit in"));
        assert!(why(24, 17).contains("17 rows do not fit in 32 slots"), "{}", why(24, 17));
        assert!(why(24, u64::MAX).contains("rows do not fit"));
        assert!(why(56, 72).contains("slots at offset 72"));
        assert!(why(8, 1 | (3 << 32)).contains("unknown key type 3"), "{}", why(8, 1 | (3 << 32)));
        assert!(why(8, 2 | (8 << 32)).contains("unknown version"));
        assert!(why(40, 2).contains("unknown version")); // hash id
        assert!(why(40, 1 | (1 << 32)).contains("unknown version")); // padding
        assert!(why(0, 0).contains("no header"));
        // a table cut short: the slots end past the segment
        let mut buf = buffer(table_bytes(1));
        build(as_bytes(&mut buf), KeyType::Int8, &[(Some(1), 1)], 3).unwrap();
        let b = as_bytes(&mut buf);
        assert!(Table::view("t", &b[..b.len() - 8]).err().unwrap().message.contains("do not fit in"));
        assert!(parse_header("t", b, 63).is_err() && parse_header("t", &b[..63], 4096).is_err());
    }

    /// The reproduction, on the slot side: a header that is valid and slots that are
    /// all occupied (no empty slot ends a chain). The probe ends after slot_count steps with
    /// an ERROR instead of spinning, and so does a build into such slots.
    #[test]
    fn a_full_table_ends_the_probe_with_an_error() {
        let mut buf = buffer(table_bytes(4));
        build(as_bytes(&mut buf), KeyType::Int8, &[(Some(1), 1), (Some(2), 2)], 3).unwrap();
        for s in 0..16 {
            buf[8 + s * 3] = 7; // every tag non-zero, none matching
        }
        let t = Table::view("ht1", as_bytes(&mut buf)).unwrap();
        let e = t.probe(&[1, 2, 3]).unwrap_err();
        assert_eq!(e.code, Code::InvalidParameterValue);
        assert_eq!(e.message, "GpuJoin hash table in segment \"ht1\" is corrupted: a probe found no empty slot in 16 slots");
        let mut buf2 = buffer(table_bytes(4));
        let mut b2 = Builder::new("ht1", as_bytes(&mut buf2), KeyType::Int8, 4, 0).unwrap();
        for i in 0..16 {
            // SAFETY: the builder's own pointer to slot i's tag (i < 16 slots); fills every
            // tag as another process could.
            unsafe { std::ptr::write_volatile(b2.word(i, 0), 5) };
        }
        assert!(b2.insert(Some(9), 9).unwrap_err().message.contains("a build found no empty slot in 16 slots"));
    }

    #[test]
    fn the_header_comes_last_and_counts_are_checked() {
        let mut buf = buffer(table_bytes(2));
        build(as_bytes(&mut buf), KeyType::Int8, &[(Some(1), 1)], 3).unwrap();
        let mut b = Builder::new("t", as_bytes(&mut buf), KeyType::Int8, 2, 3).unwrap();
        b.insert(Some(1), 1).unwrap();
        b.insert(None, 5).unwrap();
        b.insert(Some(2), 2).unwrap();
        assert_eq!(b.insert(Some(3), 3).unwrap_err().code, Code::InvalidParameterValue, "more rows than counted");
        assert_eq!(b.rows(), (2, 1));
        // before finish the old table is gone (header zeroed first)
        // SAFETY: the builder's base points to the header of our own, live buffer.
        let magic = unsafe { std::ptr::read(b.base as *const u64) };
        assert_eq!(magic, 0);
        let h = b.finish();
        assert_eq!((h.row_count, h.null_rows, h.slot_count), (2, 1, 16));
        let t = Table::view("t", as_bytes(&mut buf)).unwrap();
        assert_eq!(t.probe(&[1, 2, 3]).unwrap(), (2, 3));
    }

    #[test]
    fn the_probe_answers_the_interrupt_hook_inside_a_long_chain() {
        std::thread::spawn(|| {
            fn cancel() -> Result<()> {
                Err(UvmError::new(Code::QueryCanceled, "canceling statement due to user request"))
            }
            let n = 1u64 << 17;
            let mut buf = buffer(HEADER_BYTES + n * SLOT_BYTES);
            let header = Header { slot_count: n, ..header_for(KeyType::Int8, 0, 0, 1) };
            let b = as_bytes(&mut buf);
            b[..64].copy_from_slice(&header.as_bytes());
            for w in buf[8..].iter_mut().step_by(3) {
                *w = 2; // all occupied: a corrupted table whose chains are 2^17 slots long
            }
            let t = Table::view("t", as_bytes(&mut buf)).unwrap();
            assert!(t.probe(&[1]).unwrap_err().message.contains("corrupted"));
            // a valid table of 3 rows, whose chains are a few steps long
            let mut small = buffer(table_bytes(3));
            build(as_bytes(&mut small), KeyType::Int8, &[(Some(1), 1), (Some(2), 2), (Some(3), 3)], 5).unwrap();
            let small = Table::view("t", as_bytes(&mut small)).unwrap();
            let mut inserting = buffer(table_bytes(crate::interrupt::EVERY));
            let mut builder = Builder::new("t", as_bytes(&mut inserting), KeyType::Int8, crate::interrupt::EVERY, 5).unwrap();
            crate::interrupt::install(cancel);
            assert_eq!(t.probe(&[1]).unwrap_err().code, Code::QueryCanceled);
            // inserts count their steps too
            let canceled_at = (0..crate::interrupt::EVERY as i64).position(|i| builder.insert(Some(i), i).is_err());
            assert!(canceled_at.is_some_and(|n| n > 0), "{canceled_at:?}");
            // many short walks add up: EVERY keys check at least once
            assert!(small.probe(&[1; 100]).is_ok(), "100 short walks: no check yet");
            let keys = vec![1i64; crate::interrupt::EVERY as usize];
            assert_eq!(small.probe(&keys).unwrap_err().code, Code::QueryCanceled);
            // and so does a build (its zeroing, then its inserts)
            let mut b = buffer(table_bytes(crate::interrupt::EVERY));
            let rows: Vec<(Option<i64>, i64)> = (0..crate::interrupt::EVERY as i64).map(|i| (Some(i), i)).collect();
            assert_eq!(build(as_bytes(&mut b), KeyType::Int8, &rows, 5).unwrap_err().code, Code::QueryCanceled);
        })
        .join()
        .unwrap();
    }

    /// Header fields that are mostly valid, so that the checks past the magic get exercised.
    fn header_words() -> impl Strategy<Value = [u64; 8]> {
        let word = |good: u64| prop_oneof![3 => Just(good), 1 => any::<u64>(), 1 => 0u64..64];
        (
            word(MAGIC),
            prop_oneof![3 => Just(1u64 | 8 << 32), 1 => Just(1u64 | 4 << 32), 1 => any::<u64>()],
            prop_oneof![2 => (0u32..40).prop_map(|s| 1u64 << s), 1 => any::<u64>()],
            prop_oneof![2 => 0u64..1000, 1 => any::<u64>()],
            any::<u64>(),
            word(HASH_MIX64 as u64),
            any::<u64>(),
            word(HEADER_BYTES),
        )
            .prop_map(|(a, b, c, d, e, f, g, h)| [a, b, c, d, e, f, g, h])
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: crate::testing::proptest_cases(512), ..ProptestConfig::default() })]

        /// Arbitrary bytes and sizes: never a panic; whatever is accepted is consistent.
        #[test]
        fn the_header_parser_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200), total in any::<u64>()) {
            if let Ok(h) = parse_header("t", &bytes, total) {
                prop_assert!(h.slot_count.is_power_of_two() && h.slot_count >= MIN_SLOTS);
                prop_assert!(h.row_count * 2 <= h.slot_count);
                prop_assert!(HEADER_BYTES + h.slot_count * SLOT_BYTES <= total);
            }
        }

        /// Mostly valid headers over slots of arbitrary contents: the view is refused or every
        /// probe ends, within slot_count steps per key (at most slot_count matches), with an
        /// answer or a corrupted-table error.
        #[test]
        fn probes_over_arbitrary_slots_end(
            words in header_words(),
            slots in proptest::collection::vec(prop_oneof![2 => Just(0u64), 1 => 0u64..4, 2 => any::<u64>()], 0..3 * 300),
            keys in proptest::collection::vec(-3i64..3, 1..20),
            extra in 0usize..64,
        ) {
            let mut buf: Vec<u64> = words.to_vec();
            buf.extend_from_slice(&slots);
            let len = (buf.len() * 8).saturating_sub(extra);
            let bytes = &as_bytes(&mut buf)[..len];
            if let Ok(t) = Table::view("t", bytes) {
                let n = t.header().slot_count;
                for k in keys {
                    let mut m = 0u64;
                    match t.for_each_match(k, |_| m += 1) {
                        Ok(()) => prop_assert!(m < n),
                        Err(e) => prop_assert!(e.message.contains("corrupted"), "{}", e),
                    }
                }
            }
        }

        /// Valid tables of random rows (duplicates, NULL keys) answer as the reference.
        #[test]
        fn probes_match_the_reference(
            rows in proptest::collection::vec((proptest::option::weighted(0.9, -50i64..50), any::<i64>()), 0..400),
            keys in proptest::collection::vec(proptest::option::weighted(0.9, -60i64..60), 0..200),
            seed in any::<u64>(),
        ) {
            let stored = rows.iter().filter(|r| r.0.is_some()).count() as u64;
            let mut buf = buffer(table_bytes(stored));
            build(as_bytes(&mut buf), KeyType::Int8, &rows, seed).unwrap();
            let t = Table::view("t", as_bytes(&mut buf)).unwrap();
            let non_null: Vec<i64> = keys.iter().flatten().copied().collect();
            prop_assert_eq!(t.probe(&non_null).unwrap(), reference(&rows, &keys));
        }
    }
}

/// The CPU probe's speed (not run by default):
/// `cargo test --release -p pg_uvm_share --lib gpujoin::table::bench -- --ignored --nocapture`.
#[cfg(test)]
mod bench {
    use super::*;

    #[test]
    #[ignore]
    fn probe_ns_per_key() {
        for (rows, range) in [(10_000u64, 20_000u64), (1_000_000, 2_000_000)] {
            let data: Vec<(Option<i64>, i64)> = (0..rows as i64).map(|i| (Some(i), i)).collect();
            let mut buf = vec![0u64; (table_bytes(rows) as usize).div_ceil(8)];
            // SAFETY: our own buffer as bytes.
            let b = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, buf.len() * 8) };
            build(b, KeyType::Int8, &data, 1).unwrap();
            let keys: Vec<i64> = (0..10_000_000u64).map(|i| (mix(i) % range) as i64).collect();
            let t = Table::view("t", b).unwrap();
            let mut best = f64::MAX;
            for _ in 0..5 {
                let s = std::time::Instant::now();
                let r = t.probe(&keys).unwrap();
                best = best.min(s.elapsed().as_secs_f64());
                std::hint::black_box(r);
            }
            eprintln!("rows {rows}: {:.2} ns/key", best * 1e9 / keys.len() as f64);
        }
    }
}
