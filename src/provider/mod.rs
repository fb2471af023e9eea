//! Providers: where chunk memory comes from, and how a process maps it.
//!
//! # Design
//!
//! A provider turns "a chunk of N bytes in tier T" into a file descriptor that any process of the
//! cluster can map, and maps such an fd at a given address of a reserved range. It is the only
//! part of pg_uvm_share that knows whether memory is a memfd or a CUDA VMM allocation; the
//! registry, the broker and the segment layer deal in chunk ids, fds, offsets and tiers.
//!
//! The operations are exactly those the segment layer needs:
//!
//! | operation | host provider (`host.rs`) | CUDA provider (`cuda.rs`) |
//! | --- | --- | --- |
//! | `reserve(hint, size)` | inside the inherited arena: nothing to do; else `mmap(PROT_NONE)` | `cuMemAddressReserve(hint)` |
//! | `create_chunk(tier, size)` | `memfd_create` + `ftruncate` | `cuMemCreate` + export POSIX fd |
//! | `map_chunk(fd, addr)` | `mmap(MAP_FIXED|MAP_SHARED)` over the reservation | import + `cuMemMap` + `cuMemSetAccess` |
//! | `unmap_chunk(addr)` | `mmap(PROT_NONE, MAP_FIXED)` back over it | `cuMemUnmap` |
//! | `release_reservation` | `PROT_NONE` again (arena) or `munmap` | `cuMemAddressFree` |
//! | `copy(dst, src)` | `memcpy` | `cuMemcpy`, per chunk |
//!
//! Releasing a chunk's memory is closing the last fd and unmapping the last mapping; the broker
//! holds the fd that keeps it alive, so "release" is the broker's `RELEASE` request.
//!
//! # The arena
//!
//! In the postmaster, `_PG_init` reserves one large `PROT_NONE` range (no memory, no swap: only
//! address space). Every backend, parallel worker and background worker is forked from the
//! postmaster and so inherits the very same range, and the registry hands each segment a disjoint
//! sub-range of it. Mapping chunks with `MAP_FIXED` inside one's own copy of the arena therefore
//! puts a segment at the same address in every process, with no race against other mappings.
//! Outside the arena (it could not be reserved, or is full) the registry's base address is a
//! hint, and a process that does not get it records `same_address = false`; offsets stay valid.

pub mod cuda;
pub mod host;

use std::os::fd::{BorrowedFd, OwnedFd};

use crate::error::{Code, Result, UvmError};
use crate::registry::{Arena, Tier};

/// Mapping granularity of every provider: CUDA VMM's (2 MiB) is also used for memfds so that a
/// segment's layout does not depend on the provider.
pub const GRANULARITY: u64 = 2 << 20;

/// Alignment of a segment's address range in the arena: 1 GiB for segments of 1 GiB or more
/// (so the GPU can use its largest page-table entries over them), the granularity otherwise.
pub fn segment_alignment(reserve: u64) -> u64 {
    if reserve >= 1 << 30 {
        1 << 30
    } else {
        GRANULARITY
    }
}

/// Which provider backs this process's chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    Host,
    Cuda,
}

impl ProviderKind {
    /// The code recorded in the registry (never 0).
    pub fn code(self) -> u32 {
        match self {
            ProviderKind::Host => 1,
            ProviderKind::Cuda => 2,
        }
    }
    pub fn from_code(c: u32) -> Option<ProviderKind> {
        match c {
            1 => Some(ProviderKind::Host),
            2 => Some(ProviderKind::Cuda),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Host => "host",
            ProviderKind::Cuda => "cuda",
        }
    }
}

/// A reserved address range in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub addr: u64,
    pub size: u64,
    /// The range lies in the inherited arena (not to be unmapped, only reset to PROT_NONE).
    pub in_arena: bool,
}

/// What `uvm.device_info()` reports about a provider.
#[derive(Clone, Debug, Default)]
pub struct Capabilities {
    pub tiers: Vec<Tier>,
    pub granularity: u64,
    pub gpu_kernels: bool,
    /// Name/value pairs particular to the provider (GPU name, driver, memory, ...).
    pub details: Vec<(String, String)>,
}

