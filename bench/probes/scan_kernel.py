#!/usr/bin/env python3
"""How fast does the scan kernel (uvm_scan_groups of kernels/segment.cu) run an SSB query?

Run on the GPU machine (Python with CuPy and cuda.bindings):

    python3 bench/probes/scan_kernel.py [--sf 10] [--runs 5] NAME=kernels/segment.cu [NAME=other.cu ...]

Each NAME=PATH[@N] is a version of segment.cu (@N: launched with N blocks per SM, not --per-sm's) (for example the one of another commit, from
`git show REV:kernels/segment.cu`), compiled by NVRTC as the extension compiles it (the device's
architecture, `--std=c++17 -default-device`). The probe lays out a column cache of lineorder's
nine cached columns as the extension does (crates/uvm_core/src/cache/mod.rs: blocks of 2^20 rows,
a 256-byte header with the block's row count, each column's values then its NULL bitmap, every
area 256-byte aligned) at SSB's cardinalities for the scale factor, with uniform keys; builds the
dimension tables as GpuJoin tables (tag mix(key ^ seed) | 1, linear probing: table.rs) after
their filters, with the payloads the node puts there (a nation, a year, a brand); and runs four
programs in the words of crates/uvm_core/src/scan/gpu.rs (`words`) as the service launches them:
launches of 16 Mi rows, 4 blocks of 256 threads per SM, one pass (SCAN_BOTH), the outcome words
cleared before and read after each launch.

  Q1.1  2 range filters, 1 join (date, year 1993), no keys, sum(extendedprice * discount)
  Q2.1  3 joins (part of one category, supplier of one region, date), keys year and brand
  Q3.1  3 joins (customer and supplier of one region, date 1992-1997), keys 3 payloads
  Q4.1  4 joins (customer, supplier of one region; part of two makers; date), sum(revenue - supplycost)

Every answer is checked against the same query computed with CuPy's array operations; a version
that differs is reported and its times are not. Prints per version the kernel's registers and
local memory, the blocks per SM that fit, and per query the best wall time of `--runs` (launches,
their waits and the outcome reads, as the service's scan: `scan::gpu::run`), the bytes of the
columns the query reads (values and NULL bitmaps) and those over the time. Versions alternate
per run, so that clock drift falls on all of them alike.
"""
import argparse
import math
import sys
import time

import cupy as cp
import numpy as np

U64 = np.uint64
MASK64 = (1 << 64) - 1
ALIGN = 256
BLOCK_ROWS = 1 << 20
LAUNCH_ROWS = 1 << 24
THREADS = 256


def align(x):
    return (x + ALIGN - 1) // ALIGN * ALIGN


