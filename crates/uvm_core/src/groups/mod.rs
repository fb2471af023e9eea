//! Group tables: the groups of a `GROUP BY` and their aggregates' running states, in a segment
//! that grows when the groups outnumber its room (issue 27, point 2). This module is the format
//! and its CPU algorithms (update, grow, merge, read out), the reference the kernels follow; the
//! plan node that fills one sits above it, in the extension.
//!
//! # Layout
//!
//! | offset | bytes | what |
//! | --- | --- | --- |
//! | 0 | [`HEADER_BYTES`] | [`Header`]: magic, version, key words, aggregates, slots, groups, room asked for |
//! | [`HEADER_BYTES`] | 8 × aggregates | each aggregate's [`AggKind`] (`u16`, then padding) |
//! | `slots_at` | `slot_bytes` × `slot_count` | the slots, open addressing, linear probing |
//!
//! A slot is a tag word (0: empty; else the key's hash with its low bit set), the group's key
//! (`key_words` 64-bit words: the extension packs the grouping columns into them, a NULL as its
//! own word), then one 16-byte state per aggregate ([`AggKind`] says what its two words hold).
//! `slot_count` is a power of two, and a table takes groups up to half of it: past that an
//! update is refused with the room the table needs ([`Update::Full`]), nothing changed, and the
//! caller grows the segment and moves the groups into a table of twice the slots ([`grow`])
//! before it goes on: the grow-and-resume protocol of the GpuJoin result buffer. No limit but
//! memory, then; nobody needs to know the number of groups in advance. Parallel participants
//! each fill a table of their own and one merges the others into it ([`merge`]), states
//! combined, no group lost.
//!
//! # Aggregates
//!
//! The states keep what PostgreSQL's results need, exactly: integer sums in 128 bits (a
//! `sum(int8)` is PostgreSQL's `numeric`, never wrong by overflow; the extension checks the
//! range of `int8` results), counts in 64, `min`/`max` with a flag for "a value was seen" (no
//! value: NULL), float sums and extremes as `f64` with PostgreSQL's order for NaN (above every
//! number). `avg` is a sum and a count. Inputs are 64-bit words: integers sign-extended, floats'
//! bits; `None` is NULL, which every aggregate but `count(*)` skips.
//!
//! # Untrusted bytes
//!
//! A table lies in a segment any process with its owner's privileges may overwrite, so
//! [`Table::parse`] checks the header against the segment's size, every walk along a probe
//! chain stops after `slot_count` steps (a valid table always has an empty slot), and walks
//! check for interrupts every [`interrupt::EVERY`] steps. An overwritten table gives an ERROR
//! or a wrong but bounded answer, never a hang or a crash.

#[cfg(test)]
mod tests;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::checksum::mix;
use crate::error::{Code, Result, UvmError};
use crate::interrupt;

pub const MAGIC: u64 = u64::from_le_bytes(*b"UVMGRPS1");
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: u64 = 64;
/// The most key words and aggregates a table has (PostgreSQL's grouping keys and aggregates of
/// one query stay far below).
pub const MAX_KEY_WORDS: u16 = 32;
pub const MAX_AGGS: u16 = 64;
pub const MIN_SLOTS: u64 = 16;
const STATE_WORDS: usize = 2;

crate::wire_enum! {
    /// An aggregate's state (two words, `lo` and `hi`). The numbers are the format's: fixed,
    /// append only.
    pub enum AggKind: u16 {
        /// `count(*)`: rows, NULLs included (lo).
        CountStar = 1,
        /// `count(x)`: non-NULL inputs (lo).
        Count = 2,
        /// `sum` of an integer type: an `i128` (lo, hi); NULL when no input was non-NULL is the
        /// extension's to tell, from a `Count` beside it.
        SumInt = 3,
        /// `min`, `max` of an integer-like type: the value (lo), 1 once one was seen (hi).
        MinInt = 4,
        MaxInt = 5,
        /// `sum` of a float: the `f64` (lo); [`SEEN`] once one was seen, [`OVERFLOWED`] once
        /// finite values summed to an infinity (hi).
        SumFloat = 6,
        /// `min`, `max` of a float (NaN above every number, as PostgreSQL orders them).
        MinFloat = 7,
        MaxFloat = 8,
    }
}

