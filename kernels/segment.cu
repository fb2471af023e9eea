// Kernels over a range of a shared segment. Compiled at run time by NVRTC for the device's
// architecture (crates/uvm_core/src/gpu/), so the extension builds without a CUDA toolkit.
//
// The definitions must match the CPU ones in crates/uvm_core/src/checksum.rs exactly:
//   checksum = sum over words i of mix(w[i] ^ (i * GOLDEN))   (mod 2^64)
//   fill:      byte j = byte (j % 8) of mix(seed + j / 8), little-endian
// where w[i] is the little-endian 64-bit word at byte 8i of the range (the last one
// zero-padded). A range may start at any byte: aligned ranges use 8-byte loads, others bytes.
//
// Kernels read across chunk boundaries freely (the chunks are mapped contiguously); only the
// driver's memcpy/memset calls must stay inside one chunk.

typedef unsigned long long u64;
typedef unsigned char u8;
typedef unsigned int u32;

#define GOLDEN 0x9E3779B97F4A7C15ull

__device__ __forceinline__ u64 mix(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ u64 load_word(const u8 *p, u64 i, u64 len, bool aligned) {
    u64 at = i * 8;
    if (aligned && at + 8 <= len) {
        return ((const u64 *)p)[i];
    }
    u64 w = 0;
    for (int k = 0; k < 8 && at + k < len; k++) {
        w |= ((u64)p[at + k]) << (8 * k);
    }
    return w;
}

extern "C" __global__ void uvm_checksum(const u8 *p, u64 len, u64 *out) {
    u64 words = (len + 7) / 8;
    bool aligned = (((u64)p) & 7) == 0;
    u64 sum = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x) {
        sum += mix(load_word(p, i, len, aligned) ^ (i * GOLDEN));
    }
    // warp reduction, then one atomic per warp
    for (int off = 16; off > 0; off >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, off);
    }
    if ((threadIdx.x & 31) == 0 && sum != 0) {
        atomicAdd(out, sum);
    }
}

extern "C" __global__ void uvm_fill(u8 *p, u64 len, u64 seed) {
    u64 words = (len + 7) / 8;
    bool aligned = (((u64)p) & 7) == 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x) {
        u64 v = mix(seed + i);
        u64 at = i * 8;
        if (aligned && at + 8 <= len) {
            ((u64 *)p)[i] = v;
        } else {
            for (int k = 0; k < 8 && at + k < len; k++) {
                p[at + k] = (u8)(v >> (8 * k));
            }
        }
    }
}

// Read bandwidth probe: sums 16-byte vectors (used by the benchmarks, not by SQL).
extern "C" __global__ void uvm_read_bw(const ulonglong2 *p, u64 n, u64 *out) {
    u64 s = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        ulonglong2 v = p[i];
        s += v.x ^ v.y;
    }
    for (int off = 16; off > 0; off >>= 1) {
        s += __shfl_down_sync(0xffffffffu, s, off);
    }
    if ((threadIdx.x & 31) == 0 && s == 0x12345) {
        atomicAdd(out, s); // practically never: keeps the loads alive
    }
}

// ---- GpuJoin (crates/uvm_core/src/gpujoin/table.rs has the layout) ----
// A slot: tag (0 = empty, else mix(key ^ seed) | 1), key, payload; 24 bytes.
struct Slot { u64 tag; long long key; long long payload; };

// The table's slots are untrusted (any process may overwrite the segment): every walk along a
// probe chain stops after mask + 1 (= slot_count) steps, as the CPU's does (table.rs). A walk
// that reaches the bound counts one in *bad, which the host reads back and turns into an ERROR
// (22023, "is corrupted"); so that a corrupted table does not keep every thread walking its
// whole bound, the walks look at *bad every BAD_POLL steps and give up once it is set.
#define BAD_POLL 4096ull

// Steps one thread walks along chains in one launch, at most (summed over its keys): a launch
// then reads at most threads x WALK_BUDGET slots (135 K threads on the H200: about 13 GB, a few
// milliseconds) whatever the table holds, and the host checks for interrupts between launches,
// so a cancel or statement_timeout is answered in milliseconds even over a corrupted table of
// 2^30 slots, whose walks take many launches. A thread out of budget saves where it stopped in
// its per-thread state (`resume`) and sets the launch's `more` word; the host launches again
// with fresh = 0 (the first launch of a batch has fresh = 1) and the same grid, and the walk
// goes on. A healthy table's chains are short: its batches take one launch.
#ifndef WALK_BUDGET
#define WALK_BUDGET 4096ull
#endif
// The walk-state word of a thread with no walk in progress.
#define NO_WALK (~0ull)

__device__ __forceinline__ bool gave_up(const u64 *bad, u64 step) {
    return (step & (BAD_POLL - 1)) == 0 && step != 0 && *(volatile const u64 *)bad != 0ull;
}

// A column of `blocks` blocks of up to n rows each, `stride` bytes apart: row g is row g % n of
// block g / n, a value of `width` bytes (2, 4 or 8: a signed integer, sign-extended) at
// values + block * stride + row * width, NULL where bit row % 8 of byte row / 8 of its bitmap
// (nulls + block * stride) is set (nulls null: no NULLs). Staged keys and payloads are one block
// of 8-byte words without a bitmap; a column cache's blocks are read in place (its layout:
// crates/uvm_core/src/cache), each block starting with its row count at headers + block *
// stride (headers null: every block holds n rows). That count is untrusted: one above n makes
// the block's rows no rows and sets *bad (the host raises an ERROR); rows past it are no rows.
__device__ __forceinline__ long long column_value(const u8 *v, u64 width, u64 r) {
    if (width == 8ull) return ((const long long *)v)[r];
    if (width == 4ull) return (long long)((const int *)v)[r];
    return (long long)((const short *)v)[r];
}

__device__ __forceinline__ bool column_null(const u8 *nulls, u64 off, u64 r) {
    return nulls != 0 && ((nulls[off + (r >> 3)] >> (r & 7ull)) & 1u) != 0;
}

// Where row g lies: the block's byte offset and the row in it; false where it is no row.
__device__ __forceinline__ bool locate(u64 g, u64 n, u64 stride, const u8 *headers, u64 *bad, u64 *off, u64 *r) {
    u64 b = g / n;
    *r = g - b * n;
    *off = b * stride;
    if (headers == 0) return true;
    u64 count = *(const u64 *)(headers + *off);
    if (count > n) {
        if (*(volatile u64 *)bad == 0ull) atomicExch(bad, 1ull);
        return false;
    }
    return *r < count;
}

