//! Providers: where chunk memory comes from, and how a process maps it.
//!
//! # Design
//!
//! A provider turns "a chunk of N bytes in tier T" into a file descriptor that any process of the
//! cluster can map, and maps such an fd at a given address of a reserved range. It is the only
//! part of pg_uvm_share that knows whether memory is a memfd or a CUDA VMM allocation; the
//! registry, the broker and the segment layer deal in chunk ids, fds, offsets and tiers. It
//! imports nothing from the registry: the tiers, the arena and [`ProviderKind`] are words of
//! `crate::vocab`, which both layers speak.
//!
//! The operations are exactly those the segment layer needs:
//!
//! | operation | host provider (`host.rs`) | CUDA provider (`cuda.rs`) |
//! | --- | --- | --- |
//! | `reserve(hint, size)` | `mmap(PROT_NONE)` | `cuMemAddressReserve(hint)` |
//! | `reserve_in_arena(addr, size)` (unsafe) | inside the inherited arena: nothing to map | `cuMemAddressReserve(addr)` |
//! | `create_chunk(place, size)` | `memfd_create` + `ftruncate` | `cuMemCreate` on the place's GPU (or `HOST_NUMA`; the GPU service's host chunks: a memfd) + export POSIX fd |
//! | `map_chunk(fd, r, offset)` | `mmap(MAP_FIXED|MAP_SHARED)` over the reservation | import + `cuMemMap` + `cuMemSetAccess` (the service's memfd host chunks: `mmap`) |
//! | `unmap_chunk(r, offset)` | `mmap(PROT_NONE, MAP_FIXED)` back over it | `cuMemUnmap` |
//! | `register_for_kernels(r, offset)` | nothing | the GPU service's memfd host chunks: `cuMemHostRegister` (undone by `unmap_chunk`) |
//! | `release_reservation(r)` | `PROT_NONE` again (arena) or `munmap` | `cuMemAddressFree` |
//! | `copy(dst, src)` (unsafe) | `memcpy` | `cuMemcpy`, per chunk |
//! | `create_memfd_chunk`, `map_memfd_chunk`, `unmap_memfd_chunk` (a `cpu` segment's chunks) | as its own chunks | the same memfds, mapped `MAP_FIXED` over its reservation (no GPU mapping) |
//!
//! No safe function maps or unmaps at a raw address. Mapping and unmapping take a
//! [`Reservation`], which only a provider makes and which is neither `Copy` nor `Clone`, plus an
//! offset checked against its size: whoever holds one owns that range. The only way to a
//! reservation at a given address without the provider choosing it, `reserve_in_arena`, is
//! `unsafe` (the caller vouches the range is its own arena range), and it refuses a range that
//! overlaps one this process already adopted.
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
pub mod remote;

use std::os::fd::{BorrowedFd, OwnedFd};

use crate::error::{Code, Result, UvmError};
pub use crate::vocab::ProviderKind;
use crate::vocab::{Arena, Place, Tier};

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

/// A reserved address range in this process, owned by whoever holds this value.
///
/// Only a provider makes one (the fields are private, and it is neither `Copy` nor `Clone`), so
/// holding a `&Reservation` proves that the range is this process's to map chunks into: the
/// provider's `map_chunk` and `unmap_chunk` take one plus an offset, checked against its size,
/// never a raw address. `release_reservation` consumes it.
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    addr: u64,
    size: u64,
    /// The range lies in the inherited arena (not to be unmapped, only reset to PROT_NONE).
    in_arena: bool,
}

impl Reservation {
    pub fn addr(&self) -> u64 {
        self.addr
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn in_arena(&self) -> bool {
        self.in_arena
    }

    /// The address of `[offset, offset + size)` of the range, or 22023 if that is not inside it.
    pub fn sub_range(&self, offset: u64, size: u64) -> Result<u64> {
        match offset.checked_add(size) {
            Some(end) if end <= self.size => Ok(self.addr + offset),
            _ => Err(UvmError::new(
                Code::InvalidParameterValue,
                format!("range [{offset}, {offset} + {size}) is outside a reservation of {} bytes", self.size),
            )),
        }
    }
}

/// The arena sub-ranges this process has adopted (see [`Provider::reserve_in_arena`]): one
/// reservation per range, whatever the number of segment managers in the process.
static ADOPTED: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());

/// Records `[addr, addr + size)` as adopted; 55006 if part of it already is.
fn adopt(addr: u64, size: u64) -> Result<()> {
    let mut adopted = ADOPTED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(a, s)) = adopted.iter().find(|&&(a, s)| a < addr + size && addr < a + s) {
        return Err(UvmError::new(
            Code::ObjectInUse,
            format!("address range 0x{addr:x}+{size} overlaps range 0x{a:x}+{s} that this process still maps"),
        ));
    }
    adopted.push((addr, size));
    Ok(())
}

