#!/usr/bin/env python3
"""Why does the cached join's probe read the host tier at a seventh of the link (issue 26)?

Run on the GPU machine (Python with CuPy):

    python3 bench/probes/host_probe.py [--rows 50000000] [--dim 5000000] [--runs 5] NAME=PATH ...

Each NAME=PATH is a version of kernels/segment.cu (say, `git show REV:kernels/segment.cu`), compiled
by NVRTC as the extension compiles it.

The GPU suite's "cached join" step measured the probe kernels over fact's cached keys at 2.6 ms
with every block in device memory and 19.8 ms with a third of them (134 MB) in the host tier:
the host part read at ~8 GB/s, where a streaming kernel reads host memory at 51 GB/s and
cuMemcpy moves 55 GB/s (bench/gpu-report-column-cache.md). This probe lays out a column of
`--rows` int8 keys as the cache does (crates/uvm_core/src/cache/mod.rs: blocks of 2^20 rows, a
256-byte header whose first word is the block's row count, the values, then the NULL bitmap,
every area 256-byte aligned), once in device memory and once in pinned host memory (mapped:
the same pointer on the device), builds the join table of `--dim` keys with the first version's
`uvm_join_build`, and times each version's `uvm_join_probe` over both copies, as the extension
launches it (4 blocks of 256 threads per SM; the bitmap pointer set, as for every cached column;
launched again while a walk ran out of budget), and at 8 blocks per SM (`@8`); then `stream8`,
the same rows' keys summed and nothing else: what this access pattern can read. Prints per
version and placement the best time of `--runs`, the key bytes over it, and whether the
matches and payload sum are the expected ones (computed with CuPy); then the copy ceiling (host
to device, 256 MiB).

Measured on an H100 80GB HBM3 (PCIe gen 5 x16, 2026-12-05, 50 M keys, best of 3; the first
version of this probe, before the diagnostics and the tile kernel): segment.cu at 2dfe531
(one row at a time) 3.84 ms from device memory and 150.0 ms from pinned host memory (2.7 GB/s
of keys); reading 8 rows' counts, bits and keys before walking (4ac4a05) 14.6 ms and 146.9 ms
(4 rows 6.0 / 153.2, 16 rows 51.1 / 141.1: the batch's values in local memory); the keys alone
summed, one 8-byte load per thread at a time, 0.23 ms and 12.0 ms (33 GB/s); cudaMemcpy 54.8
GB/s. The build from a cache of dim's two columns: 1.13 ms from device memory, 4.92 ms from host.
The tile kernel (c4bf7a0, a warp's 512 rows copied into shared memory with 16-byte loads before
probing), measured on an H100 80GB HBM3 on 2026-12-06 (`old=` 2dfe531, `batch8=` 4ac4a05,
`tile=` 209194b, best of 3; every answer right):

    version    device ms  host ms (GB/s of keys)   no bitmap / no counts / keys only, host ms
    old@4        3.84     144.4  (2.8)             117.5 / 15.0 / 11.8
    batch8@8    11.37     120.0  (3.3)             124.8 / 143.5 / 123.9
    tile@4       4.28      12.60 (31.8)             12.2 / 12.5 / 12.0
    tile@8       4.23      12.43 (32.2)
    stream8@8    0.17      11.66 (34.3)            (cudaMemcpy host to device 55.2 GB/s)

The tile probe reads pinned host memory 11.6x faster than the old one, at 0.94 of what a
kernel streaming the same keys one 8-byte load per thread reads (stream8); from device memory
it takes 4.2 ms against the old 3.8 (the build is unchanged: 1.1 ms device, 4.8 ms host). In
the GPU suite (bench/gpu-report-cpu-tier.md) the join over a cache 1.5x its device budget then
read its host part at 0.73 of the copy ceiling (0.13 before).

The double-buffered tile (`tile2=`, 43540e0's segment.cu: 256-row tiles copied with cp.async, the
next tile's copies issued before the present one is probed), same machine and day: device
2.87 ms (the one-buffer tile 4.25), host 12.77 ms (31.3 GB/s; the tile 12.45): the device
part 1.48x faster, the host part at the machine's ceiling for kernels either way (every access
pattern of bench/probes/zero_copy_ceiling.py reads pinned host memory at 34.7 GB/s there).
"""
import argparse
import math
import sys
import time

import cupy as cp
import numpy as np

ALIGN = 256
BLOCK_ROWS = 1 << 20
THREADS = 256
SEED = 0x5EED

VARIANTS = r"""
extern "C" __global__ void stream8(const Slot *slots, u64 mask, u64 seed, const u8 *keys, u64 key_width,
                                   const u8 *key_nulls, u64 n, u64 blocks, u64 block_stride, const u8 *headers,
                                   u64 *resume, u64 fresh, u64 *out) {
    u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 s = 0;
    for (u64 g = tid; g < n * blocks; g += stride) {
        u64 b = g / n, r = g - b * n;
        s += ((const u64 *)(keys + b * block_stride))[r];
    }
    warp_add(&out[6], s);
}
"""


