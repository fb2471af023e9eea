//! Running requests on this process's own mappings: the code both execution modes share.
//!
//! A request is run in two or three steps, so that the GPU service can spread them over its
//! threads:
//!
//! 1. [`prepare`] (needs the segment manager, hence the registry lock: the service's main
//!    thread) pins the segments the request names, checks that the names still denote the ids
//!    the client resolved, and turns the request into [`Work`]: plain data (addresses inside
//!    the pins, lengths, the engine), which may cross to another thread.
//! 2. [`Work::run`] (no lock, no PostgreSQL: any thread) does the work on the CPU or with CUDA.
//! 3. Dropping the [`Job`] (main thread again) gives the pins back.
//!
//! Operations that change the registry, or need the manager throughout (create, grow, drop,
//! migrate, materialize with its grow-and-resume protocol), run whole in [`run_main`].
//! In process mode [`Local`] does all steps in a row, on the caller's thread.

use crate::error::{Code, Result};
use crate::gpujoin::gpu::{JoinKernels, KernelAppender};
use crate::gpujoin::pairs::{self, CpuAppender, Inner, RawInner};
use crate::gpujoin::table::{self, KeyType};
use crate::provider::{Provider, ProviderKind};
use crate::registry::TierPref;
use crate::segment::{Env, Pin, Segments};
use crate::uvm_err;

use super::kernel::{Arg, Launch};
use super::{key_type_of, split_sum, Executor, Io, Mode, Op, Request, SegRef};

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

fn op_of(req: &Request) -> Result<Op> {
    Op::from_repr(req.op).ok_or_else(|| uvm_err!(Code::ProtocolViolation, "unknown request operation {}", req.op))
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

/// Pins what `req` names and describes its work (any operation [`run_main`] does not run).
/// `io` is the request's bulk data, read only by operations that describe their work there.
pub fn prepare<E: Env>(segs: &mut Segments<E>, req: &Request, io: &Io<'_>) -> Result<Job<E>> {
    let op = op_of(req)?;
    let engine = Engine::of(segs.provider());
    let a = req.args;
    let mut pins = Vec::new();
    let work = match op {
        Op::Ping => Work::Ping,
        Op::Checksum | Op::Fill => {
            let pin = pin_ref(segs, &req.segs[0])?;
            let (offset, len) = (a[0], a[1]);
            // The CPU needs every byte addressable (bytes() checks the tiers); kernels do not.
            let addr = match engine {
                Engine::Cpu => pin.bytes(offset, len)?.as_ptr() as u64,
                Engine::Cuda => pin.addr(offset, len)?,
            };
            pins.push(pin);
            if op == Op::Checksum {
                Work::Checksum { addr, len: len as u64, engine }
            } else {
                Work::Fill { addr, len: len as u64, seed: a[2] as u64, engine }
            }
        }
        Op::Read | Op::Write => {
            let pin = pin_ref(segs, &req.segs[0])?;
            let len = if op == Op::Read { a[1] } else { req.input.min(i64::MAX as u64) as i64 };
            let pieces = pin.pieces_at(a[0], len)?;
            pins.push(pin);
            if op == Op::Read {
                Work::Read { pieces }
            } else {
                Work::Write { pieces }
            }
        }
        Op::Probe => {
            let pin = pin_ref(segs, &req.segs[0])?;
            let inner = Inner::of(&pin, key_type_of(a[0])?, engine == Engine::Cpu)?.raw();
            pins.push(pin);
            Work::Probe { inner, engine }
        }
        Op::BuildBegin | Op::BuildInsert => {
            let pin = pin_ref(segs, &req.segs[0])?;
            let slot_count = if op == Op::BuildBegin { a[0] } else { a[1] } as u64;
            if !slot_count.is_power_of_two() {
                return Err(uvm_err!(
                    Code::InvalidParameterValue,
                    "a hash table needs a power-of-two slot count, not {slot_count}"
                ));
            }
            let len = slot_count
                .checked_mul(table::SLOT_BYTES)
                .and_then(|b| b.checked_add(table::HEADER_BYTES))
                .filter(|&b| b <= pin.info().size)
                .ok_or_else(|| {
                    uvm_err!(Code::ProgramLimitExceeded, "segment \"{}\" cannot hold {slot_count} slots", pin.info().name)
                })? as i64;
            let addr = match engine {
                Engine::Cpu => pin.bytes(0, len)?.as_ptr() as u64,
                Engine::Cuda => pin.addr(0, len)?,
            };
            let name = pin.info().name.clone();
            pins.push(pin);
            if op == Op::BuildBegin {
                Work::BuildBegin { addr, len: len as u64, engine }
            } else {
                Work::BuildInsert { name, table: addr, table_len: len as usize, slot_count, key_type: key_type_of(a[0])?, engine }
            }
        }
        Op::BenchSegmentRead => {
            cuda_only(engine)?;
            let pin = pin_ref(segs, &req.segs[0])?;
            let len = pin.info().size;
            let addr = pin.addr(0, len as i64)?;
            pins.push(pin);
            Work::BenchSegmentRead { addr, len, iterations: a[0].clamp(1, u32::MAX as i64) as u32 }
        }
        Op::BenchPrivateRead => {
            cuda_only(engine)?;
            Work::BenchPrivateRead {
                bytes: a[0].max(16) as u64,
                iterations: a[1].clamp(1, u32::MAX as i64) as u32,
                seed: a[2] as u64,
            }
        }
        Op::BenchCopyCeiling => {
            cuda_only(engine)?;
            Work::BenchCopyCeiling { bytes: a[0].max(1) as u64, iterations: a[1].clamp(1, u32::MAX as i64) as u32 }
        }
        Op::BenchJoinProbe => {
            cuda_only(engine)?;
            let pin = pin_ref(segs, &req.segs[0])?;
            let inner = Inner::of(&pin, KeyType::Int8, false)?.raw();
            pins.push(pin);
            Work::BenchJoinProbe { inner, keys: a[0], key_range: a[1] }
        }
        Op::BenchHostRegister => {
            cuda_only(engine)?;
            Work::BenchHostRegister { bytes: a[0].max(1) as u64 }
        }
        Op::MemInfo => Work::MemInfo { engine },
        Op::Launch => {
            let launch = Launch::decode(input(io))?;
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
        Op::Info | Op::Create | Op::Grow | Op::Drop | Op::Prefetch | Op::GrowAtLeast | Op::Materialize => {
            return Err(uvm_err!(Code::SystemError, "operation {op:?} is not prepared: it runs whole"))
        }
    };
    Ok(Job { pins, work })
}

fn f64_word(v: f64) -> i64 {
    v.to_bits() as i64
}

fn input<'a>(io: &'a Io<'_>) -> &'a [u8] {
    match io {
        Io::In(b) => b,
        _ => &[],
    }
}

/// Views input bytes as 8-byte words (staging areas and vectors of words are aligned).
fn words<'a, T>(b: &'a [u8], what: &str) -> Result<&'a [T]> {
    let size = std::mem::size_of::<T>();
    if !(b.as_ptr() as usize).is_multiple_of(8) || !b.len().is_multiple_of(size) {
        return Err(uvm_err!(Code::ProtocolViolation, "{what} in a request are misaligned or cut"));
    }
    // SAFETY: aligned (checked), whole elements (checked), any bit pattern is a valid i64
    // (or array of them), and the bytes live as long as `b`.
    Ok(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const T, b.len() / size) })
}

