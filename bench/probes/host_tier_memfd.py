#!/usr/bin/env python3
"""Can host-tier chunks be memfds that every process maps without CUDA (issue 25, point 1)?

Run on the GPU machine (Python with cuda.bindings and CuPy): `python3 bench/probes/host_tier_memfd.py`
(all tests), or with test names to run only those (one name alone runs in this process).
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

The next ones are the plan's (docs/ARCHITECTURE.md, "The plan for the next GPU sessions"): a
host pool of memfd pieces registered once at pool addresses, mapped again at the segment's
address, and registered there off the migration's path:

  double_register       one 256 MiB memfd mapped at A (in a pool reservation) and at B (in a
                        segment reservation), A registered, then B: is B's registration accepted,
                        at what cost? device ptr == host ptr for both? kernels via A and via B get
                        the right sum; a cuMemcpy into A is seen via B by the CPU and a kernel; A
                        unregistered while B stays: kernels via B still right? then B unregistered
  register_while_launching
                        a thread launches a 64 MiB read kernel over a registered memfd in a loop
                        (own stream, synchronised each time) while the main thread registers, then
                        unregisters, 8 other 64 MiB memfds: errors? launch latency before, during
                        and after? registration times? (a pure-Python ticker thread shows whether
                        the GIL, not the driver, is what stalls)
  remap_registered      a memfd registered at A, mapped again (plain mmap, no registration) at B in
                        another reservation: the CPU time of that mmap with and without
                        MAP_POPULATE when the pages exist already, and, last (it may poison the
                        context), can a kernel read via B?

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

Measured on the H200 (2026-12-03, driver API 13000, cuda.bindings 13.3.1; 7 s for the three):

  double_register       yes: B registers while A is registered (CUDA_SUCCESS, 10.9 ms for 256 MiB,
                        A's took 11.1 ms: about 43 ms a GiB of populated pages either way), device
                        pointer == host pointer at both; kernels via A and B get the right sums; a
                        cuMemcpy into A (54.3 GB/s) is seen via B by the CPU and a kernel, a kernel's
                        writes via B by the CPU via A; A unregistered (4.8 ms), B stays valid for
                        kernels and cuMemcpy (54.7 GB/s); then B unregistered (4.6 ms)
  register_while_launching
                        no errors, no wrong sums; 8 x 64 MiB registered in 17.1 ms (2.1 ms each) and
                        unregistered in 7.6 ms; the launcher's kernels (1.35 ms each) got 1 launch in
                        while registering and none while unregistering, the Python ticker never
                        stalled past 1 ms: registration and launches take turns in the driver, so
                        registering off the migration's path still delays kernels by its own time
  remap_registered      mapping the same memfd again at B costs 0.01-0.03 ms (27 ms of first-touch
                        faults for 256 MiB after it), 6-8 ms with MAP_POPULATE; a kernel via B,
                        mapped but not registered there: CUDA_ERROR_ILLEGAL_ADDRESS (the context is
                        lost; PAGEABLE_MEMORY_ACCESS is 0 on this machine), so a segment's host
                        chunks must be registered at the segment's address before any kernel reads
                        them there

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


def memfd(size, fallocate=False):
    fd = libc.memfd_create(b"uvm-probe", 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "memfd_create")
    os.ftruncate(fd, size)
    if fallocate:
        os.posix_fallocate(fd, 0, size)
    return fd


def map_memfd(fd, size, at=0, populate=False):
    flags = MAP_SHARED | (MAP_FIXED if at else 0) | (MAP_POPULATE if populate else 0)
    return mmap(at or None, size, PROT_RW, flags, fd)


def reserve_plain(size):
    return mmap(None, size, PROT_NONE, MAP_PRIVATE | MAP_ANON | MAP_NORESERVE)


def unmap_to_none(addr, size):
    """Puts PROT_NONE back over [addr, addr + size), as the host provider unmaps (the CUDA reservation stays)."""
    return mmap(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANON | MAP_NORESERVE | MAP_FIXED)


def ms_of(f):
    t = time.perf_counter()
    r = f()
    return r, 1e3 * (time.perf_counter() - t)


def fill_host(addr, size, seed):
    """Fills [addr, addr + size) with u64 words i * seed (i counted from addr's word 0)."""
    import numpy as np
    a = np.ctypeslib.as_array((ctypes.c_uint64 * (size // 8)).from_address(addr))
    a[:] = np.arange(size // 8, dtype=np.uint64) * np.uint64(seed)
    return int(a.sum(dtype=np.uint64))


def host_sum(addr, size):
    """The CPU's sum (mod 2^64) of the u64 words of [addr, addr + size)."""
    import numpy as np
    return int(np.ctypeslib.as_array((ctypes.c_uint64 * (size // 8)).from_address(addr)).sum(dtype=np.uint64))


def rname(err):
    """A CUresult's name (CUDA_SUCCESS, CUDA_ERROR_...)."""
    return getattr(err, "name", None) or str(err)


def verdict(got, want):
    return "right sum" if got == want else f"WRONG sum {got} != {want}"


def step(label, f):
    """Prints `label: f()`, or the exception f raised; returns f()'s result or None."""
    try:
        r = f()
        print(f"  {label}: {r}")
        return r
    except Exception as e:
        print(f"  {label}: FAILED {type(e).__name__}: {e}")
        return None


def watchdog(seconds, what):
    """Ends the process (exit 3) if still running after `seconds`: a hung synchronise cannot hang the probe."""
    import threading

    def fire():
        print(f"  {what}: still running after {seconds} s, exiting", flush=True)
        os._exit(3)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


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

    def try_register(self, addr, size):
        """register without raising: (cuMemHostRegister's CUresult name, ms, device pointer or None)."""
        t = time.perf_counter()
        res = self.cu.cuMemHostRegister(addr, size, 0x2 | 0x1)
        ms = 1e3 * (time.perf_counter() - t)
        err = res[0] if isinstance(res, tuple) else res
        if err != self.cu.CUresult.CUDA_SUCCESS:
            return rname(err), ms, None
        return rname(err), ms, self.dev_ptr(addr)

    def try_unregister(self, addr):
        """(cuMemHostUnregister's CUresult name, ms)."""
        t = time.perf_counter()
        res = self.cu.cuMemHostUnregister(addr)
        ms = 1e3 * (time.perf_counter() - t)
        return rname(res[0] if isinstance(res, tuple) else res), ms

    def dev_ptr(self, addr):
        """cuMemHostGetDevicePointer, or None where it fails."""
        err, d = self.cu.cuMemHostGetDevicePointer(addr, 0)
        return int(d) if err == self.cu.CUresult.CUDA_SUCCESS else None

    def reserve(self, size):
        return int(self.ck(self.cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve"))

    def attr(self, name):
        """A device attribute by its CU_DEVICE_ATTRIBUTE_ name, or why not."""
        cu = self.cu
        a = getattr(cu.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_" + name, None)
        if a is None:
            return "n/a in these bindings"
        err, v = cu.cuDeviceGetAttribute(a, self.ck(cu.cuDeviceGet(0), "cuDeviceGet"))
        return v if err == cu.CUresult.CUDA_SUCCESS else rname(err)

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


def ptr_eq(d, host):
    return "n/a" if d is None else ("== host ptr" if d == host else f"{hex(d)} != host ptr {hex(host)}")


def t_double_register():
    g = Gpu()
    guard = watchdog(60, "double_register")
    cu = g.cu
    size = 256 * MIB
    pool, seg = g.reserve(size), g.reserve(size)
    fd = memfd(size, fallocate=True)
    try:
        a = map_memfd(fd, size, at=pool, populate=True)
        b = map_memfd(fd, size, at=seg, populate=True)
    except OSError as e:
        print(f"  mmap MAP_FIXED over the two reservations: {e}")
        return
    print(f"  256 MiB memfd (fallocated, MAP_POPULATE) at A {hex(a)} (pool reservation) and B {hex(b)} (segment reservation)")
    want = expected_sum(size, 3)
    fill_host(a, size, 3)
    print(f"  CPU wrote i * 3 via A; CPU reads via B: {verdict(host_sum(b, size), want)}")
    ra, ms, da = g.try_register(a, size)
    a_reg = ra == "CUDA_SUCCESS"
    print(f"  register A: {ra} in {ms:.1f} ms, device ptr {ptr_eq(da, a)}")
    rb, ms, db = g.try_register(b, size)
    b_reg = rb == "CUDA_SUCCESS"
    print(f"  register B while A is registered: {rb} in {ms:.1f} ms, device ptr {ptr_eq(db, b)}")
    if a_reg:
        step("kernel sum via A", lambda: verdict(g.sum64(a, size), want))
    if b_reg:
        step("kernel sum via B", lambda: verdict(g.sum64(b, size), want))
    # a copy into A (the pool address), seen via B (the segment address)
    dev = g.cp.empty(size // 8, dtype=g.cp.uint64)
    g.fill(dev.data.ptr, size, 7)
    want = expected_sum(size, 7)

    def copy_into(dst, src):
        _, ms = ms_of(lambda: g.ck(cu.cuMemcpy(dst, src, size), "cuMemcpy"))
        g.cp.cuda.Device(0).synchronize()
        return f"ok, {ms:.1f} ms ({size / ms / 1e6:.1f} GB/s)"
    if step(f"cuMemcpy device -> A ({'registered' if a_reg else 'NOT registered'})", lambda: copy_into(a, dev.data.ptr)):
        print(f"  CPU reads via B: {verdict(host_sum(b, size), want)}")
        if b_reg:
            step("kernel sum via B", lambda: verdict(g.sum64(b, size), want))
    if b_reg:
        want = expected_sum(size, 9)
        if step("kernel writes i * 9 via B", lambda: g.fill(b, size, 9) or "ok"):
            print(f"  CPU reads via A: {verdict(host_sum(a, size), want)}")
    # A unregistered while B stays
    if a_reg:
        ru, ms = g.try_unregister(a)
        print(f"  unregister A while B stays registered: {ru} in {ms:.1f} ms")
    if b_reg:
        print(f"  device ptr of B after that: {ptr_eq(g.dev_ptr(b), b)}")
        step("kernel sum via B (what it held)", lambda: verdict(g.sum64(b, size), want))
        want = expected_sum(size, 11)
        fill_host(a, size, 11)
        step("CPU wrote i * 11 via A; kernel sum via B", lambda: verdict(g.sum64(b, size), want))
        g.fill(dev.data.ptr, size, 13)
        want = expected_sum(size, 13)
        if step("cuMemcpy device -> B", lambda: copy_into(b, dev.data.ptr)):
            print(f"  CPU reads via A: {verdict(host_sum(a, size), want)}")
            step("kernel sum via B", lambda: verdict(g.sum64(b, size), want))
        ru, ms = g.try_unregister(b)
        print(f"  unregister B: {ru} in {ms:.1f} ms")
    guard.cancel()


def t_register_while_launching():
    import threading
    g = Gpu()
    guard = watchdog(60, "register_while_launching")
    cu, cp = g.cu, g.cp
    try:
        import cuda.bindings
        print(f"  cuda.bindings {getattr(cuda.bindings, '__version__', '?')} (releases the GIL in driver calls from about 12.9)")
    except Exception as e:
        print(f"  cuda.bindings version: {e}")
    size, n = 64 * MIB, 8
    base = g.reserve((n + 1) * size)
    fds = [memfd(size, fallocate=True) for _ in range(n + 1)]
    addrs = [map_memfd(fd, size, at=base + i * size, populate=True) for i, fd in enumerate(fds)]
    a, others = addrs[0], addrs[1:]
    want = expected_sum(size, 3)
    fill_host(a, size, 3)
    ra, ms, da = g.try_register(a, size)
    print(f"  A (64 MiB memfd in the reservation) registered: {ra} in {ms:.1f} ms, device ptr {ptr_eq(da, a)}")
    if ra != "CUDA_SUCCESS" or step("kernel sum via A (main thread)", lambda: verdict(g.sum64(a, size), want)) != "right sum":
        return
    ctx = g.ck(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    f = g.mod.get_function("sum64")
    launches, ticks, errors = [], [], []
    stop, started = threading.Event(), threading.Event()

    def launcher():
        try:
            g.ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent in the launcher thread")
            cp.cuda.Device(0).use()
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                out = cp.zeros(1, dtype=cp.uint64)
                args = (cp.uint64(a), cp.uint64(size // 8), out)
                end = time.perf_counter() + 15
                while not stop.is_set() and len(launches) < 5000 and time.perf_counter() < end:
                    out.fill(0)
                    s.synchronize()
                    t0 = time.perf_counter()
                    f((g.sm * 4,), (256,), args)
                    s.synchronize()
                    t1 = time.perf_counter()
                    launches.append((t0, t1, int(out[0]) == want))
                    started.set()
        except Exception as e:
            errors.append(f"launcher thread: {type(e).__name__}: {e}")
        finally:
            started.set()

    def ticker():
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.0005)
            now = time.perf_counter()
            ticks.append((last, now))
            last = now

    threads = [threading.Thread(target=launcher, daemon=True), threading.Thread(target=ticker, daemon=True)]
    for t in threads:
        t.start()
    started.wait(10)
    time.sleep(0.5)
    w0 = time.perf_counter()
    reg = []
    for x in others:
        try:
            reg.append(g.try_register(x, size))
        except Exception as e:
            reg.append((f"{type(e).__name__}: {e}", 0.0, None))
    w1 = time.perf_counter()
    unreg = []
    for x, (r, _, _) in zip(others, reg):
        if r == "CUDA_SUCCESS":
            try:
                unreg.append(g.try_unregister(x))
            except Exception as e:
                unreg.append((f"{type(e).__name__}: {e}", 0.0))
    w2 = time.perf_counter()
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(10)
    if any(t.is_alive() for t in threads):
        errors.append("a thread did not stop within 10 s")
    print(f"  register 8 x 64 MiB (populated), one after another: {', '.join(r for r, _, _ in reg if r != 'CUDA_SUCCESS') or 'all CUDA_SUCCESS'}; "
          f"ms {', '.join(f'{ms:.1f}' for _, ms, _ in reg)} ({1e3 * (w1 - w0):.1f} ms in all); device ptr == host ptr: "
          f"{all(d == x for x, (_, _, d) in zip(others, reg))}")
    print(f"  unregister them: {', '.join(r for r, _ in unreg if r != 'CUDA_SUCCESS') or 'all CUDA_SUCCESS'}; "
          f"ms {', '.join(f'{ms:.1f}' for _, ms in unreg)} ({1e3 * (w2 - w1):.1f} ms in all)")
    print(f"  launcher thread: {len(launches)} launches, {sum(1 for *_, ok in launches if not ok)} wrong sums; errors: {'; '.join(errors) or 'none'}")
    # "before" leaves out the launcher's first launches (kernel lookup, warm-up)
    windows = (("before", w0 - 0.4, w0), ("registering", w0, w1), ("unregistering", w1, w2), ("after", w2, float("inf")))
    for name, lo, hi in windows:
        # a launch (or a tick) belongs to every window it overlaps
        ls = sorted(1e3 * (t1 - t0) for t0, t1, _ in launches if t1 >= lo and t0 <= hi)
        ts = [1e3 * (t1 - t0) for t0, t1 in ticks if t1 >= lo and t0 <= hi]
        lat = f"median {ls[len(ls) // 2]:.2f} ms, max {ls[-1]:.2f} ms" if ls else "none"
        print(f"    {name:>13}: {len(ls)} launches, {lat}; Python ticker's longest gap {max(ts) if ts else 0:.2f} ms")
    guard.cancel()


def t_remap_registered():
    g = Gpu()
    guard = watchdog(60, "remap_registered")
    cu = g.cu
    size = 256 * MIB
    pool, seg = g.reserve(size), g.reserve(size)
    fd = memfd(size, fallocate=True)
    a = map_memfd(fd, size, at=pool, populate=True)
    want = expected_sum(size, 3)
    fill_host(a, size, 3)
    ra, ms, da = g.try_register(a, size)
    print(f"  256 MiB memfd at A {hex(a)} (pool reservation) registered: {ra} in {ms:.1f} ms, device ptr {ptr_eq(da, a)}")
    if ra != "CUDA_SUCCESS":
        return
    step("kernel sum via A", lambda: verdict(g.sum64(a, size), want))
    # B: the same memfd in another CUDA reservation, plain mmap, no registration
    plain, popul, undo, touch = [], [], [], []
    try:
        for _ in range(3):
            _, ms = ms_of(lambda: map_memfd(fd, size, at=seg))
            plain.append(ms)
            (got, ms) = ms_of(lambda: host_sum(seg, size))
            touch.append((ms, got == want))
            unmap_to_none(seg, size)
            _, ms = ms_of(lambda: map_memfd(fd, size, at=seg, populate=True))
            popul.append(ms)
            _, ms = ms_of(lambda: unmap_to_none(seg, size))
            undo.append(ms)
        b = map_memfd(fd, size, at=seg, populate=True)
    except OSError as e:
        print(f"  mmap at B: {e}")
        return
    print(f"  mmap 256 MiB at B {hex(b)} MAP_FIXED, pages populated already by A: ms {', '.join(f'{x:.3f}' for x in plain)}")
    print(f"    CPU's first read of all of B after it (faults): ms {', '.join(f'{x:.1f}' for x, _ in touch)} ({'right sums' if all(ok for _, ok in touch) else 'WRONG sum'})")
    print(f"  same with MAP_POPULATE: ms {', '.join(f'{x:.1f}' for x in popul)}")
    print(f"  PROT_NONE back over the populated B: ms {', '.join(f'{x:.1f}' for x in undo)}")
    print(f"  CPU reads via B: {verdict(host_sum(b, size), want)}")
    want = expected_sum(size, 5)
    fill_host(b, size, 5)
    step("CPU wrote i * 5 via B; kernel sum via A (still registered)", lambda: verdict(g.sum64(a, size), want))
    for name in ("PAGEABLE_MEMORY_ACCESS", "PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES", "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM", "HOST_REGISTER_SUPPORTED"):
        print(f"  device attribute {name}: {g.attr(name)}")
    print(f"  cuMemHostGetDevicePointer(B): {rname(cu.cuMemHostGetDevicePointer(b, 0)[0])}", flush=True)
    # Last: a kernel via the unregistered B (expected: an illegal address, which poisons the context).
    sys.stdout.flush()
    guard.cancel()
    guard = watchdog(20, "kernel via B (unregistered): synchronise")
    out = g.cp.zeros(1, dtype=g.cp.uint64)
    g.cp.cuda.Device(0).synchronize()
    t = time.perf_counter()
    try:
        g.mod.get_function("sum64")((g.sm * 4,), (256,), (g.cp.uint64(b), g.cp.uint64(size // 8), out))
        res = cu.cuCtxSynchronize()
        err = res[0] if isinstance(res, tuple) else res
        ms = 1e3 * (time.perf_counter() - t)
        if err == cu.CUresult.CUDA_SUCCESS:
            print(f"  kernel via B (mapped, not registered): CUDA_SUCCESS in {ms:.1f} ms, {verdict(int(out[0]), want)}")
        else:
            print(f"  kernel via B (mapped, not registered): {rname(err)} after {ms:.1f} ms")
    except Exception as e:
        print(f"  kernel via B (mapped, not registered): {type(e).__name__}: {e}")
    guard.cancel()
    sys.stdout.flush()
    os._exit(0)  # skip CuPy's teardown in a context that may be poisoned


TESTS = ["layout_in_cuda_range", "layout_per_chunk", "register_cost", "read_bw", "copy_bw", "dma_buf", "cpu_writes",
         "double_register", "register_while_launching", "remap_registered"]

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child_write":
        child_write(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) == 2:
        sys.stdout.reconfigure(line_buffering=True)  # what was printed survives a crash
        globals()["t_" + sys.argv[1]]()
    else:
        for t in sys.argv[1:] or TESTS:
            print(f"== {t}", flush=True)
            try:
                r = subprocess.run([sys.executable, __file__, t], capture_output=True, text=True, timeout=120)
            except subprocess.TimeoutExpired as e:
                out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                print(out.rstrip())
                print("  killed after 120 s")
                continue
            print(r.stdout.rstrip())
            if r.returncode:
                print(f"  exit {r.returncode}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
