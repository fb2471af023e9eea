//! Kernels that callers hand in as text (the C API's launches): compiled once per distinct
//! text, kept in a module cache that every thread of the process shares, and launched with a
//! parameter list given as plain 64-bit words.
//!
//! # Design
//!
//! Our own kernels are declared once beside their source and launched through typed parameter
//! structs ([`super::launch`]). A caller's kernel cannot be: its signature is known only to the
//! caller. So this module takes the parameters as words (a scalar's bits, or a device address
//! the layer above computed from a pinned segment) and passes each word's address to
//! `cuLaunchKernel`, which reads as many bytes as the parameter's C type has (little-endian: the
//! low bytes come first, so a 4-byte `int` reads the low half of its word). Matching the words
//! to the kernel's parameters is the caller's contract, as it is for any C caller of
//! `cuLaunchKernel`.
//!
//! - CUDA C goes through NVRTC for the device's architecture (as our own kernels do); PTX is
//!   loaded by the driver, which compiles it for the device. A text that does not compile, an
//!   entry that does not exist, or a launch shape the device refuses is a 22023 error.
//! - Modules belong to the context, not to a thread, so one cache serves every executor
//!   thread: keyed by a hash of the context (executors bound to another GPU have their own),
//!   the kind and the text, at most [`CACHE_ENTRIES`] modules (the least recently used is
//!   unloaded first, once no launch uses it: entries are `Arc`s).
//! - A kernel that faults (an illegal address, a trap) leaves the context unusable for every
//!   later call in this process: CUDA's errors of that kind are sticky. The launch reports it
//!   (58000) and [`context_lost`] tells the process, so that the GPU service can restart
//!   itself with a fresh context instead of failing every later request.
//!
//! Nothing here knows who asks or what the memory means.

use std::collections::hash_map::DefaultHasher;
use std::ffi::{c_void, CString};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUresult};

use super::handles::Module;
use super::{check, gpu};
use crate::error::{Code, Result, UvmError};

/// Modules the cache keeps loaded at most.
pub const CACHE_ENTRIES: usize = 64;
/// Parameters one launch takes at most (the C API's `UVM_MAX_KERNEL_ARGS`).
pub const MAX_PARAMS: usize = 32;

/// A kernel as text: CUDA C (its entry declared `extern "C" __global__`) or PTX.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub text: Vec<u8>,
    pub ptx: bool,
    pub entry: CString,
}

/// Where and how wide a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
}

impl Shape {
    /// Every dimension at least 1 (the device checks the upper limits at launch).
    pub fn check(&self) -> Result<()> {
        if self.grid.contains(&0) || self.block.contains(&0) {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!(
                    "a kernel launch needs at least one block and one thread in each dimension, not grid {:?} block {:?}",
                    self.grid, self.block
                ),
            ));
        }
        Ok(())
    }
}

/// A module that threads share: the cache's entries.
struct SharedModule(Module);

// SAFETY: a CUmodule belongs to the context, not to a thread; the driver's module calls
// (cuModuleGetFunction, and the unload when the last `Arc` goes) are thread-safe, and nothing
// here mutates the module.
unsafe impl Send for SharedModule {}
// SAFETY: as for Send.
unsafe impl Sync for SharedModule {}

static CACHE: Mutex<Vec<(u64, Arc<SharedModule>)>> = Mutex::new(Vec::new());
static CONTEXT_LOST: AtomicBool = AtomicBool::new(false);

/// Whether a kernel of this process faulted, leaving its CUDA context unusable.
pub fn context_lost() -> bool {
    CONTEXT_LOST.load(Ordering::Acquire)
}

/// The cache key of `src` in context `ctx` (a module belongs to one context).
fn key(ctx: sys::CUcontext, src: &Source) -> u64 {
    let mut h = DefaultHasher::new();
    (ctx as usize, src.ptx, &src.text).hash(&mut h);
    h.finish()
}

/// The loaded module of `src`: from the cache, or compiled (NVRTC) or JIT-loaded (PTX) now.
fn module(src: &Source) -> Result<Arc<SharedModule>> {
    // The context first: the key names it (this thread's bound GPU, or device 0).
    let g = gpu()?;
    let k = key(super::current_context(), src);
    {
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = cache.iter().position(|(h, _)| *h == k) {
            let e = cache.remove(i);
            let m = Arc::clone(&e.1);
            cache.push(e); // most recently used last
            return Ok(m);
        }
    }
    // Compiled outside the lock: two threads may compile one text at once; the first insert wins.
    let image = if src.ptx {
        let mut t = src.text.clone();
        t.push(0); // the driver reads PTX as a C string
        t
    } else {
        let text = CString::new(src.text.clone())
            .map_err(|_| UvmError::new(Code::InvalidParameterValue, "kernel source contains a NUL byte"))?;
        super::kernels::nvrtc_cubin(&g.info, &text, c"kernel.cu", &[c"--std=c++17"])?
    };
    // SAFETY: a CUBIN from NVRTC, or PTX text with its NUL; the context is current (`gpu()`).
    let loaded = unsafe { Module::load(&image) }.map_err(|e| {
        if src.ptx {
            UvmError::new(Code::InvalidParameterValue, "the PTX kernel does not load").detail(e.message)
        } else {
            e
        }
    })?;
    let m = Arc::new(SharedModule(loaded));
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, existing)) = cache.iter().find(|(h, _)| *h == k) {
        return Ok(Arc::clone(existing));
    }
    if cache.len() >= CACHE_ENTRIES {
        cache.remove(0); // unloaded when its last launch ends (Arc)
    }
    cache.push((k, Arc::clone(&m)));
    Ok(m)
}

