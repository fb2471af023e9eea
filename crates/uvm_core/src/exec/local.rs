//! Running requests on this process's own mappings: the code both execution modes share.
//!
//! A request is run in two or three steps, so that the GPU service can spread them over its
//! threads:
//!
//! 1. [`prepare`] (needs the segment manager, hence the registry lock: the service's main
//!    thread) pins the segments the request ([`Call`], decoded from its slot form) names,
//!    checks that the names still denote the ids the client resolved, and turns the request
//!    into [`Work`]: plain data (addresses inside the pins, lengths, the engine), which may
//!    cross to another thread.
//! 2. [`Work::run`] (no lock, no PostgreSQL: any thread) does the work on the CPU or with CUDA.
//! 3. Dropping the [`Job`] (main thread again) gives the pins back.
//!
//! Operations that change the registry, or need the manager throughout (create, grow, drop,
//! migrate, materialize with its grow-and-resume protocol), run whole in [`run_main`].
//! In process mode [`Local`] does all steps in a row, on the caller's thread.

use crate::error::{Code, Result};
use crate::gpujoin::gpu::{JoinKernels, KernelAppender};
use crate::gpujoin::pairs::{self, Appender, CpuAppender, Inner, RawInner, Step, Target};
use crate::gpujoin::table::{self, KeyType};
use crate::provider::{Provider, ProviderKind};
use crate::registry::TierPref;
use crate::segment::{Env, Pin, Segments};
use crate::uvm_err;

mod programs;

use super::kernel::{Arg, Launch};
use super::request::{self as ops, Call, Done, Sum128};
use super::{key_type_of, Executor, Io, Mode, Request, SegRef};

/// Where the work runs: the CPU (host provider), or CUDA kernels (CUDA provider). Chosen from
/// the provider, once: nothing above this module asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Cpu,
    Cuda,
}

impl Engine {
    pub fn of(p: &dyn Provider) -> Engine {
        match p.kind() {
            ProviderKind::Host => Engine::Cpu,
            ProviderKind::Cuda => Engine::Cuda,
        }
    }
}

/// A copy piece: address in the segment, length, whether the CPU addresses it directly.
type Piece = (u64, usize, bool);

/// What a request does once its segments are pinned: plain data, valid while the pins of its
/// [`Job`] are held.
#[derive(Debug)]
pub enum Work {
    Ping,
    Checksum {
        addr: u64,
        len: u64,
        engine: Engine,
    },
    Fill {
        addr: u64,
        len: u64,
        seed: u64,
        engine: Engine,
    },
    Read {
        pieces: Vec<Piece>,
    },
    Write {
        pieces: Vec<Piece>,
    },
    Probe {
        inner: RawInner,
        engine: Engine,
    },
    /// The result buffer's header at `base` and the pairs mapped after it (`cap`).
    MaterializeWithin {
        inner: RawInner,
        base: u64,
        cap: u64,
        indexed: bool,
        index_base: u64,
        fresh: bool,
        engine: Engine,
    },
    BuildBegin {
        addr: u64,
        len: u64,
        engine: Engine,
    },
    BuildInsert {
        name: String,
        table: u64,
        table_len: usize,
        slot_count: u64,
        key_type: KeyType,
        engine: Engine,
    },
    /// A table built from a column cache's columns (`super::cached`).
    CacheBuild {
        target: super::cached::BuildTarget,
        source: super::cached::CacheSource,
        key_col: u32,
        payload_col: u32,
    },
    /// A column cache's keys probed against a table (`super::cached`).
    CacheProbe {
        inner: RawInner,
        key_type: KeyType,
        source: super::cached::CacheSource,
        key_col: u32,
    },
    /// A scan program's request (`programs`).
    Program(programs::ProgramWork),
    BenchSegmentRead {
        addr: u64,
        len: u64,
        iterations: u32,
    },
    BenchPrivateRead {
        bytes: u64,
        iterations: u32,
        seed: u64,
    },
    BenchCopyCeiling {
        bytes: u64,
        iterations: u32,
    },
    BenchJoinProbe {
        inner: RawInner,
        keys: i64,
        key_range: i64,
    },
    BenchHostRegister {
        bytes: u64,
    },
    MemInfo {
        engine: Engine,
    },
    /// A caller's kernel with its parameters as words (segment references already turned into
    /// addresses inside the job's pins).
    Launch {
        source: crate::gpu::user::Source,
        shape: crate::gpu::user::Shape,
        params: Vec<u64>,
    },
}

/// A prepared request: its pins (released when the job drops) and its work.
pub struct Job<E: Env> {
    pub pins: Vec<Pin<E>>,
    pub work: Work,
}

