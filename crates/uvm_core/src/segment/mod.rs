//! Segments as one process sees them: lazy attachment, pins, growth, and drop.
//!
//! # Design
//!
//! Every process keeps a [`Segments`] manager: its provider, its connection to the broker, and
//! one [`Attachment`] per segment it has mapped (the reservation, the chunks mapped in it, and
//! the generation they correspond to). Nothing is mapped until a process first touches a
//! segment, and only what changed since its last access is mapped then.
//!
//! # The pin / generation protocol
//!
//! Every access goes through [`Segments::pin`], which returns a [`Pin`] guard:
//!
//! 1. Under the shared registry lock: find the segment, check it is the one we think (id), add a
//!    pin (an atomic counter in the segment and in this process's attachment slot), and copy the
//!    chunk list and generation.
//! 2. Without any lock: if the generation differs from what this process mapped, map the chunks
//!    it lacks (fds from the broker), unmap chunks that were replaced, and record the new
//!    generation in the attachment slot.
//! 3. The caller uses the memory through the guard, bounded by the size in the snapshot. The
//!    guard's fields are private; its accessors check every range against that size, which
//!    step 2 checked against the chunks this process actually mapped (shared memory is not
//!    trusted with this process's memory safety: a registry entry that contradicts the mapping
//!    is an error, never an access past it).
//! 4. Dropping the guard gives the pin back (no lock needed: the guard holds the registry's
//!    [`HeldPin`], which can release that one pin, once, and nothing else).
//!
//! Growth only appends chunks, so it never waits for pins: a process pinned at generation g keeps
//! using the chunks of g, which stay valid. What removes or replaces chunks (a drop, and the
//! migrations of the CUDA provider) needs the exclusive lock and a pin count of zero, so no
//! process can be inside a chunk that disappears.
//!
//! A migration that finds the segment pinned queues itself ([`WaitingToMigrate`]) and tries
//! again until `pin_wait`: while it waits, new pins wait behind it, as a lock request waits
//! behind a queued stronger one in PostgreSQL's lock manager, so readers that pin in turn (each
//! taking its pin before the last one gave its pin back) cannot starve it. Two kinds of pin pass
//! the queue, because waiting would deadlock: those of a process that already holds a pin on the
//! segment (it would wait for itself), and those of the process that queued the migration (the
//! GPU service, which retries a parked migration at each turn of its loop and holds its clients'
//! other requests for that segment back itself). Processes that still map a dropped segment
//! notice that its id is gone at their next access of any segment, or at exit, and unmap it.
//!
//! # Mappings outlive nothing that uses them
//!
//! An attachment's reservation and the chunks mapped in it form one [`Mapping`], shared (`Rc`)
//! by the attachment and every pin on it: it is unmapped when the last of them goes. So detaching
//! while a guard is alive (`detach_all` at process exit) gives the registry pins back but leaves
//! the guard's memory mapped until the guard is dropped; and a remap that would unmap replaced
//! chunks while a guard of this process still uses the mapping is refused. Providers map and
//! unmap only inside a [`Reservation`], never at a raw address; an arena range is adopted with
//! the `unsafe` `reserve_in_arena`, once per process.
//!
//! # Lifecycle of an attachment
//!
//! created at the first pin (reserve the address range: the segment's own range of the
//! inherited arena, or a hinted reservation) → remapped on demand when the generation moves →
//! removed when the segment is dropped (by this process: at once; by another: at the next sweep)
//! or when the process exits (`detach_all`, from a `before_shmem_exit` callback), which also
//! gives back any pins still held, so that a process dying in an ERROR or FATAL path leaves no
//! pin behind. A SIGKILLed process leaves the registry to the postmaster's crash-restart.
//!
//! Migrations (moving chunks between tiers, the queue of pins behind a waiting migration) are in
//! `migrate.rs`, the GPU service's host pool and its kept mappings in `pool.rs`, the pin guard
//! and its bounds-checked accessors in `pin.rs`, a mapping's chunks and their registration for
//! kernels (`Mapping`, `Attachment`) in `mapping.rs`; this file keeps attaching and remapping,
//! granting pins, growth and drops.
//!
//! This module does not call PostgreSQL: the registry lock and the process identity come through
//! the [`Env`] trait, implemented over LWLocks by the SQL layer and over a mutex in the tests.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::broker::client::Client;
use crate::error::{Code, Kind, Result, UvmError};
use crate::placement::{self, Gpu};
use crate::provider::{Provider, GRANULARITY};
use crate::registry::{
    next_chunk_size, round_up, ChunkInfo, HeldPin, NewSegment, PendingChunk, PinWait, Place, Registry, SegmentInfo, Tier,
    TierPref,
};
use crate::uvm_err;

