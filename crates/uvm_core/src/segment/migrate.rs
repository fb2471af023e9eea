//! Migrations: moving a segment's chunks between tiers and GPUs (`Segments::prefetch`), the
//! queue that keeps readers taking turns from starving a waiting migration ([`WaitingToMigrate`],
//! the module essay of `super`, "The pin / generation protocol"), and the GPU service's host
//! pool of pinned pieces that a migration to the host tier takes first (`super::pool`).
//!
//! A migration waits until no process pins the segment, holds new pins back with the
//! registry's migration flag ([`MigrationFlag`]), and replaces each chunk by a copy under the
//! exclusive lock with a generation bump: every process remaps before its next access. What it
//! moves and where is planned whole first (`crate::placement::plan_moves`). A `cpu` segment
//! never moves to a GPU.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{check_range, cpu_segment, ms, Env, Mapping, PendingGuard, Segments};
use crate::error::{Code, Result, UvmError};
use crate::placement;
use crate::provider::{Provider, Reservation, GRANULARITY};
use crate::registry::{ChunkInfo, PendingChunk, Place, Registry, Tier, TierPref, MAX_CHUNKS_PER_SEGMENT};
use crate::stats::{ProgressKind, ProgressPhase};
use crate::uvm_err;

/// The most a migration copies between two looks at interrupts (64 MiB: about 1.3 ms at the
/// host link's 50 GB/s, where a copy call costs some 10 us; about 0.25 s for the host
/// provider's memcpy into fresh memfd pages on a 2-core machine, measured).
const COPY_PIECE: u64 = 64 << 20;

/// The migration flag of one segment, held for the duration of a migration (recorded in the
/// process's [`Duties`] too, for an exit that skips destructors).
struct MigrationFlag<E: Env> {
    env: E,
    own: OwnWaits,
    id: u64,
}

/// The error of a migration that waited `wait` for a segment's pins to drain, in vain
/// (`detail`: who holds them).
pub fn still_pinned(name: &str, wait: Duration, detail: String) -> UvmError {
    UvmError::new(
        Code::LockNotAvailable,
        format!("could not migrate segment \"{name}\": still in use after {} ms", wait.as_millis()),
    )
    .detail(detail)
    .hint("Pins on it are held: uvm.attachments shows by which processes (this session's own count too, a pin it took through the C API say); see pg_uvm_share.pin_wait_timeout.")
}

impl<E: Env> MigrationFlag<E> {
    /// Waits up to `wait` for the segment's pins to drain, then sets its migration flag. While
    /// it waits, new pins of processes holding none on the segment wait behind it
    /// ([`WaitingToMigrate`]), so that readers taking turns cannot keep it out forever.
    fn begin(env: &E, own: &OwnWaits, id: u64, name: &str, wait: Duration) -> Result<Self> {
        let started = Instant::now();
        let mut waiting: Option<WaitingToMigrate<E>> = None;
        loop {
            let attempt = {
                let mut reg = env.exclusive()?;
                let slot = reg.find_id(id).ok_or_else(|| uvm_err!(Code::UndefinedObject, "segment \"{name}\" does not exist"))?;
                let r = reg.begin_migration(slot);
                if r.is_err() && waiting.is_none() {
                    waiting = Some(WaitingToMigrate::register(env, own, &mut reg, slot, id));
                }
                r
            };
            match attempt {
                // (`waiting` goes here: the flag now holds new pins back itself.)
                Ok(()) => {
                    own.borrow_mut().flags.insert(id);
                    return Ok(MigrationFlag { env: env.clone(), own: Rc::clone(own), id });
                }
                Err(e) if e.code == Code::ObjectInUse && started.elapsed() < wait => {
                    // The wait may last pin_wait_timeout (seconds): answer cancel meanwhile.
                    crate::interrupt::check()?;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) if e.code == Code::ObjectInUse => return Err(still_pinned(name, wait, e.detail.unwrap_or(e.message))),
                Err(e) => return Err(e),
            }
        }
    }
}

