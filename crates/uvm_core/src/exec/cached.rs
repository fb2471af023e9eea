//! The GpuJoin over column caches: a table built from a cached table's columns and a probe of
//! another's keys, both read in place, block by block, in the process that runs the request (the
//! GPU service, or a backend in process mode), so that no key crosses to the client.
//!
//! # Design
//!
//! A cache (`crate::cache`: blocks of rows, each column an aligned array with a NULL bitmap)
//! is laid out for exactly this: a block of one column is an array, and the blocks lie a fixed
//! stride apart, so one launch of the join kernels reads a column across many blocks in place
//! (`gpujoin::gpu::DeviceColumn`: base, width, bitmap, stride, each block's count from its
//! header), where the staged paths launch them over keys copied in. Launches are bounded to
//! [`LAUNCH_ROWS`] rows, with an interrupt check between them (one launch per block cost 50 µs
//! of synchronisation each: 38 ms for the 763 blocks of 50 M rows on the H200, against a few
//! for the probing itself). The CPU engine (host provider) walks the same arrays a block at a
//! time with the table's CPU code.
//!
//! The cache's bytes are untrusted, as every segment's: the layout is parsed from the pinned
//! segment here ([`Layout::parse`], which bounds every block inside it), a block's row count is
//! refused above the block's rows (by the CPU here, by the kernels as they read it: an ERROR
//! either way), and a column must be a signed integer of 2, 4 or 8 bytes
//! (and not wider than the table's key type). The blocks read are those the header counted
//! when the request began: rows appended later belong to snapshots that do not read this one.
//! Every block ends with an interrupt check; the kernels bound their own walks.
//!
//! The client decides whether a cache may answer for its snapshot (the extension's reader's
//! rule); this module only reads the segment it was handed.

use zerocopy::FromBytes;

use crate::cache::{BlockHeader, ColumnDesc, Encoding, Layout, BLOCK_HEADER_BYTES, HEADER_BYTES};
use crate::error::{Code, Result};
use crate::gpujoin::gpu::{BuildCounts, DeviceColumn, JoinKernels};
use crate::gpujoin::pairs::RawInner;
use crate::gpujoin::table::{self, KeyType};
use crate::segment::{Env, Pin};
use crate::uvm_err;

use super::local::Engine;
use super::request as ops;

/// The column number of a request that names no column (a build without payloads).
pub const NO_COLUMN: u32 = u32::MAX;

/// A pinned cache segment: where it lies for the engine (the CPU's address, or the device's)
/// and its size. Valid while the pin it came from is held.
#[derive(Debug)]
pub struct CacheSource {
    name: String,
    addr: u64,
    size: u64,
    engine: Engine,
}

impl CacheSource {
    /// The whole of the pinned segment `pin`, for `engine` (the CPU needs every byte
    /// addressable; kernels do not).
    pub fn of<E: Env>(pin: &Pin<E>, engine: Engine) -> Result<CacheSource> {
        let size = pin.info().size;
        let len = i64::try_from(size).map_err(|_| uvm_err!(Code::ProgramLimitExceeded, "a cache segment too large"))?;
        // `Pin::addr` refuses a `cpu` segment, for the CPU engine too (it does what kernels do).
        let addr = pin.addr(0, len)?;
        let addr = match engine {
            Engine::Cpu => pin.bytes(0, len)?.as_ptr() as u64,
            Engine::Cuda => addr,
        };
        pin.count_read(size);
        Ok(CacheSource { name: pin.info().name.clone(), addr, size, engine })
    }