mod mapping;
mod migrate;
#[cfg(test)]
mod model_tests;
mod pin;
mod pool;
#[cfg(test)]
mod pool_tests;
#[cfg(test)]
mod register_tests;
#[cfg(test)]
pub(crate) mod tests;

pub use mapping::Attachment;
use mapping::Mapping;
use migrate::OwnWaits;
pub use migrate::{still_pinned, CopyMap, ExitDuties, MigrationStats, WaitingToMigrate};
pub use pin::{check_range, Pin};
use pool::KeptMaps;
pub use pool::{MadePiece, PieceMaker, PoolPiece, PoolTurn};

/// What the segment layer needs from its host process. There is no unlocked access to the
/// registry: pins are released through their [`HeldPin`], which touches only its two atomics.
pub trait Env: Clone {
    type Shared: Deref<Target = Registry>;
    type Exclusive: DerefMut<Target = Registry>;
    /// The registry under its shared lock.
    fn shared(&self) -> Result<Self::Shared>;
    /// The registry under its exclusive lock.
    fn exclusive(&self) -> Result<Self::Exclusive>;
    /// This process's id as the registry records it.
    fn pid(&self) -> i32;
    /// Path of the broker's socket.
    fn broker_path(&self) -> PathBuf;
}

/// Size limits that come from configuration.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub min_chunk: u64,
    pub max_segment_size: u64,
    /// Device-tier budget in bytes, per GPU (None: the provider's own limit).
    pub device_limit: Option<u64>,
    /// How long a migration waits for pins to drain, and a pin for a migration to end.
    pub pin_wait: Duration,
    /// The host pool (issue 9's migrations): pinned host pieces of `pool_piece` bytes that the
    /// GPU service keeps at the broker, up to `pool_size` bytes, so that a migration to the host
    /// tier pins nothing. 0: no pool.
    pub pool_size: u64,
    pub pool_piece: u64,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// One process's view of every segment it uses. See the module documentation.
pub struct Segments<E: Env> {
    /// This process's last migration, if any.
    pub last_migration: Option<MigrationStats>,
    pub env: E,
    provider: Arc<dyn Provider>,
    broker: Option<Client>,
    attachments: HashMap<u64, Attachment>,
    /// Session pins (uvm.pin_segment): segment id -> the registry pins held.
    session_pins: HashMap<u64, Vec<HeldPin>>,
    pub limits: Limits,
    /// Chunks a migration or a drop replaced or removed, to release at the broker later
    /// (`release_deferred`), when `defer_releases` is set: the GPU service answers its client
    /// first. Freeing pinned memory is slow (the last close of a chunk's fd unpins it), and
    /// nothing needs it done before the reply: the registry no longer knows these ids, so if
    /// the releaser dies first the broker's sweep closes them (within 2 s).
    deferred: Vec<(u64, u64)>,
    /// A migration's temporary mappings for copies, unmapped with the deferred releases where
    /// those are deferred: unmapping takes this process's address-space lock, which the GPU
    /// service's pool thread holds for milliseconds at a time while it populates and registers a
    /// piece (an 8 GiB migration to the device spent 97 ms unmapping its 32 new chunks' copy
    /// mappings while the pool refilled, on the H100).
    deferred_maps: Vec<CopyMap>,
    /// Chunks a migration replaced, to unmap from this process's own mapping of their segment
    /// (by segment id) with the deferred releases (`Segments::unmap_replaced`).
    deferred_unmaps: Vec<(u64, ChunkInfo)>,
    defer_releases: bool,
    /// This process's migrations waiting for pins to drain (see [`WaitingToMigrate`]).
    own_waits: OwnWaits,
    /// The GPU service's mappings of pool-sized host chunks for copies (empty elsewhere).
    kept: KeptMaps,
}

/// How long a process waits for the broker to come up (it starts with the postmaster).
const BROKER_WAIT: Duration = Duration::from_secs(10);

