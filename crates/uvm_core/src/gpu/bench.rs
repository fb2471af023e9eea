//! Baselines for the GPU benchmarks (`make`-less: run by the GPU suite through SQL), measured in
//! the calling backend so that they share its context with what they are compared against.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use cudarc::driver::sys;

use super::handles::{DeviceBuffer, HostRegistration, PinnedHostBuffer};
use super::{check, gpu};
use crate::error::{Code, Result, UvmError};

/// `bytes` of device memory from `cuMemAlloc`, every byte set (to 1) before anything is timed.
fn device_buffer(bytes: usize) -> Result<DeviceBuffer> {
    let d = DeviceBuffer::new(bytes)?;
    d.set_bytes(1, bytes)?;
    Ok(d)
}

/// `bytes` of pinned host memory from `cuMemAllocHost`, every page touched.
fn pinned_buffer(bytes: usize) -> Result<PinnedHostBuffer> {
    let h = PinnedHostBuffer::new(bytes)?;
    // SAFETY: writes the whole of our own fresh allocation, `bytes` long.
    unsafe { std::ptr::write_bytes(h.ptr() as *mut u8, 1, bytes) };
    Ok(h)
}

/// GB/s of the read kernel over a private `cuMemAlloc` buffer of `bytes`, filled with the
/// fill pattern of `seed` (the same bytes as a segment filled with `fill_segment`: the data
/// moved changes the power drawn, and with it the clocks, by a few percent).
pub fn private_read(bytes: u64, iterations: u32, seed: u64) -> Result<f64> {
    let g = gpu()?;
    let buf = device_buffer(bytes as usize)?;
    // SAFETY: `buf` is our device buffer of `buf.len()` bytes, alive for the whole closure.
    g.with_kernels(|k| unsafe {
        k.fill(buf.ptr(), buf.len() as u64, seed)?;
        k.read_bandwidth(buf.ptr(), buf.len() as u64, iterations)
    })
}

/// GB/s of `cuMemcpy` host-to-device and device-to-host between pinned host memory and device
/// memory of `bytes` each: the ceiling a migration is compared against.
pub fn copy_ceiling(bytes: u64, iterations: u32) -> Result<(f64, f64)> {
    gpu()?;
    let d = device_buffer(bytes as usize)?;
    let h = pinned_buffer(bytes as usize)?;
    let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
        f()?; // warm-up
        let t = Instant::now();
        for _ in 0..iterations.max(1) {
            f()?;
        }
        Ok(bytes as f64 * iterations.max(1) as f64 / t.elapsed().as_secs_f64() / 1e9)
    };
    // SAFETY: both buffers are ours and `bytes` long.
    let htod = time(&|| check("cuMemcpyHtoD", unsafe { sys::cuMemcpyHtoD_v2(d.ptr(), h.ptr(), h.len()) }))?;
    // SAFETY: as above.
    let dtoh = time(&|| check("cuMemcpyDtoH", unsafe { sys::cuMemcpyDtoH_v2(h.ptr(), d.ptr(), d.len()) }))?;
    Ok((htod, dtoh))
}

/// Milliseconds to `cuMemHostRegister` a populated `/dev/shm` mapping of `bytes` in this
/// process: what sharing host memory costs without pg_uvm_share (per process, per attach).
pub fn host_register_ms(bytes: u64) -> Result<f64> {
    gpu()?;
    let path = format!("/dev/shm/pg_uvm_share_bench_{}", std::process::id());
    let c = std::ffi::CString::new(path.clone()).expect("no NUL");
    // SAFETY: plain file creation; the fd is owned right away, the file unlinked by `_file`.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600) };
    if fd < 0 {
        return Err(UvmError::last_os(format!("could not create {path}")));
    }
    // SAFETY: a fresh fd of ours, closed once by the OwnedFd.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let _file = Unlink(c);
    // SAFETY: reserving the file's blocks up front (ENOSPC instead of SIGBUS on touch).
    let rc = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, bytes as libc::off_t) };
    if rc != 0 {
        return Err(UvmError::os(format!("could not allocate {bytes} bytes in /dev/shm"), std::io::Error::from_raw_os_error(rc)));
    }
    // SAFETY: a shared mapping of our own file.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(UvmError::last_os("mmap of the /dev/shm file failed"));
    }
    let mapping = Unmap(p, bytes as usize);
    let t = Instant::now();
    // SAFETY: our own mapping, which `mapping` keeps until after `reg` is dropped just below.
    let reg = unsafe { HostRegistration::new(mapping.0, mapping.1, 0) }?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    drop(reg);
    Ok(ms)
}

/// Unlinks a file of ours on drop.
struct Unlink(std::ffi::CString);

impl Drop for Unlink {
    fn drop(&mut self) {
        // SAFETY: a path of ours, NUL-terminated.
        unsafe { libc::unlink(self.0.as_ptr()) };
    }
}

/// A mapping of ours, unmapped on drop.
struct Unmap(*mut c_void, usize);

impl Drop for Unmap {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; nothing uses it any more (a registration of
        // it is dropped first: it is made after this value).
        unsafe { libc::munmap(self.0, self.1) };
    }
}

/// The error for benchmarks that need a GPU under the host provider.
pub fn needs_cuda() -> UvmError {
    UvmError::new(Code::FeatureNotSupported, "this benchmark needs the CUDA provider")
}
