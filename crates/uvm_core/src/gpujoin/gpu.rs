//! GpuJoin on the GPU: the host side of the join kernels of `kernels/segment.cu` (build,
//! probe, materialize), on top of `crates/uvm_core/src/gpu` (the loaded module, its typed launches and the
//! device buffers launches share).
//!
//! Keys are staged into the process's device staging buffer, at most [`MAX_LAUNCH_KEYS`] a
//! launch, with an interrupt check between launches. No launch walks more than a bounded
//! number of slots per thread (`WALK_BUDGET` in segment.cu): a walk out of budget saves its
//! place in the per-thread state and the batch takes another launch, after another interrupt
//! check, so a cancel is answered in milliseconds even over a corrupted table of 2^30 slots,
//! whose every chain is as long as the table. The kernels reduce into the result buffer:
//! the probe adds (matches, payload lo, payload hi, corrupted chains), the materializing kernel
//! its six `ctl` words; the payload sums come back split in two halves that [`payload_sum`]
//! recombines exactly. A corrupted table (a chain without an empty slot within `slot_count`
//! steps, counted by the kernels) is an ERROR, never a wrong answer.
//!
//! The table's and the result buffer's addresses come only from [`Inner`] and [`Target`],
//! which validated their pinned segments' headers and bounded both ranges inside them.

use std::time::Instant;

use cudarc::driver::sys::CUdeviceptr;

use super::pairs::{self, Appender, Inner, Step, Target};
use super::table;
use crate::error::{Code, Result, UvmError};
use crate::gpu::launch::{MutPtr, Ptr};
use crate::gpu::segment::{JoinBuild, JoinMaterialize, JoinProbe};
use crate::gpu::Kernels;

/// Keys per launch at most, so that the staging buffer (kept for the process's lifetime) stays
/// at 8 MiB however large a batch grows while CUDA starts.
pub const MAX_LAUNCH_KEYS: usize = 1 << 20;
/// Keys one probe benchmark launch takes at most (128 MiB staged on the device).
pub const MAX_BENCH_KEYS: u64 = 1 << 24;
/// Bytes of per-thread state the join kernels keep between the launches of one batch (where
/// each thread's walk stopped; `uvm_join_materialize`'s 8 words, the most of the three). One
/// size for all: the process's state buffer is sized by its first use.
const STATE_BYTES_PER_THREAD: usize = 64;

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

/// A column the join kernels read in place: `blocks` blocks of up to `n` rows, `stride` bytes
/// apart; in block `b`, row `r`'s value of `width` bytes (2, 4 or 8, signed integers) at device
/// address `values + b × stride + r × width` and its NULL bit at bit `r % 8` of byte
/// `nulls + b × stride + r / 8` (`nulls` 0: no NULLs); where `headers` is not 0, block `b` holds
/// the rows its count at `headers + b × stride` says (a column cache's block header: untrusted,
/// a count above `n` is an ERROR). Consecutive blocks of a column cache are one
/// (`crate::cache`'s layout), and staged keys are one block of 8-byte words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceColumn {
    pub values: u64,
    pub width: u64,
    pub nulls: u64,
    pub n: u64,
    pub blocks: u64,
    pub stride: u64,
    pub headers: u64,
}

impl DeviceColumn {
    /// `n` 8-byte words at `values`, without NULLs (staged keys or payloads).
    pub fn words(values: u64, n: u64) -> DeviceColumn {
        DeviceColumn { values, width: 8, nulls: 0, n, blocks: 1, stride: 0, headers: 0 }
    }
}

/// The ERROR of a kernel that found a block counting more rows than a block holds.
pub fn overcounted_block() -> UvmError {
    // (this layer sits beside the cache format's, so not `crate::cache::overwritten`: its hint)
    UvmError::new(Code::InvalidParameterValue, "a block of a column cache says it holds more rows than its blocks hold")
        .hint("The segment was overwritten. Drop the cache with uvm.cache_drop and build it again.")
}

/// What a build from columns placed, left out or stored as 0: rows placed, rows without an
/// empty slot (a table overwritten during the build), NULL payloads (stored as 0), NULL keys
/// (left out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildCounts {
    pub placed: u64,
    pub left_out: u64,
    pub null_payloads: u64,
    pub null_keys: u64,
}

/// The GpuJoin launches, as methods of the process's [`Kernels`].
pub trait JoinKernels {
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
    unsafe fn join_build(&self, slots: u64, mask: u64, seed: u64, keys: &[i64], payloads: &[i64]) -> Result<u64>;

