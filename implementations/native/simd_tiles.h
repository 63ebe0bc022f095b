// Register-blocked SIMD tiles and vector row helpers shared by attnbench's CPU kernels, for
// the instruction set the kernel is built for: AVX-512 where the build defines
// CPU_CAPABILITY_AVX512 (16-float vectors), else AVX2 (8-float vectors). ATen's Vectorized
// follows the same macro, so the row helpers below take the build's width too.
// Compiled into each kernel (header only, inline); the loader puts a hash of this file in
// the build flags, so a change here rebuilds the kernels.
#pragma once

#include <ATen/cpu/vec/vec.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace attnbench {
// Always inlined, with internal linkage: left to its heuristics gcc kept the tiles out of
// line (the fused window forward ran 99 ms instead of 56 with external linkage; linear's
// state pass ran at half speed once the unit grew by the causal kernel).
namespace {

#define ATTNBENCH_TILE inline __attribute__((always_inline))

using Vec = at::vec::Vectorized<float>;

inline float max_of(const float* x, int64_t n, float acc) {
  int64_t j = 0;
  if (n >= Vec::size()) {
    Vec m(acc);
    for (; j + Vec::size() <= n; j += Vec::size()) m = at::vec::maximum(m, Vec::loadu(x + j));
    float lanes[Vec::size()];
    m.store(lanes);
    for (int l = 0; l < Vec::size(); ++l) acc = std::max(acc, lanes[l]);
  }
  for (; j < n; ++j) acc = std::max(acc, x[j]);
  return acc;
}

// x <- exp(x - mx) in place; returns the sum of the new values.
inline float exp_sum(float* x, int64_t n, float mx) {
  int64_t j = 0;
  float sum = 0.f;
  if (n >= Vec::size()) {
    const Vec vm(mx);
    Vec acc(0.f);
    for (; j + Vec::size() <= n; j += Vec::size()) {
      const Vec e = (Vec::loadu(x + j) - vm).exp_u20();
      e.store(x + j);
      acc = acc + e;
    }
    float lanes[Vec::size()];
    acc.store(lanes);
    for (int l = 0; l < Vec::size(); ++l) sum += lanes[l];
  }
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] - mx);
    sum += x[j];
  }
  return sum;
}

inline float dot(const float* x, const float* y, int64_t n) {
  int64_t j = 0;
  float sum = 0.f;
  if (n >= Vec::size()) {
    Vec acc(0.f);
    for (; j + Vec::size() <= n; j += Vec::size())
      acc = at::vec::fmadd(Vec::loadu(x + j), Vec::loadu(y + j), acc);
    float lanes[Vec::size()];
    acc.store(lanes);
    for (int l = 0; l < Vec::size(); ++l) sum += lanes[l];
  }
  for (; j < n; ++j) sum += x[j] * y[j];
  return sum;
}

inline void add_into(float* x, const float* y, int64_t n) {  // x += y
  int64_t j = 0;
  for (; j + Vec::size() <= n; j += Vec::size()) (Vec::loadu(x + j) + Vec::loadu(y + j)).store(x + j);
  for (; j < n; ++j) x[j] += y[j];
}

inline void scaled_copy(const float* x, float* y, int64_t n, float s) {  // y = s * x
  int64_t j = 0;
  const Vec vs(s);
  for (; j + Vec::size() <= n; j += Vec::size()) (Vec::loadu(x + j) * vs).store(y + j);
  for (; j < n; ++j) y[j] = x[j] * s;
}

// Outputs larger than this are written with non-temporal stores (scaled_store): they do
// not fit in a core's L2 (512 KiB on the AMD EPYC hosts, 2 MiB on the Xeon), so the lines
// a normal store first reads for ownership are traffic for nothing. Smaller outputs stay in
// cache for the op that reads them next.
constexpr int64_t kStreamBytes = 4 << 20;

// Whether an output of `floats` elements is streamed (the one rule every kernel reads).
inline bool streams(int64_t floats) {
  return floats * static_cast<int64_t>(sizeof(float)) > kStreamBytes;
}

