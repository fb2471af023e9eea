//! The registry: what every process must agree on about every segment, in one block of
//! PostgreSQL main shared memory.
//!
//! # Design
//!
//! A segment is a name, an owner role, a reserved address range of `reserve` bytes and an ordered
//! list of chunks that cover `[0, committed)` of that range without gaps. A chunk is one provider
//! allocation (a memfd, or a CUDA VMM allocation) known cluster-wide by a 64-bit chunk id; the
//! broker holds its file descriptor under that id. The registry never holds memory itself: it is
//! the table of contents that lets any process rebuild the same mapping.
//!
//! Everything here is fixed-size and `#[repr(C)]`, because it lives in shared memory that every
//! backend maps at a different address: no pointers, only indexes and offsets. Capacities (segment
//! slots, chunk slots, attachment slots) come from GUCs at postmaster start. The block is laid out
//! as `Header | SegmentSlot[max_segments] | ChunkSlot[max_chunks] | AttachSlot[max_attachments]`.
//!
//! The values it hands out ([`Tier`], [`TierPref`], [`ChunkInfo`], [`Arena`]) are defined in
//! `crate::vocab` and re-exported here, so that the providers use them without the registry.
//!
//! This module is plain Rust: it knows nothing of LWLocks or PostgreSQL. `shmem.rs` puts the block
//! in shared memory and hands out [`Registry`] only through RAII lock guards: a shared guard
//! derefs to `&Registry` (lookups, pins), an exclusive guard to `&mut Registry` (everything that
//! changes the table). Pin counts are atomics so that pinning needs only the shared lock, yet a
//! writer holding the exclusive lock sees a stable count (nobody can pin without the lock).
//! Releasing a pin needs no lock at all, and only a [`HeldPin`] can do it: `pin_attached` returns
//! one, and dropping it gives that one pin back. No safe code holds the whole registry without
//! the lock.
//!
//! # Lifecycle of a segment
//!
//! 1. `create_segment` (exclusive): a free slot, a unique name, an address range in the arena.
//! 2. Chunks are added in two steps so that the broker never holds an fd the registry does not
//!    know: `reserve_chunk` records a *pending* chunk id; the creator allocates the memory and
//!    hands the fd to the broker; `commit_chunk` appends it to the segment (generation + 1), or
//!    `abort_chunk` forgets it. The broker's garbage sweep closes any fd whose id is neither
//!    committed nor pending, so a process that dies between the steps leaks nothing for long.
//! 3. Readers `pin_attached` (shared lock, atomic +1), copy the chunk list, map what they lack,
//!    use the memory and drop the [`HeldPin`] (no lock, atomic -1). The generation tells a
//!    process whether its mapping is current.
//! 4. `drop_segment` (exclusive) refuses while pinned, frees the slots and returns the chunk ids
//!    for the caller to release at the broker. Processes that still map it notice at their next
//!    access (the id is gone) and unmap.
//!
//! A chunk records its place: the host tier, or the device tier of one GPU. The header counts
//! bytes per GPU and in the host tier from the moment a chunk is reserved (the device budget of
//! each GPU is checked against its count, under the exclusive lock, by `crate::placement`).
//! A migration replaces a live chunk by pending chunks that tile its range
//! (`reserve_replacement`, `replace_chunk_by`). Chunks of a fourth state, `POOL`, belong to no
//! segment: pinned host pieces the GPU service keeps ready for migrations to the host tier
//! (`reserve_pool_chunk`, `commit_pool_chunk`, `take_pool_chunk`, `trim_pool`); the broker holds
//! their fds like any other, and its sweep keeps them.
//!
//! The code follows these lives: this file the layout, segments and their growth and drop;
//! `migration.rs` migrations and the host pool; `attach.rs` attachments and pins.
//!
//! After a crash-restart the postmaster re-creates shared memory: the registry starts empty with a
//! new `epoch`, and the broker (restarted too) refuses any request made under the old epoch.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::error::{Code, Result, UvmError};
use crate::stats::{
    NodeCounters, Progress, ProgressGuard, ProgressKind, ProgressPhase, ProgressSlot, SegmentCounters, SegmentStats,
    PROGRESS_SLOTS,
};
use crate::uvm_err;
pub use crate::vocab::{Arena, ChunkInfo, Place, Tier, TierPref, MAX_DEVICES};

mod attach;
mod migration;

pub use attach::HeldPin;
pub use migration::PinWait;

/// Longest segment name in bytes, as for PostgreSQL identifiers (`NAMEDATALEN - 1`).
pub const MAX_NAME_LEN: usize = 63;
/// Chunks one segment may have. Chunk sizes grow geometrically, so 64 chunks starting at 2 MiB
/// cover far more than any machine's memory.
pub const MAX_CHUNKS_PER_SEGMENT: usize = 64;
const MAGIC: u64 = 0x5556_4d53_4841_5245; // "UVMSHARE"
const LAYOUT_VERSION: u32 = 4;
const NO_CHUNK: u32 = u32::MAX;

