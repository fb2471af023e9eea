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
//! Reservations: the driver honours an address hint only for a range that is free in the CPU
//! address space (measured), so inside the inherited arena the provider unmaps the segment's
//! range first and asks for exactly that address; it verifies the result and falls back on an
//! address of the driver's choosing (then `same_address` is false). Giving a reservation back
//! restores the `PROT_NONE` arena range so that no later mmap lands inside the arena.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys::{
    self, CUdeviceptr, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationHandleType, CUmemAllocationProp,
    CUmemAllocationType, CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, CUresult,
};

use super::{Capabilities, Provider, ProviderKind, Reservation, GRANULARITY};
use crate::error::{Code, Result, UvmError};
use crate::gpu::{self, check, Gpu};
use crate::registry::Tier;

pub struct CudaProvider {
    gpu: &'static Gpu,
}

impl CudaProvider {
    /// The CUDA provider of this process (initialises CUDA on first call).
    pub fn new() -> Result<CudaProvider> {
        let gpu = gpu::gpu()?;
        if !gpu.info.host_numa_vmm {
            return Err(UvmError::new(
                Code::FeatureNotSupported,
                format!("{} cannot allocate shareable host memory (HOST_NUMA VMM)", gpu.info.name),
            ));
        }
        Ok(CudaProvider { gpu })
    }

    fn location(&self, tier: Tier) -> CUmemLocation {
        match tier {
            Tier::Device => CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: self.gpu.device },
            Tier::Host => CUmemLocation {
                type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA,
                id: self.gpu.info.host_numa_id.max(0),
            },
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

/// `mmap(PROT_NONE)` over a range that is free again (never replaces a mapping).
fn protect_none(addr: u64, size: u64) {
    // SAFETY: MAP_FIXED_NOREPLACE fails rather than replace an existing mapping.
    unsafe {
        libc::mmap(
            addr as *mut c_void,
            size as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
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

    fn cpu_accessible(&self, tier: Tier) -> bool {
        tier == Tier::Host
    }

    fn reserve(&self, hint: u64, size: u64, in_arena: bool) -> Result<Reservation> {
        if in_arena {
            // SAFETY: this range is this process's copy of the segment's arena sub-range,
            // used by nothing else; it is restored if the driver will not take it.
            unsafe { libc::munmap(hint as *mut c_void, size as usize) };
            match self.reserve_at(hint, size) {
                Ok(p) if p == hint => return Ok(Reservation { addr: p, size, in_arena: true }),
                Ok(p) => {
                    // SAFETY: the reservation just made, given back whole.
                    unsafe { sys::cuMemAddressFree(p, size as usize) };
                    protect_none(hint, size);
                }
                Err(_) => protect_none(hint, size),
            }
            // the arena range is PROT_NONE again; fall through to an address of the driver's
            let p = self.reserve_at(0, size)?;
            return Ok(Reservation { addr: p, size, in_arena: false });
        }
        let p = self.reserve_at(hint, size)?;
        Ok(Reservation { addr: p, size, in_arena: false })
    }

    fn release_reservation(&self, r: &Reservation) {
        // SAFETY: a whole reservation of ours, with every chunk in it unmapped.
        let rc = unsafe { sys::cuMemAddressFree(r.addr, r.size as usize) };
        if r.in_arena && rc == CUresult::CUDA_SUCCESS {
            protect_none(r.addr, r.size);
        }
    }

    fn create_chunk(&self, tier: Tier, size: u64) -> Result<OwnedFd> {
        // SAFETY: all-zero is a valid CUmemAllocationProp; the fields that matter are set below.
        let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location = self.location(tier);
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointers and prop; the local handle is released on every path, the
        // exported fd (which keeps the memory alive) is owned right away.
        unsafe {
            check(&format!("cuMemCreate ({} bytes, {})", size, tier.name()), sys::cuMemCreate(&mut handle, size as usize, &prop, 0))?;
            let mut fd: libc::c_int = -1;
            let r = sys::cuMemExportToShareableHandle(
                &mut fd as *mut libc::c_int as *mut c_void,
                handle,
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            );
            let released = sys::cuMemRelease(handle);
            check("cuMemExportToShareableHandle", r)?;
            let fd = OwnedFd::from_raw_fd(fd);
            check("cuMemRelease", released)?;
            Ok(fd)
        }
    }

    fn map_chunk(&self, fd: BorrowedFd<'_>, tier: Tier, addr: u64, size: u64) -> Result<()> {
        // SAFETY: `addr..addr+size` lies in a reservation of ours; the imported handle is
        // released once mapped (the mapping keeps the memory); the fd stays the caller's.
        unsafe {
            let mut handle: CUmemGenericAllocationHandle = 0;
            check(
                "cuMemImportFromShareableHandle",
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    fd.as_raw_fd() as isize as *mut c_void,
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                ),
            )?;
            let mapped = sys::cuMemMap(addr, size as usize, 0, handle, 0);
            let released = sys::cuMemRelease(handle);
            check("cuMemMap", mapped)?;
            check("cuMemRelease", released)?;
            let rw = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            let mut desc = vec![CUmemAccessDesc { location: self.location(Tier::Device), flags: rw }];
            if tier == Tier::Host {
                desc.push(CUmemAccessDesc { location: self.location(Tier::Host), flags: rw });
            }
            let r = sys::cuMemSetAccess(addr, size as usize, desc.as_ptr(), desc.len());
            if r != CUresult::CUDA_SUCCESS {
                sys::cuMemUnmap(addr, size as usize);
                check("cuMemSetAccess", r)?;
            }
        }
        Ok(())
    }

    fn unmap_chunk(&self, addr: u64, size: u64, _tier: Tier) {
        // SAFETY: a range this process mapped with map_chunk.
        unsafe { sys::cuMemUnmap(addr, size as usize) };
    }

    unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: forwarded contract (both ranges valid, each within one chunk or private).
        unsafe { gpu::copy(dst as u64, src as u64, len) }
    }
}