def align(x):
    return (x + ALIGN - 1) // ALIGN * ALIGN


def device_pointer(pinned):
    """Pinned host memory's address on the device (with unified addressing, its own)."""
    try:
        return cp.cuda.runtime.hostGetDevicePointer(pinned.ptr, 0)
    except AttributeError:
        return pinned.ptr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=50_000_000)
    ap.add_argument("--dim", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("versions", nargs="+", help="NAME=PATH[:B]")
    a = ap.parse_args()
    mods = []
    for v in a.versions:
        name, path = v.split("=", 1)
        mods.append((name, cp.RawModule(code=open(path).read() + VARIANTS, options=("--std=c++17", "-default-device"))))
    mod = mods[0][1]
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    print(f"{name}, {sms} SMs, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}")

    # The join table: dim keys 1..dim, payload 7 * key (segment.cu's build, staged words).
    slots = 1 << math.ceil(math.log2(2 * a.dim))
    table = cp.zeros(slots * 3, dtype=cp.uint64)
    dk = cp.arange(1, a.dim + 1, dtype=cp.int64)
    dp = dk * 7
    grid = sms * 4
    resume = cp.zeros(grid * 8 * THREADS * 3, dtype=cp.uint64)
    out = cp.zeros(8, dtype=cp.uint64)  # (the extension's result buffer: 8 words)
    build = mod.get_function("uvm_join_build")
    u = np.uint64
    build((grid,), (THREADS,), (table, u(slots - 1), u(SEED), dk, u(8), u(0), dp, u(8), u(0), u(a.dim), u(1), u(0),
                                u(0), resume, u(1), out))
    cp.cuda.Device().synchronize()
    o = out.get()
    if o[5] != a.dim or o[0] or o[1]:
        sys.exit(f"build: {o}")

    # The fact column: keys uniform in 1..1.2 dim (a sixth miss), in the cache's block layout.
    rng = cp.random.default_rng(7)
    fk = rng.integers(1, a.dim * 6 // 5 + 1, size=a.rows, dtype=cp.int64)
    hit = fk <= a.dim
    want = (int(hit.sum()), int((fk * 7)[hit].sum()))
    nblocks = (a.rows + BLOCK_ROWS - 1) // BLOCK_ROWS
    values_at = ALIGN
    nulls_at = align(values_at + 8 * BLOCK_ROWS)
    block_bytes = align(nulls_at + BLOCK_ROWS // 8)
    img = cp.zeros(nblocks * block_bytes, dtype=cp.uint8)
    for b in range(nblocks):
        rows = min(BLOCK_ROWS, a.rows - b * BLOCK_ROWS)
        at = b * block_bytes
        img[at:at + 8] = cp.asarray(np.array([rows], dtype=np.uint64).view(np.uint8))
        img[at + values_at:at + values_at + 8 * rows] = fk[b * BLOCK_ROWS:b * BLOCK_ROWS + rows].view(cp.uint8)
    on_dev = img
    pinned = cp.cuda.alloc_pinned_memory(img.nbytes)
    host = np.frombuffer(pinned, dtype=np.uint8, count=img.nbytes)
    host[:] = img.get()
    host_ptr = device_pointer(pinned)
    print(f"fact: {a.rows} keys in {nblocks} blocks of {block_bytes} bytes; dim {a.dim} keys, {slots} slots; "
          f"expected matches {want[0]}, payload sum {want[1]}")

    def run(fn, base, per_sm, hdr=True, nul=True):
        g = sms * per_sm
        best = None
        got = None
        for _ in range(a.runs):
            out.fill(0)
            fresh = 1
            t = time.perf_counter()
            launches = 0
            while True:
                fn((g,), (THREADS,), (table, u(slots - 1), u(SEED), u(base + values_at), u(8), u(base + nulls_at if nul else 0),
                                      u(BLOCK_ROWS), u(nblocks), u(block_bytes), u(base if hdr else 0), resume, u(fresh), out))
                launches += 1
                o = out.get()
                if o[4] == 0 or launches > 1000:
                    break
                out[4] = 0
                fresh = 0
            ms = (time.perf_counter() - t) * 1e3
            best = ms if best is None else min(best, ms)
            lo, hi = int(o[1]), int(o[2].astype(np.int64))
            got = (int(o[0]), hi * (1 << 32) + lo, int(o[3]), int(o[5]), launches)
        return best, got

    kinds = [(name, m.get_function("uvm_join_probe")) for name, m in mods] + [("stream8", mod.get_function("stream8"))]
    print(f"{'version':<14} {'where':<7} {'ms':>8} {'GB/s keys':>10}  answer")
    key_bytes = a.rows * 8
    for kind, fn in kinds:
        for per_sm in (4, 8):
            for where, base in (("device", on_dev.data.ptr), ("host", host_ptr)):
                ms, got = run(fn, base, per_sm)
                if kind == "stream8":
                    ok = "-"
                else:
                    ok = "ok" if (got[0], got[1]) == want and got[2] == 0 and got[3] == 0 else f"WRONG {got}"
                name = f"{kind}@{per_sm}"
                print(f"{name:<14} {where:<7} {ms:8.2f} {key_bytes / ms / 1e6:10.1f}  {ok} (launches {got[4]})", flush=True)

    # Which loads cost: each version without the NULL bitmap, without the block counts (every
    # block read as full: the last block's room holds zeros, which match nothing), without both.
    for name0, m0 in mods:
        for hdr, nul, what in ((True, False, "no bitmap"), (False, True, "no counts"), (False, False, "keys only")):
            for where, base in (("device", on_dev.data.ptr), ("host", host_ptr)):
                ms, got = run(m0.get_function("uvm_join_probe"), base, 4, hdr, nul)
                ok = "ok" if (got[0], got[1]) == want and got[2] == 0 and got[3] == 0 else f"WRONG {got}"
                print(f"{name0 + ' ' + what:<22} {where:<7} {ms:8.2f} {key_bytes / ms / 1e6:10.1f}  {ok}", flush=True)

    # The build: dim's keys and payloads as a cache of two int8 columns, on the device and in
    # pinned host memory; each version's uvm_join_build into a zeroed table (not timed).
    d_values = [ALIGN, 0]
    d_nulls = [align(ALIGN + 8 * BLOCK_ROWS), 0]
    d_values[1] = align(d_nulls[0] + BLOCK_ROWS // 8)
    d_nulls[1] = align(d_values[1] + 8 * BLOCK_ROWS)
    d_block = align(d_nulls[1] + BLOCK_ROWS // 8)
    d_blocks = (a.dim + BLOCK_ROWS - 1) // BLOCK_ROWS
    dimg = cp.zeros(d_blocks * d_block, dtype=cp.uint8)
    for b in range(d_blocks):
        rows = min(BLOCK_ROWS, a.dim - b * BLOCK_ROWS)
        at = b * d_block
        dimg[at:at + 8] = cp.asarray(np.array([rows], dtype=np.uint64).view(np.uint8))
        for col, src_col in ((0, dk), (1, dp)):
            v = src_col[b * BLOCK_ROWS:b * BLOCK_ROWS + rows].view(cp.uint8)
            dimg[at + d_values[col]:at + d_values[col] + 8 * rows] = v
    dpinned = cp.cuda.alloc_pinned_memory(dimg.nbytes)
    np.frombuffer(dpinned, dtype=np.uint8, count=dimg.nbytes)[:] = dimg.get()
    print(f"{'build':<14} {'where':<7} {'ms':>8} {'Mrows/s':>10}  placed")
    for kind, m in mods:
        fn = m.get_function("uvm_join_build")
        for per_sm in (4, 8):
            for where, base in (("device", dimg.data.ptr), ("host", device_pointer(dpinned))):
                best = None
                for _ in range(a.runs):
                    table.fill(0)
                    out.fill(0)
                    cp.cuda.Device().synchronize()
                    fresh, launches = 1, 0
                    t = time.perf_counter()
                    while True:
                        fn((sms * per_sm,), (THREADS,), (
                            table, u(slots - 1), u(SEED), u(base + d_values[0]), u(8), u(base + d_nulls[0]),
                            u(base + d_values[1]), u(8), u(base + d_nulls[1]), u(BLOCK_ROWS), u(d_blocks), u(d_block),
                            u(base), resume, u(fresh), out))
                        launches += 1
                        o = out.get()
                        if o[1] == 0 or launches > 1000:
                            break
                        out[1] = 0
                        fresh = 0
                    ms = (time.perf_counter() - t) * 1e3
                    best = ms if best is None else min(best, ms)
                ok = "ok" if o[5] == a.dim and o[0] == 0 and o[4] == 0 else f"WRONG {o.tolist()}"
                print(f"{kind + '@' + str(per_sm):<14} {where:<7} {best:8.2f} {a.dim / best / 1e3:10.1f}  {ok}", flush=True)

    # The copy ceiling, host to device.
    n = 256 << 20
    dst = cp.empty(n, dtype=cp.uint8)
    best = None
    for _ in range(5):
        t = time.perf_counter()
        cp.cuda.runtime.memcpy(dst.data.ptr, pinned.ptr, n, cp.cuda.runtime.memcpyHostToDevice)
        s = time.perf_counter() - t
        best = s if best is None else min(best, s)
    print(f"cudaMemcpy host to device, 256 MiB: {n / best / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