/// Slot counts, fixed at postmaster start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub max_segments: u32,
    pub max_chunks: u32,
    pub max_attachments: u32,
}

#[repr(C)]
struct Header {
    magic: u64,
    layout_version: u32,
    max_segments: u32,
    max_chunks: u32,
    max_attachments: u32,
    epoch: u64,
    next_segment_id: u64,
    next_chunk_id: u64,
    arena_base: u64,
    arena_size: u64,
    /// Bytes per GPU and in the host tier, cluster-wide, of every chunk committed or being
    /// allocated (counted from `reserve_chunk`, so that each GPU's device budget, checked
    /// against its own count under the lock, holds against concurrent growth).
    gpu_bytes: [u64; MAX_DEVICES as usize],
    host_bytes: u64,
    /// Bytes of the host pool's pieces (not counted in `host_bytes`).
    pool_bytes: u64,
    broker_pid: i32,
    /// The provider every process of this cluster uses (0: not chosen yet; see `claim_provider`).
    provider: u32,
    /// How many GPUs that provider places device chunks on (recorded with it; for the views,
    /// which read the registry alone).
    devices: u32,
    /// A broker started since this registry was made (see [`Registry::start_broker`]).
    broker_started: u32,
    /// The GpuJoin plan node's cumulative counters (`crate::stats`).
    node: NodeCounters,
    /// Long operations in progress (`uvm.progress`; `crate::stats`).
    progress: [ProgressSlot; PROGRESS_SLOTS],
    /// Why the CUDA provider could not run although a driver is installed (UTF-8, NUL-padded;
    /// empty: nothing to say), recorded by the process that chose the provider.
    provider_note: [u8; PROVIDER_NOTE_BYTES],
}

/// Bytes of [`Registry::provider_note`].
const PROVIDER_NOTE_BYTES: usize = 400;

#[repr(C)]
struct SegmentSlot {
    /// 0: the slot is free.
    id: u64,
    name: [u8; MAX_NAME_LEN + 1],
    owner: u32,
    tier_pref: u32,
    /// Logical size: readable and writable bytes.
    size: u64,
    /// The maximum size the user asked for.
    max_size: u64,
    /// Reserved address range, `max_size` rounded up to the granularity.
    reserve: u64,
    /// Bytes covered by chunks (>= size).
    committed: u64,
    generation: u64,
    /// Offset of the range in the arena, or the creator's address when there is no arena.
    base_hint: u64,
    created_at: i64,
    pins: AtomicU32,
    nchunks: u32,
    flags: u32,
    /// Migrations waiting for the pins to drain (`wait_to_migrate`): while there is one, new
    /// pins wait behind it (see [`Registry::pin_must_wait`]). Changed under the exclusive lock.
    migrations_waiting: u32,
    chunks: [u32; MAX_CHUNKS_PER_SEGMENT],
    /// Cumulative counters (`crate::stats`), from the segment's creation.
    stats: SegmentCounters,
}

const CHUNK_FREE: u32 = 0;
const CHUNK_PENDING: u32 = 1;
const CHUNK_LIVE: u32 = 2;
/// A piece of the host pool: pinned host memory held by the broker for migrations to the host
/// tier, owned by no segment (`segment_id` 0).
const CHUNK_POOL: u32 = 3;

#[repr(C)]
struct ChunkSlot {
    id: u64,
    segment_id: u64,
    offset: u64,
    size: u64,
    tier: u32,
    state: u32,
    /// The GPU of a device chunk (0 for the host tier).
    device: u32,
    _pad: u32,
}

impl ChunkSlot {
    const FREE: ChunkSlot =
        ChunkSlot { id: 0, segment_id: 0, offset: 0, size: 0, tier: 0, state: CHUNK_FREE, device: 0, _pad: 0 };

    fn pending(id: u64, segment_id: u64, offset: u64, size: u64, place: Place) -> ChunkSlot {
        let (tier, device) = (place.tier() as u32, place.device());
        ChunkSlot { id, segment_id, offset, size, tier, state: CHUNK_PENDING, device, _pad: 0 }
    }

    fn place(&self) -> Place {
        Place::from_parts(Tier::from_u32(self.tier), self.device)
    }
}

#[repr(C)]
struct AttachSlot {
    /// 0: the slot is free.
    pid: i32,
    same_address: u32,
    segment_id: u64,
    base: u64,
    mapped_generation: u64,
    /// High 32 bits: the slot's incarnation, bumped whenever the slot is freed, so that a
    /// [`HeldPin`] of an earlier attachment in this slot never releases a later one's pin. Low
    /// 32 bits: the pins counted on this attachment.
    pins: AtomicU64,
}