// Inserts the rows of a column of keys and one of payloads (the same blocks: see above;
// payload_width 0: no payloads, every payload 0) into the table. Rows whose key is NULL are
// left out and counted in out[3]; a NULL payload is stored as 0 and counted in out[2]; rows
// placed are counted in out[5]. A row that finds no empty slot within mask + 1 steps is left
// out and counted in out[0]; out[1] is set when a thread ran out of its walk budget (launch
// again, fresh = 0); out[4] when a block's count was above n. resume: 3 words per thread: next
// row index, slot index and steps of the walk in progress (NO_WALK: none).
extern "C" __global__ void uvm_join_build(Slot *slots, u64 mask, u64 seed, const u8 *keys, u64 key_width,
                                          const u8 *key_nulls, const u8 *payloads, u64 payload_width,
                                          const u8 *payload_nulls, u64 n, u64 blocks, u64 block_stride,
                                          const u8 *headers, u64 *resume, u64 fresh, u64 *out) {
    u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 total = n * blocks;
    u64 *state = resume + 3 * tid;
    u64 g = fresh ? tid : state[0];
    u64 i = fresh ? 0ull : state[1];
    u64 step = fresh ? NO_WALK : state[2];
    u64 budget = WALK_BUDGET;
    bool more = false;
    u64 null_keys = 0, null_payloads = 0, placed_rows = 0;
    for (; g < total; g += stride) {
        u64 off, r;
        if (!locate(g, n, block_stride, headers, &out[4], &off, &r)) {
            step = NO_WALK; // (no walk is ever in progress here, unless the count changed)
            continue;
        }
        if (step == NO_WALK && column_null(key_nulls, off, r)) {
            null_keys++;
            continue;
        }
        long long k = column_value(keys + off, key_width, r);
        u64 t = mix((u64)k ^ seed) | 1ull;
        if (step == NO_WALK) {
            i = t & mask;
            step = 0;
        }
        // claim an empty slot; key and payload are written by the claimer before any probe runs
        bool placed = false;
        for (; step <= mask; step++) {
            if (budget == 0ull) {
                more = true;
                break;
            }
            budget--;
            if (gave_up(&out[0], step)) break;
            if (atomicCAS(&slots[i].tag, 0ull, t) == 0ull) {
                placed = true;
                break;
            }
            i = (i + 1) & mask;
        }
        if (more) break;
        step = NO_WALK;
        if (!placed) {
            atomicAdd(&out[0], 1ull);
            continue;
        }
        long long p = 0;
        if (payload_width != 0ull) {
            if (column_null(payload_nulls, off, r)) {
                null_payloads++;
            } else {
                p = column_value(payloads + off, payload_width, r);
            }
        }
        slots[i].key = k;
        slots[i].payload = p;
        placed_rows++;
    }
    state[0] = g;
    state[1] = i;
    state[2] = step;
    if (more) atomicExch(&out[1], 1ull);
    if (null_payloads != 0ull) atomicAdd(&out[2], null_payloads);
    if (null_keys != 0ull) atomicAdd(&out[3], null_keys);
    if (placed_rows != 0ull) atomicAdd(&out[5], placed_rows);
}

// Exact payload sums: each payload is split into its signed high and unsigned low 32 bits,
// summed apart in 64 bits (exact up to 2^32 matches per batch), and recombined in 128 bits on
// the host: sum = hi * 2^32 + lo.
__device__ __forceinline__ void add_payload(u64 &lo, long long &hi, long long p) {
    lo += (u64)(unsigned int)p;
    hi += p >> 32;
}

__device__ __forceinline__ void warp_add(u64 *out, u64 v) {
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, off);
    }
    if ((threadIdx.x & 31) == 0 && v != 0) {
        atomicAdd(out, v);
    }
}

// Probes the keys of a column (as for uvm_join_build: NULL keys match nothing); adds the matches
// and the payload sum (lo, hi as above) to out[0..3], and the keys whose chain had no empty
// slot within mask + 1 steps to out[3] (a corrupted table); sets out[4] when a thread ran out
// of its walk budget (launch again, fresh = 0: the sums go on adding up), out[5] when a
// block's count was above n, out[6] when the launch's blocks are not whole warps of at most
// PROBE_WARPS (nothing probed).
//
// A warp probes a tile of PROBE_TILE consecutive rows of one block at a time (tiles t, t +
// warps, ...), from its part of shared memory, where the tile's keys and NULL bitmap were copied
// 16 bytes a piece with asynchronous copies (`cp.async`: no registers held, every piece in
// flight at once), and the block's count with one load; each lane probes rows lane, lane + 32,
// ... of the tile. Two buffers a warp: the next tile's copies are issued before the present
// tile is probed, so a warp's loads overlap its own probing (on an H100, 4.25 ms to 2.87 ms for
// 50 M keys from device memory: bench/probes/host_probe.py). Row by row, a thread's count, NULL
// bit and key were dependent 8-byte loads, and a cache's host-tier part was read over the host
// link at 2.7 GB/s on an H100; tiles read it at 31-32 GB/s, about what any kernel reads there
// (34.7 GB/s, bench/probes/zero_copy_ceiling.py). The tile's room is read whatever the count
// says (a block holds n rows' room; staged keys are one block of n).
//
// Resume: a lane out of budget keeps its walk and stops; the others finish the tile; then, if
// any lane of the warp stopped (__any_sync), every lane saves (tile << 5 | its next row of the
// tile, PROBE_LANE_ROWS when done; slot; steps), waits for its copies in flight, and the warp
// leaves. The next launch loads that tile again and each lane goes on from its row. A warp that
// finished saves a tile past the last.
#define PROBE_TILE 256ull
#define PROBE_LANE_ROWS 8u
#define PROBE_WARPS 8u
#define PROBE_PIECES (PROBE_TILE * 8ull / 16ull / 32ull)
// A lane's asynchronous 16-byte copy from global to shared memory (`cp.async`, sm_80 and later:
// the bytes go to shared memory without a register, and the lane goes on), its commit groups and
// the waits for them. Elsewhere (older GPUs; tests/kernel_emu, where __CUDA_ARCH__ is not
// defined) the copy is a plain load and store, done when it returns, and the rest is nothing.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void copy16_async(void *dst, const void *src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most the last committed group is in flight.
__device__ __forceinline__ void async_wait_but_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
#else
__device__ __forceinline__ void copy16_async(void *dst, const void *src) {
    *(ulonglong2 *)dst = *(const ulonglong2 *)src;
}
__device__ __forceinline__ void async_commit() {}
__device__ __forceinline__ void async_wait_but_one() {}
__device__ __forceinline__ void async_wait_all() {}
#endif
// Issues the copies of tile t's whole 16s (keys, bitmap) into buffer `kb16`/`nb16` (nothing if t
// is past the last), and one commit group for them (empty groups keep the count regular).
__device__ __forceinline__ void tile_fetch(u64 t, u64 tiles, u64 tiles_per_block, u64 n, u64 block_stride,
                                           const u8 *keys, u64 key_width, const u8 *key_nulls, unsigned lane,
                                           ulonglong2 *kb16, ulonglong2 *nb16) {
    if (t < tiles) {
        u64 b = t / tiles_per_block;
        u64 row0 = (t - b * tiles_per_block) * PROBE_TILE;
        u64 off = b * block_stride;
        u64 room = n - row0 < PROBE_TILE ? n - row0 : PROBE_TILE;
        u64 bytes = room * key_width, nbytes = (room + 7ull) / 8ull;
        const ulonglong2 *src = (const ulonglong2 *)(keys + off + row0 * key_width);
#pragma unroll
        for (unsigned j = 0; j < PROBE_PIECES; j++) {
            u64 c = lane + 32u * j;
            if (c * 16ull + 16ull <= bytes) copy16_async(&kb16[c], &src[c]);
        }
        if (key_nulls != 0 && lane < PROBE_TILE / 8ull / 16ull && lane * 16ull + 16ull <= nbytes)
            copy16_async(&nb16[lane], (const ulonglong2 *)(key_nulls + off + row0 / 8ull) + lane);
    }
    async_commit();
}
extern "C" __global__ void uvm_join_probe(const Slot *slots, u64 mask, u64 seed, const u8 *keys, u64 key_width,
                                          const u8 *key_nulls, u64 n, u64 blocks, u64 block_stride,
                                          const u8 *headers, u64 *resume, u64 fresh, u64 *out) {
    __shared__ ulonglong2 tile_keys[2][PROBE_WARPS][PROBE_TILE * 8ull / 16ull];
    __shared__ ulonglong2 tile_nulls[2][PROBE_WARPS][PROBE_TILE / 8ull / 16ull];
    if ((blockDim.x & 31u) != 0u || blockDim.x > 32u * PROBE_WARPS) {
        if (threadIdx.x == 0) atomicExch(&out[6], 1ull);
        return;
    }
    const unsigned lane = threadIdx.x & 31u, w = threadIdx.x >> 5;
    u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    u64 tiles_per_block = (n + PROBE_TILE - 1ull) / PROBE_TILE;
    u64 tiles = tiles_per_block * blocks;
    u64 *state = resume + 3 * tid;
    u64 t = fresh ? tid >> 5 : state[0] >> 5;
    unsigned k = fresh ? 0u : (unsigned)(state[0] & 31ull);
    u64 i = fresh ? 0ull : state[1];
    u64 step = fresh ? NO_WALK : state[2];
    u64 budget = WALK_BUDGET;
    bool more = false, stopped = false;
    u64 matches = 0, lo = 0;
    long long hi = 0;
    unsigned cur = 0;
    tile_fetch(t, tiles, tiles_per_block, n, block_stride, keys, key_width, key_nulls, lane, tile_keys[0][w],
               tile_nulls[0][w]);
    for (; t < tiles; t += warps) {
        // The next tile's copies go out before this one is probed.
        tile_fetch(t + warps, tiles, tiles_per_block, n, block_stride, keys, key_width, key_nulls, lane,
                   tile_keys[cur ^ 1u][w], tile_nulls[cur ^ 1u][w]);
        u64 b = t / tiles_per_block;
        u64 row0 = (t - b * tiles_per_block) * PROBE_TILE;
        u64 off = b * block_stride;
        u64 room = n - row0 < PROBE_TILE ? n - row0 : PROBE_TILE;
        u64 bytes = room * key_width, nbytes = (room + 7ull) / 8ull;
        const u8 *src = keys + off + row0 * key_width;
        const u8 *nsrc = key_nulls != 0 ? key_nulls + off + row0 / 8ull : 0;
        u64 count = headers == 0 ? n : *(const u64 *)(headers + off);
        u8 *kb = (u8 *)tile_keys[cur][w];
        u8 *nb = (u8 *)tile_nulls[cur][w];
        async_wait_but_one(); // this tile's group is done; the next one's may still fly
        for (u64 x = (bytes & ~15ull) + lane; x < bytes; x += 32ull) kb[x] = src[x];
        if (key_nulls != 0) {
            for (u64 x = (nbytes & ~15ull) + lane; x < nbytes; x += 32ull) nb[x] = nsrc[x];
        }
        __syncwarp();
        if (count > n) {
            if (lane == 0 && *(volatile u64 *)&out[5] == 0ull) atomicExch(&out[5], 1ull);
            k = PROBE_LANE_ROWS; // (the block's rows are no rows)
            step = NO_WALK;
        }
        bool broken = false;
        for (; k < PROBE_LANE_ROWS; k++) {
            u64 rt = (u64)k * 32ull + lane;
            if (rt >= room || row0 + rt >= count) {
                step = NO_WALK; // (no walk is ever in progress here, unless the count changed)
                continue;
            }
            if (step == NO_WALK && key_nulls != 0 && ((nb[rt >> 3] >> (rt & 7ull)) & 1u) != 0) continue;
            long long key = column_value(kb, key_width, rt);
            u64 tg = mix((u64)key ^ seed) | 1ull;
            if (step == NO_WALK) {
                i = tg & mask;
                step = 0;
            }
            bool ended = false;
            for (; step <= mask; step++) {
                if (budget == 0ull) {
                    more = true;
                    break;
                }
                budget--;
                if (gave_up(&out[3], step)) break;
                u64 st = slots[i].tag;
                if (st == 0ull) {
                    ended = true;
                    break;
                }
                if (st == tg && slots[i].key == key) {
                    matches++;
                    add_payload(lo, hi, slots[i].payload);
                }
                i = (i + 1) & mask;
            }
            if (more) break;
            step = NO_WALK;
            if (!ended) {
                atomicAdd(&out[3], 1ull);
                broken = true; // the host raises an ERROR: no need to probe this lane's other keys
                break;
            }
        }
        if (__any_sync(0xffffffffu, more || broken)) {
            stopped = true;
            break;
        }
        __syncwarp(); // (every lane is done with this buffer before the tile after next lands there)
        cur ^= 1u;
        k = 0;
    }
    async_wait_all();
    state[0] = t << 5 | (stopped ? k : 0u);
    state[1] = i;
    state[2] = step;
    if (more) atomicExch(&out[4], 1ull);
    warp_add(&out[0], matches);
    warp_add(&out[1], lo);
    warp_add(&out[2], (u64)hi);
}

