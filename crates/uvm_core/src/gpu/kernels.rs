//! The module of `kernels/segment.cu` in this process: NVRTC compilation to a CUBIN for the
//! device's architecture, a disk cache in the data directory, the typed functions
//! (`kernels/segment.rs`), the launch geometry, the small device buffers that launches share
//! (a result buffer that kernels reduce into, a staging buffer for inputs, per-thread state),
//! and the segment-generic kernels: checksum, fill, zero and the read-bandwidth probe.
//!
//! Kernels of other layers (GpuJoin's, `crates/uvm_core/src/gpujoin/gpu.rs`) launch through [`Kernels::launch`]
//! with the same buffers; this module knows their parameter lists (the table) but none of the
//! types their callers deal in.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::time::Instant;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::nvrtc::sys::{self as rtc, nvrtcResult};

use super::handles::{DeviceBuffer, Module};
use super::launch::{Kernel, MutPtr, Params, Ptr};
use super::segment::{self, Segment};
use super::DeviceInfo;
use crate::error::{Code, Result, UvmError};

/// Directory of compiled kernels, relative to the data directory (every process runs there).
const CACHE_DIR: &str = "pg_uvm_share_kernels";

/// Bytes of the device buffer that kernels reduce into (`ctl` of the materializing kernel).
pub const RESULT_BYTES: usize = 64;
/// Threads per block of every launch.
const BLOCK: u32 = 256;

/// The loaded module and its functions, plus the device buffers that launches share. One per
/// thread (`Gpu::with_kernels`), so never shared: threads launch concurrently, each on its
/// own stream (`gpu::STREAM`).
pub struct Kernels {
    segment: Segment,
    result: DeviceBuffer,
    /// Staging buffer for kernel inputs (grown on demand).
    staging: RefCell<Option<DeviceBuffer>>,
    /// Per-thread state kept between launches (allocated on first use).
    per_thread: RefCell<Option<DeviceBuffer>>,
    grid: u32,
    /// Where the CUBIN came from: "nvrtc (N ms)" or "disk cache".
    pub origin: String,
}

fn rtc_check(what: &str, r: nvrtcResult) -> Result<()> {
    if r == nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static string.
    let s = unsafe { CStr::from_ptr(rtc::nvrtcGetErrorString(r)) }.to_string_lossy().into_owned();
    Err(UvmError::new(Code::SystemError, format!("{what} failed: {s}")))
}

fn cache_path(info: &DeviceInfo) -> PathBuf {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    segment::SOURCE.hash(&mut h);
    info.nvrtc.hash(&mut h);
    PathBuf::from(CACHE_DIR).join(format!(
        "segment-{:016x}-sm_{}{}.cubin",
        h.finish(),
        info.compute_capability.0,
        info.compute_capability.1
    ))
}

/// Compiles the kernels to a CUBIN for the device's architecture.
fn compile(info: &DeviceInfo) -> Result<Vec<u8>> {
    let src = CString::new(segment::SOURCE).expect("no NUL in the kernel source");
    // Our own source failing to compile is a fault of this build, not of the caller's input.
    nvrtc_cubin(info, &src, c"segment.cu", &[c"--std=c++17", c"-default-device"]).map_err(|mut e| {
        e.code = Code::SystemError;
        e
    })
}

/// Compiles CUDA C `src` (named `file` in messages) with NVRTC to a CUBIN for the device's
/// architecture, with `options` besides the architecture. A source that does not compile is a
/// 22023 error whose detail is NVRTC's log.
pub(super) fn nvrtc_cubin(info: &DeviceInfo, src: &CStr, file: &CStr, options: &[&CStr]) -> Result<Vec<u8>> {
    // SAFETY: dlopen probe only.
    if info.nvrtc.is_none() || !unsafe { rtc::is_culib_present() } {
        return Err(UvmError::new(
            Code::FeatureNotSupported,
            "NVRTC (libnvrtc.so.13) is not available: GPU kernels cannot be compiled",
        )
        .hint("Install the CUDA runtime compiler library, or use pg_uvm_share.provider = host."));
    }
    let arch = CString::new(format!("--gpu-architecture=sm_{}{}", info.compute_capability.0, info.compute_capability.1))
        .expect("no NUL");
    let opts: Vec<*const c_char> = std::iter::once(arch.as_ptr()).chain(options.iter().map(|o| o.as_ptr())).collect();
    // SAFETY: NVRTC calls with valid C strings and out-pointers; the program is destroyed on
    // every path.
    unsafe {
        let mut prog: rtc::nvrtcProgram = std::ptr::null_mut();
        rtc_check(
            "nvrtcCreateProgram",
            rtc::nvrtcCreateProgram(&mut prog, src.as_ptr(), file.as_ptr(), 0, std::ptr::null(), std::ptr::null()),
        )?;
        let r = rtc::nvrtcCompileProgram(prog, opts.len() as c_int, opts.as_ptr());
        let out = if r != nvrtcResult::NVRTC_SUCCESS {
            let mut n = 0usize;
            rtc::nvrtcGetProgramLogSize(prog, &mut n);
            let mut log = vec![0 as c_char; n.max(1)];
            rtc::nvrtcGetProgramLog(prog, log.as_mut_ptr());
            let log = CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned();
            Err(UvmError::new(Code::InvalidParameterValue, format!("kernel source {} does not compile", file.to_string_lossy()))
                .detail(log))
        } else {
            let mut n = 0usize;
            rtc_check("nvrtcGetCUBINSize", rtc::nvrtcGetCUBINSize(prog, &mut n)).and_then(|_| {
                let mut buf = vec![0u8; n];
                rtc_check("nvrtcGetCUBIN", rtc::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char)).map(|_| buf)
            })
        };
        rtc::nvrtcDestroyProgram(&mut prog);
        out
    }
}