const PIN_COUNT_MASK: u64 = 0xffff_ffff;

/// A consistent copy of one segment's entry, taken under the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    pub slot: u32,
    pub id: u64,
    pub name: String,
    pub owner: u32,
    pub tier_pref: TierPref,
    pub size: u64,
    pub max_size: u64,
    pub reserve: u64,
    pub committed: u64,
    pub generation: u64,
    /// Absolute address every process should map the segment at (0: anywhere).
    pub base_hint: u64,
    pub created_at: i64,
    pub pins: u32,
    pub chunks: Vec<ChunkInfo>,
}

impl SegmentInfo {
    pub fn bytes_in(&self, tier: Tier) -> u64 {
        self.chunks.iter().filter(|c| c.tier == tier).map(|c| c.size).sum()
    }
    /// Device bytes per GPU, for GPUs `0..devices` (chunks on GPUs past that are not counted).
    pub fn bytes_per_gpu(&self, devices: u32) -> Vec<u64> {
        let mut v = vec![0u64; devices as usize];
        for c in self.chunks.iter().filter(|c| c.tier == Tier::Device) {
            if let Some(b) = v.get_mut(c.device as usize) {
                *b += c.size;
            }
        }
        v
    }
}

/// One process's attachment as `uvm.attachments` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachInfo {
    pub pid: i32,
    pub segment_id: u64,
    pub base: u64,
    pub same_address: bool,
    pub mapped_generation: u64,
    pub pins: u32,
}

/// What `create_segment` needs; sizes already validated and rounded by the caller.
#[derive(Clone, Debug)]
pub struct NewSegment<'a> {
    pub name: &'a str,
    pub owner: u32,
    pub max_size: u64,
    pub reserve: u64,
    pub tier_pref: TierPref,
    pub created_at: i64,
    /// Alignment of the segment's base in the arena (the provider's granularity).
    pub align: u64,
}

/// A chunk recorded as pending by `reserve_chunk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingChunk {
    pub slot: u32,
    pub id: u64,
    pub segment_id: u64,
    pub offset: u64,
    pub size: u64,
    pub place: Place,
}

/// Checks a segment name: non-empty, at most [`MAX_NAME_LEN`] bytes, no NUL.
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(UvmError::new(Code::InvalidName, "segment name must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(uvm_err!(Code::NameTooLong, "segment name is too long ({} bytes, at most {MAX_NAME_LEN})", name.len()));
    }
    if name.as_bytes().contains(&0) {
        return Err(UvmError::new(Code::InvalidName, "segment name must not contain NUL"));
    }
    Ok(())
}

/// The prefix of the plan nodes' temporary segments (`crate::node::cleanup` names them
/// `pg_temp_gpujoin_<pid>_<n>_<what>`). Reserved: no user creates, drops, reads, writes, pins
/// or otherwise touches a segment whose name starts with it ([`check_not_reserved`]), so that
/// no one can squat a node's next name or have the abort-time sweep drop a segment of theirs.
pub const RESERVED_PREFIX: &str = "pg_temp_";

/// Fails with 42939 (`reserved_name`) when `name` lies in the plan nodes' namespace
/// ([`RESERVED_PREFIX`]): every path by which a user names a segment checks this.
pub fn check_not_reserved(name: &str) -> Result<()> {
    if name.starts_with(RESERVED_PREFIX) {
        return Err(uvm_err!(Code::ReservedName, "segment name \"{name}\" is reserved").detail(format!(
            "Names starting with \"{RESERVED_PREFIX}\" belong to the temporary segments of pg_uvm_share's plan nodes."
        )));
    }
    Ok(())
}

/// Rounds `v` up to a multiple of `align` (a power of two or any positive number); `None` on
/// overflow.
pub fn round_up(v: u64, align: u64) -> Option<u64> {
    debug_assert!(align > 0);
    v.checked_add(align - 1).map(|x| x / align * align)
}

/// Size of the next chunk of a segment that has `nchunks` chunks covering `committed` bytes and
/// must now cover `needed` bytes, inside a reservation of `reserve` bytes.
///
/// As PostgreSQL's DSA does with its segments, the size doubles every two chunks
/// (`min_chunk << nchunks / 2`), so a segment that grows in small steps ends with
/// O(2 log2(size / min_chunk)) chunks; a growth larger than that step gets one chunk that covers
/// it exactly. Both are rounded to `gran` and capped at what is left of the reservation.
pub fn next_chunk_size(committed: u64, nchunks: u32, needed: u64, reserve: u64, min_chunk: u64, gran: u64) -> u64 {
    debug_assert!(needed > committed && needed <= reserve);
    let min_chunk = round_up(min_chunk.max(gran), gran).unwrap_or(gran);
    let shift = (nchunks / 2).min(40);
    let geometric = min_chunk.checked_shl(shift).unwrap_or(u64::MAX);
    let exact = round_up(needed - committed, gran).unwrap_or(u64::MAX);
    exact.max(geometric).min(reserve - committed)
}

