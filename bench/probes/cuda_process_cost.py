#!/usr/bin/env python3
"""What a fresh process pays for CUDA, as a PostgreSQL parallel worker does: N processes forked
at once (from a parent that never touched CUDA) each time cuInit, the primary context, a small
allocation and a kernel-free sync, then exit; the parent times each child from fork to its
"ready" message, and from "done" to waitpid (the exit, where the driver tears the context down).

Run on a GPU machine: python3 bench/probes/cuda_process_cost.py [N ...]   (default 1 5 8)
Prints one line per N with medians and maxima in ms.
"""
import os, sys, time


def child(w):
    from cuda.bindings import driver as cu
    t0 = time.perf_counter()
    cu.cuInit(0)
    t1 = time.perf_counter()
    _, dev = cu.cuDeviceGet(0)
    _, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    cu.cuCtxSetCurrent(ctx)
    t2 = time.perf_counter()
    _, p = cu.cuMemAlloc(1 << 20)
    cu.cuCtxSynchronize()
    t3 = time.perf_counter()
    os.write(w, f"{(t1-t0)*1e3:.1f} {(t2-t1)*1e3:.1f} {(t3-t2)*1e3:.1f}\n".encode())
    os.close(w)
    os._exit(0) if os.environ.get("PROBE_UNDERSCORE_EXIT") else sys.exit(0)


def run(n):
    kids = []
    t_fork = time.perf_counter()
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(w)
        os.close(w)
        kids.append((pid, r))
    rows, exits = [], []
    for pid, r in kids:
        line = os.read(r, 200).decode().split()
        t_ready = time.perf_counter()
        os.waitpid(pid, 0)
        exits.append((time.perf_counter() - t_ready) * 1e3)
        rows.append([float(x) for x in line] + [(t_ready - t_fork) * 1e3])
    med = lambda xs: sorted(xs)[len(xs) // 2]
    cols = list(zip(*rows))
    print(f"N={n}: cuInit {med(cols[0]):.0f}/{max(cols[0]):.0f} ms, context {med(cols[1]):.0f}/{max(cols[1]):.0f} ms, "
          f"first alloc+sync {med(cols[2]):.0f}/{max(cols[2]):.0f} ms, fork->ready {med(cols[3]):.0f}/{max(cols[3]):.0f} ms, "
          f"exit (ready->reaped) {med(exits):.0f}/{max(exits):.0f} ms   (median/max)", flush=True)


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [1, 5, 8]:
        run(n)
