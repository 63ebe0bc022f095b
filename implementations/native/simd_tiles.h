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
// line, which slowed every kernel that uses them.
namespace {

#define ATTNBENCH_TILE inline __attribute__((always_inline))

using Vec = at::vec::Vectorized<float>;

#if defined(CPU_CAPABILITY_AVX512)
// exp(min(x, 0)) of 16 floats: 2^(n/16) from a 16-entry table (one register permute) times
// a degree-3 polynomial on |r| <= ln2/32, scaled by 2^floor(n/16) with vscalefps (which
// also gives the denormals, and 0 below -103.3); x below -104 is taken as -104, NaN stays
// NaN. On AVX-512 every vector op shares ports 0 and 5 with the tiles' FMAs, so phi's cost
// is the count of its exp's ops: 13 here, about 19 in exp_u20, at float32 accuracy.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 xm =
      _mm512_max_ps(_mm512_set1_ps(-104.f), _mm512_min_ps(_mm512_setzero_ps(), x));
  const __m512 magic = _mm512_set1_ps(12582912.f);  // 1.5 * 2^23: s - magic = round(t)
  const __m512 s = _mm512_fmadd_ps(xm, _mm512_set1_ps(23.083120654223414f), magic);  // 16/ln2
  const __m512 n = _mm512_sub_ps(s, magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.043321698904037476f), xm);  // ln2/16, hi
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-1.1904088825787085e-10f), r);  // and lo
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.f / 6.f), r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));  // exp(r), |r| <= ln2/32
  const __m512 two_j16 = _mm512_setr_ps(  // 2^(j/16), j = 0..15
      1.0f, 1.0442737340927124f, 1.0905077457427979f, 1.1387885808944702f,
      1.1892070770263672f, 1.2418577671051025f, 1.2968395948410034f, 1.3542555570602417f,
      1.4142135381698608f, 1.4768261909484863f, 1.5422108173370361f, 1.610490322113037f,
      1.6817928552627563f, 1.7562521696090698f, 1.8340080976486206f, 1.9152065515518188f);
  // the permute reads the low 4 bits of s, those of n: 2^((n mod 16) / 16)
  const __m512 t = _mm512_permutexvar_ps(_mm512_castps_si512(s), two_j16);
  return _mm512_scalef_ps(_mm512_mul_ps(t, p), _mm512_mul_ps(n, _mm512_set1_ps(1.f / 16.f)));
}

#endif

// exp(x) of a vector of nonpositive x (a score less its row's max): exp_nonpositive on
// AVX-512, ATen's exp_u20 on AVX2.
inline Vec exp_le0(const Vec& x) {
#if defined(CPU_CAPABILITY_AVX512)
  return exp_nonpositive(x);
#else
  return x.exp_u20();
#endif
}

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

// The sum of a vector's lanes by a pairwise tree (halves, then quarters...): its rounding
// error grows with log2 of the width, not with the width as a chain's does.
inline float lane_sum(const Vec& v) {
  float lanes[Vec::size()];
  v.store(lanes);
  for (int width = Vec::size() / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  return lanes[0];
}

// x <- exp(x - mx) in place; returns the sum of the new values.
inline float exp_sum(float* x, int64_t n, float mx) {
  int64_t j = 0;
  float sum = 0.f;
  if (n >= Vec::size()) {
    const Vec vm(mx);
    Vec acc(0.f);
    for (; j + Vec::size() <= n; j += Vec::size()) {
      const Vec e = exp_le0(Vec::loadu(x + j) - vm);
      e.store(x + j);
      acc = acc + e;
    }
    sum = lane_sum(acc);
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

#if defined(CPU_CAPABILITY_AVX512)
// The 16 lanes' sums of 16 vectors at once: out lane i = the sum of acc[i]'s lanes, by the
// same pairwise tree for every row (lanes l and l + 8, then + 4, + 2, + 1: lane_sum's tree,
// in registers), so a row's sum does not depend on which rows share its call. 45 shuffles
// and adds for 16 rows, where dot() stores each row's vector and adds its lanes in a chain
// of 16.
ATTNBENCH_TILE __m512 lane_sums16(const __m512* acc) {
  __m512 s[8], t[4], u[2];
  for (int i = 0; i < 8; ++i)  // rows 2i, 2i+1: their lanes j + (j + 8), 8 each
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit lane q: row 4i + q's 4 partial sums
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // lane q: 2 partials of row 8i + q, then 2 of row 8i + 4 + q
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
  // element 4q + j: row 4j + q
  const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88),
                                 _mm512_shuffle_ps(u[0], u[1], 0xDD));
  const __m512i order =
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, w);
}
#endif