/// What this process's migrations hold in the registry, which it must give back even where no
/// destructor runs (a FATAL error, `pg_terminate_backend`, exits without unwinding): their
/// places in pin queues, their migration flags, and the chunks they reserved and have not
/// swapped in yet (pending: counted in their tier, their fds kept by the broker, until
/// forgotten).
#[derive(Default)]
pub(super) struct Duties {
    /// Pending chunks of this process's [`PendingGuard`]s, by chunk id.
    pub(super) pending: HashMap<u64, PendingChunk>,
    /// Migrations waiting for pins to drain: segment id -> how many. This process's own pins do
    /// not wait behind them (the GPU service, which migrates for its clients, holds their other
    /// requests back itself rather than sleep on its own wait).
    pub(super) waits: HashMap<u64, u32>,
    /// Segments this process has marked migrating.
    flags: HashSet<u64>,
}

pub(super) type OwnWaits = Rc<RefCell<Duties>>;

/// A process's [`Duties`], for its exit callback: that callback may find the segment manager
/// in use (a FATAL error raised inside a call that borrows it) and this still reachable.
#[derive(Clone)]
pub struct ExitDuties(pub(super) OwnWaits);

impl ExitDuties {
    /// Gives back every place in a pin queue and every migration flag this process still holds
    /// (at its exit); those already given back are not again.
    pub fn undo(&self, reg: &mut Registry) {
        let Ok(mut d) = self.0.try_borrow_mut() else { return };
        for (id, n) in d.waits.drain() {
            if let Some(slot) = reg.find_id(id) {
                (0..n).for_each(|_| reg.stop_waiting_to_migrate(slot));
            }
        }
        for id in d.flags.drain() {
            if let Some(slot) = reg.find_id(id) {
                reg.end_migration(slot);
            }
        }
        // (the broker's sweep closes the fds of chunks the registry no longer knows)
        for (_, p) in d.pending.drain() {
            reg.abort_chunk(&p);
        }
    }
}

/// A migration's place in the queue of a segment's pins ([`Registry::wait_to_migrate`]),
/// withdrawn when dropped (the migration began, gave up, or failed) or at process exit
/// ([`Segments::detach_all`]), whichever comes first.
pub struct WaitingToMigrate<E: Env> {
    env: E,
    own: OwnWaits,
    id: u64,
}

impl<E: Env> WaitingToMigrate<E> {
    pub(super) fn register(env: &E, own: &OwnWaits, reg: &mut Registry, slot: u32, id: u64) -> Self {
        reg.wait_to_migrate(slot);
        *own.borrow_mut().waits.entry(id).or_default() += 1;
        WaitingToMigrate { env: env.clone(), own: Rc::clone(own), id }
    }
}

impl<E: Env> Drop for WaitingToMigrate<E> {
    fn drop(&mut self) {
        // Withdrawn already if `detach_all` took this process's waits at exit.
        {
            let mut own = self.own.borrow_mut();
            match own.waits.get_mut(&self.id) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => {
                    own.waits.remove(&self.id);
                }
                None => return,
            }
        }
        if let Ok(mut reg) = self.env.exclusive() {
            if let Some(slot) = reg.find_id(self.id) {
                reg.stop_waiting_to_migrate(slot);
            }
        }
    }
}

impl<E: Env> Drop for MigrationFlag<E> {
    fn drop(&mut self) {
        // Ended already if the exit path gave this process's duties back.
        if !self.own.borrow_mut().flags.remove(&self.id) {
            return;
        }
        if let Ok(mut reg) = self.env.exclusive() {
            if let Some(slot) = reg.find_id(self.id) {
                reg.end_migration(slot);
            }
        }
    }
}