/// Pins `seg` by name and checks it is still the segment the client resolved (authorization
/// was the client's, against that segment's owner).
fn pin_ref<E: Env>(segs: &mut Segments<E>, seg: &SegRef) -> Result<Pin<E>> {
    let pin = segs.pin(seg.name(), |_| Ok(()))?;
    check_id(pin.info().id, seg)?;
    Ok(pin)
}

fn check_id(id: u64, seg: &SegRef) -> Result<()> {
    if seg.id != 0 && id != seg.id {
        return Err(uvm_err!(Code::UndefinedObject, "segment \"{}\" was dropped while the request waited", seg.name())
            .detail("A segment of that name exists, but it is another one."));
    }
    Ok(())
}

fn cuda_only(engine: Engine) -> Result<()> {
    match engine {
        Engine::Cuda => Ok(()),
        Engine::Cpu => Err(crate::gpu::bench::needs_cuda()),
    }
}

/// The address of `[offset, offset + len)` of a pinned segment for `engine`: the CPU needs
/// every byte addressable (`bytes` checks the tiers); kernels do not. A `cpu` segment is
/// refused for both (`Pin::addr`): the CPU engine does what the kernels do, so CI sees the
/// GPU's refusals.
fn engine_addr<E: Env>(pin: &Pin<E>, engine: Engine, offset: i64, len: i64) -> Result<u64> {
    let addr = pin.addr(offset, len)?;
    match engine {
        Engine::Cpu => Ok(pin.bytes(offset, len)?.as_ptr() as u64),
        Engine::Cuda => Ok(addr),
    }
}

/// Where a checksum or a fill of `[offset, offset + len)` of `pin` runs, and at what address: on
/// `engine`, except that a `cpu` segment's bytes are always the CPU's (no kernel may read them).
fn bytes_addr<E: Env>(pin: &Pin<E>, engine: Engine, offset: i64, len: i64) -> Result<(u64, Engine)> {
    if pin.info().tier_pref.cpu_only() {
        return Ok((pin.bytes(offset, len)?.as_ptr() as u64, Engine::Cpu));
    }
    Ok((engine_addr(pin, engine, offset, len)?, engine))
}

/// Pins a GpuJoin table of `slot_count` slots for a build: its header and slots' address.
fn table_for_build<E: Env>(segs: &mut Segments<E>, seg: &SegRef, slot_count: u64, engine: Engine) -> Result<(Pin<E>, u64, u64)> {
    let pin = pin_ref(segs, seg)?;
    if !slot_count.is_power_of_two() {
        return Err(uvm_err!(Code::InvalidParameterValue, "a hash table needs a power-of-two slot count, not {slot_count}"));
    }
    let len = slot_count
        .checked_mul(table::SLOT_BYTES)
        .and_then(|b| b.checked_add(table::HEADER_BYTES))
        .filter(|&b| b <= pin.info().size)
        .ok_or_else(|| uvm_err!(Code::ProgramLimitExceeded, "segment \"{}\" cannot hold {slot_count} slots", pin.info().name))?;
    let addr = engine_addr(&pin, engine, 0, len as i64)?;
    Ok((pin, addr, len))
}

