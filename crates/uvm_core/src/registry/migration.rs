//! The registry's part in migrations: a segment's chunks replaced by chunks of another place,
//! and the host pool of pieces that such replacements take from and give back to.
//!
//! A migration runs in three steps, each under the exclusive lock and short, with the copying
//! in between done without any lock:
//!
//! 1. `begin_migration` refuses while a pin is held, then sets the segment's MIGRATING flag:
//!    from here no new pin is granted ([`Registry::pin_must_wait`] says why a pin waits) and
//!    the segment cannot be dropped. A migration that finds pins records itself first
//!    (`wait_to_migrate`), so that readers pinning in turn queue behind it instead of starving
//!    it (a process that already holds a pin passes: it would otherwise wait for itself).
//! 2. `reserve_replacement` records pending chunks at the new place that tile a live chunk's
//!    range (from the host pool with `take_pool_chunk` where a piece of the right size is
//!    there). The migrating process allocates and fills them.
//! 3. `replace_chunk_by` swaps them in for the old chunk and bumps the generation, so every
//!    process remaps before its next access; the old chunk's id goes back to the caller to
//!    release at the broker, or, a host chunk, becomes a piece of the pool. `end_migration`
//!    clears the flag.
//!
//! As with growth (the parent module's lifecycle), the broker holds only the fds of ids the
//! registry knows, pending or live: a replacement is pending from its reservation until it is
//! swapped in, and its fd reaches the broker in between.
//!
//! The host pool: chunks in the `POOL` state belong to no segment; the GPU service keeps them
//! (pinned memory, slow to make) ready for migrations to the host tier (`reserve_pool_chunk`,
//! `commit_pool_chunk`, `take_pool_chunk`, `trim_pool`). They are counted in `pool_bytes`, not
//! in the host tier's bytes, until a segment takes one.

use std::sync::atomic::Ordering;

use super::{
    ChunkSlot, PendingChunk, Place, Registry, CHUNK_LIVE, CHUNK_PENDING, CHUNK_POOL, FLAG_MIGRATING, MAX_CHUNKS_PER_SEGMENT,
    PIN_COUNT_MASK,
};
use crate::error::{Code, Result, UvmError};
use crate::uvm_err;

impl Registry {
    /// Whether a migration is under way (new pins wait for it to end).
    pub fn migrating(&self, slot: u32) -> bool {
        self.seg(slot).flags & FLAG_MIGRATING != 0
    }

    /// Starts a migration of some of the segment's chunks. Refuses (55006) while any process
    /// holds a pin or another migration runs; from here until `end_migration` no new pin is
    /// granted and the segment cannot be dropped, so chunks can be replaced under nobody's feet.
    pub fn begin_migration(&mut self, slot: u32) -> Result<()> {
        let s = self.seg(slot);
        let name = Self::seg_name(s).to_string();
        if s.flags & FLAG_MIGRATING != 0 {
            return Err(uvm_err!(Code::ObjectInUse, "segment \"{name}\" is being migrated by another process"));
        }
        let pins = s.pins.load(Ordering::Acquire);
        if pins > 0 {
            return Err(
                uvm_err!(Code::ObjectInUse, "segment \"{name}\" is in use").detail(format!("{pins} pin(s) are held on it."))
            );
        }
        self.seg_mut(slot).flags |= FLAG_MIGRATING;
        Ok(())
    }

    /// Ends a migration begun with `begin_migration`.
    pub fn end_migration(&mut self, slot: u32) {
        self.seg_mut(slot).flags &= !FLAG_MIGRATING;
    }

    /// Records a migration that waits for the segment's pins to drain: from here until
    /// [`Registry::stop_waiting_to_migrate`], new pins of processes that hold none on the
    /// segment wait behind it, as a lock request waits behind a queued stronger one, so that
    /// readers pinning in turn cannot starve the migration.
    pub fn wait_to_migrate(&mut self, slot: u32) {
        let s = self.seg_mut(slot);
        s.migrations_waiting = s.migrations_waiting.saturating_add(1);
    }

    /// Withdraws one [`Registry::wait_to_migrate`] (the migration began, or gave up).
    pub fn stop_waiting_to_migrate(&mut self, slot: u32) {
        let s = self.seg_mut(slot);
        s.migrations_waiting = s.migrations_waiting.saturating_sub(1);
    }

    /// How many migrations wait for the segment's pins to drain.
    pub fn migrations_waiting(&self, slot: u32) -> u32 {
        self.seg(slot).migrations_waiting
    }

