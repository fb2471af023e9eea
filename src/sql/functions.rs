//! The SQL surface, schema `uvm` (the names are the contract; see README.md).
//!
//! Reading functions are `PARALLEL SAFE`: a parallel worker attaches to the segment on its own
//! the first time it runs one. Mutating functions are `PARALLEL UNSAFE`, `VOLATILE`, and revoked
//! from PUBLIC at the end of the extension script.

use pgrx::iter::TableIterator;
use pgrx::prelude::*;

use crate::error::{Code, UvmError};
use crate::exec;
use crate::registry::{Tier, TierPref};
use crate::runtime::{current_user, now, report, resolve, with_executor, with_segments};

fn parse_tier(tier: &str) -> TierPref {
    TierPref::parse(tier).unwrap_or_else(|e| report(e))
}

/// Creates segment `name` of `size` bytes, growable to `max_size` (default: the
/// `pg_uvm_share.max_segment_size` setting), with chunks placed by `tier`. Returns its id.
#[pg_extern(volatile, parallel_unsafe)]
fn create_segment(
    name: Option<&str>,
    size: Option<i64>,
    max_size: default!(Option<i64>, "NULL"),
    tier: default!(Option<&str>, "'auto'"),
) -> i64 {
    // Not STRICT, because max_size may be NULL; the other arguments may not.
    let (Some(name), Some(size), Some(tier)) = (name, size, tier) else {
        report(UvmError::new(Code::NullValueNotAllowed, "name, size and tier must not be NULL"))
    };
    let pref = parse_tier(tier);
    crate::registry::check_not_reserved(name).unwrap_or_else(|e| report(e));
    with_executor(|ex| exec::create(ex, name, size, max_size, pref, current_user(), now())) as i64
}

/// Drops segment `name`; fails with 55006 while any process holds a pin on it.
#[pg_extern(volatile, parallel_unsafe)]
fn drop_segment(name: &str) {
    with_executor(|ex| exec::drop(ex, &resolve(name, "drop")?.0));
    // In service mode the service dropped it: forget this process's own attachment (session
    // pins and lookups) at once, as a process-mode drop does.
    crate::runtime::if_segments(|s| s.detach_dropped());
}

/// Grows segment `name` to `new_size` bytes (never shrinks). Returns the new size.
#[pg_extern(volatile, parallel_unsafe)]
fn grow_segment(name: &str, new_size: i64) -> i64 {
    with_executor(|ex| exec::grow(ex, &resolve(name, "grow")?.0, new_size)) as i64
}

/// Writes `data` at `offset`. Returns the number of bytes written.
#[pg_extern(volatile, parallel_unsafe)]
fn write_segment(name: &str, offset: i64, data: &[u8]) -> i64 {
    with_executor(|ex| {
        let (seg, info) = resolve(name, "write")?;
        crate::segment::check_range(&info, offset, data.len() as i64)?;
        exec::write(ex, &seg, offset, data)?;
        Ok(data.len() as i64)
    })
}

/// A `bytea` allocated in the function's result memory context and filled in place, so that a
/// read copies segment bytes once (pgrx's `Vec<u8>` return would copy them twice).
///
/// The memory belongs to the memory context that was current at [`PallocBytea::new`] (the
/// function call's), not to this value: it is freed with that context, and a `PallocBytea`
/// must not outlive it. Hence `new` is `unsafe`, and the bytes are lent out only for as long as
/// the value itself is borrowed ([`PallocBytea::data_mut`]); nothing hands out a longer-lived
/// reference. Dropping the value without returning it leaves the memory to the context (no
/// leak: the context is reset after the call, also on ERROR).
struct PallocBytea {
    /// A complete varlena of `VARHDRSZ + len` bytes, palloc'd.
    ptr: std::ptr::NonNull<pg_sys::varlena>,
    len: usize,
}

pgrx::impl_sql_translatable!(PallocBytea, "bytea");

impl PallocBytea {
    /// The largest payload one bytea can hold (`MaxAllocSize` of memutils.h, less the header).
    const MAX_LEN: usize = 0x3fff_ffff - pg_sys::VARHDRSZ;