/// The seam between the segment layer and the memory behind it. See the module documentation.
pub trait Provider {
    fn kind(&self) -> ProviderKind;
    fn capabilities(&self) -> Capabilities;
    /// Whether chunks can live in `tier` (cheap: asked on every chunk placement, whereas
    /// `capabilities` queries the device for `uvm.device_info()`).
    fn has_tier(&self, tier: Tier) -> bool;
    /// Whether the CPU can read and write chunks of `tier` through their mapping (otherwise the
    /// segment layer copies with `copy`, one chunk at a time).
    fn cpu_accessible(&self, _tier: Tier) -> bool {
        true
    }
    /// Reserves `size` bytes of address space, at `hint` if possible (`hint == 0`: anywhere).
    fn reserve(&self, hint: u64, size: u64, in_arena: bool) -> Result<Reservation>;
    /// Gives a reservation back; every chunk in it must be unmapped first.
    fn release_reservation(&self, r: &Reservation);
    /// Allocates a chunk and returns an fd another process can map.
    fn create_chunk(&self, tier: Tier, size: u64) -> Result<OwnedFd>;
    /// Maps a chunk at `addr` (inside a reservation), readable and writable by this process.
    fn map_chunk(&self, fd: BorrowedFd<'_>, tier: Tier, addr: u64, size: u64) -> Result<()>;
    /// Maps a chunk only for the provider's own `copy` (a migration's temporary mapping): the
    /// CUDA provider skips CPU access there, which would cost a page-table walk of the whole
    /// chunk (about 250 ms for 8 GiB of host memory, measured) for a copy done by DMA.
    fn map_chunk_for_copy(&self, fd: BorrowedFd<'_>, tier: Tier, addr: u64, size: u64) -> Result<()> {
        self.map_chunk(fd, tier, addr, size)
    }
    /// Unmaps a chunk, leaving its addresses reserved.
    fn unmap_chunk(&self, addr: u64, size: u64, tier: Tier);
    /// Copies between mapped chunks (or between a chunk and private memory).
    ///
    /// # Safety
    /// Both ranges must be mapped for `len` bytes and not overlap.
    unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) -> Result<()>;
}

/// Where the postmaster asks for the arena: low in the address space, away from the libraries,
/// the heap and the CUDA driver's own mappings (the CUDA provider was measured to get its
/// reservations at addresses like this one).
pub const ARENA_HINT: u64 = 0x50_0000_0000;

/// Reserves the arena in the postmaster, at `ARENA_HINT` if that range is free. On failure the
/// arena is empty and segments fall back on address hints.
pub fn reserve_arena(size: u64) -> Arena {
    let size = size / GRANULARITY * GRANULARITY;
    if size == 0 {
        return Arena::default();
    }
    // Over-reserve by one granule so that the start can be aligned.
    let len = size + GRANULARITY;
    // SAFETY: without MAP_FIXED the address is a hint: no existing mapping is touched.
    let Ok(start) = (unsafe { map_none(ARENA_HINT, len, 0) }) else { return Arena::default() };
    let p = start as *mut libc::c_void;
    let aligned = start.div_ceil(GRANULARITY) * GRANULARITY;
    // SAFETY: both trims lie inside the mapping just created and nothing else uses them.
    unsafe {
        if aligned > start {
            libc::munmap(p, (aligned - start) as usize);
        }
        let tail = (start + len) - (aligned + size);
        if tail > 0 {
            libc::munmap((aligned + size) as *mut libc::c_void, tail as usize);
        }
    }
    Arena { base: aligned, size }
}

/// Maps `size` bytes of reserved, inaccessible address space (PROT_NONE, no memory, no swap)
/// at `addr` (with `extra_flags` = MAP_FIXED: exactly there, replacing what was mapped; with 0:
/// there if free, else where the kernel likes). Returns the address.
///
/// # Safety
/// With MAP_FIXED the caller must own `[addr, addr + size)`: whatever was mapped there is gone.
pub(crate) unsafe fn map_none(addr: u64, size: u64, extra_flags: libc::c_int) -> std::io::Result<u64> {
    // SAFETY: an anonymous PROT_NONE mapping; the caller vouches for MAP_FIXED.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            size as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | extra_flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(p as u64)
    }
}

/// Resets `[addr, addr + size)` to reserved, inaccessible address space.
pub(crate) fn make_inaccessible(addr: u64, size: u64) -> Result<()> {
    // SAFETY: the caller owns this range (a reservation of its own or its arena sub-range).
    unsafe { map_none(addr, size, libc::MAP_FIXED) }
        .map(|_| ())
        .map_err(|e| UvmError::os("could not reset reserved address range", e))
}

/// Error for a tier this provider does not have.
pub fn tier_unavailable(tier: Tier, kind: ProviderKind) -> UvmError {
    UvmError::new(
        Code::FeatureNotSupported,
        format!("tier \"{}\" is not available with provider \"{}\"", tier.name(), kind.name()),
    )
    .hint("Use tier \"auto\" or \"host\", or run with pg_uvm_share.provider = cuda on a machine with a GPU.")
}