    /// Whether a new pin of the segment must wait: a migration runs, or one waits for the pins
    /// to drain and the pinning process (attachment `att`) holds no pin on the segment yet (a
    /// process that holds one passes: it could otherwise wait for itself).
    pub fn pin_must_wait(&self, slot: u32, att: u32) -> Option<PinWait> {
        let s = self.seg(slot);
        if s.flags & FLAG_MIGRATING != 0 {
            Some(PinWait::Migrating)
        } else if s.migrations_waiting > 0 && self.att(att).pins.load(Ordering::Acquire) & PIN_COUNT_MASK == 0 {
            Some(PinWait::MigrationWaiting)
        } else {
            None
        }
    }

    /// Records a pending chunk at `place` that will replace `[offset, offset + size)` of live
    /// chunk `old_id` (all of it, or one of the parts it is cut into; see `replace_chunk_by`).
    /// Needs a free chunk slot.
    pub fn reserve_replacement(&mut self, slot: u32, old_id: u64, offset: u64, size: u64, place: Place) -> Result<PendingChunk> {
        let seg_id = self.seg(slot).id;
        self.live_chunk(seg_id, old_id)
            .filter(|&(o, s)| o <= offset && offset.checked_add(size).is_some_and(|end| end <= o + s))
            .ok_or_else(|| uvm_err!(Code::ObjectInUse, "chunk {old_id} changed during migration"))?;
        let ci = self.free_chunk_slot()?;
        let id = self.hdr().next_chunk_id;
        self.hdr_mut().next_chunk_id += 1;
        *self.chunk_mut(ci) = ChunkSlot::pending(id, seg_id, offset, size, place);
        self.account(place, size as i128);
        Ok(PendingChunk { slot: ci, id, segment_id: seg_id, offset, size, place })
    }

    /// (offset, size) of live chunk `id` of segment `seg_id`.
    fn live_chunk(&self, seg_id: u64, id: u64) -> Option<(u64, u64)> {
        (0..self.hdr().max_chunks)
            .map(|i| self.chunk(i))
            .find(|c| c.id == id && c.state == CHUNK_LIVE && c.segment_id == seg_id)
            .map(|c| (c.offset, c.size))
    }

    /// Swaps a pending replacement in for live chunk `old_id`; see `replace_chunk_by`.
    pub fn replace_chunk(&mut self, p: &PendingChunk, old_id: u64) -> Result<u64> {
        self.replace_chunk_by(std::slice::from_ref(p), old_id, false).map(|id| id.expect("not kept in the pool"))
    }

    /// Swaps pending chunks `ps`, which tile live chunk `old_id`'s range in order, in for it,
    /// adjusts the per-tier, per-GPU and pool totals and bumps the generation (every process
    /// remaps before its next access). The old chunk becomes a piece of the host pool if
    /// `to_pool` (it must be a host chunk; its id stays known, and the broker keeps its fd);
    /// otherwise its id is returned for the caller to release at the broker.
    pub fn replace_chunk_by(&mut self, ps: &[PendingChunk], old_id: u64, to_pool: bool) -> Result<Option<u64>> {
        let changed = || uvm_err!(Code::ObjectInUse, "chunk {old_id} changed during migration");
        let seg_id = ps.first().map(|p| p.segment_id).ok_or_else(changed)?;
        let slot = self
            .find_id(seg_id)
            .ok_or_else(|| UvmError::new(Code::UndefinedObject, "segment was dropped while it was migrating"))?;
        let pos = {
            let s = self.seg(slot);
            s.chunks[..s.nchunks as usize].iter().position(|&ci| self.chunk(ci).id == old_id)
        }
        .ok_or_else(changed)?;
        let old_ci = self.seg(slot).chunks[pos];
        let (old_offset, old_size, old_place) = {
            let c = self.chunk(old_ci);
            (c.offset, c.size, c.place())
        };
        // The parts must tile the old range, each a pending chunk of this segment.
        let mut end = old_offset;
        for p in ps {
            let c = self.chunk(p.slot);
            if p.offset != end || c.id != p.id || c.state != CHUNK_PENDING || c.segment_id != seg_id {
                return Err(changed());
            }
            end += p.size;
        }
        let nchunks = self.seg(slot).nchunks as usize;
        if end != old_offset + old_size || nchunks - 1 + ps.len() > MAX_CHUNKS_PER_SEGMENT {
            return Err(changed());
        }
        // The parts are counted since they were reserved; the old chunk stops counting now.
        for p in ps {
            self.chunk_mut(p.slot).state = CHUNK_LIVE;
        }
        self.account(old_place, -(old_size as i128));
        let kept = to_pool && old_place == Place::Host;
        if kept {
            let c = self.chunk_mut(old_ci);
            (c.state, c.segment_id, c.offset) = (CHUNK_POOL, 0, 0);
            self.hdr_mut().pool_bytes += old_size;
        } else {
            *self.chunk_mut(old_ci) = ChunkSlot::FREE;
        }
        let s = self.seg_mut(slot);
        // The tail after the old chunk moves up to make room for the extra parts.
        s.chunks.copy_within(pos + 1..nchunks, pos + ps.len());
        for (k, p) in ps.iter().enumerate() {
            s.chunks[pos + k] = p.slot;
        }
        s.nchunks = (nchunks - 1 + ps.len()) as u32;
        s.generation += 1;
        Ok((!kept).then_some(old_id))
    }

