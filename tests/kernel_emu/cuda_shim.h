// CUDA, as much of it as kernels/segment.cu uses, for running its kernels on the CPU one
// thread after another (tests/kernel_emu/scan.cpp). Every "atomic" is a plain read-modify-write:
// threads never run at once here, so the kernels' logic (which rows, which errors, which
// states) is tested, not their races, which only the GPU suite can show.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

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
// (only the reductions of other kernels shuffle: one lane's value is the warp's here)
inline unsigned long long __shfl_down_sync(unsigned, unsigned long long v, int) { return 0; }
using std::isfinite;
using std::isinf;
using std::isnan;
