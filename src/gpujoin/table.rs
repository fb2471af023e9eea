//! The hash table's layout, build and probe (CPU). See the module documentation.

use crate::checksum::mix;
use crate::error::{Code, Result, UvmError};
use crate::segment::{Env, Pin};

pub const MAGIC: u64 = u64::from_le_bytes(*b"UVMHASH1");
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: u64 = 64;
pub const SLOT_BYTES: u64 = 24;
/// Hash function ids stored in the header.
pub const HASH_MIX64: u32 = 1;

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

/// Slots for `rows` non-NULL rows: a power of two, at least twice the rows (and 16).
pub fn slot_count(rows: u64) -> u64 {
    (rows.saturating_mul(2)).max(16).next_power_of_two()
}

/// Bytes a table of `rows` non-NULL rows needs.
pub fn table_bytes(rows: u64) -> u64 {
    HEADER_BYTES + slot_count(rows) * SLOT_BYTES
}

#[inline]
pub fn tag(key: i64, seed: u64) -> u64 {
    mix(key as u64 ^ seed) | 1
}

/// A table in memory (a pinned segment's bytes), validated.
pub struct Table<'a> {
    pub header: Header,
    slots: &'a [Slot],
}

fn not_a_table(why: &str) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, format!("segment holds no GpuJoin hash table ({why})"))
        .hint("Build one with uvm.gpujoin_build first.")
}

/// Reads and validates the header at the start of `bytes` for a table of `total` bytes.
pub fn parse_header(bytes: &[u8], total: u64) -> Result<Header> {
    if (bytes.len() as u64) < HEADER_BYTES || total < HEADER_BYTES {
        return Err(not_a_table("too small"));
    }
    // SAFETY: `bytes` holds at least a header; read_unaligned copes with any alignment.
    let header: Header = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const Header) };
    if header.magic != MAGIC {
        return Err(not_a_table("no header"));
    }
    if header.version != VERSION || header.hash != HASH_MIX64 {
        return Err(not_a_table("unknown version"));
    }
    if header.key_type != KeyType::Int4 as u32 && header.key_type != KeyType::Int8 as u32 {
        return Err(not_a_table("unknown key type"));
    }
    let n = header.slot_count;
    if !n.is_power_of_two()
        || header.slots_offset != HEADER_BYTES
        || n.checked_mul(SLOT_BYTES).and_then(|b| b.checked_add(HEADER_BYTES)).is_none_or(|b| b > total)
    {
        return Err(not_a_table("inconsistent size"));
    }
    Ok(header)
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
/// to hold `key_type` keys, and the address of its slots for kernels.
pub fn locate<E: Env>(pin: &Pin<E>, key_type: KeyType) -> Result<(Header, u64)> {
    let mut raw = [0u8; HEADER_BYTES as usize];
    if pin.info().size < HEADER_BYTES {
        return Err(not_a_table("too small"));
    }
    pin.read_into(0, &mut raw)?;
    let header = parse_header(&raw, pin.info().size)?;
    header.check_key_type(&pin.info().name, key_type)?;
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
        // SAFETY: Header is repr(C) plain data of exactly HEADER_BYTES bytes.
        unsafe { std::mem::transmute_copy(self) }
    }
}