    /// Copies `out.len()` bytes at `offset` of the segment into `out`.
    ///
    /// # Safety
    /// The pin this source came from is held.
    unsafe fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        if offset.checked_add(out.len() as u64).is_none_or(|end| end > self.size) {
            return Err(uvm_err!(Code::InvalidParameterValue, "a read past the end of cache \"{}\"", self.name));
        }
        let src = self.addr + offset;
        match self.engine {
            // SAFETY: [src, src + len) lies in the pinned, CPU-addressable segment (checked
            // above and by `of`); out is ours.
            Engine::Cpu => unsafe { std::ptr::copy_nonoverlapping(src as *const u8, out.as_mut_ptr(), out.len()) },
            Engine::Cuda => {
                crate::gpu::gpu()?; // the context current on this thread
                                    // SAFETY: as above, through the driver (device or host tier alike).
                unsafe { crate::gpu::copy(out.as_mut_ptr() as u64, src, out.len()) }?;
            }
        }
        Ok(())
    }

    /// The segment's layout, parsed and checked against its size.
    ///
    /// # Safety
    /// As for `read`.
    unsafe fn layout(&self) -> Result<Layout> {
        let mut head = vec![0u8; HEADER_BYTES as usize];
        // SAFETY: forwarded contract.
        unsafe { self.read(0, &mut head) }?;
        let mut prefix = vec![0u8; Layout::prefix_len(&self.name, &head)?.min(self.size) as usize];
        // SAFETY: forwarded contract.
        unsafe { self.read(0, &mut prefix) }?;
        Layout::parse(&self.name, &prefix, self.size)
    }

    /// The rows block `block` holds (at most its `block_rows`), and its offset.
    ///
    /// # Safety
    /// As for `read`.
    unsafe fn block(&self, layout: &Layout, block: u64) -> Result<(u64, u64)> {
        let (at, _) = layout.block_at(block).ok_or_else(|| uvm_err!(Code::SystemError, "block {block} past the cache"))?;
        let mut raw = [0u8; BLOCK_HEADER_BYTES as usize];
        // SAFETY: forwarded contract.
        unsafe { self.read(at, &mut raw) }?;
        let rows = BlockHeader::read_from_bytes(&raw).map(|h| h.rows).unwrap_or(u64::MAX);
        if rows > layout.header().block_rows {
            return Err(crate::cache::overwritten(format!(
                "block {block} of cache \"{}\" says it holds {rows} rows, more than its {}",
                self.name,
                layout.header().block_rows
            )));
        }
        Ok((rows, at))
    }

    /// Column `c` of the block at `at` with `rows` rows (its count read and checked), as the
    /// CPU reads it.
    fn column(&self, c: &ColumnDesc, at: u64, rows: u64) -> DeviceColumn {
        DeviceColumn {
            values: self.addr + at + c.values_at,
            width: u64::from(c.width),
            nulls: self.addr + at + c.nulls_at,
            n: rows,
            blocks: 1,
            stride: 0,
            headers: 0,
        }
    }

    /// Column `c` of `count` blocks from block `first`, as one launch of the kernels reads it:
    /// each block's count from its header (checked by the kernel against `block_rows`).
    fn blocks(&self, c: &ColumnDesc, layout: &Layout, first: u64, count: u64) -> DeviceColumn {
        let h = layout.header();
        let at = self.addr + h.data_offset + first * h.block_bytes;
        DeviceColumn {
            values: at + c.values_at,
            width: u64::from(c.width),
            nulls: at + c.nulls_at,
            n: h.block_rows,
            blocks: count,
            stride: h.block_bytes,
            headers: at,
        }
    }
}

/// Column `col` of `layout`, which must be a signed integer of at most the key type's width
/// (`key`) or of any integer width (payloads: `None`).
fn int_column<'l>(src: &CacheSource, layout: &'l Layout, col: u32, key: Option<KeyType>) -> Result<&'l ColumnDesc> {
    let c = layout.columns().get(col as usize);
    let enc = layout.encoding(col as usize);
    let width_ok = |w: u16| match key {
        Some(KeyType::Int4) => w <= 4,
        Some(KeyType::Int8) | None => true,
    };
    match (c, enc) {
        (
            Some(c),
            Some(Encoding::Int2 | Encoding::Int4 | Encoding::Int8 | Encoding::Date | Encoding::Timestamp | Encoding::TimestampTz),
        ) if width_ok(c.width) && (key.is_some() || matches!(enc, Some(Encoding::Int2 | Encoding::Int4 | Encoding::Int8))) => {
            Ok(c)
        }
        _ => Err(uvm_err!(
            Code::InvalidParameterValue,
            "column {} of cache \"{}\" is not an integer column the join can read",
            col.saturating_add(1),
            src.name
        )),
    }
}

/// Row `r` of a CPU-addressable column: `None` where NULL.
///
/// # Safety
/// `c` addresses `c.n` values and its bitmap in the pinned, CPU-addressable segment.
unsafe fn cpu_value(c: &DeviceColumn, r: u64) -> Option<i64> {
    // SAFETY: r < c.n (callers loop below it): inside the column (contract).
    unsafe {
        if (*((c.nulls + r / 8) as *const u8) >> (r % 8)) & 1 != 0 {
            return None;
        }
        let p = c.values + r * c.width;
        Some(match c.width {
            2 => std::ptr::read_unaligned(p as *const i16) as i64,
            4 => std::ptr::read_unaligned(p as *const i32) as i64,
            _ => std::ptr::read_unaligned(p as *const i64),
        })
    }
}

/// A table build's target: the name, the table's bytes for the CPU or its slots' address for
/// kernels, its slot count and key type.
#[derive(Debug)]
pub struct BuildTarget {
    pub name: String,
    pub addr: u64,
    pub len: usize,
    pub slot_count: u64,
    pub key_type: KeyType,
}

