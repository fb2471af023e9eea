//! The execution seam: one interface for every operation on segment memory, three ways to run
//! it.
//!
//! # Design
//!
//! Every operation the SQL layer performs on a segment's memory (create, grow, drop, migrate,
//! read, write, checksum, fill, the GpuJoin build, probe and materialize, the benchmarks) is a
//! [`Request`]: an operation, references to segments (name and id, resolved and authorized by
//! the caller) and scalars, with bulk input or output in a byte buffer ([`Io`]). An
//! [`Executor`] runs requests:
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
//! limit, whether a GPU does the work), builds requests with the typed helpers below and hands
//! them to whatever executor the runtime gives it.
//! The helpers split requests whose data exceeds what one request may carry
//! ([`Executor::max_io`]: a staging area in service mode, unbounded in process mode).
//!
//! This module and [`local`] do not call PostgreSQL; the segment manager reaches the registry
//! through its `Env`.

pub mod kernel;
pub mod local;
pub mod request;

use crate::error::{Code, Result, UvmError};
use crate::gpujoin::pairs::PairsHeader;
use crate::gpujoin::table::{self, KeyType};
use crate::registry::TierPref;
pub use request::{Mode, Op, Reply, Request, SegRef};

/// A request's bulk data: input it reads, output it writes, or none.
pub enum Io<'a> {
    None,
    In(&'a [u8]),
    Out(&'a mut [u8]),
}

/// Runs requests: in this process ([`local::Local`]) or in the GPU service.
pub trait Executor {
    fn mode(&self) -> Mode;
    /// The most bulk bytes one request may carry.
    fn max_io(&self) -> usize;
    /// Runs `req`; returns its values and the output bytes it wrote.
    fn run(&mut self, req: &Request, io: Io<'_>) -> Result<([i64; 6], u64)>;
    /// Starts `req` with `input` (at most `max_io` bytes, copied: the caller may reuse its
    /// buffer at once) and returns without waiting for it where the executor can (the
    /// service); the default runs it now.
    fn start(&mut self, req: &Request, input: &[u8]) -> Result<Pending> {
        Ok(Pending::Ready(self.run(req, Io::In(input))))
    }
}

/// A request in flight, waited for by [`Pending::wait`]. Dropping it unwaited gives the request
/// up (the service finishes or stops it, and only then reuses its slot).
pub trait InFlight {
    fn wait(self: Box<Self>) -> Result<([i64; 6], u64)>;
}

/// The result of [`Executor::start`]: there already, or to wait for.
pub enum Pending {
    Ready(Result<([i64; 6], u64)>),
    InFlight(Box<dyn InFlight>),
}

impl Pending {
    pub fn wait(self) -> Result<([i64; 6], u64)> {
        match self {
            Pending::Ready(r) => r,
            Pending::InFlight(f) => f.wait(),
        }
    }
}

fn with_seg(op: Op, seg: &SegRef) -> Request {
    let mut r = Request::new(op);
    r.segs[0] = *seg;
    r
}

/// Splits a sum carried as two words.
pub(crate) fn split_sum(sum: i128) -> (i64, i64) {
    (sum as i64, (sum >> 64) as i64)
}

fn sum_of(lo: i64, hi: i64) -> i128 {
    ((hi as i128) << 64) | (lo as u64 as i128)
}

/// Views `v` as bytes (keys and rows travel as little-endian words: every process of a cluster
/// runs on one machine).
fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: plain integer data, every byte initialised; the length is exact.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// An empty round trip.
pub fn ping(ex: &mut dyn Executor) -> Result<()> {
    ex.run(&Request::new(Op::Ping), Io::None).map(|_| ())
}

/// The executor's provider capabilities, as `uvm.device_info()` rows.
pub fn info(ex: &mut dyn Executor) -> Result<Vec<(String, String)>> {
    let mut buf = vec![0u8; ex.max_io().min(64 << 10)];
    let (_, n) = ex.run(&Request::new(Op::Info), Io::Out(&mut buf))?;
    let text = String::from_utf8_lossy(&buf[..(n as usize).min(buf.len())]).into_owned();
    Ok(text.lines().filter_map(|l| l.split_once('\t')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
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
    let mut r = Request::new(Op::Create);
    r.segs[0] = SegRef::new(name, 0)?;
    r.args = [size, max_size.unwrap_or(-1), max_size.is_some() as i64, pref.code() as i64, owner as i64, now, 0, 0];
    ex.run(&r, Io::None).map(|(v, _)| v[0] as u64)
}

pub fn grow(ex: &mut dyn Executor, seg: &SegRef, new_size: i64) -> Result<u64> {
    let mut r = with_seg(Op::Grow, seg);
    r.args[0] = new_size;
    ex.run(&r, Io::None).map(|(v, _)| v[0] as u64)
}

pub fn grow_at_least(ex: &mut dyn Executor, seg: &SegRef, min_size: u64) -> Result<u64> {
    let mut r = with_seg(Op::GrowAtLeast, seg);
    r.args[0] = min_size.min(i64::MAX as u64) as i64;
    ex.run(&r, Io::None).map(|(v, _)| v[0] as u64)
}

pub fn drop(ex: &mut dyn Executor, seg: &SegRef) -> Result<()> {
    ex.run(&with_seg(Op::Drop, seg), Io::None).map(|_| ())
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
    let mut r = with_seg(Op::Prefetch, seg);
    r.args[..4].copy_from_slice(&[offset, length, target.code() as i64, pin_wait_ms.min(i64::MAX as u64) as i64]);
    ex.run(&r, Io::None).map(|(v, _)| v[0] as u64)
}

/// Copies `[offset, offset + out.len())` of the segment into `out`.
pub fn read(ex: &mut dyn Executor, seg: &SegRef, offset: i64, out: &mut [u8]) -> Result<()> {
    if out.is_empty() {
        // Still validates the range (an offset past the end is an error).
        let mut r = with_seg(Op::Read, seg);
        r.args[..2].copy_from_slice(&[offset, 0]);
        return ex.run(&r, Io::Out(out)).map(|_| ());
    }
    let step = ex.max_io().max(1);
    for (i, part) in out.chunks_mut(step).enumerate() {
        let mut r = with_seg(Op::Read, seg);
        let at = offset.checked_add((i * step) as i64).ok_or_else(|| UvmError::new(Code::OutOfRange, "offset overflows"))?;
        r.args[..2].copy_from_slice(&[at, part.len() as i64]);
        ex.run(&r, Io::Out(part))?;
    }
    Ok(())
}

/// Copies `data` to `[offset, offset + data.len())` of the segment.
pub fn write(ex: &mut dyn Executor, seg: &SegRef, offset: i64, data: &[u8]) -> Result<()> {
    if data.is_empty() {
        let mut r = with_seg(Op::Write, seg);
        r.args[0] = offset;
        return ex.run(&r, Io::In(data)).map(|_| ());
    }
    let step = ex.max_io().max(1);
    for (i, part) in data.chunks(step).enumerate() {
        let mut r = with_seg(Op::Write, seg);
        let at = offset.checked_add((i * step) as i64).ok_or_else(|| UvmError::new(Code::OutOfRange, "offset overflows"))?;
        r.args[0] = at;
        r.input = part.len() as u64;
        ex.run(&r, Io::In(part))?;
    }
    Ok(())
}

pub fn checksum(ex: &mut dyn Executor, seg: &SegRef, offset: i64, length: i64) -> Result<u64> {
    let mut r = with_seg(Op::Checksum, seg);
    r.args[..2].copy_from_slice(&[offset, length]);
    ex.run(&r, Io::None).map(|(v, _)| v[0] as u64)
}

pub fn fill(ex: &mut dyn Executor, seg: &SegRef, offset: i64, length: i64, seed: i64) -> Result<()> {
    let mut r = with_seg(Op::Fill, seg);
    r.args[..3].copy_from_slice(&[offset, length, seed]);
    ex.run(&r, Io::None).map(|_| ())
}

fn key_code(kt: KeyType) -> i64 {
    match kt {
        KeyType::Int4 => 4,
        KeyType::Int8 => 8,
    }
}

pub(crate) fn key_type_of(code: i64) -> Result<KeyType> {
    match code {
        4 => Ok(KeyType::Int4),
        8 => Ok(KeyType::Int8),
        _ => Err(UvmError::new(Code::ProtocolViolation, format!("bad key type {code} in a request"))),
    }
}

/// Probes `keys` against the GpuJoin table in `inner`: (matches, payload sum).
pub fn probe(ex: &mut dyn Executor, inner: &SegRef, kt: KeyType, keys: &[i64]) -> Result<(u64, i128)> {
    let step = (ex.max_io() / 8).max(1);
    keys.chunks(step).try_fold((0u64, 0i128), |(m, s), part| {
        let mut r = with_seg(Op::Probe, inner);
        r.args[0] = key_code(kt);
        r.input = (part.len() * 8) as u64;
        let (v, _) = ex.run(&r, Io::In(as_bytes(part)))?;
        Ok((m + v[0] as u64, s + sum_of(v[1], v[2])))
    })
}

/// Starts probing `keys` (see [`Executor::start`]); [`probe_result`] reads the values. Keys
/// beyond one request's staging are probed at once, in pieces.
pub fn probe_start(ex: &mut dyn Executor, inner: &SegRef, kt: KeyType, keys: &[i64]) -> Result<Pending> {
    if keys.len() * 8 > ex.max_io() {
        let (m, sum) = probe(ex, inner, kt, keys)?;
        let (lo, hi) = split_sum(sum);
        return Ok(Pending::Ready(Ok(([m as i64, lo, hi, 0, 0, 0], 0))));
    }
    let mut r = with_seg(Op::Probe, inner);
    r.args[0] = key_code(kt);
    r.input = (keys.len() * 8) as u64;
    ex.start(&r, as_bytes(keys))
}

/// (matches, payload sum) of a finished probe request.
pub fn probe_result(v: [i64; 6]) -> (u64, i128) {
    (v[0] as u64, sum_of(v[1], v[2]))
}

/// Probes `keys` and appends every matched pair to the result buffer `result`.
pub fn materialize(ex: &mut dyn Executor, inner: &SegRef, result: &SegRef, kt: KeyType, keys: &[i64]) -> Result<(u64, i128)> {
    let step = (ex.max_io() / 8).max(1);
    keys.chunks(step).try_fold((0u64, 0i128), |(m, s), part| {
        let mut r = with_seg(Op::Materialize, inner);
        r.segs[1] = *result;
        r.args[0] = key_code(kt);
        r.input = (part.len() * 8) as u64;
        let (v, _) = ex.run(&r, Io::In(as_bytes(part)))?;
        Ok((m + v[0] as u64, s + sum_of(v[1], v[2])))
    })
}

/// Zeroes a table's header and `slot_count` slots (the start of a build).
pub fn build_begin(ex: &mut dyn Executor, seg: &SegRef, slot_count: u64) -> Result<()> {
    let mut r = with_seg(Op::BuildBegin, seg);
    r.args[0] = slot_count.min(i64::MAX as u64) as i64;
    ex.run(&r, Io::None).map(|_| ())
}

/// Inserts `rows` (key, payload; no NULL keys) into a table of `slot_count` slots.
pub fn build_insert(ex: &mut dyn Executor, seg: &SegRef, kt: KeyType, slot_count: u64, rows: &[[i64; 2]]) -> Result<()> {
    let step = (ex.max_io() / 16).max(1);
    for part in rows.chunks(step) {
        let mut r = with_seg(Op::BuildInsert, seg);
        r.args[..2].copy_from_slice(&[key_code(kt), slot_count.min(i64::MAX as u64) as i64]);
        r.input = (part.len() * 16) as u64;
        ex.run(&r, Io::In(as_bytes(part)))?;
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

/// Makes `seg` an empty result buffer (a fresh header: no pair reserved or written).
pub fn pairs_reset(ex: &mut dyn Executor, seg: &SegRef) -> Result<()> {
    write(ex, seg, 0, &PairsHeader::new().as_bytes())
}

/// GB/s of a kernel reading all of the segment.
pub fn bench_segment_read(ex: &mut dyn Executor, seg: &SegRef, iterations: i32) -> Result<f64> {
    let mut r = with_seg(Op::BenchSegmentRead, seg);
    r.args[0] = iterations.max(1) as i64;
    ex.run(&r, Io::None).map(|(v, _)| f64::from_bits(v[0] as u64))
}

pub fn bench_private_read(ex: &mut dyn Executor, bytes: i64, iterations: i32, seed: i64) -> Result<f64> {
    let mut r = Request::new(Op::BenchPrivateRead);
    r.args[..3].copy_from_slice(&[bytes.max(16), iterations.max(1) as i64, seed]);
    ex.run(&r, Io::None).map(|(v, _)| f64::from_bits(v[0] as u64))
}

/// (host to device, device to host) GB/s of `cuMemcpy`.
pub fn bench_copy_ceiling(ex: &mut dyn Executor, bytes: i64, iterations: i32) -> Result<(f64, f64)> {
    let mut r = Request::new(Op::BenchCopyCeiling);
    r.args[..2].copy_from_slice(&[bytes.max(1), iterations.max(1) as i64]);
    ex.run(&r, Io::None).map(|(v, _)| (f64::from_bits(v[0] as u64), f64::from_bits(v[1] as u64)))
}

pub fn bench_join_probe(ex: &mut dyn Executor, seg: &SegRef, keys: i64, key_range: i64) -> Result<f64> {
    let mut r = with_seg(Op::BenchJoinProbe, seg);
    r.args[..2].copy_from_slice(&[keys, key_range]);
    ex.run(&r, Io::None).map(|(v, _)| f64::from_bits(v[0] as u64))
}

pub fn bench_host_register(ex: &mut dyn Executor, bytes: i64) -> Result<f64> {
    let mut r = Request::new(Op::BenchHostRegister);
    r.args[0] = bytes.max(1);
    ex.run(&r, Io::None).map(|(v, _)| f64::from_bits(v[0] as u64))
}

/// Starts a caller's kernel (see [`kernel::Launch`]): validated here, run where the executor
/// runs GPU work; [`Pending::wait`] gives its outcome.
pub fn launch_start(ex: &mut dyn Executor, launch: &kernel::Launch) -> Result<Pending> {
    launch.validate()?;
    let bytes = launch.encode();
    if bytes.len() > ex.max_io() {
        return Err(UvmError::new(
            Code::ProgramLimitExceeded,
            format!("a kernel launch of {} bytes exceeds what one request carries ({} bytes)", bytes.len(), ex.max_io()),
        )
        .hint("Shorten the kernel's source, or raise pg_uvm_share.service_staging."));
    }
    let mut r = Request::new(Op::Launch);
    r.input = bytes.len() as u64;
    ex.start(&r, &bytes)
}

/// GPU memory (free, total) as the executor's process sees it; (0, 0) without a GPU.
pub fn mem_info(ex: &mut dyn Executor) -> Result<(u64, u64)> {
    ex.run(&Request::new(Op::MemInfo), Io::None).map(|(v, _)| (v[0] as u64, v[1] as u64))
}

#[cfg(test)]
mod tests;
