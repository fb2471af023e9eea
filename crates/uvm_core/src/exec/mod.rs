//! The execution seam: one interface for every operation on segment memory, three ways to run
//! it.
//!
//! # Design
//!
//! Every operation the SQL layer performs on a segment's memory (create, grow, drop, migrate,
//! read, write, checksum, fill, the GpuJoin build, probe and materialize, the joins and scan
//! programs over column caches ([`cached`], [`scan`]), the benchmarks) is a
//! typed request ([`request`]: a struct of named fields, among them references to segments
//! (name and id, resolved and authorized by the caller), with a typed reply), with bulk input
//! or output in a byte buffer ([`Io`]). An [`Executor`] runs requests in their slot form
//! ([`Request`], [`Done`]); [`call`] and [`start`] turn a typed request into that form and the
//! reply back into its type, so no caller packs or unpacks anything by position:
//!
//! - **in this process** ([`local`]): the process's own segment manager maps the segment and the
//!   work runs here, on the CPU (host provider) or with CUDA in this process (CUDA provider):
//!   the `process` execution mode;
//! - **in the GPU service** (`crate::service`): the request goes through a slot of the
//!   shared-memory channel to the service, which runs the very same [`local`] code on its own
//!   mappings, with the one CUDA context of the cluster: the `service` mode.
//!
//! The mode is chosen once per cluster (`pg_uvm_share.gpu_execution`), and CPU versus GPU is
//! chosen once per provider ([`local::Engine`]), so no surface (the SQL functions, the C API,
//! the plan nodes) asks either question: it asks the runtime for what it needs
//! (`crate::runtime`: whether this process maps segment memory, device addresses, the staging
//! limit, whether a GPU does the work), calls the helpers below and hands them whatever
//! executor the runtime gives it.
//! The helpers split requests whose data exceeds what one request may carry
//! ([`Executor::max_io`]: a staging area in service mode, unbounded in process mode).
//!
//! This module and [`local`] do not call PostgreSQL; the segment manager reaches the registry
//! through its `Env`.

pub mod cached;
pub mod kernel;
pub mod local;
pub mod request;
pub mod scan;

use std::marker::PhantomData;

use zerocopy::IntoBytes;

use crate::error::{Code, Result, UvmError};
use crate::gpujoin::pairs::PairsHeader;
use crate::gpujoin::table::{self, KeyType};
use crate::registry::TierPref;
use request::{self as ops, Sum128};
pub use request::{Call, Done, Mode, Op, Operation, Reply, Request, SegRef};

/// A request's bulk data: input it reads, output it writes, or none.
pub enum Io<'a> {
    None,
    In(&'a [u8]),
    Out(&'a mut [u8]),
}

impl Io<'_> {
    /// The input bytes (none unless `In`).
    pub fn input(&self) -> &[u8] {
        match self {
            Io::In(b) => b,
            _ => &[],
        }
    }
}

/// Runs requests: in this process ([`local::Local`]) or in the GPU service.
pub trait Executor {
    fn mode(&self) -> Mode;
    /// The most bulk bytes one request may carry.
    fn max_io(&self) -> usize;
    /// Runs `req`; returns its reply.
    fn run(&mut self, req: &Request, io: Io<'_>) -> Result<Done>;
    /// Starts `req` with `input` (at most `max_io` bytes, copied: the caller may reuse its
    /// buffer at once) and returns without waiting for it where the executor can (the
    /// service); the default runs it now.
    fn start(&mut self, req: &Request, input: &[u8]) -> Result<Started> {
        Ok(Started::Ready(self.run(req, Io::In(input))))
    }
}

/// A request in flight, waited for by [`Started::wait`]. Dropping it unwaited gives the request
/// up (the service finishes or stops it, and only then reuses its slot).
pub trait InFlight {
    fn wait(self: Box<Self>) -> Result<Done>;
}

/// The result of [`Executor::start`]: there already, or to wait for.
pub enum Started {
    Ready(Result<Done>),
    InFlight(Box<dyn InFlight>),
}

impl Started {
    pub fn wait(self) -> Result<Done> {
        match self {
            Started::Ready(r) => r,
            Started::InFlight(f) => f.wait(),
        }
    }
}

/// A started request whose reply is an `R`.
pub struct Pending<R> {
    started: Started,
    _reply: PhantomData<fn() -> R>,
}

impl<R: zerocopy::FromBytes + zerocopy::KnownLayout> Pending<R> {
    fn of(started: Started) -> Pending<R> {
        Pending { started, _reply: PhantomData }
    }