/// The CUBIN from the disk cache, or compiled and stored there (atomically: tmp + rename).
fn cubin(info: &DeviceInfo) -> Result<(Vec<u8>, String)> {
    let path = cache_path(info);
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok((bytes, "disk cache".into()));
        }
    }
    let t = Instant::now();
    let bytes = compile(info)?;
    let origin = format!("nvrtc ({:.0} ms)", t.elapsed().as_secs_f64() * 1e3);
    // The cache is an optimisation: failing to write it is not an error.
    if std::fs::create_dir_all(CACHE_DIR).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &bytes).is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok((bytes, origin))
}

impl Kernels {
    pub fn load(info: &DeviceInfo) -> Result<Kernels> {
        let (image, origin) = cubin(info)?;
        // SAFETY: a CUBIN from NVRTC or from our disk cache; the context is current (the
        // caller got `info` from `gpu()`).
        let module = unsafe { Module::load(&image) }?;
        Ok(Kernels {
            segment: Segment::load(module)?,
            result: DeviceBuffer::new(RESULT_BYTES)?,
            staging: RefCell::new(None),
            per_thread: RefCell::new(None),
            grid: (info.sm_count.max(1) * 4) as u32,
            origin,
        })
    }

    /// The functions of `segment.cu`.
    pub fn segment(&self) -> &Segment {
        &self.segment
    }

    /// Launches `kernel` (one of [`Kernels::segment`]'s) over the grid every launch uses, and
    /// waits for it.
    ///
    /// # Safety
    /// As for [`Kernel::launch`]: every pointer in `params` addresses device-accessible memory,
    /// mapped for the launch, as large as the kernel reads or writes through it.
    pub unsafe fn launch<P: Params>(&self, kernel: &Kernel<P>, params: P) -> Result<()> {
        // SAFETY: forwarded contract; the context is current (this came from `gpu()`).
        unsafe { kernel.launch(self.grid, BLOCK, params) }
    }

    /// Threads of every launch (the grid never changes in a process).
    pub fn threads(&self) -> usize {
        self.grid as usize * BLOCK as usize
    }

    /// The device buffer of [`RESULT_BYTES`] that kernels reduce into (clear what a launch adds
    /// to before it, read it back after).
    pub fn result(&self) -> &DeviceBuffer {
        &self.result
    }

    /// The result buffer's address, as a kernel's `u64 *` parameter.
    pub fn result_ptr(&self) -> MutPtr<u64> {
        MutPtr::new(self.result.ptr())
    }

    /// A device buffer of at least `bytes` for staging kernel inputs (kept for the process).
    /// The address stays valid until a later call asks for more bytes than it holds.
    pub fn staging(&self, bytes: usize) -> Result<CUdeviceptr> {
        let mut staging = self.staging.borrow_mut();
        if let Some(b) = staging.as_ref().filter(|b| b.len() >= bytes) {
            return Ok(b.ptr());
        }
        // Free the old buffer first (launches are synchronous: no kernel uses it any more).
        *staging = None;
        let b = DeviceBuffer::new(bytes.next_power_of_two().max(1 << 20))?;
        let p = b.ptr();
        *staging = Some(b);
        Ok(p)
    }

    /// Copies host values into the staging buffer (sized by [`Kernels::staging`] first) at
    /// byte `at`.
    pub fn stage(&self, at: usize, v: &[i64]) -> Result<()> {
        match self.staging.borrow().as_ref() {
            Some(b) => b.write(at, v),
            None => Err(UvmError::new(Code::SystemError, "kernel inputs staged before the staging buffer was sized")),
        }
    }

    /// A device buffer of `bytes_per_thread` for each of [`Kernels::threads`], kept for the
    /// process, so that its contents survive from one launch to the next (the first call sizes
    /// it; a later call asking for more is an error).
    pub fn per_thread_state(&self, bytes_per_thread: usize) -> Result<CUdeviceptr> {
        let bytes = self.threads() * bytes_per_thread;
        let mut state = self.per_thread.borrow_mut();
        match state.as_ref() {
            Some(b) if b.len() >= bytes => Ok(b.ptr()),
            Some(b) => Err(UvmError::new(
                Code::SystemError,
                format!("per-thread state of {bytes} bytes asked for, {} allocated", b.len()),
            )),
            None => {
                let b = DeviceBuffer::new(bytes)?;
                let p = b.ptr();
                *state = Some(b);
                Ok(p)
            }
        }
    }