impl Work {
    /// Does the work (no lock, no PostgreSQL). Returns the reply's values and the output
    /// bytes written.
    ///
    /// # Safety
    /// The pins of the job this work came from must be held (and this process's mappings of
    /// them intact) until it returns.
    pub unsafe fn run(&self, mut io: Io<'_>) -> Result<([i64; 6], u64)> {
        let mut v = [0i64; 6];
        let mut out = 0u64;
        match self {
            Work::Ping => {}
            &Work::Checksum { addr, len, engine } => {
                v[0] = match engine {
                    Engine::Cpu => {
                        // SAFETY: pinned, CPU-addressable (prepare checked), mapped (contract).
                        let b = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
                        crate::checksum::checksum_interruptible(b)?
                    }
                    // SAFETY: the pinned range (contract).
                    Engine::Cuda => crate::gpu::gpu()?.with_kernels(|k| unsafe { k.checksum(addr, len) })?,
                } as i64;
            }
            &Work::Fill { addr, len, seed, engine } => match engine {
                Engine::Cpu => {
                    // SAFETY: as for Checksum; writes to shared memory are the users' business.
                    let b = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) };
                    crate::checksum::fill_interruptible(b, seed)?;
                }
                // SAFETY: the pinned range (contract).
                Engine::Cuda => crate::gpu::gpu()?.with_kernels(|k| unsafe { k.fill(addr, len, seed) })?,
            },
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
                out = at as u64;
            }
            Work::Write { pieces } => {
                let src = input(&io);
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
            }
            Work::Probe { inner, engine } => {
                let keys: &[i64] = words(input(&io), "probe keys")?;
                // SAFETY: the pin behind `inner` is held (contract).
                let view = unsafe { inner.inner() }?;
                let (m, sum) = match (engine, view.table()) {
                    (Engine::Cpu, Some(t)) => t.probe(keys)?,
                    _ => crate::gpu::gpu()?.with_kernels(|k| k.join_probe(&view, keys))?,
                };
                let (lo, hi) = split_sum(sum);
                v[..3].copy_from_slice(&[m as i64, lo, hi]);
            }
            &Work::BuildBegin { addr, len, engine } => match engine {
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
            },
            Work::BuildInsert { name, table, table_len, slot_count, key_type, engine } => {
                let rows: &[[i64; 2]] = words(input(&io), "build rows")?;
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
            }
            &Work::BenchSegmentRead { addr, len, iterations } => {
                // SAFETY: the whole pinned segment (contract).
                v[0] = f64_word(crate::gpu::gpu()?.with_kernels(|k| unsafe { k.read_bandwidth(addr, len, iterations) })?);
            }
            &Work::BenchPrivateRead { bytes, iterations, seed } => {
                v[0] = f64_word(crate::gpu::bench::private_read(bytes, iterations, seed)?);
            }
            &Work::BenchCopyCeiling { bytes, iterations } => {
                let (htod, dtoh) = crate::gpu::bench::copy_ceiling(bytes, iterations)?;
                v[..2].copy_from_slice(&[f64_word(htod), f64_word(dtoh)]);
            }
            Work::BenchJoinProbe { inner, keys, key_range } => {
                // SAFETY: the pin behind `inner` is held (contract).
                let view = unsafe { inner.inner() }?;
                v[0] = f64_word(crate::gpujoin::gpu::join_probe_view(&view, *keys, *key_range)?);
            }
            &Work::BenchHostRegister { bytes } => {
                v[0] = f64_word(crate::gpu::bench::host_register_ms(bytes)?);
            }
            Work::Launch { source, shape, params } => {
                // SAFETY: the segment addresses lie in the job's pins (contract); the kernel is
                // the caller's, who vouches for it (the C API's contract).
                unsafe { crate::gpu::user::launch(source, *shape, params) }?;
            }
            &Work::MemInfo { engine } => {
                if engine == Engine::Cuda {
                    let (free, total) = crate::gpu::gpu()?.mem_info()?;
                    v[..2].copy_from_slice(&[free as i64, total as i64]);
                }
            }
        }
        Ok((v, out))
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

