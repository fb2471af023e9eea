//! The provider of a client process in service mode: it maps nothing.
//!
//! In service mode every operation on segment memory runs in the GPU service
//! (`crate::service`), which maps the chunks with the cluster's real provider. A backend or
//! parallel worker still keeps a segment manager, for what needs no memory: looking segments
//! up and holding session pins (`uvm.pin_segment`), which are counts in the registry. Its pins
//! then "map" through this provider, which takes the fds the broker hands out and maps none of
//! them (closing them at once), so that no client process loads libcuda or touches a chunk.
//!
//! No byte is reachable through such a pin: `cpu_accessible` is false for every tier (so
//! `Pin::bytes` refuses), `copy` is an error (so `Pin::read_into` refuses), and chunks are
//! never created here (creation is the service's).

use std::os::fd::{BorrowedFd, OwnedFd};

use super::{adopt, unadopt, Capabilities, Provider, ProviderKind, Reservation, GRANULARITY};
use crate::error::{Code, Result, UvmError};
use crate::vocab::{Place, Tier};

/// Maps nothing; see the module documentation. `kind` is the cluster's provider (for display).
pub struct RemoteProvider {
    pub kind: ProviderKind,
}

fn in_service() -> UvmError {
    UvmError::new(Code::FeatureNotSupported, "segment memory is reached only through the GPU service in this cluster")
        .hint("pg_uvm_share.gpu_execution is service: this process maps no chunk.")
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

    fn cpu_accessible(&self, _tier: Tier) -> bool {
        false
    }

    fn reserve(&self, hint: u64, size: u64) -> Result<Reservation> {
        // Nothing is mapped here, so the range is only a name for the attachment.
        Ok(Reservation { addr: hint, size, in_arena: false })
    }

    unsafe fn reserve_in_arena(&self, addr: u64, size: u64) -> Result<Reservation> {
        adopt(addr, size)?;
        Ok(Reservation { addr, size, in_arena: true })
    }

    fn release_reservation(&self, r: Reservation) {
        if r.in_arena {
            unadopt(r.addr);
        }
    }

    fn create_chunk(&self, _place: Place, _size: u64) -> Result<OwnedFd> {
        Err(in_service())
    }

    fn map_chunk(&self, _fd: BorrowedFd<'_>, _tier: Tier, r: &Reservation, offset: u64, size: u64) -> Result<()> {
        r.sub_range(offset, size).map(|_| ())
    }

    fn unmap_chunk(&self, _r: &Reservation, _offset: u64, _size: u64, _tier: Tier) {}

    unsafe fn copy(&self, _dst: *mut u8, _src: *const u8, _len: usize) -> Result<()> {
        Err(in_service())
    }
}