// out[i] = x[i, 0:n] . y[0:n] for rows i < m, ld apart: the kernels' one definition of a
// row's dot with a shared vector (linear's denominators phi(Q_i) . z, forward and backward,
// and causal rows' sums). On AVX-512, with n a multiple of 16, 16 rows are reduced together
// (lane_sums16); else row by row with dot().
inline void row_dots(const float* x, int64_t ld, int64_t m, const float* y, int64_t n,
                     float* out) {
#if defined(CPU_CAPABILITY_AVX512)
  if (n % 16 == 0) {
    for (int64_t i0 = 0; i0 < m; i0 += 16) {
      const int64_t rows = std::min<int64_t>(16, m - i0);
      __m512 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
      for (int64_t j = 0; j < n; j += 16) {
        const __m512 yj = _mm512_loadu_ps(y + j);
        for (int i = 0; i < rows; ++i)
          acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(x + (i0 + i) * ld + j), yj, acc[i]);
      }
      _mm512_mask_storeu_ps(out + i0, static_cast<__mmask16>((1u << rows) - 1),
                            lane_sums16(acc));
    }
    return;
  }
#endif
  for (int64_t i = 0; i < m; ++i) out[i] = dot(x + i * ld, y, n);
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
// A tile is R rows x P panels (16 columns each) of a product held in registers: per step
// of the reduction, one row of the right operand (P x 16 floats) is loaded, R elements of
// the left are broadcast and multiplied into it. The right operands need no per-call
// packing: K is packed once per head and piece into 16-key panels (D x 16, consecutive
// panels D * 16 floats apart), V rows are read as they lie (contiguous floats per key).
// Each output element is the same FMA chain(s) over the reduction whatever the tile's shape,
// so the shape changes speed and never a result.
//
// AVX2: 6 rows x 1 panel, two 8-float ymm a row: 12 accumulators, the shape of BLIS's
// Haswell sgemm kernel. AVX-512: 4 rows x 4 panels, four 16-float zmm a row: 16 chains in
// flight for two FMA units of 4 cycles' latency, and 8 loads per 16 FMAs (a narrower
// 8 x 16 tile had too few chains and too many loads to keep the FMA units busy).
constexpr int64_t kPanel = 16;

// Where a product's tiles put their sums: kStore overwrites the output, kChain continues
// the output's values (one FMA chain over both reductions), kAdd adds its own chain to them
// (o + sum: one more level of the sum, without a buffer for the product in between).
enum class Into { kStore, kChain, kAdd };

// Where a score's sum over d splits: qk_tile sums d < score_half(D) and the rest as two FMA
// chains, then adds them. A chain's rounding grows with its partial sums, which for the
// scores of unit-variance q and k grow with sqrt(d); two halves lower the error for little
// time, where quarters cost more time than their extra accuracy is worth.
inline int64_t score_half(int64_t D) { return D / 2; }

#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kRows = 4;  // rows per full tile
constexpr int kPanels = 4;  // panels per full tile

// c[r][x] = sum_{d0 <= d < d1} Q[r, d] * panels[x][d, 0:16]: one FMA chain per element.
template <int R, int P>
ATTNBENCH_TILE void qk_chain(const float* q, int64_t qs, const float* panels, int64_t D,
                             int64_t d0, int64_t d1, __m512 (&c)[R][P]) {
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < P; ++x) c[r][x] = _mm512_setzero_ps();
  for (int64_t d = d0; d < d1; ++d) {
    __m512 b[P];
    for (int x = 0; x < P; ++x) b[x] = _mm512_loadu_ps(panels + x * D * kPanel + d * kPanel);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(q[r * qs + d]);
      for (int x = 0; x < P; ++x) c[r][x] = _mm512_fmadd_ps(a, b[x], c[r][x]);
    }
  }
}

