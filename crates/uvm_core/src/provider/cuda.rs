//! The CUDA provider: chunks are CUDA VMM allocations on the GPU (`device` tier), and in the
//! `host` tier either pinned host memory on the GPU's NUMA node (`CU_MEM_LOCATION_TYPE_HOST_NUMA`
//! VMM allocations: process mode) or memfds registered with CUDA (the GPU service's), each
//! exported as a POSIX fd for the broker to keep.
//!
//! Every process maps device and `HOST_NUMA` chunks into a `cuMemAddressReserve`d range with
//! `cuMemMap` and grants access with `cuMemSetAccess`: to the GPU always, and to the CPU for
//! host chunks, so the CPU reads and writes host chunks through the same address as the
//! kernels. Device chunks are not CPU-addressable on this platform (no ATS): the segment layer
//! copies to and from them with `cuMemcpy`, one chunk at a time (driver copies cannot cross
//! separately mapped chunks).
//!
//! **The GPU service's host tier is memfds** ([`CudaProvider::with_memfd_host`]; issue 25,
//! point 1): a `HOST_NUMA` allocation can be mapped only by a process with a CUDA context, and in
//! service mode the backends have none, yet they must share the host tier by address. So there a
//! host chunk is a memfd, which every process maps `MAP_SHARED | MAP_FIXED` at the segment's
//! address (the client processes through `remote.rs`), and which the service alone registers
//! with CUDA (`cuMemHostRegister`, device pointer == host pointer) where kernels or copies need
//! it:
//!
//! - a chunk mapped for copies (`map_chunk_for_copy`: the host pool's pieces, kept mapped by the
//!   service, and a migration's temporary mappings) is registered at once, on whichever thread
//!   maps it (the pool's pieces on the thread that makes them, off every request's path);
//! - a chunk mapped at its segment's address (`map_chunk`) is only mapped, for the CPU; the
//!   segment layer registers it when a kernel first asks for an address in it
//!   (`register_for_kernels`, from `Pin::addr`), so a migration to the host tier publishes its
//!   pieces without registering anything on its path. The same pages may be registered at two
//!   addresses at once (the pool's and the segment's), each valid alone (H200 probe,
//!   `bench/probes/host_tier_memfd.py`).
//!
//! The registrations are owned here ([`HostRegistration`], by address) and go with the
//! mapping's `unmap_chunk`, before the pages are unmapped. A kernel must never touch a mapping
//! that is not registered (it loses the context with `CUDA_ERROR_ILLEGAL_ADDRESS`; no pageable
//! memory access here): `Pin::addr`, the one way to a kernel's address, registers first.
//!
//! Reservations: the driver honours a `cuMemAddressReserve` hint only in address space that was
//! free when `cuInit` ran (measured on the H200), so a CUDA process releases its inherited
//! `PROT_NONE` arena just before `cuInit` (`gpu::set_arena`) and then reserves each segment at
//! its arena address. The result is checked: if the driver puts a reservation elsewhere, the
//! segment is used there (`same_address` false; offsets stay valid).

use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use cudarc::driver::sys::{
    self, CUdeviceptr, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, CUresult,
};

use super::{host, Capabilities, Provider, ProviderKind, Reservation, GRANULARITY};
use crate::error::{Code, Result, UvmError};
use crate::gpu::handles::HostRegistration;
use crate::gpu::{self, check, Gpu};
use crate::vocab::{Place, Tier};

pub struct CudaProvider {
    gpu: &'static Gpu,
    /// Host chunks are memfds registered with CUDA here (the GPU service), not `HOST_NUMA`
    /// allocations: see the module documentation.
    memfd_host: bool,
    /// This process's registrations of memfd host chunks, by address; each goes with the
    /// unmapping of its range.
    registered: Mutex<HashMap<u64, HostRegistration>>,
}

