//! The GPU of this process: driver loading, the primary context, and the kernels.
//!
//! # Design
//!
//! CUDA is touched only through `cudarc`'s raw driver and NVRTC bindings, loaded with `dlopen`
//! on first use: the extension builds without a CUDA toolkit, and on a machine without libcuda
//! nothing CUDA-related runs (`probe` checks for the library before any call, because a cudarc
//! call into a missing library panics; a too-old driver that lacks a symbol panics too, which
//! `probe` turns into an error).
//!
//! This module is the CUDA layer and nothing above it: it knows the device, the module of
//! `kernels/segment.cu` and how to launch its functions, never what the callers' data means.
//!
//! - `mod.rs`: the device, the process's primary context, copies, host registration.
//! - [`handles`]: one owner per kind of CUDA handle, released on drop.
//! - [`launch`]: typed launches. Each kernel's parameter list is a Rust struct declared once,
//!   in the `kernels!` table of [`segment`] (`kernels/segment.rs`, beside `segment.cu`), and
//!   checked against the source by a test; a launch with other arguments does not compile.
//! - [`kernels`]: NVRTC compilation, the disk cache, the loaded module with the buffers that
//!   launches share, and the segment-generic kernels (checksum, fill, zero, read bandwidth).
//! - [`user`]: kernels that callers hand in as text (the C API): compiled once per text, a module
//!   cache shared by the process's threads, launches with parameters as words.
//! - [`bench`]: baselines for the GPU benchmarks.
//!
//! GpuJoin's host code (staging its keys, the build, probe and materialize launches, decoding
//! their results, the grow-and-resume appender) is `crates/uvm_core/src/gpujoin/gpu.rs`, above this layer.
//!
//! # Lifecycle
//!
//! - The postmaster and the broker never call into CUDA: a process forked after `cuInit` cannot
//!   initialise CUDA itself (measured), and the broker only holds file descriptors.
//! - The first process that needs a provider calls [`gpu`]: `cuInit`, device 0, its primary
//!   context retained and made current, once per process; the times of `cuInit` and of the
//!   context creation are kept for `uvm.device_info()`. The context lives until the process
//!   exits. In service mode that process is the GPU service (at its start-up), and no other
//!   process calls [`gpu`]; in process mode, every backend or worker that touches a segment.
//! - A parallel worker that will need the GPU (the GpuJoin aggregates) may start all of this on a
//!   helper thread ([`warm_up_in_background`]) and go on scanning meanwhile: `cuInit`, the
//!   context and the module (about 0.3 s for one process, 0.6 s each for five starting at once:
//!   the driver serialises context creation) hide behind the scan as far as it lasts. The helper calls
//!   only CUDA, never PostgreSQL, runs with every signal blocked (PostgreSQL's handlers belong to
//!   the main thread), and is joined before the process exits. The context is made current on
//!   each thread that uses it ([`gpu`] does that).
//! - Kernels (`kernels/*.cu`) are compiled by NVRTC to a CUBIN for the device's architecture on
//!   first use, cached on disk (`pg_uvm_share_kernels/` in the data directory, keyed by a hash
//!   of the source, the NVRTC version and the architecture), so a new process loads them
//!   without compiling. Each thread that launches loads its own copy of the module with its own
//!   scratch buffers, and every launch, copy and memset goes to that thread's default stream
//!   ([`STREAM`]) and is waited for there: the GPU service's executor threads run concurrently.
//! - Every CUDA handle (the context's retain, the module, device and pinned buffers, host
//!   registrations) is owned by a value of [`handles`] that releases it when dropped; what the
//!   process keeps for its whole life sits in the `Gpu` static, and process exit releases it.

pub mod bench;
pub mod handles;
pub mod kernels;
pub mod launch;
#[path = "../../../../kernels/segment.rs"]
pub mod segment;
pub mod user;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;
use std::time::Instant;

use cudarc::driver::sys::{self, CUdevice, CUdevice_attribute, CUresult};

