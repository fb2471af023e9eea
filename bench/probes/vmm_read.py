#!/usr/bin/env python3
"""Why does a kernel read an 8 GiB VMM segment at 0.94 of a private cuMemAlloc (bench/gpu-report.md)?

Run on the GPU machine (Python with cuda.bindings and CuPy): `python3 bench/probes/vmm_read.py`.
Reads 8 GiB with the extension's own read kernel (uvm_read_bw of kernels/segment.cu, same grid:
4 blocks per SM of 256 threads), median of 7, over:

  alloc        cuMemAlloc (the baseline of the report)
  vmm          one cuMemCreate of 8 GiB, POSIX-fd shareable (as the extension's chunks), mapped in a
               reservation aligned to 2 MiB (as the extension reserves) but placed `+2m` past a 1 GiB
               boundary, or aligned to 1 GiB, or aligned to 1 GiB with no shareable handle
  vmm-chunks   8 GiB as 64 separate 128 MiB chunks mapped back to back (1 GiB aligned)

Every buffer is filled with the same pattern first (the data read changes the power drawn, and
with it the clocks). Prints one line per case: GB/s and the ratio to cuMemAlloc.
"""
import sys

import cupy
from cuda.bindings import driver as cu

OK = cu.CUresult.CUDA_SUCCESS
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
            p.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return p

    def access():
        d = cu.CUmemAccessDesc()
        d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        d.location.id = 0
        d.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return d

    def vmm(chunk, align, skew, shareable=True):
        va = int(ck(cu.cuMemAddressReserve(SIZE + skew + align, align, 0, 0), "reserve"))
        base = va + skew
        handles = []
        for off in range(0, SIZE, chunk):
            h = ck(cu.cuMemCreate(chunk, prop(shareable), 0), "create")
            ck(cu.cuMemMap(base + off, chunk, 0, h, 0), "map")
            handles.append(h)
        ck(cu.cuMemSetAccess(base, SIZE, [access()], 1), "access")
        try:
            return gbps(base), base
        finally:
            ck(cu.cuMemUnmap(base, SIZE), "unmap")
            for h in handles:
                ck(cu.cuMemRelease(h), "release")
            ck(cu.cuMemAddressFree(va, SIZE + skew + align), "free")

    ptr = int(ck(cu.cuMemAlloc(SIZE), "alloc"))
    base_rate = gbps(ptr)
    print(f"alloc                         {base_rate:7.0f} GB/s  1.000   at {ptr:#x} (1 GiB aligned: {ptr % GIB == 0})")
    cases = [
        ("vmm, 2 MiB aligned, +2 MiB", SIZE, 2 * MIB, 2 * MIB, True),
        ("vmm, 1 GiB aligned", SIZE, GIB, 0, True),
        ("vmm, 1 GiB aligned, no fd", SIZE, GIB, 0, False),
        ("vmm-chunks 128 MiB, 1 GiB al.", 128 * MIB, GIB, 0, True),
    ]
    for name, chunk, align, skew, shareable in cases:
        rate, base = vmm(chunk, align, skew, shareable)
        print(f"{name:29s} {rate:7.0f} GB/s  {rate / base_rate:.3f}   at {base:#x}")
    # cuMemAlloc again, for the drift of the clocks over the run
    again = gbps(ptr)
    print(f"alloc again                   {again:7.0f} GB/s  {again / base_rate:.3f}")
    ck(cu.cuMemFree(ptr), "free")
    return 0


if __name__ == "__main__":
    sys.exit(main())
