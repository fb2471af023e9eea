// GpuJoin's kernels (uvm_join_build, uvm_join_probe of kernels/segment.cu) run on the CPU, one
// thread after another (cuda_shim.h), over columns in the column cache's block layout, and
// checked against the join computed here directly: every probe's matches and payload sum, the
// build's counts of placed rows, NULL keys and NULL payloads, and the errors a corrupted table
// or an overcounted block must raise. Built with a small WALK_BUDGET (Makefile), so that
// chains of duplicate keys run out of budget many times per launch and every run goes through
// the resume protocol (the host's loop: launch again with fresh = 0 while out says "more"),
// over grids of one to thirteen blocks and a block size that is not a power of two. Exits 1 at
// the first difference.
#include "cuda_shim.h"

#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

Dim3 threadIdx, blockIdx, blockDim, gridDim;

#include KERNEL

namespace {

unsigned long long rng_state = 0x5151;
unsigned long long next() {
    rng_state += 0x9E3779B97F4A7C15ull;
    return mix(rng_state);
}
long long below(long long n) { return (long long)(next() % (unsigned long long)n); }

const unsigned long long N = 1024; // rows per block
const int MAX_LAUNCHES = 2000;     // (the longest case takes 352)
const unsigned long long ALIGN = 256;
unsigned long long align(unsigned long long x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

int failures = 0;
void check(bool ok, const char *what, const char *name, long long got, long long want) {
    if (ok) return;
    std::printf("FAIL %s: %s %lld, expected %lld\n", name, what, got, want);
    failures++;
}

// Columns of `rows` values each in the cache's block layout: per block a 256-byte header whose
// first word is the block's count, then each column's values (its width) and NULL bitmap.
struct Blocks {
    unsigned long long blocks = 0, stride = 0;
    std::vector<unsigned long long> width, values_at, nulls_at;
    std::vector<unsigned char> bytes;
    // cols: (values, NULL flags, width); every column the same length
    Blocks(const std::vector<std::tuple<const std::vector<long long> *, const std::vector<bool> *, unsigned long long>> &cols) {
        size_t rows = std::get<0>(cols[0])->size();
        blocks = (rows + N - 1) / N;
        unsigned long long at = ALIGN;
        for (auto &[v, null, w] : cols) {
            width.push_back(w);
            values_at.push_back(at);
            nulls_at.push_back(align(at + N * w));
            at = align(nulls_at.back() + N / 8);
        }
        stride = at;
        bytes.assign(blocks * stride, 0);
        for (unsigned long long b = 0; b < blocks; b++) {
            unsigned long long count = std::min<unsigned long long>(N, rows - b * N);
            std::memcpy(&bytes[b * stride], &count, 8);
        }
        for (size_t c = 0; c < cols.size(); c++) {
            auto &[v, null, w] = cols[c];
            for (size_t g = 0; g < rows; g++) {
                unsigned char *blk = &bytes[g / N * stride];
                unsigned long long r = g % N;
                if ((*null)[g]) {
                    blk[nulls_at[c] + r / 8] |= (unsigned char)(1u << (r % 8));
                } else {
                    std::memcpy(blk + values_at[c] + r * w, &(*v)[g], w); // (little-endian: the low bytes)
                }
            }
        }
    }
    const unsigned char *headers() const { return bytes.data(); }
    const unsigned char *values(int c) const { return bytes.data() + values_at[c]; }
    const unsigned char *nulls(int c) const { return bytes.data() + nulls_at[c]; }
};

// Launches `kernel(fresh, out)` over a grid of gx blocks of bx threads until out[more] is 0:
// the host's loop (crates/uvm_core/src/gpujoin/gpu.rs). Returns the launches, or -1 where
// MAX_LAUNCHES did not finish (a resume that makes no progress: on the GPU, a hung query).
template <typename F> int launch_all(unsigned gx, unsigned bx, unsigned long long *out, int more, F kernel) {
    gridDim.x = gx;
    blockDim.x = bx;
    for (int launches = 1;; launches++) {
        for (unsigned b = 0; b < gx; b++) {
            blockIdx.x = b;
            for (unsigned w = 0; w < bx; w += 32) {
                emu::run_warp(w, [&] { kernel(launches == 1 ? 1ull : 0ull, out); });
            }
        }
        if (out[more] == 0) return launches;
        if (launches == MAX_LAUNCHES) return -1;
        out[more] = 0;
    }
}

struct Case {
    const char *name;
    std::vector<long long> dim_keys, dim_payloads;
    std::vector<bool> dim_key_null, dim_payload_null;
    std::vector<long long> fact;
    std::vector<bool> fact_null;
    unsigned long long width = 8;
};

// Builds the table from the case's dim column and probes it with its fact column; checks both
// against the join computed directly.
void run(const Case &c, unsigned gx, unsigned bx) {
    char name[160];
    std::snprintf(name, sizeof name, "%s (grid %u x %u)", c.name, gx, bx);
    Blocks dim({{&c.dim_keys, &c.dim_key_null, c.width}, {&c.dim_payloads, &c.dim_payload_null, 8}});
    Blocks fact({{&c.fact, &c.fact_null, c.width}});
    unsigned long long slots_n = 16;
    while (slots_n < 2 * c.dim_keys.size()) slots_n *= 2;
    std::vector<Slot> slots(slots_n, Slot{0, 0, 0});
    std::vector<unsigned long long> resume(3ull * gx * bx, 0);
    const unsigned long long seed = 0x77;

    unsigned long long b_out[6] = {0, 0, 0, 0, 0, 0};
    int b_launches = launch_all(gx, bx, b_out, 1, [&](unsigned long long fresh, unsigned long long *out) {
        uvm_join_build(slots.data(), slots_n - 1, seed, dim.values(0), c.width, dim.nulls(0), dim.values(1), 8,
                       dim.nulls(1), N, dim.blocks, dim.stride, dim.headers(), resume.data(), fresh, out);
    });
    // (a table's key and payload are written by the thread that claimed the slot: the probe
    // runs in a later launch)
    std::map<long long, std::pair<long long, long long>> want_of; // key -> (rows, payload sum)
    long long null_keys = 0, null_payloads = 0, placed = 0;
    for (size_t g = 0; g < c.dim_keys.size(); g++) {
        if (c.dim_key_null[g]) {
            null_keys++;
            continue;
        }
        placed++;
        long long p = c.dim_payload_null[g] ? 0 : c.dim_payloads[g];
        null_payloads += c.dim_payload_null[g];
        long long k = c.width == 8   ? c.dim_keys[g]
                      : c.width == 4 ? (long long)(int)c.dim_keys[g]
                                     : (long long)(short)c.dim_keys[g];
        want_of[k].first++;
        want_of[k].second += p;
    }
    check(b_launches > 0, "build launches", name, b_launches, 1);
    check(b_out[5] == (unsigned long long)placed, "build placed", name, b_out[5], placed);
    check(b_out[3] == (unsigned long long)null_keys, "build NULL keys", name, b_out[3], null_keys);
    check(b_out[2] == (unsigned long long)null_payloads, "build NULL payloads", name, b_out[2], null_payloads);
    check(b_out[0] == 0 && b_out[4] == 0, "build errors", name, b_out[0] + b_out[4], 0);

    unsigned long long p_out[7] = {0, 0, 0, 0, 0, 0, 0};
    std::fill(resume.begin(), resume.end(), 0);
    int launches = launch_all(gx, bx, p_out, 4, [&](unsigned long long fresh, unsigned long long *out) {
        uvm_join_probe(slots.data(), slots_n - 1, seed, fact.values(0), c.width, fact.nulls(0), N, fact.blocks,
                       fact.stride, fact.headers(), resume.data(), fresh, out);
    });
    check(launches > 0, "probe launches", name, launches, 1);
    long long matches = 0;
    __int128 sum = 0;
    std::vector<long long> staged; // the fact's non-NULL keys as 8-byte words (the staging buffer)
    for (size_t g = 0; g < c.fact.size(); g++) {
        if (c.fact_null[g]) continue;
        long long k = c.width == 8 ? c.fact[g] : c.width == 4 ? (long long)(int)c.fact[g] : (long long)(short)c.fact[g];
        staged.push_back(k);
        auto w = want_of.find(k);
        if (w == want_of.end()) continue;
        matches += w->second.first;
        sum += w->second.second;
    }
    auto check_probe = [&](const unsigned long long *o, const char *how) {
        __int128 got = (__int128)(long long)o[2] * ((__int128)1 << 32) + (__int128)o[1];
        char what[200];
        std::snprintf(what, sizeof what, "%s (%s)", name, how);
        check(o[0] == (unsigned long long)matches, "probe matches", what, o[0], matches);
        check(got == sum, "probe payload sum (low 64 bits)", what, (long long)got, (long long)sum);
        check(o[3] == 0 && o[5] == 0 && o[6] == 0, "probe errors", what, o[3] + o[5] + o[6], 0);
    };
    check_probe(p_out, "cached blocks");
    // The same keys staged: one block of n 8-byte words, no counts, no bitmap (n not a
    // multiple of the tile, nor of 2: the last tile partial, its last bytes loaded one by one).
    unsigned long long s_out[7] = {0, 0, 0, 0, 0, 0, 0};
    std::fill(resume.begin(), resume.end(), 0);
    int s_launches = launch_all(gx, bx, s_out, 4, [&](unsigned long long fresh, unsigned long long *out) {
        uvm_join_probe(slots.data(), slots_n - 1, seed, (const unsigned char *)staged.data(), 8, nullptr,
                       staged.size(), 1, 0, nullptr, resume.data(), fresh, out);
    });
    check(s_launches > 0, "staged probe launches", name, s_launches, 1);
    check_probe(s_out, "staged keys");
    std::printf("ok %s: %lld matches, %d launches (staged %zu keys: %d)\n", name, matches, launches, staged.size(),
                s_launches);
}

// The errors: a block whose count is above N, and a table with no empty slot.
void run_errors() {
    std::vector<long long> fact(3 * N + 10);
    std::vector<bool> no_null(fact.size(), false);
    for (auto &k : fact) k = below(100);
    Blocks fk({{&fact, &no_null, 8}});
    unsigned long long too_many = N + 1;
    std::memcpy(&fk.bytes[1 * fk.stride], &too_many, 8);
    unsigned long long slots_n = 64;
    std::vector<Slot> slots(slots_n, Slot{0, 0, 0});
    std::vector<unsigned long long> resume(3ull * 2 * 64, 0);
    unsigned long long out[7] = {0, 0, 0, 0, 0, 0, 0};
    int l1 = launch_all(2, 64, out, 4, [&](unsigned long long fresh, unsigned long long *o) {
        uvm_join_probe(slots.data(), slots_n - 1, 0x77, fk.values(0), 8, fk.nulls(0), N, fk.blocks, fk.stride, fk.headers(),
                       resume.data(), fresh, o);
    });
    check(l1 > 0, "launches", "errors", l1, 1);
    check(out[5] == 1, "an overcounted block's flag", "errors", out[5], 1);
    check(out[0] == 0 && out[3] == 0, "matches and corrupted against an empty table", "errors", out[0] + out[3], 0);
    std::printf("ok errors: an overcounted block flagged\n");

    // A full table (every slot's tag set, no key equal): every walk reaches its bound.
    for (unsigned long long i = 0; i < slots_n; i++) slots[i] = Slot{(i << 1) | 1, -1, 0};
    std::fill(resume.begin(), resume.end(), 0);
    unsigned long long out2[7] = {0, 0, 0, 0, 0, 0, 0};
    int l2 = launch_all(2, 64, out2, 4, [&](unsigned long long fresh, unsigned long long *o) {
        uvm_join_probe(slots.data(), slots_n - 1, 0x77, fk.values(0), 8, fk.nulls(0), N, 1, fk.stride, fk.headers(),
                       resume.data(), fresh, o);
    });
    check(l2 > 0, "launches", "errors", l2, 1);
    check(out2[3] != 0, "a full table's corrupted count", "errors", out2[3], 1);
    std::printf("ok errors: a full table reported corrupted\n");
}

} // namespace

int main() {
    // Keys 0..999 with duplicates, ~5 % NULL keys and payloads, in three and a half blocks; fact
    // keys half matching, ~5 % NULL, in five blocks (the last partly full).
    Case mixed{"mixed keys, NULLs"};
    for (int i = 0; i < 3500; i++) {
        mixed.dim_keys.push_back(below(1000) - 200);
        mixed.dim_payloads.push_back(below(1ll << 40) - (1ll << 39));
        mixed.dim_key_null.push_back(below(20) == 0);
        mixed.dim_payload_null.push_back(below(20) == 0);
    }
    for (unsigned long long i = 0; i < 4 * N + 300; i++) {
        mixed.fact.push_back(below(2000) - 200);
        mixed.fact_null.push_back(below(20) == 0);
    }
    Case narrow = mixed;
    narrow.name = "4-byte keys";
    narrow.width = 4;
    Case shorts = mixed;
    shorts.name = "2-byte keys";
    shorts.width = 2;

    // One key 600 times: chains longer than the walk budget (the Makefile's WALK_BUDGET), so
    // that walks resume across launches, mid-batch.
    Case chains{"long chains"};
    for (int i = 0; i < 900; i++) {
        chains.dim_keys.push_back(i < 600 ? 7 : below(5000));
        chains.dim_payloads.push_back(i);
        chains.dim_key_null.push_back(false);
        chains.dim_payload_null.push_back(false);
    }
    for (unsigned long long i = 0; i < 2 * N + 77; i++) {
        chains.fact.push_back(below(8) == 0 ? 7 : below(5000));
        chains.fact_null.push_back(false);
    }
    for (auto [gx, bx] : {std::pair{1u, 32u}, {3u, 64u}, {13u, 96u}}) {
        run(mixed, gx, bx);
        run(narrow, gx, bx);
        run(shorts, gx, bx);
        run(chains, gx, bx);
    }
    run_errors();
    if (failures) {
        std::printf("kernel_emu join: %d failures\n", failures);
        return 1;
    }
    std::printf("kernel_emu join: every build and probe as computed directly\n");
    return 0;
}