use crate::error::{Code, Result, UvmError};

pub use kernels::Kernels;

/// The oldest driver the extension runs on: every driver function it calls is in CUDA 12.0's
/// `cuda.h` (`scripts/check-cuda-symbols`, in `make lint`).
pub const MIN_DRIVER: i32 = 12000;
/// The first driver with shareable host-NUMA VMM memory (`CU_MEM_LOCATION_TYPE_HOST_NUMA` and
/// its device attributes), which the CUDA provider's host tier is made of.
pub const HOST_NUMA_DRIVER: i32 = 12020;

/// A driver version as CUDA writes it: 12020 -> "CUDA 12.2".
pub fn driver_name(v: i32) -> String {
    format!("CUDA {}.{}", v / 1000, (v % 1000) / 10)
}

/// What `probe` found out about device 0.
#[derive(Clone, Debug, Default)]
pub struct DeviceInfo {
    pub name: String,
    pub driver_version: i32,
    pub compute_capability: (i32, i32),
    pub sm_count: i32,
    pub vmm: bool,
    pub posix_fd: bool,
    pub host_numa_vmm: bool,
    /// The host NUMA node closest to the GPU (for host-tier chunks); -1 if unknown.
    pub host_numa_id: i32,
    pub mem_total: u64,
    pub nvrtc: Option<(i32, i32)>,
    pub cuinit_ms: f64,
    pub context_ms: f64,
}

/// The GPU of this process. Created once; lives until the process exits.
pub struct Gpu {
    pub info: DeviceInfo,
    pub device: CUdevice,
    /// The GPUs device chunks are placed on (`vocab::Place::Device(n)` is `placement[n]`):
    /// device 0 first, then as many others as `set_devices_wanted` asked for that can share
    /// VMM memory through POSIX fds and reach device 0 and be reached by it (peer access, over
    /// NVLink where the machine has it). Every mapping grants access to all of them.
    pub placement: Vec<CUdevice>,
    /// The retained primary contexts of `placement[1..]`, for threads bound to those GPUs
    /// ([`bind_thread`]): the GPU service's executors of GPU n run their kernels there.
    peer_contexts: Vec<handles::PrimaryContext>,
    /// The retained primary context (current on every thread that called [`gpu`]). Last, so
    /// that it would be dropped after the kernels' module and buffers made in it (the `Gpu`
    /// lives in a static and is never dropped: the process's exit releases the context).
    context: handles::PrimaryContext,
}

// SAFETY: what a `Gpu` holds is immutable after `probe` (the device info, the device ordinal
// and the retained primary context); the driver's context handle is valid on any thread, and
// every thread makes it current for itself (`gpu`). The mutable state, the kernels, is per
// thread (`THREAD_KERNELS`), not in the `Gpu`.
unsafe impl Send for Gpu {}
// SAFETY: as for Send.
unsafe impl Sync for Gpu {}

/// The stream every launch, copy and memset of this crate uses: the calling thread's own
/// default stream (`CU_STREAM_PER_THREAD`), so that the GPU service's executor threads run
/// their work concurrently (the legacy default stream would serialise them).
pub const STREAM: sys::CUstream = 0x2 as sys::CUstream;

thread_local! {
    /// This thread's kernels: the module and its scratch buffers, loaded on first use (from
    /// the disk cache once any thread compiled them). One per thread, so that threads launch
    /// without sharing scratch buffers or waiting for each other.
    static THREAD_KERNELS: std::cell::RefCell<Option<std::result::Result<Kernels, UvmError>>> =
        const { std::cell::RefCell::new(None) };
}

