//! The C API (`include/pg_uvm_share.h`): shared segments and GPU work for extensions written
//! in C, through a versioned function table.
//!
//! # Design
//!
//! `_PG_init` (in the postmaster) stores the address of [`API`], a `repr(C)` table of
//! `extern "C-unwind"` functions, in the rendezvous variable `pg_uvm_share_api`; every process
//! forked from the postmaster inherits it, and the header's accessor checks the table's ABI
//! major version and size before handing it out. The table is append-only within a major
//! version (`abi_version`, `struct_size` first), so a consumer built against an older header
//! keeps working with a newer library, and one built against another major gets an ERROR.
//!
//! Each function is a thin shell over what the SQL functions call: names are resolved and
//! authorized against the owner role ([`crate::runtime::resolve`]), and the work goes to the
//! cluster's executor ([`crate::runtime::with_executor`]: this process, or the GPU service), so the C
//! surface has the SQL surface's semantics and SQLSTATEs, and no branch on the mode or the GPU.
//! Errors are raised with `ereport(ERROR)`: the `#[pg_guard]` on each function turns the Rust
//! error into PostgreSQL's longjmp at the boundary, after Rust has unwound its own frames.
//!
//! # Handles, not pointers
//!
//! Pins and launches are handed out as 64-bit handles: this process's id in the high bits, a
//! counter that never repeats in the low bits. Every call looks its handle up in this process's
//! table first, so a handle that was released, forged, or taken in another process is an
//! ERROR (22023), never a dangling pointer. What a `UvmPin` points to (its chunk table) lives in
//! the table's entry, as long as the pin.
//!
//! # Resource owners
//!
//! A pin or launch belongs to `CurrentResourceOwner` when it is made (a consumer that wants a
//! pin for the whole transaction takes it under `CurTransactionResourceOwner`). One resource
//! release callback, registered in `_PG_init`, runs for every owner PostgreSQL releases, with
//! `CurrentResourceOwner` set to that owner: in the `BEFORE_LOCKS` phase (where buffer pins
//! go, because other backends can see them) it releases the owner's pins and gives up its
//! launches. After an ERROR that is the cleanup; at commit, a pin still held is a leak in the
//! consumer, reported with a WARNING, as PostgreSQL reports a leaked buffer pin.
//!
//! # Threads
//!
//! Every function must be called on the main thread of a PostgreSQL process: they raise
//! ERRORs and take LWLocks. A call from any other thread is a bug in the consumer that no
//! ERROR could report safely; it aborts the process with a message on stderr.
//!
//! # Lifecycle
//!
//! published by `_PG_init` → looked up by the consumer (`pg_uvm_share_api()`) → pins and
//! launches made and released per resource owner → at process exit, what a FATAL error left
//! behind goes with the segment manager's exit callback (registry pins) and with the process.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, c_void, CStr};

use pgrx::pg_sys;

use crate::error::{Code, Result, UvmError};
use crate::exec::kernel::{Arg, Launch};
use crate::exec::{self, Mode, Pending, SegRef};
use crate::gpu::user::{Shape, Source};
use crate::registry::{SegmentInfo, Tier, TierPref};
use crate::runtime::{self, report, PgEnv};
use crate::segment::Pin;
use crate::uvm_err;

/// The ABI major version (`PG_UVM_SHARE_ABI_MAJOR`) and minor version of this library.
pub const ABI_MAJOR: u32 = 1;
pub const ABI_MINOR: u32 = 1;

/// `UvmSegmentInfo`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UvmSegmentInfo {
    pub id: u64,
    pub size: u64,
    pub max_size: u64,
    pub generation: u64,
    pub host_bytes: u64,
    pub device_bytes: u64,
    pub owner: u32,
    pub nchunks: u32,
}

/// `UvmChunk`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UvmChunk {
    pub offset: u64,
    pub size: u64,
    pub tier: u32,
    pub cpu_mapped: u32,
}

/// `UvmPin`.
#[repr(C)]
pub struct UvmPin {
    pub handle: u64,
    pub info: UvmSegmentInfo,
    pub base: *mut c_void,
    pub same_address: bool,
    pub chunks: *const UvmChunk,
}

/// `UvmCacheColumn`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UvmCacheColumn {
    pub attnum: i16,
    pub encoding: u16,
    pub width: u16,
    pub scale: i16,
    pub values_at: u64,
    pub nulls_at: u64,
    pub dictionary: u64,
}

