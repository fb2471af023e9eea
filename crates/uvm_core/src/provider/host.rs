//! The host provider: chunks are memfds, mapped `MAP_SHARED` into the segment's reservation.
//!
//! It has one tier, `host`. It runs anywhere Linux runs, which is what lets CI exercise the whole
//! design (registry, broker, fd passing, lazy attachment, growth, pins, crash-restart) without a
//! GPU. A memfd's pages are allocated on first touch and freed when its last fd is closed and its
//! last mapping unmapped.
//!
//! **Simulated GPUs.** `HostProvider::simulating(n)` (the `pg_uvm_share.simulated_devices`
//! setting) adds a device tier of `n` GPUs whose chunks are memfds too, each named after its
//! place (`pg_uvm_share device:1 chunk`, as `/proc/<pid>/fd` shows it). Placement, per-GPU
//! budgets, migration between GPUs and the service's routing then run in CI exactly as under
//! CUDA; only the bytes' home is the same host memory. It is for tests: nothing is faster.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::{
    adopt, make_inaccessible, map_none, tier_unavailable, unadopt, Capabilities, Provider, ProviderKind, Reservation, GRANULARITY,
};
use crate::error::{Code, Result, UvmError};
use crate::vocab::{Place, Tier, MAX_DEVICES};

/// See the module documentation. `HostProvider::default()` has no device tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostProvider {
    devices: u32,
}

impl HostProvider {
    /// A host provider with `devices` simulated GPUs (at most [`MAX_DEVICES`]).
    pub fn simulating(devices: u32) -> HostProvider {
        HostProvider { devices: devices.min(MAX_DEVICES) }
    }
}

/// A memfd's name: its place, so that a test (or a person reading `/proc/<pid>/fd`) can tell
/// where a chunk is from its fd alone.
fn memfd_name(place: Place) -> std::ffi::CString {
    std::ffi::CString::new(format!("pg_uvm_share {place} chunk")).expect("no NUL in a place's name")
}

/// A memfd of `size` bytes named `name` (as `/proc/<pid>/fd` shows it): a chunk of the host
/// provider, or of a `cpu` segment under any provider.
pub(crate) fn create_memfd(name: &std::ffi::CStr, size: u64) -> Result<OwnedFd> {
    // SAFETY: memfd_create with a NUL-terminated name that outlives the call; the returned fd is
    // owned below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(UvmError::last_os("memfd_create failed"));
    }
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
        return Err(UvmError::last_os(format!("could not size a {size}-byte chunk")));
    }
    Ok(fd)
}

/// Maps memfd `fd` as `[offset, offset + size)` of reservation `r`, readable and writable,
/// `MAP_SHARED | MAP_FIXED` (whatever reserved the range: this process's arena, a `PROT_NONE`
/// mapping, or a CUDA provider's `cuMemAddressReserve`, over which the H200 probe mapped memfds,
/// `bench/probes/host_tier_memfd.py`).
pub(crate) fn map_memfd(fd: BorrowedFd<'_>, r: &Reservation, offset: u64, size: u64) -> Result<()> {
    map_memfd_with(fd, r, offset, size, 0)
}

/// [`map_memfd`] with `extra` mmap flags (`MAP_POPULATE`: the CUDA provider's mappings for
/// copies, which it registers at once, 36 ms a GiB for populated pages against 416 ms for
/// fresh ones on the H200).
pub(crate) fn map_memfd_with(fd: BorrowedFd<'_>, r: &Reservation, offset: u64, size: u64, extra: libc::c_int) -> Result<()> {
    let addr = r.sub_range(offset, size)?;
    // A memfd shorter than the mapping would raise SIGBUS on access past its end.
    // SAFETY: all-zero is a valid `stat` (plain integers).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is a live descriptor borrowed for the call; `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(UvmError::last_os("could not stat a chunk"));
    }
    if (st.st_size as u64) < size {
        return Err(UvmError::new(Code::SystemError, format!("chunk of {} bytes cannot be mapped as {size} bytes", st.st_size)));
    }
    // SAFETY: `[addr, addr + size)` lies inside reservation `r` (checked by sub_range), which
    // this process owns, so MAP_FIXED replaces only our own pages there.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED | extra,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(UvmError::last_os(format!("could not map a {size}-byte chunk")));
    }
    Ok(())
}

/// Puts `[offset, offset + size)` of reservation `r` back to reserved, inaccessible address space
/// (ignored if the range is not inside `r`).
pub(crate) fn unmap_memfd(r: &Reservation, offset: u64, size: u64) {
    if let Ok(addr) = r.sub_range(offset, size) {
        // SAFETY: inside reservation `r`, which this process owns; the caller no longer uses the
        // chunk mapped there (the segment layer unmaps only chunks nobody pins).
        let _ = unsafe { make_inaccessible(addr, size) };
    }
}

