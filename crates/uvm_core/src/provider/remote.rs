//! The provider of a client process in service mode: it maps the host tier where its chunks are
//! memfds, and never the device.
//!
//! In service mode the GPU service (`crate::service`) maps every chunk with the cluster's real
//! provider and runs every operation that needs the device. A backend or parallel worker still
//! keeps a segment manager: for looking segments up, holding pins and session pins (counts in
//! the registry), and for the memory it can reach without a GPU: host-tier chunks that are
//! memfds (the host provider's), which it maps `MAP_SHARED` at the segment's address as the
//! host provider does. Reads, writes, checksums and fills whose bytes all lie there run in the
//! calling process (`crate::exec::local::run_here`); CPU code and other extensions use them
//! through the C API's `base`. Device chunks are never mapped here
//! (their fds are taken from the broker and closed at once), so no client process loads libcuda
//! or touches GPU memory: `cpu_accessible` is false for the device tier (so `Pin::bytes`
//! refuses), `copy` is an error (so `Pin::read_into` refuses there), and chunks are never created
//! here (creation is the service's).
//!
//! The CUDA provider's host chunks are `HOST_NUMA` VMM allocations, which only a process with a
//! CUDA context can map: under it this provider maps only the chunks of `cpu` segments
//! (`TierPref::Cpu`), which are memfds under every provider (`Provider::map_memfd_chunk`). So
//! its reservations are real address space whatever the cluster's provider (its arena range,
//! or a `PROT_NONE` mapping). (Memfd host chunks that the
//! service registers with CUDA work on the H200, `bench/probes/host_tier_memfd.py`, but
//! registering 4 KiB pages made an 8 GiB migration to the host tier 20 times slower: see
//! `docs/ARCHITECTURE.md`, "The host tier in every process".)

use std::os::fd::{BorrowedFd, OwnedFd};

use super::host::HostProvider;
use super::{Capabilities, Provider, ProviderKind, Reservation, GRANULARITY};
use crate::error::{Code, Result, UvmError};
use crate::vocab::{Place, Tier};

/// See the module documentation. `kind` is the cluster's provider (for display).
pub struct RemoteProvider {
    pub kind: ProviderKind,
    /// How this process maps host-tier chunks, where they are memfds; `None`: it maps none
    /// (only `cpu` segments' chunks).
    host: Option<HostProvider>,
    /// How it reserves address space (the host provider's way, under every cluster provider).
    reserver: HostProvider,
}

impl RemoteProvider {
    /// The client provider of a cluster whose provider is `kind`.
    pub fn new(kind: ProviderKind) -> RemoteProvider {
        RemoteProvider { kind, host: (kind == ProviderKind::Host).then(HostProvider::default), reserver: HostProvider::default() }
    }

    /// The host provider that maps chunks of `tier` here, if any.
    fn mapper(&self, tier: Tier) -> Option<&HostProvider> {
        self.host.as_ref().filter(|_| tier == Tier::Host)
    }
}

fn only_the_service() -> UvmError {
    UvmError::new(Code::FeatureNotSupported, "chunks are created only by the GPU service in this cluster")
}

fn in_service() -> UvmError {
    UvmError::new(Code::FeatureNotSupported, "device memory is reached only through the GPU service in this cluster")
        .hint("pg_uvm_share.gpu_execution is service: this process maps no device chunk.")
}

impl Provider for RemoteProvider {
    fn kind(&self) -> ProviderKind {
        self.kind
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { tiers: vec![], granularity: GRANULARITY, gpu_kernels: false, details: vec![] }
    }

    fn has_tier(&self, _tier: Tier) -> bool {
        true
    }

    fn cpu_accessible(&self, tier: Tier) -> bool {
        self.mapper(tier).is_some()
    }

    fn reserve(&self, hint: u64, size: u64) -> Result<Reservation> {
        // Real address space even where no chunk of the cluster's provider is mapped into it:
        // a `cpu` segment's memfds are.
        self.reserver.reserve(hint, size)
    }

    unsafe fn reserve_in_arena(&self, addr: u64, size: u64) -> Result<Reservation> {
        // SAFETY: forwarded contract (the range lies in this process's arena).
        unsafe { self.reserver.reserve_in_arena(addr, size) }
    }

    fn release_reservation(&self, r: Reservation) {
        self.reserver.release_reservation(r)
    }

    fn create_chunk(&self, _place: Place, _size: u64) -> Result<OwnedFd> {
        Err(only_the_service())
    }

    fn create_memfd_chunk(&self, _size: u64) -> Result<OwnedFd> {
        Err(only_the_service())
    }

    fn map_chunk(&self, fd: BorrowedFd<'_>, tier: Tier, r: &Reservation, offset: u64, size: u64) -> Result<()> {
        match self.mapper(tier) {
            Some(h) => h.map_chunk(fd, tier, r, offset, size),
            None => r.sub_range(offset, size).map(|_| ()),
        }
    }

    fn unmap_chunk(&self, r: &Reservation, offset: u64, size: u64, tier: Tier) {
        if let Some(h) = self.mapper(tier) {
            h.unmap_chunk(r, offset, size, tier);
        }
    }

    unsafe fn copy(&self, _dst: *mut u8, _src: *const u8, _len: usize) -> Result<()> {
        Err(in_service())
    }
}
