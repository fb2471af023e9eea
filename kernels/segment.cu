// Kernels over a range of a shared segment. Compiled at run time by NVRTC for the device's
// architecture (src/gpu/), so the extension builds without a CUDA toolkit.
//
// The definitions must match the CPU ones in src/checksum.rs exactly:
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

// ---- GpuJoin (src/gpujoin/table.rs has the layout) ----
// A slot: tag (0 = empty, else mix(key ^ seed) | 1), key, payload; 24 bytes.
struct Slot { u64 tag; long long key; long long payload; };

// Inserts n rows (keys[i], payloads[i]) into the table; NULL keys were left out by the caller.
extern "C" __global__ void uvm_join_build(Slot *slots, u64 mask, u64 seed, const long long *keys,
                                          const long long *payloads, u64 n) {
    for (u64 r = blockIdx.x * (u64)blockDim.x + threadIdx.x; r < n; r += (u64)gridDim.x * blockDim.x) {
        long long k = keys[r];
        u64 t = mix((u64)k ^ seed) | 1ull;
        u64 i = t & mask;
        // claim an empty slot; key and payload are written by the claimer before any probe runs
        while (atomicCAS(&slots[i].tag, 0ull, t) != 0ull) {
            i = (i + 1) & mask;
        }
        slots[i].key = k;
        slots[i].payload = payloads[r];
    }
}

// Probes n keys; adds the matches and the payload sum (two's complement, 64-bit) to out[0..2].
extern "C" __global__ void uvm_join_probe(const Slot *slots, u64 mask, u64 seed, const long long *keys,
                                          u64 n, u64 *out) {
    u64 matches = 0, sum = 0;
    for (u64 r = blockIdx.x * (u64)blockDim.x + threadIdx.x; r < n; r += (u64)gridDim.x * blockDim.x) {
        long long k = keys[r];
        u64 t = mix((u64)k ^ seed) | 1ull;
        u64 i = t & mask;
        for (;;) {
            u64 st = slots[i].tag;
            if (st == 0ull) break;
            if (st == t && slots[i].key == k) {
                matches++;
                sum += (u64)slots[i].payload;
            }
            i = (i + 1) & mask;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        matches += __shfl_down_sync(0xffffffffu, matches, off);
        sum += __shfl_down_sync(0xffffffffu, sum, off);
    }
    if ((threadIdx.x & 31) == 0 && matches != 0) {
        atomicAdd(&out[0], matches);
        atomicAdd(&out[1], sum);
    }
}

// Zeroes [p, p + len) (len a multiple of 8, p 8-byte aligned), across chunk boundaries.
extern "C" __global__ void uvm_zero(u64 *p, u64 words) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x) {
        p[i] = 0;
    }
}