/// Forgets an adopted range (its reservation was released).
fn unadopt(addr: u64) {
    let mut adopted = ADOPTED.lock().unwrap_or_else(|p| p.into_inner());
    adopted.retain(|&(a, _)| a != addr);
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
/// `Send + Sync`: the GPU service makes host-pool pieces on a thread of their own
/// (`Segments::chunk_maker`).
pub trait Provider: Send + Sync {
    fn kind(&self) -> ProviderKind;
    fn capabilities(&self) -> Capabilities;
    /// Whether chunks can live in `tier` (cheap: asked on every chunk placement, whereas
    /// `capabilities` queries the device for `uvm.device_info()`).
    fn has_tier(&self, tier: Tier) -> bool;
    /// How many GPUs device chunks can be placed on, numbered from 0 (0: no device tier).
    fn devices(&self) -> u32 {
        u32::from(self.has_tier(Tier::Device))
    }
    /// Whether the CPU can read and write chunks of `tier` through their mapping (otherwise the
    /// segment layer copies with `copy`, one chunk at a time).
    fn cpu_accessible(&self, _tier: Tier) -> bool {
        true
    }
    /// Reserves `size` bytes of fresh address space, at `hint` if that is free (`hint == 0`:
    /// anywhere). Never touches an existing mapping.
    fn reserve(&self, hint: u64, size: u64) -> Result<Reservation>;
    /// Takes `[addr, addr + size)` of this process's inherited arena as a reservation. Fails
    /// (55006) if this process already holds a reservation of part of it.
    ///
    /// The default (for providers whose arena was given back to the system, as the CUDA
    /// provider's is before `cuInit`) is `reserve(addr, size)`: a fresh range there if free.
    ///
    /// # Safety
    /// `[addr, addr + size)` must lie inside this process's arena (the `PROT_NONE` range that
    /// [`reserve_arena`] made in the postmaster), which nothing but reservations uses: the host
    /// provider maps chunks there with `MAP_FIXED`, replacing whatever is there.
    unsafe fn reserve_in_arena(&self, addr: u64, size: u64) -> Result<Reservation> {
        self.reserve(addr, size)
    }
    /// Gives a reservation back. Unmap its chunks first: the host provider unmaps whatever is
    /// left, but the CUDA driver refuses to free a range with mappings (it then leaks).
    fn release_reservation(&self, r: Reservation);
    /// Allocates a chunk at `place` (the host tier, or GPU n's memory) and returns an fd another
    /// process can map. A GPU past `devices()` is refused (22023).
    fn create_chunk(&self, place: Place, size: u64) -> Result<OwnedFd>;
    /// Maps a chunk of `size` bytes at `offset` of reservation `r` (22023 if that is not inside
    /// it), readable and writable by this process, replacing what was mapped there.
    fn map_chunk(&self, fd: BorrowedFd<'_>, tier: Tier, r: &Reservation, offset: u64, size: u64) -> Result<()>;
    /// Maps a chunk only for the provider's own `copy` (a migration's temporary mapping): the
    /// CUDA provider skips CPU access there, which would cost a page-table walk of the whole
    /// chunk (about 250 ms for 8 GiB of host memory, measured) for a copy done by DMA.
    fn map_chunk_for_copy(&self, fd: BorrowedFd<'_>, tier: Tier, r: &Reservation, offset: u64, size: u64) -> Result<()> {
        self.map_chunk(fd, tier, r, offset, size)
    }
    /// Whether a chunk of `tier` that `map_chunk` mapped needs [`Provider::register_for_kernels`]
    /// before a kernel may touch it (the GPU service's memfd host chunks under CUDA: mapping them
    /// is cheap, registering them is not, so it waits for the first kernel).
    fn needs_kernel_registration(&self, _tier: Tier) -> bool {
        false
    }
    /// Makes the chunk mapped at `[offset, offset + size)` of `r` readable and writable by
    /// kernels at that address (CUDA: `cuMemHostRegister`); a no-op where it is already, and for
    /// chunks that need nothing. Undone by `unmap_chunk`.
    fn register_for_kernels(&self, _r: &Reservation, _offset: u64, _size: u64, _tier: Tier) -> Result<()> {
        Ok(())
    }
    /// Unmaps the chunk at `[offset, offset + size)` of `r`, leaving its addresses reserved
    /// (ignored if the range is not inside `r`).
    fn unmap_chunk(&self, r: &Reservation, offset: u64, size: u64, tier: Tier);
    /// Creates a chunk of a `cpu` segment (`TierPref::Cpu`): a memfd under every provider, so
    /// that every process maps it without CUDA. Not the provider's own memory: it goes through
    /// the provider only so that a provider that creates nothing (`remote.rs`) can say so.
    fn create_memfd_chunk(&self, size: u64) -> Result<OwnedFd> {
        host::create_memfd(c"pg_uvm_share cpu chunk", size)
    }
    /// Maps a `cpu` segment's memfd chunk at `[offset, offset + size)` of `r`, for the CPU alone
    /// (no GPU mapping, no CUDA registration), in every provider's reservations.
    fn map_memfd_chunk(&self, fd: BorrowedFd<'_>, r: &Reservation, offset: u64, size: u64) -> Result<()> {
        host::map_memfd(fd, r, offset, size)
    }
    /// Unmaps what `map_memfd_chunk` mapped, leaving the addresses reserved.
    fn unmap_memfd_chunk(&self, r: &Reservation, offset: u64, size: u64) {
        host::unmap_memfd(r, offset, size)
    }
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
///
/// # Safety
/// The caller must own the range (a reservation of its own, or its arena sub-range), and
/// nothing may use memory mapped there any more.
pub(crate) unsafe fn make_inaccessible(addr: u64, size: u64) -> Result<()> {
    // SAFETY: the caller owns the range and vouches that nobody uses what is mapped there.
    unsafe { map_none(addr, size, libc::MAP_FIXED) }
        .map(|_| ())
        .map_err(|e| UvmError::os("could not reset reserved address range", e))
}

/// Error for a GPU this provider does not have.
pub fn no_such_device(place: Place, devices: u32) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, format!("there is no {place}: the provider has {devices} GPU(s)"))
}

/// Error for a tier this provider does not have.
pub fn tier_unavailable(tier: Tier, kind: ProviderKind) -> UvmError {
    UvmError::new(
        Code::FeatureNotSupported,
        format!("tier \"{}\" is not available with provider \"{}\"", tier.name(), kind.name()),
    )
    .hint("Use tier \"auto\" or \"host\", or run with pg_uvm_share.provider = cuda on a machine with a GPU.")
}
