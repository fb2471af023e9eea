//! Owners of CUDA handles: each value holds one driver object and releases it when dropped, so
//! that no path (an error half-way through a set-up, a buffer replaced by a larger one) frees a
//! handle by hand or forgets to.
//!
//! | owner | made by | released by (on drop) |
//! | --- | --- | --- |
//! | [`PrimaryContext`] | `cuDevicePrimaryCtxRetain` | `cuDevicePrimaryCtxRelease` |
//! | [`Module`] | `cuModuleLoadData` | `cuModuleUnload` |
//! | [`DeviceBuffer`] | `cuMemAlloc` | `cuMemFree` |
//! | [`PinnedHostBuffer`] | `cuMemAllocHost` | `cuMemFreeHost` |
//! | [`HostRegistration`] | `cuMemHostRegister` | `cuMemHostUnregister` |
//!
//! A release's error is ignored (there is nobody to tell in `drop`, and the driver frees
//! everything at process exit anyway). The process's own context and kernels live in a static
//! ([`super::gpu`]) and so are never dropped: they are released by the process's exit. Every
//! owner must be dropped while the context it was made in is still alive, which the static
//! guarantees for everything made after [`super::gpu`].

use std::ffi::{c_void, CStr};

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdeviceptr, CUfunction, CUmodule};

use super::check;
use crate::error::{Code, Result, UvmError};

/// A device's primary context, retained by this value.
pub struct PrimaryContext {
    ctx: CUcontext,
    dev: CUdevice,
}

impl PrimaryContext {
    /// Retains `dev`'s primary context (creating it if no one holds it yet).
    pub fn retain(dev: CUdevice) -> Result<PrimaryContext> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the driver is initialised (the caller got `dev` from it).
        check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) })?;
        Ok(PrimaryContext { ctx, dev })
    }

    pub fn raw(&self) -> CUcontext {
        self.ctx
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: gives back the one retain this value took; nothing made in the context is
        // used after this (see the module documentation).
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// A loaded module (CUBIN).
pub struct Module(CUmodule);

impl Module {
    /// Loads `image` into the context current on this thread.
    ///
    /// # Safety
    /// `image` must be a complete CUBIN (or PTX, or fatbin) image, and a context must be current.
    pub unsafe fn load(image: &[u8]) -> Result<Module> {
        let mut m: CUmodule = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the image and the current context are the caller's promise.
        check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void) })?;
        Ok(Module(m))
    }

    /// The function `name` of the module, valid while the module is loaded.
    pub(crate) fn function(&self, name: &CStr) -> Result<CUfunction> {
        let mut f: CUfunction = std::ptr::null_mut();
        // SAFETY: valid out-pointer and module; the name is NUL-terminated.
        check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut f, self.0, name.as_ptr()) })?;
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: our own module, unloaded once; its functions are not launched after this
        // (only the owner of the module hands them out, by reference).
        unsafe { sys::cuModuleUnload(self.0) };
    }
}