/// Pins what `call` names and describes its work (any operation [`run_main`] does not run).
/// `io` is the request's bulk data, read only by operations that describe their work there.
pub fn prepare<E: Env>(segs: &mut Segments<E>, call: &Call, io: &Io<'_>) -> Result<Job<E>> {
    let engine = Engine::of(segs.provider());
    let mut pins = Vec::new();
    let work = match *call {
        Call::Ping(_) => Work::Ping,
        Call::Checksum(ops::Checksum { seg, offset, length }) => {
            let pin = pin_ref(segs, &seg)?;
            let (addr, engine) = bytes_addr(&pin, engine, offset, length)?;
            pin.count_read(length as u64);
            pins.push(pin);
            Work::Checksum { addr, len: length as u64, engine }
        }
        Call::Fill(ops::Fill { seg, offset, length, seed }) => {
            let pin = pin_ref(segs, &seg)?;
            let (addr, engine) = bytes_addr(&pin, engine, offset, length)?;
            pin.count_written(length as u64);
            pins.push(pin);
            Work::Fill { addr, len: length as u64, seed: seed as u64, engine }
        }
        Call::Read(ops::ReadBytes { seg, offset, length }) => {
            let pin = pin_ref(segs, &seg)?;
            let pieces = pin.pieces_at(offset, length)?;
            pin.count_read(length as u64);
            pins.push(pin);
            Work::Read { pieces }
        }
        Call::Write(ops::WriteBytes { seg, offset }) => {
            let pin = pin_ref(segs, &seg)?;
            let len = io.input().len().min(i64::MAX as usize) as i64;
            let pieces = pin.pieces_at(offset, len)?;
            pin.count_written(len as u64);
            pins.push(pin);
            Work::Write { pieces }
        }
        Call::Probe(ops::Probe { inner, key_type, .. }) => {
            let pin = pin_ref(segs, &inner)?;
            let inner = Inner::of(&pin, key_type_of(key_type)?, engine == Engine::Cpu)?.raw();
            pins.push(pin);
            Work::Probe { inner, engine }
        }
        Call::MaterializeWithin(ops::MaterializeWithin { inner, result, key_type, indexed, index_base, fresh, .. }) => {
            let cpu = engine == Engine::Cpu;
            let inner_pin = pin_ref(segs, &inner)?;
            let inner = Inner::of(&inner_pin, key_type_of(key_type)?, cpu)?.raw();
            let result_pin = pin_ref(segs, &result)?;
            // A fresh batch's header is written by the work before the kernel reads it.
            let target = if fresh != 0 { Target::to_reset(&result_pin, cpu) } else { Target::of(&result_pin, cpu) };
            let (base, cap) = target.map(|t| (t.base(), t.cap()))?;
            pins.push(inner_pin);
            pins.push(result_pin);
            Work::MaterializeWithin { inner, base, cap, indexed: indexed != 0, index_base, fresh: fresh != 0, engine }
        }
        Call::BuildBegin(ops::BuildBegin { table, slot_count }) => {
            let (pin, addr, len) = table_for_build(segs, &table, slot_count, engine)?;
            pins.push(pin);
            Work::BuildBegin { addr, len, engine }
        }
        Call::BuildInsert(ops::BuildInsert { table, key_type, slot_count, .. }) => {
            let key_type = key_type_of(key_type)?;
            let (pin, addr, len) = table_for_build(segs, &table, slot_count, engine)?;
            let name = pin.info().name.clone();
            pins.push(pin);
            Work::BuildInsert { name, table: addr, table_len: len as usize, slot_count, key_type, engine }
        }
        Call::CacheBuild(ops::CacheBuild { table, cache, key_type, key_col, payload_col, slot_count, .. }) => {
            let key_type = key_type_of(key_type)?;
            let (pin, addr, len) = table_for_build(segs, &table, slot_count, engine)?;
            let name = pin.info().name.clone();
            pins.push(pin);
            let cache_pin = pin_ref(segs, &cache)?;
            let source = super::cached::CacheSource::of(&cache_pin, engine)?;
            pins.push(cache_pin);
            let target = super::cached::BuildTarget { name, addr, len: len as usize, slot_count, key_type };
            Work::CacheBuild { target, source, key_col, payload_col }
        }
        Call::CacheProbe(ops::CacheProbe { inner, cache, key_type, key_col }) => {
            let key_type = key_type_of(key_type)?;
            let pin = pin_ref(segs, &inner)?;
            let inner = Inner::of(&pin, key_type, engine == Engine::Cpu)?.raw();
            pins.push(pin);
            let cache_pin = pin_ref(segs, &cache)?;
            let source = super::cached::CacheSource::of(&cache_pin, engine)?;
            pins.push(cache_pin);
            Work::CacheProbe { inner, key_type, source, key_col }
        }
        Call::ScanGroups(_) | Call::ScanBuild(_) | Call::ScanBuildTable(_) | Call::GroupsGrow(_) => {
            Work::Program(programs::prepare(segs, call, io, engine, &mut pins)?)
        }
        Call::BenchSegmentRead(ops::BenchSegmentRead { seg, iterations, .. }) => {
            cuda_only(engine)?;
            let pin = pin_ref(segs, &seg)?;
            let len = pin.info().size;
            let addr = pin.addr(0, len as i64)?;
            pins.push(pin);
            Work::BenchSegmentRead { addr, len, iterations: iterations.max(1) }
        }
        Call::BenchPrivateRead(ops::BenchPrivateRead { bytes, iterations, seed, .. }) => {
            cuda_only(engine)?;
            Work::BenchPrivateRead { bytes: bytes.max(16) as u64, iterations: iterations.max(1), seed: seed as u64 }
        }
        Call::BenchCopyCeiling(ops::BenchCopyCeiling { bytes, iterations, .. }) => {
            cuda_only(engine)?;
            Work::BenchCopyCeiling { bytes: bytes.max(1) as u64, iterations: iterations.max(1) }
        }
        Call::BenchJoinProbe(ops::BenchJoinProbe { table, keys, key_range }) => {
            cuda_only(engine)?;
            let pin = pin_ref(segs, &table)?;
            let inner = Inner::of(&pin, KeyType::Int8, false)?.raw();
            pins.push(pin);
            Work::BenchJoinProbe { inner, keys, key_range }
        }
        Call::BenchHostRegister(ops::BenchHostRegister { bytes }) => {
            cuda_only(engine)?;
            Work::BenchHostRegister { bytes: bytes.max(1) as u64 }
        }
        Call::MemInfo(_) => Work::MemInfo { engine },
        Call::Launch(_) => {
            let launch = Launch::decode(io.input())?;
            if engine == Engine::Cpu {
                return Err(crate::gpu::user::needs_cuda());
            }
            // One pin per segment reference, in order; the addresses lie inside them.
            for seg in &launch.segs {
                pins.push(pin_ref(segs, seg)?);
            }
            let params = launch
                .args
                .iter()
                .map(|a| match *a {
                    Arg::Scalar { bits, .. } => Ok(bits),
                    Arg::Segment { seg, offset } => pins[seg].addr(offset, 0),
                })
                .collect::<Result<Vec<u64>>>()?;
            Work::Launch { source: launch.source, shape: launch.shape, params }
        }
        Call::Info(_)
        | Call::Create(_)
        | Call::CreateWith(_)
        | Call::Grow(_)
        | Call::Drop(_)
        | Call::DropSegments(_)
        | Call::Prefetch(_)
        | Call::GrowAtLeast(_)
        | Call::Materialize(_) => {
            return Err(uvm_err!(Code::SystemError, "operation {:?} is not prepared: it runs whole", call.op()))
        }
    };
    Ok(Job { pins, work })
}