/// The registry as seen through a lock guard. See the module documentation.
pub struct Registry {
    hdr: *mut Header,
    segs: *mut SegmentSlot,
    chunks: *mut ChunkSlot,
    atts: *mut AttachSlot,
}

// SAFETY: a Registry is only a set of pointers into shared memory; all access goes through lock
// guards (shmem.rs) or, in tests, through exclusive ownership of the backing buffer (the
// contract of `init` and `from_raw`).
unsafe impl Send for Registry {}

const fn align8(x: usize) -> usize {
    (x + 7) & !7
}

impl Registry {
    /// Bytes of shared memory a registry of this capacity needs.
    pub fn size_for(cap: Capacity) -> usize {
        align8(std::mem::size_of::<Header>())
            + cap.max_segments as usize * std::mem::size_of::<SegmentSlot>()
            + cap.max_chunks as usize * std::mem::size_of::<ChunkSlot>()
            + cap.max_attachments as usize * std::mem::size_of::<AttachSlot>()
    }

    fn layout(base: *mut u8, cap: Capacity) -> Registry {
        let hdr = base as *mut Header;
        // SAFETY: offsets stay inside the `size_for(cap)` bytes the caller guarantees.
        unsafe {
            let segs = base.add(align8(std::mem::size_of::<Header>())) as *mut SegmentSlot;
            let chunks = segs.add(cap.max_segments as usize) as *mut ChunkSlot;
            let atts = chunks.add(cap.max_chunks as usize) as *mut AttachSlot;
            Registry { hdr, segs, chunks, atts }
        }
    }

    /// Formats a fresh registry in `base`.
    ///
    /// # Safety
    /// `base` must point to at least `size_for(cap)` writable bytes, 8-byte aligned, that nobody
    /// else accesses during the call.
    pub unsafe fn init(base: *mut u8, cap: Capacity, epoch: u64, arena: Arena) -> Registry {
        // SAFETY: the caller guarantees the buffer; zero is a valid state for every slot type
        // (free slots, zero atomics).
        unsafe { std::ptr::write_bytes(base, 0, Self::size_for(cap)) };
        let r = Self::layout(base, cap);
        // SAFETY: hdr points into the buffer just zeroed.
        unsafe {
            *r.hdr = Header {
                magic: MAGIC,
                layout_version: LAYOUT_VERSION,
                max_segments: cap.max_segments,
                max_chunks: cap.max_chunks,
                max_attachments: cap.max_attachments,
                epoch,
                next_segment_id: 1,
                next_chunk_id: 1,
                arena_base: arena.base,
                arena_size: arena.size,
                gpu_bytes: [0; MAX_DEVICES as usize],
                host_bytes: 0,
                pool_bytes: 0,
                broker_pid: 0,
                provider: 0,
                devices: 0,
                broker_started: 0,
                node: NodeCounters::default(),
                progress: std::array::from_fn(|_| ProgressSlot::default()),
                provider_note: [0; PROVIDER_NOTE_BYTES],
            };
        }
        r
    }

    /// Views an initialized registry.
    ///
    /// # Safety
    /// `base` must point to a block formatted by [`Registry::init`] that stays mapped for as long
    /// as the returned `Registry`, or any [`HeldPin`] taken through it, is used. The caller holds
    /// the registry's lock while it uses the `Registry`: in shared mode for `&Registry`, in
    /// exclusive mode for `&mut Registry` (as `shmem.rs`'s guards do), since its methods read
    /// and write the slots with plain loads and stores; only a `HeldPin` needs no lock.
    pub unsafe fn from_raw(base: *mut u8) -> Registry {
        // SAFETY: the caller guarantees an initialized header at `base`.
        let h = unsafe { &*(base as *const Header) };
        assert!(h.magic == MAGIC && h.layout_version == LAYOUT_VERSION, "registry corrupt");
        Self::layout(
            base,
            Capacity { max_segments: h.max_segments, max_chunks: h.max_chunks, max_attachments: h.max_attachments },
        )
    }