impl<E: Env> Segments<E> {
    pub fn new(env: E, provider: Box<dyn Provider>, limits: Limits) -> Self {
        Segments {
            last_migration: None,
            env,
            provider: Arc::from(provider),
            broker: None,
            attachments: HashMap::new(),
            session_pins: HashMap::new(),
            limits,
            deferred: Vec::new(),
            deferred_maps: Vec::new(),
            deferred_unmaps: Vec::new(),
            defer_releases: false,
            own_waits: OwnWaits::default(),
            kept: KeptMaps::default(),
        }
    }

    /// Defers the broker releases of replaced and dropped chunks until `release_deferred`.
    pub fn defer_releases(&mut self, on: bool) {
        self.defer_releases = on;
    }

    /// Releases the chunks whose release was deferred; failures are left to the broker's sweep.
    pub fn release_deferred(&mut self) {
        for (id, c) in std::mem::take(&mut self.deferred_unmaps) {
            self.unmap_replaced_now(id, &c);
        }
        self.deferred_maps.clear();
        for (epoch, id) in std::mem::take(&mut self.deferred) {
            self.kept.forget(id);
            let _ = self.with_broker(|b| b.release(epoch, id));
        }
    }

    /// Releases a chunk that the registry no longer knows, now or (`defer_releases`) later,
    /// with this process's kept mapping of it, if any.
    ///
    /// Best effort, never an error: the registry's change that freed the chunk is committed
    /// by then, so a failure here must not fail the operation that made it. The broker closes
    /// the fds of chunks the registry does not know every 2 s, which may have closed this one
    /// already (it then answers "unknown chunk": a migration failed so, after its swap, in 5
    /// of 50 moves of a 768 MiB chunk); any other failure is left to that sweep too.
    fn release(&mut self, epoch: u64, id: u64) {
        if self.defer_releases {
            self.deferred.push((epoch, id));
            return;
        }
        self.kept.forget(id);
        let _ = self.with_broker(|b| b.release(epoch, id));
    }

    pub fn provider(&self) -> &dyn Provider {
        self.provider.as_ref()
    }

    pub fn attachments(&self) -> impl Iterator<Item = &Attachment> {
        self.attachments.values()
    }

    fn broker(&mut self) -> Result<&Client> {
        connected(&mut self.broker, &self.env.broker_path())
    }

    /// Runs a broker call; if the connection failed (`Kind::BrokerConnection`: it may be stale,
    /// say after a broker restart) reconnects once and tries again. Other errors are answers.
    fn with_broker<T>(&mut self, f: impl Fn(&Client) -> Result<T>) -> Result<T> {
        match f(self.broker()?) {
            Err(e) if e.kind == Kind::BrokerConnection => {
                self.broker = None;
                f(self.broker()?)
            }
            r => r,
        }
    }

    /// The provider's GPUs as placement sees them: each one's committed bytes and budget.
    fn gpus(&self, reg: &Registry) -> Vec<Gpu> {
        (0..self.provider.devices()).map(|n| Gpu { used: reg.gpu_bytes(n), budget: self.limits.device_limit }).collect()
    }

    /// Refuses (0A000) a preference for the device tier when the provider has none.
    fn check_pref(&self, pref: TierPref) -> Result<()> {
        if pref.tier() == Tier::Device && pref != TierPref::Auto && self.provider.devices() == 0 {
            return Err(crate::provider::tier_unavailable(Tier::Device, self.provider.kind()));
        }
        Ok(())
    }

    /// Where a new chunk of `size` bytes goes under preference `pref`, and how large it is
    /// (`crate::placement`): `auto` fills the GPUs' budgets first, so a chunk that does not fit
    /// whole is cut at a budget (the next chunk goes to another GPU or the host tier) and a
    /// segment spans GPUs and tiers; `device` spreads over the GPUs the same way.
    fn place_chunk(&self, reg: &Registry, pref: TierPref, size: u64) -> Result<(Place, u64)> {
        self.check_pref(pref)?;
        placement::place_chunk(pref, size, &self.gpus(reg), GRANULARITY)
    }

    /// Validates a requested size (> 0, <= max), returning it as u64.
    fn check_size(&self, what: &str, v: i64) -> Result<u64> {
        if v <= 0 {
            return Err(uvm_err!(Code::InvalidParameterValue, "{what} must be positive: {v}"));
        }
        if v as u64 > self.limits.max_segment_size {
            return Err(uvm_err!(
                Code::ProgramLimitExceeded,
                "{what} {v} exceeds pg_uvm_share.max_segment_size ({} bytes)",
                self.limits.max_segment_size
            ));
        }
        Ok(v as u64)
    }