/// Turns a driver result into a `UvmError` (out-of-memory as 53200, the rest as 58000).
pub fn check(what: &str, r: CUresult) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let (mut name, mut desc): (*const c_char, *const c_char) = (std::ptr::null(), std::ptr::null());
    // SAFETY: valid out-pointers; the driver returns static strings (or leaves them null).
    unsafe {
        sys::cuGetErrorName(r, &mut name);
        sys::cuGetErrorString(r, &mut desc);
    }
    let text = |p: *const c_char| {
        if p.is_null() {
            format!("{r:?}")
        } else {
            // SAFETY: a NUL-terminated static string from the driver.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let code = match r {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => Code::OutOfMemory,
        _ => Code::SystemError,
    };
    Err(UvmError::new(code, format!("{what} failed: {} ({})", text(name), text(desc))))
}

/// Whether libcuda can be loaded at all (a dlopen, nothing else: safe in any process).
pub fn driver_present() -> bool {
    // SAFETY: only dlopen()/dlclose() of the candidate library names.
    unsafe { sys::is_culib_present() }
}

static GPU: OnceLock<std::result::Result<Gpu, UvmError>> = OnceLock::new();
static ARENA: OnceLock<crate::vocab::Arena> = OnceLock::new();

/// Tells `gpu` where this process's inherited address arena is. Must come before the first
/// `gpu()` call: the arena is released just before `cuInit`, because the driver honours
/// `cuMemAddressReserve` hints only in address space that was free when it initialised
/// (measured on the H200: a range unmapped after `cuInit` is never given back at its address).
/// Segments then get their reservations at their arena addresses, the same in every process.
pub fn set_arena(arena: crate::vocab::Arena) {
    let _ = ARENA.set(arena);
}

/// How many GPUs the CUDA provider may place device chunks on (`pg_uvm_share.cuda_devices`).
static DEVICES_WANTED: OnceLock<u32> = OnceLock::new();

/// Records how many GPUs to place chunks on, before the first [`gpu`] (later calls do nothing).
/// Kernels run on device 0 unless a thread binds itself to another ([`bind_thread`]: the GPU
/// service's executors of each GPU); every GPU reads chunks on the others over the interconnect.
pub fn set_devices_wanted(n: u32) {
    let _ = DEVICES_WANTED.set(n.clamp(1, crate::vocab::MAX_DEVICES));
}

/// This process's GPU, initialising CUDA on first call (or waiting for the helper thread of
/// [`warm_up_in_background`]), with its context current on the calling thread. Errors (no
/// driver, no device, no VMM) are remembered: CUDA is not retried in a process where it failed.
pub fn gpu() -> Result<&'static Gpu> {
    let g = GPU.get_or_init(probe).as_ref().map_err(Clone::clone)?;
    CURRENT.with(|c| {
        if !c.get() {
            // SAFETY: a context retained for the life of the process (`g` is in a static).
            check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(g.context.raw()) })?;
            c.set(true);
        }
        Ok(g)
    })
}

