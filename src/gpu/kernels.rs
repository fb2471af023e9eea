//! The kernels of `kernels/segment.cu`: NVRTC compilation to a CUBIN for the device's
//! architecture, a disk cache in the data directory, and typed launches.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::time::Instant;

use cudarc::driver::sys::{self, CUdeviceptr, CUfunction};
use cudarc::nvrtc::sys::{self as rtc, nvrtcResult};

use super::handles::{DeviceBuffer, Module};
use super::{check, void, DeviceInfo};
use crate::error::{Code, Result, UvmError};
use crate::gpujoin::pairs::{self, Appender, Inner, Step, Target};
use crate::gpujoin::table;

const SOURCE: &str = include_str!("../../kernels/segment.cu");
/// Directory of compiled kernels, relative to the data directory (every process runs there).
const CACHE_DIR: &str = "pg_uvm_share_kernels";

/// Bytes of the device buffer that kernels reduce into (`ctl` of the materializing kernel).
const RESULT_BYTES: usize = 64;
/// Threads per block of every launch.
const BLOCK: u32 = 256;
/// Keys per launch at most, so that the staging buffer (kept for the process's lifetime) stays
/// at 8 MiB however large a batch grows while CUDA starts.
const MAX_LAUNCH_KEYS: usize = 1 << 20;
/// Keys one probe benchmark launch takes at most (128 MiB staged on the device).
pub const MAX_BENCH_KEYS: u64 = 1 << 24;

/// Recombines the split payload sums of the join kernels: hi * 2^32 + lo (see segment.cu),
/// exact while one launch matches fewer than 2^32 rows (else an error, never a wrong sum).
fn payload_sum(matches: u64, lo: u64, hi: u64) -> Result<i128> {
    if matches >= 1 << 32 {
        return Err(UvmError::new(
            Code::ProgramLimitExceeded,
            format!("one GpuJoin kernel launch matched {matches} rows: its payload sum would not be exact"),
        )
        .hint("Probe fewer keys per launch, or deduplicate the inner side's keys."));
    }
    Ok(((hi as i64 as i128) << 32) + lo as i128)
}

