//! The CUDA provider: chunks are CUDA VMM allocations, on the GPU (`device` tier) or in pinned
//! host memory on the GPU's NUMA node (`host` tier, `CU_MEM_LOCATION_TYPE_HOST_NUMA`), each
//! exported as a POSIX fd for the broker to keep.
//!
//! Every process maps chunks into a `cuMemAddressReserve`d range with `cuMemMap` and grants
//! access with `cuMemSetAccess`: to the GPU always, and to the CPU for host chunks, so the CPU
//! reads and writes host chunks through the same address as the kernels. Device chunks are not
//! CPU-accessible on this platform (no ATS): the segment layer copies to and from them with
//! `cuMemcpy`, one chunk at a time (driver copies cannot cross separately mapped chunks).
//!
//! Reservations: the driver honours a `cuMemAddressReserve` hint only in address space that was
//! free when `cuInit` ran (measured on the H200), so a CUDA process releases its inherited
//! `PROT_NONE` arena just before `cuInit` (`gpu::set_arena`) and then reserves each segment at
//! its arena address. The result is checked: if the driver puts a reservation elsewhere, the
//! segment is used there (`same_address` false; offsets stay valid).

use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys::{
    self, CUdeviceptr, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, CUresult,
};

use super::{Capabilities, Provider, ProviderKind, Reservation, GRANULARITY};
use crate::error::{Code, Result, UvmError};
use crate::gpu::{self, check, Gpu};
use crate::vocab::{Place, Tier};

pub struct CudaProvider {
    gpu: &'static Gpu,
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
        Ok(CudaProvider { gpu })
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
            details: self.gpu.describe(),
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
        // thread of their own).
        gpu::gpu()?;
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
        self.map(fd, tier, r.sub_range(offset, size)?, size, tier == Tier::Host)
    }

    fn map_chunk_for_copy(&self, fd: BorrowedFd<'_>, tier: Tier, r: &Reservation, offset: u64, size: u64) -> Result<()> {
        self.map(fd, tier, r.sub_range(offset, size)?, size, false)
    }

    fn unmap_chunk(&self, r: &Reservation, offset: u64, size: u64, _tier: Tier) {
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