    /// Allocates a zeroed bytea of `len` bytes in `CurrentMemoryContext`. (Zeroed, because a
    /// `&mut [u8]` may only point to initialised bytes; zeroing costs far less than the copy.)
    ///
    /// # Safety
    ///
    /// The caller returns the value from the current SQL function call, or drops it, before
    /// `CurrentMemoryContext` is reset or deleted: it must not be kept across calls or moved
    /// to another thread (it is neither `Send` nor `Sync`).
    unsafe fn new(len: usize) -> crate::error::Result<PallocBytea> {
        if len > Self::MAX_LEN {
            return Err(UvmError::new(
                Code::ProgramLimitExceeded,
                format!("cannot read {len} bytes into one bytea (at most 1 GB)"),
            ));
        }
        let total = len + pg_sys::VARHDRSZ;
        // SAFETY: palloc0 either returns `total` zeroed bytes in CurrentMemoryContext or raises
        // an ERROR (it never returns null); `total` is below MaxAllocSize (checked above), and
        // set_varsize_4b writes the 4-byte header inside that allocation.
        let ptr = unsafe {
            let p = pg_sys::palloc0(total) as *mut pg_sys::varlena;
            pgrx::set_varsize_4b(p, total as i32);
            std::ptr::NonNull::new_unchecked(p)
        };
        Ok(PallocBytea { ptr, len })
    }

    /// The payload, borrowed for as long as `self` is.
    fn data_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocation holds VARHDRSZ + len initialised (zeroed) bytes (new), lives as
        // long as the memory context, which outlives `self` (new's contract), and is reachable
        // only through `self`, so the `&mut self` borrow makes this the only reference; no other
        // thread sees it (the type is neither Send nor Sync).
        unsafe { std::slice::from_raw_parts_mut((self.ptr.as_ptr() as *mut u8).add(pg_sys::VARHDRSZ), self.len) }
    }
}

// SAFETY: the pointer is a complete, palloc'd varlena, which is exactly a bytea Datum, and it
// lives in the call's memory context (PallocBytea::new's contract).
unsafe impl pgrx::callconv::BoxRet for PallocBytea {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut pgrx::callconv::FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        // SAFETY: returning a valid pointer Datum allocated in the call's memory context.
        unsafe { fcinfo.return_raw_datum(pg_sys::Datum::from(self.ptr.as_ptr())) }
    }
}

/// Reads `length` bytes at `offset`.
#[pg_extern(volatile, parallel_safe)]
fn read_segment(name: &str, offset: i64, length: i32) -> PallocBytea {
    with_executor(|ex| {
        let (seg, info) = resolve(name, "read")?;
        crate::segment::check_range(&info, offset, length as i64)?;
        // SAFETY: `out` is returned from this call (or dropped with the error) right below.
        let mut out = unsafe { PallocBytea::new(length as usize)? };
        exec::read(ex, &seg, offset, out.data_mut())?;
        Ok(out)
    })
}

/// The checksum of `[offset, offset + length)` (see `checksum.rs` for its definition),
/// computed by a GPU kernel with the CUDA provider and by the CPU with the host provider
/// (interruptible between blocks there).
#[pg_extern(volatile, parallel_safe)]
fn checksum_segment(name: &str, offset: i64, length: i64) -> i64 {
    with_executor(|ex| exec::checksum(ex, &resolve(name, "read")?.0, offset, length)) as i64
}

/// Fills `[offset, offset + length)` with the pattern of `checksum.rs::fill` (a function of
/// `seed` and the position), with a GPU kernel under the CUDA provider, else on the CPU. Returns
/// the bytes written.
#[pg_extern(volatile, parallel_unsafe)]
fn fill_segment(name: &str, offset: i64, length: i64, seed: i64) -> i64 {
    with_executor(|ex| exec::fill(ex, &resolve(name, "write")?.0, offset, length, seed));
    length
}

/// Moves the chunks covering `[offset, offset + length)` to `tier`: 'host', 'device' (any GPU:
/// chunks already on one stay, the others go where they fit) or 'device:N' (GPU N). Returns the
/// bytes moved.
#[pg_extern(volatile, parallel_unsafe)]
fn prefetch_segment(name: &str, offset: i64, length: i64, tier: &str) -> i64 {
    let target = parse_tier(tier);
    let pin_wait = crate::guc::PIN_WAIT_TIMEOUT_MS.get().max(0) as u64;
    with_executor(|ex| exec::prefetch(ex, &resolve(name, "migrate")?.0, offset, length, target, pin_wait)) as i64
}

/// Holds a pin on `name` until `unpin_segment` or the end of the session: the segment cannot
/// be dropped (or, with the CUDA provider, migrated) meanwhile.
#[pg_extern(volatile, parallel_unsafe)]
fn pin_segment(name: &str) {
    crate::registry::check_not_reserved(name).unwrap_or_else(|e| report(e));
    with_segments(|s| s.pin_session(name, |o| crate::runtime::authorize(o, name, "pin")))
}

/// Releases one pin taken by this session with `pin_segment`; false if it held none.
#[pg_extern(volatile, parallel_unsafe)]
fn unpin_segment(name: &str) -> bool {
    crate::registry::check_not_reserved(name).unwrap_or_else(|e| report(e));
    with_segments(|s| s.unpin_session(name))
}

