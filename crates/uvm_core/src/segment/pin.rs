//! Pins: a process's guard on a segment it maps ([`Pin`]), whose accessors check every range
//! against the snapshot the pin was granted with, and give kernels their addresses (making the
//! chunks ready for them first: `Mapping::ready_for_kernels`). `Segments::pin` in `super` grants
//! them; the module essay of `super` ("The pin / generation protocol") says what a pin holds off.

use std::marker::PhantomData;
use std::rc::Rc;

use super::{cpu_segment, Env, Mapping};
use crate::error::{Code, Result};
use crate::registry::{HeldPin, SegmentInfo, Tier};
use crate::uvm_err;

/// A pinned, mapped segment: the memory stays valid until the guard is dropped.
///
/// A pin owns a share of this process's mapping of the segment and the registry pin
/// ([`HeldPin`]), not a borrow of the manager, so a process can hold pins on several segments at
/// once (a join's inner table and its result). Its fields are private: every access goes through
/// the bounds-checked accessors, against the snapshot taken when the pin was granted, which
/// `Segments::pin` checked against the chunks this process actually mapped.
pub struct Pin<E: Env> {
    pub(super) mapping: Rc<Mapping>,
    pub(super) held: HeldPin,
    pub(super) info: SegmentInfo,
    pub(super) base: *mut u8,
    pub(super) map_ms: f64,
    pub(super) _env: PhantomData<E>,
}

impl<E: Env> Pin<E> {
    /// The snapshot of the segment's entry that the pin protects (its size bounds every access).
    pub fn info(&self) -> &SegmentInfo {
        &self.info
    }

    /// The segment's address in this process. Dereferencing it is the caller's `unsafe`
    /// business; [`Pin::addr`] gives bounds-checked addresses.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Counts `bytes` read from the segment (its `uvm.stat_segments` row).
    pub fn count_read(&self, bytes: u64) {
        self.held.counters().read(bytes);
    }

    /// Counts `bytes` written to the segment.
    pub fn count_written(&self, bytes: u64) {
        self.held.counters().written(bytes);
    }

    /// Milliseconds spent mapping chunks for this pin (0 when the mapping was current).
    pub fn map_ms(&self) -> f64 {
        self.map_ms
    }

    /// Whether this process's CPU addresses chunks of `tier` at `base() + offset` (not device
    /// chunks under CUDA, nor in service mode's client processes, which map only host-tier
    /// memfds).
    pub fn cpu_mapped(&self, tier: Tier) -> bool {
        self.mapping.cpu_accessible(tier)
    }

    /// Whether this process's CPU addresses every byte of `[offset, offset + len)` (checked
    /// against the segment's size first: 22023 or 2202E past it).
    pub fn cpu_mapped_range(&self, offset: i64, len: i64) -> Result<bool> {
        let (o, l) = self.check_range(offset, len)?;
        Ok(self.check_cpu(o, l).is_ok())
    }

    /// Checks `[offset, offset + len)` against the segment's size and returns it as a range.
    pub fn check_range(&self, offset: i64, len: i64) -> Result<(usize, usize)> {
        check_range(&self.info, offset, len)
    }

    /// Fails unless the CPU can address every chunk under `[o, o + l)` directly.
    fn check_cpu(&self, o: usize, l: usize) -> Result<()> {
        let (start, end) = (o as u64, (o + l) as u64);
        match self
            .info
            .chunks
            .iter()
            .find(|c| c.offset < end && start < c.offset + c.size && !self.mapping.cpu_accessible(c.tier))
        {
            None => Ok(()),
            Some(c) => Err(uvm_err!(
                Code::FeatureNotSupported,
                "bytes at offset {} of segment \"{}\" are in the {} tier, which the CPU cannot address",
                c.offset.max(start),
                self.info.name,
                c.tier.name()
            )),
        }
    }

    /// The bytes `[offset, offset + len)` as a slice, when the CPU can address all of them.
    ///
    /// Other processes (and other pins of this one) may write the same bytes meanwhile, as with
    /// any shared memory: what the slice shows is then a snapshot in progress.
    pub fn bytes(&self, offset: i64, len: i64) -> Result<&[u8]> {
        let (o, l) = self.check_range(offset, len)?;
        self.check_cpu(o, l)?;
        // SAFETY: the range lies within `info.size`, which the chunks this process mapped cover
        // (checked when the pin was granted), is CPU-accessible (checked), and the pin keeps the
        // mapping alive for the guard's life.
        Ok(unsafe { std::slice::from_raw_parts(self.base.add(o), l) })
    }

    /// The bytes `[offset, offset + len)` for writing, when the CPU can address all of them.
    pub fn bytes_mut(&mut self, offset: i64, len: i64) -> Result<&mut [u8]> {
        let (o, l) = self.check_range(offset, len)?;
        self.check_cpu(o, l)?;
        // SAFETY: as in `bytes`; concurrent writers to a segment are the user's business, as
        // for any shared memory; the range is mapped read-write.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.add(o), l) })
    }

