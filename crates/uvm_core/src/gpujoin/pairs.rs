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
//! # Untrusted headers
//!
//! The header lives in shared memory that any process with the owner's privileges may
//! overwrite. [`read_header`] validates it before every append and read: magic, version, pair
//! size, offset, and counters small enough that no arithmetic on them overflows
//! ([`MAX_PAIRS`]). An appender adds to `next` with checked arithmetic, writes only inside its
//! own reservation and below the capacity it has mapped, and walks every probe chain at most
//! `slot_count` slots (`table::Table`). A reader ([`complete_pairs`]) trusts the pairs only
//! when `written == next <= capacity`. `next` may exceed the capacity while appenders are
//! growing the buffer (or after a growth failed), so appenders do not require that. A buffer
//! overwritten while it is appended to gives an ERROR or wrong pairs, never a hang, a write
//! outside the buffer or a crash.
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
/// The most pairs a buffer's counters may claim: a buffer of that many bytes fits an `i64`,
/// and adding a key's matches (at most a table's slot count, below 2^60) cannot overflow.
pub const MAX_PAIRS: u64 = (i64::MAX as u64 - HEADER_BYTES) / PAIR_BYTES;

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

/// Validates a result buffer's header in `raw` (at least HEADER_BYTES bytes, else an error)
/// for a segment of `size` bytes. Never reads past `raw`, never panics.
pub fn parse_header(name: &str, raw: &[u8], size: u64) -> Result<PairsHeader> {
    if size < HEADER_BYTES || (raw.len() as u64) < HEADER_BYTES {
        return Err(not_pairs(name, "too small"));
    }
    // SAFETY: `raw` holds a header's bytes; read_unaligned copes with any alignment, and every
    // bit pattern is a valid PairsHeader (plain integers).
    let h: PairsHeader = unsafe { std::ptr::read_unaligned(raw.as_ptr() as *const PairsHeader) };
    if h.magic != MAGIC {
        return Err(not_pairs(name, "no header"));
    }
    if h.version != VERSION || h.pair_bytes as u64 != PAIR_BYTES || h.pairs_offset != HEADER_BYTES {
        return Err(not_pairs(name, "unknown version"));
    }
    if h.next > MAX_PAIRS || h.written > MAX_PAIRS {
        return Err(uvm_err!(
            Code::InvalidParameterValue,
            "GpuJoin result buffer \"{name}\" is corrupted: {} pairs reserved, {} written, at most {MAX_PAIRS} possible",
            h.next,
            h.written
        )
        .hint("The segment was overwritten; drop it and create it again with uvm.gpujoin_pairs_create."));
    }
    Ok(h)
}

/// Reads and validates a result buffer's header (wherever its first chunk lies).
pub fn read_header<E: Env>(pin: &Pin<E>) -> Result<PairsHeader> {
    let name = &pin.info().name;
    if pin.info().size < HEADER_BYTES {
        return Err(not_pairs(name, "too small"));
    }
    let mut raw = [0u8; HEADER_BYTES as usize];
    pin.read_into(0, &mut raw)?;
    parse_header(name, &raw, pin.info().size)
}

/// The number of pairs a complete buffer holds; an error while writers are missing.
pub fn complete_pairs<E: Env>(pin: &Pin<E>) -> Result<u64> {
    check_complete(&pin.info().name, pin.info().size, &read_header(pin)?)
}

/// The pairs of a complete buffer of `size` bytes whose header is `h`; an error while writers
/// are missing.
pub fn check_complete(name: &str, size: u64, h: &PairsHeader) -> Result<u64> {
    if h.written != h.next || h.next > capacity(size) {
        return Err(uvm_err!(
            Code::ObjectNotInPrerequisiteState,
            "GpuJoin result buffer \"{}\" is incomplete: {} pairs reserved, {} written",
            name,
            h.next,
            h.written
        )
        .hint("A gpujoin_materialize that appends to it is still running or failed; drop the buffer and run the join again."));
    }
    Ok(h.next)
}