/// The table's header (the module's table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Header {
    pub magic: u64,
    pub version: u32,
    pub key_words: u16,
    pub aggs: u16,
    pub slot_count: u64,
    /// Slots in use.
    pub groups: u64,
    pub seed: u64,
    pub slots_at: u64,
    pub slot_bytes: u64,
    pub _reserved: u64,
}

const _: () = assert!(std::mem::size_of::<Header>() as u64 == HEADER_BYTES);

/// A group as [`Table::groups`] reads it out: its key words and each aggregate's state
/// `(lo, hi)`.
pub type Group = (Vec<u64>, Vec<(u64, u64)>);

/// What an update did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Update {
    /// The group existed, or was added.
    Done,
    /// The table is at its load limit: nothing changed; grow it to the slots given, move the
    /// groups over ([`grow`]) and update again.
    Full(u64),
}

fn bad_table(name: &str, why: &str) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, format!("segment \"{name}\" holds no group table ({why})"))
        .hint("The segment was overwritten; the query that made it must run again.")
}

/// A table's shape: its keys, its aggregates, its slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    pub key_words: u16,
    pub aggs: Vec<AggKind>,
    pub slot_count: u64,
}

impl Shape {
    /// Slots for `groups` groups: a power of two, at least twice them and [`MIN_SLOTS`].
    pub fn slots_for(groups: u64) -> u64 {
        groups.saturating_mul(2).max(MIN_SLOTS).checked_next_power_of_two().unwrap_or(1 << 63)
    }

    fn check(&self) -> Result<()> {
        let bad = |why: String| Err(UvmError::new(Code::InvalidParameterValue, why));
        if self.key_words == 0 || self.key_words > MAX_KEY_WORDS {
            return bad(format!("a group table has 1 to {MAX_KEY_WORDS} key words, not {}", self.key_words));
        }
        if self.aggs.len() > MAX_AGGS as usize {
            return bad(format!("a group table has at most {MAX_AGGS} aggregates, not {}", self.aggs.len()));
        }
        if !self.slot_count.is_power_of_two() || self.slot_count < MIN_SLOTS {
            return bad(format!("a group table's slots are a power of two from {MIN_SLOTS}, not {}", self.slot_count));
        }
        Ok(())
    }

    fn slot_bytes(&self) -> u64 {
        8 * (1 + u64::from(self.key_words) + STATE_WORDS as u64 * self.aggs.len() as u64)
    }

    fn slots_at(&self) -> u64 {
        (HEADER_BYTES + 8 * self.aggs.len() as u64).next_multiple_of(64)
    }

    /// Bytes a table of this shape needs (saturating).
    pub fn bytes(&self) -> u64 {
        self.slot_count.saturating_mul(self.slot_bytes()).saturating_add(self.slots_at())
    }

    /// This shape with `slot_count` slots.
    pub fn with_slots(&self, slot_count: u64) -> Shape {
        Shape { slot_count, ..self.clone() }
    }
}

/// Writes an empty table of `shape` at the start of `bytes` (at least [`Shape::bytes`] of
/// them): header, aggregate kinds, zeroed slots.
pub fn init(bytes: &mut [u8], shape: &Shape, seed: u64) -> Result<()> {
    shape.check()?;
    let need = shape.bytes();
    if (bytes.len() as u64) < need {
        return Err(UvmError::new(Code::InvalidParameterValue, format!("a group table of this shape needs {need} bytes")));
    }
    let h = Header {
        magic: MAGIC,
        version: VERSION,
        key_words: shape.key_words,
        aggs: shape.aggs.len() as u16,
        slot_count: shape.slot_count,
        groups: 0,
        seed,
        slots_at: shape.slots_at(),
        slot_bytes: shape.slot_bytes(),
        _reserved: 0,
    };
    bytes[..need as usize].fill(0);
    bytes[..HEADER_BYTES as usize].copy_from_slice(h.as_bytes());
    for (i, k) in shape.aggs.iter().enumerate() {
        let at = (HEADER_BYTES + 8 * i as u64) as usize;
        bytes[at..at + 2].copy_from_slice(&(*k as u16).to_le_bytes());
    }
    Ok(())
}

/// A validated table over its segment's bytes (only [`Table::parse`] makes one).
pub struct Table<'a> {
    name: &'a str,
    h: Header,
    aggs: Vec<AggKind>,
    bytes: &'a mut [u8],
    steps: u64,
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn set_word(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// PostgreSQL's order of floats: NaN above every number, -0 equal to 0.
fn float_less(a: f64, b: f64) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (true, _) => false,
        (false, true) => true,
        _ => a < b,
    }
}