// ---- Materializing GpuJoin (crates/uvm_core/src/gpujoin/pairs.rs has the result layout) ----
// Appends every match (outer key, payload) of n keys to a shared pair buffer through a bump
// allocator (with `indexed`, the pair's first word is the key's index, index_base + r, instead of
// the key: the plan node then finds the key's outer tuples without a lookup): `next` (in the buffer's header, shared by every process) counts the pairs reserved.
// A thread counts a key's matches (walk COUNTING), reserves them all at once, then walks again
// writing them (WRITING). When a reservation ends beyond `cap` (the pairs this process has
// mapped), the kernel stops: that thread keeps its reservation, every thread saves where it
// stopped in `resume`, and ctl[1] says how many pairs the buffer needs. The host grows the
// segment, maps the new chunks and launches again with the same resume state (fresh = 0; the
// first launch of a batch has fresh = 1), which goes on where it stopped. A thread out of its
// walk budget saves its walk the same way and sets ctl[6]; the host launches again. The grid
// must be the same for every launch.
// ctl: [0] stop flag, [1] pairs needed, [2] matches written, [3] payload lo, [4] payload hi,
// [5] corrupted: keys whose chain had no empty slot within mask + 1 steps, or whose second walk
// found other matches than the first, or whose reservation overflowed (the host raises an
// ERROR), [6] a walk ran out of budget. A thread writes at most the pairs it reserved, below
// `cap`, whatever the slots hold. `written` (in the header) counts pairs written, so that
// readers can tell a complete buffer.
// resume: 8 words per thread: [0] next key index, [1] its reservation or NO_RESERVATION,
// [2] walk (NO_WALK, COUNTING, COUNTED, WRITING), [3] slot index, [4] steps, [5] matches
// counted, [6] next pair to write.
#define NO_RESERVATION (~0ull)
#define COUNTING 1ull
#define COUNTED 2ull
#define WRITING 3ull
// The most pairs a buffer's counters may claim (pairs.rs, MAX_PAIRS).
#define MAX_PAIRS ((0x7fffffffffffffffull - 64ull) / 16ull)

extern "C" __global__ void uvm_join_materialize(const Slot *slots, u64 mask, u64 seed, const long long *keys,
                                                u64 n, long long *pairs, u64 *next, u64 *written, u64 cap,
                                                u64 *resume, u64 fresh, u64 *ctl, u64 indexed,
                                                u64 index_base) {
    u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 *state = resume + 8 * tid;
    u64 r = fresh ? tid : state[0];
    u64 pend = fresh ? NO_RESERVATION : state[1];
    u64 walk = fresh ? NO_WALK : state[2];
    u64 i = fresh ? 0ull : state[3];
    u64 step = fresh ? 0ull : state[4];
    u64 m = fresh ? 0ull : state[5];
    u64 j = fresh ? 0ull : state[6];
    u64 budget = WALK_BUDGET;
    bool more = false;
    u64 done = 0, lo = 0;
    long long hi = 0;
    for (; r < n; r += stride) {
        if (*(volatile u64 *)&ctl[0] != 0ull) break; // another thread overflowed: stop here
        if (*(volatile u64 *)&ctl[5] != 0ull) break; // the table is corrupted: the host fails
        long long k = keys[r];
        u64 t = mix((u64)k ^ seed) | 1ull;
        if (walk == NO_WALK) {
            walk = COUNTING;
            i = t & mask;
            step = 0;
            m = 0;
        }
        if (walk == COUNTING) {
            bool ended = false;
            for (; step <= mask; step++) {
                if (budget == 0ull) {
                    more = true;
                    break;
                }
                budget--;
                if (gave_up(&ctl[5], step)) break;
                u64 st = slots[i].tag;
                if (st == 0ull) {
                    ended = true;
                    break;
                }
                if (st == t && slots[i].key == k) m++;
                i = (i + 1) & mask;
            }
            if (more) break;
            if (!ended) {
                atomicAdd(&ctl[5], 1ull);
                break;
            }
            walk = COUNTED;
        }
        if (walk == COUNTED) {
            if (m == 0) {
                walk = NO_WALK;
                continue;
            }
            u64 base = pend != NO_RESERVATION ? pend : atomicAdd(next, m);
            if (base > MAX_PAIRS || m > MAX_PAIRS - base) {
                atomicAdd(&ctl[5], 1ull); // a corrupted counter: never write
                break;
            }
            pend = base;
            if (base + m > cap) {
                atomicMax(&ctl[1], base + m);
                atomicExch(&ctl[0], 1ull);
                break;
            }
            // Walk again, writing at most the m pairs reserved (the slots may have changed).
            walk = WRITING;
            i = t & mask;
            step = 0;
            j = base;
        }
        // WRITING: pairs [pend, pend + m) reserved, j the next to write.
        u64 end = pend + m;
        for (; step <= mask && j < end; step++) {
            if (budget == 0ull) {
                more = true;
                break;
            }
            budget--;
            u64 st = slots[i].tag;
            if (st == 0ull) break;
            if (st == t && slots[i].key == k) {
                long long p = slots[i].payload;
                pairs[2 * j] = indexed ? (long long)(index_base + r) : k;
                pairs[2 * j + 1] = p;
                add_payload(lo, hi, p);
                j++;
                done++;
            }
            i = (i + 1) & mask;
        }
        if (more) break;
        walk = NO_WALK;
        pend = NO_RESERVATION;
        if (j != end) {
            atomicAdd(&ctl[5], 1ull); // part of the reservation stays unwritten: written != next
            break;
        }
    }
    state[0] = r;
    state[1] = pend;
    state[2] = walk;
    state[3] = i;
    state[4] = step;
    state[5] = m;
    state[6] = j;
    if (more) atomicExch(&ctl[6], 1ull);
    if (done != 0ull) {
        __threadfence_system(); // the pairs before the count that publishes them
        atomicAdd(written, done);
    }
    warp_add(&ctl[2], done);
    warp_add(&ctl[3], lo);
    warp_add(&ctl[4], (u64)hi);
}

