#!/usr/bin/env python3
"""Why does a kernel read an 8 GiB VMM segment at 0.94 of a private cuMemAlloc (bench/gpu-report.md)?

Run on the GPU machine (Python with cuda.bindings and CuPy): `python3 bench/probes/vmm_read.py`.
Reads 8 GiB with the extension's own read kernel (uvm_read_bw of kernels/segment.cu, same grid:
4 blocks per SM of 256 threads), median of 7 launches per round, 5 rounds alternating over:

  alloc        cuMemAlloc (the baseline of the report)
  vmm          one cuMemCreate of 8 GiB, POSIX-fd shareable (as the extension's chunks), mapped in a
               reservation aligned to 2 MiB (as the extension reserves), 2 MiB past a 1 GiB boundary;
               the same exported as a POSIX fd and imported (as every process maps a chunk); one not
               shareable, 1 GiB aligned; 64 separate 128 MiB chunks mapped back to back

Every buffer is filled with the same pattern first (the data read changes the power drawn, and
with it the clocks). Prints one line per case: GB/s and the ratio to cuMemAlloc.

Measured on the H200 (2026-11-30, driver 580.159.04): every VMM case reads at 0.998 to 1.003 of
cuMemAlloc (3963 GB/s), the 80 GB reservation at the extension's arena address included. An
earlier version that measured the cases one after the other, not in alternating rounds, saw the
clocks drift by 15 % within one run. So the VMM mechanism (shareable handle, import, alignment,
reservation size, chunking) is not what makes the GPU suite's segment read 0.95 of its private
cuMemAlloc; that gap, measured in the extension's own process, is still unexplained.
"""
import os
import sys

import cupy
from cuda.bindings import driver as cu

OK = cu.CUresult.CUDA_SUCCESS
FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
GIB, MIB = 1 << 30, 1 << 20
SIZE = 8 * GIB

SRC = r"""
typedef unsigned long long u64;
extern "C" __global__ void uvm_read_bw(const ulonglong2 *p, u64 n, u64 *out) {
    u64 s = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        ulonglong2 v = p[i];
        s += v.x ^ v.y;
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if ((threadIdx.x & 31) == 0 && s == 0x12345) atomicAdd(out, s);
}
extern "C" __global__ void fill(u64 *p, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        p[i] = (i * 0x9E3779B97F4A7C15ull) ^ (i >> 7);
}
"""


def ck(res, what):
    err, *rest = res if isinstance(res, tuple) else (res,)
    if err != OK:
        raise RuntimeError(f"{what}: {err}")
    return rest[0] if len(rest) == 1 else rest


def main():
    cupy.cuda.Device(0).use()
    cupy.zeros(1)
    dev = ck(cu.cuDeviceGet(0), "device")
    sms = ck(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "sms")
    mod = cupy.RawModule(code=SRC)
    read, fill = mod.get_function("uvm_read_bw"), mod.get_function("fill")
    out = cupy.zeros(1, dtype=cupy.uint64)
    grid, block = (sms * 4,), (256,)

    def gbps(ptr):
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
        times.sort()
        return SIZE / times[3] / 1e9

    def prop(shareable):
        p = cu.CUmemAllocationProp()
        p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        p.location.id = 0
        if shareable:
            p.requestedHandleTypes = FD
        return p

    def access():
        d = cu.CUmemAccessDesc()
        d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        d.location.id = 0
        d.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return d

    def vmm(chunk, align, skew, shareable=True, imported=False, reserve=None, hint=0):
        """Maps SIZE bytes of cuMemCreate chunks; returns (base, cleanup)."""
        total = reserve or SIZE + skew + align
        va = int(ck(cu.cuMemAddressReserve(total, align, hint, 0), "reserve"))
        base = va + skew
        handles = []
        for off in range(0, SIZE, chunk):
            h = ck(cu.cuMemCreate(chunk, prop(shareable), 0), "create")
            if imported:
                # as the extension does: export a POSIX fd, import it, map the imported handle
                fd = ck(cu.cuMemExportToShareableHandle(h, FD, 0), "export")
                h2 = ck(cu.cuMemImportFromShareableHandle(fd, FD), "import")
                ck(cu.cuMemRelease(h), "release original")
                os.close(int(fd))
                h = h2
            ck(cu.cuMemMap(base + off, chunk, 0, h, 0), "map")
            handles.append(h)
        ck(cu.cuMemSetAccess(base, SIZE, [access()], 1), "access")

        def cleanup():
            ck(cu.cuMemUnmap(base, SIZE), "unmap")
            for h in handles:
                ck(cu.cuMemRelease(h), "release")
            ck(cu.cuMemAddressFree(va, total), "free")

        return base, cleanup

    # Every case stays allocated; rounds alternate between them, so that the clocks' drift over
    # the run (measured: up to 15 % between the start and the end of a run) weighs on all alike.
    ptr = int(ck(cu.cuMemAlloc(SIZE), "alloc"))
    cases = [("alloc (cuMemAlloc)", ptr, None)]
    for name, chunk, align, skew, shareable, imported, reserve, hint in [
        ("vmm, 2 MiB aligned, +2 MiB", SIZE, 2 * MIB, 2 * MIB, True, False, None, 0),
        ("vmm, fd exported + imported", SIZE, 2 * MIB, 2 * MIB, True, True, None, 0),
        ("vmm, 1 GiB aligned, no fd", SIZE, GIB, 0, False, False, None, 0),
        ("vmm, 64 chunks of 128 MiB", 128 * MIB, 2 * MIB, 0, True, False, None, 0),
        # as the GPU suite's segments: 80 GB reserved (max_segment_size), 8 GiB mapped at its start
        ("vmm, in an 80 GB reservation", SIZE, 2 * MIB, 0, True, True, 80 * 10**9 // (2 * MIB) * (2 * MIB), 0),
        # and in the extension's arena (ARENA_HINT 0x50_0000_0000, a few segments in)
        ("vmm, 80 GB res. at the arena", SIZE, 2 * MIB, 0, True, True, 80 * 10**9 // (2 * MIB) * (2 * MIB),
         0x50_0000_0000 + 3 * (80 * 10**9 // (2 * MIB) * (2 * MIB))),
    ]:
        base, cleanup = vmm(chunk, align, skew, shareable, imported, reserve, hint)
        cases.append((name, base, cleanup))
    rates = {name: [] for name, _, _ in cases}
    for _ in range(5):
        for name, base, _ in cases:
            rates[name].append(gbps(base))
    ref = sorted(rates[cases[0][0]])[2]
    for name, base, _ in cases:
        r = sorted(rates[name])
        print(f"{name:30s} {r[2]:7.0f} GB/s  {r[2] / ref:.3f}   (rounds: {', '.join(f'{x:.0f}' for x in rates[name])})  at {base:#x}")
    for _, _, cleanup in cases[1:]:
        cleanup()
    ck(cu.cuMemFree(ptr), "free")
    return 0


if __name__ == "__main__":
    sys.exit(main())