/// Where the time of this process's last migration went (reported by `uvm.device_info()`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MigrationStats {
    pub bytes: u64,
    pub chunks: u32,
    /// Copies that read from or wrote to a kept mapping (the GPU service's pool pieces,
    /// [`KeptMaps`]) instead of mapping a chunk for the copy.
    pub kept_copies: u32,
    /// Waiting for pins to drain.
    pub wait_ms: f64,
    /// Bringing this process's own mapping of the segment up to date first (an attach).
    pub map_ms: f64,
    /// Allocating the new chunks (pinning host memory dominates) and handing them to the broker.
    pub alloc_ms: f64,
    /// Copying (the provider's copy: cuMemcpy).
    pub copy_ms: f64,
    /// Mapping the new chunks for the copy, and unmapping them and the old chunks' temporary
    /// mappings after it.
    pub copy_map_ms: f64,
    /// The registry's part under its exclusive lock: taking pool pieces and recording the new
    /// chunks, then swapping them in.
    pub swap_ms: f64,
    /// Releasing the old chunks at the broker (next to nothing where releases are deferred:
    /// the GPU service releases them after it has answered).
    pub release_ms: f64,
    /// The rest (reservations, the broker's PUT, the migration flag).
    pub other_ms: f64,
}

impl<E: Env> Segments<E> {
    /// Unmaps a migration's temporary mapping now, or with the deferred releases where those
    /// are deferred (the GPU service: after its reply).
    fn unmap_later(&mut self, m: CopyMap) {
        if self.defer_releases {
            self.deferred_maps.push(m);
        } else {
            drop(m);
        }
    }

    /// Unmaps chunk `old`, just replaced, from this process's own mapping of segment `id`, where
    /// it is mapped there and no pin of this process uses the mapping (`map_missing`'s rule; the
    /// next pin maps the new chunk). Left mapped, it would hold the old chunk's memory (a GPU's,
    /// for a device chunk) until this process next pins the segment, which for the GPU service
    /// may be never: its clients map the host tier themselves. Deferred with the releases where
    /// those are (the service: after its reply).
    fn unmap_replaced(&mut self, id: u64, old: ChunkInfo) {
        if self.defer_releases {
            self.deferred_unmaps.push((id, old));
        } else {
            self.unmap_replaced_now(id, &old);
        }
    }

    pub(super) fn unmap_replaced_now(&self, id: u64, old: &ChunkInfo) {
        if let Some(a) = self.attachments.get(&id) {
            let unused = Rc::strong_count(&a.mapping) == 1 && !self.session_pins.contains_key(&id);
            if unused && a.mapping.mapped.borrow().contains(old) {
                a.mapping.unmap(old);
            }
        }
    }

    /// Queues a migration of segment `id` that this process will try again and again without
    /// sleeping (the GPU service's parked migrations): new pins of other processes wait behind
    /// it until the guard goes. Its own pins of the segment do not: it holds its other requests
    /// for the segment back itself.
    pub fn wait_to_migrate(&mut self, id: u64) -> Result<WaitingToMigrate<E>> {
        let mut reg = self.env.exclusive()?;
        let slot = reg.find_id(id).ok_or_else(|| UvmError::new(Code::UndefinedObject, "segment was dropped"))?;
        Ok(WaitingToMigrate::register(&self.env, &self.own_waits, &mut reg, slot, id))
    }

