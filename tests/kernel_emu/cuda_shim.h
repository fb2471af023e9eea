// CUDA, as much of it as kernels/segment.cu uses, for running its kernels on the CPU one
// thread after another (tests/kernel_emu/scan.cpp, join.cpp). Every "atomic" is a plain read-modify-write:
// threads never run at once here, so the kernels' logic (which rows, which errors, which
// states) is tested, not their races, which only the GPU suite can show.
//
// A warp's 32 lanes run as coroutines (emu::run_warp), one at a time: a lane at a warp
// collective (__ballot_sync, __any_sync, __syncwarp, __shfl_down_sync) waits there until every
// lane has come to one, and the collective's result is then computed from them all. A lane
// that returns while others wait at a collective, or lanes at different collectives, abort
// the run: on the GPU that is a hang or undefined behaviour, so the emulator checks that the
// kernel keeps its warps together where it says it does.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <ucontext.h>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static

struct Dim3 { unsigned int x; };
extern Dim3 threadIdx, blockIdx, blockDim, gridDim;

struct ulonglong2 { unsigned long long x, y; };

inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) { auto o = *p; *p = o + v; return o; }
inline double atomicAdd(double *p, double v) { double o = *p; *p = o + v; return o; }
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long c, unsigned long long v) {
    auto o = *p; if (o == c) *p = v; return o;
}
inline unsigned long long atomicExch(unsigned long long *p, unsigned long long v) { auto o = *p; *p = v; return o; }
inline long long atomicMin(long long *p, long long v) { auto o = *p; if (v < o) *p = v; return o; }
inline long long atomicMax(long long *p, long long v) { auto o = *p; if (v > o) *p = v; return o; }
inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v) { auto o = *p; if (v > o) *p = v; return o; }
inline unsigned long long atomicOr(unsigned long long *p, unsigned long long v) { auto o = *p; *p = o | v; return o; }
inline void __threadfence() {}
inline void __threadfence_system() {}
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * (__int128)b) >> 64); }
inline long long __double_as_longlong(double d) { long long x; std::memcpy(&x, &d, 8); return x; }
inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }

namespace emu {
struct Lane {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done = false, waiting = false;
    int op = 0, arg = 0;
    unsigned long long val = 0, res = 0;
};
inline Lane lanes[32];
inline int cur;
inline ucontext_t sched;
inline std::function<void()> body;

inline void entry() {
    body();
    lanes[cur].done = true; // (back to sched through uc_link)
}

// The calling lane's part in collective `op` (with `arg`, the same in every lane): waits for
// the warp, returns the ballot of vals (op SHFL_DOWN: the val of lane + arg, or its own where
// that is past lane 31).
constexpr int SHFL_DOWN = 4;
inline unsigned long long collective(int op, unsigned long long v, int arg = 0) {
    int me = cur;
    lanes[me].op = op;
    lanes[me].arg = arg;
    lanes[me].val = v;
    lanes[me].waiting = true;
    swapcontext(&lanes[me].ctx, &sched);
    return lanes[me].res;
}

// Runs fn as threads first .. first + 31 of the current block (threadIdx.x set per lane).
inline void run_warp(unsigned first, std::function<void()> fn) {
    body = std::move(fn);
    for (int i = 0; i < 32; i++) {
        Lane &l = lanes[i];
        l.done = l.waiting = false;
        l.stack.assign(1 << 18, 0);
        getcontext(&l.ctx);
        l.ctx.uc_stack.ss_sp = l.stack.data();
        l.ctx.uc_stack.ss_size = l.stack.size();
        l.ctx.uc_link = &sched;
        makecontext(&l.ctx, entry, 0);
    }
    for (;;) {
        for (int i = 0; i < 32; i++) {
            if (lanes[i].done || lanes[i].waiting) continue;
            cur = i;
            threadIdx.x = first + i;
            swapcontext(&sched, &lanes[i].ctx);
        }
        int done = 0, waiting = 0, op = 0, arg = 0;
        unsigned long long ballot = 0;
        for (int i = 0; i < 32; i++) {
            done += lanes[i].done;
            if (!lanes[i].waiting) continue;
            waiting++;
            if (op != 0 && (lanes[i].op != op || lanes[i].arg != arg)) {
                std::fprintf(stderr, "kernel_emu: the lanes of a warp at different collectives\n");
                std::abort();
            }
            op = lanes[i].op;
            arg = lanes[i].arg;
            if (lanes[i].val) ballot |= 1ull << i;
        }
        if (done == 32) return;
        if (done != 0) {
            std::fprintf(stderr, "kernel_emu: %d lanes returned while %d wait at a warp collective\n", done, waiting);
            std::abort();
        }
        for (int i = 0; i < 32; i++) {
            lanes[i].res = op != SHFL_DOWN ? ballot : i + arg < 32 ? lanes[i + arg].val : lanes[i].val;
            lanes[i].waiting = false;
        }
    }
}
} // namespace emu

inline unsigned __ballot_sync(unsigned, int pred) { return (unsigned)emu::collective(1, pred != 0); }
inline int __any_sync(unsigned, int pred) { return emu::collective(2, pred != 0) != 0; }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::collective(3, 0); }
inline unsigned long long __shfl_down_sync(unsigned, unsigned long long v, int off) {
    return emu::collective(emu::SHFL_DOWN, v, off);
}
using std::isfinite;
using std::isinf;
using std::isnan;