    fn hdr(&self) -> &Header {
        // SAFETY: hdr points to the initialized header for the registry's lifetime.
        unsafe { &*self.hdr }
    }
    fn hdr_mut(&mut self) -> &mut Header {
        // SAFETY: as above; &mut self means the exclusive lock is held.
        unsafe { &mut *self.hdr }
    }
    fn seg(&self, i: u32) -> &SegmentSlot {
        assert!(i < self.hdr().max_segments);
        // SAFETY: bounds checked against the capacity the block was laid out with.
        unsafe { &*self.segs.add(i as usize) }
    }
    fn seg_mut(&mut self, i: u32) -> &mut SegmentSlot {
        assert!(i < self.hdr().max_segments);
        // SAFETY: bounds checked; exclusive access through &mut self.
        unsafe { &mut *self.segs.add(i as usize) }
    }
    fn chunk(&self, i: u32) -> &ChunkSlot {
        assert!(i < self.hdr().max_chunks);
        // SAFETY: bounds checked.
        unsafe { &*self.chunks.add(i as usize) }
    }
    fn chunk_mut(&mut self, i: u32) -> &mut ChunkSlot {
        assert!(i < self.hdr().max_chunks);
        // SAFETY: bounds checked; exclusive access through &mut self.
        unsafe { &mut *self.chunks.add(i as usize) }
    }
    fn att(&self, i: u32) -> &AttachSlot {
        assert!(i < self.hdr().max_attachments);
        // SAFETY: bounds checked.
        unsafe { &*self.atts.add(i as usize) }
    }
    fn att_mut(&mut self, i: u32) -> &mut AttachSlot {
        assert!(i < self.hdr().max_attachments);
        // SAFETY: bounds checked; exclusive access through &mut self.
        unsafe { &mut *self.atts.add(i as usize) }
    }

    pub fn capacity(&self) -> Capacity {
        let h = self.hdr();
        Capacity { max_segments: h.max_segments, max_chunks: h.max_chunks, max_attachments: h.max_attachments }
    }
    pub fn epoch(&self) -> u64 {
        self.hdr().epoch
    }
    pub fn arena(&self) -> Arena {
        Arena { base: self.hdr().arena_base, size: self.hdr().arena_size }
    }
    pub fn broker_pid(&self) -> i32 {
        self.hdr().broker_pid
    }
    pub fn set_broker_pid(&mut self, pid: i32) {
        self.hdr_mut().broker_pid = pid;
    }
    /// Records that a broker starts; false when one started before in this registry's life
    /// (the broker was restarted, and the fds of the chunks registered then died with its
    /// predecessor).
    pub fn start_broker(&mut self) -> bool {
        std::mem::replace(&mut self.hdr_mut().broker_started, 1) == 0
    }
    /// Records `kind` (a non-zero provider code) as the cluster's provider unless one was
    /// recorded already; returns the recorded one. All processes must map chunks the same way,
    /// so the first process that needs a provider decides for the whole cluster (until the next
    /// restart).
    pub fn claim_provider(&mut self, kind: u32) -> u32 {
        debug_assert!(kind != 0);
        if self.hdr().provider == 0 {
            self.hdr_mut().provider = kind;
        }
        self.hdr().provider
    }

    /// Records why the CUDA provider could not run (cut at a character boundary to fit).
    pub fn set_provider_note(&mut self, note: &str) {
        let mut end = note.len().min(PROVIDER_NOTE_BYTES);
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        let buf = &mut self.hdr_mut().provider_note;
        *buf = [0; PROVIDER_NOTE_BYTES];
        buf[..end].copy_from_slice(&note.as_bytes()[..end]);
    }

    /// The note of [`Registry::set_provider_note`] (`None`: none).
    pub fn provider_note(&self) -> Option<String> {
        let b = &self.hdr().provider_note;
        let len = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        (len > 0).then(|| String::from_utf8_lossy(&b[..len]).into_owned())
    }

    /// Records how many GPUs the cluster's provider has (every process computes the same).
    pub fn record_devices(&mut self, devices: u32) {
        self.hdr_mut().devices = devices.min(MAX_DEVICES);
    }

    /// The GPUs of the cluster's provider, as recorded (0: no device tier, or not chosen yet).
    pub fn devices(&self) -> u32 {
        self.hdr().devices.min(MAX_DEVICES)
    }

    /// The recorded provider code (0: none yet).
    pub fn provider(&self) -> u32 {
        self.hdr().provider
    }

    /// Bytes in a tier, all segments together (chunks committed or being allocated).
    pub fn tier_bytes(&self, tier: Tier) -> u64 {
        match tier {
            Tier::Device => self.hdr().gpu_bytes.iter().sum(),
            Tier::Host => self.hdr().host_bytes,
        }
    }

    /// Committed device bytes on GPU `n`, all segments together (0 past [`MAX_DEVICES`]).
    pub fn gpu_bytes(&self, n: u32) -> u64 {
        self.hdr().gpu_bytes.get(n as usize).copied().unwrap_or(0)
    }