/// Views input bytes as words (staging areas and vectors of words are aligned; anything else
/// is refused, not copied).
fn words<'a, T: zerocopy::FromBytes + zerocopy::Immutable>(b: &'a [u8], what: &str) -> Result<&'a [T]> {
    <[T] as zerocopy::FromBytes>::ref_from_bytes(b)
        .map_err(|_| uvm_err!(Code::ProtocolViolation, "{what} in a request are misaligned or cut"))
}

impl Work {
    /// Does the work (no lock, no PostgreSQL). Returns the reply.
    ///
    /// # Safety
    /// The pins of the job this work came from must be held (and this process's mappings of
    /// them intact) until it returns.
    pub unsafe fn run(&self, mut io: Io<'_>) -> Result<Done> {
        let done = |r: &dyn DoneOf| Ok(r.done(0));
        match self {
            Work::Ping => done(&ops::Pong {}),
            &Work::Checksum { addr, len, engine } => {
                let checksum = match engine {
                    Engine::Cpu => {
                        // SAFETY: pinned, CPU-addressable (prepare checked), mapped (contract).
                        let b = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
                        crate::checksum::checksum_interruptible(b)?
                    }
                    // SAFETY: the pinned range (contract).
                    Engine::Cuda => crate::gpu::gpu()?.with_kernels(|k| unsafe { k.checksum(addr, len) })?,
                };
                done(&ops::Summed { checksum })
            }
            &Work::Fill { addr, len, seed, engine } => {
                match engine {
                    Engine::Cpu => {
                        // SAFETY: as for Checksum; writes to shared memory are the users' business.
                        let b = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) };
                        crate::checksum::fill_interruptible(b, seed)?;
                    }
                    // SAFETY: the pinned range (contract).
                    Engine::Cuda => crate::gpu::gpu()?.with_kernels(|k| unsafe { k.fill(addr, len, seed) })?,
                }
                done(&ops::Filled {})
            }
            Work::Read { pieces } => {
                let Io::Out(buf) = &mut io else { return Err(uvm_err!(Code::SystemError, "a read request without a buffer")) };
                let total: usize = pieces.iter().map(|p| p.1).sum();
                if total > buf.len() {
                    return Err(uvm_err!(
                        Code::ProgramLimitExceeded,
                        "a read of {total} bytes exceeds the request's {} bytes",
                        buf.len()
                    ));
                }
                let mut at = 0usize;
                for &(addr, n, cpu) in pieces {
                    crate::interrupt::check()?;
                    let dst = &mut buf[at..at + n];
                    // SAFETY: [addr, addr + n) lies in one pinned chunk (contract); dst is ours.
                    unsafe {
                        if cpu {
                            std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), n);
                        } else {
                            crate::gpu::gpu()?;
                            crate::gpu::copy(dst.as_mut_ptr() as u64, addr, n)?;
                        }
                    }
                    at += n;
                }
                Ok(ops::ReadDone {}.done(at as u64))
            }
            Work::Write { pieces } => {
                let src = io.input();
                let mut at = 0usize;
                for &(addr, n, cpu) in pieces {
                    crate::interrupt::check()?;
                    let s = src
                        .get(at..at + n)
                        .ok_or_else(|| uvm_err!(Code::ProtocolViolation, "a write request lacks its bytes"))?;
                    // SAFETY: as for Read, the other way.
                    unsafe {
                        if cpu {
                            std::ptr::copy_nonoverlapping(s.as_ptr(), addr as *mut u8, n);
                        } else {
                            crate::gpu::gpu()?;
                            crate::gpu::copy(addr, s.as_ptr() as u64, n)?;
                        }
                    }
                    at += n;
                }
                done(&ops::Written {})
            }
            Work::Probe { inner, engine } => {
                let keys: &[i64] = words(io.input(), "probe keys")?;
                // SAFETY: the pin behind `inner` is held (contract).
                let view = unsafe { inner.inner() }?;
                let (matches, sum) = match (engine, view.table()) {
                    (Engine::Cpu, Some(t)) => t.probe(keys)?,
                    _ => crate::gpu::gpu()?.with_kernels(|k| k.join_probe(&view, keys))?,
                };
                done(&ops::Probed { matches, sum: Sum128::from(sum) })
            }
            &Work::MaterializeWithin { ref inner, base, cap, indexed, index_base, fresh, engine } => {
                let keys: &[i64] = words(io.input(), "probe keys")?;
                // The header: `HEADER_BYTES` at `base`, in the result's pinned first chunk
                // (`Target::of` checked it); the CPU's to address under the CPU engine, else
                // copied by the driver (device or host tier alike).
                let header = |out: Option<&mut [u8; pairs::HEADER_BYTES as usize]>| -> Result<()> {
                    let fresh_bytes = pairs::PairsHeader::new().as_bytes();
                    if engine == Engine::Cuda {
                        crate::gpu::gpu()?; // the context current on this thread
                    }
                    // SAFETY: `base` is the header of the pinned result buffer (above), 8-byte
                    // aligned and mapped for HEADER_BYTES; each copy is of those bytes, to or
                    // from a local array of that length.
                    unsafe {
                        match (out, engine) {
                            (None, Engine::Cpu) => {
                                std::ptr::copy_nonoverlapping(fresh_bytes.as_ptr(), base as *mut u8, fresh_bytes.len())
                            }
                            (None, Engine::Cuda) => crate::gpu::copy(base, fresh_bytes.as_ptr() as u64, fresh_bytes.len())?,
                            (Some(o), Engine::Cpu) => std::ptr::copy_nonoverlapping(base as *const u8, o.as_mut_ptr(), o.len()),
                            (Some(o), Engine::Cuda) => crate::gpu::copy(o.as_mut_ptr() as u64, base, o.len())?,
                        }
                    }
                    Ok(())
                };
                if fresh {
                    header(None)?;
                }
                // SAFETY: the pins behind `inner` and the result buffer are held (contract), and
                // `base`, `cap` are what `Target::of` (or `to_reset`) found in the result's pin.
                let (view, target) = unsafe { (inner.inner()?, Target::from_raw(base, cap)) };
                let (step, matches, sum) = match engine {
                    Engine::Cpu => {
                        let mut ap = CpuAppender::new(keys).indexed(indexed, index_base);
                        (ap.run(&view, target)?, ap.matches, ap.sum)
                    }
                    Engine::Cuda => crate::gpu::gpu()?.with_kernels(|k| {
                        let mut ap = KernelAppender::new(k, keys).indexed(indexed, index_base);
                        Ok((ap.run(&view, target)?, ap.matches, ap.sum))
                    })?,
                };
                let need = match step {
                    Step::Done => 0,
                    Step::Need(pairs) => pairs.max(1),
                };
                let (matches, sum) = if need == 0 { (matches, sum) } else { (0, 0) };
                let mut raw = [0u8; pairs::HEADER_BYTES as usize];
                header(Some(&mut raw))?;
                let counter = |at: u64| u64::from_ne_bytes(raw[at as usize..at as usize + 8].try_into().expect("8 bytes"));
                let (next, written) = (counter(pairs::NEXT_AT), counter(pairs::WRITTEN_AT));
                done(&ops::MaterializedWithin { matches, sum: Sum128::from(sum), need, next, written })
            }
            &Work::BuildBegin { addr, len, engine } => {
                match engine {
                    Engine::Cpu => {
                        // SAFETY: pinned, CPU-addressable (prepare checked), mapped (contract).
                        let b = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) };
                        for part in b.chunks_mut(1 << 20) {
                            part.fill(0);
                            crate::interrupt::check()?;
                        }
                    }
                    // SAFETY: the pinned range, 8-byte aligned (a segment starts on a page).
                    Engine::Cuda => crate::gpu::gpu()?.with_kernels(|k| unsafe { k.zero(addr, len / 8) })?,
                }
                done(&ops::Begun {})
            }
            Work::BuildInsert { name, table, table_len, slot_count, key_type, engine } => {
                let rows: &[[i64; 2]] = words(io.input(), "build rows")?;
                match engine {
                    Engine::Cpu => {
                        // SAFETY: pinned, CPU-addressable (prepare checked), mapped (contract).
                        let b = unsafe { std::slice::from_raw_parts_mut(*table as *mut u8, *table_len) };
                        let mut builder = table::Builder::resume(name, b, *key_type, *slot_count, 0)?;
                        for &[k, p] in rows {
                            builder.insert(Some(k), p)?;
                        }
                    }
                    Engine::Cuda => {
                        let (keys, payloads): (Vec<i64>, Vec<i64>) = rows.iter().map(|r| (r[0], r[1])).unzip();
                        let slots = *table + table::HEADER_BYTES;
                        // SAFETY: the pinned table's slots (prepare bounded them), slot_count a
                        // power of two.
                        let left_out = crate::gpu::gpu()?
                            .with_kernels(|k| unsafe { k.join_build(slots, slot_count - 1, 0, &keys, &payloads) })?;
                        if left_out > 0 {
                            return Err(table::corrupted(name, &format!("a build found no empty slot in {slot_count} slots")));
                        }
                    }
                }
                done(&ops::Inserted {})
            }
            Work::CacheBuild { target, source, key_col, payload_col } => {
                // SAFETY: the job's pins (contract) hold the table and the cache.
                done(&unsafe { super::cached::build(target, source, *key_col, *payload_col) }?)
            }
            Work::CacheProbe { inner, key_type, source, key_col } => {
                // SAFETY: as above.
                done(&unsafe { super::cached::probe(inner, *key_type, source, *key_col) }?)
            }
            // SAFETY: forwarded contract.
            Work::Program(w) => unsafe { w.run() },
            &Work::BenchSegmentRead { addr, len, iterations } => {
                // SAFETY: the whole pinned segment (contract).
                let gbps = crate::gpu::gpu()?.with_kernels(|k| unsafe { k.read_bandwidth(addr, len, iterations) })?;
                done(&ops::SegmentReadRate { gbps })
            }
            &Work::BenchPrivateRead { bytes, iterations, seed } => {
                done(&ops::PrivateReadRate { gbps: crate::gpu::bench::private_read(bytes, iterations, seed)? })
            }
            &Work::BenchCopyCeiling { bytes, iterations } => {
                let (host_to_device, device_to_host) = crate::gpu::bench::copy_ceiling(bytes, iterations)?;
                done(&ops::CopyRates { host_to_device, device_to_host })
            }
            Work::BenchJoinProbe { inner, keys, key_range } => {
                // SAFETY: the pin behind `inner` is held (contract).
                let view = unsafe { inner.inner() }?;
                done(&ops::ProbeRate { keys_per_s: crate::gpujoin::gpu::join_probe_view(&view, *keys, *key_range)? })
            }
            &Work::BenchHostRegister { bytes } => done(&ops::RegisterTime { ms: crate::gpu::bench::host_register_ms(bytes)? }),
            Work::Launch { source, shape, params } => {
                // SAFETY: the segment addresses lie in the job's pins (contract); the kernel is
                // the caller's, who vouches for it (the C API's contract).
                unsafe { crate::gpu::user::launch(source, *shape, params) }?;
                done(&ops::Launched {})
            }
            &Work::MemInfo { engine } => {
                let (free, total) = match engine {
                    Engine::Cuda => crate::gpu::gpu()?.mem_info()?,
                    Engine::Cpu => (0, 0),
                };
                done(&ops::GpuMemory { free, total })
            }
        }
    }
}