/// `UvmCache`.
#[repr(C)]
pub struct UvmCache {
    pub pin: UvmPin,
    pub rows: u64,
    pub blocks: u64,
    pub block_rows: u64,
    pub block_bytes: u64,
    pub data_offset: u64,
    pub block_header_bytes: u64,
    pub ncolumns: u32,
    pub columns: *const UvmCacheColumn,
}

/// `UvmKernel`.
#[repr(C)]
pub struct UvmKernel {
    pub source: *const c_char,
    pub source_len: u32,
    pub is_ptx: u32,
    pub entry: *const c_char,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
}

/// `UvmKernelArg`.
#[repr(C)]
pub struct UvmKernelArg {
    pub kind: u32,
    pub size: u32,
    pub value: u64,
    pub pin: u64,
}

const ARG_SCALAR: u32 = 1;
const ARG_SEGMENT: u32 = 2;

type CStrArg = *const c_char;

/// `PgUvmShareApi`: the order and types of the members are the ABI.
#[repr(C)]
pub struct PgUvmShareApi {
    pub abi_version: u32,
    pub struct_size: u32,
    pub library_version: *const c_char,
    pub execution_mode: unsafe extern "C-unwind" fn() -> *const c_char,
    pub lookup: unsafe extern "C-unwind" fn(CStrArg, *mut UvmSegmentInfo) -> bool,
    pub create: unsafe extern "C-unwind" fn(CStrArg, i64, i64, CStrArg) -> u64,
    pub drop: unsafe extern "C-unwind" fn(CStrArg),
    pub grow: unsafe extern "C-unwind" fn(CStrArg, i64) -> i64,
    pub attach: unsafe extern "C-unwind" fn(CStrArg, *mut UvmSegmentInfo),
    pub pin: unsafe extern "C-unwind" fn(CStrArg, *const UvmSegmentInfo, *mut UvmPin),
    pub unpin: unsafe extern "C-unwind" fn(u64),
    pub read: unsafe extern "C-unwind" fn(u64, i64, *mut c_void, i64),
    pub write: unsafe extern "C-unwind" fn(u64, i64, *const c_void, i64),
    pub device_address: unsafe extern "C-unwind" fn(u64, i64, i64) -> u64,
    pub launch: unsafe extern "C-unwind" fn(*const UvmKernel, *const UvmKernelArg, c_int),
    pub launch_start: unsafe extern "C-unwind" fn(*const UvmKernel, *const UvmKernelArg, c_int) -> u64,
    pub launch_wait: unsafe extern "C-unwind" fn(u64),
    // 1.1
    pub cache_pin: unsafe extern "C-unwind" fn(pg_sys::Oid, pg_sys::Snapshot, *mut UvmCache) -> bool,
}

/// A `Sync` wrapper: the table holds a pointer to a static string, which C only reads.
struct Table(PgUvmShareApi);
// SAFETY: immutable after construction; its only pointer is to a static, NUL-terminated string.
unsafe impl Sync for Table {}

static API: Table = Table(PgUvmShareApi {
    abi_version: (ABI_MAJOR << 16) | ABI_MINOR,
    struct_size: std::mem::size_of::<PgUvmShareApi>() as u32,
    library_version: concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char,
    execution_mode: api_execution_mode,
    lookup: api_lookup,
    create: api_create,
    drop: api_drop,
    grow: api_grow,
    attach: api_attach,
    pin: api_pin,
    unpin: api_unpin,
    read: api_read,
    write: api_write,
    device_address: api_device_address,
    launch: api_launch,
    launch_start: api_launch_start,
    launch_wait: api_launch_wait,
    cache_pin: api_cache_pin,
});

/// Publishes the table and registers the resource release callback (from `_PG_init`, in the
/// postmaster: every child inherits both).
pub fn publish() {
    // SAFETY: find_rendezvous_variable returns the address of a pointer-sized slot that lives
    // for the process (in TopMemoryContext); we store a pointer to a static in it. The callback
    // is a pg_guard'ed C-unwind function that lives as long as the library.
    unsafe {
        let slot = pg_sys::find_rendezvous_variable(c"pg_uvm_share_api".as_ptr());
        *slot = &API.0 as *const PgUvmShareApi as *mut c_void;
        pg_sys::RegisterResourceReleaseCallback(Some(release), std::ptr::null_mut());
    }
}