// Zeroes [p, p + len) (len a multiple of 8, p 8-byte aligned), across chunk boundaries.
extern "C" __global__ void uvm_zero(u64 *p, u64 words) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x) {
        p[i] = 0;
    }
}

// ---- Scan programs (crates/uvm_core/src/scan: the CPU reference; scan/gpu.rs the host side) ----
// A scan program over a column cache's blocks folds every row that passes its filters and its
// joins into a group table (crates/uvm_core/src/groups has the layout), one thread per row.
// The program comes as words staged by the host (scan/gpu.rs, `DeviceProgram`, says where each
// part lies); the host validated it, but the kernel still bounds every index by the counts in
// its header, so a program it did not build cannot make a thread read past the words.
//
// Program words: [0] filters, [1] joins, [2] keys, [3] aggregates, [4] columns, [5] steps,
// [6] data bytes, then the offsets (in words) of [7] columns, [8] filters, [9] steps,
// [10] joins, [11] keys, [12] aggregates, [13] data (bytes, 8-byte aligned).
//   column: values_at, nulls_at, width, signed (4 words; offsets inside a block)
//   filter: col | kind << 32 | or << 40, a, b, 0 (kind 1 range a..=b, 2 codes at byte a of the
//           data, b bytes, 3 IS NULL, 4 a comparison: its steps from a, b = lhs | rhs << 16 |
//           cmp << 32)
//   step:   kind | op << 8 | width << 16, value (kind 1 column, 2 constant, 3 operator, 4 -)
//   join:   fact column, slots (address), mask, seed, walk bound (5 words)
//   key:    kind << 32 | index (kind 1 a fact column, 2 a join's payload)
//   agg:    kind | input << 16, a | b << 32 (input 0 none, 1 a column, 2 a - b, 3 a * b,
//           4 a float4 column)
//
// One pass per launch (`mode` SCAN_BOTH: each key inserted where new, then folded) where the
// host knows that the table cannot refuse a key (the program makes at most as many distinct
// keys as the table takes: a refusal then is an ERROR, never a lost row); else two passes:
// SCAN_KEYS inserts the key of every combination a row folds into (no state changes),
// SCAN_FOLD finds them and folds. A key pass that finds the table at
// its load limit (groups at `limit`) inserts nothing more and counts the refusal in out[1]: the
// host grows the table and runs the launch's key pass again before its fold pass, so that no
// row is folded twice or lost whatever the threads' order, and the keys inserted before the
// refusal are folded by the fold pass that follows. The fold pass never inserts; a key it does
// not find is a corrupted table.
//
// out: [0] corrupted (a walk past its bound, a key the fold pass did not find, a slot busy past
// SPIN_LIMIT reads), [1] keys refused for want of room, [2] the first error (SCAN_ERR_*),
// [3] a block whose count exceeded n, [4] rows folded (the fold pass), [5] the dimension
// tables' walks that found no empty slot within their bound (the table changed or is
// corrupted: the host raises an ERROR). Threads stop at the next row once any of [0], [2],
// [3], [5] is set (or [1], in a pass that inserts).
#define SCAN_KEYS 0ull
#define SCAN_FOLD 1ull
#define SCAN_BOTH 2ull
#define SCAN_MAX_JOINS 8
#define SCAN_MAX_KEY_WORDS 32
#define SCAN_MAX_AGGS 64
#define SCAN_DEPTH 16
#define SCAN_MAX_STEPS 32
#define SCAN_ERR_INT2 1ull
#define SCAN_ERR_INT4 2ull
#define SCAN_ERR_INT8 3ull
#define SCAN_ERR_DIV0 4ull
#define SCAN_ERR_SUB 5ull
#define SCAN_ERR_MUL 6ull
#define SCAN_ERR_PROGRAM 7ull
// A group slot being claimed (tags are odd; 0 is empty).
#define SLOT_BUSY 2ull
#define SPIN_LIMIT (1ull << 20)

struct ScanRow {
    const u64 *prog;
    const u64 *cols;
    u64 ncols;
    const u8 *block;
    u64 r;
};

__device__ __forceinline__ u64 vload(const u64 *p) { return *(volatile const u64 *)p; }

// Column c's word in the row (sign-extended where signed); false where NULL or no column.
__device__ __forceinline__ bool scan_col(const ScanRow &row, u64 c, u64 *w) {
    if (c >= row.ncols) return false;
    const u64 *d = row.cols + 4 * c;
    const u8 *nulls = row.block + d[1];
    if ((nulls[row.r >> 3] >> (row.r & 7ull)) & 1u) return false;
    const u8 *v = row.block + d[0];
    u64 width = d[2];
    bool sgn = d[3] != 0ull;
    if (width == 8ull) {
        *w = ((const u64 *)v)[row.r];
    } else if (width == 4ull) {
        unsigned int x = ((const unsigned int *)v)[row.r];
        *w = sgn ? (u64)(long long)(int)x : (u64)x;
    } else if (width == 2ull) {
        unsigned short x = ((const unsigned short *)v)[row.r];
        *w = sgn ? (u64)(long long)(short)x : (u64)x;
    } else {
        unsigned char x = v[row.r];
        *w = sgn ? (u64)(long long)(signed char)x : (u64)x;
    }
    return true;
}

// Whether this thread has met an error (scan_error): what a scan checks after each filter and
// each row, in shared memory, not out[2] (a volatile load from L2 per row and per filter,
// which the rows' dependent loads waited on); other threads' errors stop it at the periodic
// check of the outcome words. Cleared by each scan kernel at its start (scan_begin).
__shared__ unsigned char scan_err[1024];

__device__ __forceinline__ void scan_begin() { scan_err[threadIdx.x] = 0; }
__device__ __forceinline__ bool scan_failed() { return scan_err[threadIdx.x] != 0; }

__device__ __forceinline__ void scan_error(u64 *out, u64 code) {
    scan_err[threadIdx.x] = 1;
    if (vload(&out[2]) == 0ull) atomicCAS(&out[2], 0ull, code);
}

// v checked against the bounds of the operator's result type (2, 4, 8 bytes); an overflow of
// int8 itself is reported by the caller.
__device__ __forceinline__ bool scan_fits(long long v, u64 width, u64 *out) {
    if (width == 2ull && (v < -32768ll || v > 32767ll)) {
        scan_error(out, SCAN_ERR_INT2);
        return false;
    }
    if (width == 4ull && (v < -2147483648ll || v > 2147483647ll)) {
        scan_error(out, SCAN_ERR_INT4);
        return false;
    }
    return true;
}