/// A reply of any operation, as its slot form (lets one closure answer every arm above).
pub(crate) trait DoneOf {
    fn done(&self, output: u64) -> Done;
}

impl<R: zerocopy::IntoBytes + zerocopy::Immutable> DoneOf for R {
    fn done(&self, output: u64) -> Done {
        Done::of(self, output)
    }
}

/// The provider's `uvm.device_info()` rows (and the manager's last migration) as
/// `key\tvalue` lines.
fn info_text<E: Env>(segs: &Segments<E>) -> String {
    let p = segs.provider();
    let caps = p.capabilities();
    let mut rows = vec![
        ("provider".to_string(), p.kind().name().to_string()),
        ("tiers".into(), caps.tiers.iter().map(|t| t.name()).collect::<Vec<_>>().join(",")),
        ("granularity".into(), caps.granularity.to_string()),
        ("gpu_kernels".into(), caps.gpu_kernels.to_string()),
    ];
    rows.extend(caps.details);
    if let Some(m) = segs.last_migration {
        rows.push(("last_migration_bytes".into(), m.bytes.to_string()));
        rows.push(("last_migration_chunks".into(), m.chunks.to_string()));
        rows.push(("last_migration_kept_copies".into(), m.kept_copies.to_string()));
        let phases = [
            ("wait", m.wait_ms),
            ("map", m.map_ms),
            ("alloc", m.alloc_ms),
            ("copy", m.copy_ms),
            ("copy_map", m.copy_map_ms),
            ("swap", m.swap_ms),
            ("release", m.release_ms),
            ("other", m.other_ms),
        ];
        for (k, v) in phases {
            rows.push((format!("last_migration_{k}_ms"), format!("{v:.3}")));
        }
    }
    rows.iter().map(|(k, v)| format!("{k}\t{}\n", v.replace(['\t', '\n'], " "))).collect()
}