/// A pin held for C: the segment manager's pin, the chunk table `UvmPin::chunks` points to,
/// and its resource owner.
struct HeldPin {
    handle: u64,
    owner: usize,
    seg: SegRef,
    pin: Pin<PgEnv>,
    /// What the caller's `UvmPin::chunks` points to: kept, never read here.
    _chunks: Box<[UvmChunk]>,
    /// What a cache pin's `UvmCache::columns` points to (empty for other pins): kept, never
    /// read here.
    _columns: Box<[UvmCacheColumn]>,
}

/// A launch in flight for C.
struct HeldLaunch {
    handle: u64,
    owner: usize,
    pending: Pending<exec::request::Launched>,
}

thread_local! {
    static PINS: RefCell<Vec<HeldPin>> = const { RefCell::new(Vec::new()) };
    static LAUNCHES: RefCell<Vec<HeldLaunch>> = const { RefCell::new(Vec::new()) };
    static NEXT_HANDLE: Cell<u64> = const { Cell::new(1) };
}

/// A new handle: this process's id above a counter that never repeats in the process.
fn new_handle() -> u64 {
    let n = NEXT_HANDLE.with(|c| {
        let n = c.get();
        c.set(n + 1);
        n
    });
    // SAFETY: MyProcPid is set at process start.
    let pid = unsafe { pg_sys::MyProcPid } as u64 & 0xff_ffff;
    (pid << 40) | (n & ((1 << 40) - 1))
}

fn bad_handle(what: &str, h: u64) -> UvmError {
    uvm_err!(Code::InvalidParameterValue, "{what} handle {h} is not held by this process")
        .detail("It was released (by the caller, or by its resource owner at the end of a statement, transaction or ERROR), or taken in another process.")
}

/// Aborts on a call from a thread other than the process's main thread (see the module
/// documentation): no ERROR can be raised there.
fn main_thread_only() {
    // SAFETY: plain system calls without memory arguments.
    if unsafe { libc::gettid() != libc::getpid() } {
        eprintln!("pg_uvm_share: a C API function was called outside PostgreSQL's main thread; aborting");
        std::process::abort();
    }
}

fn current_owner() -> Result<usize> {
    // SAFETY: a global PostgreSQL maintains; read on the main thread.
    let owner = unsafe { pg_sys::CurrentResourceOwner } as usize;
    if owner == 0 {
        return Err(UvmError::new(Code::ObjectNotInPrerequisiteState, "pg_uvm_share pins and launches need a resource owner")
            .hint("Call it inside a transaction."));
    }
    Ok(owner)
}

/// Runs `f` on the main thread, raising its error as an ERROR.
fn guarded<R>(f: impl FnOnce() -> Result<R>) -> R {
    main_thread_only();
    f().unwrap_or_else(|e| report(e))
}

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that lives for `'a`.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(uvm_err!(Code::NullValueNotAllowed, "{what} must not be NULL"));
    }
    // SAFETY: NUL-terminated (the caller's contract).
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| uvm_err!(Code::InvalidParameterValue, "{what} is not valid UTF-8"))
}

fn info_of(i: &SegmentInfo) -> UvmSegmentInfo {
    UvmSegmentInfo {
        id: i.id,
        size: i.size,
        max_size: i.max_size,
        generation: i.generation,
        host_bytes: i.bytes_in(Tier::Host),
        device_bytes: i.bytes_in(Tier::Device),
        owner: i.owner,
        nchunks: i.chunks.len() as u32,
    }
}

/// Writes `v` through an out-pointer argument.
///
/// # Safety
/// `p` is NULL or valid for a write of `T`.
unsafe fn out<T>(p: *mut T, v: T, what: &str) -> Result<()> {
    if p.is_null() {
        return Err(uvm_err!(Code::NullValueNotAllowed, "{what} must not be NULL"));
    }
    // SAFETY: non-NULL, valid for writes (contract); `write` does not drop the old contents,
    // which may be uninitialised.
    unsafe { p.write(v) };
    Ok(())
}

/// (segment reference, pinned size) of the pin `h`.
fn pinned(h: u64) -> Result<(SegRef, u64)> {
    PINS.with(|p| p.borrow().iter().find(|x| x.handle == h).map(|x| (x.seg, x.pin.info().size)))
        .ok_or_else(|| bad_handle("pin", h))
}

