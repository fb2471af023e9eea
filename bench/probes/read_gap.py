#!/usr/bin/env python3
"""What makes the GPU suite's 8 GiB segment read 0.96 of its private cuMemAlloc (issue 25, point 4)?

Run on the GPU machine (Python with cuda.bindings and CuPy): `python3 bench/probes/read_gap.py`.

bench/probes/vmm_read.py found every VMM layout (shareable, imported, chunked, at the arena's
address) reading at 1.00 of a long-lived cuMemAlloc. The suite compares differently: its
private buffer is allocated fresh in every round (cuMemAlloc, fill, read, free), timed by the
wall clock over 20 synchronous launches, in a process that also holds about 9 GB of registered
host memory (the host pool). This probe measures the cases the suite's comparison mixes up,
alternating in rounds (the clocks drift by up to 15 % over a run):

  alloc, kept       one cuMemAlloc of 8 GiB made at the start (vmm_read.py's baseline)
  alloc, fresh      cuMemAlloc, fill, read, free in every round (the suite's private side)
  vmm, kept         8 GiB cuMemCreate, fd exported and imported, mapped in an 80 GB reservation at
                    the arena's address (the suite's segment: one chunk of its size)
  vmm, fresh        the same made and freed in every round
  alloc, after holes a cuMemAlloc of 8 GiB made after 16 GiB of 1 GiB buffers were allocated and
                    every other one freed (its physical pages in the holes)
  ..., ext build    the kept buffers read by the kernel compiled with the extension's NVRTC
                    options (sm_XY, --std=c++17 -default-device) instead of CuPy's

Each case is timed both ways: by CUDA events around one launch (median of 7) and by the wall
clock around 20 synchronous launches (the suite's `read_bandwidth`). Then 9 GB of memfd host
memory is registered with CUDA (as the GPU service's host pool) and the rounds run again.
Prints one line per case and phase: GB/s and the ratio to "alloc, kept".

Measured on an H100 (2026-12-06, driver 580.159.04, 17 s; bench/gpu-report-slot-layout.md):
by the wall clock every case reads at 1.000 (2,893-2,897 GB/s), with and without the 9 GB of
registered host memory, the extension's build of the kernel included. By events around single
launches, the two cases measured right after a fresh case freed its 8 GiB ("vmm, kept" after
"alloc, fresh", "alloc, after holes" after "vmm, fresh") read at 0.86: reads within tens of
milliseconds of an 8 GiB free are slower, which 20 launches timed together do not show.
"""
import ctypes
import ctypes.util
import os
import statistics
import sys
import time

import cupy
from cuda.bindings import driver as cu

# The read kernel (the extension's uvm_read_bw) and the driver-call check, as vmm_read.py has
# them (this directory is on the path when a probe runs as a script).
from vmm_read import SRC, ck

FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
GIB, MIB = 1 << 30, 1 << 20
SIZE = 8 * GIB
ARENA = 0x50_0000_0000
RESERVE = 80 * 10**9 // (2 * MIB) * (2 * MIB)


