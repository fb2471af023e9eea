//! The GPU service's host pool: pinned host pieces of `limits.pool_piece` bytes, up to
//! `limits.pool_size`, kept at the broker so that a migration to the host tier takes them
//! instead of pinning memory (`super::migrate`), and the service's mappings of them for copies
//! ([`KeptMaps`]). `docs/ARCHITECTURE.md`, "Migration", has the measurements.
//!
//! A piece is added in two halves around the slow part: [`Segments::pool_begin`] records it
//! pending in the registry, its [`PieceMaker`] pins it (and in the service maps it for copies)
//! on any thread, [`Segments::pool_finish`] hands its fd to the broker and commits it, or
//! aborts it. [`Segments::pool_step`] does all of it on the caller's thread.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::migrate::CopyMap;
use super::{Env, PendingGuard, Segments};
use crate::error::Result;
use crate::provider::Provider;
use crate::registry::{PendingChunk, Place, Tier};

impl<E: Env> Segments<E> {
    /// Brings the host pool one step closer to `limits.pool_size` (one piece added, or one
    /// released: of another size than `limits.pool_piece`, or past the size); whether it did
    /// anything. Making a piece pins host memory (about 0.17 s per GiB, 45-64 ms for 256 MB
    /// on the H200 and H100), here on the caller's thread: the GPU service makes its pieces on
    /// a thread of their own instead ([`Segments::pool_begin`]), so that no request waits.
    pub fn pool_step(&mut self) -> Result<bool> {
        match self.pool_begin()? {
            PoolTurn::Idle => Ok(false),
            PoolTurn::Trimmed => Ok(true),
            PoolTurn::Make(piece) => {
                let made = piece.maker().make();
                self.pool_finish(piece, made)?;
                Ok(true)
            }
        }
    }

    /// The registry's half of a pool step: releases one piece the pool should not keep (of
    /// another size, past the pool's size, or, in the GPU service, one not kept mapped for
    /// copies: `Trimmed`), or records a pending piece for the caller to make with its
    /// [`PoolPiece::maker`], on any thread, and hand to [`Segments::pool_finish`].
    pub fn pool_begin(&mut self) -> Result<PoolTurn> {
        let (size, piece) = (self.limits.pool_size, self.limits.pool_piece);
        let mut reg = self.env.exclusive()?;
        let epoch = reg.epoch();
        // In the GPU service, a piece it does not keep mapped for copies (a segment's host chunk
        // of the piece's size that a migration gave back to the pool) is replaced by one it
        // does: a migration into it would map it on its path.
        let kept = &self.kept;
        if let Some(id) = reg.trim_pool(size, piece, |id| !kept.on || kept.maps.contains_key(&id)) {
            drop(reg);
            self.release(epoch, id);
            return Ok(PoolTurn::Trimmed);
        }
        if piece == 0 || reg.pool_bytes() + piece > size {
            return Ok(PoolTurn::Idle);
        }
        let pending = reg.reserve_pool_chunk(piece)?;
        let maker = PieceMaker { provider: Arc::clone(&self.provider), size: piece, map: self.kept.on };
        Ok(PoolTurn::Make(PoolPiece { pending, epoch, size: piece, maker }))
    }

    /// Adds a piece begun by [`Segments::pool_begin`] to the pool: hands `made`, its chunk, to
    /// the broker and commits it. An error in `made` (or here) aborts the pending piece.
    pub fn pool_finish(&mut self, piece: PoolPiece, made: Result<MadePiece>) -> Result<()> {
        let mut guard = PendingGuard::new(self, vec![(piece.pending, false)], piece.epoch);
        let made = made?;
        guard.segs.with_broker(|b| b.put(piece.epoch, piece.pending.id, made.fd.as_fd()))?;
        guard.parts[0].1 = true;
        guard.segs.env.exclusive()?.commit_pool_chunk(&piece.pending)?;
        guard.committed = true;
        if let Some(m) = made.map {
            guard.segs.kept.maps.insert(piece.pending.id, m);
        }
        Ok(())
    }