    /// The checksum (`crates/uvm_core/src/checksum.rs`) of `[addr, addr + len)`, computed on the GPU.
    ///
    /// # Safety
    /// `[addr, addr + len)` is device-accessible memory kept mapped for the call (a pinned
    /// segment's range, bounds-checked by `Pin::addr`): the kernel reads every byte of it.
    pub unsafe fn checksum(&self, addr: u64, len: u64) -> Result<u64> {
        self.result.set_bytes(0, 8)?;
        let params = segment::Checksum { p: Ptr::new(addr), len, out: self.result_ptr() };
        // SAFETY: the kernel reads [addr, addr + len) (the caller's promise) and adds to the
        // first word of our result buffer.
        unsafe { self.launch(self.segment.uvm_checksum(), params) }?;
        let mut v = [0u64; 1];
        self.result.read(&mut v)?;
        Ok(v[0])
    }

    /// Fills `[addr, addr + len)` with the pattern of `crates/uvm_core/src/checksum.rs::fill`, on the GPU.
    ///
    /// # Safety
    /// `[addr, addr + len)` is writable device-accessible memory kept mapped for the call (a
    /// pinned segment's range, bounds-checked by `Pin::addr`, or a buffer of ours): the kernel
    /// writes every byte of it.
    pub unsafe fn fill(&self, addr: u64, len: u64, seed: u64) -> Result<()> {
        // SAFETY: the kernel writes [addr, addr + len) (the caller's promise).
        unsafe { self.launch(self.segment.uvm_fill(), segment::Fill { p: MutPtr::new(addr), len, seed }) }
    }

    /// Zeroes `words` 8-byte words at `addr` (which may span chunks).
    ///
    /// # Safety
    /// `[addr, addr + 8 * words)` is 8-byte aligned device-accessible memory that nothing else
    /// of this process uses (a pinned segment's range, bounds-checked by `Pin::addr`).
    pub unsafe fn zero(&self, addr: u64, words: u64) -> Result<()> {
        // SAFETY: the kernel writes [addr, addr + 8 * words) (the caller's promise).
        unsafe { self.launch(self.segment.uvm_zero(), segment::Zero { p: MutPtr::new(addr), words }) }
    }

    /// GB/s of a kernel reading `[addr, addr + len)` `iterations` times (after a warm-up).
    ///
    /// # Safety
    /// As for [`Kernels::checksum`]: the kernel reads every byte of `[addr, addr + len)`.
    pub unsafe fn read_bandwidth(&self, addr: u64, len: u64, iterations: u32) -> Result<f64> {
        let params = segment::ReadBw { p: Ptr::new(addr), n: len / 16, out: self.result_ptr() };
        // SAFETY: the kernel reads the first n 16-byte vectors of [addr, addr + len) (the
        // caller's promise) and may add to the first word of our result buffer.
        unsafe { self.launch(self.segment.uvm_read_bw(), params) }?;
        let t = Instant::now();
        for _ in 0..iterations.max(1) {
            // SAFETY: as above.
            unsafe { self.launch(self.segment.uvm_read_bw(), params) }?;
        }
        Ok((params.n * 16) as f64 * iterations.max(1) as f64 / t.elapsed().as_secs_f64() / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::super::launch::declared_kernels;
    use super::*;

    /// The table of `kernels/segment.rs` declares exactly the functions of `segment.cu`, in
    /// order, each with the source's parameters: same names, same C types, same order. This is
    /// what makes a typed launch pass exactly what the kernel takes.
    #[test]
    fn kernel_table_matches_the_source() {
        let source = declared_kernels(segment::SOURCE);
        let table = Segment::signatures();
        let names = |v: Vec<&str>| v.join(", ");
        assert_eq!(
            names(table.iter().map(|k| k.0).collect()),
            names(source.iter().map(|k| k.0.as_str()).collect()),
            "the table's functions (left) are not the source's (right)"
        );
        for ((name, params), (_, declared)) in table.into_iter().zip(source) {
            let params: Vec<(String, String)> = params.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
            assert_eq!(params, declared, "{name}: the table's parameters (left) are not the source's (right)");
        }
    }

    /// The parser sees what the table is compared against: spot checks of its reading.
    #[test]
    fn source_declarations_are_read_as_written() {
        let k = declared_kernels(
            "extern \"C\" __global__ void f(const u8 *p, u64 len,\n    long long *out) {}\n\
             extern \"C\" __global__ void __launch_bounds__(256, 4) g(Slot* s) {}",
        );
        let own = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        assert_eq!(k[0].0, "f");
        assert_eq!(k[0].1, own(&[("p", "const u8 *"), ("len", "u64"), ("out", "long long *")]));
        assert_eq!(k[1].0, "g");
        assert_eq!(k[1].1, own(&[("s", "Slot *")]));
        let probe = Segment::signatures().into_iter().find(|(n, _)| *n == "uvm_join_probe").unwrap().1;
        assert_eq!(probe[0], ("slots", "const Slot *".to_string()));
        assert_eq!(probe[3], ("keys", "const u8 *".to_string()));
    }
}