    /// Creates a segment of `size` bytes that may grow to `max_size`, owned by `owner`.
    pub fn create(&mut self, name: &str, size: i64, max_size: Option<i64>, pref: TierPref, owner: u32, now: i64) -> Result<u64> {
        crate::registry::validate_name(name)?;
        let size = self.check_size("size", size)?;
        let max_size = match max_size {
            Some(m) => self.check_size("max_size", m)?,
            None => self.limits.max_segment_size,
        };
        if max_size < size {
            return Err(uvm_err!(Code::InvalidParameterValue, "max_size {max_size} is smaller than size {size}"));
        }
        self.check_pref(pref)?;
        if let TierPref::DeviceOn(n) = pref {
            if n >= self.provider.devices() {
                return Err(crate::provider::no_such_device(Place::Device(n), self.provider.devices()));
            }
        }
        let reserve = round_up(max_size, GRANULARITY).expect("bounded by max_segment_size");
        let (slot, id) = {
            let mut reg = self.env.exclusive()?;
            let align = crate::provider::segment_alignment(reserve);
            let spec = NewSegment { name, owner, max_size, reserve, tier_pref: pref, created_at: now, align };
            let slot = reg.create_segment(&spec)?;
            (slot, reg.info(slot).id)
        };
        if let Err(e) = self.grow_to(id, size) {
            // Undo the half-created segment (nobody can have pinned it: it had no size yet).
            if let Ok(mut reg) = self.env.exclusive() {
                if reg.find_id(id) == Some(slot) {
                    if let Ok(ids) = reg.drop_segment(slot) {
                        drop(reg);
                        self.release_chunks(&ids);
                    }
                }
            }
            return Err(e);
        }
        Ok(id)
    }

    /// Grows segment `name` to `new_size` bytes; returns the new size.
    pub fn grow(&mut self, name: &str, new_size: i64, authorize: impl FnOnce(u32) -> Result<()>) -> Result<u64> {
        let info = self.lookup(name)?;
        authorize(info.owner)?;
        if new_size < 0 {
            return Err(uvm_err!(Code::InvalidParameterValue, "new_size must not be negative: {new_size}"));
        }
        if (new_size as u64) < info.size {
            return Err(uvm_err!(
                Code::InvalidParameterValue,
                "segment \"{name}\" cannot shrink from {} to {new_size} bytes",
                info.size
            )
            .hint("Segments only grow; create a new one for a smaller size."));
        }
        self.grow_within(&info, new_size as u64)?;
        Ok(new_size as u64)
    }

    /// Grows segment `name` to at least `min_size` bytes; returns its size, which another
    /// process may already have made larger. For writers that grow a shared buffer in parallel.
    pub fn grow_at_least(&mut self, name: &str, min_size: u64, authorize: impl FnOnce(u32) -> Result<()>) -> Result<u64> {
        let info = self.lookup(name)?;
        authorize(info.owner)?;
        if min_size <= info.size {
            return Ok(info.size);
        }
        self.grow_within(&info, min_size)?;
        Ok(self.lookup_id(info.id)?.size)
    }

    /// Grows the segment of `info` to `size` bytes, refusing (54000) sizes past its max_size.
    fn grow_within(&mut self, info: &SegmentInfo, size: u64) -> Result<()> {
        if size > info.max_size {
            return Err(uvm_err!(
                Code::ProgramLimitExceeded,
                "segment \"{}\" cannot grow to {size} bytes: its max_size is {}",
                info.name,
                info.max_size
            ));
        }
        self.grow_to(info.id, size)
    }

