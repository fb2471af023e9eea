#!/usr/bin/env python3
"""Can host-tier chunks be memfds that every process maps without CUDA (issue 25, point 1)?

Run on the GPU machine (Python with cuda.bindings and CuPy): `python3 bench/probes/host_tier_memfd.py`.
Each test runs in its own subprocess (a failure or an illegal address does not hide the others)
and prints one block. The questions, in the order the design needs their answers:

  layout_in_cuda_range  memfd mmapped MAP_FIXED inside a cuMemAddressReserve range, registered
                        (cuMemHostRegister DEVICEMAP): accepted? device pointer == host pointer? a
                        VMM device chunk mapped next to it in the same range: one kernel reads
                        across the boundary and gets the right sum?
  layout_per_chunk      the same with the range a plain PROT_NONE mapping and the device chunk's
                        piece given to cuMemAddressReserve at its exact address
  register_cost         cuMemHostRegister of a fresh memfd, of a populated one, and of a second
                        mapping of a memfd whose pages another registration already pins
  read_bw               kernel read bandwidth of a registered memfd, a HOST_NUMA VMM chunk and a
                        device chunk (same kernel, alternating rounds)
  copy_bw               cuMemcpy between a registered memfd and a device chunk, both ways
  dma_buf               a HOST_NUMA VMM range exported as a dma-buf fd: can a process without
                        CUDA mmap it?
  cpu_writes            a child process without CUDA maps the memfd at the same address and writes;
                        the parent's kernel reads what it wrote

Measured on the H200 (2026-12-02, driver API 13000, 19 s for the whole probe):

  layout_in_cuda_range  yes to all: MAP_FIXED over the CUDA reservation, registration with device
                        pointer == host pointer, a device chunk in the same reservation, and a
                        kernel reading across the boundary gets the right sum
  layout_per_chunk      cuMemAddressReserve does not honour a hint at a freed piece of a plain
                        mapping (it reserved elsewhere): keep the CUDA reservation per segment
  register_cost         1 GiB: 416 ms fresh, 36 ms populated (MAP_POPULATE), 86 ms for a second
                        mapping of pages another registration pins; unregister 15 ms. No huge
                        pages (nr_hugepages 0, shmem THP never)
  read_bw               registered memfd 51.3 GB/s, HOST_NUMA VMM 51.3 GB/s, device 3827 GB/s
  copy_bw               memfd <-> device 55.4 / 55.3 GB/s; HOST_NUMA <-> device 55.3 / 55.2 GB/s
  dma_buf               CUDA_ERROR_INVALID_VALUE: a HOST_NUMA range cannot be exported as dma-buf
  cpu_writes            yes: a process without libcuda maps the memfd at the same address, and
                        the other's kernel reads its writes

So the CUDA provider's host tier can be memfd chunks that every process maps: the service maps
each MAP_FIXED inside its CUDA reservation of the segment and registers it (DEVICEMAP), at no
cost in kernel reads or copies. The cost is elsewhere: built that way (fallocated memfds, mapped
with MAP_POPULATE and registered where mapped), the GPU suite passed, but an 8 GiB migration to
the host tier took 5.4 s in service mode against 0.28 s with HOST_NUMA chunks, 6 s of it
mapping, populating and registering 4 KiB pages for the copy (docs/ARCHITECTURE.md, "The host
tier in every process").
"""
import ctypes
import ctypes.util
import os
import subprocess
import sys
import time

GIB, MIB = 1 << 30, 1 << 20
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.memfd_create.argtypes = [ctypes.c_char_p, ctypes.c_uint]
PROT_NONE, PROT_RW = 0, 3
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANON, MAP_NORESERVE, MAP_POPULATE = 1, 2, 0x10, 0x20, 0x4000, 0x8000
MAP_FAILED = ctypes.c_void_p(-1).value


def mmap(addr, size, prot, flags, fd=-1, off=0):
    p = libc.mmap(addr, size, prot, flags, fd, off)
    if p == MAP_FAILED or p is None:
        raise OSError(ctypes.get_errno(), f"mmap({addr and hex(addr)}, {size})")
    return p


def memfd(size):
    fd = libc.memfd_create(b"uvm-probe", 0)
    os.ftruncate(fd, size)
    return fd


def map_memfd(fd, size, at=0, populate=False):
    flags = MAP_SHARED | (MAP_FIXED if at else 0) | (MAP_POPULATE if populate else 0)
    return mmap(at or None, size, PROT_RW, flags, fd)


def reserve_plain(size):
    return mmap(None, size, PROT_NONE, MAP_PRIVATE | MAP_ANON | MAP_NORESERVE)