thread_local! {
    /// Whether this thread has made the GPU's context current.
    static CURRENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes placement GPU `n`'s context current on this thread for good (before its first [`gpu`]
/// call, which then leaves it): the thread's kernels load, and its launches run, on that GPU.
/// GPU 0 is the process's own context. A GPU the provider does not place on is 22023.
pub fn bind_thread(n: u32) -> Result<()> {
    let g = GPU.get_or_init(probe).as_ref().map_err(Clone::clone)?;
    let ctx = match n {
        0 => g.context.raw(),
        n => g
            .peer_contexts
            .get(n as usize - 1)
            .map(|c| c.raw())
            .ok_or_else(|| UvmError::new(Code::InvalidParameterValue, format!("no placement GPU {n}")))?,
    };
    // SAFETY: a context retained for the life of the process (`g` is in a static).
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
    CURRENT.with(|c| c.set(true));
    Ok(())
}

/// The context current on this thread (null if none): modules belong to one.
pub fn current_context() -> sys::CUcontext {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; with no context the driver writes null.
    unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    ctx
}

/// The helper thread of `warm_up_in_background`, joined at exit.
static WARMING: std::sync::Mutex<Option<std::thread::JoinHandle<()>>> = std::sync::Mutex::new(None);
static WARM_STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static WARM_DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Starts CUDA (driver, context, kernels) on a helper thread, once per process, unless it is
/// already up. The caller keeps working; the next [`gpu`] call waits for the helper if needed.
/// Only for a process whose cluster uses the CUDA provider; called from the main thread.
pub fn warm_up_in_background() {
    if GPU.get().is_some() {
        return;
    }
    let mut slot = WARMING.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_some() {
        return;
    }
    // PostgreSQL's signals stay the main thread's.
    let spawned = crate::interrupt::spawn_without_signals("uvm-cuda-init".into(), || {
        if let Ok(g) = gpu() {
            // Compiles the kernels into the disk cache (or finds them there), so that the main
            // thread's own load is a file read.
            let _ = g.kernels();
        }
        WARM_DONE.store(true, std::sync::atomic::Ordering::Release);
    });
    if let Ok(h) = spawned {
        *slot = Some(h);
        WARM_STARTED.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Whether the helper thread of `warm_up_in_background` is still starting CUDA.
pub fn warming() -> bool {
    use std::sync::atomic::Ordering::Acquire;
    WARM_STARTED.load(Acquire) && !WARM_DONE.load(Acquire)
}

/// Waits for the helper thread, if any (at process exit: CUDA must not be mid-initialisation on
/// another thread while the process tears down).
pub fn join_warm_up() {
    let h = WARMING.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(h) = h {
        let _ = h.join();
    }
}

fn attr(a: CUdevice_attribute, dev: CUdevice) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer; the driver is initialised.
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) })?;
    Ok(v)
}

fn probe() -> std::result::Result<Gpu, UvmError> {
    if !driver_present() {
        return Err(UvmError::new(Code::FeatureNotSupported, "the CUDA driver (libcuda.so.1) could not be loaded"));
    }
    match std::panic::catch_unwind(probe_inner) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown failure".into());
            Err(UvmError::new(Code::FeatureNotSupported, format!("the CUDA driver is unusable: {msg}"))
                .hint("pg_uvm_share needs a CUDA 13 driver; set pg_uvm_share.provider = host to run without it."))
        }
    }
}