/// A table's header and aggregate kinds, validated, without its slots: what a reader that
/// takes the slots a window at a time needs (a backend returning the groups of a table in a
/// segment without holding it all: [`Head::groups_in`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    h: Header,
    aggs: Vec<AggKind>,
}

impl Head {
    /// The bytes of a table's start that [`Head::parse`] reads (fewer if the table is smaller).
    pub const PREFIX_BYTES: u64 = HEADER_BYTES + 8 * MAX_AGGS as u64;

    /// Reads and validates a table's header from `prefix`, its first bytes, for a table of
    /// `total` bytes in all (its segment's size). Never panics.
    pub fn parse(name: &str, prefix: &[u8], total: u64) -> Result<Head> {
        let Ok((h, _)) = Header::read_from_prefix(prefix) else {
            return Err(bad_table(name, "too small"));
        };
        if h.magic != MAGIC || h.version != VERSION {
            return Err(bad_table(name, "no header"));
        }
        let dir_end = HEADER_BYTES + 8 * u64::from(h.aggs);
        if h.aggs > MAX_AGGS || (prefix.len() as u64) < dir_end {
            return Err(bad_table(name, &format!("{} aggregates", h.aggs)));
        }
        let mut aggs = Vec::with_capacity(h.aggs as usize);
        for i in 0..h.aggs as usize {
            let at = HEADER_BYTES as usize + 8 * i;
            let code = u16::from_le_bytes([prefix[at], prefix[at + 1]]);
            aggs.push(AggKind::from_repr(code).ok_or_else(|| bad_table(name, &format!("aggregate {i} is of kind {code}")))?);
        }
        let shape = Shape { key_words: h.key_words, aggs, slot_count: h.slot_count };
        shape.check().map_err(|e| bad_table(name, &e.message))?;
        if h.slots_at != shape.slots_at() || h.slot_bytes != shape.slot_bytes() || shape.bytes() > total {
            return Err(bad_table(name, "its slots do not fit its shape or its segment"));
        }
        if h.groups > h.slot_count / 2 {
            return Err(bad_table(name, &format!("{} groups in {} slots", h.groups, h.slot_count)));
        }
        Ok(Head { h, aggs: shape.aggs })
    }

    pub fn header(&self) -> &Header {
        &self.h
    }

    pub fn aggs(&self) -> &[AggKind] {
        &self.aggs
    }

    /// The groups of whole slots `slots` (the table's bytes of some run of its slots), appended
    /// to `out` in slot order: bounded by the bytes given.
    pub fn groups_in(&self, slots: &[u8], out: &mut Vec<Group>) {
        self.each_in(slots, |_, g| out.push(g));
    }

    /// [`Head::groups_in`] with each group's slot: its index among `slots` (add the index of
    /// their first slot for its index in the table).
    pub fn indexed_groups_in(&self, slots: &[u8], out: &mut Vec<(u64, Group)>) {
        self.each_in(slots, |i, g| out.push((i, g)));
    }

    fn each_in(&self, slots: &[u8], mut f: impl FnMut(u64, Group)) {
        let (kw, na, sb) = (self.h.key_words as usize, self.aggs.len(), self.h.slot_bytes as usize);
        for (i, slot) in slots.chunks_exact(sb).enumerate() {
            if word(slot, 0) == 0 {
                continue;
            }
            let key = (0..kw).map(|k| word(slot, 8 * (1 + k))).collect();
            let s = 8 * (1 + kw);
            let states = (0..na).map(|a| (word(slot, s + 16 * a), word(slot, s + 16 * a + 8))).collect();
            f(i as u64, (key, states));
        }
    }
}

/// Adds the states `b` (another table's, or another part's, of the same aggregates) into `a`.
pub fn combine_states(kinds: &[AggKind], a: &mut [(u64, u64)], b: &[(u64, u64)]) {
    for ((k, x), y) in kinds.iter().zip(a.iter_mut()).zip(b) {
        *x = combine(*k, *x, *y);
    }
}