/// Maps segment `name` in this process now rather than at first use. Returns the milliseconds
/// spent mapping (0 when the mapping was already current).
#[pg_extern(volatile, parallel_safe)]
fn attach_segment(name: &str) -> f64 {
    crate::registry::check_not_reserved(name).unwrap_or_else(|e| report(e));
    with_segments(|s| Ok(s.pin(name, |o| crate::runtime::authorize(o, name, "read"))?.map_ms()))
}

/// The execution mode, the provider and its capabilities, as (property, value) rows.
#[pg_extern(volatile, parallel_safe)]
fn device_info() -> TableIterator<'static, (name!(property, String), name!(value, String))> {
    let mut head = crate::runtime::execution_report().unwrap_or_else(|e| report(e));
    let mut rows = with_executor(exec::info);
    let reg = crate::registry::shmem::shared().unwrap_or_else(|e| report(e));
    let arena = reg.arena();
    let mut tail = vec![
        ("broker_pid".to_string(), reg.broker_pid().to_string()),
        ("epoch".into(), format!("{:016x}", reg.epoch())),
        ("arena_base".into(), format!("0x{:x}", arena.base)),
        ("arena_size".into(), arena.size.to_string()),
        ("device_bytes".into(), reg.tier_bytes(Tier::Device).to_string()),
        ("host_bytes".into(), reg.tier_bytes(Tier::Host).to_string()),
        ("host_pool_bytes".into(), reg.pool_bytes().to_string()),
        ("gpus".into(), reg.devices().to_string()),
    ];
    // Each GPU's committed bytes (the device budget applies to each on its own), and the
    // requests the service routed to it.
    for n in 0..reg.devices() {
        tail.push((format!("gpu{n}_bytes"), reg.gpu_bytes(n).to_string()));
        tail.push((format!("gpu{n}_requests"), crate::runtime::routed_to(n).to_string()));
    }
    // provider, tiers, granularity, gpu_kernels first (as before), then the registry's rows,
    // then the provider's details and the last migration.
    let split = rows.len().min(4);
    let details = rows.split_off(split);
    head.extend(rows);
    head.extend(tail);
    head.extend(details);
    TableIterator::new(head)
}

/// Benchmark: GB/s of a GPU kernel reading all of segment `name`, where kernels run.
#[pg_extern(volatile, parallel_unsafe)]
fn bench_segment_read(name: &str, iterations: i32) -> f64 {
    with_executor(|ex| exec::bench_segment_read(ex, &resolve(name, "read")?.0, iterations))
}

/// Benchmark baseline: GB/s of the same kernel over a private `cuMemAlloc` buffer holding
/// the `fill_segment` pattern of `seed` (compare with a segment filled the same way).
#[pg_extern(volatile, parallel_unsafe)]
fn bench_private_read(bytes: i64, iterations: i32, seed: default!(i64, 1)) -> f64 {
    with_executor(|ex| exec::bench_private_read(ex, bytes, iterations, seed))
}

/// Benchmark baseline: `cuMemcpy` GB/s between pinned host and device memory, both ways.
#[pg_extern(volatile, parallel_unsafe)]
fn bench_copy_ceiling(bytes: i64, iterations: i32) -> TableIterator<'static, (name!(direction, String), name!(gbps, f64))> {
    let (htod, dtoh) = with_executor(|ex| exec::bench_copy_ceiling(ex, bytes, iterations));
    TableIterator::new(vec![("htod".to_string(), htod), ("dtoh".to_string(), dtoh)])
}

/// Benchmark: keys per second of the GpuJoin probe kernel alone (no scan, no staging copy) over
/// `keys` pseudo-random int8 keys in `[0, key_range)`, against the table in segment `name`.
#[pg_extern(volatile, parallel_unsafe)]
fn bench_join_probe(name: &str, keys: i64, key_range: i64) -> f64 {
    with_executor(|ex| exec::bench_join_probe(ex, &resolve(name, "read")?.0, keys, key_range))
}

/// Benchmark baseline: milliseconds to `cuMemHostRegister` a populated /dev/shm mapping.
#[pg_extern(volatile, parallel_unsafe)]
fn bench_host_register(bytes: i64) -> f64 {
    with_executor(|ex| exec::bench_host_register(ex, bytes))
}