fn probe_inner() -> std::result::Result<Gpu, UvmError> {
    use CUdevice_attribute as A;
    if let Some(arena) = ARENA.get().filter(|a| a.size > 0) {
        // SAFETY: the arena is this process's copy of the postmaster's PROT_NONE reservation;
        // nothing is mapped in it yet (no provider existed before this one).
        unsafe { libc::munmap(arena.base as *mut c_void, arena.size as usize) };
    }
    let t = Instant::now();
    // SAFETY: cuInit may be called any number of times; this process was not forked from one
    // that called it (the postmaster never does).
    check("cuInit", unsafe { sys::cuInit(0) })?;
    let mut info = DeviceInfo { cuinit_ms: t.elapsed().as_secs_f64() * 1e3, ..Default::default() };
    // SAFETY: valid out-pointers after a successful cuInit.
    unsafe {
        check("cuDriverGetVersion", sys::cuDriverGetVersion(&mut info.driver_version))?;
        if info.driver_version < MIN_DRIVER {
            return Err(UvmError::new(
                Code::FeatureNotSupported,
                format!("the CUDA driver is {}: pg_uvm_share needs CUDA 12.0 or later", driver_name(info.driver_version)),
            ));
        }
        let mut count: c_int = 0;
        check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count))?;
        if count < 1 {
            return Err(UvmError::new(Code::FeatureNotSupported, "no CUDA device is visible"));
        }
    }
    let mut dev: CUdevice = 0;
    // SAFETY: valid out-pointer; ordinal 0 exists (count >= 1).
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, 0) })?;
    let mut name = [0 as c_char; 256];
    // SAFETY: the buffer holds 256 bytes, as passed.
    check("cuDeviceGetName", unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev) })?;
    // SAFETY: the driver NUL-terminates the name within the buffer.
    info.name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
    info.compute_capability = (
        attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)?,
        attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)?,
    );
    info.sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)?;
    info.vmm = attr(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev)? != 0;
    info.posix_fd = attr(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev)? != 0;
    // Both attributes came with CUDA 12.2 (an older driver answers CUDA_ERROR_INVALID_VALUE).
    if info.driver_version >= HOST_NUMA_DRIVER {
        info.host_numa_vmm = attr(A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev)? != 0;
        info.host_numa_id = attr(A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev)?;
    } else {
        info.host_numa_id = -1;
    }
    if !info.vmm || !info.posix_fd {
        return Err(UvmError::new(
            Code::FeatureNotSupported,
            format!("{} cannot share memory between processes (VMM {}, POSIX fd handles {})", info.name, info.vmm, info.posix_fd),
        ));
    }
    let placement = placement_devices(dev, info.compute_capability, DEVICES_WANTED.get().copied().unwrap_or(1))?;
    let t = Instant::now();
    // Retained for the process's lifetime once the `Gpu` is in its static; released if a step
    // below fails.
    let ctx = handles::PrimaryContext::retain(dev)?;
    // SAFETY: a context just retained.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx.raw()) })?;
    info.context_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut total = 0usize;
    let mut free = 0usize;
    // SAFETY: valid out-pointers, context current.
    check("cuMemGetInfo", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
    info.mem_total = total as u64;
    // SAFETY: dlopen probe only, then a version query.
    unsafe {
        if cudarc::nvrtc::sys::is_culib_present() {
            let (mut maj, mut min) = (0, 0);
            if cudarc::nvrtc::sys::nvrtcVersion(&mut maj, &mut min) == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                info.nvrtc = Some((maj, min));
            }
        }
    }
    // The other placement GPUs' contexts, for executors bound to them (none with one GPU).
    let peer_contexts = placement[1..].iter().map(|&d| handles::PrimaryContext::retain(d)).collect::<Result<Vec<_>>>()?;
    // SAFETY: retaining does not change the current context, but be explicit: device 0's.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx.raw()) })?;
    Ok(Gpu { info, device: dev, placement, peer_contexts, context: ctx })
}

/// Device 0 and up to `wanted - 1` other devices, in ordinal order, of device 0's compute
/// capability (the kernels are compiled once, for it), that can share VMM memory through POSIX
/// fds and have peer access with device 0 both ways.
fn placement_devices(dev0: CUdevice, capability: (i32, i32), wanted: u32) -> Result<Vec<CUdevice>> {
    use CUdevice_attribute as A;
    let mut out = vec![dev0];
    let mut count: c_int = 0;
    // SAFETY: valid out-pointer after a successful cuInit.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut count) })?;
    for ordinal in 1..count {
        if out.len() as u32 >= wanted {
            break;
        }
        let mut dev: CUdevice = 0;
        // SAFETY: valid out-pointer; the ordinal is below the count.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ordinal) })?;
        let shares = attr(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev)? != 0
            && attr(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev)? != 0
            && (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)?,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)?,
            ) == capability;
        let (mut there, mut back): (c_int, c_int) = (0, 0);
        // SAFETY: valid out-pointers and device handles.
        unsafe {
            check("cuDeviceCanAccessPeer", sys::cuDeviceCanAccessPeer(&mut there, dev0, dev))?;
            check("cuDeviceCanAccessPeer", sys::cuDeviceCanAccessPeer(&mut back, dev, dev0))?;
        }
        if shares && there != 0 && back != 0 {
            out.push(dev);
        }
    }
    Ok(out)
}