    /// Bytes in the host pool's pieces.
    pub fn pool_bytes(&self) -> u64 {
        self.hdr().pool_bytes
    }

    /// The host pool's pieces: (chunk id, size).
    pub fn pool_chunks(&self) -> Vec<(u64, u64)> {
        (0..self.hdr().max_chunks).map(|i| self.chunk(i)).filter(|c| c.state == CHUNK_POOL).map(|c| (c.id, c.size)).collect()
    }

    /// Records a pending piece of `size` bytes for the host pool (no segment owns it). The
    /// caller allocates it, hands its fd to the broker and calls `commit_pool_chunk`, or
    /// `abort_chunk`.
    pub fn reserve_pool_chunk(&mut self, size: u64) -> Result<PendingChunk> {
        let ci = self.free_chunk_slot()?;
        let id = self.hdr().next_chunk_id;
        self.hdr_mut().next_chunk_id += 1;
        *self.chunk_mut(ci) = ChunkSlot::pending(id, 0, 0, size, Place::Host);
        Ok(PendingChunk { slot: ci, id, segment_id: 0, offset: 0, size, place: Place::Host })
    }

    /// Adds a pending piece to the host pool.
    pub fn commit_pool_chunk(&mut self, p: &PendingChunk) -> Result<()> {
        let c = self.chunk_mut(p.slot);
        if c.id != p.id || c.state != CHUNK_PENDING || c.segment_id != 0 {
            return Err(UvmError::new(Code::ObjectInUse, "a host pool piece changed before it was added"));
        }
        c.state = CHUNK_POOL;
        self.hdr_mut().pool_bytes += p.size;
        Ok(())
    }

    /// Takes a piece of exactly `size` bytes from the host pool as a pending replacement of
    /// `[offset, offset + size)` of segment `slot` (the broker keeps its fd under the same id);
    /// `None` if the pool has none.
    pub fn take_pool_chunk(&mut self, slot: u32, offset: u64, size: u64) -> Option<PendingChunk> {
        let seg_id = self.seg(slot).id;
        let ci = (0..self.hdr().max_chunks).find(|&i| {
            let c = self.chunk(i);
            c.state == CHUNK_POOL && c.size == size
        })?;
        let c = self.chunk_mut(ci);
        (c.state, c.segment_id, c.offset) = (CHUNK_PENDING, seg_id, offset);
        let id = c.id;
        self.hdr_mut().pool_bytes -= size;
        self.account(Place::Host, size as i128);
        Some(PendingChunk { slot: ci, id, segment_id: seg_id, offset, size, place: Place::Host })
    }

    /// Removes a piece from the host pool that is not `keep_size` bytes or that `keep` refuses,
    /// or any piece if the pool holds more than `target` bytes; returns its id for the caller to
    /// release at the broker.
    pub fn trim_pool(&mut self, target: u64, keep_size: u64, keep: impl Fn(u64) -> bool) -> Option<u64> {
        let over = self.hdr().pool_bytes > target;
        let ci = (0..self.hdr().max_chunks).find(|&i| {
            let c = self.chunk(i);
            c.state == CHUNK_POOL && (over || c.size != keep_size || !keep(c.id))
        })?;
        let (id, size) = (self.chunk(ci).id, self.chunk(ci).size);
        *self.chunk_mut(ci) = ChunkSlot::FREE;
        self.hdr_mut().pool_bytes -= size;
        Some(id)
    }
}

/// Why a new pin waits ([`Registry::pin_must_wait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinWait {
    /// A migration replaces the segment's chunks.
    Migrating,
    /// A migration waits for the pins held now to drain.
    MigrationWaiting,
}