    /// Moves the chunks covering `[offset, offset + length)` of `name` to `target` (`host`,
    /// `device`: any GPU, chunks already on one stay; `device:N`: GPU N); returns the bytes
    /// moved. Where each chunk goes is planned first (`placement::plan_moves`): a move past a
    /// GPU's budget refuses the whole migration before anything moves.
    ///
    /// Migration waits (up to `limits.pin_wait`) until no process holds a pin, then marks the
    /// segment migrating, which holds new pins back and refuses drops. For each chunk to move it
    /// allocates a chunk in the target tier, copies the bytes (per chunk: driver copies cannot
    /// cross chunk boundaries), and swaps it in under the exclusive lock with a generation bump,
    /// so that every process remaps before its next access. Chunks already where `target` wants
    /// them stay.
    pub fn prefetch(
        &mut self,
        name: &str,
        offset: i64,
        length: i64,
        target: TierPref,
        authorize: impl FnOnce(u32) -> Result<()>,
    ) -> Result<u64> {
        let info = self.lookup(name)?;
        authorize(info.owner)?;
        let (start, len) = check_range(&info, offset, length)?;
        if matches!(target, TierPref::Auto | TierPref::Cpu) {
            return Err(uvm_err!(Code::InvalidParameterValue, "prefetch needs a concrete tier, not \"{}\"", target.name())
                .hint("Use \"host\", \"device\" or \"device:N\"."));
        }
        if info.tier_pref.cpu_only() && target.tier() == Tier::Device {
            return Err(cpu_segment(name, "its memory never moves to a GPU").detail("Nothing was moved."));
        }
        self.check_pref(target)?;
        let (start, end) = (start as u64, (start + len) as u64);
        // Planned before waiting (nothing to move, or a move refused for budget, answers at
        // once), and again once the flag is held (below).
        let planned = self.plan_moves(&info, start, end, target)?;
        if planned.is_empty() {
            return Ok(0);
        }
        let bytes: u64 = planned.iter().map(|(c, _)| c.size).sum();
        let started = Instant::now();
        // (`uvm.progress`: none if every row is taken.)
        let progress = self.env.shared()?.start_progress(
            self.env.pid(),
            ProgressKind::Migration,
            ProgressPhase::WaitingForPins,
            info.id,
            bytes,
        );
        let _flag = MigrationFlag::begin(&self.env, &self.own_waits, info.id, name, self.limits.pin_wait)?;
        // Another migration of the segment may have moved its chunks while this one waited for
        // the flag: the plan made before would copy chunks the registry has let go (two
        // sessions moving one segment the same way: the second failed with 55006 or 58000).
        let moving = self.plan_moves(&self.lookup_id(info.id)?, start, end, target)?;
        if moving.is_empty() {
            return Ok(0);
        }
        let bytes: u64 = moving.iter().map(|(c, _)| c.size).sum();
        let mut stats = MigrationStats { bytes, chunks: moving.len() as u32, wait_ms: ms(started), ..Default::default() };
        let mut done = 0;
        // The next chunk's new device chunk, made while this one copies (see `Ahead`).
        let mut ahead: Option<Ahead> = None;
        for (i, (c, to)) in moving.iter().enumerate() {
            if let Some(p) = &progress {
                p.phase(ProgressPhase::Copying, done, bytes);
            }
            // Between chunks: each migrate_chunk is all-or-nothing, so an interrupt here leaves
            // every chunk either moved or in place (and the flag is cleared by its guard).
            crate::interrupt::check()?;
            let mine = ahead.take();
            ahead = moving.get(i + 1).and_then(|&(next, to)| Ahead::start(&self.provider, to, next.size));
            self.migrate_chunk(info.id, c, *to, mine, &mut stats)?;
            done += c.size;
        }
        if let Ok(reg) = self.env.shared() {
            if let Some(slot) = reg.find_id(info.id) {
                reg.count_migration(slot, bytes);
            }
        }
        stats.other_ms = ms(started)
            - stats.wait_ms
            - stats.map_ms
            - stats.alloc_ms
            - stats.copy_ms
            - stats.copy_map_ms
            - stats.swap_ms
            - stats.release_ms;
        self.last_migration = Some(stats);
        Ok(bytes)
    }

    /// The chunks of `info` covering `[start, end)` that a migration to `target` moves, and
    /// where each goes: planned whole (`placement::plan_moves`), so that a move refused for
    /// budget refuses them all.
    fn plan_moves(
        &self,
        info: &crate::segment::SegmentInfo,
        start: u64,
        end: u64,
        target: TierPref,
    ) -> Result<Vec<(ChunkInfo, Place)>> {
        let covered: Vec<ChunkInfo> =
            info.chunks.iter().filter(|c| c.offset < end && start < c.offset + c.size).copied().collect();
        let plan = {
            let reg = self.env.shared()?;
            let chunks: Vec<(Place, u64)> = covered.iter().map(|c| (c.place(), c.size)).collect();
            placement::plan_moves(target, &chunks, &self.gpus(&reg), GRANULARITY)
                .map_err(|e| e.detail(format!("Nothing of segment \"{}\" was moved.", info.name)))?
        };
        Ok(covered.iter().zip(plan).filter_map(|(c, to)| to.map(|to| (*c, to))).collect())
    }