impl<'a> Table<'a> {
    /// Reads and validates the table at the start of `bytes` (`name` is for messages). Never
    /// reads past `bytes`, never panics.
    pub fn parse(name: &'a str, bytes: &'a mut [u8]) -> Result<Table<'a>> {
        let Head { h, aggs } = Head::parse(name, bytes, bytes.len() as u64)?;
        Ok(Table { name, h, aggs, bytes, steps: 0 })
    }

    pub fn header(&self) -> &Header {
        &self.h
    }

    pub fn shape(&self) -> Shape {
        Shape { key_words: self.h.key_words, aggs: self.aggs.clone(), slot_count: self.h.slot_count }
    }

    fn slot_at(&self, i: u64) -> usize {
        (self.h.slots_at + i * self.h.slot_bytes) as usize
    }

    fn tag(&self, key: &[u64]) -> u64 {
        let mut h = self.h.seed;
        for &w in key {
            h = mix(h ^ w);
        }
        h | 1
    }

    fn count_steps(&mut self, n: u64) -> Result<()> {
        let before = self.steps;
        self.steps += n;
        if before / interrupt::EVERY != self.steps / interrupt::EVERY {
            interrupt::check()?;
        }
        Ok(())
    }

    /// The slot of `key` (`Ok`), or the empty slot where it would go (`Err`); an ERROR when
    /// the walk finds neither within `slot_count` steps (an overwritten table).
    fn find(&mut self, key: &[u64]) -> Result<std::result::Result<u64, u64>> {
        let tag = self.tag(key);
        let mask = self.h.slot_count - 1;
        let mut i = tag & mask;
        let kw = self.h.key_words as usize;
        for step in 0..self.h.slot_count {
            if step % 64 == 63 {
                self.count_steps(64)?;
            }
            let at = self.slot_at(i);
            let t = word(self.bytes, at);
            if t == 0 {
                return Ok(Err(i));
            }
            if t == tag && (0..kw).all(|k| word(self.bytes, at + 8 * (1 + k)) == key[k]) {
                return Ok(Ok(i));
            }
            i = (i + 1) & mask;
        }
        Err(UvmError::new(
            Code::InvalidParameterValue,
            format!("group table in segment \"{}\" is corrupted: a probe found no empty slot", self.name),
        ))
    }

    /// The index of the slot of `key`'s group (`key_words` words), `None` where the table has
    /// no such group. Bounded as [`Table::update`].
    pub fn slot_of_existing(&mut self, key: &[u64]) -> Result<Option<u64>> {
        if key.len() != self.h.key_words as usize {
            return Err(UvmError::new(Code::InvalidParameterValue, "a key does not match the group table"));
        }
        Ok(self.find(key)?.ok())
    }

    /// The segment's name (for messages).
    pub fn name(&self) -> &str {
        self.name
    }

    /// The slot of `key`'s group, added with empty states if new; `Err(slots)` when the table
    /// is at its load limit (nothing changed: grow it to that many slots).
    fn slot_of(&mut self, key: &[u64]) -> Result<std::result::Result<u64, u64>> {
        let i = match self.find(key)? {
            Ok(i) => return Ok(Ok(i)),
            Err(i) => i,
        };
        if self.h.groups + 1 > self.h.slot_count / 2 {
            return Ok(Err(self.h.slot_count * 2));
        }
        let at = self.slot_at(i);
        let tag = self.tag(key);
        set_word(self.bytes, at, tag);
        for (k, &w) in key.iter().enumerate() {
            set_word(self.bytes, at + 8 * (1 + k), w);
        }
        self.h.groups += 1;
        set_word(self.bytes, std::mem::offset_of!(Header, groups), self.h.groups);
        Ok(Ok(i))
    }

    /// Folds one row into its group (added if new): `key` of `key_words` words, one input per
    /// aggregate (`None`: NULL; ignored by `count(*)`).
    pub fn update(&mut self, key: &[u64], inputs: &[Option<u64>]) -> Result<Update> {
        if key.len() != self.h.key_words as usize || inputs.len() != self.aggs.len() {
            return Err(UvmError::new(Code::InvalidParameterValue, "a row's key or inputs do not match the group table"));
        }
        let slot = match self.slot_of(key)? {
            Ok(i) => i,
            Err(n) => return Ok(Update::Full(n)),
        };
        let states = self.slot_at(slot) + 8 * (1 + self.h.key_words as usize);
        for (a, (&kind, &input)) in self.aggs.iter().zip(inputs).enumerate() {
            let at = states + 16 * a;
            let (lo, hi) = fold(kind, (word(self.bytes, at), word(self.bytes, at + 8)), input);
            set_word(self.bytes, at, lo);
            set_word(self.bytes, at + 8, hi);
        }
        Ok(Update::Done)
    }

    /// Calls `f` with the table's bytes and the offset of each occupied slot, in slot order.
    /// Bounded by the slots, with an interrupt check every 1,024.
    fn each_group(&mut self, mut f: impl FnMut(&mut [u8], usize)) -> Result<()> {
        for i in 0..self.h.slot_count {
            if i % 1024 == 1023 {
                self.count_steps(1024)?;
            }
            let at = self.slot_at(i);
            if word(self.bytes, at) != 0 {
                f(self.bytes, at);
            }
        }
        Ok(())
    }

    /// Every group: its key and its aggregates' states `(lo, hi)`, in slot order. Bounded by
    /// the slots.
    pub fn groups(&mut self) -> Result<Vec<Group>> {
        let (kw, na) = (self.h.key_words as usize, self.aggs.len());
        let mut out = Vec::new();
        self.each_group(|b, at| {
            let key = (0..kw).map(|k| word(b, at + 8 * (1 + k))).collect();
            let s = at + 8 * (1 + kw);
            let states = (0..na).map(|a| (word(b, s + 16 * a), word(b, s + 16 * a + 8))).collect();
            out.push((key, states));
        })?;
        if out.len() as u64 != self.h.groups {
            return Err(bad_table(self.name, &format!("it counts {} groups and holds {}", self.h.groups, out.len())));
        }
        Ok(out)
    }

    /// Gives every `min`/`max` state that has seen no value its identity as `lo` (the largest
    /// integer, the smallest, NaN, -Infinity), which the scan kernels fold into with one atomic
    /// (`scan::gpu`; they write the identities into the slots they claim). A state that has
    /// seen no value is read by its `hi` alone, so the CPU's reading does not change.
    pub fn prime(&mut self) -> Result<()> {
        let kw = self.h.key_words as usize;
        let identities: Vec<Option<u64>> = self.aggs.iter().map(|k| identity(*k)).collect();
        self.each_group(|b, at| {
            for (a, id) in identities.iter().enumerate() {
                let s = at + 8 * (1 + kw) + 16 * a;
                if let Some(id) = id.filter(|_| word(b, s + 8) == 0) {
                    set_word(b, s, id);
                }
            }
        })
    }

    /// Folds `states` (another table's, of the same aggregates) into `key`'s group.
    fn combine(&mut self, key: &[u64], states: &[(u64, u64)]) -> Result<Update> {
        let slot = match self.slot_of(key)? {
            Ok(i) => i,
            Err(n) => return Ok(Update::Full(n)),
        };
        let base = self.slot_at(slot) + 8 * (1 + self.h.key_words as usize);
        for (a, (&kind, &other)) in self.aggs.iter().zip(states).enumerate() {
            let at = base + 16 * a;
            let (lo, hi) = combine(kind, (word(self.bytes, at), word(self.bytes, at + 8)), other);
            set_word(self.bytes, at, lo);
            set_word(self.bytes, at + 8, hi);
        }
        Ok(Update::Done)
    }
}