// y = s * x, with non-temporal stores where `stream` is set, y is aligned to the vector and
// n is a multiple of its width (else ordinary stores). A kernel that streamed ends with
// _mm_sfence(), so its stores are visible before it returns.
inline void scaled_store(const float* x, float* y, int64_t n, float s, bool stream) {
  if (stream && reinterpret_cast<uintptr_t>(y) % sizeof(Vec) == 0 && n % Vec::size() == 0) {
    const Vec vs(s);
    for (int64_t j = 0; j < n; j += Vec::size()) {
#if defined(CPU_CAPABILITY_AVX512)
      _mm512_stream_ps(y + j, Vec::loadu(x + j) * vs);
#else
      _mm256_stream_ps(y + j, Vec::loadu(x + j) * vs);
#endif
    }
    return;
  }
  scaled_copy(x, y, n, s);
}

// ---- register-blocked tiles (the fast path: Dv a multiple of 16) ---------------------
// A tile is R rows x 16 columns of the product held in registers: per step of the
// reduction, one row of 16 floats of the right operand is loaded, R elements of the left
// are broadcast and multiplied into it. The right operands need no per-call packing: K is
// packed once per head and piece into 16-key panels (D x 16), V rows are read as they lie
// (16 contiguous floats per key).
//
// AVX2: a row's 16 columns are two 8-float ymm accumulators, R <= 6: 12 accumulators, the
// shape of BLIS's Haswell sgemm kernel. AVX-512: one 16-float zmm a row, R <= 8: 8 FMA
// chains in flight, as many as two FMA units of 4 cycles' latency need, each loaded row
// of the right operand feeding 8 FMAs (the broadcasts fold into the FMAs). With R = 12 the
// 12 row pointers no longer fit in the general registers and the loop reloaded them from
// the stack: sliding_window's forward (N = 8192, 2 threads, medians of 12 calls in two
// processes) took 57 ms, against 48 ms with R = 8. Each output element is the same FMA
// chain over the reduction in both builds.
constexpr int64_t kPanel = 16;

#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kRows = 8;

// S[r, 0:16] = alpha * sum_d Q[r, d] * panel[d, 0:16], r < R.
template <int R>
ATTNBENCH_TILE void qk_tile(const float* q, int64_t qs, const float* panel, int64_t D, float alpha,
                    float* s, int64_t lds) {
  __m512 c[R];
  for (int r = 0; r < R; ++r) c[r] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const __m512 b = _mm512_loadu_ps(panel + d * kPanel);
    for (int r = 0; r < R; ++r) c[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * qs + d]), b, c[r]);
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(s + r * lds, _mm512_mul_ps(c[r], va));
}