__device__ __forceinline__ u64 scan_width_err(u64 width) {
    return width == 2ull ? SCAN_ERR_INT2 : width == 4ull ? SCAN_ERR_INT4 : SCAN_ERR_INT8;
}

// PostgreSQL's integer operators (scan/expr.rs, `apply`); false after recording an error.
__device__ bool scan_apply(u64 op, u64 width, long long a, long long b, long long *res, u64 *out) {
    long long r;
    switch (op) {
    case 1: // +
        r = (long long)((u64)a + (u64)b);
        if (((a ^ r) & (b ^ r)) < 0) goto overflow;
        break;
    case 2: // -
        r = (long long)((u64)a - (u64)b);
        if (((a ^ b) & (a ^ r)) < 0) goto overflow;
        break;
    case 3: { // *
        long long hi = __mul64hi(a, b);
        r = (long long)((u64)a * (u64)b);
        if (hi != (r >> 63)) goto overflow;
        break;
    }
    case 4: // /
        if (b == 0) {
            scan_error(out, SCAN_ERR_DIV0);
            return false;
        }
        if (a == (long long)0x8000000000000000ull && b == -1) goto overflow;
        r = a / b;
        break;
    case 5: // %
        if (b == 0) {
            scan_error(out, SCAN_ERR_DIV0);
            return false;
        }
        r = b == -1 ? 0 : a % b;
        break;
    default:
        scan_error(out, SCAN_ERR_PROGRAM);
        return false;
    }
    if (!scan_fits(r, width, out)) return false;
    *res = r;
    return true;
overflow:
    scan_error(out, scan_width_err(width));
    return false;
}

// One side of a comparison: *null set where it is NULL; false after recording an error.
__device__ bool scan_eval(const ScanRow &row, const u64 *steps, u64 n, long long *val, bool *null, u64 *out) {
    long long st[SCAN_DEPTH];
    bool nl[SCAN_DEPTH];
    int d = 0;
    if (n > SCAN_MAX_STEPS) n = SCAN_MAX_STEPS;
    for (u64 i = 0; i < n; i++) {
        u64 w0 = steps[2 * i], w1 = steps[2 * i + 1];
        u64 kind = w0 & 0xffull, op = (w0 >> 8) & 0xffull, width = (w0 >> 16) & 0xffull;
        if (kind == 1ull || kind == 2ull) {
            if (d >= SCAN_DEPTH) goto malformed;
            if (kind == 1ull) {
                u64 w;
                nl[d] = !scan_col(row, w1, &w);
                st[d] = (long long)w;
            } else {
                nl[d] = false;
                st[d] = (long long)w1;
            }
            d++;
        } else if (kind == 3ull) {
            if (d < 2) goto malformed;
            long long a = st[d - 2], b = st[d - 1];
            bool n2 = nl[d - 2] || nl[d - 1];
            d--;
            nl[d - 1] = n2;
            if (!n2 && !scan_apply(op, width, a, b, &st[d - 1], out)) return false;
        } else if (kind == 4ull) {
            if (d < 1) goto malformed;
            if (!nl[d - 1]) {
                long long v = st[d - 1];
                if (v == (long long)0x8000000000000000ull) {
                    scan_error(out, scan_width_err(width));
                    return false;
                }
                if (!scan_fits(-v, width, out)) return false;
                st[d - 1] = -v;
            }
        } else {
            goto malformed;
        }
    }
    if (d != 1) goto malformed;
    *val = st[0];
    *null = nl[0];
    return true;
malformed:
    scan_error(out, SCAN_ERR_PROGRAM);
    return false;
}

// Whether the row passes filter f (4 words); false with out[2] set after an error.
__device__ bool scan_filter(const ScanRow &row, const u64 *f, const u8 *data, u64 data_bytes, const u64 *steps,
                            u64 nsteps, u64 *out) {
    u64 col = f[0] & 0xffffffffull, kind = (f[0] >> 32) & 0xffull;
    u64 w;
    if (kind == 3ull) return !scan_col(row, col, &w);
    if (kind == 4ull) {
        u64 at = f[1], nl = f[2] & 0xffffull, nr = (f[2] >> 16) & 0xffffull, cmp = (f[2] >> 32) & 0xffull;
        if (at > nsteps || nl + nr > nsteps - at) {
            scan_error(out, SCAN_ERR_PROGRAM);
            return false;
        }
        long long a, b;
        bool na, nb;
        if (!scan_eval(row, steps + 2 * at, nl, &a, &na, out)) return false;
        if (!scan_eval(row, steps + 2 * (at + nl), nr, &b, &nb, out)) return false;
        if (na || nb) return false;
        switch (cmp) {
        case 0: return a < b;
        case 1: return a <= b;
        case 2: return a == b;
        case 3: return a != b;
        case 4: return a >= b;
        case 5: return a > b;
        default: scan_error(out, SCAN_ERR_PROGRAM); return false;
        }
    }
    if (!scan_col(row, col, &w)) return false;
    if (kind == 1ull) return (long long)f[1] <= (long long)w && (long long)w <= (long long)f[2];
    if (kind == 2ull) {
        u64 at = f[1], len = f[2];
        if (at > data_bytes || len > data_bytes - at) return false;
        return w / 8ull < len && ((data[at + w / 8ull] >> (w & 7ull)) & 1u) != 0;
    }
    scan_error(out, SCAN_ERR_PROGRAM);
    return false;
}

// The next match of join j's key k after slot *i (first: from its home slot), at most
// `bound` steps from home in all (*steps counts them); false where none is left. A walk that
// reaches its bound without an empty slot counts in out[5].
__device__ __forceinline__ bool scan_match(const u64 *join, long long k, bool first, u64 *i, u64 *steps, u64 *out) {
    const Slot *slots = (const Slot *)join[1];
    u64 mask = join[2], bound = join[4];
    u64 t = mix((u64)k ^ join[3]) | 1ull;
    u64 at = first ? (t & mask) : ((*i + 1ull) & mask);
    u64 s = first ? 0ull : *steps + 1ull;
    for (; s < bound; s++) {
        u64 st = slots[at].tag;
        if (st == 0ull) return false;
        if (st == t && slots[at].key == k) {
            *i = at;
            *steps = s;
            return true;
        }
        at = (at + 1ull) & mask;
    }
    atomicAdd(&out[5], 1ull);
    return false;
}