/// The `lo` a `min`/`max` state starts from in the kernels (none for the other kinds).
pub fn identity(kind: AggKind) -> Option<u64> {
    match kind {
        AggKind::MinInt => Some(i64::MAX as u64),
        AggKind::MaxInt => Some(i64::MIN as u64),
        AggKind::MinFloat => Some(f64::NAN.to_bits()),
        AggKind::MaxFloat => Some(f64::NEG_INFINITY.to_bits()),
        _ => None,
    }
}

/// One input folded into a state.
fn fold(kind: AggKind, (lo, hi): (u64, u64), input: Option<u64>) -> (u64, u64) {
    match (kind, input) {
        (AggKind::CountStar, _) => (lo.wrapping_add(1), hi),
        (_, None) => (lo, hi),
        (AggKind::Count, Some(_)) => (lo.wrapping_add(1), hi),
        (AggKind::SumInt, Some(v)) => {
            let s = (i128::from(hi as i64) << 64 | i128::from(lo)).wrapping_add(i128::from(v as i64));
            (s as u64, (s >> 64) as u64)
        }
        (AggKind::MinInt, Some(v)) if hi == 0 || (v as i64) < (lo as i64) => (v, 1),
        (AggKind::MaxInt, Some(v)) if hi == 0 || (v as i64) > (lo as i64) => (v, 1),
        (AggKind::MinInt | AggKind::MaxInt, Some(_)) => (lo, hi),
        (AggKind::SumFloat, Some(v)) => add_floats((lo, hi), (v, SEEN)),
        (AggKind::MinFloat, Some(v)) if hi == 0 || float_less(f64::from_bits(v), f64::from_bits(lo)) => (v, 1),
        (AggKind::MaxFloat, Some(v)) if hi == 0 || float_less(f64::from_bits(lo), f64::from_bits(v)) => (v, 1),
        (AggKind::MinFloat | AggKind::MaxFloat, Some(_)) => (lo, hi),
    }
}