/// Runs an operation that needs the segment manager throughout (see the module documentation),
/// or prepares and runs any other.
pub fn run_main<E: Env>(segs: &mut Segments<E>, call: &Call, mut io: Io<'_>) -> Result<Done> {
    let done = |r: &dyn DoneOf| Ok(r.done(0));
    let checked = |segs: &mut Segments<E>, seg: &SegRef| check_id(segs.lookup(seg.name())?.id, seg);
    match *call {
        Call::Info(_) => {
            let text = info_text(segs);
            let Io::Out(buf) = &mut io else { return Err(uvm_err!(Code::SystemError, "an info request without a buffer")) };
            let n = text.len().min(buf.len());
            buf[..n].copy_from_slice(&text.as_bytes()[..n]);
            Ok(ops::InfoText {}.done(n as u64))
        }
        Call::Create(ops::Create { seg, size, max_size, has_max_size, pref, owner, now, .. }) => {
            let max_size = (has_max_size != 0).then_some(max_size);
            // A code that names nothing reads as `auto` (requests come from this cluster's own
            // backends, but the slot is shared memory).
            let id = segs.create(seg.name(), size, max_size, TierPref::from_code(pref), owner, now)?;
            done(&ops::Created { id })
        }
        Call::CreateWith(ops::CreateWith { seg, size, max_size, has_max_size, pref, owner, now, .. }) => {
            let max_size = (has_max_size != 0).then_some(max_size);
            let id = segs.create(seg.name(), size, max_size, TierPref::from_code(pref), owner, now)?;
            // The bytes written as a Write request writes them, here on the main thread (the
            // client sends only what fits its staging in one request).
            let write = |segs: &mut Segments<E>, io: Io<'_>| {
                let job = prepare(segs, &Call::Write(ops::WriteBytes { seg: SegRef::new(seg.name(), id)?, offset: 0 }), &io)?;
                // SAFETY: the job's pins live until after the work returns.
                unsafe { job.work.run(io) }
            };
            if let Err(e) = write(segs, io) {
                // (nobody else knows the id yet; a name taken over meanwhile is not ours)
                if segs.lookup(seg.name()).map(|i| i.id == id).unwrap_or(false) {
                    let _ = segs.drop_segment(seg.name(), |_| Ok(()));
                }
                return Err(e);
            }
            done(&ops::CreatedWith { id })
        }
        Call::DropSegments(_) => {
            let input = io.input();
            let each = std::mem::size_of::<SegRef>();
            if !input.len().is_multiple_of(each) {
                return Err(uvm_err!(Code::ProtocolViolation, "a drop request of {} bytes names no whole segments", input.len()));
            }
            let mut dropped = 0u64;
            for part in input.chunks_exact(each) {
                let seg = <SegRef as zerocopy::FromBytes>::read_from_bytes(part)
                    .map_err(|_| uvm_err!(Code::ProtocolViolation, "a drop request's segment is unreadable"))?;
                checked(segs, &seg)?;
                segs.drop_segment(seg.name(), |_| Ok(()))?;
                dropped += 1;
            }
            done(&ops::DroppedSegments { dropped })
        }
        Call::Grow(ops::Grow { seg, new_size }) => {
            checked(segs, &seg)?;
            done(&ops::Grown { size: segs.grow(seg.name(), new_size, |_| Ok(()))? })
        }
        Call::GrowAtLeast(ops::GrowAtLeast { seg, min_size }) => {
            checked(segs, &seg)?;
            done(&ops::GrownTo { size: segs.grow_at_least(seg.name(), min_size, |_| Ok(()))? })
        }
        Call::Drop(ops::DropSegment { seg }) => {
            checked(segs, &seg)?;
            segs.drop_segment(seg.name(), |_| Ok(()))?;
            done(&ops::Dropped {})
        }
        Call::Prefetch(ops::Prefetch { seg, offset, length, target, pin_wait_ms, .. }) => {
            checked(segs, &seg)?;
            // Unknown codes read as `auto`, which prefetch refuses (22023).
            let target = TierPref::from_code(target);
            let saved = segs.limits.pin_wait;
            segs.limits.pin_wait = std::time::Duration::from_millis(pin_wait_ms);
            let r = segs.prefetch(seg.name(), offset, length, target, |_| Ok(()));
            segs.limits.pin_wait = saved;
            done(&ops::Moved { bytes: r? })
        }
        Call::Materialize(ops::Materialize { inner, result, key_type, indexed, index_base }) => {
            checked(segs, &inner)?;
            checked(segs, &result)?;
            let keys: &[i64] = words(io.input(), "probe keys")?;
            let kt = key_type_of(key_type)?;
            let allow = |_: u32, _: &str, _: &str| Ok(());
            let (matches, sum) = match Engine::of(segs.provider()) {
                Engine::Cpu => {
                    let mut ap = CpuAppender::new(keys).indexed(indexed != 0, index_base);
                    pairs::append_batch(segs, inner.name(), result.name(), kt, &allow, &mut ap)?;
                    (ap.matches, ap.sum)
                }
                Engine::Cuda => crate::gpu::gpu()?.with_kernels(|k| {
                    let mut ap = KernelAppender::new(k, keys).indexed(indexed != 0, index_base);
                    pairs::append_batch(segs, inner.name(), result.name(), kt, &allow, &mut ap)?;
                    Ok((ap.matches, ap.sum))
                })?,
            };
            done(&ops::Materialized { matches, sum: Sum128::from(sum) })
        }
        _ => {
            let job = prepare(segs, call, &io)?;
            // SAFETY: the job's pins live until after the work returns.
            unsafe { job.work.run(io) }
        }
    }
}