def main():
    cupy.cuda.Device(0).use()
    cupy.zeros(1)
    dev = ck(cu.cuDeviceGet(0), "device")
    sms = ck(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "sms")
    mod = cupy.RawModule(code=SRC)
    read, fill = mod.get_function("uvm_read_bw"), mod.get_function("fill")
    # The kernel as the extension compiles it (crates/uvm_core/src/gpu/kernels.rs: NVRTC with
    # the device's sm_ architecture, --std=c++17 -default-device): does its code read VMM and
    # cuMemAlloc memory alike too?
    cc = ck(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cc")
    cc_minor = ck(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cc")
    try:
        ext_mod = cupy.RawModule(code=SRC, options=(f"--gpu-architecture=sm_{cc}{cc_minor}", "--std=c++17", "-default-device"))
        ext_read = ext_mod.get_function("uvm_read_bw")
    except Exception as e:  # CuPy may refuse an architecture option of the caller's
        print(f"(the extension's NVRTC options: {type(e).__name__}: {e}; CuPy's options without the architecture instead)")
        ext_mod = cupy.RawModule(code=SRC, options=("--std=c++17", "-default-device"))
        ext_read = ext_mod.get_function("uvm_read_bw")
    out = cupy.zeros(1, dtype=cupy.uint64)
    grid, block = (sms * 4,), (256,)

    def rates(ptr, read=read):
        fill(grid, block, (cupy.uint64(ptr), cupy.uint64(SIZE // 8)))
        args = (cupy.uint64(ptr), cupy.uint64(SIZE // 16), out)
        read(grid, block, args)
        cupy.cuda.Device(0).synchronize()
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(7):
            s.record()
            read(grid, block, args)
            e.record()
            e.synchronize()
            times.append(cupy.cuda.get_elapsed_time(s, e) / 1e3)
        fill(grid, block, (cupy.uint64(ptr), cupy.uint64(SIZE // 8)))
        read(grid, block, args)
        cupy.cuda.Device(0).synchronize()
        t = time.perf_counter()
        for _ in range(20):
            read(grid, block, args)
            cupy.cuda.Device(0).synchronize()
        wall = SIZE * 20 / (time.perf_counter() - t) / 1e9
        return SIZE / statistics.median(times) / 1e9, wall

    def access():
        d = cu.CUmemAccessDesc()
        d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        d.location.id = 0
        d.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return d

    def vmm():
        p = cu.CUmemAllocationProp()
        p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        p.location.id = 0
        p.requestedHandleTypes = FD
        va = int(ck(cu.cuMemAddressReserve(RESERVE, 2 * MIB, ARENA, 0), "reserve"))
        h = ck(cu.cuMemCreate(SIZE, p, 0), "create")
        fd = ck(cu.cuMemExportToShareableHandle(h, FD, 0), "export")
        h2 = ck(cu.cuMemImportFromShareableHandle(fd, FD), "import")
        ck(cu.cuMemRelease(h), "release original")
        os.close(int(fd))
        ck(cu.cuMemMap(va, SIZE, 0, h2, 0), "map")
        ck(cu.cuMemSetAccess(va, SIZE, [access()], 1), "access")

        def free():
            ck(cu.cuMemUnmap(va, SIZE), "unmap")
            ck(cu.cuMemRelease(h2), "release")
            ck(cu.cuMemAddressFree(va, RESERVE), "free")

        return va, free

    def alloc():
        ptr = int(ck(cu.cuMemAlloc(SIZE), "alloc"))
        return ptr, lambda: ck(cu.cuMemFree(ptr), "free")

    kept_alloc, free_kept_alloc = alloc()
    kept_vmm, free_kept_vmm = vmm()
    holes = [int(ck(cu.cuMemAlloc(GIB), "hole")) for _ in range(16)]
    for p in holes[1::2]:
        ck(cu.cuMemFree(p), "free hole")
    holed, free_holed = alloc()

    def fresh(make):
        def run():
            ptr, free = make()
            try:
                return rates(ptr)
            finally:
                free()

        return run

    cases = [
        ("alloc, kept", lambda: rates(kept_alloc)),
        ("alloc, fresh", fresh(alloc)),
        ("vmm, kept", lambda: rates(kept_vmm)),
        ("vmm, fresh", fresh(vmm)),
        ("alloc, after holes", lambda: rates(holed)),
        ("alloc, kept, ext build", lambda: rates(kept_alloc, ext_read)),
        ("vmm, kept, ext build", lambda: rates(kept_vmm, ext_read)),
    ]

    def phase(title):
        got = {name: [] for name, _ in cases}
        for _ in range(5):
            for name, run in cases:
                got[name].append(run())
        ev0 = statistics.median(r[0] for r in got[cases[0][0]])
        wall0 = statistics.median(r[1] for r in got[cases[0][0]])
        print(f"-- {title}")
        for name, _ in cases:
            ev = statistics.median(r[0] for r in got[name])
            wall = statistics.median(r[1] for r in got[name])
            print(f"{name:20s} events {ev:6.0f} GB/s {ev / ev0:.3f}   wall {wall:6.0f} GB/s {wall / wall0:.3f}"
                  f"   (wall rounds: {', '.join(f'{r[1]:.0f}' for r in got[name])})")
        sys.stdout.flush()

    phase("no host memory registered")
    # 9 GB of memfd host memory registered, as the service's host pool (36 pieces of 256 MB).
    regs = []
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    for i in range(36):
        fd = os.memfd_create(f"read_gap {i}")
        os.ftruncate(fd, 256 * MIB)
        addr = libc.mmap(None, 256 * MIB, 3, 0x1 | 0x8000, fd, 0)  # PROT_RW, MAP_SHARED | MAP_POPULATE
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        libc.memset(addr, 1, 256 * MIB)
        ck(cu.cuMemHostRegister(addr, 256 * MIB, cu.CU_MEMHOSTREGISTER_DEVICEMAP), "register")
        regs.append((fd, addr))
    phase("9 GB of host memory registered")
    for fd, addr in regs:
        ck(cu.cuMemHostUnregister(addr), "unregister")
    free_holed()
    for p in holes[0::2]:
        ck(cu.cuMemFree(p), "free hole")
    free_kept_vmm()
    free_kept_alloc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