/// A float state's flags (its `hi` word): a value was seen; the sum overflowed (PostgreSQL's
/// `float8pl` raises 22003 where finite operands give an infinity: the extension does, reading
/// the flag).
pub const SEEN: u64 = 1;
pub const OVERFLOWED: u64 = 2;

/// Two `SumFloat` states added.
fn add_floats(a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
    if b.1 & SEEN == 0 {
        return a;
    }
    if a.1 & SEEN == 0 {
        return b;
    }
    let (x, y) = (f64::from_bits(a.0), f64::from_bits(b.0));
    let s = x + y;
    let overflow = s.is_infinite() && x.is_finite() && y.is_finite();
    (s.to_bits(), SEEN | (a.1 | b.1) & OVERFLOWED | if overflow { OVERFLOWED } else { 0 })
}

/// Two states of one aggregate combined (a parallel participant's into another's).
fn combine(kind: AggKind, a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
    match kind {
        AggKind::CountStar | AggKind::Count => (a.0.wrapping_add(b.0), 0),
        AggKind::SumInt => {
            let (x, y) = (i128::from(a.1 as i64) << 64 | i128::from(a.0), i128::from(b.1 as i64) << 64 | i128::from(b.0));
            let s = x.wrapping_add(y);
            (s as u64, (s >> 64) as u64)
        }
        AggKind::SumFloat => add_floats(a, b),
        _ if b.1 == 0 => a,
        _ if a.1 == 0 => b,
        _ => fold(kind, a, Some(b.0)),
    }
}

/// The `i128` of a `SumInt` state.
pub fn sum_int(state: (u64, u64)) -> i128 {
    i128::from(state.1 as i64) << 64 | i128::from(state.0)
}

/// Moves every group of `from` into `to`, a table of the same key words and aggregates (a
/// bigger one when growing: [`Shape::with_slots`]; another participant's when merging). `Full`
/// when `to` has no room left, having taken some of the groups: grow `to` and merge again from
/// the start would count those twice, so a caller that can run out sizes `to` first
/// ([`Shape::slots_for`] of both tables' groups).
pub fn merge(from: &mut Table<'_>, to: &mut Table<'_>) -> Result<Update> {
    if from.h.key_words != to.h.key_words || from.aggs != to.aggs {
        return Err(UvmError::new(Code::InvalidParameterValue, "group tables of different shapes cannot be merged"));
    }
    for (key, states) in from.groups()? {
        if let Update::Full(n) = to.combine(&key, &states)? {
            return Ok(Update::Full(n));
        }
    }
    Ok(Update::Done)
}

/// Grows a full table: `to` (at least [`Shape::bytes`] of the bigger shape) gets an empty
/// table of `slot_count` slots and every group of `from`.
pub fn grow(from: &mut Table<'_>, to: &mut [u8], slot_count: u64) -> Result<()> {
    let shape = from.shape().with_slots(slot_count);
    if slot_count < Shape::slots_for(from.h.groups + 1) {
        return Err(UvmError::new(
            Code::InvalidParameterValue,
            format!("{slot_count} slots do not hold {} groups and one more", from.h.groups),
        ));
    }
    init(to, &shape, from.h.seed)?;
    let name = from.name;
    let mut bigger = Table::parse(name, to)?;
    match merge(from, &mut bigger)? {
        Update::Done => Ok(()),
        Update::Full(_) => Err(bad_table(name, "its groups outgrew a table sized for them")),
    }
}
