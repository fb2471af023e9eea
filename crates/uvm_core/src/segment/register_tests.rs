//! Host chunks that need registering before a kernel reads them (the GPU service's memfd host
//! chunks under CUDA, `Provider::needs_kernel_registration`), as `tests.rs` runs the rest of the
//! segment system: a provider that records its registrations, and when the segment layer makes
//! and drops them.

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use super::tests::{limits, ok, TestEnv, World};
use super::*;
use crate::provider::host::HostProvider;
use crate::provider::Reservation;
use crate::registry::Arena;

const MIB: u64 = 1 << 20;

/// Live registrations (address, size), and how many were made in all.
type Registrations = Arc<std::sync::Mutex<(Vec<(u64, u64)>, u32)>>;

/// The host provider with one simulated GPU whose host chunks, like the GPU service's memfd
/// host chunks under CUDA, need registering before a kernel touches them: it records which
/// addresses are registered, and fails a test that registers a range twice or unmaps one
/// without its registration going first.
struct Registering {
    inner: HostProvider,
    live: Registrations,
}

impl Provider for Registering {
    fn kind(&self) -> crate::provider::ProviderKind {
        self.inner.kind()
    }
    fn capabilities(&self) -> crate::provider::Capabilities {
        self.inner.capabilities()
    }
    fn has_tier(&self, tier: Tier) -> bool {
        self.inner.has_tier(tier)
    }
    fn devices(&self) -> u32 {
        self.inner.devices()
    }
    fn reserve(&self, hint: u64, size: u64) -> Result<Reservation> {
        self.inner.reserve(hint, size)
    }
    fn release_reservation(&self, r: Reservation) {
        assert!(
            self.live.lock().unwrap().0.iter().all(|&(a, _)| a < r.addr() || a >= r.addr() + r.size()),
            "a reservation released with registrations in it"
        );
        self.inner.release_reservation(r)
    }
    fn create_chunk(&self, place: Place, size: u64) -> Result<std::os::fd::OwnedFd> {
        self.inner.create_chunk(place, size)
    }
    fn map_chunk(&self, fd: BorrowedFd<'_>, tier: Tier, r: &Reservation, offset: u64, size: u64) -> Result<()> {
        self.inner.map_chunk(fd, tier, r, offset, size)
    }
    fn needs_kernel_registration(&self, tier: Tier) -> bool {
        tier == Tier::Host
    }
    fn register_for_kernels(&self, r: &Reservation, offset: u64, size: u64, tier: Tier) -> Result<()> {
        assert_eq!(tier, Tier::Host, "only host chunks are registered");
        let addr = r.sub_range(offset, size)?;
        let mut live = self.live.lock().unwrap();
        assert!(!live.0.iter().any(|&(a, _)| a == addr), "0x{addr:x} registered twice");
        live.0.push((addr, size));
        live.1 += 1;
        Ok(())
    }
    fn unmap_chunk(&self, r: &Reservation, offset: u64, size: u64, tier: Tier) {
        if let Ok(addr) = r.sub_range(offset, size) {
            self.live.lock().unwrap().0.retain(|&(a, _)| a != addr);
        }
        self.inner.unmap_chunk(r, offset, size, tier)
    }
    unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.inner.copy(dst, src, len) }
    }
}

#[test]
fn host_chunks_are_registered_for_the_first_kernel_and_unregistered_with_their_mapping() {
    let world = World::new("register", Arena::default());
    let live: Registrations = Arc::default();
    let provider = Registering { inner: HostProvider::simulating(1), live: Arc::clone(&live) };
    let mut a = Segments::new(TestEnv::new(&world, 1), Box::new(provider), limits());
    let count = || live.lock().unwrap().1;
    let registered = || live.lock().unwrap().0.len();
    a.create("r", 3 * MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    a.grow("r", 7 * MIB as i64, ok).unwrap();
    {
        let mut p = a.pin("r", ok).unwrap();
        // The CPU needs nothing registered.
        p.bytes_mut(0, 7 * MIB as i64).unwrap().fill(3);
        assert_eq!((count(), registered()), (0, 0), "mapping and CPU access register nothing");
        // A kernel's address registers every host chunk, even those past the range asked for.
        p.addr(0, 8).unwrap();
        assert_eq!((count(), registered()), (2, 2));
        p.addr(5 * MIB as i64, 8).unwrap();
        assert_eq!(count(), 2, "a chunk is registered once per mapping");
    }
    // Another pin of the same mapping: nothing more.
    a.pin("r", ok).unwrap().addr(0, 1).unwrap();
    assert_eq!(count(), 2);
    // A chunk that moves to the device loses its registration with its mapping; its
    // replacement needs none. Back on the host tier, the new chunk is registered at the next
    // kernel address, not by the migration.
    a.prefetch("r", 5 * MIB as i64, MIB as i64, TierPref::Device, ok).unwrap();
    a.pin("r", ok).unwrap().addr(0, 1).unwrap();
    assert_eq!((count(), registered()), (2, 1), "the moved chunk's registration went with it");
    a.prefetch("r", 0, 7 * MIB as i64, TierPref::Host, ok).unwrap();
    assert_eq!(count(), 2, "a migration registers nothing at the segment's address");
    let p = a.pin("r", ok).unwrap();
    assert_eq!(registered(), 1, "the remap dropped nothing it should keep");
    p.addr(0, 1).unwrap();
    assert_eq!((count(), registered()), (3, 2));
    assert_eq!(p.bytes(0, 7 * MIB as i64).unwrap().iter().filter(|&&b| b != 3).count(), 0, "the bytes moved intact");
    drop(p);
    // A `cpu` segment's chunks are never registered (no kernel is given their address).
    a.create("c", 2 * MIB as i64, None, TierPref::Cpu, 1, 0).unwrap();
    assert!(a.pin("c", ok).unwrap().addr(0, 1).is_err());
    assert_eq!(count(), 3);
    // Dropping the segment unregisters what was left before its memory goes.
    a.drop_segment("r", ok).unwrap();
    a.drop_segment("c", ok).unwrap();
    assert_eq!(registered(), 0, "registrations left after the drop");
    drop(a);
    assert_eq!(world.finish(), 0);
}