/// Checks `[offset, offset + len)` against a pinned size (2202E outside, 22023 negative).
fn check_pinned(size: u64, offset: i64, len: i64) -> Result<()> {
    if offset < 0 || len < 0 {
        return Err(uvm_err!(Code::InvalidParameterValue, "offset and length must not be negative: {offset}, {len}"));
    }
    if (offset as u64).checked_add(len as u64).is_none_or(|end| end > size) {
        return Err(uvm_err!(
            Code::OutOfRange,
            "range [{offset}, {offset} + {len}) lies outside the {size} bytes the pin covers"
        ));
    }
    Ok(())
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_execution_mode() -> *const c_char {
    guarded(|| {
        Ok(match runtime::execution_mode()? {
            Mode::Service => c"service".as_ptr(),
            _ => c"process".as_ptr(),
        })
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_lookup(name: *const c_char, info: *mut UvmSegmentInfo) -> bool {
    guarded(|| {
        // SAFETY: the header's contract: a NUL-terminated name.
        let name = unsafe { text(name, "name") }?;
        match runtime::resolve(name, "look up") {
            Ok((_, i)) => {
                if !info.is_null() {
                    // SAFETY: non-NULL: the caller's UvmSegmentInfo.
                    unsafe { out(info, info_of(&i), "info") }?;
                }
                Ok(true)
            }
            Err(e) if e.code == Code::UndefinedObject => Ok(false),
            Err(e) => Err(e),
        }
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_create(name: *const c_char, size: i64, max_size: i64, tier: *const c_char) -> u64 {
    guarded(|| {
        // SAFETY: the header's contract: NUL-terminated strings (tier may be NULL: auto).
        let name = unsafe { text(name, "name") }?;
        let pref = if tier.is_null() {
            TierPref::Auto
        } else {
            // SAFETY: as above.
            TierPref::parse(unsafe { text(tier, "tier") }?)?
        };
        let max = (max_size >= 0).then_some(max_size);
        crate::registry::check_not_reserved(name)?;
        runtime::try_executor(|ex| exec::create(ex, name, size, max, pref, runtime::current_user(), runtime::now()))
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_drop(name: *const c_char) {
    guarded(|| {
        // SAFETY: the header's contract.
        let name = unsafe { text(name, "name") }?;
        let (seg, _) = runtime::resolve(name, "drop")?;
        runtime::try_executor(|ex| exec::drop(ex, &seg))?;
        runtime::if_segments(|s| s.detach_dropped());
        Ok(())
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_grow(name: *const c_char, new_size: i64) -> i64 {
    guarded(|| {
        // SAFETY: the header's contract.
        let name = unsafe { text(name, "name") }?;
        let (seg, _) = runtime::resolve(name, "grow")?;
        runtime::try_executor(|ex| exec::grow(ex, &seg, new_size)).map(|s| s as i64)
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_attach(name: *const c_char, info: *mut UvmSegmentInfo) {
    guarded(|| {
        // SAFETY: the header's contract.
        let name = unsafe { text(name, "name") }?;
        crate::registry::check_not_reserved(name)?;
        // A pin maps what this process lacks (nothing in service mode); dropping it keeps the
        // mapping and gives the pin back.
        let i = runtime::try_with_segments(|s| {
            s.pin(name, |owner| runtime::authorize(owner, name, "attach")).map(|p| info_of(p.info()))
        })?;
        if !info.is_null() {
            // SAFETY: non-NULL: the caller's UvmSegmentInfo.
            unsafe { out(info, i, "info") }?;
        }
        Ok(())
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_pin(name: *const c_char, expect: *const UvmSegmentInfo, result: *mut UvmPin) {
    guarded(|| {
        // SAFETY: the header's contract.
        let name = unsafe { text(name, "name") }?;
        if result.is_null() {
            return Err(UvmError::new(Code::NullValueNotAllowed, "the UvmPin to fill in must not be NULL"));
        }
        crate::registry::check_not_reserved(name)?;
        let owner = current_owner()?;
        let mapped = runtime::maps_segment_memory()?;
        let pin = runtime::try_with_segments(|s| s.pin(name, |o| runtime::authorize(o, name, "pin")))?;
        let i = pin.info();
        if !expect.is_null() {
            // SAFETY: non-NULL: the caller's UvmSegmentInfo, read only.
            let e = unsafe { &*expect };
            if e.id != i.id {
                return Err(uvm_err!(Code::UndefinedObject, "segment \"{name}\" was dropped and created again")
                    .detail(format!("The caller expected id {}, the segment of that name now has id {}.", e.id, i.id)));
            }
            if e.generation != 0 && e.generation != i.generation {
                return Err(uvm_err!(
                    Code::ObjectNotInPrerequisiteState,
                    "segment \"{name}\" changed since the caller looked at it: generation {} instead of {}",
                    i.generation,
                    e.generation
                )
                .hint("Look it up again (its chunks grew or moved), then pin it."));
            }
        }
        let (filled, held) = hold(name, pin, owner, mapped, Box::new([]))?;
        // SAFETY: non-NULL (checked): the caller's UvmPin.
        unsafe { out(result, filled, "pin") }?;
        PINS.with(|p| p.borrow_mut().push(held));
        Ok(())
    })
}

/// The `UvmPin` of segment `name`'s `pin`, and the entry that holds it for `owner` (with
/// `columns`, what a cache pin's `UvmCache::columns` points to).
fn hold(name: &str, pin: Pin<PgEnv>, owner: usize, mapped: bool, columns: Box<[UvmCacheColumn]>) -> Result<(UvmPin, HeldPin)> {
    let i = pin.info();
    let chunks: Box<[UvmChunk]> = i
        .chunks
        .iter()
        .map(|c| UvmChunk { offset: c.offset, size: c.size, tier: c.tier as u32, cpu_mapped: pin.cpu_mapped(c.tier) as u32 })
        .collect();
    // Service mode: this process maps the host tier only (`crate::provider::remote`).
    let base = if mapped || chunks.iter().any(|c| c.cpu_mapped != 0) { pin.base() as *mut c_void } else { std::ptr::null_mut() };
    let filled = UvmPin {
        handle: new_handle(),
        info: info_of(i),
        base,
        same_address: i.base_hint != 0 && pin.base() as u64 == i.base_hint,
        chunks: chunks.as_ptr(),
    };
    let (handle, seg) = (filled.handle, SegRef::new(name, i.id)?);
    Ok((filled, HeldPin { handle, owner, seg, pin, _chunks: chunks, _columns: columns }))
}

/// Pins a segment of a cache (the extension's own, in the reserved namespace: the caller was
/// authorized for the table) as `expect`: the same id.
fn pin_own(seg: &SegRef) -> Result<Pin<PgEnv>> {
    let pin = runtime::try_with_segments(|s| s.pin(seg.name(), |_| Ok(())))?;
    if pin.info().id != seg.id {
        return Err(uvm_err!(Code::UndefinedObject, "segment \"{}\" was dropped and created again", seg.name()));
    }
    Ok(pin)
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_cache_pin(relid: pg_sys::Oid, snapshot: pg_sys::Snapshot, result: *mut UvmCache) -> bool {
    guarded(|| {
        if result.is_null() {
            return Err(UvmError::new(Code::NullValueNotAllowed, "the UvmCache to fill in must not be NULL"));
        }
        let owner = current_owner()?;
        let mapped = runtime::maps_segment_memory()?;
        let Some(cache) = crate::caches::usable_for(relid, snapshot)? else { return Ok(false) };
        // Pinned, the segment stays; a drop or a rebuild that came first means the heap.
        let pin = match pin_own(&cache.seg) {
            Ok(p) => p,
            Err(e) if e.code == Code::UndefinedObject => return Ok(false),
            Err(e) => return Err(e),
        };
        if !cache.still_ready() {
            return Ok(false);
        }
        // The dictionaries' pins first (an ERROR meanwhile: the resource owner releases them);
        // the cache's own pin is published last, with everything.
        let mut columns = Vec::new();
        for (col, c) in cache.layout.columns().iter().enumerate() {
            let mut dictionary = 0;
            if cache.layout.encoding(col) == Some(crate::cache::Encoding::DictCode) {
                let seg = cache.dictionary(col)?;
                let p = pin_own(&seg)?;
                let (_, held) = hold(seg.name(), p, owner, mapped, Box::new([]))?;
                dictionary = held.handle;
                PINS.with(|p| p.borrow_mut().push(held));
            }
            columns.push(UvmCacheColumn {
                attnum: c.attnum,
                encoding: c.encoding,
                width: c.width,
                scale: c.scale,
                values_at: c.values_at,
                nulls_at: c.nulls_at,
                dictionary,
            });
        }
        let columns: Box<[UvmCacheColumn]> = columns.into_boxed_slice();
        let h = cache.layout.header();
        let (ptr, n) = (columns.as_ptr(), columns.len() as u32);
        let (filled, held) = hold(cache.seg.name(), pin, owner, mapped, columns)?;
        let c = UvmCache {
            pin: filled,
            rows: h.rows,
            blocks: h.blocks,
            block_rows: h.block_rows,
            block_bytes: h.block_bytes,
            data_offset: h.data_offset,
            block_header_bytes: crate::cache::BLOCK_HEADER_BYTES,
            ncolumns: n,
            columns: ptr,
        };
        // SAFETY: non-NULL (checked): the caller's UvmCache.
        unsafe { out(result, c, "cache") }?;
        PINS.with(|p| p.borrow_mut().push(held));
        Ok(true)
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_unpin(h: u64) {
    guarded(|| {
        let held = PINS.with(|p| {
            let mut p = p.borrow_mut();
            p.iter().position(|x| x.handle == h).map(|i| p.swap_remove(i))
        });
        drop(held.ok_or_else(|| bad_handle("pin", h))?); // gives the pin back
        Ok(())
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_read(h: u64, offset: i64, dst: *mut c_void, len: i64) {
    guarded(|| {
        let (seg, size) = pinned(h)?;
        check_pinned(size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(UvmError::new(Code::NullValueNotAllowed, "the destination must not be NULL"));
        }
        // SAFETY: the caller's buffer of `len` bytes (the header's contract), not aliased while
        // this runs (single-threaded).
        let buf = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len as usize) };
        runtime::try_executor(|ex| exec::read(ex, &seg, offset, buf))
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_write(h: u64, offset: i64, src: *const c_void, len: i64) {
    guarded(|| {
        let (seg, size) = pinned(h)?;
        check_pinned(size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if src.is_null() {
            return Err(UvmError::new(Code::NullValueNotAllowed, "the source must not be NULL"));
        }
        // SAFETY: the caller's buffer of `len` bytes (the header's contract).
        let data = unsafe { std::slice::from_raw_parts(src as *const u8, len as usize) };
        runtime::try_executor(|ex| exec::write(ex, &seg, offset, data))
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_device_address(h: u64, offset: i64, len: i64) -> u64 {
    guarded(|| {
        let (_, size) = pinned(h)?;
        check_pinned(size, offset, len)?;
        runtime::check_device_addresses()?;
        PINS.with(|p| p.borrow().iter().find(|x| x.handle == h).map(|x| x.pin.addr(offset, len)))
            .ok_or_else(|| bad_handle("pin", h))?
    })
}

/// The launch a C caller describes.
///
/// # Safety
/// `k` and `args` are NULL or valid for reads (`args` of `nargs` elements), with the strings
/// the header describes.
unsafe fn launch_of(k: *const UvmKernel, args: *const UvmKernelArg, nargs: c_int) -> Result<Launch> {
    if k.is_null() {
        return Err(UvmError::new(Code::NullValueNotAllowed, "the kernel must not be NULL"));
    }
    // SAFETY: non-NULL: the caller's UvmKernel.
    let k = unsafe { &*k };
    if k.source.is_null() {
        return Err(UvmError::new(Code::NullValueNotAllowed, "the kernel's source must not be NULL"));
    }
    let code = if k.source_len == 0 {
        // SAFETY: a NUL-terminated source (the header's contract for source_len 0).
        unsafe { CStr::from_ptr(k.source) }.to_bytes().to_vec()
    } else {
        // SAFETY: `source_len` bytes at `source` (the header's contract).
        unsafe { std::slice::from_raw_parts(k.source as *const u8, k.source_len as usize) }.to_vec()
    };
    // SAFETY: the header's contract.
    let entry = unsafe { text(k.entry, "the kernel's entry") }?;
    let entry = std::ffi::CString::new(entry).expect("from a C string: no NUL inside");
    if !(0..=crate::gpu::user::MAX_PARAMS as c_int).contains(&nargs) {
        return Err(uvm_err!(
            Code::InvalidParameterValue,
            "a kernel takes 0 to {} arguments, not {nargs}",
            crate::gpu::user::MAX_PARAMS
        ));
    }
    if nargs > 0 && args.is_null() {
        return Err(UvmError::new(Code::NullValueNotAllowed, "the kernel's arguments must not be NULL"));
    }
    let given: &[UvmKernelArg] = if nargs == 0 {
        &[]
    } else {
        // SAFETY: `nargs` elements at `args` (the header's contract), checked non-NULL.
        unsafe { std::slice::from_raw_parts(args, nargs as usize) }
    };
    let mut segs: Vec<SegRef> = Vec::new();
    let mut list = Vec::with_capacity(given.len());
    for (i, a) in given.iter().enumerate() {
        list.push(match a.kind {
            ARG_SCALAR => Arg::Scalar { bits: a.value, size: a.size },
            ARG_SEGMENT => {
                let (seg, size) = pinned(a.pin)?;
                let offset = i64::try_from(a.value).ok().filter(|&o| o as u64 <= size).ok_or_else(|| {
                    uvm_err!(Code::OutOfRange, "kernel argument {i}: offset {} lies outside the {size} bytes pinned", a.value)
                })?;
                let at = match segs.iter().position(|s| s.id == seg.id) {
                    Some(at) => at,
                    None => {
                        segs.push(seg);
                        segs.len() - 1
                    }
                };
                Arg::Segment { seg: at, offset }
            }
            other => return Err(uvm_err!(Code::InvalidParameterValue, "kernel argument {i} is of unknown kind {other}")),
        });
    }
    Ok(Launch {
        source: Source { text: code, ptx: k.is_ptx != 0, entry },
        shape: Shape { grid: k.grid, block: k.block, shared_mem: k.shared_mem_bytes },
        segs,
        args: list,
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_launch(k: *const UvmKernel, args: *const UvmKernelArg, nargs: c_int) {
    guarded(|| {
        // SAFETY: the header's contract.
        let launch = unsafe { launch_of(k, args, nargs) }?;
        runtime::try_executor(|ex| exec::launch_start(ex, &launch)?.wait()).map(|_| ())
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_launch_start(k: *const UvmKernel, args: *const UvmKernelArg, nargs: c_int) -> u64 {
    guarded(|| {
        let owner = current_owner()?;
        // SAFETY: the header's contract.
        let launch = unsafe { launch_of(k, args, nargs) }?;
        let pending = runtime::try_executor(|ex| exec::launch_start(ex, &launch))?;
        let handle = new_handle();
        LAUNCHES.with(|l| l.borrow_mut().push(HeldLaunch { handle, owner, pending }));
        Ok(handle)
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn api_launch_wait(h: u64) {
    guarded(|| {
        let held = LAUNCHES.with(|l| {
            let mut l = l.borrow_mut();
            l.iter().position(|x| x.handle == h).map(|i| l.swap_remove(i))
        });
        held.ok_or_else(|| bad_handle("launch", h))?.pending.wait().map(|_| ())
    })
}

/// Releases the pins and gives up the launches of the resource owner being released (see the
/// module documentation); at commit, each is a leak the consumer made, reported with a WARNING.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn release(phase: pg_sys::ResourceReleasePhase::Type, commit: bool, _top: bool, _arg: *mut c_void) {
    if phase != pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_BEFORE_LOCKS {
        return;
    }
    // SAFETY: PostgreSQL sets CurrentResourceOwner to the owner it releases, on the main thread.
    let owner = unsafe { pg_sys::CurrentResourceOwner } as usize;
    // Taken out of the tables first, dropped after: a drop never runs with a table borrowed.
    let pins: Vec<HeldPin> = PINS.with(|p| match p.try_borrow_mut() {
        Ok(mut p) => take_owned(&mut p, |x| x.owner == owner),
        Err(_) => Vec::new(),
    });
    let launches: Vec<HeldLaunch> = LAUNCHES.with(|l| match l.try_borrow_mut() {
        Ok(mut l) => take_owned(&mut l, |x| x.owner == owner),
        Err(_) => Vec::new(),
    });
    for p in pins {
        if commit {
            pgrx::warning!(
                "pg_uvm_share: a pin on segment \"{}\" was not released; released at the end of its resource owner",
                p.seg.name()
            );
        }
        drop(p);
    }
    for l in launches {
        if commit {
            pgrx::warning!("pg_uvm_share: a kernel launch was never waited for; given up at the end of its resource owner");
        }
        drop(l); // an unwaited request is abandoned: the service finishes it, then frees its slot
    }
}

fn take_owned<T>(v: &mut Vec<T>, mine: impl Fn(&T) -> bool) -> Vec<T> {
    let (taken, kept): (Vec<T>, Vec<T>) = std::mem::take(v).into_iter().partition(|x| mine(x));
    *v = kept;
    taken
}

#[cfg(test)]
mod tests;