/// Copies pairs `[from, from + out.len())` of a buffer into `out` (2202E past its end).
pub fn read_pairs<E: Env>(pin: &Pin<E>, from: u64, out: &mut [[i64; 2]]) -> Result<()> {
    // SAFETY: viewing our own [i64; 2] buffer as bytes.
    let raw = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, out.len() * PAIR_BYTES as usize) };
    let at = from.saturating_mul(PAIR_BYTES).saturating_add(HEADER_BYTES).min(i64::MAX as u64);
    pin.read_into(at as i64, raw)
}

/// How a run of an appender ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every key of the batch is done.
    Done,
    /// A reservation ends beyond the mapped capacity: the buffer must hold this many pairs.
    Need(u64),
}

/// The inner table as a batch sees it, for as long as the pin it came from lives: its
/// validated header, the address of its `slot_count` slots (for kernels) and, for CPU
/// appenders, a view of its bytes. Only [`Inner::of`] makes one, so the slots always lie
/// inside the pinned segment.
pub struct Inner<'a> {
    name: &'a str,
    header: Header,
    slots: u64,
    cpu: Option<Table<'a>>,
    /// The bytes `cpu` views (address, length), to rebuild it elsewhere ([`RawInner`]).
    cpu_bytes: Option<(u64, usize)>,
}

impl<'a> Inner<'a> {
    /// The table in `pin`, checked to hold `key_type` keys; with `cpu`, viewed for the CPU
    /// (which refuses tiers it cannot address).
    pub fn of<E: Env>(pin: &'a Pin<E>, key_type: KeyType, cpu: bool) -> Result<Inner<'a>> {
        let name = pin.info().name.as_str();
        let (header, slots) = table::locate(pin, key_type)?;
        if !cpu {
            return Ok(Inner { name, header, slots, cpu: None, cpu_bytes: None });
        }
        let bytes = pin.bytes(0, pin.info().size as i64)?;
        let t = Table::view(name, bytes)?;
        // The view read the header again: use that copy, whose slots it bounds.
        t.header().check_key_type(name, key_type)?;
        let cpu_bytes = Some((bytes.as_ptr() as u64, bytes.len()));
        Ok(Inner { name, header: *t.header(), slots, cpu: Some(t), cpu_bytes })
    }

    /// The segment's name (for messages).
    pub fn name(&self) -> &'a str {
        self.name
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Address of the slots (`header().slot_count` of them), valid while the pin lives.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// The CPU view of the table (CPU appenders only).
    pub fn table(&self) -> Option<&Table<'a>> {
        self.cpu.as_ref()
    }
}

/// An [`Inner`] taken apart to cross to another thread (the GPU service prepares a request on
/// its main thread, which holds the pin, and runs it on an executor thread): plain data, valid
/// for as long as the pin it came from lives.
#[derive(Clone, Debug)]
pub struct RawInner {
    name: String,
    header: Header,
    slots: u64,
    /// The whole segment's bytes (address, length) when viewed for the CPU.
    cpu: Option<(u64, usize)>,
}

impl Inner<'_> {
    /// This view as plain data (see [`RawInner`]).
    pub fn raw(&self) -> RawInner {
        RawInner { name: self.name.to_string(), header: self.header, slots: self.slots, cpu: self.cpu_bytes }
    }
}

impl RawInner {
    /// The view again.
    ///
    /// # Safety
    /// The pin that the [`Inner`] behind this came from must still be held, and its memory
    /// mapped in this process, for as long as the returned view is used.
    pub unsafe fn inner(&self) -> Result<Inner<'_>> {
        let cpu = match self.cpu {
            // SAFETY: the caller keeps the pin, so the bytes Inner::of viewed are still mapped.
            Some((addr, len)) => Some(Table::view(&self.name, unsafe { std::slice::from_raw_parts(addr as *const u8, len) })?),
            None => None,
        };
        Ok(Inner { name: &self.name, header: self.header, slots: self.slots, cpu, cpu_bytes: self.cpu })
    }
}

