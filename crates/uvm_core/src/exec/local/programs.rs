//! The scan programs' requests as an executor runs them (`ScanGroups`, `ScanBuild`,
//! `GroupsGrow`; `crate::exec::scan` has their wire form, `crate::scan` the programs): the
//! segments a program reads pinned whole ([`Whole`]), then the CPU's loop over their bytes or
//! the kernels over their device addresses (`crate::scan::gpu`). `super` dispatches these
//! requests here, as every other request, in two steps: [`prepare`] under the manager, then
//! [`ProgramWork::run`] on any thread.

use crate::error::{Code, Result};
use crate::gpujoin::table::{self, KeyType};
use crate::segment::{Env, Pin, Segments};
use crate::uvm_err;

use super::super::request::{self as ops, Call, Done};
use super::super::{Io, SegRef};
use super::{engine_addr, pin_ref, table_for_build, DoneOf, Engine};

/// What a program's request does once its segments are pinned (`super::Work::Program`).
#[derive(Debug)]
pub enum ProgramWork {
    /// A scan program over a cache, folding into a group table (`crate::exec::scan`).
    ScanGroups {
        cache: Whole,
        groups: Whole,
        /// Each dimension table named by the program, in its order.
        dims: Vec<Whole>,
        spec: crate::exec::scan::Spec,
        start: (u64, u64),
        /// The most distinct keys the program can make (0: unknown; the kernels' one pass).
        max_groups: u64,
    },
    /// A dimension's join table from its cache and its program's group table
    /// (`crate::scan::build`; the kernels' `scan::gpu::build`).
    ScanBuild {
        cache: Whole,
        groups: Whole,
        target: crate::exec::cached::BuildTarget,
        spec: crate::exec::scan::Spec,
        key_col: usize,
        /// `ScanBuildTable`'s: the rows the build must insert, the table zeroed before it
        /// and its header written after (`None`: `ScanBuild`, a table begun and finished by
        /// requests of their own).
        whole: Option<u64>,
    },
    /// A group table's groups moved into a bigger one (the CPU's).
    GroupsGrow { from: Whole, to: Whole, slot_count: u64 },
}

/// A whole pinned segment, CPU-addressable: its name, address and size. Valid while the pin it
/// came from is held.
#[derive(Debug)]
pub struct Whole {
    name: String,
    addr: u64,
    len: usize,
    engine: Engine,
}

impl Whole {
    /// The whole of the pinned segment `pin`, for `engine`: CPU-addressable bytes for the CPU,
    /// device addresses for kernels.
    fn of<E: Env>(pin: &Pin<E>, engine: Engine) -> Result<Whole> {
        let size = pin.info().size;
        let len = i64::try_from(size).map_err(|_| uvm_err!(Code::ProgramLimitExceeded, "a segment too large"))?;
        let addr = engine_addr(pin, engine, 0, len)?;
        Ok(Whole { name: pin.info().name.clone(), addr, len: size as usize, engine })
    }

    /// # Safety
    /// The pin this came from is held, and this is the CPU's (`Engine::Cpu`).
    unsafe fn bytes(&self) -> &[u8] {
        debug_assert_eq!(self.engine, Engine::Cpu);
        // SAFETY: [addr, addr + len) is the whole pinned, CPU-addressable segment (contract).
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// # Safety
    /// As `bytes`, and no other view of the segment lives while this one does.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self) -> &mut [u8] {
        debug_assert_eq!(self.engine, Engine::Cpu);
        // SAFETY: as `bytes`; the caller keeps this view the only one (contract).
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }

    /// The segment as the kernels see it.
    fn device(&self) -> crate::scan::gpu::DeviceSeg<'_> {
        crate::scan::gpu::DeviceSeg { name: &self.name, addr: self.addr, len: self.len as u64 }
    }
}

/// The layout of the cache whose whole CPU-addressable bytes are `bytes`, parsed and checked.
fn cpu_layout(name: &str, bytes: &[u8]) -> Result<crate::cache::Layout> {
    let head = bytes.get(..crate::cache::HEADER_BYTES as usize).unwrap_or(bytes);
    let prefix = crate::cache::Layout::prefix_len(name, head)?.min(bytes.len() as u64) as usize;
    crate::cache::Layout::parse(name, &bytes[..prefix], bytes.len() as u64)
}