impl Provider for HostProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Host
    }

    fn capabilities(&self) -> Capabilities {
        let mut details = vec![("chunk_backing".into(), "memfd".into())];
        if self.devices > 0 {
            details.push(("simulated_devices".into(), self.devices.to_string()));
        }
        let tiers = if self.devices > 0 { vec![Tier::Device, Tier::Host] } else { vec![Tier::Host] };
        Capabilities { tiers, granularity: GRANULARITY, gpu_kernels: false, details }
    }

    fn has_tier(&self, tier: Tier) -> bool {
        tier == Tier::Host || self.devices > 0
    }

    fn devices(&self) -> u32 {
        self.devices
    }

    fn reserve(&self, hint: u64, size: u64) -> Result<Reservation> {
        // SAFETY: without MAP_FIXED the kernel never replaces an existing mapping; the hint is
        // only a preference.
        let addr = unsafe { map_none(hint, size, 0) }
            .map_err(|e| UvmError::os(format!("could not reserve {size} bytes of address space"), e))?;
        Ok(Reservation { addr, size, in_arena: false })
    }

    unsafe fn reserve_in_arena(&self, addr: u64, size: u64) -> Result<Reservation> {
        // The range is already reserved (inherited from the postmaster, PROT_NONE): nothing to
        // map, only to make sure this process hands it out once.
        adopt(addr, size)?;
        Ok(Reservation { addr, size, in_arena: true })
    }

    fn release_reservation(&self, r: Reservation) {
        if r.in_arena {
            // SAFETY: the reservation owns its arena range and is given up here, so nothing
            // uses what is mapped in it any more.
            let _ = unsafe { make_inaccessible(r.addr, r.size) };
            unadopt(r.addr);
        } else {
            // SAFETY: the reservation was created by `reserve` and is consumed here, once.
            unsafe { libc::munmap(r.addr as *mut libc::c_void, r.size as usize) };
        }
    }

    fn create_chunk(&self, place: Place, size: u64) -> Result<OwnedFd> {
        match place {
            Place::Device(_) if self.devices == 0 => return Err(tier_unavailable(Tier::Device, ProviderKind::Host)),
            Place::Device(n) if n >= self.devices => return Err(super::no_such_device(place, self.devices)),
            _ => {}
        }
        create_memfd(&memfd_name(place), size)
    }

    fn map_chunk(&self, fd: BorrowedFd<'_>, tier: Tier, r: &Reservation, offset: u64, size: u64) -> Result<()> {
        if !self.has_tier(tier) {
            return Err(tier_unavailable(tier, ProviderKind::Host));
        }
        map_memfd(fd, r, offset, size)
    }

    fn unmap_chunk(&self, r: &Reservation, offset: u64, size: u64, _tier: Tier) {
        unmap_memfd(r, offset, size);
    }

    unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: the caller guarantees both ranges are mapped and disjoint.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::reserve_arena;
    use std::os::fd::AsFd;

    #[test]
    fn chunks_map_into_a_reservation_and_share_bytes() {
        let p = HostProvider::default();
        let r = p.reserve(0, 3 * GRANULARITY).unwrap();
        let a = p.create_chunk(Place::Host, GRANULARITY).unwrap();
        let b = p.create_chunk(Place::Host, 2 * GRANULARITY).unwrap();
        p.map_chunk(a.as_fd(), Tier::Host, &r, 0, GRANULARITY).unwrap();
        p.map_chunk(b.as_fd(), Tier::Host, &r, GRANULARITY, 2 * GRANULARITY).unwrap();
        // The segment is contiguous across the chunk boundary.
        let base = r.addr() as *mut u8;
        // SAFETY: the whole reservation is mapped read-write above.
        unsafe {
            std::ptr::write_bytes(base.add(GRANULARITY as usize - 4), 0xab, 8);
            assert_eq!(*base.add(GRANULARITY as usize + 3), 0xab);
        }
        // A second mapping of the same fd (as another process would have) sees the same bytes.
        let r2 = p.reserve(0, GRANULARITY).unwrap();
        p.map_chunk(b.as_fd(), Tier::Host, &r2, 0, GRANULARITY).unwrap();
        // SAFETY: mapped above.
        unsafe { assert_eq!(*(r2.addr() as *const u8).add(3), 0xab) };
        p.unmap_chunk(&r2, 0, GRANULARITY, Tier::Host);
        p.release_reservation(r2);
        p.unmap_chunk(&r, 0, 3 * GRANULARITY, Tier::Host);
        p.release_reservation(r);
    }

    #[test]
    fn mappings_stay_inside_their_reservation_and_their_chunk() {
        let p = HostProvider::default();
        let r = p.reserve(0, 2 * GRANULARITY).unwrap();
        let c = p.create_chunk(Place::Host, GRANULARITY).unwrap();
        let e = p.map_chunk(c.as_fd(), Tier::Host, &r, 2 * GRANULARITY, GRANULARITY).unwrap_err();
        assert_eq!(e.code, crate::error::Code::InvalidParameterValue);
        let e = p.map_chunk(c.as_fd(), Tier::Host, &r, u64::MAX, 2).unwrap_err();
        assert_eq!(e.code, crate::error::Code::InvalidParameterValue);
        // a chunk mapped larger than it is would raise SIGBUS past its end: refused
        let e = p.map_chunk(c.as_fd(), Tier::Host, &r, 0, 2 * GRANULARITY).unwrap_err();
        assert_eq!(e.code, crate::error::Code::SystemError);
        p.map_chunk(c.as_fd(), Tier::Host, &r, GRANULARITY, GRANULARITY).unwrap();
        // unmapping outside the reservation does nothing
        p.unmap_chunk(&r, 2 * GRANULARITY, GRANULARITY, Tier::Host);
        // SAFETY: mapped above.
        unsafe { *((r.addr() + GRANULARITY) as *mut u64) = 1 };
        p.release_reservation(r);
    }

    #[test]
    fn device_tier_is_refused() {
        let e = HostProvider::default().create_chunk(Place::Device(0), GRANULARITY).unwrap_err();
        assert_eq!(e.code, crate::error::Code::FeatureNotSupported);
    }

    /// Simulated GPUs: chunks on GPUs 0..n are memfds named after their place; GPU n is 22023.
    #[test]
    fn simulated_gpus_are_named_memfds() {
        let p = HostProvider::simulating(2);
        assert_eq!((p.devices(), p.has_tier(Tier::Device)), (2, true));
        let c = p.create_chunk(Place::Device(1), GRANULARITY).unwrap();
        let link = std::fs::read_link(format!("/proc/self/fd/{}", c.as_raw_fd())).unwrap();
        assert!(link.to_string_lossy().contains("pg_uvm_share device:1 chunk"), "{link:?}");
        let e = p.create_chunk(Place::Device(2), GRANULARITY).unwrap_err();
        assert_eq!(e.code, crate::error::Code::InvalidParameterValue);
        let r = p.reserve(0, GRANULARITY).unwrap();
        p.map_chunk(c.as_fd(), Tier::Device, &r, 0, GRANULARITY).unwrap();
        p.unmap_chunk(&r, 0, GRANULARITY, Tier::Device);
        p.release_reservation(r);
    }

    #[test]
    fn arena_is_aligned_and_usable_and_adopted_once() {
        let arena = reserve_arena(64 * GRANULARITY);
        assert_eq!(arena.base % GRANULARITY, 0);
        assert_eq!(arena.size, 64 * GRANULARITY);
        let p = HostProvider::default();
        // SAFETY: a range of the arena this test reserved, used by nothing else.
        let r = unsafe { p.reserve_in_arena(arena.base + 4 * GRANULARITY, 2 * GRANULARITY) }.unwrap();
        assert_eq!(r.addr(), arena.base + 4 * GRANULARITY);
        // a second reservation of part of it is refused while the first is held
        // SAFETY: as above (it is refused before anything is mapped).
        let e = unsafe { p.reserve_in_arena(arena.base + 5 * GRANULARITY, GRANULARITY) }.unwrap_err();
        assert_eq!(e.code, crate::error::Code::ObjectInUse);
        let c = p.create_chunk(Place::Host, GRANULARITY).unwrap();
        p.map_chunk(c.as_fd(), Tier::Host, &r, 0, GRANULARITY).unwrap();
        // SAFETY: mapped above.
        unsafe { *(r.addr() as *mut u64) = 7 };
        p.unmap_chunk(&r, 0, GRANULARITY, Tier::Host);
        p.release_reservation(r);
        // SAFETY: as above; the first reservation is released.
        let r = unsafe { p.reserve_in_arena(arena.base + 5 * GRANULARITY, GRANULARITY) }.unwrap();
        p.release_reservation(r);
        // SAFETY: the arena was reserved by this test.
        unsafe { libc::munmap(arena.base as *mut libc::c_void, arena.size as usize) };
    }
}