    /// Adds chunks until segment `id` covers `needed` bytes, then sets its size.
    fn grow_to(&mut self, id: u64, needed: u64) -> Result<()> {
        // Set when the device is out of memory for an `auto` chunk: it goes to the host tier.
        let mut spill = false;
        loop {
            // Before each chunk (none is pending here): a growth by many chunks answers cancel.
            crate::interrupt::check()?;
            let (pending, epoch, cpu_only) = {
                let mut reg = self.env.exclusive()?;
                let slot = reg.find_id(id).ok_or_else(|| UvmError::new(Code::UndefinedObject, "segment was dropped"))?;
                let info = reg.info(slot);
                if needed <= info.committed {
                    reg.set_size(slot, needed);
                    return Ok(());
                }
                let size = next_chunk_size(
                    info.committed,
                    info.chunks.len() as u32,
                    needed,
                    info.reserve,
                    self.limits.min_chunk,
                    GRANULARITY,
                );
                let (place, size) = if spill { (Place::Host, size) } else { self.place_chunk(&reg, info.tier_pref, size)? };
                (reg.reserve_chunk(slot, info.committed, size, place)?, reg.epoch(), info.tier_pref.cpu_only())
            };
            let mut guard = PendingGuard::new(self, vec![(pending, false)], epoch);
            let created = if cpu_only {
                guard.segs.provider.create_memfd_chunk(pending.size)
            } else {
                guard.segs.provider.create_chunk(pending.place, pending.size)
            };
            let fd = match created {
                Ok(fd) => fd,
                Err(e) if e.code == Code::OutOfMemory && pending.place != Place::Host && !spill => {
                    let auto = guard.segs.lookup_id(id).map(|i| i.tier_pref == TierPref::Auto).unwrap_or(false);
                    if !auto {
                        return Err(e);
                    }
                    spill = true;
                    continue; // the guard forgets the pending chunk
                }
                Err(e) => return Err(e),
            };
            guard.segs.with_broker(|b| b.put(epoch, pending.id, fd.as_fd()))?;
            guard.parts[0].1 = true;
            drop(fd);
            // A chunk cut at a GPU's budget covers only part of the growth; the loop adds the
            // rest, and only the chunk that completes it sets the size, so that a growth refused
            // part way (a `device` segment past every GPU's budget) leaves the size as it was.
            let covered = needed.min(pending.offset + pending.size);
            let new_size = if covered == needed { needed } else { 0 };
            let committed = guard.segs.env.exclusive()?.commit_chunk(&pending, new_size);
            match committed {
                Ok(_) => {
                    guard.committed = true;
                    if covered == needed {
                        return Ok(());
                    }
                }
                // another process grew the segment first: retry against the new layout
                Err(e) if e.code == Code::ObjectInUse => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Asks the broker to close these chunks' fds; failures are left to its sweep.
    fn release_chunks(&mut self, ids: &[u64]) {
        let Ok(epoch) = self.env.shared().map(|r| r.epoch()) else { return };
        for &id in ids {
            self.release(epoch, id);
        }
    }

    fn lookup_id(&self, id: u64) -> Result<SegmentInfo> {
        let reg = self.env.shared()?;
        let slot = reg.find_id(id).ok_or_else(|| UvmError::new(Code::UndefinedObject, "segment was dropped"))?;
        Ok(reg.info(slot))
    }

    /// A snapshot of segment `name` (no pin).
    pub fn lookup(&self, name: &str) -> Result<SegmentInfo> {
        crate::registry::validate_name(name)?;
        let reg = self.env.shared()?;
        let slot = reg.lookup(name)?;
        Ok(reg.info(slot))
    }

    /// Drops segment `name`. Fails with 55006 while any process holds a pin on it.
    pub fn drop_segment(&mut self, name: &str, authorize: impl FnOnce(u32) -> Result<()>) -> Result<()> {
        let info = self.lookup(name)?;
        authorize(info.owner)?;
        let ids = {
            let mut reg = self.env.exclusive()?;
            let slot =
                reg.find_id(info.id).ok_or_else(|| uvm_err!(Code::UndefinedObject, "segment \"{name}\" does not exist"))?;
            reg.drop_segment(slot)?
        };
        self.detach(info.id);
        self.release_chunks(&ids);
        Ok(())
    }

    /// Frees this process's attachment of segment `id`, giving back its session pins and any
    /// pins still counted on the slot. The mapping goes with the attachment, or with the last
    /// [`Pin`] still alive on it.
    fn detach(&mut self, id: u64) {
        self.session_pins.remove(&id);
        if let Some(a) = self.attachments.remove(&id) {
            if let Ok(mut reg) = self.env.exclusive() {
                reg.detach(a.att_slot);
            }
        }
    }

    /// Detaches the segments that no longer exist (dropped by another process, or by the GPU
    /// service on this process's behalf); the next pin would do it anyway.
    pub fn detach_dropped(&mut self) -> Result<()> {
        let stale = {
            let reg = self.env.shared()?;
            self.sweep(&reg)
        };
        for id in stale {
            self.detach(id);
        }
        Ok(())
    }

    /// Detaches every segment (process exit), giving back every pin this process holds.
    pub fn detach_all(&mut self) {
        self.release_deferred();
        let ids: Vec<u64> = self.attachments.keys().copied().collect();
        for id in ids {
            self.detach(id);
        }
        self.session_pins.clear();
        if let Ok(mut reg) = self.env.exclusive() {
            // Waits and flags whose guards outlive the process's exit path (FATAL skips
            // destructors).
            self.exit_duties().undo(&mut reg);
            reg.detach_process(self.env.pid());
        }
    }

    /// A handle on what this process's migrations hold in the registry, for an exit callback
    /// that may find this manager in use ([`ExitDuties::undo`]).
    pub fn exit_duties(&self) -> ExitDuties {
        ExitDuties(Rc::clone(&self.own_waits))
    }

    /// Unmaps segments that no longer exist (dropped by another process).
    fn sweep(&mut self, reg: &Registry) -> Vec<u64> {
        self.attachments.keys().copied().filter(|&id| reg.find_id(id).is_none()).collect()
    }

    /// Pins segment `name` and maps whatever this process lacks. `authorize` sees the owner
    /// role before anything is mapped.
    pub fn pin(&mut self, name: &str, authorize: impl FnOnce(u32) -> Result<()>) -> Result<Pin<E>> {
        crate::registry::validate_name(name)?;
        let (info, stale) = {
            let reg = self.env.shared()?;
            let slot = reg.lookup(name)?;
            (reg.info(slot), self.sweep(&reg))
        };
        for id in stale {
            self.detach(id);
        }
        authorize(info.owner)?;
        self.ensure_attachment(&info)?;
        let att = self.attachments[&info.id].att_slot;
        // Pin, and take the snapshot that the pin protects. A migration in progress holds new
        // pins back until it ends, and so does one waiting for the pins held now to drain
        // (unless this process holds one, or is the one waiting). The wait starts again once
        // when a waiting migration begins: its own wait is bounded by pin_wait too.
        let mut waited = Instant::now();
        let (mut behind, mut restarted) = (None, false);
        let (held, info, epoch) = loop {
            let reg = self.env.shared()?;
            let slot = match reg.find_id(info.id) {
                Some(s) => s,
                None => return Err(uvm_err!(Code::UndefinedObject, "segment \"{name}\" does not exist")),
            };
            let wait = match reg.pin_must_wait(slot, att) {
                Some(PinWait::MigrationWaiting) if self.own_waits.borrow().waits.contains_key(&info.id) => None,
                w => w,
            };
            let Some(wait) = wait else {
                break (reg.pin_attached(slot, att), reg.info(slot), reg.epoch());
            };
            drop(reg);
            if behind == Some(PinWait::MigrationWaiting) && wait == PinWait::Migrating && !restarted {
                (waited, restarted) = (Instant::now(), true);
            }
            behind = Some(wait);
            if waited.elapsed() >= self.limits.pin_wait {
                return Err(uvm_err!(
                    Code::LockNotAvailable,
                    "timed out after {} ms waiting for a migration of segment \"{name}\" to end",
                    self.limits.pin_wait.as_millis()
                ));
            }
            // No pin is held yet: an interrupt here leaves nothing behind.
            crate::interrupt::check()?;
            std::thread::sleep(Duration::from_millis(1));
        };
        // From here on, an error drops `held`, which gives the pin back.
        let started = Instant::now();
        let mut map_ms = 0.0;
        let a = self.attachments.get_mut(&info.id).expect("attached above");
        if a.generation != info.generation {
            map_missing(&mut self.broker, &self.env, a, &info, epoch)?;
            map_ms = ms(started);
        }
        // Every access through the pin is bounded by `info.size`: make sure this process really
        // maps exactly the snapshot's chunks, which cover it, whatever shared memory says.
        if *a.mapping.mapped.borrow() != info.chunks || info.size > info.committed {
            return Err(inconsistent(&info, "its chunks are not the ones this process mapped"));
        }
        let base = a.mapping.addr() as *mut u8;
        Ok(Pin { mapping: Rc::clone(&a.mapping), held, info, base, map_ms, _env: PhantomData })
    }

    /// Creates this process's attachment (reservation + registry slot) if it has none.
    fn ensure_attachment(&mut self, info: &SegmentInfo) -> Result<()> {
        if self.attachments.contains_key(&info.id) {
            return Ok(());
        }
        let (in_arena, arena) = {
            let reg = self.env.shared()?;
            let slot = reg
                .find_id(info.id)
                .ok_or_else(|| uvm_err!(Code::UndefinedObject, "segment \"{}\" does not exist", info.name))?;
            (reg.in_arena(slot), reg.arena())
        };
        let reservation = if in_arena {
            let end = info.base_hint.checked_add(info.reserve);
            if info.base_hint < arena.base || end.is_none_or(|e| e > arena.base + arena.size) {
                return Err(inconsistent(info, "its address range is outside the arena"));
            }
            // The registry gives live segments disjoint arena ranges, so an attachment of ours
            // that overlaps this one belongs to a segment dropped since: detach it first.
            let stale: Vec<u64> =
                self.attachments.values().filter(|a| a.overlaps(info.base_hint, info.reserve)).map(|a| a.segment_id).collect();
            for id in stale {
                self.detach(id);
            }
            // SAFETY: the range lies inside this process's arena (checked above): the PROT_NONE
            // range inherited from the postmaster, which only reservations use. The provider
            // refuses it if a reservation of this process (say, the mapping of a detached
            // segment that a pin still holds) still covers part of it.
            unsafe { self.provider.reserve_in_arena(info.base_hint, info.reserve)? }
        } else {
            self.provider.reserve(info.base_hint, info.reserve)?
        };
        let addr = reservation.addr();
        let same_address = info.base_hint == 0 || addr == info.base_hint;
        let mapping = Rc::new(Mapping {
            provider: Arc::clone(&self.provider),
            reservation: Some(reservation),
            mapped: RefCell::new(Vec::new()),
            cpu_only: info.tier_pref.cpu_only(),
            registered: RefCell::new(Vec::new()),
            ready: Cell::new(false),
        });
        // An error from here on drops `mapping`, which gives the reservation back.
        let att_slot = {
            let mut reg = self.env.exclusive()?;
            if info.base_hint == 0 {
                reg.set_base_hint(info.slot, addr);
            }
            reg.attach(self.env.pid(), info.id, addr, same_address, 0)?
        };
        self.attachments.insert(info.id, Attachment { segment_id: info.id, mapping, generation: 0, att_slot, same_address });
        Ok(())
    }

    /// Takes a session pin (held until `unpin_session` or process exit).
    pub fn pin_session(&mut self, name: &str, authorize: impl FnOnce(u32) -> Result<()>) -> Result<()> {
        let pin = self.pin(name, authorize)?;
        let id = pin.info.id;
        self.session_pins.entry(id).or_default().push(pin.into_session());
        Ok(())
    }

    /// Releases one session pin on `name`; false if this session holds none.
    pub fn unpin_session(&mut self, name: &str) -> Result<bool> {
        let info = self.lookup(name)?;
        let Some(held) = self.session_pins.get_mut(&info.id) else { return Ok(false) };
        drop(held.pop()); // gives the pin back
        if held.is_empty() {
            self.session_pins.remove(&info.id);
        }
        Ok(true)
    }
}

/// The broker connection in `slot`, connecting first if there is none. The broker starts with
/// the postmaster, so a process may have to wait a little for its socket.
fn connected<'a>(slot: &'a mut Option<Client>, path: &std::path::Path) -> Result<&'a Client> {
    if slot.is_none() {
        let start = Instant::now();
        let client = loop {
            match Client::connect(path) {
                Ok(c) => break c,
                Err(e) if start.elapsed() >= BROKER_WAIT => {
                    return Err(e.hint("Is pg_uvm_share in shared_preload_libraries, and its broker running?"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        *slot = Some(client);
    }
    Ok(slot.as_ref().expect("connected above"))
}

/// The error (0A000) for what a `cpu` segment (`TierPref::Cpu`) does not do.
fn cpu_segment(name: &str, what: &str) -> UvmError {
    uvm_err!(Code::FeatureNotSupported, "segment \"{name}\" is in the \"cpu\" tier: {what}")
}

/// The error for a registry entry that contradicts what this process mapped or may map: never
/// expected, but shared memory is not trusted with this process's memory safety.
fn inconsistent(info: &SegmentInfo, why: &str) -> UvmError {
    uvm_err!(Code::SystemError, "segment \"{}\" is inconsistent in the registry: {why}", info.name)
}

/// Checks that the chunks of `info` tile `[0, committed)` in order, without gaps or overlaps,
/// inside the reservation, and cover its size.
fn check_layout(info: &SegmentInfo) -> Result<()> {
    let mut end = 0u64;
    for c in &info.chunks {
        if c.offset != end || c.size == 0 {
            return Err(inconsistent(info, "its chunks do not tile it"));
        }
        end = c.offset.checked_add(c.size).ok_or_else(|| inconsistent(info, "a chunk ends past 2^64"))?;
    }
    if end != info.committed || end > info.reserve || info.size > end {
        return Err(inconsistent(info, "its sizes do not match its chunks"));
    }
    Ok(())
}

/// Maps the chunks of `info` that `a` lacks, unmapping chunks that were replaced, and records the
/// generation. A free function so that it can borrow the manager's fields separately.
fn map_missing<E: Env>(broker: &mut Option<Client>, env: &E, a: &mut Attachment, info: &SegmentInfo, epoch: u64) -> Result<()> {
    check_layout(info)?;
    // Chunks mapped here that the segment no longer has at the same offset: unmap them, unless a
    // pin of this process still uses the mapping (chunks are replaced only with no pin held, so
    // this means the registry lost a pin: refuse rather than pull memory from under the pin).
    let gone: Vec<ChunkInfo> = a.mapping.mapped.borrow().iter().filter(|m| !info.chunks.contains(m)).copied().collect();
    if !gone.is_empty() && Rc::strong_count(&a.mapping) > 1 {
        return Err(uvm_err!(
            Code::ObjectInUse,
            "chunks of segment \"{}\" were replaced while this process still uses them",
            info.name
        ));
    }
    for c in &gone {
        a.mapping.unmap(c);
    }
    for c in &info.chunks {
        if a.mapping.mapped.borrow().contains(c) {
            continue;
        }
        let fd = connected(broker, &env.broker_path())?.get(epoch, c.id)?;
        a.mapping.map(fd.as_fd(), c)?;
    }
    a.generation = info.generation;
    if let Ok(mut reg) = env.exclusive() {
        reg.set_mapped_generation(a.att_slot, info.generation);
    }
    Ok(())
}

/// Chunks being added or replaced, recorded as pending in the registry. Dropped before they are
/// committed (an error, a cancel), it forgets them in the registry and, for each whose fd the
/// broker has, asks the broker to close it.
struct PendingGuard<'a, E: Env> {
    segs: &'a mut Segments<E>,
    /// The pending chunks, each with whether the broker holds its fd.
    parts: Vec<(PendingChunk, bool)>,
    committed: bool,
    epoch: u64,
}

impl<'a, E: Env> PendingGuard<'a, E> {
    /// Guards `parts`, recorded in the process's duties too (a FATAL exit skips `drop`).
    fn new(segs: &'a mut Segments<E>, parts: Vec<(PendingChunk, bool)>, epoch: u64) -> Self {
        let mut g = PendingGuard { segs, parts: Vec::with_capacity(parts.len()), committed: false, epoch };
        for (p, handed_over) in parts {
            g.add(p, handed_over);
        }
        g
    }

    fn add(&mut self, p: PendingChunk, handed_over: bool) {
        self.segs.own_waits.borrow_mut().pending.insert(p.id, p);
        self.parts.push((p, handed_over));
    }
}

impl<E: Env> Drop for PendingGuard<'_, E> {
    fn drop(&mut self) {
        {
            let mut own = self.segs.own_waits.borrow_mut();
            for (p, _) in &self.parts {
                own.pending.remove(&p.id);
            }
        }
        if self.committed {
            return;
        }
        if let Ok(mut reg) = self.segs.env.exclusive() {
            for (p, _) in &self.parts {
                reg.abort_chunk(p);
            }
        }
        let epoch = self.epoch;
        for &(p, handed_over) in &self.parts {
            self.segs.kept.forget(p.id);
            if handed_over {
                let _ = self.segs.with_broker(|b| b.release(epoch, p.id));
            }
        }
    }
}
