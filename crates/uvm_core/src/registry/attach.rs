//! Attachments and pins: which process maps which segment, and the pins that keep a segment's
//! chunks from being dropped or migrated while a process uses them.
//!
//! An attachment slot records one process's mapping of one segment (its base address, whether
//! it is the segment's own address, the generation it has mapped). Its pin count is an atomic
//! beside the segment's own, with the slot's incarnation in its high 32 bits: pinning takes the
//! shared lock and adds one to both (`pin_attached`), and only the [`HeldPin`] it returns can
//! take them back, without a lock. Freeing the slot (`detach`, or `detach_process` at a
//! process's exit) gives back the pins it still counts and bumps the incarnation, so a
//! `HeldPin` of the old incarnation released later does nothing: no count is given back twice.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::{AttachInfo, Registry, PIN_COUNT_MASK};
use crate::error::{Code, Result};
use crate::stats::SegmentCounters;
use crate::uvm_err;

/// A pin that a process holds on a segment through one of its attachments (taken with
/// [`Registry::pin_attached`]); dropping it gives the pin back, with no lock (two atomic
/// decrements).
///
/// It is the only way to release a pin, once: neither `Copy` nor `Clone`, and made only by
/// `pin_attached`, so safe code cannot drive a pin count below the pins actually held (which
/// would let a drop or a migration proceed under a process still using the chunks). If the
/// attachment was detached meanwhile (its pins were given back, say at process exit), dropping
/// the `HeldPin` does nothing: the slot's incarnation changed.
#[must_use = "dropping a HeldPin releases the pin at once"]
pub struct HeldPin {
    seg_pins: *const AtomicU32,
    att_pins: *const AtomicU64,
    stats: *const SegmentCounters,
    incarnation: u32,
    slot: u32,
    att: u32,
}

impl HeldPin {
    /// The segment slot pinned.
    pub fn slot(&self) -> u32 {
        self.slot
    }
    /// The attachment slot the pin is counted on.
    pub fn att(&self) -> u32 {
        self.att
    }
    /// The pinned segment's counters (while the pin is held, the slot is this segment's).
    pub fn counters(&self) -> &SegmentCounters {
        // SAFETY: points into the registry block, mapped while any HeldPin is used (as for the
        // pin counts); the counters are atomics.
        unsafe { &*self.stats }
    }
}

impl Drop for HeldPin {
    fn drop(&mut self) {
        // SAFETY: both point into the registry block, which stays mapped while any HeldPin is
        // used (the contract of `Registry::init` and `Registry::from_raw`); only atomics are
        // touched, which needs no lock.
        let (seg, att) = unsafe { (&*self.seg_pins, &*self.att_pins) };
        let inc = self.incarnation as u64;
        // Attachment first, then segment: a concurrent `detach` (exclusive lock) gives back the
        // attachment's count as it finds it, so each pin is given back exactly once.
        let ours = att
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| (v >> 32 == inc && v & PIN_COUNT_MASK > 0).then(|| v - 1))
            .is_ok();
        if ours {
            let _ = seg.fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| p.checked_sub(1));
        }
    }
}

impl Registry {
    /// Records that process `pid` maps segment `segment_id` at `base`.
    pub fn attach(&mut self, pid: i32, segment_id: u64, base: u64, same_address: bool, generation: u64) -> Result<u32> {
        let i = (0..self.hdr().max_attachments).find(|&i| self.att(i).pid == 0).ok_or_else(|| {
            uvm_err!(
                Code::ConfigurationLimitExceeded,
                "too many segment attachments (pg_uvm_share.max_attachments = {})",
                self.hdr().max_attachments
            )
            .hint("Raise pg_uvm_share.max_attachments (needs a restart).")
        })?;
        let a = self.att_mut(i);
        a.pid = pid;
        a.segment_id = segment_id;
        a.base = base;
        a.same_address = same_address as u32;
        a.mapped_generation = generation;
        // Keep the incarnation (bumped when the slot was freed), no pins.
        let inc = a.pins.load(Ordering::Acquire) >> 32;
        a.pins.store(inc << 32, Ordering::Release);
        Ok(i)
    }

    /// Updates the generation an attachment has mapped.
    pub fn set_mapped_generation(&mut self, att: u32, generation: u64) {
        self.att_mut(att).mapped_generation = generation;
    }

    /// Frees an attachment slot, giving back any pins still counted on it. The slot's next
    /// incarnation begins: a [`HeldPin`] of this attachment released later does nothing.
    pub fn detach(&mut self, att: u32) {
        let (seg_id, pins) = {
            let a = self.att(att);
            let inc = (a.pins.load(Ordering::Acquire) >> 32).wrapping_add(1) & PIN_COUNT_MASK;
            (a.segment_id, (a.pins.swap(inc << 32, Ordering::AcqRel) & PIN_COUNT_MASK) as u32)
        };
        if pins > 0 {
            if let Some(slot) = self.find_id(seg_id) {
                let _ = self.seg(slot).pins.fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| Some(p.saturating_sub(pins)));
            }
        }
        let a = self.att_mut(att);
        a.pid = 0;
        a.segment_id = 0;
    }

    /// Pins a segment on behalf of an attachment (shared lock suffices), so that the pin is
    /// visible per process and can be given back if the process exits while holding it. Pins
    /// block drops and migrations; dropping the returned [`HeldPin`] releases the pin.
    ///
    /// Nobody pins without the lock, so a writer holding the exclusive lock sees stable counts.
    pub fn pin_attached(&self, slot: u32, att: u32) -> HeldPin {
        let seg_pins: *const AtomicU32 = &self.seg(slot).pins;
        let att_pins: *const AtomicU64 = &self.att(att).pins;
        let stats: *const SegmentCounters = &self.seg(slot).stats;
        self.seg(slot).stats.pinned();
        // Segment first, then attachment (the reverse of the release); the lock keeps `detach`
        // out meanwhile, so the incarnation read here is the attachment's.
        self.seg(slot).pins.fetch_add(1, Ordering::AcqRel);
        let v = self.att(att).pins.fetch_add(1, Ordering::AcqRel);
        HeldPin { seg_pins, att_pins, stats, incarnation: (v >> 32) as u32, slot, att }
    }

    /// Every attachment of every process.
    pub fn attachments(&self) -> Vec<AttachInfo> {
        (0..self.hdr().max_attachments)
            .map(|i| self.att(i))
            .filter(|a| a.pid != 0)
            .map(|a| AttachInfo {
                pid: a.pid,
                segment_id: a.segment_id,
                base: a.base,
                same_address: a.same_address != 0,
                mapped_generation: a.mapped_generation,
                pins: (a.pins.load(Ordering::Acquire) & PIN_COUNT_MASK) as u32,
            })
            .collect()
    }

    /// Whether process `pid` holds a pin on segment `segment_id` (a bounded scan of the
    /// attachment slots).
    pub fn holds_pin(&self, pid: i32, segment_id: u64) -> bool {
        (0..self.hdr().max_attachments)
            .map(|i| self.att(i))
            .any(|a| a.pid == pid && a.segment_id == segment_id && a.pins.load(Ordering::Acquire) & PIN_COUNT_MASK > 0)
    }

    /// Frees every attachment slot of `pid` (process exit), and its progress rows.
    pub fn detach_process(&mut self, pid: i32) {
        self.hdr().progress.iter().for_each(|s| s.release(pid));
        for i in 0..self.hdr().max_attachments {
            if self.att(i).pid == pid {
                self.detach(i);
            }
        }
    }
}