    /// Keeps pool-sized host chunks mapped for copies ([`KeptMaps`]; the GPU service), or stops.
    pub fn keep_pool_mappings(&mut self, on: bool) {
        self.kept.on = on;
        if !on {
            self.kept.maps.clear();
        }
    }

    /// How many chunks this process keeps mapped for copies.
    pub fn kept_mappings(&self) -> usize {
        self.kept.maps.len()
    }

    /// Drops the kept mappings of chunks the registry no longer knows (released by another
    /// process, or by a path that did not say so here).
    pub fn sweep_kept_maps(&mut self) -> Result<()> {
        if self.kept.maps.is_empty() {
            return Ok(());
        }
        let known: std::collections::HashSet<u64> = self.env.shared()?.known_chunk_ids().into_iter().collect();
        self.kept.maps.retain(|id, _| known.contains(id));
        Ok(())
    }
}

/// What [`Segments::pool_begin`] did.
pub enum PoolTurn {
    /// The pool has its size (or cannot take a piece of `pool_piece` bytes).
    Idle,
    /// A piece was released.
    Trimmed,
    /// A piece is pending in the registry: make its chunk, then [`Segments::pool_finish`].
    Make(PoolPiece),
}

/// A host-pool piece pending in the registry while its chunk is made.
#[must_use = "a pool piece begun must be finished (Segments::pool_finish), else it stays pending"]
pub struct PoolPiece {
    pending: PendingChunk,
    epoch: u64,
    /// Its size in bytes (`limits.pool_piece` when it was begun).
    pub size: u64,
    maker: PieceMaker,
}

impl PoolPiece {
    /// What makes its chunk, on any thread.
    pub fn maker(&self) -> PieceMaker {
        PieceMaker { provider: Arc::clone(&self.maker.provider), ..self.maker }
    }
}

/// The GPU service's mappings of host chunks of the pool's piece size, kept for copies (issue
/// 25, point 3): a piece is mapped when it joins the pool (on the thread that pins it), and the
/// mapping stays while the piece is a segment's chunk, so that a migration to the host tier
/// copies into pieces, and one back to the device reads from them, with no mapping on its path
/// (32 pieces of 256 MB took 103-152 ms to map and unmap per 8 GiB, against 156-174 ms of
/// copying). A mapping goes when its chunk is released (with the release, which the service
/// defers past its reply) or gives up a failed migration, and a sweep against the registry
/// (`sweep_kept_maps`) drops any whose chunk went another way: a mapping alone keeps pinned
/// memory alive. Off (empty) in every other process.
#[derive(Default)]
pub(super) struct KeptMaps {
    on: bool,
    maps: HashMap<u64, CopyMap>,
}

impl KeptMaps {
    pub(super) fn addr(&self, id: u64) -> Option<u64> {
        self.maps.get(&id).map(CopyMap::addr)
    }

    /// Whether a chunk of `tier` and `size` is one to keep mapped (`piece`: the pool's).
    pub(super) fn wants(&self, tier: Tier, size: u64, piece: u64) -> bool {
        self.on && tier == Tier::Host && piece > 0 && size == piece
    }

    pub(super) fn forget(&mut self, id: u64) {
        self.maps.remove(&id);
    }

    pub(super) fn keep(&mut self, id: u64, m: CopyMap) {
        self.maps.insert(id, m);
    }
}

/// A host pool piece's chunk as made by [`PieceMaker::make`]: its fd (for the broker) and, in
/// the GPU service, its mapping for copies.
pub struct MadePiece {
    fd: OwnedFd,
    map: Option<CopyMap>,
}

/// What makes a pool piece's chunk, on any thread ([`PoolPiece::maker`]).
pub struct PieceMaker {
    provider: Arc<dyn Provider>,
    size: u64,
    map: bool,
}

impl PieceMaker {
    /// Pins the piece (the slow part: 45-64 ms for 256 MB) and, if wanted, maps it for copies.
    pub fn make(self) -> Result<MadePiece> {
        let fd = self.provider.create_chunk(Place::Host, self.size)?;
        let map = if self.map { Some(CopyMap::new(&self.provider, fd.as_fd(), Tier::Host, self.size)?) } else { None };
        Ok(MadePiece { fd, map })
    }
}
