//! The provider of a client process in service mode: it maps the host tier, whose chunks are
//! memfds under every provider in service mode, and never the device.
//!
//! In service mode the GPU service (`crate::service`) maps every chunk with the cluster's real
//! provider and runs every operation that needs the device. A backend or parallel worker still
//! keeps a segment manager: for looking segments up, holding pins and session pins (counts in
//! the registry), and for the memory it can reach without a GPU: the host tier, whose chunks are
//! memfds (the host provider's; under CUDA the GPU service's, which it registers with CUDA
//! itself, `cuda.rs`), mapped `MAP_SHARED` at the segment's address as the host provider maps
//! them. Reads, writes, checksums and fills whose bytes all lie there run in the calling process
//! (`crate::exec::local::run_here`); CPU code and other extensions use them through the C API's
//! `base`. Device chunks are never mapped here (their fds are taken from the broker and closed
//! at once), so no client process loads libcuda or touches GPU memory: `cpu_accessible` is false
//! for the device tier (so `Pin::bytes` refuses), `copy` is an error (so `Pin::read_into`
//! refuses there), and chunks are never created here (creation is the service's). Its
//! reservations are real address space (its arena range, or a `PROT_NONE` mapping), whatever
//! the cluster's provider.

use std::os::fd::{BorrowedFd, OwnedFd};

use super::host::HostProvider;
use super::{Capabilities, Provider, ProviderKind, Reservation, GRANULARITY};
use crate::error::{Code, Result, UvmError};
use crate::vocab::{Place, Tier};

/// See the module documentation. `kind` is the cluster's provider (for display).
pub struct RemoteProvider {
    pub kind: ProviderKind,
    /// How this process maps host-tier chunks and reserves address space: the host provider's
    /// way, under every cluster provider.
    host: HostProvider,
}

impl RemoteProvider {
    /// The client provider of a cluster whose provider is `kind`.
    pub fn new(kind: ProviderKind) -> RemoteProvider {
        RemoteProvider { kind, host: HostProvider::default() }
    }

    /// The host provider that maps chunks of `tier` here, if any (the host tier's).
    fn mapper(&self, tier: Tier) -> Option<&HostProvider> {
        (tier == Tier::Host).then_some(&self.host)
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
        // Real address space: host-tier and `cpu` segments' memfds are mapped into it.
        self.host.reserve(hint, size)
    }

    unsafe fn reserve_in_arena(&self, addr: u64, size: u64) -> Result<Reservation> {
        // SAFETY: forwarded contract (the range lies in this process's arena).
        unsafe { self.host.reserve_in_arena(addr, size) }
    }

    fn release_reservation(&self, r: Reservation) {
        self.host.release_reservation(r)
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