impl<'a> Table<'a> {
    /// Validates the header and the size of `bytes` and views it as a table.
    pub fn view(bytes: &'a [u8]) -> Result<Table<'a>> {
        let header = parse_header(bytes, bytes.len() as u64)?;
        let n = header.slot_count;
        let start = &bytes[HEADER_BYTES as usize..];
        if start.as_ptr() as usize % std::mem::align_of::<Slot>() != 0 {
            return Err(not_a_table("misaligned"));
        }
        // SAFETY: the range holds `n` slots (checked), is 8-byte aligned (checked), and Slot is
        // plain data for which any bit pattern is valid.
        let slots = unsafe { std::slice::from_raw_parts(start.as_ptr() as *const Slot, n as usize) };
        Ok(Table { header, slots })
    }

    pub fn key_type(&self) -> KeyType {
        self.header.key_type()
    }

    /// Calls `f(payload)` for every row whose key equals `key`.
    #[inline]
    pub fn for_each_match(&self, key: i64, mut f: impl FnMut(i64)) {
        let t = tag(key, self.header.seed);
        let mask = self.header.slot_count - 1;
        let mut i = t & mask;
        loop {
            let s = &self.slots[i as usize];
            if s.tag == 0 {
                return;
            }
            if s.tag == t && s.key == key {
                f(s.payload);
            }
            i = (i + 1) & mask;
        }
    }

    /// Matches and payload sum of `keys` (non-NULL keys: NULL keys never match).
    pub fn probe(&self, keys: &[i64]) -> (u64, i128) {
        let (mut matches, mut sum) = (0u64, 0i128);
        for k in keys {
            self.for_each_match(*k, |p| {
                matches += 1;
                sum += p as i128;
            });
        }
        (matches, sum)
    }
}

/// Builds a table of `rows` (key, payload) into `bytes` (at least `table_bytes(non-NULL rows)`
/// long, 8-byte aligned). Returns the header written.
pub fn build(bytes: &mut [u8], key_type: KeyType, rows: &[(Option<i64>, i64)], seed: u64) -> Result<Header> {
    let stored = rows.iter().filter(|r| r.0.is_some()).count() as u64;
    let n = slot_count(stored);
    let need = HEADER_BYTES + n * SLOT_BYTES;
    if (bytes.len() as u64) < need {
        return Err(UvmError::new(
            Code::ProgramLimitExceeded,
            format!("a hash table of {stored} rows needs {need} bytes, the segment has {}", bytes.len()),
        ));
    }
    let (head, rest) = bytes.split_at_mut(HEADER_BYTES as usize);
    if rest.as_ptr() as usize % std::mem::align_of::<Slot>() != 0 {
        return Err(UvmError::new(Code::SystemError, "hash table memory is misaligned"));
    }
    // SAFETY: `rest` holds `n` slots (checked above), aligned (checked); Slot is plain data.
    let slots = unsafe { std::slice::from_raw_parts_mut(rest.as_mut_ptr() as *mut Slot, n as usize) };
    slots.fill(Slot::default());
    let mask = n - 1;
    for (key, payload) in rows {
        let Some(key) = *key else { continue };
        let t = tag(key, seed);
        let mut i = t & mask;
        while slots[i as usize].tag != 0 {
            i = (i + 1) & mask;
        }
        slots[i as usize] = Slot { tag: t, key, payload: *payload };
    }
    let header = header_for(key_type, stored, rows.len() as u64 - stored, seed);
    // SAFETY: `head` is HEADER_BYTES long; write_unaligned copes with any alignment.
    unsafe { std::ptr::write_unaligned(head.as_mut_ptr() as *mut Header, header) };
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let t = Table::view(as_bytes(&mut buf)).unwrap();
        let non_null: Vec<i64> = keys.iter().flatten().copied().collect();
        assert_eq!(t.probe(&non_null), reference(rows, keys));
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
        assert_eq!(table_bytes(0), 64 + 16 * 24);
        let mut small = buffer(100);
        assert_eq!(build(as_bytes(&mut small), KeyType::Int8, &[(Some(1), 1)], 0).unwrap_err().code, Code::ProgramLimitExceeded);
    }

    #[test]
    fn foreign_bytes_are_not_a_table() {
        let mut buf = buffer(4096);
        let e = Table::view(as_bytes(&mut buf)).err().unwrap();
        assert_eq!(e.code, Code::InvalidParameterValue);
        assert!(e.message.contains("no GpuJoin hash table"), "{e}");
        build(as_bytes(&mut buf), KeyType::Int4, &[(Some(5), 1)], 0).unwrap();
        let t = Table::view(as_bytes(&mut buf)).unwrap();
        assert_eq!(t.key_type(), KeyType::Int4);
        // a truncated view is refused
        let b = as_bytes(&mut buf);
        assert!(Table::view(&b[..100]).is_err());
        // a header of another version is refused
        b[8] = 9;
        assert!(Table::view(b).is_err());
    }
}
