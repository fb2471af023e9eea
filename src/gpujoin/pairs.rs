//! The materializing GpuJoin: matched (outer key, payload) pairs appended by every process into
//! one shared result segment whose final size nobody knows in advance.
//!
//! # Design
//!
//! A result buffer is a segment that starts with a 64-byte header followed by 16-byte pairs:
//!
//! ```text
//! offset 0   magic "UVMPAIR1", version, pair size (16),
//!            next: pairs reserved (the bump allocator; the only word written concurrently),
//!            written: pairs written (a reader trusts the buffer only when written == next),
//!            offset of the pairs (64)
//! offset 64  (key i64, payload i64) pairs
//! ```
//!
//! Writers reserve space with one atomic add on `next` per probe key (all of a key's matches at
//! once), on the GPU (`uvm_join_materialize` in `kernels/segment.cu`) or on the CPU
//! ([`CpuAppender`]), and count what they wrote into `written`. A process may only write what it
//! has mapped, which is the segment's size at its last pin. When a reservation ends beyond that,
//! the writer stops, keeps its reservation and says how many pairs the buffer needs
//! ([`Step::Need`]); [`append_batch`] then grows the segment (to at least twice its size, so
//! that stops are rare) or, if another process already grew it, just pins it again, which maps
//! the new chunks; and the writer resumes where it stopped. Growth only appends chunks, so the
//! pairs already written never move, and processes holding the old size keep writing below it.
//!
//! # Lifecycle
//!
//! `uvm.gpujoin_pairs_create` makes the segment and its header → any number of
//! `uvm.gpujoin_materialize` aggregates (in any number of parallel workers) append → the set-
//! returning `uvm.gpujoin_pairs` reads them back (refusing a buffer whose writers did not all
//! finish: `written != next` after an error mid-append) → `uvm.drop_segment` frees it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::table::{self, Header, KeyType, Table};
use crate::error::{Code, Result, UvmError};
use crate::segment::{Env, Pin, Segments};
use crate::uvm_err;

pub const MAGIC: u64 = u64::from_le_bytes(*b"UVMPAIR1");
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: u64 = 64;
pub const PAIR_BYTES: u64 = 16;
/// Byte offsets of the two counters in the header.
pub const NEXT_AT: u64 = 16;
pub const WRITTEN_AT: u64 = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct PairsHeader {
    pub magic: u64,
    pub version: u32,
    pub pair_bytes: u32,
    pub next: u64,
    pub written: u64,
    pub pairs_offset: u64,
    pub _reserved: [u64; 3],
}

const _: () = assert!(std::mem::size_of::<PairsHeader>() as u64 == HEADER_BYTES);

impl PairsHeader {
    pub fn new() -> PairsHeader {
        PairsHeader {
            magic: MAGIC,
            version: VERSION,
            pair_bytes: PAIR_BYTES as u32,
            next: 0,
            written: 0,
            pairs_offset: HEADER_BYTES,
            _reserved: [0; 3],
        }
    }

    pub fn as_bytes(&self) -> [u8; HEADER_BYTES as usize] {
        // SAFETY: PairsHeader is repr(C) plain data of exactly HEADER_BYTES bytes.
        unsafe { std::mem::transmute_copy(self) }
    }
}

impl Default for PairsHeader {
    fn default() -> Self {
        PairsHeader::new()
    }
}

/// Pairs a buffer of `size` bytes holds.
pub fn capacity(size: u64) -> u64 {
    size.saturating_sub(HEADER_BYTES) / PAIR_BYTES
}

/// Bytes a buffer of `pairs` pairs needs (saturating).
pub fn bytes_for(pairs: u64) -> u64 {
    pairs.saturating_mul(PAIR_BYTES).saturating_add(HEADER_BYTES)
}

fn not_pairs(name: &str, why: &str) -> UvmError {
    uvm_err!(Code::InvalidParameterValue, "segment \"{name}\" holds no GpuJoin result buffer ({why})")
        .hint("Create one with uvm.gpujoin_pairs_create.")
}