impl CudaProvider {
    /// The CUDA provider of this process (initialises CUDA on first call).
    pub fn new() -> Result<CudaProvider> {
        let gpu = gpu::gpu()?;
        if gpu.info.driver_version < gpu::HOST_NUMA_DRIVER {
            return Err(UvmError::new(
                Code::FeatureNotSupported,
                format!(
                    "the {} driver predates shareable host-NUMA memory ({}), which the CUDA provider's host tier is made of",
                    gpu::driver_name(gpu.info.driver_version),
                    gpu::driver_name(gpu::HOST_NUMA_DRIVER)
                ),
            )
            .hint("Upgrade the driver to CUDA 12.2 or later; meanwhile the host provider runs (no GPU kernels)."));
        }
        if !gpu.info.host_numa_vmm {
            return Err(UvmError::new(
                Code::FeatureNotSupported,
                format!("{} cannot allocate shareable host memory (HOST_NUMA VMM)", gpu.info.name),
            ));
        }
        Ok(CudaProvider { gpu, memfd_host: false, registered: Mutex::new(HashMap::new()) })
    }

    /// The GPU service's provider: host chunks are memfds that every process of the cluster
    /// maps, registered with CUDA here (see the module documentation).
    pub fn with_memfd_host(mut self) -> CudaProvider {
        self.memfd_host = true;
        self
    }

    /// Whether chunks of `tier` are memfds here.
    fn memfd(&self, tier: Tier) -> bool {
        self.memfd_host && tier == Tier::Host
    }

    /// Registers `[offset, offset + size)` of `r` (a memfd mapped there) with CUDA, unless it is.
    fn register(&self, r: &Reservation, offset: u64, size: u64) -> Result<()> {
        let addr = r.sub_range(offset, size)?;
        let lock = || self.registered.lock().unwrap_or_else(|p| p.into_inner());
        if lock().contains_key(&addr) {
            return Ok(());
        }
        // (Not under the lock: registering takes tens of milliseconds, and the pool's thread
        // registers its pieces while the main thread registers segments' chunks. No other
        // caller registers this address meanwhile: it lies in `r`, which the caller owns.)
        // SAFETY: `[addr, addr + size)` lies in reservation `r` (checked), where the caller
        // mapped a memfd; the registration is dropped by `unmap_chunk` before that unmaps it.
        let reg = unsafe { gpu::register_at(addr, size as usize) }?;
        lock().insert(addr, reg);
        Ok(())
    }

    /// Drops the registration at `addr`, if any (before its pages are unmapped).
    fn unregister(&self, addr: u64) {
        let reg = self.registered.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr);
        if reg.is_some() {
            // The context current on this thread for `cuMemHostUnregister` (no-op where it is).
            let _ = gpu::gpu();
        }
        drop(reg);
    }

    fn location(&self, place: Place) -> CUmemLocation {
        match place {
            Place::Device(n) => {
                let dev = self.gpu.placement.get(n as usize).copied().unwrap_or(self.gpu.device);
                CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: dev }
            }
            Place::Host => {
                CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, id: self.gpu.info.host_numa_id.max(0) }
            }
        }
    }

    fn reserve_at(&self, hint: u64, size: u64) -> Result<u64> {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; `hint` is only a preference; flags must be 0.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut ptr, size as usize, GRANULARITY as usize, hint, 0)
        })?;
        Ok(ptr)
    }
}