/// Inserts the rows of `src`'s columns `key_col` and `payload_col` into the table (see
/// `ops::CacheBuild`).
///
/// # Safety
/// The pins of the table and the cache are held; `t` and `src` came from them.
pub unsafe fn build(t: &BuildTarget, src: &CacheSource, key_col: u32, payload_col: u32) -> Result<ops::CacheBuilt> {
    // SAFETY: forwarded contract.
    let layout = unsafe { src.layout() }?;
    let key = int_column(src, &layout, key_col, Some(t.key_type))?;
    let payload = if payload_col == NO_COLUMN { None } else { Some(int_column(src, &layout, payload_col, None)?) };
    let mut counts = BuildCounts::default();
    match src.engine {
        Engine::Cpu => {
            // SAFETY: the pinned table, CPU-addressable (prepare checked), mapped (contract).
            let b = unsafe { std::slice::from_raw_parts_mut(t.addr as *mut u8, t.len) };
            let mut builder = table::Builder::resume(&t.name, b, t.key_type, t.slot_count, 0)?;
            for block in 0..layout.header().blocks {
                crate::interrupt::check()?;
                // SAFETY: forwarded contract.
                let (n, at) = unsafe { src.block(&layout, block) }?;
                let keys = src.column(key, at, n);
                let payloads = payload.map(|p| src.column(p, at, n));
                for r in 0..n {
                    // SAFETY: both columns lie in the parsed block of the pinned,
                    // CPU-addressable segment (`Layout::parse` bounded it), r < n ≤ block_rows.
                    let (k, p) = unsafe { (cpu_value(&keys, r), payloads.map(|c| cpu_value(&c, r))) };
                    let Some(k) = k else {
                        counts.null_keys += 1;
                        continue;
                    };
                    let p = match p {
                        Some(None) => {
                            counts.null_payloads += 1;
                            0
                        }
                        Some(Some(v)) => v,
                        None => 0,
                    };
                    builder.insert(Some(k), p)?;
                    counts.placed += 1;
                }
            }
        }
        Engine::Cuda => {
            let slots = t.addr + table::HEADER_BYTES;
            for (first, count) in launches(&layout) {
                crate::interrupt::check()?;
                let keys = src.blocks(key, &layout, first, count);
                let payloads = payload.map(|p| src.blocks(p, &layout, first, count));
                // SAFETY: the pinned table's slots (prepare bounded them), slot_count a power of
                // two; both columns' blocks lie in the parsed layout of the pinned segment.
                let c = crate::gpu::gpu()?
                    .with_kernels(|k| unsafe { k.join_build_columns(slots, t.slot_count - 1, 0, keys, payloads) })?;
                if c.left_out > 0 {
                    return Err(table::corrupted(&t.name, &format!("a build found no empty slot in {} slots", t.slot_count)));
                }
                counts.placed += c.placed;
                counts.null_keys += c.null_keys;
                counts.null_payloads += c.null_payloads;
            }
        }
    }
    Ok(ops::CacheBuilt { inserted: counts.placed, null_keys: counts.null_keys, null_payloads: counts.null_payloads })
}

/// Rows one kernel launch reads at most (a bounded launch: the host checks for interrupts
/// between launches).
const LAUNCH_ROWS: u64 = 1 << 26;

/// The launches over `layout`'s blocks: (first block, blocks), each of at most
/// [`LAUNCH_ROWS`] rows (one block at least).
fn launches(layout: &Layout) -> impl Iterator<Item = (u64, u64)> {
    let h = layout.header();
    let per = (LAUNCH_ROWS / h.block_rows.max(1)).max(1);
    let blocks = h.blocks;
    (0..blocks).step_by(per as usize).map(move |first| (first, per.min(blocks - first)))
}

/// Probes the keys of `src`'s column `key_col` against `inner` (see `ops::CacheProbe`).
///
/// # Safety
/// The pins of the table and the cache are held; `inner` and `src` came from them.
pub unsafe fn probe(inner: &RawInner, key_type: KeyType, src: &CacheSource, key_col: u32) -> Result<ops::CacheProbed> {
    // SAFETY: forwarded contract.
    let layout = unsafe { src.layout() }?;
    let key = int_column(src, &layout, key_col, Some(key_type))?;
    // SAFETY: the pin behind `inner` is held (contract).
    let view = unsafe { inner.inner() }?;
    let (mut matches, mut sum, mut rows, mut ns) = (0u64, 0i128, 0u64, 0f64);
    match (src.engine, view.table()) {
        (Engine::Cpu, Some(t)) => {
            let mut keys = Vec::new();
            for block in 0..layout.header().blocks {
                crate::interrupt::check()?;
                // SAFETY: forwarded contract.
                let (n, at) = unsafe { src.block(&layout, block) }?;
                let col = src.column(key, at, n);
                rows += n;
                let t0 = std::time::Instant::now();
                keys.clear();
                // SAFETY: as in `build`.
                keys.extend((0..n).filter_map(|r| unsafe { cpu_value(&col, r) }));
                let (m, s) = t.probe(&keys)?;
                ns += t0.elapsed().as_nanos() as f64;
                matches += m;
                sum += s;
            }
        }
        _ => {
            // (the rows the header counts: the kernels read each block's own count)
            rows = layout.header().rows;
            for (first, count) in launches(&layout) {
                crate::interrupt::check()?;
                let col = src.blocks(key, &layout, first, count);
                // SAFETY: the column's blocks lie in the parsed layout of the pinned segment.
                let (m, s, ms) = crate::gpu::gpu()?.with_kernels(|k| unsafe { k.join_probe_column(&view, col) })?;
                ns += ms * 1e6;
                matches += m;
                sum += s;
            }
        }
    }
    Ok(ops::CacheProbed { matches, sum: ops::Sum128::from(sum), rows, probe_ns: ns as u64 })
}