/// Reads and validates a result buffer's header (wherever its first chunk lies).
pub fn read_header<E: Env>(pin: &Pin<E>) -> Result<PairsHeader> {
    let name = &pin.info().name;
    if pin.info().size < HEADER_BYTES {
        return Err(not_pairs(name, "too small"));
    }
    let mut raw = [0u8; HEADER_BYTES as usize];
    pin.read_into(0, &mut raw)?;
    // SAFETY: `raw` holds a header's bytes; read_unaligned copes with any alignment.
    let h: PairsHeader = unsafe { std::ptr::read_unaligned(raw.as_ptr() as *const PairsHeader) };
    if h.magic != MAGIC {
        return Err(not_pairs(name, "no header"));
    }
    if h.version != VERSION || h.pair_bytes as u64 != PAIR_BYTES || h.pairs_offset != HEADER_BYTES {
        return Err(not_pairs(name, "unknown version"));
    }
    Ok(h)
}

/// The number of pairs a complete buffer holds; an error while writers are missing.
pub fn complete_pairs<E: Env>(pin: &Pin<E>) -> Result<u64> {
    let h = read_header(pin)?;
    if h.written != h.next || h.next > capacity(pin.info().size) {
        return Err(uvm_err!(
            Code::ObjectNotInPrerequisiteState,
            "GpuJoin result buffer \"{}\" is incomplete: {} pairs reserved, {} written",
            pin.info().name,
            h.next,
            h.written
        )
        .hint("A gpujoin_materialize that appends to it is still running or failed; drop the buffer and run the join again."));
    }
    Ok(h.next)
}

/// Copies pairs `[from, from + out.len())` of a buffer into `out`.
pub fn read_pairs<E: Env>(pin: &Pin<E>, from: u64, out: &mut [[i64; 2]]) -> Result<()> {
    // SAFETY: viewing our own [i64; 2] buffer as bytes.
    let raw = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, out.len() * PAIR_BYTES as usize) };
    pin.read_into((HEADER_BYTES + from * PAIR_BYTES) as i64, raw)
}

/// How a run of an appender ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every key of the batch is done.
    Done,
    /// A reservation ends beyond the mapped capacity: the buffer must hold this many pairs.
    Need(u64),
}

/// The inner table as a batch sees it: its header, the address of its slots (for kernels) and,
/// for CPU appenders, its bytes.
pub struct Inner<'a> {
    pub header: Header,
    pub slots: u64,
    pub cpu: Option<Table<'a>>,
}

/// The result buffer as a batch sees it: the address of its header and the pairs mapped.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub base: u64,
    pub cap: u64,
}

/// Appends a batch's matches: the CPU appender below, or the kernel (`sql/gpujoin.rs`).
pub trait Appender {
    /// Whether it reads and writes through CPU addresses (then both segments must be in tiers
    /// the CPU can address).
    fn cpu(&self) -> bool;
    /// Appends, or goes on appending where the last run stopped, into `target`.
    fn run(&mut self, inner: &Inner<'_>, target: Target) -> Result<Step>;
}

/// Appends the matches of one batch of keys through `appender`, growing the result buffer as
/// writers need. `authorize(owner, segment, action)` checks access to each segment.
pub fn append_batch<E: Env>(
    segs: &mut Segments<E>,
    inner: &str,
    result: &str,
    key_type: KeyType,
    authorize: &dyn Fn(u32, &str, &str) -> Result<()>,
    appender: &mut dyn Appender,
) -> Result<()> {
    let inner_pin = segs.pin(inner, |o| authorize(o, inner, "read"))?;
    let size = inner_pin.info().size;
    let (header, slots) = table::locate(&inner_pin, key_type)?;
    let cpu = if appender.cpu() { Some(Table::view(inner_pin.bytes(0, size as i64)?)?) } else { None };
    let inner_view = Inner { header, slots, cpu };
    loop {
        let out = segs.pin(result, |o| authorize(o, result, "write"))?;
        read_header(&out)?;
        if appender.cpu() {
            out.bytes(0, out.info().size as i64)?; // refuses tiers the CPU cannot address
        }
        let target = Target { base: out.addr(0, HEADER_BYTES as i64)?, cap: capacity(out.info().size) };
        let (size, max_size) = (out.info().size, out.info().max_size);
        match appender.run(&inner_view, target)? {
            Step::Done => return Ok(()),
            Step::Need(pairs) => {
                drop(out);
                debug_assert!(pairs > target.cap);
                // Twice the size when that fits (amortised growth), else exactly what is needed.
                let doubled = size.saturating_mul(2).max(bytes_for(pairs));
                let want = if doubled <= max_size { doubled } else { bytes_for(pairs) };
                segs.grow_at_least(result, want, |o| authorize(o, result, "write")).map_err(|e| {
                    if e.code == Code::ProgramLimitExceeded {
                        e.hint("Create the result buffer with a larger max_size.")
                    } else {
                        e
                    }
                })?;
            }
        }
    }
}

/// The CPU appender: the same protocol as the kernel, one key after another.
#[derive(Debug, Default)]
pub struct CpuAppender<'a> {
    keys: &'a [i64],
    /// The next key to probe, and the reservation of that key when a run stopped on it.
    at: usize,
    pending: Option<u64>,
    pub matches: u64,
    pub sum: i128,
}