// S[r, 0:16P] = alpha * sum_d Q[r, d] * panels[x][d, 0:16], r < R, x < P, the sum over d
// in two halves (score_half), the first parked in S until the second is added to it.
template <int R, int P>
ATTNBENCH_TILE void qk_tile(const float* q, int64_t qs, const float* panels, int64_t D,
                            float alpha, float* s, int64_t lds) {
  __m512 c[R][P];
  const int64_t half = score_half(D);
  qk_chain<R, P>(q, qs, panels, D, 0, half, c);
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < P; ++x) _mm512_storeu_ps(s + r * lds + x * kPanel, c[r][x]);
  qk_chain<R, P>(q, qs, panels, D, half, D, c);
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < P; ++x) {
      float* out = s + r * lds + x * kPanel;
      _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_add_ps(_mm512_loadu_ps(out), c[r][x]), va));
    }
}

// O[r, 0:16P] (+)= sum_j P[r, j] * V[j, 0:16P], r < R, as `into` says. P is row-major (row
// stride ldp) or, with Transposed, given as P^T (element (r, j) at p[j * ldp + r]).
template <int R, int P, bool Transposed>
ATTNBENCH_TILE void pv_tile(const float* p, int64_t ldp, const float* v, int64_t vs, int64_t K,
                            float* o, int64_t ldo, Into into) {
  __m512 c[R][P];
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < P; ++x)
      c[r][x] = into == Into::kChain ? _mm512_loadu_ps(o + r * ldo + x * kPanel)
                                     : _mm512_setzero_ps();
  for (int64_t j = 0; j < K; ++j) {
    __m512 b[P];
    for (int x = 0; x < P; ++x) b[x] = _mm512_loadu_ps(v + j * vs + x * kPanel);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(Transposed ? p[j * ldp + r] : p[r * ldp + j]);
      for (int x = 0; x < P; ++x) c[r][x] = _mm512_fmadd_ps(a, b[x], c[r][x]);
    }
  }
  if (into == Into::kAdd)
    for (int r = 0; r < R; ++r)
      for (int x = 0; x < P; ++x)
        c[r][x] = _mm512_add_ps(_mm512_loadu_ps(o + r * ldo + x * kPanel), c[r][x]);
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < P; ++x) _mm512_storeu_ps(o + r * ldo + x * kPanel, c[r][x]);
}
#else
constexpr int64_t kRows = 6;
constexpr int kPanels = 1;

// c0[r], c1[r] = sum_{d0 <= d < d1} Q[r, d] * panels[d, 0:8], panels[d, 8:16]: one FMA
// chain per element.
template <int R>
ATTNBENCH_TILE void qk_chain(const float* q, int64_t qs, const float* panels, int64_t d0,
                             int64_t d1, __m256 (&c0)[R], __m256 (&c1)[R]) {
  for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
  for (int64_t d = d0; d < d1; ++d) {
    const __m256 b0 = _mm256_loadu_ps(panels + d * kPanel);
    const __m256 b1 = _mm256_loadu_ps(panels + d * kPanel + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(q + r * qs + d);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
}

// S[r, 0:16] = alpha * sum_d Q[r, d] * panels[d, 0:16], r < R (P = 1 only), the sum over d
// in two halves (score_half), as on AVX-512.
template <int R, int P>
ATTNBENCH_TILE void qk_tile(const float* q, int64_t qs, const float* panels, int64_t D,
                            float alpha, float* s, int64_t lds) {
  static_assert(P == 1, "the AVX2 tiles are one panel wide");
  __m256 c0[R], c1[R];
  const int64_t half = score_half(D);
  qk_chain<R>(q, qs, panels, 0, half, c0, c1);
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s + r * lds, c0[r]);
    _mm256_storeu_ps(s + r * lds + 8, c1[r]);
  }
  qk_chain<R>(q, qs, panels, half, D, c0, c1);
  const __m256 va = _mm256_set1_ps(alpha);
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s + r * lds,
                     _mm256_mul_ps(_mm256_add_ps(_mm256_loadu_ps(s + r * lds), c0[r]), va));
    _mm256_storeu_ps(s + r * lds + 8,
                     _mm256_mul_ps(_mm256_add_ps(_mm256_loadu_ps(s + r * lds + 8), c1[r]), va));
  }
}