/// The loaded module and its functions, plus a small device buffer for reductions.
pub struct Kernels {
    checksum_fn: CUfunction,
    fill_fn: CUfunction,
    read_bw_fn: CUfunction,
    join_build_fn: CUfunction,
    join_probe_fn: CUfunction,
    join_materialize_fn: CUfunction,
    zero_fn: CUfunction,
    /// The loaded module: the functions above are valid while it is (unloaded on drop).
    _module: Module,
    result: DeviceBuffer,
    /// Staging buffer for probe keys (grown on demand).
    staging: std::cell::RefCell<Option<DeviceBuffer>>,
    /// Per-thread resume state of `uvm_join_materialize` (2 words a thread; allocated on first use).
    resume: std::cell::RefCell<Option<DeviceBuffer>>,
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
    SOURCE.hash(&mut h);
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
    // SAFETY: dlopen probe only.
    if info.nvrtc.is_none() || !unsafe { rtc::is_culib_present() } {
        return Err(UvmError::new(
            Code::FeatureNotSupported,
            "NVRTC (libnvrtc.so.13) is not available: GPU kernels cannot be compiled",
        )
        .hint("Install the CUDA runtime compiler library, or use pg_uvm_share.provider = host."));
    }
    let src = CString::new(SOURCE).expect("no NUL in the kernel source");
    let arch = CString::new(format!("--gpu-architecture=sm_{}{}", info.compute_capability.0, info.compute_capability.1))
        .expect("no NUL");
    let opts = [arch.as_ptr(), c"--std=c++17".as_ptr(), c"-default-device".as_ptr()];
    // SAFETY: NVRTC calls with valid C strings and out-pointers; the program is destroyed on
    // every path.
    unsafe {
        let mut prog: rtc::nvrtcProgram = std::ptr::null_mut();
        rtc_check(
            "nvrtcCreateProgram",
            rtc::nvrtcCreateProgram(&mut prog, src.as_ptr(), c"segment.cu".as_ptr(), 0, std::ptr::null(), std::ptr::null()),
        )?;
        let r = rtc::nvrtcCompileProgram(prog, opts.len() as c_int, opts.as_ptr());
        let out = if r != nvrtcResult::NVRTC_SUCCESS {
            let mut n = 0usize;
            rtc::nvrtcGetProgramLogSize(prog, &mut n);
            let mut log = vec![0 as c_char; n.max(1)];
            rtc::nvrtcGetProgramLog(prog, log.as_mut_ptr());
            let log = CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned();
            rtc_check("nvrtcCompileProgram", r).map_err(|e| e.detail(log)).map(|_| Vec::new())
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
            checksum_fn: module.function(c"uvm_checksum")?,
            fill_fn: module.function(c"uvm_fill")?,
            read_bw_fn: module.function(c"uvm_read_bw")?,
            join_build_fn: module.function(c"uvm_join_build")?,
            join_probe_fn: module.function(c"uvm_join_probe")?,
            join_materialize_fn: module.function(c"uvm_join_materialize")?,
            zero_fn: module.function(c"uvm_zero")?,
            staging: std::cell::RefCell::new(None),
            resume: std::cell::RefCell::new(None),
            _module: module,
            result: DeviceBuffer::new(RESULT_BYTES)?,
            grid: (info.sm_count.max(1) * 4) as u32,
            origin,
        })
    }

    fn launch(&self, f: CUfunction, params: &mut [*mut c_void]) -> Result<()> {
        // SAFETY: `params` points to one value per kernel parameter, alive for the call; the
        // legacy default stream is synchronized before returning.
        unsafe {
            check(
                "cuLaunchKernel",
                sys::cuLaunchKernel(
                    f,
                    self.grid,
                    1,
                    1,
                    BLOCK,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            )?;
            check("cuStreamSynchronize", sys::cuStreamSynchronize(std::ptr::null_mut()))
        }
    }

    /// The checksum (`src/checksum.rs`) of `[addr, addr + len)`, computed on the GPU.
    ///
    /// # Safety
    /// `[addr, addr + len)` is device-accessible memory kept mapped for the call (a pinned
    /// segment's range, bounds-checked by `Pin::addr`): the kernel reads every byte of it.
    pub unsafe fn checksum(&self, addr: u64, len: u64) -> Result<u64> {
        self.result.set_bytes(0, 8)?;
        let (mut p, mut n, mut out) = (addr, len, self.result.ptr());
        self.launch(self.checksum_fn, &mut [void(&mut p), void(&mut n), void(&mut out)])?;
        let mut v = [0u64; 1];
        self.result.read(&mut v)?;
        Ok(v[0])
    }

    /// Fills `[addr, addr + len)` with the pattern of `src/checksum.rs::fill`, on the GPU.
    ///
    /// # Safety
    /// `[addr, addr + len)` is writable device-accessible memory kept mapped for the call (a
    /// pinned segment's range, bounds-checked by `Pin::addr`, or a buffer of ours): the kernel
    /// writes every byte of it.
    pub unsafe fn fill(&self, addr: u64, len: u64, seed: u64) -> Result<()> {
        let (mut p, mut n, mut s) = (addr, len, seed);
        self.launch(self.fill_fn, &mut [void(&mut p), void(&mut n), void(&mut s)])
    }

    /// A device buffer of at least `bytes` for staging kernel inputs (kept for the process).
    /// The address stays valid until a later call asks for more bytes than it holds.
    fn staging(&self, bytes: usize) -> Result<CUdeviceptr> {
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

    /// Copies host values into the staging buffer (sized by `staging` first) at byte `at`.
    fn stage(&self, at: usize, v: &[i64]) -> Result<()> {
        match self.staging.borrow().as_ref() {
            Some(b) => b.write(at, v),
            None => Err(UvmError::new(Code::SystemError, "kernel inputs staged before the staging buffer was sized")),
        }
    }

    /// Zeroes `words` 8-byte words at `addr` (which may span chunks).
    ///
    /// # Safety
    /// `[addr, addr + 8 * words)` is 8-byte aligned device-accessible memory that nothing else
    /// of this process uses (a pinned segment's range, bounds-checked by `Pin::addr`).
    pub unsafe fn zero(&self, addr: u64, words: u64) -> Result<()> {
        let (mut p, mut n) = (addr, words);
        self.launch(self.zero_fn, &mut [void(&mut p), void(&mut n)])
    }

    /// Inserts rows with non-NULL keys into a GpuJoin table's slots at `slots` (`mask + 1`
    /// slots, zeroed before the first batch), on the GPU, at most [`MAX_LAUNCH_KEYS`] rows per
    /// launch with an interrupt check between launches. Rows that find no empty slot within
    /// `mask + 1` steps (the segment was overwritten during the build) are left out; returns
    /// how many.
    ///
    /// # Safety
    /// `slots` addresses `mask + 1` slots (`mask + 1` a power of two) of writable,
    /// device-accessible memory, 8-byte aligned, kept mapped for the call (a pinned segment's
    /// range, bounds-checked by `Pin::addr`).
    pub unsafe fn join_build(&self, slots: u64, mask: u64, seed: u64, keys: &[i64], payloads: &[i64]) -> Result<u64> {
        debug_assert_eq!(keys.len(), payloads.len());
        let mut left_out = 0;
        for (ks, ps) in keys.chunks(MAX_LAUNCH_KEYS).zip(payloads.chunks(MAX_LAUNCH_KEYS)) {
            crate::interrupt::check()?;
            let buf = self.staging(ks.len() * 16)?;
            self.stage(0, ks)?;
            self.stage(ks.len() * 8, ps)?;
            self.result.set_bytes(0, 8)?;
            let (mut s, mut m, mut sd, mut k, mut p, mut n, mut bad) =
                (slots, mask, seed, buf, buf + ks.len() as u64 * 8, ks.len() as u64, self.result.ptr());
            self.launch(
                self.join_build_fn,
                &mut [void(&mut s), void(&mut m), void(&mut sd), void(&mut k), void(&mut p), void(&mut n), void(&mut bad)],
            )?;
            let mut b = [0u64; 1];
            self.result.read(&mut b)?;
            left_out += b[0];
        }
        Ok(left_out)
    }

    /// Probes non-NULL `keys` against the table of `inner`; returns (matches, payload sum),
    /// exact up to 2^32 matches per launch. A chain without an empty slot is an ERROR (22023):
    /// the table is corrupted.
    pub fn join_probe(&self, inner: &Inner<'_>, keys: &[i64]) -> Result<(u64, i128)> {
        keys.chunks(MAX_LAUNCH_KEYS).try_fold((0, 0), |(m, sum), part| {
            crate::interrupt::check()?;
            self.result.set_bytes(0, 32)?;
            self.run_probe(inner, part, 1)?;
            let mut r = [0u64; 4];
            self.result.read(&mut r)?;
            if r[3] != 0 {
                return Err(table::corrupted(
                    inner.name(),
                    &format!("a probe found no empty slot in {} slots", inner.header().slot_count),
                ));
            }
            Ok((m + r[0], sum + payload_sum(r[0], r[1], r[2])?))
        })
    }

    /// Stages `keys` and launches the probe kernel `runs` times, adding into the result buffer;
    /// returns the milliseconds of the last launch.
    fn run_probe(&self, inner: &Inner<'_>, keys: &[i64], runs: u32) -> Result<f64> {
        let buf = self.staging(keys.len() * 8)?;
        self.stage(0, keys)?;
        self.launch_probe(inner, buf, keys.len() as u64, runs)
    }

    /// Launches the probe kernel `runs` times over `n` keys staged at `keys`.
    fn launch_probe(&self, inner: &Inner<'_>, keys: CUdeviceptr, n: u64, runs: u32) -> Result<f64> {
        let h = inner.header();
        // Inner::of validated the header and bounded the slots inside the pinned segment.
        let (mut s, mut m, mut sd, mut k, mut n, mut out) = (inner.slots(), h.slot_count - 1, h.seed, keys, n, self.result.ptr());
        let mut params = [void(&mut s), void(&mut m), void(&mut sd), void(&mut k), void(&mut n), void(&mut out)];
        let mut ms = 0.0;
        for _ in 0..runs.max(1) {
            let t = Instant::now();
            self.launch(self.join_probe_fn, &mut params)?;
            ms = t.elapsed().as_secs_f64() * 1e3;
        }
        Ok(ms)
    }

    /// The per-thread resume buffer of the materializing kernel.
    fn resume_state(&self) -> Result<CUdeviceptr> {
        let mut resume = self.resume.borrow_mut();
        if let Some(b) = resume.as_ref() {
            return Ok(b.ptr());
        }
        // 16 bytes per thread of the (fixed) grid.
        let b = DeviceBuffer::new(self.grid as usize * BLOCK as usize * 16)?;
        let p = b.ptr();
        *resume = Some(b);
        Ok(p)
    }

    /// Time of one launch of the probe kernel over `n` keys, `key(i)` for i in `0..n`
    /// (benchmarks only; `n` at most [`MAX_BENCH_KEYS`]): the kernel alone, after a warm-up
    /// launch, without the staging copy. The keys are generated and staged a launch's worth at
    /// a time, so host memory stays constant; the device's staging buffer holds all `n`.
    pub fn join_probe_kernel_ms(&self, inner: &Inner<'_>, n: u64, key: impl Fn(u64) -> i64) -> Result<f64> {
        if n == 0 || n > MAX_BENCH_KEYS {
            return Err(UvmError::new(
                Code::ProgramLimitExceeded,
                format!("a probe benchmark takes 1 to {MAX_BENCH_KEYS} keys, not {n}"),
            ));
        }
        let buf = self.staging(n as usize * 8)?;
        let mut host = Vec::with_capacity(MAX_LAUNCH_KEYS.min(n as usize));
        for start in (0..n).step_by(MAX_LAUNCH_KEYS) {
            crate::interrupt::check()?;
            host.clear();
            host.extend((start..(start + MAX_LAUNCH_KEYS as u64).min(n)).map(&key));
            self.stage(start as usize * 8, &host)?;
        }
        self.result.set_bytes(0, 32)?;
        self.launch_probe(inner, buf, n, 2)
    }
}

/// The materializing GpuJoin on the GPU: `uvm_join_materialize` under the grow-and-resume
/// protocol of `gpujoin::pairs` (the kernel's state between launches stays on the device).
pub struct KernelAppender<'k> {
    k: &'k Kernels,
    keys: &'k [i64],
    /// Start of the part of `keys` being appended (at most MAX_LAUNCH_KEYS keys), and where it is
    /// staged once it is.
    at: usize,
    staged: Option<CUdeviceptr>,
    /// Whether the part's next launch starts it (else it resumes where the last one stopped).
    fresh: bool,
    pub matches: u64,
    pub sum: i128,
}