    /// Replaces one chunk by a copy at `to`. The caller holds the migration flag.
    fn migrate_chunk(
        &mut self,
        id: u64,
        old: &ChunkInfo,
        to: Place,
        mut ahead: Option<Ahead>,
        stats: &mut MigrationStats,
    ) -> Result<()> {
        let target = to.tier();
        let (info, epoch) = {
            let reg = self.env.shared()?;
            let slot = reg.find_id(id).ok_or_else(|| UvmError::new(Code::UndefinedObject, "segment was dropped"))?;
            (reg.info(slot), reg.epoch())
        };
        let t = Instant::now();
        self.ensure_attachment(&info)?;
        // The copy reads the old chunk from the GPU service's kept mapping of it, if any
        // (registered for DMA: a memfd host chunk mapped at the segment's address may not be),
        // else where this process maps it; if it does not (its mapping is older than the chunk,
        // as after an earlier migration), through a temporary mapping made for the copy alone.
        // Bringing the whole mapping up to date instead would give the CPU access to every
        // chunk (a page-table walk: about 250 ms for 8 GiB of host memory, measured) for a copy
        // done by DMA.
        let a = self.attachments.get_mut(&id).expect("attached above");
        let source = if let Some(addr) = self.kept.addr(old.id) {
            stats.kept_copies += 1;
            CopySource::Kept(addr)
        } else if a.mapping.mapped.borrow().contains(old) {
            CopySource::Mapped { _held: Rc::clone(&a.mapping), addr: a.mapping.addr() + old.offset }
        } else {
            let fd = self.with_broker(|b| b.get(epoch, old.id))?;
            CopySource::Temporary(CopyMap::new(&self.provider, fd.as_fd(), old.tier, old.size)?)
        };
        stats.map_ms += ms(t);
        let src = source.addr();
        // The new chunks: to the host tier, pieces of the host pool first (pinned already), then
        // one fresh chunk for the rest; elsewhere, one fresh chunk.
        let t = Instant::now();
        let (parts, rest, to_pool) = {
            let mut reg = self.env.exclusive()?;
            let slot = reg.find_id(id).ok_or_else(|| UvmError::new(Code::UndefinedObject, "segment was dropped"))?;
            // The plan saw room for this chunk; other sessions may have taken it since.
            if let Place::Device(n) = to {
                if !placement::fits(&self.gpus(&reg), n, old.size, GRANULARITY) {
                    return Err(uvm_err!(
                        Code::ConfigurationLimitExceeded,
                        "moving a {}-byte chunk to GPU {n} would exceed pg_uvm_share.device_memory_limit",
                        old.size
                    )
                    .detail("Other sessions took the room since the migration was planned; the chunks before this one moved."));
                }
            }
            let piece = self.limits.pool_piece;
            let mut parts: Vec<(PendingChunk, bool)> = Vec::new();
            if to == Place::Host && piece > 0 {
                // Entries the parts may take in the segment's chunk table: the old chunk's and the
                // free ones. Pieces take all of them only if they cover the chunk exactly;
                // otherwise one is left for the fresh chunk that covers the rest.
                let room = (MAX_CHUNKS_PER_SEGMENT + 1).saturating_sub(info.chunks.len()).max(1);
                let whole = (old.size / piece) as usize;
                let n = if whole <= room && whole as u64 * piece == old.size { whole } else { whole.min(room - 1) };
                for k in 0..n as u64 {
                    match reg.take_pool_chunk(slot, old.offset + k * piece, piece) {
                        // The broker has held a piece's fd since it joined the pool.
                        Some(p) => parts.push((p, true)),
                        None => break,
                    }
                }
            }
            let taken: u64 = parts.iter().map(|(p, _)| p.size).sum();
            // The fresh chunk for what the pieces do not cover: an error here is raised once the
            // guard below holds the pieces, which then go back to the broker like any pending chunk.
            let rest = (taken < old.size)
                .then(|| reg.reserve_replacement(slot, old.id, old.offset + taken, old.size - taken, to))
                .transpose();
            // A host chunk of the pool's piece size goes back to the pool while it is short.
            let to_pool =
                old.tier == Tier::Host && piece > 0 && old.size == piece && reg.pool_bytes() + piece <= self.limits.pool_size;
            (parts, rest, to_pool)
        };
        stats.swap_ms += ms(t);
        let mut guard = PendingGuard::new(self, parts, epoch);
        if let Some(p) = rest? {
            guard.add(p, false);
        }
        for k in 0..guard.parts.len() {
            let (p, handed_over) = guard.parts[k];
            // Copy into the service's kept mapping of a pool piece, else through a temporary
            // mapping of the new chunk (kept if it is one to keep).
            let (dst, temporary) = match guard.segs.kept.addr(p.id) {
                Some(addr) => {
                    stats.kept_copies += 1;
                    (addr, None)
                }
                None if !handed_over && ahead.as_ref().is_some_and(|a| a.fits(to, p.size)) => {
                    let t = Instant::now();
                    let (fd, m) = ahead.take().expect("checked above").wait()?;
                    guard.segs.with_broker(|b| b.put(epoch, p.id, fd.as_fd()))?;
                    stats.alloc_ms += ms(t);
                    guard.parts[k].1 = true;
                    (m.addr(), Some(m))
                }
                None => {
                    let fd = if handed_over {
                        guard.segs.with_broker(|b| b.get(epoch, p.id))?
                    } else {
                        let t = Instant::now();
                        let fd = guard.segs.provider.create_chunk(to, p.size)?;
                        guard.segs.with_broker(|b| b.put(epoch, p.id, fd.as_fd()))?;
                        stats.alloc_ms += ms(t);
                        guard.parts[k].1 = true;
                        fd
                    };
                    let t = Instant::now();
                    let m = CopyMap::new(&guard.segs.provider, fd.as_fd(), target, p.size)?;
                    stats.copy_map_ms += ms(t);
                    (m.addr(), Some(m))
                }
            };
            let t = Instant::now();
            // In pieces, answering interrupts between them: a chunk may be gigabytes, which
            // the host provider copies at memory speed (seconds). An interrupt leaves the
            // chunk in place and the new one pending, which the guard (or, at a FATAL exit,
            // this process's duties) forgets.
            let from = src + (p.offset - old.offset);
            let mut at = 0;
            while at < p.size {
                let n = (p.size - at).min(COPY_PIECE);
                // SAFETY: both ranges are mapped for `p.size` bytes (the old chunk's part at
                // `from`, held by `source`; the new chunk at `dst`, in a kept mapping or
                // `temporary`), are distinct mappings, and `at + n <= p.size`.
                unsafe { guard.segs.provider.copy((dst + at) as *mut u8, (from + at) as *const u8, n as usize) }?;
                at += n;
                if at < p.size {
                    crate::interrupt::check()?;
                }
            }
            stats.copy_ms += ms(t);
            if let Some(m) = temporary {
                if guard.segs.kept.wants(target, p.size, guard.segs.limits.pool_piece) {
                    guard.segs.kept.keep(p.id, m);
                } else {
                    let t = Instant::now();
                    guard.segs.unmap_later(m);
                    stats.copy_map_ms += ms(t);
                }
            }
        }
        let t = Instant::now();
        match source {
            CopySource::Temporary(m) => guard.segs.unmap_later(m),
            other => drop(other),
        }
        stats.copy_map_ms += ms(t);
        let t = Instant::now();
        let pendings: Vec<PendingChunk> = guard.parts.iter().map(|(p, _)| *p).collect();
        let released = guard.segs.env.exclusive()?.replace_chunk_by(&pendings, old.id, to_pool)?;
        stats.swap_ms += ms(t);
        guard.committed = true;
        drop(guard);
        self.unmap_replaced(id, *old);
        if let Some(old_id) = released {
            let t = Instant::now();
            self.release(epoch, old_id);
            stats.release_ms += ms(t);
        }
        Ok(())
    }
}