impl Gpu {
    /// Free and total device memory now.
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; the context is current in this process.
        check("cuMemGetInfo", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    /// Loads this thread's kernels (compiled, or from the disk cache) unless it has them; an
    /// error is kept for the thread.
    pub fn kernels(&self) -> Result<()> {
        THREAD_KERNELS.with(|k| {
            let mut k = k.borrow_mut();
            if k.is_none() {
                *k = Some(Kernels::load(&self.info));
            }
            match k.as_ref() {
                Some(Err(e)) => Err(e.clone()),
                _ => Ok(()),
            }
        })
    }

    /// Runs `f` with this thread's kernels.
    pub fn with_kernels<R>(&self, f: impl FnOnce(&Kernels) -> Result<R>) -> Result<R> {
        self.kernels()?;
        THREAD_KERNELS.with(|k| match k.borrow().as_ref() {
            Some(Ok(k)) => f(k),
            _ => unreachable!("kernels() returned Ok"),
        })
    }

    /// `uvm.device_info()` rows.
    pub fn describe(&self) -> Vec<(String, String)> {
        let i = &self.info;
        let mut rows = vec![
            ("gpu_name".to_string(), i.name.clone()),
            ("driver_version".into(), format!("{}.{}", i.driver_version / 1000, (i.driver_version % 1000) / 10)),
            ("compute_capability".into(), format!("{}.{}", i.compute_capability.0, i.compute_capability.1)),
            ("sm_count".into(), i.sm_count.to_string()),
            ("vmm".into(), i.vmm.to_string()),
            ("posix_fd_handles".into(), i.posix_fd.to_string()),
            ("host_numa_vmm".into(), i.host_numa_vmm.to_string()),
            ("host_numa_id".into(), i.host_numa_id.to_string()),
            ("nvrtc".into(), i.nvrtc.map(|(a, b)| format!("{a}.{b}")).unwrap_or_else(|| "absent".into())),
            ("cuinit_ms".into(), format!("{:.3}", i.cuinit_ms)),
            ("context_ms".into(), format!("{:.3}", i.context_ms)),
            ("cuda_placement_devices".into(), format!("{:?}", self.placement)),
        ];
        if let Ok((free, total)) = self.mem_info() {
            rows.push(("memory_free".into(), free.to_string()));
            rows.push(("memory_total".into(), total.to_string()));
        }
        rows
    }
}

/// `cuMemcpy` between two unified addresses, then waits for it.
///
/// # Safety
/// Both ranges must be valid for `len` bytes (mapped chunks, or host memory of this process).
pub unsafe fn copy(dst: u64, src: u64, len: usize) -> Result<()> {
    // SAFETY: forwarded contract; the context is current; the copy is waited for on this
    // thread's stream.
    unsafe {
        check("cuMemcpyAsync", sys::cuMemcpyAsync(dst, src, len, STREAM))?;
        check("cuStreamSynchronize", sys::cuStreamSynchronize(STREAM))
    }
}

/// Registers `[addr, addr + len)` of this process's memory with CUDA (page-locked, readable by
/// kernels and DMA at the same address), for as long as the process lives: the GPU service
/// does it once for the channel's staging memory.
pub fn register_host(addr: u64, len: usize) -> Result<()> {
    // SAFETY: the caller's own mapped memory, kept mapped for the life of the process (hence
    // `keep_for_process`).
    unsafe { register_at(addr, len) }.map(handles::HostRegistration::keep_for_process)
}

/// Registers `[addr, addr + len)` for every GPU of the process (portable, device-mapped) and
/// checks that kernels reach it at the same address (a platform where the device pointer of
/// registered memory differs would need every kernel's addresses translated: refused, 0A000).
///
/// # Safety
/// The range must be memory of this process, mapped until the registration is dropped.
pub unsafe fn register_at(addr: u64, len: usize) -> Result<handles::HostRegistration> {
    gpu()?;
    let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    // SAFETY: forwarded contract (mapped until the registration drops).
    let reg = unsafe { handles::HostRegistration::new(addr as *mut c_void, len, flags) }?;
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; `addr` was just registered; flags must be 0.
    check("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, addr as *mut c_void, 0) })?;
    if dptr != addr {
        return Err(UvmError::new(
            Code::FeatureNotSupported,
            format!("registered host memory at 0x{addr:x} has device address 0x{dptr:x}: kernels would not reach it at its own address"),
        ));
    }
    Ok(reg)
}