impl Provider for CudaProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Cuda
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            tiers: vec![Tier::Device, Tier::Host],
            granularity: GRANULARITY,
            gpu_kernels: self.gpu.info.nvrtc.is_some(),
            details: {
                let mut d = self.gpu.describe();
                let host = if self.memfd_host { "memfd, registered with CUDA by the GPU service" } else { "HOST_NUMA VMM" };
                d.push(("host_tier_backing".into(), host.into()));
                d
            },
        }
    }

    fn has_tier(&self, _tier: Tier) -> bool {
        true
    }

    fn devices(&self) -> u32 {
        // Device 0, and the peers `pg_uvm_share.cuda_devices` allows (`gpu::placement_devices`).
        self.gpu.placement.len() as u32
    }

    fn cpu_accessible(&self, tier: Tier) -> bool {
        tier == Tier::Host
    }

    fn reserve(&self, hint: u64, size: u64) -> Result<Reservation> {
        // The arena was unmapped before cuInit (gpu::set_arena), so a segment's range in it is
        // free address space that the driver gives back at exactly that address (the default
        // `reserve_in_arena` comes here). If somebody else has the range, the driver picks
        // another address: the segment layer records same_address = false, and offsets stay
        // valid. The driver never hands out a range twice.
        let p = self.reserve_at(hint, size)?;
        Ok(Reservation { addr: p, size, in_arena: false })
    }

    fn release_reservation(&self, r: Reservation) {
        // SAFETY: a whole reservation of ours, consumed here. The segment layer unmaps every
        // chunk first (the driver refuses to free a range with mappings: the range then leaks,
        // which is safe). In a CUDA process the arena stays unmapped, see gpu::set_arena.
        unsafe { sys::cuMemAddressFree(r.addr, r.size as usize) };
    }

    fn create_chunk(&self, place: Place, size: u64) -> Result<OwnedFd> {
        if place.device() >= self.devices() {
            return Err(super::no_such_device(place, self.devices()));
        }
        // The context current on this thread too (the GPU service makes pool pieces on a
        // thread of their own, then reserves address space and registers them there).
        gpu::gpu()?;
        if self.memfd(place.tier()) {
            return host::create_memfd(c"pg_uvm_share host chunk", size);
        }
        let tier = place.tier();
        // SAFETY: all-zero is a valid CUmemAllocationProp; the fields that matter are set below.
        let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location = self.location(place);
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and prop; the handle is owned right away.
        check(&format!("cuMemCreate ({} bytes, {})", size, tier.name()), unsafe {
            sys::cuMemCreate(&mut handle, size as usize, &prop, 0)
        })?;
        let handle = Allocation(handle);
        let mut fd: libc::c_int = -1;
        // SAFETY: valid out-pointer and a live handle.
        let r = unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut libc::c_int as *mut c_void,
                handle.0,
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        };
        // The exported fd, not the handle, keeps the memory alive.
        let released = handle.release();
        check("cuMemExportToShareableHandle", r)?;
        // SAFETY: the fd the driver just exported for us, owned right away.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        released?;
        Ok(fd)
    }

    fn map_chunk(&self, fd: BorrowedFd<'_>, tier: Tier, r: &Reservation, offset: u64, size: u64) -> Result<()> {
        if self.memfd(tier) {
            // For the CPU; registered when a kernel first needs it (`register_for_kernels`).
            return host::map_memfd(fd, r, offset, size);
        }
        self.map(fd, tier, r.sub_range(offset, size)?, size, tier == Tier::Host)
    }

    fn map_chunk_for_copy(&self, fd: BorrowedFd<'_>, tier: Tier, r: &Reservation, offset: u64, size: u64) -> Result<()> {
        if self.memfd(tier) {
            // Copies by DMA need the pages registered (pinned): the pool's pieces pay it once,
            // on the thread that makes them. Registering populated pages is cheap (36 ms a GiB
            // against 416 for fresh ones), and so is populating a mapping of pages the memfd
            // has: the pages are allocated first, through the fd (`fallocate`, which holds no
            // lock of this process's address space, where faulting them in would hold it against
            // the main thread's mappings for as long), then mapped `MAP_POPULATE`.
            // SAFETY: fallocate on a live descriptor borrowed for the call (a failure, no memory,
            // shows at the registration below, which allocates what is missing).
            unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, size as libc::off_t) };
            host::map_memfd_with(fd, r, offset, size, libc::MAP_POPULATE)?;
            return self.register(r, offset, size).inspect_err(|_| host::unmap_memfd(r, offset, size));
        }
        self.map(fd, tier, r.sub_range(offset, size)?, size, false)
    }

    fn needs_kernel_registration(&self, tier: Tier) -> bool {
        self.memfd(tier)
    }

    fn register_for_kernels(&self, r: &Reservation, offset: u64, size: u64, tier: Tier) -> Result<()> {
        if self.memfd(tier) {
            // Page-table entries first (`MADV_POPULATE_WRITE`, Linux 5.14; where it fails the
            // registration faults the pages in itself): without them the first kernel read of
            // an 8 GiB segment whose pages a backend had written took 1,971 ms on the H100, with
            // them 1,288-1,866 ms (the probe's 36-86 ms a GiB was for pages populated in the
            // registering process itself).
            if let Ok(addr) = r.sub_range(offset, size) {
                // SAFETY: a range of reservation `r` where the caller mapped a memfd read-write;
                // populating changes no byte (it allocates the memfd's missing pages, zeroed, as
                // the registration would).
                unsafe { libc::madvise(addr as *mut c_void, size as usize, libc::MADV_POPULATE_WRITE) };
            }
            self.register(r, offset, size)?;
        }
        Ok(())
    }

    fn unmap_chunk(&self, r: &Reservation, offset: u64, size: u64, tier: Tier) {
        if self.memfd(tier) {
            if let Ok(addr) = r.sub_range(offset, size) {
                self.unregister(addr);
            }
            return host::unmap_memfd(r, offset, size);
        }
        if let Ok(addr) = r.sub_range(offset, size) {
            // SAFETY: inside reservation `r`, which this process owns; the caller no longer
            // uses the chunk mapped there.
            unsafe { sys::cuMemUnmap(addr, size as usize) };
        }
    }

    unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: forwarded contract (both ranges valid, each within one chunk or private).
        unsafe { gpu::copy(dst as u64, src as u64, len) }
    }
}