/// Device memory from `cuMemAlloc`. Its contents are not initialised.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    /// `len` bytes (at least 1) of device memory, in the context current on this thread.
    pub fn new(len: usize) -> Result<DeviceBuffer> {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; a context is current (callers got it from `gpu()`).
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, len) })?;
        Ok(DeviceBuffer { ptr, len })
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks that `[at, at + n)` lies inside the buffer (else an internal error: callers size
    /// their buffers).
    fn check_range(&self, at: usize, n: usize) -> Result<()> {
        match at.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(UvmError::new(
                Code::SystemError,
                format!("bytes [{at}, {at} + {n}) are outside a device buffer of {} bytes", self.len),
            )),
        }
    }

    /// Sets the first `n` bytes to `value`.
    pub fn set_bytes(&self, value: u8, n: usize) -> Result<()> {
        self.check_range(0, n)?;
        // SAFETY: the first n bytes of our allocation (checked above), waited for on this
        // thread's stream.
        unsafe {
            check("cuMemsetD8Async", sys::cuMemsetD8Async(self.ptr, value, n, super::STREAM))?;
            check("cuStreamSynchronize", sys::cuStreamSynchronize(super::STREAM))
        }
    }

    /// Copies `src` into the buffer at byte `at`.
    pub fn write(&self, at: usize, src: &[i64]) -> Result<()> {
        let n = std::mem::size_of_val(src);
        self.check_range(at, n)?;
        // SAFETY: [at, at + n) lies in our allocation (checked above); src is n readable bytes,
        // borrowed until the copy was waited for on this thread's stream.
        unsafe {
            let dst = self.ptr + at as u64;
            check("cuMemcpyHtoDAsync", sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, n, super::STREAM))?;
            check("cuStreamSynchronize", sys::cuStreamSynchronize(super::STREAM))
        }
    }

    /// Copies the first `8 * dst.len()` bytes of the buffer into `dst`.
    pub fn read(&self, dst: &mut [u64]) -> Result<()> {
        let n = std::mem::size_of_val(dst);
        self.check_range(0, n)?;
        // SAFETY: the first n bytes of our allocation (checked above) into n writable bytes,
        // borrowed until the copy was waited for on this thread's stream.
        unsafe {
            check("cuMemcpyDtoHAsync", sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, self.ptr, n, super::STREAM))?;
            check("cuStreamSynchronize", sys::cuStreamSynchronize(super::STREAM))
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: our own allocation, freed once. Launches are synchronous (`Kernel::launch`
        // waits for them), so no kernel still uses it.
        unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Page-locked host memory from `cuMemAllocHost`, mapped in this process and for DMA.
pub struct PinnedHostBuffer {
    ptr: *mut c_void,
    len: usize,
}

impl PinnedHostBuffer {
    /// `len` bytes of pinned host memory, in the context current on this thread.
    pub fn new(len: usize) -> Result<PinnedHostBuffer> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current (callers got it from `gpu()`).
        check("cuMemAllocHost", unsafe { sys::cuMemAllocHost_v2(&mut ptr, len) })?;
        Ok(PinnedHostBuffer { ptr, len })
    }

    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        // SAFETY: our own allocation, freed once; copies into or out of it are synchronous.
        unsafe { sys::cuMemFreeHost(self.ptr) };
    }
}

/// A range of this process's memory registered with CUDA (`cuMemHostRegister`): page-locked
/// and reachable by DMA and kernels for as long as this value lives.
pub struct HostRegistration(*mut c_void);

// SAFETY: the pointer is only the registration's key, handed to `cuMemHostUnregister` from
// whichever thread drops the value (with the process's context current there, as on every
// thread that calls into CUDA); nothing is read or written through it here. The GPU service
// registers host pool pieces on the thread that makes them and unregisters on its main thread.
unsafe impl Send for HostRegistration {}

impl HostRegistration {
    /// Registers `[addr, addr + len)` with `flags` (`CU_MEMHOSTREGISTER_*`).
    ///
    /// # Safety
    /// The range must be memory of this process, mapped until this value is dropped (or for
    /// the life of the process, after [`HostRegistration::keep_for_process`]).
    pub unsafe fn new(addr: *mut c_void, len: usize, flags: u32) -> Result<HostRegistration> {
        // SAFETY: the caller's mapped memory (contract); a context is current.
        check("cuMemHostRegister", unsafe { sys::cuMemHostRegister_v2(addr, len, flags) })?;
        Ok(HostRegistration(addr))
    }

    /// Keeps the registration until the process exits (the range must stay mapped as long).
    pub fn keep_for_process(self) {
        std::mem::forget(self);
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        // SAFETY: undoes our own registration, once; the range is still mapped (contract of
        // `new`), and copies from it are synchronous.
        unsafe { sys::cuMemHostUnregister(self.0) };
    }
}