/// Pins what a program's request `call` names (into `pins`) and describes its work.
pub(super) fn prepare<E: Env>(
    segs: &mut Segments<E>,
    call: &Call,
    io: &Io<'_>,
    engine: Engine,
    pins: &mut Vec<Pin<E>>,
) -> Result<ProgramWork> {
    Ok(match *call {
        Call::ScanGroups(ops::ScanGroups { cache, groups, start_block, start_row, max_groups }) => {
            let spec = crate::exec::scan::Spec::decode(io.input())?;
            let groups_pin = pin_ref(segs, &groups)?;
            let written = groups_pin.info().id;
            let mut read = |seg: &SegRef, pins: &mut Vec<Pin<E>>| -> Result<Whole> {
                let pin = pin_ref(segs, seg)?;
                // The group table is written through the one mutable view of it: no segment
                // the program reads may be it.
                if pin.info().id == written {
                    return Err(uvm_err!(
                        Code::InvalidParameterValue,
                        "the group table \"{}\" is also read by the scan",
                        seg.name()
                    ));
                }
                let w = Whole::of(&pin, engine)?;
                pin.count_read(w.len as u64);
                pins.push(pin);
                Ok(w)
            };
            let cache = read(&cache, pins)?;
            let dims = spec.dims.iter().map(|d| read(d, pins)).collect::<Result<Vec<_>>>()?;
            let groups = Whole::of(&groups_pin, engine)?;
            groups_pin.count_written(groups.len as u64);
            pins.push(groups_pin);
            ProgramWork::ScanGroups { cache, groups, dims, spec, start: (start_block, start_row), max_groups }
        }
        Call::ScanBuild(ops::ScanBuild { cache, table, key_col, slot_count, .. })
        | Call::ScanBuildTable(ops::ScanBuildTable { cache, table, key_col, slot_count, .. }) => {
            let whole = match *call {
                Call::ScanBuildTable(o) => Some(o.rows),
                _ => None,
            };
            let spec = crate::exec::scan::Spec::decode(io.input())?;
            let [groups] = spec.dims.as_slice() else {
                return Err(uvm_err!(Code::InvalidParameterValue, "a build program names its group table and nothing else"));
            };
            let (table_pin, addr, len) = table_for_build(segs, &table, slot_count, engine)?;
            let (cache_pin, groups_pin) = (pin_ref(segs, &cache)?, pin_ref(segs, groups)?);
            let ids = [table_pin.info().id, cache_pin.info().id, groups_pin.info().id];
            if ids[0] == ids[1] || ids[0] == ids[2] || ids[1] == ids[2] {
                return Err(uvm_err!(Code::InvalidParameterValue, "a build reads and writes three different segments"));
            }
            let target = crate::exec::cached::BuildTarget {
                name: table_pin.info().name.clone(),
                addr,
                len: len as usize,
                slot_count,
                key_type: KeyType::Int8,
            };
            let (cache, groups) = (Whole::of(&cache_pin, engine)?, Whole::of(&groups_pin, engine)?);
            cache_pin.count_read(cache.len as u64);
            groups_pin.count_read(groups.len as u64);
            table_pin.count_written(len);
            pins.extend([table_pin, cache_pin, groups_pin]);
            ProgramWork::ScanBuild { cache, groups, target, spec, key_col: key_col as usize, whole }
        }
        Call::GroupsGrow(ops::GroupsGrow { from, to, slot_count }) => {
            let (from_pin, to_pin) = (pin_ref(segs, &from)?, pin_ref(segs, &to)?);
            if from_pin.info().id == to_pin.info().id {
                return Err(uvm_err!(Code::InvalidParameterValue, "a group table cannot grow into itself"));
            }
            let (from, to) = (Whole::of(&from_pin, engine)?, Whole::of(&to_pin, engine)?);
            to_pin.count_written(to.len as u64);
            pins.push(from_pin);
            pins.push(to_pin);
            ProgramWork::GroupsGrow { from, to, slot_count }
        }
        _ => return Err(uvm_err!(Code::SystemError, "operation {:?} is not a scan program's", call.op())),
    })
}