    /// Splits `[o, o + l)` at chunk boundaries: (chunk tier, segment offset, length) per piece.
    fn pieces(&self, o: usize, l: usize) -> Vec<(Tier, usize, usize)> {
        let (start, end) = (o as u64, (o + l) as u64);
        self.info
            .chunks
            .iter()
            .filter(|c| c.offset < end && start < c.offset + c.size)
            .map(|c| {
                let a = c.offset.max(start);
                let b = (c.offset + c.size).min(end);
                (c.tier, a as usize, (b - a) as usize)
            })
            .collect()
    }

    /// Copies `[offset, offset + dst.len())` into `dst`: directly where the CPU can address the
    /// chunk, with the provider's copy (cuMemcpy) chunk by chunk where it cannot.
    pub fn read_into(&self, offset: i64, dst: &mut [u8]) -> Result<()> {
        let (o, l) = self.check_range(offset, dst.len() as i64)?;
        for (tier, at, n) in self.pieces(o, l) {
            let d = &mut dst[at - o..at - o + n];
            // SAFETY: [at, at + n) lies in one mapped chunk (pieces), pinned; `d` is ours.
            unsafe {
                let src = self.base.add(at);
                if self.mapping.cpu_accessible(tier) {
                    std::ptr::copy_nonoverlapping(src, d.as_mut_ptr(), n);
                } else {
                    self.mapping.provider.copy(d.as_mut_ptr(), src, n)?;
                }
            }
        }
        Ok(())
    }

    /// Copies `src` to `[offset, offset + src.len())`, as `read_into` does the other way.
    pub fn write_from(&mut self, offset: i64, src: &[u8]) -> Result<()> {
        let (o, l) = self.check_range(offset, src.len() as i64)?;
        for (tier, at, n) in self.pieces(o, l) {
            let s = &src[at - o..at - o + n];
            // SAFETY: as in `read_into`, the other way.
            unsafe {
                let dst = self.base.add(at);
                if self.mapping.cpu_accessible(tier) {
                    std::ptr::copy_nonoverlapping(s.as_ptr(), dst, n);
                } else {
                    self.mapping.provider.copy(dst, s.as_ptr(), n)?;
                }
            }
        }
        Ok(())
    }

    /// `[offset, offset + len)` split at chunk boundaries: (address, length, whether the CPU
    /// addresses it directly) per piece, in order. For copies made on another thread while this
    /// pin is held (the GPU service's executors).
    pub fn pieces_at(&self, offset: i64, len: i64) -> Result<Vec<(u64, usize, bool)>> {
        let (o, l) = self.check_range(offset, len)?;
        Ok(self
            .pieces(o, l)
            .into_iter()
            .map(|(t, at, n)| (self.base as u64 + at as u64, n, self.mapping.cpu_accessible(t)))
            .collect())
    }

    /// The address of byte `offset` (for kernels), bounds-checked with `len`. A `cpu` segment's
    /// memory has no address for kernels (nothing maps it on a GPU: a kernel reading it would
    /// lose the CUDA context), so it is refused (0A000) here, under every provider and engine,
    /// so that what runs on the CPU in CI refuses exactly what a GPU would.
    pub fn addr(&self, offset: i64, len: i64) -> Result<u64> {
        let (o, _) = self.check_range(offset, len)?;
        if self.mapping.cpu_only {
            return Err(cpu_segment(&self.info.name, "GPU kernels do not read it")
                .hint("Create the segment in another tier (\"auto\", \"device\" or \"host\") for kernels."));
        }
        // Kernels may reach past `len` (a result buffer's header hands out the whole buffer):
        // every chunk is made ready, not only those under the range.
        self.mapping.ready_for_kernels()?;
        Ok(self.base as u64 + o as u64)
    }

    /// Keeps the registry pin past the guard's life (a session pin); the mapping share goes.
    pub(super) fn into_session(self) -> HeldPin {
        self.held
    }
}

/// Checks `[offset, offset + len)` against a segment's size; returns (offset, len).
pub fn check_range(info: &SegmentInfo, offset: i64, len: i64) -> Result<(usize, usize)> {
    if offset < 0 {
        return Err(uvm_err!(Code::InvalidParameterValue, "offset must not be negative: {offset}"));
    }
    if len < 0 {
        return Err(uvm_err!(Code::InvalidParameterValue, "length must not be negative: {len}"));
    }
    let (o, l) = (offset as u64, len as u64);
    match o.checked_add(l) {
        Some(end) if end <= info.size => Ok((o as usize, l as usize)),
        _ => Err(uvm_err!(
            Code::OutOfRange,
            "range [{offset}, {offset} + {len}) is outside segment \"{}\" of {} bytes",
            info.name,
            info.size
        )),
    }
}