/// Where a migration copies a chunk from (see `migrate_chunk`): this process's mapping of the
/// segment (held, so it outlives the copy), the GPU service's kept mapping of a pool-sized host
/// chunk ([`KeptMaps`]), or a temporary mapping of the chunk alone, unmapped and released when
/// this drops (on every path).
enum CopySource {
    Mapped { _held: Rc<Mapping>, addr: u64 },
    Kept(u64),
    Temporary(CopyMap),
}

impl CopySource {
    fn addr(&self) -> u64 {
        match self {
            CopySource::Mapped { addr, .. } => *addr,
            CopySource::Kept(addr) => *addr,
            CopySource::Temporary(m) => m.addr(),
        }
    }
}

/// A chunk mapped for copies alone (`Provider::map_chunk_for_copy`: GPU access) in a
/// reservation of its own; unmapped and the reservation given back when it drops. `Send`: the
/// GPU service maps a new pool piece on the thread that makes it.
pub struct CopyMap {
    provider: Arc<dyn Provider>,
    /// `Some` until `drop` gives it back.
    reservation: Option<Reservation>,
    size: u64,
    tier: Tier,
}

impl CopyMap {
    pub(super) fn new(provider: &Arc<dyn Provider>, fd: BorrowedFd<'_>, tier: Tier, size: u64) -> Result<CopyMap> {
        let m = CopyMap { provider: Arc::clone(provider), reservation: Some(provider.reserve(0, size)?), size, tier };
        // (On an error `m` drops: unmapping a range that was never mapped is a no-op.)
        provider.map_chunk_for_copy(fd, tier, m.reservation.as_ref().expect("set above"), 0, size)?;
        Ok(m)
    }