impl ProgramWork {
    /// Does the work (no lock, no PostgreSQL). Returns the reply.
    ///
    /// # Safety
    /// As `super::Work::run`: the pins of the job this work came from are held until it returns.
    pub(super) unsafe fn run(&self) -> Result<Done> {
        let done = |r: &dyn DoneOf| Ok(r.done(0));
        match self {
            ProgramWork::ScanGroups { cache, groups, dims, spec, start, max_groups } if cache.engine == Engine::Cuda => {
                let program = crate::scan::gpu::DeviceProgram {
                    filters: &spec.filters,
                    joins: spec.joins.iter().map(|&(col, d)| (col, dims[d].device())).collect(),
                    keys: &spec.keys,
                    aggs: &spec.aggs,
                };
                let mut scan_ns = 0;
                // SAFETY: the job's pins hold every segment (contract), each `Whole` its whole
                // range as device addresses; the group table is none of the segments read
                // (prepare).
                let progress = crate::gpu::gpu()?.with_kernels(|k| unsafe {
                    crate::scan::gpu::run(k, &program, &cache.device(), &groups.device(), *start, *max_groups, &mut scan_ns)
                })?;
                done(&scanned(progress, scan_ns))
            }
            ProgramWork::ScanGroups { cache, groups, dims, spec, start, .. } => {
                // SAFETY: the job's pins hold every segment (contract); the group table is none
                // of the segments read (prepare), so its mutable view is the only one.
                let (cache_bytes, groups_bytes) = unsafe { (cache.bytes(), groups.bytes_mut()) };
                let layout = cpu_layout(&cache.name, cache_bytes)?;
                let joins = spec
                    .joins
                    .iter()
                    .map(|&(col, d)| {
                        let dim = &dims[d];
                        // SAFETY: as above.
                        let table = table::Table::view(&dim.name, unsafe { dim.bytes() })?;
                        Ok(crate::scan::Join { col, table })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let program = crate::scan::Program {
                    filters: spec.filters.clone(),
                    joins,
                    keys: spec.keys.clone(),
                    aggs: spec.aggs.clone(),
                };
                let mut g = crate::groups::Table::parse(&groups.name, groups_bytes)?;
                let t = std::time::Instant::now();
                let progress = crate::scan::run(&program, &layout, cache_bytes, &mut g, *start)?;
                done(&scanned(progress, t.elapsed().as_nanos() as u64))
            }
            ProgramWork::ScanBuild { cache, groups, target, spec, key_col, whole } if cache.engine == Engine::Cuda => {
                let program = crate::scan::gpu::DeviceProgram {
                    filters: &spec.filters,
                    joins: Vec::new(),
                    keys: &spec.keys,
                    aggs: &spec.aggs,
                };
                let mut scan_ns = 0;
                // SAFETY: the job's pins hold the three segments (contract), three different
                // ones (prepare), each `Whole` its whole range as device addresses; the target's
                // header and slots lie in the pinned table (`table_for_build`: `len` bytes, 8-byte
                // aligned at a segment's start).
                let inserted = crate::gpu::gpu()?.with_kernels(|k| unsafe {
                    if whole.is_some() {
                        k.zero(target.addr, target.len as u64 / 8)?;
                    }
                    let table = (target.addr, target.slot_count);
                    crate::scan::gpu::build(k, &program, *key_col, &cache.device(), &groups.device(), table, &mut scan_ns)
                })?;
                if let Some(rows) = *whole {
                    let header = whole_header(target, inserted, rows)?;
                    // SAFETY: the pinned table's first bytes (as above); the header is ours.
                    unsafe { crate::gpu::copy(target.addr, header.as_ptr() as u64, header.len()) }?;
                }
                Ok(scan_built(whole.is_some(), inserted, scan_ns))
            }
            ProgramWork::ScanBuild { cache, groups, target, spec, key_col, whole } => {
                // SAFETY: the job's pins hold the three segments (contract), three different
                // ones (prepare): the group table's and the target's views are the only ones.
                let (cache_bytes, groups_bytes, table_bytes) = unsafe {
                    (cache.bytes(), groups.bytes_mut(), std::slice::from_raw_parts_mut(target.addr as *mut u8, target.len))
                };
                let layout = cpu_layout(&cache.name, cache_bytes)?;
                let program = crate::scan::Program {
                    filters: spec.filters.clone(),
                    joins: Vec::new(),
                    keys: spec.keys.clone(),
                    aggs: spec.aggs.clone(),
                };
                let mut g = crate::groups::Table::parse(&groups.name, groups_bytes)?;
                if whole.is_some() {
                    for part in table_bytes.chunks_mut(1 << 20) {
                        part.fill(0);
                        crate::interrupt::check()?;
                    }
                }
                let mut b = table::Builder::resume(&target.name, table_bytes, KeyType::Int8, target.slot_count, 0)?;
                let t = std::time::Instant::now();
                let inserted =
                    crate::scan::build(&program, *key_col, &layout, cache_bytes, &mut g, &mut b, target.slot_count / 2)?;
                let scan_ns = t.elapsed().as_nanos() as u64;
                if let Some(rows) = *whole {
                    let header = whole_header(target, inserted, rows)?;
                    table_bytes[..header.len()].copy_from_slice(&header);
                }
                Ok(scan_built(whole.is_some(), inserted, scan_ns))
            }
            ProgramWork::GroupsGrow { from, to, slot_count } if from.engine == Engine::Cuda => {
                // (the context current on this thread, for the copies)
                crate::gpu::gpu()?;
                // SAFETY: the job's pins hold both (contract), two different segments (prepare),
                // each `Whole` its whole range as device addresses.
                let moved = unsafe { crate::scan::gpu::grow(&from.device(), &to.device(), *slot_count) }?;
                done(&ops::GroupsGrown { groups: moved })
            }
            ProgramWork::GroupsGrow { from, to, slot_count } => {
                // SAFETY: the job's pins hold both (contract), two different segments (prepare).
                let (f, t) = unsafe { (from.bytes_mut(), to.bytes_mut()) };
                let mut from_table = crate::groups::Table::parse(&from.name, f)?;
                crate::groups::grow(&mut from_table, t, *slot_count)?;
                done(&ops::GroupsGrown { groups: from_table.header().groups })
            }
        }
    }
}

/// The header of a table `ScanBuildTable` built, which had to insert `rows` pairs: an ERROR
/// where it inserted another number (the table then stays without a header, unusable).
fn whole_header(target: &crate::exec::cached::BuildTarget, inserted: u64, rows: u64) -> Result<Vec<u8>> {
    if inserted != rows {
        return Err(uvm_err!(
            Code::SystemError,
            "a dimension's build inserted {inserted} rows of the {rows} its program counted into \"{}\"",
            target.name
        ));
    }
    let header = table::Header { slot_count: target.slot_count, ..table::header_for(KeyType::Int8, rows, 0, 0) };
    Ok(header.as_bytes().to_vec())
}

/// The reply of a build: `ScanBuildTable`'s (`whole`) or `ScanBuild`'s.
fn scan_built(whole: bool, inserted: u64, scan_ns: u64) -> Done {
    if whole {
        ops::ScanBuiltTable { inserted, scan_ns }.done(0)
    } else {
        ops::ScanBuilt { inserted, scan_ns }.done(0)
    }
}

/// A scan's reply.
fn scanned(p: crate::scan::Progress, scan_ns: u64) -> ops::ScannedGroups {
    match p {
        crate::scan::Progress::Done => ops::ScannedGroups { full: 0, _pad: 0, block: 0, row: 0, slots: 0, scan_ns },
        crate::scan::Progress::Full { block, row, slots } => ops::ScannedGroups { full: 1, _pad: 0, block, row, slots, scan_ns },
    }
}