    /// Adds `delta` bytes to the committed total of `place`. A GPU past [`MAX_DEVICES`] (never
    /// recorded: placement names only the provider's GPUs) counts nowhere.
    fn account(&mut self, place: Place, delta: i128) {
        let total = match place {
            Place::Host => &mut self.hdr_mut().host_bytes,
            Place::Device(n) => match self.hdr_mut().gpu_bytes.get_mut(n as usize) {
                Some(t) => t,
                None => return,
            },
        };
        *total = (*total as i128 + delta).max(0) as u64;
    }

    fn seg_name(s: &SegmentSlot) -> &str {
        let n = s.name.iter().position(|&b| b == 0).unwrap_or(s.name.len());
        std::str::from_utf8(&s.name[..n]).unwrap_or("")
    }

    /// Slot index of the segment with this name.
    pub fn find(&self, name: &str) -> Option<u32> {
        (0..self.hdr().max_segments).find(|&i| {
            let s = self.seg(i);
            s.id != 0 && Self::seg_name(s) == name
        })
    }

    /// Slot index of the segment with this id.
    pub fn find_id(&self, id: u64) -> Option<u32> {
        if id == 0 {
            return None;
        }
        (0..self.hdr().max_segments).find(|&i| self.seg(i).id == id)
    }

    /// Looks a segment up by name, or fails with 42704.
    pub fn lookup(&self, name: &str) -> Result<u32> {
        self.find(name).ok_or_else(|| uvm_err!(Code::UndefinedObject, "segment \"{name}\" does not exist"))
    }

    /// A copy of a segment's entry.
    pub fn info(&self, slot: u32) -> SegmentInfo {
        let s = self.seg(slot);
        let chunks = s.chunks[..s.nchunks as usize]
            .iter()
            .map(|&ci| {
                let c = self.chunk(ci);
                ChunkInfo { id: c.id, offset: c.offset, size: c.size, tier: Tier::from_u32(c.tier), device: c.device }
            })
            .collect();
        let arena = self.arena();
        SegmentInfo {
            slot,
            id: s.id,
            name: Self::seg_name(s).to_string(),
            owner: s.owner,
            tier_pref: TierPref::from_code(s.tier_pref),
            size: s.size,
            max_size: s.max_size,
            reserve: s.reserve,
            committed: s.committed,
            generation: s.generation,
            base_hint: if s.flags & FLAG_IN_ARENA != 0 { arena.base + s.base_hint } else { s.base_hint },
            created_at: s.created_at,
            pins: s.pins.load(Ordering::Acquire),
            chunks,
        }
    }