    pub(super) fn addr(&self) -> u64 {
        self.reservation.as_ref().map_or(0, Reservation::addr)
    }
}

impl Drop for CopyMap {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            self.provider.unmap_chunk(&r, 0, self.size, self.tier);
            self.provider.release_reservation(r);
        }
    }
}

/// A migration's next new device chunk, made (allocated and mapped for the copy) on a thread of
/// its own while the chunk before it copies: an 8 GiB migration back from the host pool's 32
/// pieces spent 7 ms allocating and 10 ms mapping its 32 device chunks between copies of 156 ms
/// in all (H100). Unused (a failed or interrupted migration, or a plan that changed), it drops
/// with its thread: the chunk's fd closes and its mapping goes.
struct Ahead {
    place: Place,
    size: u64,
    made: std::thread::JoinHandle<Result<(OwnedFd, CopyMap)>>,
}

impl Ahead {
    /// Starts making a chunk of `size` bytes at `to`, if it is a GPU's (host chunks come from
    /// the pool, or are pinned where they are needed); `None` where no thread can start.
    fn start(provider: &Arc<dyn Provider>, to: Place, size: u64) -> Option<Ahead> {
        if to.tier() != Tier::Device {
            return None;
        }
        let provider = Arc::clone(provider);
        let made = std::thread::Builder::new()
            .name("uvm migration".into())
            .spawn(move || {
                let fd = provider.create_chunk(to, size)?;
                let m = CopyMap::new(&provider, fd.as_fd(), to.tier(), size)?;
                Ok((fd, m))
            })
            .ok()?;
        Some(Ahead { place: to, size, made })
    }

    fn fits(&self, to: Place, size: u64) -> bool {
        (self.place, self.size) == (to, size)
    }

    fn wait(self) -> Result<(OwnedFd, CopyMap)> {
        self.made.join().unwrap_or_else(|_| Err(UvmError::new(Code::SystemError, "a migration's helper thread failed")))
    }
}