impl<'a> CpuAppender<'a> {
    pub fn new(keys: &'a [i64]) -> CpuAppender<'a> {
        CpuAppender { keys, ..Default::default() }
    }
}

impl Appender for CpuAppender<'_> {
    fn cpu(&self) -> bool {
        true
    }

    fn run(&mut self, inner: &Inner<'_>, target: Target) -> Result<Step> {
        let table = inner.cpu.as_ref().expect("append_batch views the table for CPU appenders");
        // SAFETY: `target.base` is the header of a pinned, CPU-addressable buffer (checked by
        // append_batch), 8-byte aligned (segments start on page boundaries); the counters are
        // only ever accessed atomically, by every process.
        let (next, written) =
            unsafe { (&*((target.base + NEXT_AT) as *const AtomicU64), &*((target.base + WRITTEN_AT) as *const AtomicU64)) };
        let pairs = (target.base + HEADER_BYTES) as *mut [i64; 2];
        while self.at < self.keys.len() {
            let k = self.keys[self.at];
            let mut m = 0u64;
            table.for_each_match(k, |_| m += 1);
            if m > 0 {
                let base = match self.pending {
                    Some(b) => b,
                    None => next.fetch_add(m, Ordering::AcqRel),
                };
                if base + m > target.cap {
                    self.pending = Some(base);
                    return Ok(Step::Need(base + m));
                }
                let mut j = base;
                let sum = &mut self.sum;
                table.for_each_match(k, |p| {
                    // SAFETY: pair j lies in [base, base + m), reserved by us alone and below
                    // the mapped capacity (checked above).
                    unsafe { pairs.add(j as usize).write([k, p]) };
                    *sum += p as i128;
                    j += 1;
                });
                written.fetch_add(m, Ordering::Release);
                self.matches += m;
                self.pending = None;
            }
            self.at += 1;
        }
        Ok(Step::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::mix;
    use crate::registry::{Arena, TierPref};
    use crate::segment::tests::{ok, process, World};
    use std::collections::HashMap;

    fn allow(_: u32, _: &str, _: &str) -> Result<()> {
        Ok(())
    }

    fn make_inner(segs: &mut Segments<crate::segment::tests::TestEnv>, name: &str, rows: &[(Option<i64>, i64)]) {
        let stored = rows.iter().filter(|r| r.0.is_some()).count() as u64;
        let bytes = table::table_bytes(stored);
        segs.create(name, bytes as i64, None, TierPref::Auto, 1, 0).unwrap();
        let mut pin = segs.pin(name, ok).unwrap();
        table::build(pin.bytes_mut(0, bytes as i64).unwrap(), KeyType::Int8, rows, 99).unwrap();
    }

    fn make_result(segs: &mut Segments<crate::segment::tests::TestEnv>, name: &str, pairs: u64, max: Option<i64>) {
        segs.create(name, bytes_for(pairs) as i64, max, TierPref::Auto, 1, 0).unwrap();
        segs.pin(name, ok).unwrap().write_from(0, &PairsHeader::new().as_bytes()).unwrap();
    }

    fn sorted(mut v: Vec<[i64; 2]>) -> Vec<[i64; 2]> {
        v.sort_unstable();
        v
    }

    #[test]
    fn concurrent_appenders_grow_the_buffer_and_lose_nothing() {
        let world = World::new("pairs", Arena::default());
        let mut a = process(&world, 1);
        // duplicates (key % 500 repeats), a NULL key, negative payloads
        let rows: Vec<(Option<i64>, i64)> = (0..3000).map(|i| (Some(i % 500), i - 1500)).chain([(None, 7)]).collect();
        make_inner(&mut a, "inner", &rows);
        make_result(&mut a, "out", 1, None); // one pair: every writer must grow it
        let mut by_key: HashMap<i64, Vec<i64>> = HashMap::new();
        for (k, p) in &rows {
            if let Some(k) = k {
                by_key.entry(*k).or_default().push(*p);
            }
        }
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let world = world.clone();
                std::thread::spawn(move || {
                    let mut p = process(&world, 10 + w);
                    let mut x = w as u64 + 1;
                    let keys: Vec<i64> = (0..12000)
                        .map(|_| {
                            x = mix(x);
                            (x % 800) as i64 // 500..800 miss
                        })
                        .collect();
                    let mut app = CpuAppender::default();
                    for chunk in 0..3 {
                        // several batches per process, as the aggregate flushes them
                        let mut batch = CpuAppender::new(&keys[chunk * 4000..(chunk + 1) * 4000]);
                        append_batch(&mut p, "inner", "out", KeyType::Int8, &allow, &mut batch).unwrap();
                        app.matches += batch.matches;
                        app.sum += batch.sum;
                    }
                    p.detach_all();
                    (keys, app.matches, app.sum)
                })
            })
            .collect();
        let mut expected = Vec::new();
        let (mut matches, mut sum) = (0u64, 0i128);
        for w in workers {
            let (keys, m, s) = w.join().unwrap();
            matches += m;
            sum += s;
            for k in keys {
                for p in by_key.get(&k).into_iter().flatten() {
                    expected.push([k, *p]);
                }
            }
        }
        assert_eq!(matches, expected.len() as u64);
        assert_eq!(sum, expected.iter().map(|p| p[1] as i128).sum::<i128>());
        let pin = a.pin("out", ok).unwrap();
        let n = complete_pairs(&pin).unwrap();
        assert_eq!(n, expected.len() as u64);
        assert!(
            pin.info().size >= bytes_for(n) && pin.info().chunks.len() > 1,
            "grew into several chunks: {:?}",
            pin.info().chunks.len()
        );
        let mut got = vec![[0i64; 2]; n as usize];
        read_pairs(&pin, 0, &mut got).unwrap();
        assert_eq!(sorted(got), sorted(expected));
        drop(pin);
        a.drop_segment("out", ok).unwrap();
        a.drop_segment("inner", ok).unwrap();
        drop(a);
        assert_eq!(world.finish(), 0);
    }