/// In a client process of the GPU service: runs a read, write, checksum or fill here, on this
/// process's own mappings, when every byte it touches lies in a chunk this process maps (a `cpu`
/// segment's, and the host tier where its chunks are memfds: `crate::provider::remote`). `None` (nothing done, no
/// pin kept) for bytes elsewhere and for every other operation: the service runs those.
///
/// The pin taken here is a pin like the service's: it waits behind a migration that waits, and
/// holds off migrations while the bytes are copied, so what runs here sees the same chunks the
/// service would. Its bytes are counted in the segment's statistics, not as a service request.
pub fn run_here<E: Env>(segs: &mut Segments<E>, call: &Call, io: &mut Io<'_>) -> Result<Option<Done>> {
    let (seg, offset, length) = match *call {
        Call::Checksum(ops::Checksum { seg, offset, length })
        | Call::Fill(ops::Fill { seg, offset, length, .. })
        | Call::Read(ops::ReadBytes { seg, offset, length }) => (seg, offset, length),
        Call::Write(ops::WriteBytes { seg, offset }) => (seg, offset, io.input().len().min(i64::MAX as usize) as i64),
        _ => return Ok(None),
    };
    // Looked up first (a shared lock): bytes outside the chunks this process maps go to the
    // service without a pin here, which would fetch fds of chunks it never maps.
    let info = segs.lookup(seg.name())?;
    let (start, end) = (offset.max(0) as u64, offset.max(0).saturating_add(length.max(0)) as u64);
    // A `cpu` segment's chunks are mapped here under every provider; others where the provider
    // gives this process their tier (the host tier's memfds of the host provider).
    let here = |c: &crate::vocab::ChunkInfo| info.tier_pref.cpu_only() || segs.provider().cpu_accessible(c.tier);
    if info.chunks.iter().any(|c| c.offset < end && start < c.offset + c.size && !here(c)) {
        return Ok(None);
    }
    let mut pin = pin_ref(segs, &seg)?;
    // The chunks may have moved meanwhile: checked again under the pin.
    if !pin.cpu_mapped_range(offset, length)? {
        return Ok(None);
    }
    let done = match *call {
        Call::Checksum(_) => {
            pin.count_read(length as u64);
            ops::Summed { checksum: crate::checksum::checksum_interruptible(pin.bytes(offset, length)?)? }.done(0)
        }
        Call::Fill(ops::Fill { seed, .. }) => {
            pin.count_written(length as u64);
            crate::checksum::fill_interruptible(pin.bytes_mut(offset, length)?, seed as u64)?;
            ops::Filled {}.done(0)
        }
        Call::Read(_) => {
            let Io::Out(buf) = io else { return Err(uvm_err!(Code::SystemError, "a read request without a buffer")) };
            let room = buf.len();
            let dst = buf.get_mut(..length as usize).ok_or_else(|| {
                uvm_err!(Code::ProgramLimitExceeded, "a read of {length} bytes exceeds the request's {room} bytes")
            })?;
            pin.count_read(length as u64);
            pin.read_into(offset, dst)?;
            ops::ReadDone {}.done(length as u64)
        }
        _ => {
            pin.count_written(length as u64);
            pin.write_from(offset, io.input())?;
            ops::Written {}.done(0)
        }
    };
    Ok(Some(done))
}

/// The process-mode executor: every request runs here, on this process's segment manager.
pub struct Local<'a, E: Env> {
    pub segs: &'a mut Segments<E>,
}

impl<E: Env> Executor for Local<'_, E> {
    fn mode(&self) -> Mode {
        Mode::Process
    }

    fn max_io(&self) -> usize {
        usize::MAX
    }

    fn run(&mut self, req: &Request, io: Io<'_>) -> Result<Done> {
        run_main(self.segs, &Call::decode(req)?, io)
    }
}