    /// Inserts the rows of two columns read in place (`keys`, and `payloads` of the same
    /// blocks, or none: payloads 0) into the table's slots, in one launch (more where a walk
    /// runs out of its budget, with an interrupt check between). Rows with a NULL key are left
    /// out, NULL payloads stored as 0; the counts say how many of each, of rows placed, and of
    /// rows left out for want of an empty slot.
    ///
    /// # Safety
    /// As for [`JoinKernels::join_build`]; and each column's `n` values (and its bitmap's
    /// `n / 8` bytes rounded up, where it has one) lie in device-accessible memory kept mapped
    /// for the call.
    unsafe fn join_build_columns(
        &self,
        slots: u64,
        mask: u64,
        seed: u64,
        keys: DeviceColumn,
        payloads: Option<DeviceColumn>,
    ) -> Result<BuildCounts>;

    /// Probes the non-NULL keys of a column read in place against the table of `inner`, as
    /// [`JoinKernels::join_probe`] probes staged keys; also returns the milliseconds its
    /// launches took.
    ///
    /// # Safety
    /// The column's `n` values (and its bitmap's bytes) lie in device-accessible memory kept
    /// mapped for the call.
    unsafe fn join_probe_column(&self, inner: &Inner<'_>, keys: DeviceColumn) -> Result<(u64, i128, f64)>;

    /// Probes non-NULL `keys` against the table of `inner`; returns (matches, payload sum),
    /// exact up to 2^32 matches per launch. A chain without an empty slot is an ERROR (22023):
    /// the table is corrupted.
    fn join_probe(&self, inner: &Inner<'_>, keys: &[i64]) -> Result<(u64, i128)>;

    /// Time of one launch of the probe kernel over `n` keys, `key(i)` for i in `0..n`
    /// (benchmarks only; `n` at most [`MAX_BENCH_KEYS`]): the kernel alone, after a warm-up
    /// launch, without the staging copy. The keys are generated and staged a launch's worth at
    /// a time, so host memory stays constant; the device's staging buffer holds all `n`.
    fn join_probe_kernel_ms(&self, inner: &Inner<'_>, n: u64, key: impl Fn(u64) -> i64) -> Result<f64>;
}

impl JoinKernels for Kernels {
    unsafe fn join_build(&self, slots: u64, mask: u64, seed: u64, keys: &[i64], payloads: &[i64]) -> Result<u64> {
        debug_assert_eq!(keys.len(), payloads.len());
        let mut left_out = 0;
        for (ks, ps) in keys.chunks(MAX_LAUNCH_KEYS).zip(payloads.chunks(MAX_LAUNCH_KEYS)) {
            crate::interrupt::check()?;
            let buf = self.staging(ks.len() * 16)?;
            self.stage(0, ks)?;
            self.stage(ks.len() * 8, ps)?;
            let n = ks.len() as u64;
            let cols = (DeviceColumn::words(buf, n), DeviceColumn::words(buf + n * 8, n));
            // SAFETY: the caller's promise for the slots; both columns are our staging buffer's
            // 16 * n bytes.
            left_out += unsafe { self.join_build_columns(slots, mask, seed, cols.0, Some(cols.1)) }?.left_out;
        }
        Ok(left_out)
    }

    unsafe fn join_build_columns(
        &self,
        slots: u64,
        mask: u64,
        seed: u64,
        keys: DeviceColumn,
        payloads: Option<DeviceColumn>,
    ) -> Result<BuildCounts> {
        let p = payloads.unwrap_or(DeviceColumn { values: 0, width: 0, nulls: 0, ..keys });
        if (p.n, p.blocks, p.stride, p.headers) != (keys.n, keys.blocks, keys.stride, keys.headers) {
            return Err(UvmError::new(Code::SystemError, "a GpuJoin build's key and payload columns differ in their blocks"));
        }
        let resume = self.per_thread_state(STATE_BYTES_PER_THREAD)?;
        self.result().set_bytes(0, 48)?;
        let mut params = JoinBuild {
            slots: MutPtr::new(slots),
            mask,
            seed,
            keys: Ptr::new(keys.values),
            key_width: keys.width,
            key_nulls: Ptr::new(keys.nulls),
            payloads: Ptr::new(p.values),
            payload_width: p.width,
            payload_nulls: Ptr::new(p.nulls),
            n: keys.n,
            blocks: keys.blocks,
            block_stride: keys.stride,
            headers: Ptr::new(keys.headers),
            resume: MutPtr::new(resume),
            fresh: 1,
            out: self.result_ptr(),
        };
        loop {
            // SAFETY: the kernel writes inside `mask + 1` slots at `slots` (the caller's
            // promise; every walk is bounded by mask + 1 steps), reads the rows (values, bitmap
            // bits, block counts) of each column's blocks (the caller's promise), 24 bytes per
            // thread of our per-thread state, and the first 6 words of our result buffer.
            unsafe { self.launch(self.segment().uvm_join_build(), params) }?;
            let mut b = [0u64; 6];
            self.result().read(&mut b)?;
            if b[4] != 0 {
                return Err(overcounted_block());
            }
            if b[1] == 0 {
                return Ok(BuildCounts { placed: b[5], left_out: b[0], null_payloads: b[2], null_keys: b[3] });
            }
            // A walk ran out of budget: go on where it stopped (the counts keep adding up;
            // the flag, word 1, is cleared).
            crate::interrupt::check()?;
            self.result().write(8, &[0])?;
            params.fresh = 0;
        }
    }

    unsafe fn join_probe_column(&self, inner: &Inner<'_>, keys: DeviceColumn) -> Result<(u64, i128, f64)> {
        let (r, ms) = probe_batch(self, inner, keys, 1)?;
        Ok((r[0], payload_sum(r[0], r[1], r[2])?, ms))
    }

    fn join_probe(&self, inner: &Inner<'_>, keys: &[i64]) -> Result<(u64, i128)> {
        keys.chunks(MAX_LAUNCH_KEYS).try_fold((0, 0), |(m, sum), part| {
            crate::interrupt::check()?;
            let buf = self.staging(part.len() * 8)?;
            self.stage(0, part)?;
            let (r, _) = probe_batch(self, inner, DeviceColumn::words(buf, part.len() as u64), 1)?;
            Ok((m + r[0], sum + payload_sum(r[0], r[1], r[2])?))
        })
    }

    fn join_probe_kernel_ms(&self, inner: &Inner<'_>, n: u64, key: impl Fn(u64) -> i64) -> Result<f64> {
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
        probe_batch(self, inner, DeviceColumn::words(buf, n), 2).map(|(_, ms)| ms)
    }
}

/// Probes the keys of `keys` (our staging buffer, or a column a caller vouches for) `runs`
/// times, each run as many launches as its walks' budgets need (one for a healthy table), with
/// an interrupt check between launches. Returns the last run's (matches, payload lo, payload
/// hi) and the milliseconds of its launches; a corrupted table is an ERROR (22023).
fn probe_batch(k: &Kernels, inner: &Inner<'_>, keys: DeviceColumn, runs: u32) -> Result<([u64; 3], f64)> {
    let h = inner.header();
    let resume = k.per_thread_state(STATE_BYTES_PER_THREAD)?;
    let mut params = JoinProbe {
        slots: Ptr::new(inner.slots()),
        mask: h.slot_count - 1,
        seed: h.seed,
        keys: Ptr::new(keys.values),
        key_width: keys.width,
        key_nulls: Ptr::new(keys.nulls),
        n: keys.n,
        blocks: keys.blocks,
        block_stride: keys.stride,
        headers: Ptr::new(keys.headers),
        resume: MutPtr::new(resume),
        fresh: 1,
        out: k.result_ptr(),
    };
    let mut last = ([0u64; 3], 0.0);
    for _ in 0..runs.max(1) {
        k.result().set_bytes(0, 56)?;
        params.fresh = 1;
        let mut ms = 0.0;
        let r = loop {
            let t = Instant::now();
            // SAFETY: Inner::of validated the header and bounded the `slot_count` slots inside
            // the pinned segment, which the pin behind `inner` keeps mapped; the kernel reads
            // only those (every walk is bounded by slot_count steps), the column's room (values
            // and bitmap bytes of n rows a block, block counts: staged by the caller, or vouched
            // for by its caller), 24 bytes per thread of our per-thread state, and the first 7
            // words of our result buffer.
            unsafe { k.launch(k.segment().uvm_join_probe(), params) }?;
            ms += t.elapsed().as_secs_f64() * 1e3;
            let mut r = [0u64; 7];
            k.result().read(&mut r)?;
            if r[6] != 0 {
                return Err(UvmError::new(Code::SystemError, "uvm_join_probe refused its launch's block size"));
            }
            if r[5] != 0 {
                return Err(overcounted_block());
            }
            if r[3] != 0 {
                return Err(table::corrupted(inner.name(), &format!("a probe found no empty slot in {} slots", h.slot_count)));
            }
            if r[4] == 0 {
                break r;
            }
            // A walk ran out of budget: go on where it stopped (the sums keep adding up; the
            // flag, word 4, is cleared).
            crate::interrupt::check()?;
            k.result().write(32, &[0])?;
            params.fresh = 0;
        };
        last = ([r[0], r[1], r[2]], ms);
    }
    Ok(last)
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
    /// Pairs start with the key's index plus this, not the key (`CpuAppender::indexed`).
    index_base: Option<u64>,
    pub matches: u64,
    pub sum: i128,
}

impl<'k> KernelAppender<'k> {
    pub fn new(k: &'k Kernels, keys: &'k [i64]) -> KernelAppender<'k> {
        KernelAppender { k, keys, at: 0, staged: None, fresh: true, index_base: None, matches: 0, sum: 0 }
    }

    /// With `on`, each pair starts with its key's index in `keys` plus `base`.
    pub fn indexed(self, on: bool, base: u64) -> Self {
        KernelAppender { index_base: on.then_some(base), ..self }
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
            match self.launch(part, inner, target)? {
                Launched::Need(pairs) => return Ok(Step::Need(pairs)),
                // A walk ran out of budget: the next launch goes on where it stopped.
                Launched::More => continue,
                Launched::Done => (self.at, self.staged, self.fresh) = (self.at + part.len(), None, true),
            }
        }
        Ok(Step::Done)
    }
}

/// How a launch of the materializing kernel ended.
enum Launched {
    /// Every key of the part is done.
    Done,
    /// The buffer must hold this many pairs before the next launch resumes.
    Need(u64),
    /// A walk ran out of its budget: launch again.
    More,
}

impl KernelAppender<'_> {
    /// One launch over `part` (staged on its first launch): starts it, or resumes it.
    fn launch(&mut self, part: &[i64], inner: &Inner<'_>, target: Target<'_>) -> Result<Launched> {
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
        let resume = k.per_thread_state(STATE_BYTES_PER_THREAD)?;
        k.result().set_bytes(0, 56)?;
        let h = inner.header();
        let base = target.base();
        let params = JoinMaterialize {
            slots: Ptr::new(inner.slots()),
            mask: h.slot_count - 1,
            seed: h.seed,
            keys: Ptr::new(keys),
            n: part.len() as u64,
            pairs: MutPtr::new(base + pairs::HEADER_BYTES),
            next: MutPtr::new(base + pairs::NEXT_AT),
            written: MutPtr::new(base + pairs::WRITTEN_AT),
            cap: target.cap(),
            resume: MutPtr::new(resume),
            fresh: u64::from(self.fresh),
            ctl: k.result_ptr(),
            indexed: u64::from(self.index_base.is_some()),
            // The part starts at `at` of this appender's keys.
            index_base: self.index_base.unwrap_or(0).wrapping_add(self.at as u64),
        };
        // SAFETY: Inner::of and Target::of validated both headers and bounded both ranges
        // inside their pinned segments, which the pins behind `inner` and `target` keep mapped:
        // the kernel reads only the `slot_count` slots (every walk bounded), writes pairs only
        // below `cap` and the header's `next` and `written` words. It reads the part's keys
        // from our staging buffer (staged on the part's first launch and not replaced since:
        // nothing else stages while this appender runs), 64 bytes per thread of our per-thread
        // state, and the 7 words of our result buffer.
        unsafe { k.launch(k.segment().uvm_join_materialize(), params) }?;
        self.fresh = false;
        let mut c = [0u64; 7];
        k.result().read(&mut c)?;
        self.matches += c[2];
        self.sum += payload_sum(c[2], c[3], c[4])?;
        if c[5] != 0 {
            // Some reservations stay partly unwritten: readers see written != next.
            return Err(table::corrupted(
                inner.name(),
                "a probe found no empty slot or the table changed while it was probed (or the result buffer's counters are corrupted)",
            ));
        }
        Ok(if c[0] != 0 {
            Launched::Need(c[1])
        } else if c[6] != 0 {
            Launched::More
        } else {
            Launched::Done
        })
    }
}