/// Benchmark: `requests` empty requests in a row to wherever this cluster runs its work (the
/// GPU service, or this process), timed one by one: the median and 99th percentile round trip
/// in microseconds.
#[pg_extern(volatile, parallel_unsafe)]
fn bench_roundtrip(requests: i32) -> TableIterator<'static, (name!(median_us, f64), name!(p99_us, f64))> {
    if !(1..=10_000_000).contains(&requests) {
        report(UvmError::new(Code::InvalidParameterValue, format!("requests must be between 1 and 10000000, not {requests}")));
    }
    let mut us = with_executor(|ex| {
        let mut v = Vec::with_capacity(requests as usize);
        for i in 0..requests {
            let t = std::time::Instant::now();
            exec::ping(ex)?;
            v.push(t.elapsed().as_secs_f64() * 1e6);
            crate::interrupt::check_every(i as u64)?;
        }
        Ok(v)
    });
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
    TableIterator::new(vec![(at(0.5), at(0.99))])
}

/// Every segment and attachment, read from the registry alone: the views work even where no
/// provider can be set up (they need no mapping).
fn registry_snapshot() -> (Vec<crate::registry::SegmentInfo>, Vec<crate::registry::AttachInfo>) {
    let reg = crate::registry::shmem::shared().unwrap_or_else(|e| report(e));
    (reg.segments(), reg.attachments())
}

/// Rows of the `uvm.segments` view.
// pgrx spells a set-returning function's row type inline, one `name!` per column.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
fn segments_internal() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(id, i64),
        name!(owner_oid, pg_sys::Oid),
        name!(size, i64),
        name!(max_size, i64),
        name!(device_bytes, i64),
        name!(gpu_bytes, Vec<i64>),
        name!(host_bytes, i64),
        name!(chunks, i32),
        name!(generation, i64),
        name!(attached_processes, i32),
        name!(created_at, TimestampWithTimeZone),
    ),
> {
    let (segs, atts) = registry_snapshot();
    let devices = crate::registry::shmem::shared().unwrap_or_else(|e| report(e)).devices();
    let rows: Vec<_> = segs
        .into_iter()
        .map(|i| {
            let gpu_bytes = i.bytes_per_gpu(devices).into_iter().map(|b| b as i64).collect();
            let attached = atts.iter().filter(|a| a.segment_id == i.id).count() as i32;
            (
                i.name.clone(),
                i.id as i64,
                pg_sys::Oid::from(i.owner),
                i.size as i64,
                i.max_size as i64,
                i.bytes_in(Tier::Device) as i64,
                gpu_bytes,
                i.bytes_in(Tier::Host) as i64,
                i.chunks.len() as i32,
                i.generation as i64,
                attached,
                TimestampWithTimeZone::try_from(i.created_at)
                    .unwrap_or_else(|_| report(UvmError::new(Code::SystemError, "bad timestamp"))),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// Rows of the `uvm.attachments` view.
#[pg_extern(volatile, parallel_safe)]
fn attachments_internal() -> TableIterator<
    'static,
    (
        name!(pid, i32),
        name!(segment, String),
        name!(base_address, String),
        name!(same_address, bool),
        name!(mapped_generation, i64),
        name!(pins, i32),
    ),
> {
    let (segs, atts) = registry_snapshot();
    let rows: Vec<_> = atts
        .into_iter()
        .map(|a| {
            let name = segs.iter().find(|s| s.id == a.segment_id).map(|s| s.name.clone()).unwrap_or_default();
            (a.pid, name, format!("0x{:x}", a.base), a.same_address, a.mapped_generation as i64, a.pins as i32)
        })
        .collect();
    TableIterator::new(rows)
}

pgrx::extension_sql!(
    r#"
GRANT USAGE ON SCHEMA @extschema@ TO PUBLIC;

CREATE VIEW segments AS
SELECT s.name, s.id, pg_get_userbyid(s.owner_oid) AS owner, s.size, s.max_size,
       s.device_bytes, s.gpu_bytes, s.host_bytes, s.chunks, s.generation, s.attached_processes, s.created_at
  FROM segments_internal() s;
COMMENT ON VIEW segments IS 'Shared segments of the cluster: size, bytes per tier and per GPU (gpu_bytes[n + 1] is GPU n), chunks, generation, attached processes.';

CREATE VIEW attachments AS
SELECT a.pid, a.segment, a.base_address, a.same_address, a.mapped_generation, a.pins
  FROM attachments_internal() a;
COMMENT ON VIEW attachments IS 'Which process maps which segment, at which address and generation, holding how many pins.';

GRANT SELECT ON segments, attachments TO PUBLIC;

REVOKE EXECUTE ON FUNCTION create_segment(text, bigint, bigint, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION drop_segment(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION grow_segment(text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION write_segment(text, bigint, bytea) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fill_segment(text, bigint, bigint, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION prefetch_segment(text, bigint, bigint, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION bench_segment_read(text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION bench_private_read(bigint, integer, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION bench_copy_ceiling(bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION bench_host_register(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION bench_join_probe(text, bigint, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION bench_roundtrip(integer) FROM PUBLIC;
"#,
    name = "views_and_privileges",
    finalize
);
