// The scan kernel (uvm_scan_groups of kernels/segment.cu) run on the CPU, one thread after
// another (cuda_shim.h), over a small column cache in the extension's block layout, for a set of
// programs that reach every path of the kernel: filters of each kind and clauses of
// alternatives, NULLs, a join with duplicate keys, keyless programs of each aggregate kind
// (the per-thread states: SCAN_SOLO) and of more aggregates than those, grouped programs, both
// ways of running (one pass, and key pass then fold pass), a first row past the block's start,
// and programs that end in an ERROR. It prints every run's groups and outcome words in a
// canonical order, so that two versions of the kernel can be compared:
//
//   make -C tests/kernel_emu check BASE=<an older segment.cu>
//
// builds this file against both and fails if their outputs differ (tests/kernel_emu/Makefile).
// Threads run one at a time, so what this checks is the kernel's logic (which rows fold, into
// which groups, with which errors), not its races: those only the GPU suite sees.
#include "cuda_shim.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

Dim3 threadIdx, blockIdx, blockDim, gridDim;

#include KERNEL

namespace {

using u64v = std::vector<unsigned long long>;

unsigned long long rng_state = 0x1234567;
unsigned long long next() {
    rng_state += 0x9E3779B97F4A7C15ull;
    return mix(rng_state);
}
long long below(long long n) { return (long long)(next() % (unsigned long long)n); }

const unsigned long long N = 1024;  // rows per block
const unsigned long long ALIGN = 256;
const unsigned long long COUNTS[] = {1024, 1024, 700, 1024, 333};
const int BLOCKS = 5;

struct Col {
    unsigned long long width;
    bool sgn;
    unsigned long long values_at = 0, nulls_at = 0;
};

// c0 date key (int4, 0..99) | c1 discount (int4 0..10, 5% NULL) | c2 quantity (int4 1..50)
// c3 price (int8) | c4 big (int8 near 2^62: sums carry) | c5 key of B (int4 0..49, 10% NULL)
// c6 float8 (halves, 10% NULL) | c7 int2 (signed) | c8 bool (int1, NULLs) | c9 code (int4 0..20)
std::vector<Col> cols = {{4, true}, {4, true}, {4, true}, {8, true}, {8, true},
                         {4, true}, {8, false}, {2, true}, {1, false}, {4, false}};

unsigned long long al(unsigned long long x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

std::vector<unsigned char> cache;
unsigned long long stride;

void put(int b, int c, unsigned long long r, unsigned long long v, bool null) {
    unsigned char *blk = cache.data() + b * stride;
    std::memcpy(blk + cols[c].values_at + r * cols[c].width, &v, cols[c].width);
    if (null) blk[cols[c].nulls_at + r / 8] |= (unsigned char)(1u << (r % 8));
}

void make_cache() {
    unsigned long long at = ALIGN;
    for (auto &c : cols) {
        c.values_at = al(at);
        c.nulls_at = al(c.values_at + N * c.width);
        at = al(c.nulls_at + N / 8);
    }
    stride = at;
    cache.assign(stride * BLOCKS, 0);
    for (int b = 0; b < BLOCKS; b++) {
        std::memcpy(cache.data() + b * stride, &COUNTS[b], 8);
        for (unsigned long long r = 0; r < N; r++) {
            // (rows past the count hold values too, as a cache's may: never read as rows)
            put(b, 0, r, (unsigned long long)below(100), false);
            put(b, 1, r, (unsigned long long)below(11), below(20) == 0);
            put(b, 2, r, (unsigned long long)(1 + below(50)), false);
            put(b, 3, r, (unsigned long long)(90000 + below(10000000)), false);
            put(b, 4, r, (unsigned long long)((1ll << 62) - below(1ll << 40)) * (below(3) == 0 ? ~0ull : 1ull), false);
            put(b, 5, r, (unsigned long long)below(50), below(10) == 0);
            double d = (double)(below(2001) - 1000) / 2.0;
            unsigned long long bits;
            std::memcpy(&bits, &d, 8);
            put(b, 6, r, bits, below(10) == 0);
            put(b, 7, r, (unsigned long long)(long long)(below(2001) - 1000), false);
            put(b, 8, r, (unsigned long long)below(2), below(7) == 0);
            put(b, 9, r, (unsigned long long)below(21), false);
        }
    }
}

// A GpuJoin table of (key, payload) pairs (table.rs: tag mix(key ^ seed) | 1, linear probing).
struct Table {
    std::vector<Slot> slots;
    unsigned long long mask, seed = 0x5EED, bound;
    Table(const std::vector<std::pair<long long, long long>> &pairs, unsigned long long n) {
        slots.assign(n, Slot{0, 0, 0});
        mask = n - 1;
        for (auto [k, p] : pairs) {
            unsigned long long t = mix((unsigned long long)k ^ seed) | 1ull, i = t & mask;
            while (slots[i].tag != 0) i = (i + 1) & mask;
            slots[i] = Slot{t, k, p};
        }
        unsigned long long run = 0, longest = 0;
        for (unsigned long long i = 0; i < 2 * n; i++) {
            run = slots[i & mask].tag ? run + 1 : 0;
            longest = std::max(longest, run);
        }
        bound = std::min(longest, n) + 1;
    }
    u64v word(unsigned long long col) const {
        return {col, (unsigned long long)slots.data(), mask, seed, bound};
    }
};

struct Filter {
    unsigned long long col, kind;
    bool orr;
    unsigned long long a = 0, b = 0;  // range lo/hi; code bitmap's (at, len); compare (at, sides)
};

struct Program {
    std::vector<Filter> filters;
    u64v steps;  // pairs of words
    std::vector<unsigned char> data;
    std::vector<u64v> joins;
    u64v keys;
    u64v aggs;  // pairs of words
};

u64v words(const Program &p) {
    u64v c;
    for (auto &x : cols) c.insert(c.end(), {x.values_at, x.nulls_at, x.width, (unsigned long long)x.sgn});
    u64v f;
    for (auto &x : p.filters) f.insert(f.end(), {x.col | x.kind << 32 | (unsigned long long)x.orr << 40, x.a, x.b, 0});
    u64v j;
    for (auto &x : p.joins) j.insert(j.end(), x.begin(), x.end());
    const unsigned long long HEAD = 14;
    unsigned long long at_cols = HEAD, at_filters = at_cols + c.size(), at_steps = at_filters + f.size(),
                       at_joins = at_steps + p.steps.size(), at_keys = at_joins + j.size(),
                       at_aggs = at_keys + p.keys.size(), at_data = at_aggs + p.aggs.size();
    u64v w = {p.filters.size(), p.joins.size(), p.keys.size(), p.aggs.size() / 2, cols.size(), p.steps.size() / 2,
              p.data.size(), at_cols, at_filters, at_steps, at_joins, at_keys, at_aggs, at_data};
    for (const u64v *part : {(const u64v *)&c, (const u64v *)&f, &p.steps, (const u64v *)&j, &p.keys, &p.aggs}) w.insert(w.end(), part->begin(), part->end());
    for (size_t i = 0; i < p.data.size(); i += 8) {
        unsigned long long x = 0;
        std::memcpy(&x, p.data.data() + i, std::min<size_t>(8, p.data.size() - i));
        w.push_back(x);
    }
    return w;
}

// Runs `p` over the cache from row first_row of block 0, launches of `per` blocks, grids of
// gx blocks of bx threads, in one pass (both = true) or a key pass and a fold pass; prints the
// groups (sorted) and the outcome.
void run(const char *name, const Program &p, bool both, unsigned long long first_row = 0, unsigned long long per = 2,
         unsigned gx = 3, unsigned bx = 64) {
    u64v prog = words(p);
    unsigned long long kw = p.keys.size() + 1, naggs = p.aggs.size() / 2, slot_words = 1 + kw + 2 * naggs;
    unsigned long long slots_n = 1 << 14;
    u64v slots(slots_n * slot_words, 0);
    unsigned long long groups = 0;
    unsigned long long out_total[6] = {0, 0, 0, 0, 0, 0};
    gridDim.x = gx;
    blockDim.x = bx;
    for (unsigned long long first = 0; first < (unsigned long long)BLOCKS && out_total[2] == 0; first += per) {
        unsigned long long count = std::min(per, BLOCKS - first);
        std::vector<unsigned long long> modes = both ? std::vector<unsigned long long>{2} : std::vector<unsigned long long>{0, 1};
        for (auto mode : modes) {
            unsigned long long out[6] = {0, 0, 0, 0, 0, 0};
            for (unsigned b = 0; b < gx; b++) {
                for (unsigned w = 0; w < bx; w += 32) {
                    blockIdx.x = b;
                    emu::run_warp(w, [&] {
                        uvm_scan_groups(prog.data(), cache.data() + first * stride, N, count, stride,
                                        first == 0 ? first_row : 0, slots.data(), slots_n - 1, 0x77, kw, slot_words,
                                        &groups, slots_n / 2, mode, out);
                    });
                }
            }
            for (int i = 0; i < 6; i++) out_total[i] = i == 2 ? (out_total[2] ? out_total[2] : out[2]) : out_total[i] + out[i];
            if (out[2]) break;
        }
    }
    std::printf("== %s (%s, first row %llu)\n", name, both ? "one pass" : "two passes", first_row);
    if (out_total[2]) {
        // (an ERROR: where the threads stopped, and so the states, are not the answer)
        std::printf("outcome: error %llu\n", out_total[2]);
        return;
    }
    std::printf("outcome: corrupted %llu, refused %llu, bad block %llu, folded %llu, walks %llu; groups %llu\n",
                out_total[0], out_total[1], out_total[3], out_total[4], out_total[5], groups);
    std::vector<std::string> lines;
    for (unsigned long long i = 0; i < slots_n; i++) {
        const unsigned long long *s = slots.data() + i * slot_words;
        if (!s[0]) continue;
        std::string l = "key";
        char buf[64];
        for (unsigned long long k = 0; k < kw; k++) {
            std::snprintf(buf, sizeof buf, " %lld", (long long)s[1 + k]);
            l += buf;
        }
        l += " |";
        for (unsigned long long a = 0; a < naggs; a++) {
            unsigned long long kind = p.aggs[2 * a] & 0xffff, lo = s[1 + kw + 2 * a], hi = s[2 + kw + 2 * a];
            if (kind >= 6) {
                std::snprintf(buf, sizeof buf, " %.17g/%llu", __longlong_as_double((long long)lo), hi);
            } else {
                std::snprintf(buf, sizeof buf, " %lld/%lld", (long long)lo, (long long)hi);
            }
            l += buf;
        }
        lines.push_back(l);
    }
    std::sort(lines.begin(), lines.end());
    // Every group's line goes into a digest; the first few are printed, for a reader of a diff.
    unsigned long long digest = 0;
    for (auto &l : lines)
        for (unsigned char c : l + "\n") digest = mix(digest ^ c);
    std::printf("digest of the %zu groups' lines: %016llx\n", lines.size(), digest);
    for (size_t i = 0; i < lines.size() && i < 8; i++) std::printf("%s\n", lines[i].c_str());
}

// An aggregate's two words: kind (groups::AggKind), input kind (1 column, 2 a - b, 3 a * b,
// 4 float4 column, 0 none), its columns.
struct Agg {
    unsigned long long kind, input, a = 0, b = 0;
};

void add_aggs(Program &p, std::initializer_list<Agg> aggs) {
    for (auto &x : aggs) p.aggs.insert(p.aggs.end(), {x.kind | x.input << 16, x.a | x.b << 32});
}

}  // namespace

int main() {
    make_cache();
    // A: the date-like dimension, keys 0..99, 60 of them, payload key % 7.
    std::vector<std::pair<long long, long long>> a_pairs, b_pairs;
    for (long long k = 0; k < 100; k++)
        if (k % 5 != 0 && k % 7 != 3) a_pairs.push_back({k, k % 7});
    Table A(a_pairs, 256);
    // B: keys 0..49, some of them two or three times (payloads distinct), some missing.
    for (long long k = 0; k < 50; k++) {
        if (k % 9 == 4) continue;
        b_pairs.push_back({k, 100 + k});
        if (k % 4 == 1) b_pairs.push_back({k, 200 + k});
        if (k % 12 == 5) b_pairs.push_back({k, 300 + k});
    }
    Table B(b_pairs, 256);

    for (bool both : {true, false}) {
        // Q1-like: c1 in [1, 3], c2 <= 24, c0 joins A; sum(c3 * c1).
        Program q1;
        q1.filters = {{1, 1, false, 1, 3}, {2, 1, false, (unsigned long long)LLONG_MIN, 24}};
        q1.joins = {A.word(0)};
        add_aggs(q1, {{3, 3, 3, 1}});
        run("keyless, one join, sum(c3 * c1)", q1, both);

        // Keyless, four aggregates of integer kinds (per-thread states), no filter.
        Program k4;
        add_aggs(k4, {{1, 0}, {2, 1, 1}, {3, 1, 4}, {4, 1, 7}});
        run("keyless: count(*), count(c1), sum(c4), min(c7)", k4, both);

        // Keyless, float states and an integer max; a filter on a bool.
        Program kf;
        kf.filters = {{8, 1, false, 1, 1}};
        add_aggs(kf, {{6, 1, 6}, {7, 1, 6}, {8, 1, 6}, {5, 1, 7}});
        run("keyless: sum, min, max of c6, max(c7) where c8", kf, both);

        // Keyless over a join with duplicate keys: rows of several matches fold the general way.
        Program kd;
        kd.joins = {B.word(5)};
        add_aggs(kd, {{1, 0}, {3, 1, 3}, {5, 1, 2}});
        run("keyless over B's duplicates: count(*), sum(c3), max(c2)", kd, both);

        // Keyless, five aggregates (past SCAN_SOLO) and a comparison: (c2 * 3 - c1) > 40.
        Program k5;
        k5.steps = {1, 2, 2, 3, 3 | (3ull << 8) | (8ull << 16), 0, 1, 1, 3 | (2ull << 8) | (8ull << 16), 0, 2, 40};
        k5.filters = {{2, 4, false, 0, 5 | 1ull << 16 | 5ull << 32}};
        add_aggs(k5, {{1, 0}, {2, 1, 1}, {3, 1, 4}, {4, 1, 7}, {5, 1, 3}});
        run("keyless, five aggregates, (c2 * 3 - c1) > 40", k5, both);

        // Grouped by A's payload, B's payload and c8, with clauses of alternatives:
        // (c2 < 10 OR c9 IN {2, 3, 5, 7, 11, 13, 17, 19}) AND (c1 IS NULL OR c1 >= 5).
        Program g;
        g.data.assign(3, 0);
        for (int c : {2, 3, 5, 7, 11, 13, 17, 19}) g.data[c / 8] |= (unsigned char)(1 << (c % 8));
        g.filters = {{2, 1, false, (unsigned long long)LLONG_MIN, 9}, {9, 2, true, 0, 3},
                     {1, 3, false}, {1, 1, true, 5, (unsigned long long)LLONG_MAX}};
        g.joins = {A.word(0), B.word(5)};
        g.keys = {2ull << 32 | 0, 2ull << 32 | 1, 1ull << 32 | 8};
        add_aggs(g, {{1, 0}, {3, 1, 4}, {4, 1, 3}, {5, 1, 1}, {3, 2, 3, 2}});
        run("grouped by A, B, c8 with alternatives", g, both);
        run("grouped by A, B, c8 with alternatives", g, both, 100);
        run("grouped, one warp", g, both, 0, 2, 1, 32);
        run("grouped, a grid wider than the rows", g, both, 0, 5, 40, 256);

        // Three joins, most rows passing each: the warps' queues between the joins hold many
        // rows when their loops end, so the drain goes through every queue with some left.
        Program s3;
        s3.joins = {A.word(0), B.word(5), A.word(0)};
        s3.keys = {2ull << 32 | 0, 2ull << 32 | 1};
        add_aggs(s3, {{1, 0}, {3, 1, 3}});
        run("grouped by A and B over three joins", s3, both);
        run("grouped by A and B over three joins, one warp a block", s3, both, 0, 2, 5, 32);
        // Joins that pass most rows after ones that pass fewer, on grids of 1 to 13 blocks: the
        // drain at the loops' end meets queues with many rows each, where a queue taken whole
        // once pushed more rows into the next than it holds (seen here as the kernel's program
        // error, which its queues now refuse with rather than write past their end).
        for (unsigned gx : {1u, 2u, 3u, 7u, 13u}) {
            Program s4;
            s4.joins = {B.word(5), A.word(0), B.word(5), A.word(0)};
            s4.keys = {2ull << 32 | 1};
            add_aggs(s4, {{1, 0}});
            run(("B, A, B, A, grid of " + std::to_string(gx)).c_str(), s4, both, 0, 2, gx, 96);
            Program s5;
            s5.filters = {{2, 1, false, (unsigned long long)LLONG_MIN, 30}};
            s5.joins = {A.word(0), B.word(5), A.word(0)};
            s5.keys = {2ull << 32 | 1};
            add_aggs(s5, {{1, 0}});
            run(("c2 <= 30, A, B, A, grid of " + std::to_string(gx)).c_str(), s5, both, 0, 2, gx, 64);
        }

        // Errors: c2 / (c1 - 5) > 0 divides by zero where c1 = 5; sum(c4 * c4) overflows.
        Program e1;
        e1.steps = {1, 2, 1, 1, 2, 5, 3 | (2ull << 8) | (8ull << 16), 0, 3 | (4ull << 8) | (8ull << 16), 0, 2, 0};
        e1.filters = {{2, 4, false, 0, 5 | 1ull << 16 | 5ull << 32}};
        add_aggs(e1, {{1, 0}});
        run("division by zero in a filter", e1, both);
        Program e2;
        e2.filters = {{2, 1, false, 40, 50}};
        add_aggs(e2, {{3, 3, 4, 4}});
        run("an overflowing product", e2, both);
        Program e3 = e2;
        e3.keys = {1ull << 32 | 9};
        run("an overflowing product, grouped", e3, both);
    }
    return 0;
}