// O[r, 0:16] (+)= sum_j P[r, j] * V[j, 0:16], r < R (P = 1 only), as `into` says. P is
// row-major (row stride ldp) or, with Transposed, given as P^T (element (r, j) at
// p[j * ldp + r]). The offsets stay compile-time constants: with both strides as runtime
// values the loop ran at half speed.
template <int R, int P, bool Transposed>
ATTNBENCH_TILE void pv_tile(const float* p, int64_t ldp, const float* v, int64_t vs, int64_t K,
                            float* o, int64_t ldo, Into into) {
  static_assert(P == 1, "the AVX2 tiles are one panel wide");
  __m256 c0[R], c1[R];
  for (int r = 0; r < R; ++r) {
    c0[r] = into == Into::kChain ? _mm256_loadu_ps(o + r * ldo) : _mm256_setzero_ps();
    c1[r] = into == Into::kChain ? _mm256_loadu_ps(o + r * ldo + 8) : _mm256_setzero_ps();
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
  if (into == Into::kAdd)
    for (int r = 0; r < R; ++r) {
      c0[r] = _mm256_add_ps(_mm256_loadu_ps(o + r * ldo), c0[r]);
      c1[r] = _mm256_add_ps(_mm256_loadu_ps(o + r * ldo + 8), c1[r]);
    }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(o + r * ldo, c0[r]);
    _mm256_storeu_ps(o + r * ldo + 8, c1[r]);
  }
}
#endif

// ---- work between tiles ----------------------------------------------------------------
// A product's tiles run from registers and L1, leaving the memory system idle; a kernel
// that next reads a fresh chunk from memory then waits on it in one burst. The products
// take a `between` hook, called before each tile, through which a kernel spreads that
// traffic over the tiles instead: prefetches of the next chunk's lines, which retire
// without waiting for them (linear_state's K and V).
struct NoHook {
  ATTNBENCH_TILE void operator()() const {}
};

// Prefetches `rows` rows of `cols` floats, `stride` floats apart from `first`, into L1: a
// share of their 64-byte lines per call, so that `calls` calls cover them all.
class RowsPrefetch {
 public:
  RowsPrefetch(const float* first, int64_t stride, int64_t cols, int64_t rows, int64_t calls)
      : row_(reinterpret_cast<const char*>(first)),
        row_bytes_(cols * 4),
        stride_bytes_(stride * 4),
        rows_(rows),
        per_call_((rows * ((cols * 4 + 63) / 64) + calls - 1) / std::max<int64_t>(calls, 1)) {}

  ATTNBENCH_TILE void operator()() {
    for (int64_t i = 0; i < per_call_ && rows_ > 0; ++i) {
      _mm_prefetch(row_ + offset_, _MM_HINT_T0);
      offset_ += 64;
      if (offset_ >= row_bytes_) {
        offset_ = 0;
        row_ += stride_bytes_;
        --rows_;
      }
    }
  }

 private:
  const char* row_;
  int64_t row_bytes_, stride_bytes_, rows_, per_call_, offset_ = 0;
};

// The last band of a panel group: Tile<R, P> for the R = rest rows left (0 < rest < kRows).
template <template <int, int> class Tile, int P, int R, typename Hook, typename... Args>
ATTNBENCH_TILE void last_band(Hook& between, int64_t rest, int64_t i, int64_t col,
                              Args... args) {
  if constexpr (R > 0) {
    if (rest == R) {
      between();
      return Tile<R, P>::run(i, col, args...);
    }
    last_band<Tile, P, R - 1>(between, rest, i, col, args...);
  }
}