impl<'k> KernelAppender<'k> {
    pub fn new(k: &'k Kernels, keys: &'k [i64]) -> KernelAppender<'k> {
        KernelAppender { k, keys, at: 0, staged: None, fresh: true, matches: 0, sum: 0 }
    }
}

impl Appender for KernelAppender<'_> {
    fn cpu(&self) -> bool {
        false
    }

    fn run(&mut self, inner: &Inner<'_>, target: Target<'_>) -> Result<Step> {
        while self.at < self.keys.len() {
            crate::interrupt::check()?;
            let part = &self.keys[self.at..(self.at + MAX_LAUNCH_KEYS).min(self.keys.len())];
            if let Step::Need(pairs) = self.launch(part, inner, target)? {
                return Ok(Step::Need(pairs));
            }
            (self.at, self.staged, self.fresh) = (self.at + part.len(), None, true);
        }
        Ok(Step::Done)
    }
}

impl KernelAppender<'_> {
    /// One launch over `part` (staged on its first launch): starts it, or resumes it.
    fn launch(&mut self, part: &[i64], inner: &Inner<'_>, target: Target<'_>) -> Result<Step> {
        let k = self.k;
        let keys = match self.staged {
            Some(p) => p,
            None => {
                let p = k.staging(part.len() * 8)?;
                k.stage(0, part)?;
                self.staged = Some(p);
                p
            }
        };
        let resume = k.resume_state()?;
        k.result.set_bytes(0, 48)?;
        // Inner::of and Target::of validated both headers and bounded both ranges inside their
        // pinned segments, which the pins behind `inner` and `target` keep mapped.
        let h = inner.header();
        let (mut s, mut m, mut sd, mut kp, mut n) = (inner.slots(), h.slot_count - 1, h.seed, keys, part.len() as u64);
        let base = target.base();
        let (mut pairs, mut next, mut written, mut cap) =
            (base + pairs::HEADER_BYTES, base + pairs::NEXT_AT, base + pairs::WRITTEN_AT, target.cap());
        let (mut rs, mut fresh, mut ctl) = (resume, u64::from(self.fresh), k.result.ptr());
        k.launch(
            k.join_materialize_fn,
            &mut [
                void(&mut s),
                void(&mut m),
                void(&mut sd),
                void(&mut kp),
                void(&mut n),
                void(&mut pairs),
                void(&mut next),
                void(&mut written),
                void(&mut cap),
                void(&mut rs),
                void(&mut fresh),
                void(&mut ctl),
            ],
        )?;
        self.fresh = false;
        let mut c = [0u64; 6];
        k.result.read(&mut c)?;
        self.matches += c[2];
        self.sum += payload_sum(c[2], c[3], c[4])?;
        if c[5] != 0 {
            // Some reservations stay partly unwritten: readers see written != next.
            return Err(table::corrupted(
                inner.name(),
                "a probe found no empty slot or the table changed while it was probed (or the result buffer's counters are corrupted)",
            ));
        }
        Ok(if c[0] != 0 { Step::Need(c[1]) } else { Step::Done })
    }
}