    /// Every segment, in slot order.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        (0..self.hdr().max_segments).filter(|&i| self.seg(i).id != 0).map(|i| self.info(i)).collect()
    }

    /// First-fit search for `reserve` bytes of the arena, aligned to `align`.
    fn alloc_range(&self, reserve: u64, align: u64) -> Option<u64> {
        let arena = self.arena();
        if arena.size == 0 {
            return None;
        }
        let mut used: Vec<(u64, u64)> = (0..self.hdr().max_segments)
            .map(|i| self.seg(i))
            .filter(|s| s.id != 0)
            .map(|s| (s.base_hint, s.base_hint + s.reserve))
            .collect();
        used.sort_unstable();
        let mut cursor = 0u64;
        for (start, end) in used {
            let at = round_up(cursor, align)?;
            if at.checked_add(reserve)? <= start {
                return Some(at);
            }
            cursor = cursor.max(end);
        }
        let at = round_up(cursor, align)?;
        (at.checked_add(reserve)? <= arena.size).then_some(at)
    }

    /// Creates a segment with no chunks yet. Fails on a duplicate name (42710) or a full
    /// registry (53400).
    pub fn create_segment(&mut self, spec: &NewSegment<'_>) -> Result<u32> {
        validate_name(spec.name)?;
        if self.find(spec.name).is_some() {
            return Err(uvm_err!(Code::DuplicateObject, "segment \"{}\" already exists", spec.name));
        }
        let slot = (0..self.hdr().max_segments).find(|&i| self.seg(i).id == 0).ok_or_else(|| {
            uvm_err!(
                Code::ConfigurationLimitExceeded,
                "too many shared segments (pg_uvm_share.max_segments = {})",
                self.hdr().max_segments
            )
            .hint("Drop unused segments or raise pg_uvm_share.max_segments (needs a restart).")
        })?;
        // With no arena (or no room in it), base_hint stays 0 and the creator records its own
        // address later with `set_base_hint`.
        let (base_hint, flags) = match self.alloc_range(spec.reserve, spec.align.max(1)) {
            Some(offset) => (offset, FLAG_IN_ARENA),
            None => (0, 0),
        };
        let id = self.hdr().next_segment_id;
        self.hdr_mut().next_segment_id += 1;
        let mut name = [0u8; MAX_NAME_LEN + 1];
        name[..spec.name.len()].copy_from_slice(spec.name.as_bytes());
        let s = self.seg_mut(slot);
        s.id = id;
        s.name = name;
        s.owner = spec.owner;
        s.tier_pref = spec.tier_pref.code();
        s.size = 0; // set by the first commit_chunk
        s.max_size = spec.max_size;
        s.reserve = spec.reserve;
        s.committed = 0;
        s.generation = 1;
        s.base_hint = base_hint;
        s.flags = flags;
        s.migrations_waiting = 0;
        s.stats.reset();
        s.created_at = spec.created_at;
        s.pins.store(0, Ordering::Release);
        s.nchunks = 0;
        s.chunks = [NO_CHUNK; MAX_CHUNKS_PER_SEGMENT];
        Ok(slot)
    }

    /// Whether the segment's address range lies in the inherited arena.
    pub fn in_arena(&self, slot: u32) -> bool {
        self.seg(slot).flags & FLAG_IN_ARENA != 0
    }

    /// Records the creator's address for a segment outside the arena.
    pub fn set_base_hint(&mut self, slot: u32, addr: u64) {
        if !self.in_arena(slot) && self.seg(slot).base_hint == 0 {
            self.seg_mut(slot).base_hint = addr;
        }
    }

    /// Records a pending chunk that will cover `[offset, offset + size)` of the segment. The
    /// caller then allocates it, gives its fd to the broker, and calls `commit_chunk` or
    /// `abort_chunk`.
    pub fn reserve_chunk(&mut self, slot: u32, offset: u64, size: u64, place: Place) -> Result<PendingChunk> {
        let (seg_id, nchunks) = {
            let s = self.seg(slot);
            (s.id, s.nchunks)
        };
        if nchunks as usize >= MAX_CHUNKS_PER_SEGMENT {
            return Err(uvm_err!(
                Code::ProgramLimitExceeded,
                "segment has the maximum number of chunks ({MAX_CHUNKS_PER_SEGMENT})"
            )
            .hint("Grow segments in larger steps, or raise pg_uvm_share.min_chunk_size."));
        }
        let ci = self.free_chunk_slot()?;
        let id = self.hdr().next_chunk_id;
        self.hdr_mut().next_chunk_id += 1;
        *self.chunk_mut(ci) = ChunkSlot::pending(id, seg_id, offset, size, place);
        // Counted from now on, so that a budget check under the lock sees the chunks other
        // processes are still allocating.
        self.account(place, size as i128);
        Ok(PendingChunk { slot: ci, id, segment_id: seg_id, offset, size, place })
    }

    fn free_chunk_slot(&self) -> Result<u32> {
        (0..self.hdr().max_chunks).find(|&i| self.chunk(i).state == CHUNK_FREE).ok_or_else(|| {
            uvm_err!(Code::ConfigurationLimitExceeded, "too many chunks (pg_uvm_share.max_chunks = {})", self.hdr().max_chunks)
                .hint("Drop unused segments or raise pg_uvm_share.max_chunks (needs a restart).")
        })
    }

    /// Forgets a pending chunk (its allocation failed or lost a race).
    pub fn abort_chunk(&mut self, p: &PendingChunk) {
        let c = self.chunk_mut(p.slot);
        if c.id == p.id && c.state == CHUNK_PENDING {
            // A pending piece of the host pool (no segment) was not counted yet.
            let counted = c.segment_id != 0;
            *c = ChunkSlot::FREE;
            if counted {
                self.account(p.place, -(p.size as i128));
            }
        }
    }

    /// Appends a pending chunk to its segment and raises the logical size to `new_size` (0:
    /// leaves it, for a chunk that covers only part of a growth).
    /// Fails if the segment changed meanwhile: it was dropped (42704), or another process
    /// already covered this offset (55006; the caller retries with a fresh snapshot).
    pub fn commit_chunk(&mut self, p: &PendingChunk, new_size: u64) -> Result<u64> {
        let slot = self
            .find_id(p.segment_id)
            .ok_or_else(|| UvmError::new(Code::UndefinedObject, "segment was dropped while it was growing"))?;
        if self.seg(slot).committed != p.offset {
            return Err(UvmError::new(Code::ObjectInUse, "segment was grown concurrently"));
        }
        debug_assert!(new_size <= p.offset + p.size);
        self.chunk_mut(p.slot).state = CHUNK_LIVE;
        let s = self.seg_mut(slot);
        s.chunks[s.nchunks as usize] = p.slot;
        s.nchunks += 1;
        s.committed += p.size;
        s.size = s.size.max(new_size);
        s.generation += 1;
        // (Counted since `reserve_chunk`.)
        Ok(s.generation)
    }

    /// Sets the logical size when the committed chunks already cover it.
    pub fn set_size(&mut self, slot: u32, new_size: u64) {
        let s = self.seg_mut(slot);
        debug_assert!(new_size <= s.committed);
        if new_size > s.size {
            s.size = new_size;
        }
    }

    /// Removes a segment. Refuses (55006) while any process holds a pin. Returns the chunk ids
    /// whose fds the caller must release at the broker.
    pub fn drop_segment(&mut self, slot: u32) -> Result<Vec<u64>> {
        if self.migrating(slot) {
            let name = Self::seg_name(self.seg(slot)).to_string();
            return Err(uvm_err!(Code::ObjectInUse, "segment \"{name}\" is being migrated"));
        }
        let pins = self.seg(slot).pins.load(Ordering::Acquire);
        if pins > 0 {
            let name = Self::seg_name(self.seg(slot)).to_string();
            return Err(
                uvm_err!(Code::ObjectInUse, "segment \"{name}\" is in use").detail(format!("{pins} pin(s) are held on it."))
            );
        }
        let seg_id = self.seg(slot).id;
        let mut ids = Vec::new();
        for ci in 0..self.hdr().max_chunks {
            let c = self.chunk(ci);
            if c.state != CHUNK_FREE && c.segment_id == seg_id {
                // Pending chunks count too (since `reserve_chunk`).
                let (id, size, place) = (c.id, c.size, c.place());
                ids.push(id);
                self.account(place, -(size as i128));
                *self.chunk_mut(ci) = ChunkSlot::FREE;
            }
        }
        let s = self.seg_mut(slot);
        s.id = 0;
        s.name = [0; MAX_NAME_LEN + 1];
        s.nchunks = 0;
        s.migrations_waiting = 0;
        s.generation += 1;
        Ok(ids)
    }

    /// The segment's cumulative counters.
    pub fn segment_stats(&self, slot: u32) -> SegmentStats {
        self.seg(slot).stats.snapshot()
    }

    /// Counts a migration of `bytes` of the segment.
    pub fn count_migration(&self, slot: u32, bytes: u64) {
        self.seg(slot).stats.migrated(bytes);
    }

    /// The GpuJoin node's counters (atomics: any lock mode will do).
    pub fn node_counters(&self) -> &NodeCounters {
        &self.hdr().node
    }

    /// Zeroes every segment's counters and the node's (`uvm.stat_reset()`).
    pub fn reset_stats(&self) {
        for i in 0..self.hdr().max_segments {
            self.seg(i).stats.reset();
        }
        self.hdr().node.reset();
    }

    /// Ids of every chunk the registry knows (pending or live): the broker keeps exactly these.
    pub fn known_chunk_ids(&self) -> Vec<u64> {
        (0..self.hdr().max_chunks).map(|i| self.chunk(i)).filter(|c| c.state != CHUNK_FREE).map(|c| c.id).collect()
    }

    /// Claims a row of the progress table for a long operation of process `pid` (`None` when
    /// every row is taken: the operation runs unreported). Lock-free: any lock mode will do.
    pub fn start_progress(
        &self,
        pid: i32,
        kind: ProgressKind,
        phase: ProgressPhase,
        segment_id: u64,
        total: u64,
    ) -> Option<ProgressGuard> {
        let rows = &self.hdr().progress;
        // A free row, else one a dead process left (it exited without unwinding and without
        // the exit callback that frees its rows: see `detach_process`).
        let slot = rows.iter().find(|s| s.claim(pid, kind, phase, segment_id, total)).or_else(|| {
            rows.iter()
                .find(|s| s.snapshot().is_some_and(|p| !process_alive(p.pid)) && s.reclaim(pid, kind, phase, segment_id, total))
        })?;
        // SAFETY: the slot lies in the registry block, which stays mapped while the process
        // uses the registry (the contract of `from_raw`); `pid` just claimed it.
        Some(unsafe { ProgressGuard::new(slot, pid) })
    }

    /// The long operations in progress (rows of processes that are gone left out).
    pub fn progress(&self) -> Vec<Progress> {
        self.hdr().progress.iter().filter_map(ProgressSlot::snapshot).filter(|p| process_alive(p.pid)).collect()
    }
}

/// Whether process `pid` exists (signal 0: no signal is sent; EPERM means it exists).
fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for the process.
    pid > 0 && (unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

const FLAG_IN_ARENA: u32 = 1;
const FLAG_MIGRATING: u32 = 2;

#[cfg(test)]
mod tests;