// Tile<R, P> over every kRows-row band of m rows (the last band has m % kRows rows), for
// the P panels from panel `col`.
template <template <int, int> class Tile, int P, typename Hook, typename... Args>
ATTNBENCH_TILE void row_bands(Hook& between, int64_t m, int64_t col, Args... args) {
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) {
    between();
    Tile<kRows, P>::run(i, col, args...);
  }
  if (m > i) last_band<Tile, P, kRows - 1>(between, m - i, i, col, args...);
}

// Tiles over an (m rows) x (n_panels panels) product: groups of kPanels panels, then the
// rest in groups of 2 and 1; in each group, the row bands (its right operand stays in L1).
// `between()` before each tile.
template <template <int, int> class Tile, typename Hook, typename... Args>
ATTNBENCH_TILE void for_tiles(Hook& between, int64_t m, int64_t n_panels, Args... args) {
  int64_t p = 0;
  for (; p + kPanels <= n_panels; p += kPanels)
    row_bands<Tile, kPanels>(between, m, p, args...);
  if constexpr (kPanels > 2) {
    if (p + 2 <= n_panels) {
      row_bands<Tile, 2>(between, m, p, args...);
      p += 2;
    }
  }
  if constexpr (kPanels > 1) {
    if (p < n_panels) row_bands<Tile, 1>(between, m, p, args...);
  }
}

// How many tiles (so `between` calls) for_tiles runs over m rows and n_panels panels.
inline int64_t tile_count(int64_t m, int64_t n_panels) {
  const int64_t groups = n_panels / kPanels + (kPanels > 2 && n_panels % kPanels >= 2) +
                         (kPanels > 1 && n_panels % 2 == 1);
  return groups * ((m + kRows - 1) / kRows);
}

template <int R, int P>
struct QKTile {
  static ATTNBENCH_TILE void run(int64_t i, int64_t col, const float* q, int64_t qs,
                                 const float* panels, int64_t D, float alpha, float* s,
                                 int64_t lds) {
    qk_tile<R, P>(q + i * qs, qs, panels + col * D * kPanel, D, alpha, s + i * lds + col * kPanel,
                  lds);
  }
};

template <int R, int P>
struct PVTile {
  static ATTNBENCH_TILE void run(int64_t i, int64_t col, const float* p, int64_t ldp,
                                 const float* v, int64_t vs, int64_t K, float* o, int64_t ldo,
                                 Into into) {
    pv_tile<R, P, false>(p + i * ldp, ldp, v + col * kPanel, vs, K, o + i * ldo + col * kPanel,
                         ldo, into);
  }
};

template <int R, int P>
struct PVTTile {  // P given transposed: rows of the product are columns of p
  static ATTNBENCH_TILE void run(int64_t i, int64_t col, const float* pt, int64_t ldp,
                                 const float* v, int64_t vs, int64_t K, float* o, int64_t ldo,
                                 Into into) {
    pv_tile<R, P, true>(pt + i, ldp, v + col * kPanel, vs, K, o + i * ldo + col * kPanel, ldo,
                        into);
  }
};

// S (m, n) = alpha * Q (m, D) K^T: K's n keys (n a multiple of 16) as consecutive
// (D, 16) panels (pack_keys); rows of Q and S ld qs and lds apart.
template <typename Hook = NoHook>
ATTNBENCH_TILE void qk_product(int64_t m, int64_t n, const float* q, int64_t qs,
                               const float* panels, int64_t D, float alpha, float* s,
                               int64_t lds, Hook between = {}) {
  for_tiles<QKTile>(between, m, n / kPanel, q, qs, panels, D, alpha, s, lds);
}

// O (m, n) (+)= P (m, K) V (K, n) as `into` says, n a multiple of 16; V's rows vs apart.
template <typename Hook = NoHook>
ATTNBENCH_TILE void pv_product(int64_t m, int64_t n, const float* p, int64_t ldp,
                               const float* v, int64_t vs, int64_t K, float* o, int64_t ldo,
                               Into into, Hook between = {}) {
  for_tiles<PVTile>(between, m, n / kPanel, p, ldp, v, vs, K, o, ldo, into);
}