/// Runs an operation that needs the segment manager throughout (see the module documentation).
pub fn run_main<E: Env>(segs: &mut Segments<E>, req: &Request, mut io: Io<'_>) -> Result<([i64; 6], u64)> {
    let op = op_of(req)?;
    let a = req.args;
    let mut v = [0i64; 6];
    let mut out = 0u64;
    let seg = &req.segs[0];
    let checked = |id: u64| check_id(id, seg);
    match op {
        Op::Info => {
            let text = info_text(segs);
            let Io::Out(buf) = &mut io else { return Err(uvm_err!(Code::SystemError, "an info request without a buffer")) };
            let n = text.len().min(buf.len());
            buf[..n].copy_from_slice(&text.as_bytes()[..n]);
            out = n as u64;
        }
        Op::Create => {
            let max_size = (a[2] != 0).then_some(a[1]);
            // A code that names nothing reads as `auto` (requests come from this cluster's own
            // backends, but the slot is shared memory).
            let pref = TierPref::from_code(u32::try_from(a[3]).unwrap_or(0));
            v[0] = segs.create(seg.name(), a[0], max_size, pref, a[4] as u32, a[5])? as i64;
        }
        Op::Grow => {
            checked(segs.lookup(seg.name())?.id)?;
            v[0] = segs.grow(seg.name(), a[0], |_| Ok(()))? as i64;
        }
        Op::GrowAtLeast => {
            checked(segs.lookup(seg.name())?.id)?;
            v[0] = segs.grow_at_least(seg.name(), a[0].max(0) as u64, |_| Ok(()))? as i64;
        }
        Op::Drop => {
            checked(segs.lookup(seg.name())?.id)?;
            segs.drop_segment(seg.name(), |_| Ok(()))?;
        }
        Op::Prefetch => {
            checked(segs.lookup(seg.name())?.id)?;
            // Unknown codes read as `auto`, which prefetch refuses (22023).
            let target = TierPref::from_code(u32::try_from(a[2]).unwrap_or(0));
            let saved = segs.limits.pin_wait;
            segs.limits.pin_wait = std::time::Duration::from_millis(a[3].max(0) as u64);
            let r = segs.prefetch(seg.name(), a[0], a[1], target, |_| Ok(()));
            segs.limits.pin_wait = saved;
            v[0] = r? as i64;
        }
        Op::Materialize => {
            let result = &req.segs[1];
            checked(segs.lookup(seg.name())?.id)?;
            check_id(segs.lookup(result.name())?.id, result)?;
            let keys: &[i64] = words(input(&io), "probe keys")?;
            let kt = key_type_of(a[0])?;
            let allow = |_: u32, _: &str, _: &str| Ok(());
            let (m, sum) = match Engine::of(segs.provider()) {
                Engine::Cpu => {
                    let mut ap = CpuAppender::new(keys);
                    pairs::append_batch(segs, seg.name(), result.name(), kt, &allow, &mut ap)?;
                    (ap.matches, ap.sum)
                }
                Engine::Cuda => crate::gpu::gpu()?.with_kernels(|k| {
                    let mut ap = KernelAppender::new(k, keys);
                    pairs::append_batch(segs, seg.name(), result.name(), kt, &allow, &mut ap)?;
                    Ok((ap.matches, ap.sum))
                })?,
            };
            let (lo, hi) = split_sum(sum);
            v[..3].copy_from_slice(&[m as i64, lo, hi]);
        }
        _ => {
            let job = prepare(segs, req, &io)?;
            // SAFETY: the job's pins live until after the work returns.
            return unsafe { job.work.run(io) };
        }
    }
    Ok((v, out))
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

    fn run(&mut self, req: &Request, io: Io<'_>) -> Result<([i64; 6], u64)> {
        run_main(self.segs, req, io)
    }
}
