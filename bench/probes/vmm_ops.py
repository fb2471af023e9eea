#!/usr/bin/env python3
"""What does each CUDA VMM call of a temporary segment's life cost (a chunk created, exported,
imported, mapped, written, unmapped, released)?

Run on the GPU machine (Python with cuda.bindings and CuPy): `python3 bench/probes/vmm_ops.py`.

bench/probes/service_ops.sql measured, inside the GPU service, a device segment of 64 kB
created in about 100 us, its first 16 kB write about 180 us against about 55 us for the next
ones, and its drop about 60 us once written (10 us never written): a cached star join makes up
to nine such segments. This probe times the driver calls under those numbers, as the extension
makes them (crates/uvm_core/src/provider/cuda.rs): `create_chunk` (cuMemCreate of a 2 MiB
shareable chunk, cuMemExportToShareableHandle to a POSIX fd, cuMemRelease), `map`
(cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess, cuMemRelease of the imported
handle), a 16 kB cuMemcpyHtoD (the first and a second), `unmap_chunk` (cuMemUnmap), and the fd
closed (the memory freed). Per call: the median and mean microseconds over `--cycles` cycles,
for the device tier and the host tier (HOST_NUMA), each cycle at a fresh 2 MiB of one
reservation, as segments are. Prints one table.
"""
import argparse
import os
import statistics
import sys
import time

import cupy
import numpy as np
from cuda.bindings import driver as cu

OK = cu.CUresult.CUDA_SUCCESS
FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
MIB = 1 << 20
CHUNK = 2 * MIB


def ck(res, what):
    err, *rest = res if isinstance(res, tuple) else (res,)
    if err != OK:
        raise RuntimeError(f"{what}: {err}")
    return rest[0] if len(rest) == 1 else rest


def prop(host):
    p = cu.CUmemAllocationProp()
    p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    if host:
        p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
        p.location.id = 0
    else:
        p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        p.location.id = 0
    p.requestedHandleTypes = FD
    return p


def access(host):
    descs = []
    d = cu.CUmemAccessDesc()
    d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    d.location.id = 0
    d.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    descs.append(d)
    if host:
        h = cu.CUmemAccessDesc()
        h.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
        h.location.id = 0
        h.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        descs.append(h)
    return descs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=200)
    a = ap.parse_args()
    cupy.cuda.Device(0).use()
    cupy.zeros(1)
    src = np.full(16384, 0xAB, dtype=np.uint8)
    rows = []
    for tier, host in (("device", False), ("host", True)):
        va = int(ck(cu.cuMemAddressReserve(CHUNK * a.cycles, CHUNK, 0, 0), "reserve"))
        times = {}

        def timed(name, f):
            t = time.perf_counter_ns()
            r = f()
            times.setdefault(name, []).append((time.perf_counter_ns() - t) / 1e3)
            return r

        try:
            for i in range(a.cycles):
                if i == 0 and host:
                    try:
                        cu.cuMemRelease(ck(cu.cuMemCreate(CHUNK, prop(host), 0), "create"))
                    except RuntimeError as e:
                        rows.append((tier, f"not measured: {e}", float("nan"), float("nan")))
                        break
                addr = va + i * CHUNK
                h = timed("cuMemCreate", lambda: ck(cu.cuMemCreate(CHUNK, prop(host), 0), "create"))
                fd = timed("cuMemExportToShareableHandle", lambda: ck(cu.cuMemExportToShareableHandle(h, FD, 0), "export"))
                timed("cuMemRelease (created)", lambda: ck(cu.cuMemRelease(h), "release"))
                h2 = timed("cuMemImportFromShareableHandle", lambda: ck(cu.cuMemImportFromShareableHandle(fd, FD), "import"))
                timed("cuMemMap", lambda: ck(cu.cuMemMap(addr, CHUNK, 0, h2, 0), "map"))
                acc = access(host)
                timed("cuMemSetAccess", lambda: ck(cu.cuMemSetAccess(addr, CHUNK, acc, len(acc)), "access"))
                timed("cuMemRelease (imported)", lambda: ck(cu.cuMemRelease(h2), "release"))
                timed("cuMemcpyHtoD 16 kB (first)", lambda: ck(cu.cuMemcpyHtoD(addr, src.ctypes.data, src.nbytes), "copy"))
                timed("cuMemcpyHtoD 16 kB (second)", lambda: ck(cu.cuMemcpyHtoD(addr, src.ctypes.data, src.nbytes), "copy"))
                timed("cuMemUnmap", lambda: ck(cu.cuMemUnmap(addr, CHUNK), "unmap"))
                timed("close (the chunk freed)", lambda: os.close(int(fd)))
        finally:
            ck(cu.cuMemAddressFree(va, CHUNK * a.cycles), "free")
        for name, t in times.items():
            rows.append((tier, name, statistics.median(t), statistics.fmean(t)))
    print(f"| tier | call ({CHUNK // MIB} MiB chunks, {a.cycles} cycles) | median (us) | mean (us) |")
    print("|---|---|---:|---:|")
    for tier, name, med, mean in rows:
        print(f"| {tier} | {name} | {med:.1f} | {mean:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