// Where `key` is in the group table (its slot's first word), claiming an empty slot for it in
// the key pass; 0 where it is not (out[1] counts a refusal for want of room; out[0] a corrupted
// table).
__device__ u64 *scan_group(u64 *slots, u64 mask, u64 seed, u64 kw, u64 slot_words, const u64 *key, u64 *groups,
                           u64 limit, u64 mode, const u64 *aggs, u64 naggs, u64 *out) {
    u64 t = seed;
    for (u64 k = 0; k < kw; k++) t = mix(t ^ key[k]);
    t |= 1ull;
    u64 i = t & mask, retries = 0;
    for (u64 step = 0; step <= mask; step++) {
        if (gave_up(&out[0], step)) return 0;
        u64 *slot = slots + i * slot_words;
        u64 st = vload(slot);
        for (u64 spins = 0; st == SLOT_BUSY; spins++) {
            if (spins == SPIN_LIMIT) {
                atomicAdd(&out[0], 1ull);
                return 0;
            }
            st = vload(slot);
        }
        if (st == t) {
            bool same = true;
            for (u64 k = 0; k < kw && same; k++) same = vload(slot + 1 + k) == key[k];
            if (same) return slot;
        } else if (st == 0ull) {
            if (mode == SCAN_FOLD) {
                atomicAdd(&out[0], 1ull); // the key pass put every key here
                return 0;
            }
            // A table at its limit refuses before touching the slot; below it, the slot is
            // claimed first and the group counted after: counting first (a reservation) would
            // let the threads racing to add one new key (thousands, on a table's first rows)
            // push the count past the limit for a moment and refuse keys there was room for.
            if (vload(groups) >= limit) {
                atomicAdd(&out[1], 1ull);
                return 0;
            }
            if (atomicCAS(slot, 0ull, SLOT_BUSY) == 0ull) {
                if (atomicAdd(groups, 1ull) >= limit) {
                    atomicAdd(groups, ~0ull);
                    atomicExch(slot, 0ull); // the slot empty again, for whoever waits on it
                    atomicAdd(&out[1], 1ull);
                    return 0;
                }
                for (u64 k = 0; k < kw; k++) slot[1 + k] = key[k];
                // min and max start from their identities (groups.rs, `prime`): a value
                // folds in with one atomic whatever the order.
                for (u64 a = 0; a < naggs; a++) {
                    u64 kind = aggs[2 * a] & 0xffffull, *lo = slot + 1 + kw + 2 * a;
                    if (kind == 4ull) *lo = 0x7fffffffffffffffull;
                    else if (kind == 5ull) *lo = 0x8000000000000000ull;
                    else if (kind == 7ull) *lo = 0x7ff8000000000000ull;  // NaN: above every number
                    else if (kind == 8ull) *lo = 0xfff0000000000000ull;  // -Infinity
                }
                __threadfence();
                atomicExch(slot, t);
                return slot;
            }
            // Another thread took the slot: look at it again (i unchanged, and not a step
            // along the chain), a bounded number of times.
            if (++retries == SPIN_LIMIT) {
                atomicAdd(&out[0], 1ull);
                return 0;
            }
            step--;
            continue;
        }
        i = (i + 1ull) & mask;
    }
    atomicAdd(&out[0], 1ull);
    return 0;
}

// PostgreSQL's order of floats: NaN above every number.
__device__ __forceinline__ bool scan_float_less(double a, double b) {
    if (isnan(a)) return false;
    if (isnan(b)) return true;
    return a < b;
}

// Folds one input (has: not NULL) into a state of kind `kind` (groups.rs, `fold`).
__device__ void scan_fold(u64 kind, u64 *lo, u64 *hi, bool has, u64 v) {
    if (kind == 1ull) {
        atomicAdd(lo, 1ull);
        return;
    }
    if (!has) return;
    switch (kind) {
    case 2ull: atomicAdd(lo, 1ull); break;
    case 3ull: {
        u64 old = atomicAdd(lo, v);
        u64 carry = old + v < old ? 1ull : 0ull;
        u64 h = (u64)((long long)v >> 63) + carry;
        if (h != 0ull) atomicAdd(hi, h);
        break;
    }
    case 4ull: atomicMin((long long *)lo, (long long)v); if (vload(hi) == 0ull) atomicExch(hi, 1ull); break;
    case 5ull: atomicMax((long long *)lo, (long long)v); if (vload(hi) == 0ull) atomicExch(hi, 1ull); break;
    case 6ull: {
        double d = __longlong_as_double((long long)v);
        double old = atomicAdd((double *)lo, d);
        double s = old + d;
        u64 flags = 1ull; // SEEN
        if (isinf(s) && isfinite(old) && isfinite(d)) flags |= 2ull; // OVERFLOWED
        if ((vload(hi) & flags) != flags) atomicOr(hi, flags);
        break;
    }
    case 7ull:
    case 8ull: {
        double d = __longlong_as_double((long long)v);
        // Each failed exchange means another thread moved the state past its value, so the
        // loop ends within as many turns as the rows folding into this group.
        u64 cur = vload(lo);
        for (;;) {
            double c = __longlong_as_double((long long)cur);
            bool better = kind == 7ull ? scan_float_less(d, c) : scan_float_less(c, d);
            if (!better) break;
            u64 seen = atomicCAS(lo, cur, v);
            if (seen == cur) break;
            cur = seen;
        }
        if (vload(hi) == 0ull) atomicExch(hi, 1ull);
        break;
    }
    default: break;
    }
}

// Whether the row passes the program's filters: clauses of alternatives, in order, as
// scan::fold_row tests them; false after an error (out[2] set: the caller returns).
__device__ bool scan_passes(const ScanRow &row, const u64 *filters, u64 nfilters, const u8 *data, u64 data_bytes,
                            const u64 *steps, u64 nsteps, u64 *out) {
    bool clause = true;
    for (u64 f = 0; f < nfilters; f++) {
        const u64 *fw = filters + 4 * f;
        if (((fw[0] >> 40) & 1ull) == 0ull) {
            if (!clause) return false;
            clause = false;
        }
        if (!clause) {
            clause = scan_filter(row, fw, data, data_bytes, steps, nsteps, out);
            if (scan_failed()) return false;
        }
    }
    return clause;
}

// Phase 2 of one row that passed its filters and whose every join matched (phase 1, in
// uvm_scan_groups): its joins' first matches, its aggregates' inputs, and every combination of
// the joins' matches (an odometer over them) found or inserted in the group table and folded.
// Returns the combinations folded; an error is recorded (scan_failed) and ends the row.
__device__ __forceinline__ u64 scan_fold_row(const ScanRow &row, const u64 *joins, u64 njoins, const u64 *keys,
                                             u64 nkeys, const u64 *aggs, u64 naggs, u64 *slots, u64 mask, u64 seed,
                                             u64 key_words, u64 slot_words, u64 *groups, u64 limit, u64 mode,
                                             u64 *out) {
    u64 folded = 0;
    // The joins' first matches (none: the row is dropped).
    long long jk[SCAN_MAX_JOINS];
    u64 first[SCAN_MAX_JOINS], fsteps[SCAN_MAX_JOINS], cur[SCAN_MAX_JOINS], csteps[SCAN_MAX_JOINS];
    for (u64 j = 0; j < njoins; j++) {
        u64 w;
        if (!scan_col(row, joins[5 * j], &w)) return 0;
        jk[j] = (long long)w;
        if (!scan_match(joins + 5 * j, jk[j], true, &first[j], &fsteps[j], out)) return 0;
        cur[j] = first[j];
        csteps[j] = fsteps[j];
    }
    // The aggregates' inputs (the fold pass: their errors are those of rows that fold).
    u64 in[SCAN_MAX_AGGS];
    bool has[SCAN_MAX_AGGS];
    if (mode != SCAN_KEYS) {
        for (u64 a = 0; a < naggs; a++) {
            u64 kind = (aggs[2 * a] >> 16) & 0xffffull;
            u64 ca = aggs[2 * a + 1] & 0xffffffffull, cb = aggs[2 * a + 1] >> 32;
            u64 x = 0, y = 0;
            has[a] = false;
            in[a] = 0;
            if (kind == 1ull) {
                has[a] = scan_col(row, ca, &x);
                in[a] = x;
            } else if (kind == 4ull) {
                has[a] = scan_col(row, ca, &x);
                in[a] = (u64)__double_as_longlong((double)__int_as_float((int)(unsigned int)x));
            } else if (kind == 2ull || kind == 3ull) {
                bool hx = scan_col(row, ca, &x), hy = scan_col(row, cb, &y);
                if (hx && hy) {
                    long long a8 = (long long)x, b8 = (long long)y, v;
                    bool over;
                    if (kind == 2ull) {
                        v = (long long)(x - y);
                        over = ((a8 ^ b8) & (a8 ^ v)) < 0;
                    } else {
                        v = (long long)(x * y);
                        over = __mul64hi(a8, b8) != (v >> 63);
                    }
                    if (over) {
                        scan_error(out, kind == 2ull ? SCAN_ERR_SUB : SCAN_ERR_MUL);
                        return 0;
                    }
                    has[a] = true;
                    in[a] = (u64)v;
                }
            }
        }
    }
    for (;;) {
        u64 key[SCAN_MAX_KEY_WORDS];
        u64 nulls = 0;
        for (u64 k = 0; k < nkeys; k++) {
            u64 kind = keys[k] >> 32, idx = keys[k] & 0xffffffffull;
            u64 w = 0;
            if (kind == 2ull && idx < njoins) {
                const Slot *s = (const Slot *)joins[5 * idx + 1];
                w = (u64)s[cur[idx]].payload;
            } else if (kind == 1ull) {
                if (!scan_col(row, idx, &w)) {
                    nulls |= 1ull << k;
                    w = 0;
                }
            }
            key[k] = w;
        }
        key[nkeys] = nulls;
        u64 *slot = scan_group(slots, mask, seed, key_words, slot_words, key, groups, limit, mode, aggs, naggs, out);
        if (slot == 0) break; // refused or corrupted: out says which
        if (mode != SCAN_KEYS) {
            for (u64 a = 0; a < naggs; a++) {
                u64 *lo = slot + 1 + key_words + 2 * a;
                scan_fold(aggs[2 * a] & 0xffffull, lo, lo + 1, has[a], in[a]);
            }
            folded++;
        }
        u64 j = 0;
        for (; j < njoins; j++) {
            if (scan_match(joins + 5 * j, jk[j], false, &cur[j], &csteps[j], out)) break;
            cur[j] = first[j];
            csteps[j] = fsteps[j];
        }
        if (j == njoins) break;
    }
    return folded;
}