// O (m, n) (+)= P (m, K) V (K, n) with P given as P^T (K, m), row stride ldp.
template <typename Hook = NoHook>
ATTNBENCH_TILE void pvt_product(int64_t m, int64_t n, const float* pt, int64_t ldp,
                                const float* v, int64_t vs, int64_t K, float* o, int64_t ldo,
                                Into into, Hook between = {}) {
  for_tiles<PVTTile>(between, m, n / kPanel, pt, ldp, v, vs, K, o, ldo, into);
}

#if defined(CPU_CAPABILITY_AVX512)
// dst[c * 16 : c * 16 + 16] = column c of the 16 x 16 block of rows[0..16), c < 16: the
// block transposed in registers (interleave pairs of rows, then 4 x 4 blocks within each
// 128-bit lane, then lanes across the four groups of rows).
ATTNBENCH_TILE void transpose16(const float* const* rows, int64_t col, float* dst) {
  __m512 a[16], b[16];
  for (int i = 0; i < 16; i += 2) {
    const __m512 x = _mm512_loadu_ps(rows[i] + col), y = _mm512_loadu_ps(rows[i + 1] + col);
    a[i] = _mm512_unpacklo_ps(x, y);  // per lane: x0 y0 x1 y1
    a[i + 1] = _mm512_unpackhi_ps(x, y);  // x2 y2 x3 y3
  }
  for (int i = 0; i < 16; i += 4) {  // b[i + k], lane L: rows i..i+3 of column 4L + k
    b[i] = _mm512_shuffle_ps(a[i], a[i + 2], 0x44);
    b[i + 1] = _mm512_shuffle_ps(a[i], a[i + 2], 0xEE);
    b[i + 2] = _mm512_shuffle_ps(a[i + 1], a[i + 3], 0x44);
    b[i + 3] = _mm512_shuffle_ps(a[i + 1], a[i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512 u = _mm512_shuffle_f32x4(b[k], b[4 + k], 0x88);  // lanes 0, 2
    const __m512 w = _mm512_shuffle_f32x4(b[k], b[4 + k], 0xDD);  // lanes 1, 3
    const __m512 u2 = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], 0x88);
    const __m512 w2 = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], 0xDD);
    _mm512_storeu_ps(dst + (0 + k) * 16, _mm512_shuffle_f32x4(u, u2, 0x88));
    _mm512_storeu_ps(dst + (4 + k) * 16, _mm512_shuffle_f32x4(w, w2, 0x88));
    _mm512_storeu_ps(dst + (8 + k) * 16, _mm512_shuffle_f32x4(u, u2, 0xDD));
    _mm512_storeu_ps(dst + (12 + k) * 16, _mm512_shuffle_f32x4(w, w2, 0xDD));
  }
}
#endif

// Keys [k0, k1) of one head (k0 a multiple of kPanel) as (D, kPanel) panels; keys outside
// [0, Nk) are zero. On AVX-512 a panel of 16 keys inside [0, Nk) is transposed 16 x 16 in
// registers (D a multiple of 16), else element by element.
inline void pack_keys(const float* kh, int64_t ks, int64_t D, int64_t Nk, int64_t k0, int64_t k1,
               float* dst) {
  for (int64_t p = 0; p * kPanel < k1 - k0; ++p) {
    float* panel = dst + p * D * kPanel;  // (D, kPanel)
#if defined(CPU_CAPABILITY_AVX512)
    const int64_t first = k0 + p * kPanel;
    if (D % 16 == 0 && first >= 0 && first + kPanel <= Nk) {
      const float* rows[16];
      for (int c = 0; c < 16; ++c) rows[c] = kh + (first + c) * ks;
      for (int64_t d = 0; d < D; d += 16) transpose16(rows, d, panel + d * kPanel);
      continue;
    }
#endif
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