impl Kernels {
    /// GB/s of a kernel reading `[addr, addr + len)` `iterations` times (after a warm-up).
    ///
    /// # Safety
    /// As for [`Kernels::checksum`]: the kernel reads every byte of `[addr, addr + len)`.
    pub unsafe fn read_bandwidth(&self, addr: u64, len: u64, iterations: u32) -> Result<f64> {
        let (mut p, mut n, mut out) = (addr, len / 16, self.result.ptr());
        self.launch(self.read_bw_fn, &mut [void(&mut p), void(&mut n), void(&mut out)])?;
        let t = Instant::now();
        for _ in 0..iterations.max(1) {
            self.launch(self.read_bw_fn, &mut [void(&mut p), void(&mut n), void(&mut out)])?;
        }
        Ok((n * 16) as f64 * iterations.max(1) as f64 / t.elapsed().as_secs_f64() / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels' split sums (segment.cu, add_payload), recombined, equal the exact sum.
    #[test]
    fn split_payload_sums_recombine_exactly() {
        let payloads = [-1i64, 5, i64::MIN, i64::MAX, i64::MAX, -7_000_000_000, 0, 1 << 40];
        let (mut lo, mut hi) = (0u64, 0i64);
        for p in payloads {
            lo = lo.wrapping_add(p as u32 as u64);
            hi = hi.wrapping_add(p >> 32);
        }
        let exact: i128 = payloads.iter().map(|&p| p as i128).sum();
        assert_eq!(payload_sum(payloads.len() as u64, lo, hi as u64).unwrap(), exact);
        assert_eq!(payload_sum(1 << 32, lo, hi as u64).unwrap_err().code, Code::ProgramLimitExceeded);
    }
}