// A warp's queues of rows between the steps of a scan (uvm_scan_groups): SCAN_MAX_JOINS + 1
// queues of SCAN_QUEUE rows (their index in the launch) per warp, of blocks of at most
// SCAN_WARPS warps (uvm_scan_groups refuses others); their counts, 7 bits each, in one word.
#define SCAN_QUEUE 64
#define SCAN_WARPS 8
#define SCAN_LANES 0xffffffffu
#define SCAN_QUEUES (SCAN_MAX_JOINS + 1)

__device__ __forceinline__ unsigned scan_count(u64 counts, u64 k) { return (unsigned)(counts >> (7ull * k)) & 127u; }

// Queues row g of each lane where keep, at the end of queue k (its count in counts, the same
// in every lane: the ballot needs every lane). A queue never holds more than 63 rows (the
// loop's rounds and its drain see to it); rows past SCAN_QUEUE would be a bug of this file,
// refused as a program error rather than written over the next queue.
__device__ __forceinline__ void scan_push(u32 *queue, u64 *counts, u64 k, bool keep, u64 g, u64 *out) {
    unsigned lane = threadIdx.x & 31u;
    unsigned kept = __ballot_sync(SCAN_LANES, keep);
    unsigned at = scan_count(*counts, k);
    if (at + (unsigned)__popc(kept) > SCAN_QUEUE) {
        if (lane == 0) scan_error(out, SCAN_ERR_PROGRAM);
        return;
    }
    if (keep) queue[k * SCAN_QUEUE + at + __popc(kept & ((1u << lane) - 1u))] = (u32)g;
    *counts += (u64)__popc(kept) << (7ull * k);
    __syncwarp();
}

// Takes up to 32 rows from the end of queue k: the lane's row into *g, false for a lane
// without one.
__device__ __forceinline__ bool scan_pop(const u32 *queue, u64 *counts, u64 k, u64 *g) {
    unsigned lane = threadIdx.x & 31u;
    unsigned have = scan_count(*counts, k), take = have < 32u ? have : 32u;
    *counts -= (u64)take << (7ull * k);
    bool some = lane < take;
    *g = some ? queue[k * SCAN_QUEUE + have - take + lane] : 0ull;
    __syncwarp(); // (every lane has its row before rows are queued over it)
    return some;
}

// Runs the program over `blocks` blocks of up to n rows (n a power of two; block b at base +
// b * stride, its count in its header; rows of the first block below first_row skipped) in pass `mode` (above), into
// the group table's slots (mask + 1 of slot_words words, at `slots`; `groups` its count of
// groups, `limit` the most it may hold). Bounded to 64 registers (__launch_bounds__: the 4
// blocks of 256 threads per SM every launch has, all resident; unbounded it took 113, and 2
// fitted): bench/probes/scan_kernel.py measured the star joins faster so (Q2.1 6.6 to 5.0 ms
// on an H100 at SF 10), the one-join queries as fast.
//
// Each warp reads 32 consecutive rows at a time, its loop and every exit from it the same in
// all its lanes (the ballots need every lane), and keeps its lanes busy with rows at the same
// step: step 0 is a row's filters (where there are none, join 0's probe), step j + 1 the
// probe of join j (whether it has a match, keeping nothing), and the last step
// (scan_fold_row) the joins' matches, the group and the folds. A row that passes a step waits
// in the warp's queue for the next until the queue holds 32, and then all 32 lanes take that
// step for them at once. Without the queues a warp ran each step for the few lanes whose rows
// had come that far while the others waited: a star join keeps a few rows in a hundred (Q3.1
// one in 25), and its last step was most of the kernel's time (bench/probes/scan_kernel.py on
// an H100 at SF 10: Q3.1 10.0 to 3.5 ms, Q4.1 9.2 to 3.5; bench/gpu-report-scan-warps.md).
// The rows left in the queues at the end go through the steps left, queue by queue; a warp
// that stops early (an error, a corrupted table, a refusal) leaves its queues: the host raises
// the ERROR, or runs the key pass again (a refusal).
extern "C" __global__ void __launch_bounds__(256, 4) uvm_scan_groups(const u64 *prog, const u8 *base, u64 n, u64 blocks, u64 stride,
                                           u64 first_row, u64 *slots, u64 mask, u64 seed, u64 key_words,
                                           u64 slot_words, u64 *groups, u64 limit, u64 mode, u64 *out) {
    __shared__ u32 scan_queues[SCAN_WARPS * SCAN_QUEUES * SCAN_QUEUE];
    u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    scan_begin();
    u64 gstride = (u64)gridDim.x * blockDim.x;
    u64 nfilters = prog[0], njoins = prog[1], nkeys = prog[2], naggs = prog[3];
    u64 nsteps = prog[5], data_bytes = prog[6];
    u64 total = n * blocks;
    if (njoins > SCAN_MAX_JOINS || nkeys + 1ull != key_words || key_words > SCAN_MAX_KEY_WORDS ||
        naggs > SCAN_MAX_AGGS || n == 0ull || (n & (n - 1ull)) != 0ull || (blockDim.x & 31u) != 0u ||
        blockDim.x > 32u * SCAN_WARPS || blocks > 0xffffffffull / n) {
        if (tid == 0) scan_error(out, SCAN_ERR_PROGRAM);
        return;
    }
    const u64 *filters = prog + prog[8], *steps = prog + prog[9], *joins = prog + prog[10];
    const u64 *keys = prog + prog[11], *aggs = prog + prog[12];
    const u8 *data = (const u8 *)(prog + prog[13]);
    ScanRow row;
    row.prog = prog;
    row.cols = prog + prog[7];
    row.ncols = prog[4];
    u64 folded = 0;
    u64 shift = (u64)(__ffsll((long long)n) - 1);
    unsigned lane = threadIdx.x & 31u;
    u32 *queue = scan_queues + (threadIdx.x >> 5) * SCAN_QUEUES * SCAN_QUEUE;
    u64 counts = 0; // (the same in every lane)
    bool stopped = false;
    u64 seen = 0;
    // Step k + 1 for the rows of queue k (k < njoins: join k; k = njoins: the fold) of the
    // lanes that have one: a row that matches goes on to queue k + 1. (A corrupted walk counts
    // in out[5], read at the periodic check.)
    auto step = [&](u64 k, bool some, u64 g) {
        row.block = base + (g >> shift) * stride;
        row.r = g & (n - 1ull);
        if (k < njoins) {
            u64 w, at, walked;
            bool keep = some && scan_col(row, joins[5 * k], &w) &&
                        scan_match(joins + 5 * k, (long long)w, true, &at, &walked, out);
            scan_push(queue, &counts, k + 1ull, keep, g, out);
        } else if (some) {
            folded += scan_fold_row(row, joins, njoins, keys, nkeys, aggs, naggs, slots, mask, seed, key_words,
                                    slot_words, groups, limit, mode, out);
        }
    };
    for (u64 wg = tid - lane; wg < total; wg += gstride, seen++) {
        if ((seen & 63ull) == 0ull &&
            __any_sync(SCAN_LANES, (vload(&out[0]) | vload(&out[2]) | vload(&out[3]) | vload(&out[5]) |
                                    (mode != SCAN_FOLD ? vload(&out[1]) : 0ull)) != 0ull)) {
            stopped = true;
            break;
        }
        // Step 0: the filters.
        u64 g = wg + lane;
        bool keep = false, bad_block = false;
        if (g < total) {
            // (locate's, with a shift for the division: blocks hold a power of two of rows)
            u64 b = g >> shift, r = g & (n - 1ull), off = b * stride;
            u64 count = *(const u64 *)(base + off);
            if (count > n) {
                bad_block = true;
                if (vload(&out[3]) == 0ull) atomicExch(&out[3], 1ull);
            } else if (r < count && !(b == 0ull && r < first_row)) {
                row.block = base + off;
                row.r = r;
                keep = scan_passes(row, filters, nfilters, data, data_bytes, steps, nsteps, out) && !scan_failed();
                // (no filters: step 0 is join 0's probe, every row would pass to queue 0)
                if (keep && nfilters == 0ull && njoins != 0ull) {
                    u64 w, at, walked;
                    keep = scan_col(row, joins[0], &w) && scan_match(joins, (long long)w, true, &at, &walked, out);
                }
            }
        }
        if (__any_sync(SCAN_LANES, bad_block || scan_failed())) {
            stopped = true;
            break;
        }
        scan_push(queue, &counts, nfilters == 0ull && njoins != 0ull ? 1ull : 0ull, keep, g, out);
        // Each queue gains at most 32 rows a round and gives 32 once it has them: below 64.
        for (u64 k = 0; k <= njoins; k++) {
            if (scan_count(counts, k) < 32u) continue;
            u64 q;
            bool some = scan_pop(queue, &counts, k, &q);
            step(k, some, q);
        }
        if (__any_sync(SCAN_LANES, scan_failed())) {
            stopped = true;
            break;
        }
    }
    // The rows left, queue by queue. Every queue is below 32 at the end of a round; a pop of
    // queue k takes fewer than 32, which go on to queue k + 1, and then every later queue that
    // reaches 32 takes its step at once, as in a round, so that each stays below 64 (taking
    // queue k + 1 whole afterwards instead would push up to 62 rows into queue k + 2, which may
    // hold 31 already).
    for (u64 k = 0; !stopped && k <= njoins; k++) {
        while (scan_count(counts, k) != 0u) {
            u64 q;
            bool some = scan_pop(queue, &counts, k, &q);
            step(k, some, q);
            for (u64 m = k + 1ull; m <= njoins; m++) {
                if (scan_count(counts, m) < 32u) continue;
                some = scan_pop(queue, &counts, m, &q);
                step(m, some, q);
            }
        }
        stopped = __any_sync(SCAN_LANES, scan_failed());
    }
    if (folded != 0ull) atomicAdd(&out[4], folded);
}