def mix(z):
    """segment.cu's mix, on uint64 arrays (wrapping)."""
    z = np.asarray(z, dtype=U64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


# lineorder's cached columns: (name, width)
COLUMNS = [
    ("lo_orderdate", 4),
    ("lo_custkey", 4),
    ("lo_partkey", 4),
    ("lo_suppkey", 4),
    ("lo_quantity", 4),
    ("lo_discount", 4),
    ("lo_extendedprice", 8),
    ("lo_revenue", 8),
    ("lo_supplycost", 8),
]
COL = {name: i for i, (name, _) in enumerate(COLUMNS)}


class Cache:
    """lineorder's columns in the cache's block layout, in one device buffer."""

    def __init__(self, cols, rows):
        self.rows = rows
        self.n = BLOCK_ROWS
        self.blocks = (rows + self.n - 1) // self.n
        at = ALIGN  # the block header
        self.desc = []
        for _, w in COLUMNS:
            values_at = align(at)
            nulls_at = align(values_at + self.n * w)
            at = align(nulls_at + self.n // 8)
            self.desc.append((values_at, nulls_at, w, 1))
        self.stride = at
        self.buf = cp.zeros(self.blocks * self.stride, dtype=cp.uint8)
        view = self.buf.reshape(self.blocks, self.stride)
        counts = np.full(self.blocks, self.n, dtype=np.uint64)
        counts[-1] = rows - (self.blocks - 1) * self.n
        view[:, :8] = cp.asarray(counts.view(np.uint8).reshape(self.blocks, 8))
        for (name, w), (values_at, _, _, _) in zip(COLUMNS, self.desc):
            full = cp.zeros(self.blocks * self.n, dtype=cp.int32 if w == 4 else cp.int64)
            full[:rows] = cols[name]
            view[:, values_at:values_at + self.n * w] = full.view(cp.uint8).reshape(self.blocks, self.n * w)

    def words(self):
        out = []
        for d in self.desc:
            out.extend(d)
        return out

    def bytes_of(self, names):
        return sum(self.rows * w + self.rows // 8 for n, w in COLUMNS if n in names)


class Table:
    """A GpuJoin table of (key, payload) pairs on the device; its word for a program's join."""

    def __init__(self, keys, payloads, seed=0x5EED):
        keys = np.asarray(keys, dtype=np.int64)
        slots = max(16, 1 << math.ceil(math.log2(max(1, 2 * len(keys)))))
        mask = slots - 1
        tab = np.zeros((slots, 3), dtype=np.uint64)
        tags = mix(keys.view(U64) ^ U64(seed)) | U64(1)
        for k, p, t in zip(keys.tolist(), np.asarray(payloads, dtype=np.int64).tolist(), tags.tolist()):
            i = t & mask
            while tab[i, 0] != 0:
                i = (i + 1) & mask
            tab[i] = (t, k & MASK64, p & MASK64)
        occupied = tab[:, 0] != 0
        run = longest = 0
        for o in np.concatenate([occupied, occupied]).tolist():
            run = run + 1 if o else 0
            longest = max(longest, run)
        self.dev = cp.asarray(tab)
        self.mask, self.seed, self.bound = mask, seed, min(longest, slots) + 1

    def word(self, col):
        return [COL[col], self.dev.data.ptr, self.mask, self.seed, self.bound]


def program(cache, filters, joins, keys, aggs):
    """segment.cu's program words (scan/gpu.rs, `words`)."""
    cols = cache.words()
    fw = []
    for col, lo, hi in filters:  # ranges only
        fw.extend([COL[col] | 1 << 32, lo & MASK64, hi & MASK64, 0])
    jw = []
    for table, col in joins:
        jw.extend(table.word(col))
    kw = [2 << 32 | j for j in keys]  # join payloads
    aw = []
    for kind, ik, a, b in aggs:
        aw.extend([kind | ik << 16, COL[a] | (COL[b] if b else 0) << 32])
    head = 14
    at = [head, head + len(cols)]
    at.append(at[1] + len(fw))  # steps (none)
    at.append(at[2])  # joins
    at.append(at[3] + len(jw))  # keys
    at.append(at[4] + len(kw))  # aggs
    at.append(at[5] + len(aw))  # data
    w = [len(filters), len(joins), len(keys), len(aggs), len(COLUMNS), 0, 0] + at
    return cp.asarray(np.array([x & MASK64 for x in w + cols + fw + jw + kw + aw], dtype=np.uint64))


class Query:
    def __init__(self, name, cache, filters, joins, keys, aggs, max_groups, reads, expect):
        self.name, self.prog, self.keys, self.kinds = name, program(cache, filters, joins, keys, aggs), keys, [a[0] for a in aggs]
        self.key_words = len(keys) + 1
        self.slot_words = 1 + self.key_words + 2 * len(aggs)
        self.slots = max(1024, 1 << math.ceil(math.log2(2 * max_groups)))
        self.table = cp.zeros(self.slots * self.slot_words, dtype=cp.uint64)
        self.count = cp.zeros(1, dtype=cp.uint64)
        self.bytes = cache.bytes_of(reads)
        self.expect = expect

    def answer(self):
        t = self.table.get().reshape(self.slots, self.slot_words)
        got = {}
        for row in t[t[:, 0] != 0]:
            key = tuple(int(x) for x in row[1:1 + len(self.keys)])
            states = []
            for i, kind in enumerate(self.kinds):
                lo, hi = int(row[1 + self.key_words + 2 * i]), int(row[2 + self.key_words + 2 * i])
                if kind == 3:  # an i128
                    v = lo + (hi << 64)
                    states.append(v - (1 << 128) if v >= 1 << 127 else v)
                else:  # a count, or an integer min/max
                    states.append(lo - (1 << 64) if kind in (4, 5) and lo >= 1 << 63 else lo)
            got[key] = states[0] if len(states) == 1 else tuple(states)
        return got


def run(kernel, cache, q, grid):
    q.table.fill(0)
    q.count.fill(0)
    out = cp.zeros(6, dtype=cp.uint64)
    per = LAUNCH_ROWS // cache.n
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    first = 0
    while first < cache.blocks:
        count = min(per, cache.blocks - first)
        out.fill(0)
        args = (
            q.prog, cp.uint64(cache.buf.data.ptr + first * cache.stride), cp.uint64(cache.n), cp.uint64(count),
            cp.uint64(cache.stride), cp.uint64(0), q.table, cp.uint64(q.slots - 1), cp.uint64(0x1234),
            cp.uint64(q.key_words), cp.uint64(q.slot_words), q.count, cp.uint64(q.slots // 2), cp.uint64(2), out,
        )
        kernel((grid,), (THREADS,), args)
        o = out.get()
        if o[0] or o[1] or o[2] or o[3] or o[5]:
            raise RuntimeError(f"{q.name}: outcome words {o.tolist()}")
        first += count
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--per-sm", type=int, default=4, help="blocks of 256 threads per SM (the extension's: 4)")
    ap.add_argument("--queries", default="", help="the queries to run, by name, comma-separated (default: all)")
    ap.add_argument("versions", nargs="+")
    a = ap.parse_args()
    dev = cp.cuda.Device(0)
    sms = dev.attributes["MultiProcessorCount"]
    grid = sms * a.per_sm
    rng = cp.random.default_rng(42)
    rows = 6_000_000 * a.sf
    ncust, nsupp, npart = 30_000 * a.sf, 2_000 * a.sf, 200_000 * (1 + int(math.log2(a.sf)))
    days = np.arange(np.datetime64("1992-01-01"), np.datetime64("1992-01-01") + 2556)
    ymd = np.array([int(str(d).replace("-", "")) for d in days], dtype=np.int64)
    years = ymd // 10000
    t0 = time.perf_counter()
    cols = {
        "lo_orderdate": cp.asarray(ymd)[rng.integers(0, len(ymd), rows)].astype(cp.int32),
        "lo_custkey": rng.integers(1, ncust + 1, rows, dtype=cp.int32),
        "lo_partkey": rng.integers(1, npart + 1, rows, dtype=cp.int32),
        "lo_suppkey": rng.integers(1, nsupp + 1, rows, dtype=cp.int32),
        "lo_quantity": rng.integers(1, 51, rows, dtype=cp.int32),
        "lo_discount": rng.integers(0, 11, rows, dtype=cp.int32),
        "lo_extendedprice": rng.integers(90_000, 10_000_000, rows, dtype=cp.int64),
        "lo_supplycost": rng.integers(60_000, 6_000_000, rows, dtype=cp.int64),
    }
    cols["lo_revenue"] = cols["lo_extendedprice"] * (100 - cols["lo_discount"].astype(cp.int64)) // 100
    cache = Cache(cols, rows)
    hrng = np.random.default_rng(7)
    c_nation = hrng.integers(0, 25, ncust + 1)
    s_nation = hrng.integers(0, 25, nsupp + 1)
    p_mfgr = hrng.integers(1, 6, npart + 1)
    p_cat = p_mfgr * 10 + hrng.integers(1, 6, npart + 1)
    p_brand = p_cat * 100 + hrng.integers(1, 41, npart + 1)
    ck, sk, pk = np.arange(1, ncust + 1), np.arange(1, nsupp + 1), np.arange(1, npart + 1)

    def lookup(keys, pay, size):
        """payload per key (-1: filtered out), as a device array indexed by key."""
        a = np.full(size + 1, -1, dtype=np.int64)
        a[keys] = pay
        return cp.asarray(a)

    dlook = lambda m: lookup(ymd[m] - 19920101, years[m], 19990101 - 19920101)
    od = cols["lo_orderdate"].astype(cp.int64) - 19920101

    def grouped(mask, keys, value):
        """{key tuple: sum of value} over the rows of mask (on the host: exact integers)."""
        v = value[mask].get().astype(np.int64)
        if not keys:
            return {(): int(v.sum())}
        ks = np.stack([k[mask].get() for k in keys], axis=1)
        uniq, inv = np.unique(ks, axis=0, return_inverse=True)
        sums = np.zeros(len(uniq), dtype=np.int64)
        np.add.at(sums, inv.ravel(), v)
        return {tuple(u): int(x) for u, x in zip(uniq.tolist(), sums.tolist())}

    m1 = years == 1993
    date93 = Table(ymd[m1], np.zeros(m1.sum()))
    d93 = dlook(m1)[od] >= 0
    mq1 = d93 & (cols["lo_discount"] >= 1) & (cols["lo_discount"] <= 3) & (cols["lo_quantity"] <= 24)
    q11m = Query("Q1.1 (4 aggregates)", cache, [("lo_discount", 1, 3), ("lo_quantity", -(1 << 63), 24)],
                 [(date93, "lo_orderdate")], [],
                 [(1, 0, "lo_quantity", None), (4, 1, "lo_extendedprice", None), (5, 1, "lo_revenue", None),
                  (3, 1, "lo_revenue", None)], 1,
                 ["lo_orderdate", "lo_quantity", "lo_discount", "lo_extendedprice", "lo_revenue"],
                 {(): (int(mq1.sum()), int(cols["lo_extendedprice"][mq1].min()), int(cols["lo_revenue"][mq1].max()),
                       int(cols["lo_revenue"][mq1].sum()))})
    q11 = Query("Q1.1", cache, [("lo_discount", 1, 3), ("lo_quantity", -(1 << 63), 24)], [(date93, "lo_orderdate")], [],
                [(3, 3, "lo_extendedprice", "lo_discount")], 1,
                ["lo_orderdate", "lo_quantity", "lo_discount", "lo_extendedprice"],
                grouped(mq1, [], cols["lo_extendedprice"] * cols["lo_discount"].astype(cp.int64)))

    date_all = Table(ymd, years)
    dyear = dlook(np.ones(len(ymd), dtype=bool))[od]
    m = p_cat[pk] == 12
    part12 = Table(pk[m], p_brand[pk][m])
    pb = lookup(pk[m], p_brand[pk][m], npart)[cols["lo_partkey"]]
    m = s_nation[sk] // 5 == 1
    supp_am = Table(sk[m], np.zeros(m.sum()))
    sam = lookup(sk[m], np.zeros(m.sum()), nsupp)[cols["lo_suppkey"]] >= 0
    q21_reads = ["lo_partkey", "lo_suppkey", "lo_orderdate", "lo_revenue"]
    q21 = Query("Q2.1", cache, [], [(part12, "lo_partkey"), (supp_am, "lo_suppkey"), (date_all, "lo_orderdate")], [2, 0],
                [(3, 1, "lo_revenue", None)], 7 * 40, q21_reads,
                grouped((pb >= 0) & sam, [dyear, pb], cols["lo_revenue"]))

    m = c_nation[ck] // 5 == 2
    cust_as = Table(ck[m], c_nation[ck][m])
    cn = lookup(ck[m], c_nation[ck][m], ncust)[cols["lo_custkey"]]
    m = s_nation[sk] // 5 == 2
    supp_as = Table(sk[m], s_nation[sk][m])
    sn = lookup(sk[m], s_nation[sk][m], nsupp)[cols["lo_suppkey"]]
    m = (years >= 1992) & (years <= 1997)
    date_9297 = Table(ymd[m], years[m])
    dy = dlook(m)[od]
    q31_reads = ["lo_custkey", "lo_suppkey", "lo_orderdate", "lo_revenue"]
    q31 = Query("Q3.1", cache, [], [(cust_as, "lo_custkey"), (supp_as, "lo_suppkey"), (date_9297, "lo_orderdate")], [0, 1, 2],
                [(3, 1, "lo_revenue", None)], 25 * 25 * 7, q31_reads,
                grouped((cn >= 0) & (sn >= 0) & (dy >= 0), [cn, sn, dy], cols["lo_revenue"]))

    m = c_nation[ck] // 5 == 1
    cust_am = Table(ck[m], c_nation[ck][m])
    cna = lookup(ck[m], c_nation[ck][m], ncust)[cols["lo_custkey"]]
    m = (p_mfgr[pk] == 1) | (p_mfgr[pk] == 2)
    part12m = Table(pk[m], np.zeros(m.sum()))
    pm = lookup(pk[m], np.zeros(m.sum()), npart)[cols["lo_partkey"]] >= 0
    q41 = Query("Q4.1", cache, [], [(cust_am, "lo_custkey"), (supp_am, "lo_suppkey"), (part12m, "lo_partkey"),
                                    (date_all, "lo_orderdate")], [3, 0],
                [(3, 2, "lo_revenue", "lo_supplycost")], 7 * 25,
                ["lo_custkey", "lo_suppkey", "lo_partkey", "lo_orderdate", "lo_revenue", "lo_supplycost"],
                grouped((cna >= 0) & sam & pm, [dyear, cna], cols["lo_revenue"] - cols["lo_supplycost"]))
    # The same joins in other orders, and Q3.1 without its keys: what the join order and the
    # grouping cost (the node orders a program's joins by the share of rows each lets pass).
    q21d = Query("Q2.1 (date first)", cache, [], [(date_all, "lo_orderdate"), (part12, "lo_partkey"), (supp_am, "lo_suppkey")],
                 [0, 1], [(3, 1, "lo_revenue", None)], 7 * 40, q21_reads, q21.expect)
    q31d = Query("Q3.1 (date first)", cache, [], [(date_9297, "lo_orderdate"), (cust_as, "lo_custkey"), (supp_as, "lo_suppkey")],
                 [1, 2, 0], [(3, 1, "lo_revenue", None)], 25 * 25 * 7, q31_reads, q31.expect)
    q31n = Query("Q3.1 (no keys)", cache, [], [(cust_as, "lo_custkey"), (supp_as, "lo_suppkey"), (date_9297, "lo_orderdate")], [],
                 [(3, 1, "lo_revenue", None)], 1, q31_reads,
                 grouped((cn >= 0) & (sn >= 0) & (dy >= 0), [], cols["lo_revenue"]))
    queries = [q11, q11m, q21, q21d, q31, q31d, q31n, q41]
    if a.queries:
        queries = [q for q in queries if q.name in a.queries.split(",")]
    print(f"# SF {a.sf}: {rows} rows, cache {cache.buf.nbytes / 1e6:.0f} MB; data and references in "
          f"{time.perf_counter() - t0:.1f} s; {dev.compute_capability}, {sms} SMs, grid {grid} x {THREADS}")

    kernels = {}
    for v in a.versions:
        name, path = v.split("=", 1)
        path, _, per_sm = path.partition("@")
        vgrid = sms * int(per_sm) if per_sm else grid
        src = open(path).read()
        t = time.perf_counter()
        k = cp.RawKernel(src, "uvm_scan_groups", options=("--std=c++17", "-default-device"))
        k.compile()
        took = time.perf_counter() - t
        at = k.attributes
        try:
            from cuda.bindings import driver as cu
            err, fit = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(cu.CUfunction(k.kernel.ptr), THREADS, 0)
            fit = fit if err == cu.CUresult.CUDA_SUCCESS else f"? ({err})"
        except Exception as e:  # noqa: BLE001 (a probe: say why, go on)
            fit = f"? ({e})"
        print(f"# {name} ({path}): compiled in {took:.1f} s; {at.get('num_regs')} registers, "
              f"{at.get('local_size_bytes')} B local, {fit} blocks of {THREADS} per SM fit")
        kernels[name] = (vgrid, k)

    best = {(n, q.name): math.inf for n in kernels for q in queries}
    wrong = set()
    for r in range(a.runs + 1):
        for q in queries:
            for n, (vgrid, k) in kernels.items():
                s = run(k, cache, q, vgrid)
                if r == 0:
                    got = q.answer()
                    if got != q.expect:
                        wrong.add((n, q.name))
                        diff = [(key, got.get(key), q.expect.get(key)) for key in set(got) | set(q.expect)
                                if got.get(key) != q.expect.get(key)][:3]
                        print(f"# {n} {q.name}: WRONG ANSWER ({len(got)} groups, {len(q.expect)} expected; {diff})")
                    continue
                best[(n, q.name)] = min(best[(n, q.name)], s)
    names = list(kernels)
    print()
    print("| query | groups | columns read (MB) | " + " | ".join(f"{n} (ms) | {n} GB/s" for n in names)
          + (f" | {names[-1]} / {names[0]}" if len(names) > 1 else "") + " |")
    print("|---|---:|---:|" + "---:|---:|" * len(names) + ("---:|" if len(names) > 1 else ""))
    for q in queries:
        cells = []
        for n in names:
            if (n, q.name) in wrong:
                cells += ["wrong", "-"]
            else:
                s = best[(n, q.name)]
                cells += [f"{s * 1e3:.3f}", f"{q.bytes / s / 1e9:.0f}"]
        ratio = ""
        if len(names) > 1:
            a0, a1 = best[(names[0], q.name)], best[(names[-1], q.name)]
            ratio = " | -" if {(names[0], q.name), (names[-1], q.name)} & wrong else f" | {a1 / a0:.2f}"
        print(f"| {q.name} | {len(q.expect)} | {q.bytes / 1e6:.0f} | " + " | ".join(cells) + ratio + " |")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