// O[r, 0:16] (+)= sum_j P[r, j] * V[j, 0:16], r < R. P is row-major (row stride ldp) or,
// with Transposed, given as P^T (element (r, j) at p[j * ldp + r]).
template <int R, bool Transposed = false>
ATTNBENCH_TILE void pv_tile(const float* p, int64_t ldp, const float* v, int64_t vs, int64_t K,
                    float* o, int64_t ldo, bool accumulate) {
  __m512 c[R];
  for (int r = 0; r < R; ++r) c[r] = accumulate ? _mm512_loadu_ps(o + r * ldo) : _mm512_setzero_ps();
  for (int64_t j = 0; j < K; ++j) {
    const __m512 b = _mm512_loadu_ps(v + j * vs);
    for (int r = 0; r < R; ++r) {
      const float a = Transposed ? p[j * ldp + r] : p[r * ldp + j];
      c[r] = _mm512_fmadd_ps(_mm512_set1_ps(a), b, c[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(o + r * ldo, c[r]);
}
#else
constexpr int64_t kRows = 6;

// S[r, 0:16] = alpha * sum_d Q[r, d] * panel[d, 0:16], r < R.
template <int R>
ATTNBENCH_TILE void qk_tile(const float* q, int64_t qs, const float* panel, int64_t D, float alpha,
                    float* s, int64_t lds) {
  __m256 c0[R], c1[R];
  for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const __m256 b0 = _mm256_loadu_ps(panel + d * kPanel);
    const __m256 b1 = _mm256_loadu_ps(panel + d * kPanel + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(q + r * qs + d);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha);
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s + r * lds, _mm256_mul_ps(c0[r], va));
    _mm256_storeu_ps(s + r * lds + 8, _mm256_mul_ps(c1[r], va));
  }
}

// O[r, 0:16] (+)= sum_j P[r, j] * V[j, 0:16], r < R. P is row-major (row stride ldp) or,
// with Transposed, given as P^T (element (r, j) at p[j * ldp + r]). The offsets stay
// compile-time constants: with both strides as runtime values the loop ran at half speed.
template <int R, bool Transposed = false>
ATTNBENCH_TILE void pv_tile(const float* p, int64_t ldp, const float* v, int64_t vs, int64_t K,
                    float* o, int64_t ldo, bool accumulate) {
  __m256 c0[R], c1[R];
  for (int r = 0; r < R; ++r) {
    c0[r] = accumulate ? _mm256_loadu_ps(o + r * ldo) : _mm256_setzero_ps();
    c1[r] = accumulate ? _mm256_loadu_ps(o + r * ldo + 8) : _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < K; ++j) {
    const __m256 b0 = _mm256_loadu_ps(v + j * vs);
    const __m256 b1 = _mm256_loadu_ps(v + j * vs + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(Transposed ? p + j * ldp + r : p + r * ldp + j);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(o + r * ldo, c0[r]);
    _mm256_storeu_ps(o + r * ldo + 8, c1[r]);
  }
}
#endif

// The last band of for_row_bands: tile<R> for the R = rest rows left (0 < rest < kRows).
template <template <int> class Tile, int R, typename... Args>
ATTNBENCH_TILE void last_band(int64_t rest, int64_t i, Args... args) {
  if constexpr (R > 0) {
    if (rest == R) return Tile<R>::run(i, args...);
    last_band<Tile, R - 1>(rest, i, args...);
  }
}

// Calls tile<R> for every kRows-row band of m rows (the last band has m % kRows rows).
template <template <int> class Tile, typename... Args>
ATTNBENCH_TILE void for_row_bands(int64_t m, Args... args) {
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) Tile<kRows>::run(i, args...);
  if (m > i) last_band<Tile, kRows - 1>(m - i, i, args...);
}

template <int R>
struct QKBand {
  static ATTNBENCH_TILE void run(int64_t i, const float* q, int64_t qs, const float* panel, int64_t D,
                  float alpha, float* s, int64_t lds) {
    qk_tile<R>(q + i * qs, qs, panel, D, alpha, s + i * lds, lds);
  }
};

template <int R>
struct PVBand {
  static ATTNBENCH_TILE void run(int64_t i, const float* p, int64_t ldp, const float* v, int64_t vs,
                  int64_t K, float* o, int64_t ldo, bool accumulate) {
    pv_tile<R>(p + i * ldp, ldp, v, vs, K, o + i * ldo, ldo, accumulate);
  }
};

template <int R>
struct PVTBand {  // P given transposed: rows of the product are columns of p
  static ATTNBENCH_TILE void run(int64_t i, const float* pt, int64_t ldp, const float* v, int64_t vs,
                  int64_t K, float* o, int64_t ldo, bool accumulate) {
    pv_tile<R, true>(pt + i, ldp, v, vs, K, o + i * ldo, ldo, accumulate);
  }
};

// Keys [k0, k1) of one head (k0 a multiple of kPanel) as (D, kPanel) panels; keys outside
// [0, Nk) are zero.
inline void pack_keys(const float* kh, int64_t ks, int64_t D, int64_t Nk, int64_t k0, int64_t k1,
               float* dst) {
  for (int64_t p = 0; p * kPanel < k1 - k0; ++p) {
    float* panel = dst + p * D * kPanel;  // (D, kPanel)
    for (int64_t c = 0; c < kPanel; ++c) {
      const int64_t key = k0 + p * kPanel + c;
      if (key >= 0 && key < Nk) {
        const float* row = kh + key * ks;
        for (int64_t d = 0; d < D; ++d) panel[d * kPanel + c] = row[d];
      } else {
        for (int64_t d = 0; d < D; ++d) panel[d * kPanel + c] = 0.f;
      }
    }
  }
}

inline int64_t floor_to(int64_t x, int64_t a) {
  return x >= 0 ? x / a * a : -((-x + a - 1) / a) * a;
}
inline int64_t ceil_to(int64_t x, int64_t a) { return floor_to(x + a - 1, a); }

}  // namespace
}  // namespace attnbench