    #[test]
    fn a_full_buffer_is_an_error_and_stays_marked_incomplete() {
        let world = World::new("pairs-full", Arena::default());
        let mut a = process(&world, 1);
        let rows: Vec<(Option<i64>, i64)> = (0..100).map(|i| (Some(1), i)).collect(); // 100 duplicates of key 1
        make_inner(&mut a, "inner", &rows);
        make_result(&mut a, "out", 10, Some(bytes_for(150) as i64));
        let mut app = CpuAppender::new(&[1, 2]);
        append_batch(&mut a, "inner", "out", KeyType::Int8, &allow, &mut app).unwrap();
        assert_eq!(app.matches, 100);
        let mut app = CpuAppender::new(&[1]);
        let e = append_batch(&mut a, "inner", "out", KeyType::Int8, &allow, &mut app).unwrap_err();
        assert_eq!(e.code, Code::ProgramLimitExceeded);
        let pin = a.pin("out", ok).unwrap();
        assert_eq!(complete_pairs(&pin).unwrap_err().code, Code::ObjectNotInPrerequisiteState);
        drop(pin);
        // a key type mismatch and a segment that is no buffer are refused before any write
        let e = append_batch(&mut a, "inner", "out", KeyType::Int4, &allow, &mut CpuAppender::new(&[1])).unwrap_err();
        assert_eq!(e.code, Code::DatatypeMismatch);
        let e = append_batch(&mut a, "inner", "inner", KeyType::Int8, &allow, &mut CpuAppender::new(&[1])).unwrap_err();
        assert_eq!(e.code, Code::InvalidParameterValue);
        assert!(e.message.contains("no GpuJoin result buffer"), "{e}");
        a.drop_segment("out", ok).unwrap();
        a.drop_segment("inner", ok).unwrap();
        drop(a);
        assert_eq!(world.finish(), 0);
    }
}