// The longest run of occupied slots of a GpuJoin table (mask + 1 slots), at most cap + 1, into
// out[0] (atomicMax), and its empty slots into out[1]: a walk from any slot of a run reaches
// an empty slot within the run's length, so the longest run bounds the scan's walks.
// A dimension's join table from its cache (crate::scan::build): for each row of `blocks` blocks
// (as uvm_scan_groups reads them) that passes the program's filters (a program of no joins)
// with a key in column key_col, the slot of its group (the program's keys: fact columns) in
// the group table (found, never claimed: a group the table lacks counts in out[0]), then the
// pair (key, that slot's index) inserted into the join table's tmask + 1 slots (tag seed
// tseed, as uvm_join_build's), at most `limit` pairs in all: out[1] counts the pairs, and one
// past the limit or a walk of tmask + 1 slots without an empty one sets out[4].
extern "C" __global__ void uvm_scan_build(const u64 *prog, const u8 *base, u64 n, u64 blocks, u64 stride, u64 *slots,
                                          u64 mask, u64 seed, u64 key_words, u64 slot_words, u64 key_col,
                                          Slot *tslots, u64 tmask, u64 tseed, u64 limit, u64 *out) {
    u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    scan_begin();
    u64 gstride = (u64)gridDim.x * blockDim.x;
    u64 nfilters = prog[0], njoins = prog[1], nkeys = prog[2], naggs = prog[3];
    u64 nsteps = prog[5], data_bytes = prog[6];
    if (njoins != 0ull || nkeys + 1ull != key_words || key_words > SCAN_MAX_KEY_WORDS || naggs > SCAN_MAX_AGGS ||
        n == 0ull || (n & (n - 1ull)) != 0ull) {
        if (tid == 0) scan_error(out, SCAN_ERR_PROGRAM);
        return;
    }
    const u64 *filters = prog + prog[8], *steps = prog + prog[9], *keys = prog + prog[11], *aggs = prog + prog[12];
    const u8 *data = (const u8 *)(prog + prog[13]);
    ScanRow row;
    row.prog = prog;
    row.cols = prog + prog[7];
    row.ncols = prog[4];
    u64 total = n * blocks;
    u64 shift = (u64)(__ffsll((long long)n) - 1);
    u64 seen = 0;
    for (u64 g = tid; g < total; g += gstride, seen++) {
        if ((seen & 63ull) == 0ull && (vload(&out[0]) | vload(&out[2]) | vload(&out[3]) | vload(&out[4])) != 0ull) break;
        u64 b = g >> shift, r = g & (n - 1ull), off = b * stride;
        u64 count = *(const u64 *)(base + off);
        if (count > n) {
            if (vload(&out[3]) == 0ull) atomicExch(&out[3], 1ull);
            break;
        }
        if (r >= count) continue;
        row.block = base + off;
        row.r = r;
        bool pass = scan_passes(row, filters, nfilters, data, data_bytes, steps, nsteps, out);
        if (scan_failed()) return;
        u64 kw;
        if (!pass || !scan_col(row, key_col, &kw)) continue;
        u64 key[SCAN_MAX_KEY_WORDS];
        u64 nulls = 0;
        for (u64 k = 0; k < nkeys; k++) {
            u64 w = 0;
            if ((keys[k] >> 32) != 1ull) {
                scan_error(out, SCAN_ERR_PROGRAM);
                return;
            }
            if (!scan_col(row, keys[k] & 0xffffffffull, &w)) {
                nulls |= 1ull << k;
                w = 0;
            }
            key[k] = w;
        }
        key[nkeys] = nulls;
        u64 *slot = scan_group(slots, mask, seed, key_words, slot_words, key, 0, 0, SCAN_FOLD, aggs, naggs, out);
        if (slot == 0) break; // (out[0] says why)
        if (atomicAdd(&out[1], 1ull) >= limit) {
            atomicExch(&out[4], 1ull);
            break;
        }
        long long k = (long long)kw;
        u64 t = mix((u64)k ^ tseed) | 1ull;
        u64 i = t & tmask;
        bool placed = false;
        for (u64 step = 0; step <= tmask; step++) {
            if (gave_up(&out[4], step)) break;
            if (atomicCAS(&tslots[i].tag, 0ull, t) == 0ull) {
                tslots[i].key = k;
                tslots[i].payload = (long long)((u64)(slot - slots) / slot_words);
                placed = true;
                break;
            }
            i = (i + 1ull) & tmask;
        }
        if (!placed) {
            atomicExch(&out[4], 1ull);
            break;
        }
    }
}

extern "C" __global__ void uvm_longest_run(const Slot *slots, u64 mask, u64 cap, u64 *out) {
    u64 empty = 0, longest = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i <= mask; i += (u64)gridDim.x * blockDim.x) {
        if (slots[i].tag == 0ull) {
            empty++;
            continue;
        }
        if (slots[(i - 1ull) & mask].tag != 0ull) continue; // not the start of a run
        u64 len = 1;
        while (len <= cap && slots[(i + len) & mask].tag != 0ull) len++;
        if (len > longest) longest = len;
    }
    if (longest != 0ull) atomicMax(&out[0], longest);
    warp_add(&out[1], empty);
}