/// Keys per second of the GpuJoin probe kernel alone (no scan, no staging copy) over `keys`
/// pseudo-random int8 keys in `[0, key_range)`, against the int8 table in `pin`: at most
/// `MAX_BENCH_KEYS` keys (54000 beyond, 22023 below one), generated on the fly, so that the
/// request sizes no host allocation.
pub fn join_probe<E: crate::segment::Env>(pin: &crate::segment::Pin<E>, keys: i64, key_range: i64) -> Result<f64> {
    let inner = Inner::of(pin, table::KeyType::Int8, false)?;
    join_probe_view(&inner, keys, key_range)
}

/// [`join_probe`] against a table already viewed (the GPU service's form).
pub fn join_probe_view(inner: &Inner<'_>, keys: i64, key_range: i64) -> Result<f64> {
    if keys < 1 || key_range < 1 {
        return Err(UvmError::new(
            Code::InvalidParameterValue,
            format!("keys and key_range must be positive, not {keys} and {key_range}"),
        ));
    }
    if keys as u64 > MAX_BENCH_KEYS {
        return Err(UvmError::new(
            Code::ProgramLimitExceeded,
            format!("a probe benchmark takes at most {MAX_BENCH_KEYS} keys, not {keys}"),
        ));
    }
    let range = key_range as u64;
    let ms = crate::gpu::gpu()?
        .with_kernels(|k| k.join_probe_kernel_ms(inner, keys as u64, |i| (crate::checksum::mix(i) % range) as i64))?;
    Ok(keys as f64 / (ms / 1e3))
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