/// The errors after which the context is unusable (CUDA's sticky errors).
fn sticky(r: CUresult) -> bool {
    use CUresult::*;
    matches!(
        r,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_ASSERT
    )
}

/// Compiles (or finds) `src`, launches its entry with `params` on this thread's stream and
/// waits for it.
///
/// # Safety
/// Each word of `params` must be what the kernel's parameter at that place expects (a scalar's
/// bits, or a device address valid for everything the kernel touches through it, mapped until
/// this returns), and the kernel must terminate. A kernel is arbitrary code with the process's
/// GPU address space: the caller vouches for it.
pub unsafe fn launch(src: &Source, shape: Shape, params: &[u64]) -> Result<()> {
    shape.check()?;
    if params.len() > MAX_PARAMS {
        return Err(UvmError::new(Code::InvalidParameterValue, format!("a kernel takes at most {MAX_PARAMS} parameters")));
    }
    if context_lost() {
        return Err(lost());
    }
    let m = module(src)?;
    let f = m.0.function(&src.entry).map_err(|e| {
        UvmError::new(Code::InvalidParameterValue, format!("the kernel has no entry \"{}\"", src.entry.to_string_lossy()))
            .detail(e.message)
            .hint("Declare the entry extern \"C\" __global__, so that its name is not mangled.")
    })?;
    let mut words: Vec<u64> = params.to_vec();
    let mut ptrs: Vec<*mut c_void> = words.iter_mut().map(|w| w as *mut u64 as *mut c_void).collect();
    let [gx, gy, gz] = shape.grid;
    let [bx, by, bz] = shape.block;
    // SAFETY: `f` belongs to `m`, loaded and alive (we hold its Arc) in the current context
    // (`module` called `gpu()` on this thread); `ptrs` holds one pointer per word, each alive
    // for the call; what the words mean to the kernel is the caller's contract. The stream is
    // synchronized before returning, so the kernel never outlives the caller's pins.
    let r = unsafe {
        sys::cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shape.shared_mem, super::STREAM, ptrs.as_mut_ptr(), std::ptr::null_mut())
    };
    if r != CUresult::CUDA_SUCCESS {
        return Err(match check("cuLaunchKernel", r) {
            Err(e) if sticky(r) => context_failed(e),
            // A refused launch (a shape over the device's limits, too much shared memory, a
            // parameter list that does not fit) leaves the context intact: the caller's mistake.
            Err(e) => UvmError::new(Code::InvalidParameterValue, "the device refused the kernel launch").detail(e.message),
            Ok(()) => unreachable!("not CUDA_SUCCESS"),
        });
    }
    // SAFETY: this thread's stream of the current context.
    let r = unsafe { sys::cuStreamSynchronize(super::STREAM) };
    match check("the kernel", r) {
        Err(e) if sticky(r) => Err(context_failed(e)),
        other => other,
    }
}

/// The error for a kernel launch or a device address where the cluster has no GPU.
pub fn needs_cuda() -> UvmError {
    UvmError::new(Code::FeatureNotSupported, "GPU kernels need the CUDA provider, and this cluster runs the host provider")
        .hint("pg_uvm_share.provider picks the provider at server start (auto: CUDA where a usable GPU is found).")
}

fn context_failed(e: UvmError) -> UvmError {
    CONTEXT_LOST.store(true, Ordering::Release);
    UvmError::new(Code::SystemError, format!("a kernel faulted: {}", e.message))
        .detail("A fault leaves the process's CUDA context unusable; in service mode the GPU service restarts with a new one.")
}

fn lost() -> UvmError {
    UvmError::new(Code::SystemError, "the CUDA context of this process is lost: an earlier kernel faulted")
        .hint("In service mode the GPU service restarts by itself; in process mode, reconnect.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_need_every_dimension() {
        assert!(Shape { grid: [1, 1, 1], block: [256, 1, 1], shared_mem: 0 }.check().is_ok());
        let e = Shape { grid: [0, 1, 1], block: [1, 1, 1], shared_mem: 0 }.check().unwrap_err();
        assert_eq!(e.code, Code::InvalidParameterValue);
        assert!(Shape { grid: [1, 1, 1], block: [1, 0, 1], shared_mem: 0 }.check().is_err());
    }

    #[test]
    fn cache_keys_tell_kinds_and_texts_apart() {
        let s = |t: &str, ptx| Source { text: t.as_bytes().to_vec(), ptx, entry: c"k".into() };
        let (c0, c1) = (std::ptr::null_mut(), 8 as sys::CUcontext);
        assert_eq!(key(c0, &s("a", false)), key(c0, &s("a", false)));
        assert_ne!(key(c0, &s("a", false)), key(c0, &s("a", true)));
        assert_ne!(key(c0, &s("a", false)), key(c0, &s("b", false)));
        // another GPU's context has modules of its own
        assert_ne!(key(c0, &s("a", false)), key(c1, &s("a", false)));
    }
}