def fill_host(addr, size, seed):
    """Fills [addr, addr + size) with u64 words i * seed (i counted from addr's word 0)."""
    import numpy as np
    a = np.ctypeslib.as_array((ctypes.c_uint64 * (size // 8)).from_address(addr))
    a[:] = np.arange(size // 8, dtype=np.uint64) * np.uint64(seed)
    return int(a.sum(dtype=np.uint64))


KSRC = r"""
typedef unsigned long long u64;
extern "C" __global__ void sum64(const u64 *p, u64 n, u64 *out) {
    u64 s = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) s += p[i];
    atomicAdd(out, s);
}
extern "C" __global__ void read_bw(const ulonglong2 *p, u64 n, u64 *out) {
    u64 s = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        ulonglong2 v = p[i];
        s += v.x ^ v.y;
    }
    if (s == 0x12345) atomicAdd(out, s);
}
extern "C" __global__ void fill(u64 *p, u64 n, u64 seed) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) p[i] = i * seed;
}
"""


class Gpu:
    def __init__(self):
        import cupy
        from cuda.bindings import driver as cu
        self.cp, self.cu = cupy, cu
        cupy.cuda.Device(0).use()
        cupy.zeros(1)
        self.ck(cu.cuInit(0), "cuInit")
        self.mod = cupy.RawModule(code=KSRC)
        self.sm = cupy.cuda.Device(0).attributes["MultiProcessorCount"]

    def ck(self, res, what=""):
        err, *rest = res if isinstance(res, tuple) else (res,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{what}: {err}")
        return rest[0] if len(rest) == 1 else (rest or None)

    def sum64(self, addr, size):
        out = self.cp.zeros(1, dtype=self.cp.uint64)
        self.mod.get_function("sum64")((self.sm * 4,), (256,), (self.cp.uint64(addr), self.cp.uint64(size // 8), out))
        self.cp.cuda.Device(0).synchronize()
        return int(out[0])

    def fill(self, addr, size, seed):
        self.mod.get_function("fill")((self.sm * 4,), (256,), (self.cp.uint64(addr), self.cp.uint64(size // 8), self.cp.uint64(seed)))
        self.cp.cuda.Device(0).synchronize()

    def read_gbps(self, addr, size, reps=5):
        out = self.cp.zeros(1, dtype=self.cp.uint64)
        f = self.mod.get_function("read_bw")
        args = (self.cp.uint64(addr), self.cp.uint64(size // 16), out)
        f((self.sm * 4,), (256,), args)
        s, e = self.cp.cuda.Event(), self.cp.cuda.Event()
        ts = []
        for _ in range(reps):
            s.record()
            f((self.sm * 4,), (256,), args)
            e.record()
            e.synchronize()
            ts.append(self.cp.cuda.get_elapsed_time(s, e) / 1e3)
        ts.sort()
        return size / ts[len(ts) // 2] / 1e9

    def register(self, addr, size):
        self.ck(self.cu.cuMemHostRegister(addr, size, 0x2 | 0x1), "cuMemHostRegister")
        return int(self.ck(self.cu.cuMemHostGetDevicePointer(addr, 0), "cuMemHostGetDevicePointer"))

    def prop(self, host_numa=False):
        cu = self.cu
        p = cu.CUmemAllocationProp()
        p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA if host_numa else cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        p.location.id = 0
        p.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return p

    def access(self, host_numa=False):
        cu = self.cu
        ds = []
        for t in ([cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE] + ([cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA] if host_numa else [])):
            d = cu.CUmemAccessDesc()
            d.location.type = t
            d.location.id = 0
            d.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            ds.append(d)
        return ds

    def vmm_map(self, va, size, host_numa=False):
        cu = self.cu
        h = self.ck(cu.cuMemCreate(size, self.prop(host_numa), 0), "cuMemCreate")
        self.ck(cu.cuMemMap(va, size, 0, h, 0), "cuMemMap")
        ds = self.access(host_numa)
        self.ck(cu.cuMemSetAccess(va, size, ds, len(ds)), "cuMemSetAccess")
        return h

    def vmm_unmap(self, va, size, h):
        self.ck(self.cu.cuMemUnmap(va, size), "cuMemUnmap")
        self.ck(self.cu.cuMemRelease(h), "cuMemRelease")


def expected_sum(size, seed):
    n = size // 8
    return (n * (n - 1) // 2 * seed) % (1 << 64)


def across(g, base, half, hptr_ok):
    """The host half holds i * 3, the device half i * 5 (each counted from its start)."""
    fill_host(base, half, 3)
    g.fill(base + half, half, 5)
    got = g.sum64(base, 2 * half)
    want = (expected_sum(half, 3) + expected_sum(half, 5)) % (1 << 64)
    print(f"  kernel across the boundary: {'right sum' if got == want else f'WRONG sum {got} != {want}'} (device ptr == host ptr: {hptr_ok})")


def t_layout_in_cuda_range():
    g = Gpu()
    half = 64 * MIB
    va = int(g.ck(g.cu.cuMemAddressReserve(2 * half, 0, 0, 0), "reserve"))
    fd = memfd(half)
    try:
        p = map_memfd(fd, half, at=va)
        print(f"  mmap MAP_FIXED over the CUDA reservation: ok at {hex(p)}")
    except OSError as e:
        print(f"  mmap MAP_FIXED over the CUDA reservation: {e}")
        return
    try:
        d = g.register(va, half)
        print(f"  register: ok, device ptr {hex(d)} {'==' if d == va else '!='} host ptr")
    except RuntimeError as e:
        print(f"  register: {e}")
        return
    try:
        h = g.vmm_map(va + half, half)
        print("  device chunk mapped in the other half: ok")
    except RuntimeError as e:
        print(f"  device chunk in the other half: {e}")
        return
    across(g, va, half, d == va)


def t_layout_per_chunk():
    g = Gpu()
    half = 64 * MIB
    base = reserve_plain(2 * half + 2 * MIB)
    base = (base + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)
    libc.munmap(base + half, half)
    va = int(g.ck(g.cu.cuMemAddressReserve(half, 0, base + half, 0), "reserve at hint"))
    print(f"  cuMemAddressReserve at the freed piece: {'exact' if va == base + half else f'elsewhere {hex(va)}'}")
    fd = memfd(half)
    map_memfd(fd, half, at=base)
    try:
        d = g.register(base, half)
        print(f"  register: ok, device ptr {'==' if d == base else '!='} host ptr")
    except RuntimeError as e:
        print(f"  register: {e}")
        return
    if va != base + half:
        return
    h = g.vmm_map(va, half)
    across(g, base, half, d == base)
    # migration of the host half to the device: unregister, reserve there, map a device chunk
    t = time.perf_counter()
    g.ck(g.cu.cuMemHostUnregister(base), "unregister")
    libc.munmap(base, half)
    va2 = int(g.ck(g.cu.cuMemAddressReserve(half, 0, base, 0), "reserve 2"))
    h2 = g.vmm_map(va2, half) if va2 == base else None
    print(f"  host half replaced by a device chunk at the same address: {va2 == base} ({1e3*(time.perf_counter()-t):.2f} ms)")
    if h2 is not None:
        g.fill(base, 2 * half, 7)
        print(f"  kernel over the two device reservations: {'right sum' if g.sum64(base, 2*half) == expected_sum(2*half, 7) else 'WRONG'}")


def t_register_cost():
    g = Gpu()
    size = 1 * GIB
    fd = memfd(size)
    a = map_memfd(fd, size)
    t = time.perf_counter()
    g.register(a, size)
    print(f"  register 1 GiB fresh memfd: {1e3*(time.perf_counter()-t):.0f} ms")
    b = map_memfd(fd, size)
    t = time.perf_counter()
    g.register(b, size)
    print(f"  register a second mapping of it (pages pinned by the first): {1e3*(time.perf_counter()-t):.0f} ms")
    t = time.perf_counter()
    g.ck(g.cu.cuMemHostUnregister(b), "unregister")
    print(f"  unregister: {1e3*(time.perf_counter()-t):.0f} ms")
    fd2 = memfd(size)
    c = map_memfd(fd2, size, populate=True)
    t = time.perf_counter()
    g.register(c, size)
    print(f"  register 1 GiB populated (MAP_POPULATE) memfd: {1e3*(time.perf_counter()-t):.0f} ms")
    for f in ("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "/proc/sys/vm/nr_hugepages"):
        try:
            print(f"  {f}: {open(f).read().strip()}")
        except OSError as e:
            print(f"  {f}: {e}")
    try:
        fd3 = libc.memfd_create(b"huge", 4)  # MFD_HUGETLB
        os.ftruncate(fd3, 64 * MIB)
        mmap(None, 64 * MIB, PROT_RW, MAP_SHARED | MAP_POPULATE, fd3)
        print("  MFD_HUGETLB 64 MiB: ok")
    except OSError as e:
        print(f"  MFD_HUGETLB 64 MiB: {e}")


def t_read_bw():
    g = Gpu()
    size = 2 * GIB
    fd = memfd(size)
    a = map_memfd(fd, size, populate=True)
    fill_host(a, size, 3)
    g.register(a, size)
    va = int(g.ck(g.cu.cuMemAddressReserve(size, 0, 0, 0), "reserve"))
    g.vmm_map(va, size, host_numa=True)
    g.fill(va, size, 3)
    vd = int(g.ck(g.cu.cuMemAddressReserve(size, 0, 0, 0), "reserve"))
    g.vmm_map(vd, size)
    g.fill(vd, size, 3)
    res = {"memfd registered": [], "host_numa vmm": [], "device vmm": []}
    for _ in range(3):
        res["memfd registered"].append(g.read_gbps(a, size))
        res["host_numa vmm"].append(g.read_gbps(va, size))
        res["device vmm"].append(g.read_gbps(vd, size))
    for k, v in res.items():
        v.sort()
        print(f"  kernel read {k}: {v[1]:.1f} GB/s (rounds {', '.join(f'{x:.1f}' for x in v)})")


def t_copy_bw():
    g = Gpu()
    size = 2 * GIB
    fd = memfd(size)
    a = map_memfd(fd, size, populate=True)
    g.register(a, size)
    vd = int(g.ck(g.cu.cuMemAddressReserve(size, 0, 0, 0), "reserve"))
    g.vmm_map(vd, size)
    va = int(g.ck(g.cu.cuMemAddressReserve(size, 0, 0, 0), "reserve"))
    g.vmm_map(va, size, host_numa=True)
    for name, src, dst in (("memfd -> device", a, vd), ("device -> memfd", vd, a), ("host_numa -> device", va, vd), ("device -> host_numa", vd, va)):
        g.ck(g.cu.cuMemcpy(dst, src, size), "copy")
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            g.ck(g.cu.cuMemcpy(dst, src, size), "copy")
            ts.append(time.perf_counter() - t)
        ts.sort()
        print(f"  cuMemcpy {name} 2 GiB: {size / ts[1] / 1e9:.1f} GB/s")


def t_dma_buf():
    g = Gpu()
    size = 64 * MIB
    va = int(g.ck(g.cu.cuMemAddressReserve(size, 0, 0, 0), "reserve"))
    g.vmm_map(va, size, host_numa=True)
    cu = g.cu
    try:
        fd = int(g.ck(cu.cuMemGetHandleForAddressRange(va, size, cu.CUmemRangeHandleType.CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), "dma-buf"))
    except Exception as e:
        print(f"  dma-buf export of a HOST_NUMA range: {e}")
        return
    try:
        p = mmap(None, size, PROT_RW, MAP_SHARED, fd)
        print(f"  dma-buf export ok; mmap by this process: ok at {hex(p)}")
    except OSError as e:
        print(f"  dma-buf export ok; mmap: {e}")


def t_cpu_writes():
    g = Gpu()
    size = 64 * MIB
    base = reserve_plain(size + 2 * MIB)
    base = (base + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)
    fd = memfd(size)
    map_memfd(fd, size, at=base)
    g.register(base, size)
    os.set_inheritable(fd, True)
    r = subprocess.run([sys.executable, __file__, "child_write", str(fd), str(base), str(size)], pass_fds=[fd], capture_output=True, text=True, timeout=60)
    print(r.stdout.rstrip() or r.stderr.rstrip())
    got = g.sum64(base, size)
    print(f"  parent kernel reads the child's writes: {'right sum' if got == expected_sum(size, 11) else 'WRONG'}")


def child_write(fd, base, size):
    assert "libcuda" not in open("/proc/self/maps").read()
    p = map_memfd(fd, size, at=0)
    # The same address as the parent: the child's address space is a fresh exec, so map there if free.
    try:
        q = mmap(base, size, PROT_RW, MAP_SHARED | 0x100000, fd)  # MAP_FIXED_NOREPLACE
        same = q == base
    except OSError:
        q, same = p, False
    fill_host(q, size, 11)
    print(f"  child (no libcuda) mapped the memfd at the parent's address: {same}; wrote")


TESTS = ["layout_in_cuda_range", "layout_per_chunk", "register_cost", "read_bw", "copy_bw", "dma_buf", "cpu_writes"]

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child_write":
        child_write(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1:
        globals()["t_" + sys.argv[1]]()
    else:
        for t in TESTS:
            print(f"== {t}", flush=True)
            r = subprocess.run([sys.executable, __file__, t], capture_output=True, text=True, timeout=120)
            print(r.stdout.rstrip())
            if r.returncode:
                print(f"  exit {r.returncode}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