/// The result buffer as a batch sees it, for as long as the pin it came from lives: the address
/// of its header and the pairs mapped. Only [`Target::of`] and [`Target::to_reset`] make one
/// ([`Target::from_raw`] makes one of theirs again).
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    base: u64,
    cap: u64,
    _pin: std::marker::PhantomData<&'a ()>,
}

impl<'a> Target<'a> {
    /// The result buffer in `pin`, its header validated; with `cpu`, checked to be addressable
    /// by the CPU. `cap` is the pairs the pin maps.
    pub fn of<E: Env>(pin: &'a Pin<E>, cpu: bool) -> Result<Target<'a>> {
        read_header(pin)?;
        Target::to_reset(pin, cpu)
    }

    /// As [`Target::of`] for a buffer whose header the caller writes afresh before anything
    /// reads it (so it is not read here: in the GPU service, a read of device memory on its main
    /// thread).
    pub fn to_reset<E: Env>(pin: &'a Pin<E>, cpu: bool) -> Result<Target<'a>> {
        if pin.info().size < HEADER_BYTES {
            return Err(not_pairs(&pin.info().name, "too small"));
        }
        if cpu {
            pin.bytes(0, pin.info().size as i64)?; // refuses tiers the CPU cannot address
        }
        let base = pin.addr(0, HEADER_BYTES as i64)?;
        if !base.is_multiple_of(8) {
            return Err(UvmError::new(Code::SystemError, "result buffer memory is misaligned"));
        }
        Ok(Target { base, cap: capacity(pin.info().size), _pin: std::marker::PhantomData })
    }

    /// The target `Target::of` found (`base`, `cap`), again: for work prepared under a pin and
    /// run later.
    ///
    /// # Safety
    /// `base` and `cap` come from [`Target::of`] on a pin the caller still holds.
    pub unsafe fn from_raw(base: u64, cap: u64) -> Target<'a> {
        Target { base, cap, _pin: std::marker::PhantomData }
    }

    /// Address of the header (8-byte aligned); the pairs follow it.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Pairs mapped after the header: `[base + HEADER_BYTES, + cap * PAIR_BYTES)` is writable.
    pub fn cap(&self) -> u64 {
        self.cap
    }
}

/// Appends a batch's matches: the CPU appender below, or the kernel (`gpu::KernelAppender`).
pub trait Appender {
    /// Whether it reads and writes through CPU addresses (then both segments must be in tiers
    /// the CPU can address).
    fn cpu(&self) -> bool;
    /// Appends, or goes on appending where the last run stopped, into `target`.
    fn run(&mut self, inner: &Inner<'_>, target: Target<'_>) -> Result<Step>;
}

/// What [`append_batch`] needs of a process's segment manager: pins and growth. The SQL layer
/// implements it with a short borrow of its manager per call, so that no interrupt check runs
/// while the manager is borrowed (a FATAL interrupt ends the process from inside the check, and
/// the exit callback can only detach a manager that is not borrowed).
pub trait Access<E: Env> {
    fn pin(&mut self, name: &str, authorize: &dyn Fn(u32) -> Result<()>) -> Result<Pin<E>>;
    fn grow_at_least(&mut self, name: &str, min_size: u64, authorize: &dyn Fn(u32) -> Result<()>) -> Result<u64>;
}

impl<E: Env> Access<E> for Segments<E> {
    fn pin(&mut self, name: &str, authorize: &dyn Fn(u32) -> Result<()>) -> Result<Pin<E>> {
        Segments::pin(self, name, authorize)
    }