    /// Waits for the reply.
    pub fn wait(self) -> Result<R> {
        self.started.wait().map(|d| d.get())
    }
}

/// Runs the typed request `o` with `io`: its typed reply and the output bytes written.
pub fn call<O: Operation>(ex: &mut dyn Executor, o: &O, io: Io<'_>) -> Result<(O::Reply, u64)> {
    let req = Request::of(o, io.input().len() as u64);
    ex.run(&req, io).map(|d| (d.get(), d.output))
}

/// Starts the typed request `o` with `input` (see [`Executor::start`]).
pub fn start<O: Operation>(ex: &mut dyn Executor, o: &O, input: &[u8]) -> Result<Pending<O::Reply>> {
    ex.start(&Request::of(o, input.len() as u64), input).map(Pending::of)
}

/// Runs `o` with no bulk data and gives its typed reply.
fn reply<O: Operation>(ex: &mut dyn Executor, o: O) -> Result<O::Reply> {
    call(ex, &o, Io::None).map(|(r, _)| r)
}

/// An empty round trip.
pub fn ping(ex: &mut dyn Executor) -> Result<()> {
    reply(ex, ops::Ping {}).map(|_| ())
}

/// The executor's provider capabilities, as `uvm.device_info()` rows.
pub fn info(ex: &mut dyn Executor) -> Result<Vec<(String, String)>> {
    let mut buf = vec![0u8; ex.max_io().min(64 << 10)];
    let (_, n) = call(ex, &ops::Info {}, Io::Out(&mut buf))?;
    let text = String::from_utf8_lossy(&buf[..(n as usize).min(buf.len())]).into_owned();
    Ok(text.lines().filter_map(|l| l.split_once('\t')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

/// A `Create` request's fields (see `Segments::create`).
fn create_request(name: &str, size: i64, max_size: Option<i64>, pref: TierPref, owner: u32, now: i64) -> Result<ops::Create> {
    Ok(ops::Create {
        seg: SegRef::new(name, 0)?,
        size,
        max_size: max_size.unwrap_or(-1),
        has_max_size: max_size.is_some() as u32,
        pref: pref.code(),
        owner,
        _pad: 0,
        now,
    })
}

/// Creates a segment (see `Segments::create`); returns its id.
pub fn create(
    ex: &mut dyn Executor,
    name: &str,
    size: i64,
    max_size: Option<i64>,
    pref: TierPref,
    owner: u32,
    now: i64,
) -> Result<u64> {
    reply(ex, create_request(name, size, max_size, pref, owner, now)?).map(|r| r.id)
}

/// Creates a segment (as [`create`]) with `data` written at its start: one request where it
/// fits the executor's staging (`CreateWith`), else a creation and then the writes. Returns
/// its id.
#[allow(clippy::too_many_arguments)]
pub fn create_with(
    ex: &mut dyn Executor,
    name: &str,
    size: i64,
    max_size: Option<i64>,
    pref: TierPref,
    owner: u32,
    now: i64,
    data: &[u8],
) -> Result<u64> {
    if data.len() > ex.max_io() {
        let id = create(ex, name, size, max_size, pref, owner, now)?;
        write(ex, &SegRef::new(name, id)?, 0, data)?;
        return Ok(id);
    }
    // (the same fields as Create's, in the same layout: zerocopy checks the sizes)
    let o: ops::CreateWith = zerocopy::transmute!(create_request(name, size, max_size, pref, owner, now)?);
    call(ex, &o, Io::In(data)).map(|(r, _)| r.id)
}

/// Drops `segs` in order, in as few requests as their names fit in staging
/// (`DropSegments`); the first failure ends it (those before it are dropped).
pub fn drop_all(ex: &mut dyn Executor, segs: &[SegRef]) -> Result<()> {
    let step = (ex.max_io() / std::mem::size_of::<SegRef>()).max(1);
    for part in segs.chunks(step) {
        call(ex, &ops::DropSegments {}, Io::In(part.as_bytes()))?;
    }
    Ok(())
}

pub fn grow(ex: &mut dyn Executor, seg: &SegRef, new_size: i64) -> Result<u64> {
    reply(ex, ops::Grow { seg: *seg, new_size }).map(|r| r.size)
}

pub fn grow_at_least(ex: &mut dyn Executor, seg: &SegRef, min_size: u64) -> Result<u64> {
    reply(ex, ops::GrowAtLeast { seg: *seg, min_size }).map(|r| r.size)
}

pub fn drop(ex: &mut dyn Executor, seg: &SegRef) -> Result<()> {
    reply(ex, ops::DropSegment { seg: *seg }).map(|_| ())
}

/// Moves `[offset, offset + length)` to `target`, waiting up to `pin_wait_ms` for pins to drain.
pub fn prefetch(
    ex: &mut dyn Executor,
    seg: &SegRef,
    offset: i64,
    length: i64,
    target: TierPref,
    pin_wait_ms: u64,
) -> Result<u64> {
    reply(ex, ops::Prefetch { seg: *seg, offset, length, target: target.code(), _pad: 0, pin_wait_ms }).map(|r| r.bytes)
}

/// The offset `i * step` bytes past `offset`, or 2202E if that overflows.
fn offset_at(offset: i64, i: usize, step: usize) -> Result<i64> {
    offset.checked_add((i * step) as i64).ok_or_else(|| UvmError::new(Code::OutOfRange, "offset overflows"))
}

/// Copies `[offset, offset + out.len())` of the segment into `out`.
pub fn read(ex: &mut dyn Executor, seg: &SegRef, offset: i64, out: &mut [u8]) -> Result<()> {
    if out.is_empty() {
        // Still validates the range (an offset past the end is an error).
        return call(ex, &ops::ReadBytes { seg: *seg, offset, length: 0 }, Io::Out(out)).map(|_| ());
    }
    let step = ex.max_io().max(1);
    for (i, part) in out.chunks_mut(step).enumerate() {
        let o = ops::ReadBytes { seg: *seg, offset: offset_at(offset, i, step)?, length: part.len() as i64 };
        call(ex, &o, Io::Out(part))?;
    }
    Ok(())
}

/// Copies `data` to `[offset, offset + data.len())` of the segment.
pub fn write(ex: &mut dyn Executor, seg: &SegRef, offset: i64, data: &[u8]) -> Result<()> {
    if data.is_empty() {
        return call(ex, &ops::WriteBytes { seg: *seg, offset }, Io::In(data)).map(|_| ());
    }
    let step = ex.max_io().max(1);
    for (i, part) in data.chunks(step).enumerate() {
        call(ex, &ops::WriteBytes { seg: *seg, offset: offset_at(offset, i, step)? }, Io::In(part))?;
    }
    Ok(())
}

pub fn checksum(ex: &mut dyn Executor, seg: &SegRef, offset: i64, length: i64) -> Result<u64> {
    reply(ex, ops::Checksum { seg: *seg, offset, length }).map(|r| r.checksum)
}

pub fn fill(ex: &mut dyn Executor, seg: &SegRef, offset: i64, length: i64, seed: i64) -> Result<()> {
    reply(ex, ops::Fill { seg: *seg, offset, length, seed }).map(|_| ())
}

/// A key type as a request carries it: its width in bytes.
fn key_code(kt: KeyType) -> u32 {
    match kt {
        KeyType::Int4 => 4,
        KeyType::Int8 => 8,
    }
}

pub(crate) fn key_type_of(code: u32) -> Result<KeyType> {
    match code {
        4 => Ok(KeyType::Int4),
        8 => Ok(KeyType::Int8),
        _ => Err(UvmError::new(Code::ProtocolViolation, format!("bad key type {code} in a request"))),
    }
}

/// A probe's outcome: the keys that matched, and the sum of their payloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSum {
    pub matches: u64,
    pub sum: i128,
}

impl From<ops::Probed> for ProbeSum {
    fn from(p: ops::Probed) -> ProbeSum {
        ProbeSum { matches: p.matches, sum: p.sum.get() }
    }
}

impl std::ops::Add for ProbeSum {
    type Output = ProbeSum;
    fn add(self, o: ProbeSum) -> ProbeSum {
        ProbeSum { matches: self.matches + o.matches, sum: self.sum + o.sum }
    }
}

/// Probes `keys` against the GpuJoin table in `inner`.
pub fn probe(ex: &mut dyn Executor, inner: &SegRef, kt: KeyType, keys: &[i64]) -> Result<ProbeSum> {
    let step = (ex.max_io() / 8).max(1);
    let o = ops::Probe { inner: *inner, key_type: key_code(kt), _pad: 0 };
    keys.chunks(step)
        .try_fold(ProbeSum { matches: 0, sum: 0 }, |acc, part| Ok(acc + call(ex, &o, Io::In(part.as_bytes()))?.0.into()))
}

/// Starts probing `keys` (see [`Executor::start`]). Keys beyond one request's staging are
/// probed at once, in pieces.
pub fn probe_start(ex: &mut dyn Executor, inner: &SegRef, kt: KeyType, keys: &[i64]) -> Result<Pending<ops::Probed>> {
    if keys.len() * 8 > ex.max_io() {
        let p = probe(ex, inner, kt, keys)?;
        let done = Done::of(&ops::Probed { matches: p.matches, sum: Sum128::from(p.sum) }, 0);
        return Ok(Pending::of(Started::Ready(Ok(done))));
    }
    start(ex, &ops::Probe { inner: *inner, key_type: key_code(kt), _pad: 0 }, keys.as_bytes())
}

/// Probes `keys` and appends every matched pair to the result buffer `result`: (key, payload),
/// or with `indexed` (the key's index in `keys`, payload).
pub fn materialize(
    ex: &mut dyn Executor,
    inner: &SegRef,
    result: &SegRef,
    kt: KeyType,
    keys: &[i64],
    indexed: bool,
) -> Result<ProbeSum> {
    let step = (ex.max_io() / 8).max(1);
    let mut o =
        ops::Materialize { inner: *inner, result: *result, key_type: key_code(kt), indexed: u32::from(indexed), index_base: 0 };
    keys.chunks(step).try_fold(ProbeSum { matches: 0, sum: 0 }, |acc, part| {
        let (r, _) = call(ex, &o, Io::In(part.as_bytes()))?;
        o.index_base += part.len() as u64;
        Ok(acc + ProbeSum { matches: r.matches, sum: r.sum.get() })
    })
}

/// [`materialize`] into a reset result buffer, within its present size, on an executor thread of
/// the GPU service rather than its main thread (one thread for the cluster, which a growth
/// needs): the buffer's header is reset by the first request and checked after the last (every
/// pair reserved was written, and they are the matches), so the caller needs no other round
/// trip. `Ok(Err(pairs))` when the buffer must hold `pairs` pairs first; what was written then
/// does not count (reset the buffer and call [`materialize`], which grows it).
pub fn materialize_within(
    ex: &mut dyn Executor,
    inner: &SegRef,
    result: &SegRef,
    kt: KeyType,
    keys: &[i64],
    indexed: bool,
) -> Result<std::result::Result<ProbeSum, u64>> {
    let step = (ex.max_io() / 8).max(1);
    let mut o = within_op(inner, result, kt, indexed);
    let mut total = ProbeSum { matches: 0, sum: 0 };
    // An empty batch still resets the buffer.
    let parts: Vec<&[i64]> = if keys.is_empty() { vec![keys] } else { keys.chunks(step).collect() };
    let mut counters = (0, 0);
    for part in parts {
        let (r, _) = call(ex, &o, Io::In(part.as_bytes()))?;
        if r.need > 0 {
            return Ok(Err(r.need));
        }
        o.index_base += part.len() as u64;
        o.fresh = 0;
        total = total + ProbeSum { matches: r.matches, sum: r.sum.get() };
        counters = (r.next, r.written);
    }
    check_counters(result, counters, total.matches)?;
    Ok(Ok(total))
}

/// [`materialize_within`] started and not waited for ([`Executor::start`]), so that the caller
/// reads its next batch or returns the last one's rows meanwhile: `keys` go in one request
/// where they fit one request's staging; else the whole call runs now. The result buffer is the
/// request's until [`WithinPending::wait`] returns; dropped unwaited, the request is given up.
pub fn materialize_within_start(
    ex: &mut dyn Executor,
    inner: &SegRef,
    result: &SegRef,
    kt: KeyType,
    keys: &[i64],
    indexed: bool,
) -> Result<WithinPending> {
    if keys.len() * 8 > ex.max_io() {
        let done = materialize_within(ex, inner, result, kt, keys, indexed)?;
        return Ok(WithinPending { result: *result, state: Within::Done(done) });
    }
    let o = within_op(inner, result, kt, indexed);
    Ok(WithinPending { result: *result, state: Within::InFlight(start(ex, &o, keys.as_bytes())?) })
}

/// A batch's first [`ops::MaterializeWithin`] request (it resets the buffer: `fresh`).
fn within_op(inner: &SegRef, result: &SegRef, kt: KeyType, indexed: bool) -> ops::MaterializeWithin {
    ops::MaterializeWithin {
        inner: *inner,
        result: *result,
        key_type: key_code(kt),
        indexed: u32::from(indexed),
        index_base: 0,
        fresh: 1,
        _pad: 0,
    }
}

/// A [`materialize_within`] in flight ([`materialize_within_start`]).
pub struct WithinPending {
    result: SegRef,
    state: Within,
}

enum Within {
    Done(std::result::Result<ProbeSum, u64>),
    InFlight(Pending<ops::MaterializedWithin>),
}

impl WithinPending {
    /// Its answer, as [`materialize_within`]'s: the pairs' count and sum, the buffer's header
    /// checked; or `Err(pairs)` when the buffer must hold `pairs` pairs first.
    pub fn wait(self) -> Result<std::result::Result<ProbeSum, u64>> {
        match self.state {
            Within::Done(d) => Ok(d),
            Within::InFlight(p) => {
                let r = p.wait()?;
                if r.need > 0 {
                    return Ok(Err(r.need));
                }
                check_counters(&self.result, (r.next, r.written), r.matches)?;
                Ok(Ok(ProbeSum { matches: r.matches, sum: r.sum.get() }))
            }
        }
    }
}

/// [`materialize`] into a reset result buffer, its header checked after (as
/// [`materialize_within`] does): the main-thread form, which grows the buffer.
pub fn materialize_reset(
    ex: &mut dyn Executor,
    inner: &SegRef,
    result: &SegRef,
    kt: KeyType,
    keys: &[i64],
    indexed: bool,
) -> Result<ProbeSum> {
    pairs_reset(ex, result)?;
    let p = materialize(ex, inner, result, kt, keys, indexed)?;
    let mut raw = [0u8; crate::gpujoin::pairs::HEADER_BYTES as usize];
    read(ex, result, 0, &mut raw)?;
    let h = crate::gpujoin::pairs::parse_header(result.name(), &raw, crate::gpujoin::pairs::HEADER_BYTES)?;
    check_counters(result, (h.next, h.written), p.matches)?;
    Ok(p)
}

/// A result buffer whose header counts `(next, written)` pairs after a materialize that found
/// `matches`: every pair reserved written, and they are the matches; else the buffer was
/// overwritten meanwhile (ERROR 55000).
fn check_counters(result: &SegRef, (next, written): (u64, u64), matches: u64) -> Result<()> {
    if (next, written) == (matches, matches) {
        return Ok(());
    }
    Err(UvmError::new(
        Code::ObjectNotInPrerequisiteState,
        format!("GpuJoin result buffer \"{}\" holds {next} pairs ({written} written), the probe found {matches}", result.name()),
    ))
}

/// Zeroes a table's header and `slot_count` slots (the start of a build).
pub fn build_begin(ex: &mut dyn Executor, seg: &SegRef, slot_count: u64) -> Result<()> {
    reply(ex, ops::BuildBegin { table: *seg, slot_count }).map(|_| ())
}

/// Inserts `rows` (key, payload; no NULL keys) into a table of `slot_count` slots.
pub fn build_insert(ex: &mut dyn Executor, seg: &SegRef, kt: KeyType, slot_count: u64, rows: &[[i64; 2]]) -> Result<()> {
    let step = (ex.max_io() / 16).max(1);
    let o = ops::BuildInsert { table: *seg, key_type: key_code(kt), _pad: 0, slot_count };
    for part in rows.chunks(step) {
        call(ex, &o, Io::In(part.as_bytes()))?;
    }
    Ok(())
}

/// Ends a build: writes the header of a table of `slot_count` slots holding `rows` rows (and
/// `nulls` rows left out for their NULL keys). Written last: a table is valid only once its
/// header is, so a build that failed before leaves no usable table.
pub fn build_finish(ex: &mut dyn Executor, seg: &SegRef, kt: KeyType, slot_count: u64, rows: u64, nulls: u64) -> Result<()> {
    let header = table::Header { slot_count, ..table::header_for(kt, rows, nulls, 0) };
    write(ex, seg, 0, &header.as_bytes())
}

/// Inserts the rows of the column cache `cache` into the table `seg` of `slot_count` slots
/// (begun by [`build_begin`]): keys from its column `key_col`, payloads from `payload_col`
/// (`None`: 0), read in place (`cached`). Finish it with [`build_finish`] and the reply's
/// counts.
pub fn cache_build(
    ex: &mut dyn Executor,
    seg: &SegRef,
    kt: KeyType,
    slot_count: u64,
    cache: &SegRef,
    key_col: u32,
    payload_col: Option<u32>,
) -> Result<ops::CacheBuilt> {
    let payload_col = payload_col.unwrap_or(cached::NO_COLUMN);
    reply(ex, ops::CacheBuild { table: *seg, cache: *cache, key_type: key_code(kt), key_col, payload_col, _pad: 0, slot_count })
}

/// Probes the non-NULL keys of column `key_col` of the column cache `cache` against the table
/// `inner`, read in place (`cached`): the matches and payload sum, the cache's rows read, and
/// the time the probing itself took (kernels or CPU loop).
pub fn cache_probe(
    ex: &mut dyn Executor,
    inner: &SegRef,
    kt: KeyType,
    cache: &SegRef,
    key_col: u32,
) -> Result<(ProbeSum, u64, std::time::Duration)> {
    let r = reply(ex, ops::CacheProbe { inner: *inner, cache: *cache, key_type: key_code(kt), key_col })?;
    Ok((ProbeSum { matches: r.matches, sum: r.sum.get() }, r.rows, std::time::Duration::from_nanos(r.probe_ns)))
}

/// A scan program's bulk bytes, where they fit the executor's staging.
fn program_bytes(ex: &mut dyn Executor, spec: &scan::Spec) -> Result<Vec<u8>> {
    let bytes = spec.encode()?;
    if bytes.len() > ex.max_io() {
        return Err(UvmError::new(
            Code::ProgramLimitExceeded,
            format!("a scan program of {} bytes does not fit a request's {} bytes of staging", bytes.len(), ex.max_io()),
        ));
    }
    Ok(bytes)
}

/// Runs the scan program `spec` over the column cache `cache`, folding into the group table
/// `groups` (formatted by `groups::init`, or grown by [`groups_grow`]) from row `start.1` of
/// block `start.0` (see `ops::ScanGroups`): where the table is full, the row to resume at and
/// the slots it needs; and the time the scanning itself took (`ops::ScannedGroups`).
/// `max_groups`: the most distinct keys the program can make (0: unknown).
pub fn scan_groups(
    ex: &mut dyn Executor,
    cache: &SegRef,
    groups: &SegRef,
    spec: &scan::Spec,
    start: (u64, u64),
    max_groups: u64,
) -> Result<(crate::scan::Progress, std::time::Duration)> {
    scan_groups_start(ex, cache, groups, spec, start, max_groups)?.wait()
}

/// [`scan_groups`] started: in the GPU service it runs while the caller goes on (a star join
/// starts its dimensions' programs together), elsewhere it has run already.
pub fn scan_groups_start(
    ex: &mut dyn Executor,
    cache: &SegRef,
    groups: &SegRef,
    spec: &scan::Spec,
    start: (u64, u64),
    max_groups: u64,
) -> Result<ScanGroupsPending> {
    let bytes = program_bytes(ex, spec)?;
    let o = ops::ScanGroups { cache: *cache, groups: *groups, start_block: start.0, start_row: start.1, max_groups };
    self::start(ex, &o, &bytes).map(ScanGroupsPending)
}

/// A started [`scan_groups`].
pub struct ScanGroupsPending(Pending<ops::ScannedGroups>);

impl ScanGroupsPending {
    /// Waits for it: where the program stopped, and the scanning's own time.
    pub fn wait(self) -> Result<(crate::scan::Progress, std::time::Duration)> {
        let r = self.0.wait()?;
        let progress = if r.full == 0 {
            crate::scan::Progress::Done
        } else {
            crate::scan::Progress::Full { block: r.block, row: r.row, slots: r.slots }
        };
        Ok((progress, std::time::Duration::from_nanos(r.scan_ns)))
    }
}

/// The bulk bytes of a dimension's build program (`ScanBuild`, `ScanBuildTable`): `spec`,
/// which has no joins, with its one segment, the group table `groups` of the same program.
fn build_program_bytes(ex: &mut dyn Executor, spec: &scan::Spec, groups: &SegRef) -> Result<Vec<u8>> {
    if !spec.dims.is_empty() || !spec.joins.is_empty() {
        return Err(UvmError::new(Code::InvalidParameterValue, "a dimension's build program has no joins"));
    }
    program_bytes(ex, &scan::Spec { dims: vec![*groups], ..spec.clone() })
}

/// Inserts the pairs of a dimension's rows in the cache `cache` that pass `spec`'s filters into
/// the join table `table` of `slot_count` slots (begun by [`build_begin`]; finish it with
/// [`build_finish`]): key column `key_col`, payload the slot of the row's group in `groups`,
/// the table `spec` (no joins, no dimension tables of its own) filled by [`scan_groups`] over
/// the same cache (`ops::ScanBuild`). Returns the pairs inserted and the scanning's time.
pub fn scan_build(
    ex: &mut dyn Executor,
    cache: &SegRef,
    groups: &SegRef,
    table: &SegRef,
    spec: &scan::Spec,
    key_col: u32,
    slot_count: u64,
) -> Result<(u64, std::time::Duration)> {
    let bytes = build_program_bytes(ex, spec, groups)?;
    let o = ops::ScanBuild { cache: *cache, table: *table, key_col, _pad: 0, slot_count };
    let (r, _) = call(ex, &o, Io::In(&bytes))?;
    Ok((r.inserted, std::time::Duration::from_nanos(r.scan_ns)))
}

/// A dimension's whole join table from its cache (`ops::ScanBuildTable`): [`build_begin`],
/// [`scan_build`] and [`build_finish`] in one request, the build required to insert `rows`
/// pairs (the rows its program counted). Returns the scanning's time.
#[allow(clippy::too_many_arguments)]
pub fn scan_build_table(
    ex: &mut dyn Executor,
    cache: &SegRef,
    groups: &SegRef,
    table: &SegRef,
    spec: &scan::Spec,
    key_col: u32,
    slot_count: u64,
    rows: u64,
) -> Result<std::time::Duration> {
    let bytes = build_program_bytes(ex, spec, groups)?;
    let o = ops::ScanBuildTable { cache: *cache, table: *table, key_col, _pad: 0, slot_count, rows };
    let (r, _) = call(ex, &o, Io::In(&bytes))?;
    Ok(std::time::Duration::from_nanos(r.scan_ns))
}

/// Moves the groups of the group table `from` into `to` (a segment of at least the bytes of a
/// table of `slot_count` slots), made a table of that many slots; returns the groups moved.
pub fn groups_grow(ex: &mut dyn Executor, from: &SegRef, to: &SegRef, slot_count: u64) -> Result<u64> {
    reply(ex, ops::GroupsGrow { from: *from, to: *to, slot_count }).map(|r| r.groups)
}

/// Makes `seg` an empty result buffer (a fresh header: no pair reserved or written).
pub fn pairs_reset(ex: &mut dyn Executor, seg: &SegRef) -> Result<()> {
    write(ex, seg, 0, &PairsHeader::new().as_bytes())
}

/// GB/s of a kernel reading all of the segment.
pub fn bench_segment_read(ex: &mut dyn Executor, seg: &SegRef, iterations: i32) -> Result<f64> {
    reply(ex, ops::BenchSegmentRead { seg: *seg, iterations: iterations.max(1) as u32, _pad: 0 }).map(|r| r.gbps)
}

pub fn bench_private_read(ex: &mut dyn Executor, bytes: i64, iterations: i32, seed: i64) -> Result<f64> {
    let o = ops::BenchPrivateRead { bytes: bytes.max(16), iterations: iterations.max(1) as u32, _pad: 0, seed };
    reply(ex, o).map(|r| r.gbps)
}

/// (host to device, device to host) GB/s of `cuMemcpy`.
pub fn bench_copy_ceiling(ex: &mut dyn Executor, bytes: i64, iterations: i32) -> Result<(f64, f64)> {
    let o = ops::BenchCopyCeiling { bytes: bytes.max(1), iterations: iterations.max(1) as u32, _pad: 0 };
    reply(ex, o).map(|r| (r.host_to_device, r.device_to_host))
}

pub fn bench_join_probe(ex: &mut dyn Executor, seg: &SegRef, keys: i64, key_range: i64) -> Result<f64> {
    reply(ex, ops::BenchJoinProbe { table: *seg, keys, key_range }).map(|r| r.keys_per_s)
}

pub fn bench_host_register(ex: &mut dyn Executor, bytes: i64) -> Result<f64> {
    reply(ex, ops::BenchHostRegister { bytes: bytes.max(1) }).map(|r| r.ms)
}

/// Starts a caller's kernel (see [`kernel::Launch`]): validated here, run where the executor
/// runs GPU work; [`Pending::wait`] gives its outcome.
pub fn launch_start(ex: &mut dyn Executor, launch: &kernel::Launch) -> Result<Pending<ops::Launched>> {
    launch.validate()?;
    let bytes = launch.encode();
    if bytes.len() > ex.max_io() {
        return Err(UvmError::new(
            Code::ProgramLimitExceeded,
            format!("a kernel launch of {} bytes exceeds what one request carries ({} bytes)", bytes.len(), ex.max_io()),
        )
        .hint("Shorten the kernel's source, or raise pg_uvm_share.service_staging."));
    }
    start(ex, &ops::LaunchKernel {}, &bytes)
}

/// GPU memory (free, total) as the executor's process sees it; (0, 0) without a GPU.
pub fn mem_info(ex: &mut dyn Executor) -> Result<(u64, u64)> {
    reply(ex, ops::MemInfo {}).map(|r| (r.free, r.total))
}

#[cfg(test)]
mod tests;
