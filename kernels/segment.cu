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
#define WALK_BUDGET 4096ull
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
// block's count was above n. resume: 3 words per thread, as for uvm_join_build.
extern "C" __global__ void uvm_join_probe(const Slot *slots, u64 mask, u64 seed, const u8 *keys, u64 key_width,
                                          const u8 *key_nulls, u64 n, u64 blocks, u64 block_stride,
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
    u64 matches = 0, lo = 0;
    long long hi = 0;
    for (; g < total; g += stride) {
        u64 off, r;
        if (!locate(g, n, block_stride, headers, &out[5], &off, &r)) {
            step = NO_WALK; // (no walk is ever in progress here, unless the count changed)
            continue;
        }
        if (step == NO_WALK && column_null(key_nulls, off, r)) continue;
        long long k = column_value(keys + off, key_width, r);
        u64 t = mix((u64)k ^ seed) | 1ull;
        if (step == NO_WALK) {
            i = t & mask;
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
            if (st == t && slots[i].key == k) {
                matches++;
                add_payload(lo, hi, slots[i].payload);
            }
            i = (i + 1) & mask;
        }
        if (more) break;
        step = NO_WALK;
        if (!ended) {
            atomicAdd(&out[3], 1ull);
            break; // the host raises an ERROR: no need to probe this thread's other keys
        }
    }
    state[0] = g;
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