    fn grow_at_least(&mut self, name: &str, min_size: u64, authorize: &dyn Fn(u32) -> Result<()>) -> Result<u64> {
        Segments::grow_at_least(self, name, min_size, authorize)
    }
}

/// Appends the matches of one batch of keys through `appender`, growing the result buffer as
/// writers need. `authorize(owner, segment, action)` checks access to each segment.
pub fn append_batch<E: Env>(
    segs: &mut dyn Access<E>,
    inner: &str,
    result: &str,
    key_type: KeyType,
    authorize: &dyn Fn(u32, &str, &str) -> Result<()>,
    appender: &mut dyn Appender,
) -> Result<()> {
    let inner_pin = segs.pin(inner, &|o| authorize(o, inner, "read"))?;
    let inner_view = Inner::of(&inner_pin, key_type, appender.cpu())?;
    loop {
        crate::interrupt::check()?;
        let out = segs.pin(result, &|o| authorize(o, result, "write"))?;
        let target = Target::of(&out, appender.cpu())?;
        let (size, max_size, cap) = (out.info().size, out.info().max_size, target.cap());
        let step = appender.run(&inner_view, target)?;
        drop(out);
        match step {
            Step::Done => return Ok(()),
            Step::Need(pairs) => {
                debug_assert!(pairs > cap);
                // Twice the size when that fits (amortised growth), else exactly what is needed.
                let doubled = size.saturating_mul(2).max(bytes_for(pairs));
                let want = if doubled <= max_size { doubled } else { bytes_for(pairs) };
                segs.grow_at_least(result, want, &|o| authorize(o, result, "write")).map_err(|e| {
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
    /// Pairs start with the key's index in `keys` plus this, not the key: the plan node reads
    /// the batch position of the probed key from it, with no lookup.
    index_base: Option<u64>,
    pub matches: u64,
    pub sum: i128,
}

impl<'a> CpuAppender<'a> {
    pub fn new(keys: &'a [i64]) -> CpuAppender<'a> {
        CpuAppender { keys, ..Default::default() }
    }

    /// With `on`, each pair starts with its key's index in `keys` plus `base`.
    pub fn indexed(self, on: bool, base: u64) -> Self {
        CpuAppender { index_base: on.then_some(base), ..self }
    }
}

impl Appender for CpuAppender<'_> {
    fn cpu(&self) -> bool {
        true
    }

    fn run(&mut self, inner: &Inner<'_>, target: Target<'_>) -> Result<Step> {
        let table =
            inner.table().ok_or_else(|| UvmError::new(Code::SystemError, "a CPU appender got no CPU view of the table"))?;
        let (cap, name) = (target.cap(), table.name());
        // SAFETY: Target::of checked that `base` is the 8-byte-aligned header of a buffer that
        // the pin behind `target` keeps mapped and CPU-addressable; the counters are only ever
        // accessed atomically, by every process.
        let (next, written) =
            unsafe { (&*((target.base() + NEXT_AT) as *const AtomicU64), &*((target.base() + WRITTEN_AT) as *const AtomicU64)) };
        let pairs = (target.base() + HEADER_BYTES) as *mut i64;
        while self.at < self.keys.len() {
            let k = self.keys[self.at];
            let tag = self.index_base.map_or(k, |b| b.wrapping_add(self.at as u64) as i64);
            let mut m = 0u64;
            table.for_each_match(k, |_| m += 1)?;
            if m > 0 {
                let base = match self.pending {
                    Some(b) => b,
                    None => next.fetch_add(m, Ordering::AcqRel),
                };
                let end = base.checked_add(m).filter(|&e| e <= MAX_PAIRS).ok_or_else(|| {
                    uvm_err!(Code::InvalidParameterValue, "GpuJoin result buffer is corrupted: {base} pairs reserved")
                        .hint("The segment was overwritten; drop it and create it again with uvm.gpujoin_pairs_create.")
                })?;
                if end > cap {
                    self.pending = Some(base);
                    return Ok(Step::Need(end));
                }
                // Walk again and write at most the m pairs reserved: a table overwritten between
                // the two walks must not make us write past our reservation.
                let mut j = base;
                let sum = &mut self.sum;
                let walked = table.for_each_match(k, |p| {
                    if j < end {
                        // SAFETY: pair j lies in [base, end), reserved by us alone and below the
                        // mapped capacity `cap` (checked above); two aligned i64 words each.
                        unsafe {
                            std::ptr::write_volatile(pairs.add(2 * j as usize), tag);
                            std::ptr::write_volatile(pairs.add(2 * j as usize + 1), p);
                        }
                        *sum += p as i128;
                        j += 1;
                    }
                });
                written.fetch_add(j - base, Ordering::Release);
                self.matches += j - base;
                self.pending = None;
                walked?;
                if j != end {
                    // The reservation stays partly unwritten: readers see written != next.
                    return Err(table::corrupted(name, "it changed while it was probed"));
                }
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

    /// Counters overwritten with huge values: appends fail with an ERROR (the checked
    /// arithmetic, the header check, or growth past max_size) and never write outside the
    /// buffer; a table whose chains have no end fails the append too.
    #[test]
    fn corrupted_counters_and_tables_give_errors() {
        let world = World::new("pairs-corrupt", Arena::default());
        let mut a = process(&world, 1);
        let rows: Vec<(Option<i64>, i64)> = (0..10).map(|i| (Some(i), i)).collect();
        make_inner(&mut a, "inner", &rows);
        make_result(&mut a, "out", 100, Some(bytes_for(200) as i64));
        let set = |a: &mut Segments<crate::segment::tests::TestEnv>, name: &str, at: u64, v: u64| {
            a.pin(name, ok).unwrap().write_from(at as i64, &v.to_le_bytes()).unwrap();
        };
        for (next, code) in [
            (u64::MAX - 1, Code::InvalidParameterValue), // header check
            (MAX_PAIRS, Code::InvalidParameterValue),    // checked arithmetic
            (1 << 40, Code::ProgramLimitExceeded),       // growth past max_size
        ] {
            set(&mut a, "out", NEXT_AT, next);
            let e = append_batch(&mut a, "inner", "out", KeyType::Int8, &allow, &mut CpuAppender::new(&[1, 2])).unwrap_err();
            assert_eq!(e.code, code, "next = {next}: {e}");
        }
        set(&mut a, "out", NEXT_AT, 0);
        set(&mut a, "out", WRITTEN_AT, 0);
        // a reader refuses counters beyond the buffer's capacity
        set(&mut a, "out", NEXT_AT, 150);
        set(&mut a, "out", WRITTEN_AT, 150);
        let pin = a.pin("out", ok).unwrap();
        assert_eq!(complete_pairs(&pin).unwrap_err().code, Code::ObjectNotInPrerequisiteState);
        drop(pin);
        set(&mut a, "out", NEXT_AT, 0);
        set(&mut a, "out", WRITTEN_AT, 0);
        // every slot of the inner table occupied: the probe chain has no end
        {
            let mut pin = a.pin("inner", ok).unwrap();
            for s in 0..32u64 {
                pin.write_from((table::HEADER_BYTES + s * table::SLOT_BYTES) as i64, &7u64.to_le_bytes()).unwrap();
            }
        }
        let e = append_batch(&mut a, "inner", "out", KeyType::Int8, &allow, &mut CpuAppender::new(&[1])).unwrap_err();
        assert!(e.message.contains("is corrupted: a probe found no empty slot"), "{e}");
        a.drop_segment("out", ok).unwrap();
        a.drop_segment("inner", ok).unwrap();
        drop(a);
        assert_eq!(world.finish(), 0);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: crate::testing::proptest_cases(512), ..Default::default() })]

        /// Arbitrary bytes and sizes: never a panic; an accepted header has counters that no
        /// arithmetic overflows on.
        #[test]
        fn the_header_parser_takes_any_bytes(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100),
            magic in proptest::bool::ANY,
            size in proptest::prelude::any::<u64>(),
        ) {
            let mut bytes = bytes;
            if magic && bytes.len() >= 24 {
                bytes[..16].copy_from_slice(&PairsHeader::new().as_bytes()[..16]);
            }
            if let Ok(h) = parse_header("p", &bytes, size) {
                proptest::prop_assert!(h.next <= MAX_PAIRS && h.written <= MAX_PAIRS && size >= HEADER_BYTES);
                proptest::prop_assert!(bytes_for(h.next) <= i64::MAX as u64);
            }
        }
    }
}