impl CudaProvider {
    /// Imports and maps a chunk at `addr`, which the callers take from a reservation of ours
    /// (`Reservation::sub_range`); access for the GPU, and for the CPU if `cpu_access`.
    fn map(&self, fd: BorrowedFd<'_>, tier: Tier, addr: u64, size: u64, cpu_access: bool) -> Result<()> {
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer; the fd is only read (it stays the caller's); the handle is
        // owned right away.
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as isize as *mut c_void,
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        let handle = Allocation(handle);
        // SAFETY: `addr..addr+size` lies in a reservation of ours; the handle is live.
        let mapped = unsafe { sys::cuMemMap(addr, size as usize, 0, handle.0, 0) };
        // The mapping, not the handle, keeps the memory alive.
        let released = handle.release();
        check("cuMemMap", mapped)?;
        released?;
        // SAFETY: `addr..addr+size` is the range just mapped; on failure it is unmapped again.
        unsafe {
            // Every placement GPU may read and write every chunk, wherever it lives (one GPU:
            // device 0 alone, as before several were possible).
            let rw = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            let mut desc: Vec<CUmemAccessDesc> =
                (0..self.devices()).map(|n| CUmemAccessDesc { location: self.location(Place::Device(n)), flags: rw }).collect();
            if cpu_access {
                debug_assert_eq!(tier, Tier::Host);
                desc.push(CUmemAccessDesc { location: self.location(Place::Host), flags: rw });
            }
            let r = sys::cuMemSetAccess(addr, size as usize, desc.as_ptr(), desc.len());
            if r != CUresult::CUDA_SUCCESS {
                sys::cuMemUnmap(addr, size as usize);
                check("cuMemSetAccess", r)?;
            }
        }
        Ok(())
    }
}

/// A VMM allocation handle (`cuMemCreate`, `cuMemImportFromShareableHandle`). Once the memory is
/// exported or mapped, those keep it alive and the handle is given back with
/// [`Allocation::release`], which reports the driver's answer; dropped on an error path
/// instead, it is released all the same.
struct Allocation(CUmemGenericAllocationHandle);

impl Allocation {
    fn release(self) -> Result<()> {
        let handle = self.0;
        std::mem::forget(self);
        // SAFETY: our own handle, released once (`forget` keeps `drop` from releasing it again).
        check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: our own handle, released once.
        unsafe { sys::cuMemRelease(self.0) };
    }
}
