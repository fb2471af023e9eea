#!/usr/bin/env python3
"""How fast can a kernel read pinned host memory in place (issue 26, point 5)?

Run on the GPU machine (Python with CuPy): `python3 bench/probes/zero_copy_ceiling.py [--mib 512]
[--runs 5]`.

The issue asks the cached join to read a cache's host-tier part "in place at >= 0.8 of the host
link's bandwidth", the link being what `cuMemcpy` moves (55 GB/s on the H100 and the H200). The
probe kernel reads its keys a warp's tile at a time (kernels/segment.cu, `uvm_join_probe`); this
asks what access patterns can reach at all, over `--mib` MiB of pinned host memory (mapped: one
pointer for both), each the best of `--runs`, at 2, 4, 8 and 16 blocks of 256 threads per SM:

  ld8        grid-stride, one 8-byte load per thread per step (the suite's "stream8")
  ld16       the same with 16-byte loads
  ld16x4     4 16-byte loads per thread per step, all issued before any is used
  ld16x8     8 of them
  cpasync8   per warp, 8 16-byte `cp.async.cg` copies per lane into shared memory, then one
             wait: the loads go global -> shared without registers (sm_80 and later)
  memcpy     cudaMemcpy host to device of the same bytes (the copy engines' ceiling)

Every kernel sums what it read (so nothing is optimised away) and the sums are checked against
CuPy's. Prints GB/s and the fraction of the copy ceiling.

Measured on an H100 80GB HBM3 (2026-12-06, 512 MiB, best of 5; every sum right): memcpy 55.2
GB/s; every kernel, every grid: 34.3-34.8 GB/s, 0.62-0.63 of it (ld8 34.3-34.5, ld16 34.6-34.7,
ld16x4 34.7-34.8, ld16x8 34.6-34.7, cpasync8 34.6-34.7). On that machine no kernel reads pinned
host memory in place faster than 0.63 of the copy engines, whatever it keeps in flight: the
issue's 0.8 cannot be met there by reading in place. (The H200 machine's notes give 48-51 GB/s
for CuPy's sum over HOST_NUMA and registered memory, about 0.9 of its 55: run this there.)
"""
import argparse
import sys

import cupy as cp
import numpy as np

THREADS = 256

SOURCE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ void add_out(u64 *out, u64 s) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31u) == 0u) atomicAdd(out, s);
}
extern "C" __global__ void ld8(const u64 *p, u64 n8, u64 *out) {
    u64 s = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n8; i += (u64)gridDim.x * blockDim.x) s += p[i];
    add_out(out, s);
}
extern "C" __global__ void ld16(const ulonglong2 *p, u64 n16, u64 *out) {
    u64 s = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n16; i += (u64)gridDim.x * blockDim.x) {
        ulonglong2 v = p[i];
        s += v.x + v.y;
    }
    add_out(out, s);
}
template <int K> __device__ void ld16xk(const ulonglong2 *p, u64 n16, u64 *out) {
    u64 s = 0;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    for (; i + (K - 1) * stride < n16; i += K * stride) {
        ulonglong2 v[K];
#pragma unroll
        for (int k = 0; k < K; k++) v[k] = p[i + k * stride];
#pragma unroll
        for (int k = 0; k < K; k++) s += v[k].x + v[k].y;
    }
    for (; i < n16; i += stride) s += p[i].x + p[i].y;
    add_out(out, s);
}
extern "C" __global__ void ld16x4(const ulonglong2 *p, u64 n16, u64 *out) { ld16xk<4>(p, n16, out); }
extern "C" __global__ void ld16x8(const ulonglong2 *p, u64 n16, u64 *out) { ld16xk<8>(p, n16, out); }
// Each warp copies tiles of 32 x 8 16-byte pieces (4 KiB) into its shared buffer with cp.async,
// waits, and sums them; tiles t, t + warps, ... (n16 a multiple of 256).
extern "C" __global__ void cpasync8(const ulonglong2 *p, u64 n16, u64 *out) {
    __shared__ ulonglong2 buf[8][256];
    const unsigned lane = threadIdx.x & 31u, w = threadIdx.x >> 5;
    u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    u64 s = 0;
    for (u64 t = blockIdx.x * (u64)(blockDim.x >> 5) + w; t * 256ull < n16; t += warps) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            unsigned dst = (unsigned)__cvta_generic_to_shared(&buf[w][lane + 32 * k]);
            const ulonglong2 *src = p + t * 256ull + lane + 32 * k;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
        }
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group 0;\n" ::);
        __syncwarp();
#pragma unroll
        for (int k = 0; k < 8; k++) s += buf[w][lane + 32 * k].x + buf[w][lane + 32 * k].y;
        __syncwarp();
    }
    add_out(out, s);
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    dev = cp.cuda.Device(0)
    props = cp.cuda.runtime.getDeviceProperties(0)
    sms = props["multiProcessorCount"]
    print(f"{props['name'].decode()}, {sms} SMs, {a.mib} MiB of pinned host memory, best of {a.runs}")
    nbytes = a.mib << 20
    pinned = cp.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(pinned, dtype=np.uint64, count=nbytes // 8)
    host[:] = np.random.default_rng(7).integers(0, 1 << 40, size=host.size, dtype=np.uint64)
    want = int(host.sum(dtype=np.uint64))
    try:
        ptr = cp.cuda.runtime.hostGetDevicePointer(pinned.ptr, 0)
    except Exception:  # noqa: BLE001 (UVA: the host pointer is the device pointer)
        ptr = pinned.ptr
    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=None)
    out = cp.zeros(1, dtype=cp.uint64)
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def timed(launch):
        best = None
        for _ in range(a.runs):
            out.fill(0)
            start.record()
            launch()
            end.record()
            end.synchronize()
            ms = cp.cuda.get_elapsed_time(start, end)
            best = ms if best is None else min(best, ms)
        return best, int(out.get()[0])

    d = cp.empty(nbytes // 8, dtype=cp.uint64)
    ms, _ = timed(lambda: cp.cuda.runtime.memcpy(d.data.ptr, pinned.ptr, nbytes, 1))
    ceiling = nbytes / ms / 1e6
    print(f"{'memcpy':10} {'':>6} {ms:8.2f} ms {ceiling:7.1f} GB/s  1.00")
    n = {"ld8": nbytes // 8, "ld16": nbytes // 16, "ld16x4": nbytes // 16, "ld16x8": nbytes // 16, "cpasync8": nbytes // 16}
    for name in ("ld8", "ld16", "ld16x4", "ld16x8", "cpasync8"):
        try:
            k = mod.get_function(name)
        except Exception as e:  # noqa: BLE001
            print(f"{name:10} does not compile here: {e}")
            continue
        for per_sm in (2, 4, 8, 16):
            grid = sms * per_sm
            try:
                ms, got = timed(lambda: k((grid,), (THREADS,), (cp.uint64(ptr), cp.uint64(n[name]), out)))
            except Exception as e:  # noqa: BLE001
                print(f"{name:10} @{per_sm:<4} failed: {e}")
                break
            gbps = nbytes / ms / 1e6
            ok = "ok" if got == want else f"WRONG sum {got} != {want}"
            print(f"{name:10} @{per_sm:<5} {ms:8.2f} ms {gbps:7.1f} GB/s  {gbps / ceiling:.2f}  {ok}")
    dev.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
