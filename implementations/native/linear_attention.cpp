// Fused CPU forwards and backwards of linear attention (fp32), with phi either elu(x) + 1 or
// FAVOR+'s positive random features exp(W' x - h |x|^2 - shift) (Choromanski et al. 2021),
// non-causal:
//
//   out = phi(Q) S / (phi(Q) . z),   S = phi(K)^T V (F x Dv),   z = sum_j phi(K_j) (F,)
//
// In eager PyTorch the elementwise feature map (elu: an exp, a compare, a select; FAVOR+:
// the projection's (N, m) result written out, shifted and exponentiated in separate passes)
// cost a large share of the forward beside matmuls whose operands came from memory.
// Here phi is computed for 64 rows at a time into a
// buffer that stays in L1/L2 and consumed there by the register-blocked tiles of
// simd_tiles.h:
//
// * linear_state: per (batch, kv head), S and z over the keys, 64 key rows at a time (the
//   tile reads phi(K) of the rows transposed, so S += phi(K)^T V needs no copy).
// * linear_output: per (batch, query head, 64-row block), phi(Q) of the block, then
//   phi(Q) S and each row divided by phi(Q_i) . z.
// * linear_causal: per (batch, query head), chunks of 64 rows in order, each seeing the
//   state of the keys before it and, inside the chunk, a masked 64 x 64 product.
// * linear_backward, linear_causal_backward: per (batch, kv head), dq, dk and dv from the
//   states the forward kept (see each function).
//
// FAVOR+'s shifts (the same as the eager form's, linear.feature_fn): a query row is shifted
// by its own maximum, which cancels between numerator and denominator; keys share one
// shift per head, the running maximum of the exponents seen so far: when a chunk raises it,
// the sums of the earlier keys are rescaled (as flash attention rescales its running sums),
// so no second pass over the keys is needed and exp cannot overflow.
//
// phi shares the FMA ports with the tiles, so its exp is the elu forward's main cost beside
// the products; the keys' sum z is taken while phi is in registers and the chunk's product
// is added to the group's sums as the tiles store it, so no buffer is written and read back.
// The AVX-512 build's phi takes a leaner exp (simd_tiles.h's exp_nonpositive); the AVX2
// build keeps ATen's exp_u20. Denominators and row sums are reduced 16 rows at a time
// (row_dots), not row by row. The tuning behind these choices: docs/tuning-log.md.
//
// Each runs a range of its tasks per call with the GIL released; the *_parallel bindings
// share a call's tasks out over the CPU threads in one parallel region (cpu_pieces.h).
// Dv and FAVOR+'s m must be multiples of 16 (the tiles' width), and for the backwards D too.
#include <torch/extension.h>

#include "cpu_pieces.h"
#include "simd_tiles.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

namespace {

using namespace attnbench;

constexpr int64_t kChunk = 64;  // rows of phi per step
// Long sums over keys (or query rows) go in three levels: 64 rows in a tile's chain, 16
// chunks in a group's buffer, then the groups: two levels leave a chain of N / 64 adds,
// whose rounding error exceeds the eager path's blocked matmul sums.
constexpr int64_t kGroup = 16;

inline float elu1(float x) { return x > 0.f ? x + 1.f : std::exp(x); }  // the scalar tails'

#if defined(CPU_CAPABILITY_AVX512)
inline Vec elu1(const Vec& x) {  // elu(x) + 1: x + 1 where x > 0, else exp(x)
  const __m512 v = x;
  const __mmask16 positive = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
  return _mm512_mask_add_ps(exp_nonpositive(v), positive, v, _mm512_set1_ps(1.f));
}
#else
inline Vec elu1(const Vec& x) {  // elu(x) + 1: x + 1 where x > 0, else exp(x)
  return Vec::blendv(x.exp_u20(), x + Vec(1.f), x > Vec(0.f));
}
#endif

// dst[0:n] = phi(src[0:n]), vectorized with a scalar tail.
inline void elu1_row(const float* src, float* dst, int64_t n) {
  int64_t d = 0;
  for (; d + Vec::size() <= n; d += Vec::size()) elu1(Vec::loadu(src + d)).store(dst + d);
  for (; d < n; ++d) dst[d] = elu1(src[d]);
}

// phi of r key rows (row stride xs) into dst (r, D), and their sum over the rows into
// zc (D,), taken while phi is in registers: the same sums, in the same order, as adding
// the stored rows after (which read the chunk's phi twice more).
inline void elu1_rows_summed(const float* x, int64_t xs, int64_t r, int64_t D, float* dst,
                             float* zc) {
  int64_t d = 0;
  for (; d + Vec::size() <= D; d += Vec::size()) {
    Vec acc(0.f);
    for (int64_t i = 0; i < r; ++i) {
      const Vec p = elu1(Vec::loadu(x + i * xs + d));
      p.store(dst + i * D + d);
      acc = acc + p;
    }
    acc.store(zc + d);
  }
  for (; d < D; ++d) {
    float acc = 0.f;
    for (int64_t i = 0; i < r; ++i) {
      dst[i * D + d] = elu1(x[i * xs + d]);
      acc += dst[i * D + d];
    }
    zc[d] = acc;
  }
}

inline void add_scalar(float* x, int64_t n, float s) {  // x += s
  int64_t j = 0;
  const Vec vs(s);
  for (; j + Vec::size() <= n; j += Vec::size()) (Vec::loadu(x + j) + vs).store(x + j);
  for (; j < n; ++j) x[j] += s;
}

inline void scale_in_place(float* x, int64_t n, float s) { scaled_copy(x, x, n, s); }

// x <- exp(x - mx) in place with Sleef's 1-ulp exp. FAVOR+'s features are these exps
// themselves, and exp_u20 (up to 20 ulp, the softmax kernels' choice) left its errors
// against float64 3-4% above the eager path's (torch.exp, 1 ulp).
inline void exp_shift(float* x, int64_t n, float mx) {
  int64_t j = 0;
  const Vec vm(mx);
  for (; j + Vec::size() <= n; j += Vec::size()) (Vec::loadu(x + j) - vm).exp().store(x + j);
  for (; j < n; ++j) x[j] = std::exp(x[j] - mx);
}

// O (m x cols, row stride ldo) = P (m x K) @ V (K x cols), K the features: the sum goes in
// slices of kSlice features, each its own tile chain, added after (as MKL blocks its sums).
// One chain over FAVOR+'s 256 features read 7% further from float64 than the eager path's
// matmul. Each slice after the first is added to O as its tiles store it (Into::kAdd).
// `between`: the tiles' hook (simd_tiles.h).
constexpr int64_t kSlice = 64;
template <typename Hook = NoHook>
inline void features_product(int64_t m, const float* p, int64_t ldp, const float* v, int64_t vs,
                             int64_t K, int64_t cols, float* o, int64_t ldo,
                             Hook between = {}) {
  for (int64_t k0 = 0; k0 < K; k0 += kSlice)
    pv_product(m, cols, p + k0, ldp, v + k0 * vs, vs, std::min(kSlice, K - k0), o, ldo,
               k0 == 0 ? Into::kStore : Into::kAdd, between);
}

// Row i of a causal chunk's scores (r x rp, row stride kChunk) keeps keys 0..i: the rest is
// zeroed in place, and sums[i] is the row's sum (row_dots with ones: the zeros add
// nothing), forward and backward alike.
inline void masked_row_sums(float* a, int64_t r, int64_t rp, float* sums) {
  static const std::vector<float> ones(kChunk, 1.f);
  for (int64_t i = 0; i < r; ++i) std::fill(a + i * kChunk + i + 1, a + i * kChunk + rp, 0.f);
  row_dots(a, kChunk, r, ones.data(), rp, sums);
}

// The feature map: elu + 1 (panels == nullptr, F = D) or FAVOR+ with m = F features, whose
// scaled projection W' = W sqrt(scale) comes packed as F/16 panels of (D, 16).
struct FeatureMap {
  const float* panels;
  int64_t D, F;
  float half_scale;

  bool favor() const { return panels != nullptr; }

  // FAVOR+: the exponents x W'^T (- h |x|^2 for keys) of r rows into dst (r, F); elu: phi.
  void exponents(const float* x, int64_t xs, int64_t r, float* dst, bool keys) const {
    if (!favor()) {
      for (int64_t i = 0; i < r; ++i) elu1_row(x + i * xs, dst + i * F, D);
      return;
    }
    qk_product(r, F, x, xs, panels, D, 1.f, dst, F);
    if (keys)
      for (int64_t i = 0; i < r; ++i)
        add_scalar(dst + i * F, F, -half_scale * dot(x + i * xs, x + i * xs, D));
  }

  // phi of r query rows into dst (r, F); FAVOR+ rows shifted by their own maximum.
  void queries(const float* x, int64_t xs, int64_t r, float* dst) const {
    exponents(x, xs, r, dst, false);
    if (favor())
      for (int64_t i = 0; i < r; ++i)
        exp_shift(dst + i * F, F, max_of(dst + i * F, F, -INFINITY));
  }

  // phi of r key rows into dst (r, F) at the running shift `top` (FAVOR+), which this chunk
  // may raise; returns the factor by which sums over earlier keys must be rescaled.
  float keys(const float* x, int64_t xs, int64_t r, float* dst, float& top) const {
    exponents(x, xs, r, dst, true);
    if (!favor()) return 1.f;
    const float mc = max_of(dst, r * F, -INFINITY);
    float rescale = 1.f;
    if (mc > top) {
      if (top > -INFINITY) rescale = std::exp(top - mc);
      top = mc;
    }
    exp_shift(dst, r * F, top);
    return rescale;
  }

  // keys(), and the r rows' sum into zc (F,); elu's while phi is in registers.
  float keys_summed(const float* x, int64_t xs, int64_t r, float* dst, float& top,
                    float* zc) const {
    if (!favor()) {
      elu1_rows_summed(x, xs, r, D, dst, zc);
      return 1.f;
    }
    const float rescale = keys(x, xs, r, dst, top);
    std::fill(zc, zc + F, 0.f);
    for (int64_t j = 0; j < r; ++j) add_into(zc, dst + j * F, F);
    return rescale;
  }
};

// phi of r key rows at a given shift (the forward's final one; FAVOR+), into dst (r, F).
inline void keys_at(const FeatureMap& fm, const float* x, int64_t xs, int64_t r, float* dst,
                    float top) {
  fm.exponents(x, xs, r, dst, true);
  if (fm.favor()) exp_shift(dst, r * fm.F, top);
}

void check_float4d(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 4 &&
                  t.stride(3) == 1,
              "linear: ", what, " must be a 4-d float32 CPU tensor, last dim contiguous");
}

// proj: an empty tensor (elu + 1) or FAVOR+'s panels (F/16, D, 16), contiguous float32.
FeatureMap feature_map(const torch::Tensor& proj, int64_t D, double half_scale) {
  if (proj.numel() == 0) return FeatureMap{nullptr, D, D, 0.f};
  TORCH_CHECK(proj.is_contiguous() && proj.scalar_type() == at::kFloat && proj.dim() == 3 &&
                  proj.size(1) == D && proj.size(2) == kPanel,
              "linear: proj must be FAVOR+'s packed projection (m/16, D, 16), float32");
  return FeatureMap{proj.data_ptr<float>(), D, proj.size(0) * kPanel,
                    static_cast<float>(half_scale)};
}

}  // namespace

// state (B, Hkv, F, Dv) and zsum (B, Hkv, F), contiguous, for kv heads [lo, hi) of B*Hkv.
// shift (B, Hkv): FAVOR+'s key shift at the end (S and z are at it), 0 for elu.
void linear_state(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& proj,
                  double half_scale, const torch::Tensor& state, const torch::Tensor& zsum,
                  const torch::Tensor& shift, int64_t lo, int64_t hi) {
  check_float4d(k, "k");
  check_float4d(v, "v");
  const int64_t B = k.size(0), Hkv = k.size(1), Nk = k.size(2), D = k.size(3);
  const int64_t Dv = v.size(3);
  const FeatureMap fm = feature_map(proj, D, half_scale);
  const int64_t F = fm.F;
  TORCH_CHECK(v.size(0) == B && v.size(1) == Hkv && v.size(2) == Nk,
              "linear_state: k and v shapes do not match");
  TORCH_CHECK(Dv % kPanel == 0, "linear_state: Dv must be a multiple of 16");
  TORCH_CHECK(state.is_contiguous() && state.scalar_type() == at::kFloat &&
                  state.numel() == B * Hkv * F * Dv && zsum.is_contiguous() &&
                  zsum.scalar_type() == at::kFloat && zsum.numel() == B * Hkv * F,
              "linear_state: state must be (B, Hkv, F, Dv) and zsum (B, Hkv, F), float32");
  TORCH_CHECK(shift.is_contiguous() && shift.scalar_type() == at::kFloat &&
                  shift.numel() == B * Hkv,
              "linear_state: shift must be (B, Hkv), float32");
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= B * Hkv, "linear_state: head range outside");
  std::vector<float> phik(static_cast<size_t>(kChunk * F));  // (kChunk, F)
  std::vector<float> zc(static_cast<size_t>(F));
  std::vector<float> sg(static_cast<size_t>(F * Dv)), zg(static_cast<size_t>(F));  // a group's
  const int64_t tiles = tile_count(F, Dv / kPanel);  // per chunk product
  for (int64_t head = lo; head < hi; ++head) {
    const int64_t n = head / Hkv, h = head % Hkv;
    const float* kh = k.data_ptr<float>() + n * k.stride(0) + h * k.stride(1);
    const float* vh = v.data_ptr<float>() + n * v.stride(0) + h * v.stride(1);
    float* s = state.data_ptr<float>() + head * F * Dv;  // (F, Dv)
    float* z = zsum.data_ptr<float>() + head * F;  // (F,)
    std::fill(s, s + F * Dv, 0.f);
    std::fill(z, z + F, 0.f);
    std::fill(sg.begin(), sg.end(), 0.f);
    std::fill(zg.begin(), zg.end(), 0.f);
    float top = -INFINITY;  // FAVOR+'s key shift so far
    for (int64_t j0 = 0; j0 < Nk; j0 += kChunk) {
      const int64_t r = std::min(kChunk, Nk - j0);
      const float rescale =
          fm.keys_summed(kh + j0 * k.stride(2), k.stride(2), r, phik.data(), top, zc.data());
      if (rescale != 1.f) {
        scale_in_place(s, F * Dv, rescale);
        scale_in_place(z, F, rescale);
        scale_in_place(sg.data(), F * Dv, rescale);
        scale_in_place(zg.data(), F, rescale);
      }
      // The chunk's phi(K_rows)^T (F, r) @ V_rows (r, Dv) (phi(K) read transposed), added
      // to the group's sums as the tiles store it (Into::kAdd): three levels (kGroup), not
      // one fp32 chain. V's rows are read where they lie. Between the tiles, the next
      // chunk's K and V rows are prefetched: read in a burst after the tiles (K by phi, V by
      // the tiles) they left the FMA units idle.
      const int64_t next = std::min(kChunk, Nk - j0 - r);
      RowsPrefetch next_k(kh + (j0 + r) * k.stride(2), k.stride(2), D, next, tiles);
      RowsPrefetch next_v(vh + (j0 + r) * v.stride(2), v.stride(2), Dv, next, tiles);
      pvt_product(F, Dv, phik.data(), F, vh + j0 * v.stride(2), v.stride(2), r, sg.data(), Dv,
                  Into::kAdd, [&] {
                    next_k();
                    next_v();
                  });
      add_into(zg.data(), zc.data(), F);
      if ((j0 / kChunk + 1) % kGroup == 0 || j0 + r == Nk) {  // the group joins S and z
        add_into(z, zg.data(), F);
        add_into(s, sg.data(), F * Dv);
        std::fill(sg.begin(), sg.end(), 0.f);
        std::fill(zg.begin(), zg.end(), 0.f);
      }
    }
    shift.data_ptr<float>()[head] = fm.favor() ? top : 0.f;
  }
}

// out (B, Hq, Nq, Dv) contiguous, for tasks [lo, hi) of (batch, query head, 64-row block).
void linear_output(const torch::Tensor& q, const torch::Tensor& proj, const torch::Tensor& state,
                   const torch::Tensor& zsum, const torch::Tensor& out, int64_t lo, int64_t hi) {
  check_float4d(q, "q");
  const int64_t B = q.size(0), Hq = q.size(1), Nq = q.size(2), D = q.size(3);
  const FeatureMap fm = feature_map(proj, D, 0.0);
  const int64_t F = fm.F;
  TORCH_CHECK(state.dim() == 4 && state.size(0) == B && state.size(2) == F &&
                  state.is_contiguous() && zsum.is_contiguous() && state.size(1) > 0 &&
                  Hq % state.size(1) == 0,
              "linear_output: state must be (B, Hkv, F, Dv) with Hq a multiple of Hkv");
  const int64_t Hkv = state.size(1), Dv = state.size(3), G = Hq / Hkv;
  TORCH_CHECK(out.is_contiguous() && out.numel() == B * Hq * Nq * Dv && Dv % kPanel == 0,
              "linear_output: out must be a contiguous (B, Hq, Nq, Dv) tensor");
  const int64_t nb = (Nq + kChunk - 1) / kChunk;
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= B * Hq * nb, "linear_output: task range");
  std::vector<float> phiq(static_cast<size_t>(kChunk * F));  // (kChunk, F)
  // The block's phi(Q) S goes to a buffer in L1 and is scaled into `out` in one pass: the
  // tiles storing straight into `out` (fresh lines each block) ran at half their speed.
  std::vector<float> ot(static_cast<size_t>(kChunk * Dv));  // (kChunk, Dv)
  std::vector<float> den(static_cast<size_t>(kChunk));
  // large outputs are written with streamed stores, which skip reading the lines first
  const bool stream = streams(out.numel());
  for (int64_t task = lo; task < hi; ++task) {
    const int64_t b = task % nb, bh = task / nb, h = bh % Hq, n = bh / Hq;
    const int64_t head = n * Hkv + h / G, i0 = b * kChunk, m = std::min(kChunk, Nq - i0);
    const float* qb = q.data_ptr<float>() + n * q.stride(0) + h * q.stride(1);
    const float* s = state.data_ptr<float>() + head * F * Dv;  // (F, Dv)
    const float* z = zsum.data_ptr<float>() + head * F;  // (F,)
    float* ob = out.data_ptr<float>() + ((n * Hq + h) * Nq + i0) * Dv;  // (m, Dv)
    fm.queries(qb + i0 * q.stride(2), q.stride(2), m, phiq.data());
    // the next task's query rows are prefetched between the tiles, as linear_state's keys
    const int64_t next = task + 1, next_b = next % nb, next_bh = next / nb;
    RowsPrefetch next_q(next < hi ? q.data_ptr<float>() + (next_bh / Hq) * q.stride(0) +
                                        (next_bh % Hq) * q.stride(1) +
                                        next_b * kChunk * q.stride(2)
                                  : qb,
                        q.stride(2), D, next < hi ? std::min(kChunk, Nq - next_b * kChunk) : 0,
                        tile_count(m, Dv / kPanel));
    features_product(m, phiq.data(), F, s, Dv, F, Dv, ot.data(), Dv, [&] { next_q(); });
    row_dots(phiq.data(), F, m, z, F, den.data());  // phi(Q_i) . z
    // phi > 0, so phi(Q_i) . z == 0 only if it underflowed (FAVOR+): then the numerator
    // is 0 too, as in the eager form (which divides by the smallest normal float)
    for (int64_t i = 0; i < m; ++i)
      scaled_store(&ot[i * Dv], ob + i * Dv, Dv, 1.f / std::max(den[i], FLT_MIN), stream);
  }
  if (stream) _mm_sfence();
}

// Causal, seq_q == seq_k: out (B, Hq, N, Dv) contiguous, for query heads [lo, hi) of B*Hq.
// Chunks of 64 rows in order, with the state of the keys before the chunk:
//   o_c = phi(Q_c) S + tril(phi(Q_c) phi(K_c)^T) V_c,  den_c = phi(Q_c) z + rowsum(tril(..)),
// then S += phi(K_c)^T V_c and z += sum phi(K_c) (two-level sums, as in linear_state).
// With prefix (B, Hkv, nc, F, Dv), zprefix (B, Hkv, nc, F) and tops (B, Hkv, nc) not empty,
// the state after each chunk (at that chunk's key shift, FAVOR+) and the shift are kept
// for the backward (written by each group's first head).
void linear_causal(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const torch::Tensor& proj, double half_scale, const torch::Tensor& out,
                   const torch::Tensor& prefix, const torch::Tensor& zprefix,
                   const torch::Tensor& tops, int64_t lo, int64_t hi) {
  check_float4d(q, "q");
  check_float4d(k, "k");
  check_float4d(v, "v");
  const int64_t B = q.size(0), Hq = q.size(1), N = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Dv = v.size(3);
  const FeatureMap fm = feature_map(proj, D, half_scale);
  const int64_t F = fm.F;
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && k.size(2) == N && v.size(2) == N &&
                  v.size(1) == Hkv && k.size(3) == D && Hkv > 0 && Hq % Hkv == 0,
              "linear_causal: q, k, v shapes do not match (seq_q must equal seq_k)");
  TORCH_CHECK(Dv % kPanel == 0, "linear_causal: Dv must be a multiple of 16");
  TORCH_CHECK(out.is_contiguous() && out.numel() == B * Hq * N * Dv,
              "linear_causal: out must be a contiguous (B, Hq, N, Dv) tensor");
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= B * Hq, "linear_causal: head range outside");
  const int64_t G = Hq / Hkv, nc = (N + kChunk - 1) / kChunk;
  const bool keep = prefix.numel() > 0;
  TORCH_CHECK(!keep || (prefix.is_contiguous() && zprefix.is_contiguous() &&
                        tops.is_contiguous() && prefix.scalar_type() == at::kFloat &&
                        zprefix.scalar_type() == at::kFloat && tops.scalar_type() == at::kFloat &&
                        prefix.numel() == B * Hkv * nc * F * Dv &&
                        zprefix.numel() == B * Hkv * nc * F && tops.numel() == B * Hkv * nc),
              "linear_causal: prefix must be (B, Hkv, nc, F, Dv), zprefix (B, Hkv, nc, F) and "
              "tops (B, Hkv, nc), float32");
  std::vector<float> st(static_cast<size_t>(F * Dv)), z(static_cast<size_t>(F));
  std::vector<float> zc(static_cast<size_t>(F));
  std::vector<float> phiq(static_cast<size_t>(kChunk * F)), phik(static_cast<size_t>(kChunk * F));
  std::vector<float> panels(static_cast<size_t>(kChunk * F));  // phi(K_c) as (F, 16) panels
  std::vector<float> a(static_cast<size_t>(kChunk * kChunk));  // (C, C) masked scores
  std::vector<float> ot(static_cast<size_t>(kChunk * Dv)), den(static_cast<size_t>(kChunk));
  std::vector<float> sums(static_cast<size_t>(kChunk));
  const bool stream = streams(out.numel());
  for (int64_t head = lo; head < hi; ++head) {
    const int64_t n = head / Hq, h = head % Hq, hk = h / G;
    const float* qh = q.data_ptr<float>() + n * q.stride(0) + h * q.stride(1);
    const float* kh = k.data_ptr<float>() + n * k.stride(0) + hk * k.stride(1);
    const float* vh = v.data_ptr<float>() + n * v.stride(0) + hk * v.stride(1);
    float* oh = out.data_ptr<float>() + head * N * Dv;  // (N, Dv)
    std::fill(st.begin(), st.end(), 0.f);
    std::fill(z.begin(), z.end(), 0.f);
    float top = -INFINITY;  // FAVOR+'s key shift so far
    for (int64_t c0 = 0; c0 < N; c0 += kChunk) {
      const int64_t r = std::min(kChunk, N - c0), rp = ceil_to(r, kPanel);
      fm.queries(qh + c0 * q.stride(2), q.stride(2), r, phiq.data());
      const float rescale =
          fm.keys_summed(kh + c0 * k.stride(2), k.stride(2), r, phik.data(), top, zc.data());
      if (rescale != 1.f) {  // the earlier keys' sums, to this chunk's shift
        scale_in_place(st.data(), F * Dv, rescale);
        scale_in_place(z.data(), F, rescale);
      }
      pack_keys(phik.data(), F, F, r, 0, rp, panels.data());  // rows r..rp-1 zero
      // the keys before the chunk: phi(Q_c) S and phi(Q_c) . z
      features_product(r, phiq.data(), F, st.data(), Dv, F, Dv, ot.data(), Dv);
      row_dots(phiq.data(), F, r, z.data(), F, den.data());
      // inside the chunk: row i sees keys 0..i
      qk_product(r, rp, phiq.data(), F, panels.data(), F, 1.f, a.data(), kChunk);
      masked_row_sums(a.data(), r, rp, sums.data());
      for (int64_t i = 0; i < r; ++i) den[i] += sums[i];
      // summed apart from phi(Q_c) S and then added (two shorter fp32 chains than one)
      pv_product(r, Dv, a.data(), kChunk, vh + c0 * v.stride(2), v.stride(2), r, ot.data(), Dv,
                 Into::kAdd);
      // den > 0 (every row sees its own key) unless FAVOR+'s features underflowed: then the
      // numerator is 0 too, as in the eager form
      for (int64_t i = 0; i < r; ++i)
        scaled_store(&ot[i * Dv], oh + (c0 + i) * Dv, Dv, 1.f / std::max(den[i], FLT_MIN),
                     stream);
      // the chunk joins the state
      pvt_product(F, Dv, phik.data(), F, vh + c0 * v.stride(2), v.stride(2), r, st.data(), Dv,
                  Into::kAdd);
      add_into(z.data(), zc.data(), F);
      if (keep && h % G == 0) {
        const int64_t at = (n * Hkv + hk) * nc + c0 / kChunk;
        std::copy(st.begin(), st.end(), prefix.data_ptr<float>() + at * F * Dv);
        std::copy(z.begin(), z.end(), zprefix.data_ptr<float>() + at * F);
        tops.data_ptr<float>()[at] = fm.favor() ? top : 0.f;
      }
    }
  }
  if (stream) _mm_sfence();
}

// dL/dx of r rows x (row stride xs) into gx (r, D), from dL/dphi (r, F; consumed) and phi:
// elu + 1: dphi * min(phi, 1) (phi' = exp(min(x, 0))); FAVOR+: da = dphi * phi, dx = da W'
// with W' = w (F, D) rows, keys also - 2 h x rowsum(da) (the shifts cancel: no term).
inline void through_features(const FeatureMap& fm, const float* w, const float* x, int64_t xs,
                             int64_t r, bool keys, float* dphi, const float* phi, float* gx) {
  const int64_t D = fm.D, F = fm.F;
  if (!fm.favor()) {
    for (int64_t i = 0; i < r; ++i)
      for (int64_t d = 0; d < D; d += Vec::size())
        (Vec::loadu(dphi + i * F + d) * at::vec::minimum(Vec::loadu(phi + i * F + d), Vec(1.f)))
            .store(gx + i * D + d);
    return;
  }
  for (int64_t i = 0; i < r * F; i += Vec::size())
    (Vec::loadu(dphi + i) * Vec::loadu(phi + i)).store(dphi + i);
  features_product(r, dphi, F, w, D, F, D, gx, D);
  if (keys)
    for (int64_t i = 0; i < r; ++i) {
      float rs = 0.f;
      for (int64_t f = 0; f < F; ++f) rs += dphi[i * F + f];
      const Vec c(-2.f * fm.half_scale * rs);
      for (int64_t d = 0; d < D; d += Vec::size())
        at::vec::fmadd(Vec::loadu(x + i * xs + d), c, Vec::loadu(gx + i * D + d)).store(gx + i * D + d);
    }
}

// (F, Dv) -> its transpose (Dv, F)
inline void transpose_into(const float* a, int64_t rows, int64_t cols, float* t) {
  for (int64_t f = 0; f < rows; ++f)
    for (int64_t e = 0; e < cols; ++e) t[e * rows + f] = a[f * cols + e];
}

// The checks both backwards share: shapes that fit the tiles, FAVOR+'s W' rows, and out,
// dout and the gradients contiguous float32 of the inputs' sizes.
void check_backward(const char* name, const torch::Tensor& q, const torch::Tensor& k,
                    const torch::Tensor& v, const FeatureMap& fm,
                    const torch::Tensor& proj_rows, const torch::Tensor& out,
                    const torch::Tensor& dout, const torch::Tensor& dq, const torch::Tensor& dk,
                    const torch::Tensor& dv) {
  TORCH_CHECK(fm.D % kPanel == 0 && v.size(3) % kPanel == 0 && fm.F % kPanel == 0, name,
              ": D, Dv and the features must be multiples of 16");
  TORCH_CHECK(!fm.favor() || (proj_rows.is_contiguous() && proj_rows.numel() == fm.F * fm.D &&
                              proj_rows.scalar_type() == at::kFloat),
              name, ": proj_rows must be FAVOR+'s W' (m, D), float32");
  for (const torch::Tensor* t : {&out, &dout, &dq, &dk, &dv})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == at::kFloat, name,
                ": out, dout and the gradients must be contiguous float32");
  TORCH_CHECK(out.numel() == q.size(0) * q.size(1) * q.size(2) * v.size(3) &&
                  dout.numel() == out.numel() && dq.numel() == q.numel() &&
                  dk.numel() == k.numel() && dv.numel() == v.numel(),
              name, ": out, dout or the gradients have the wrong size");
}

// The non-causal backward: dq, dk, dv (contiguous, shaped as q, k, v) for kv heads
// [lo, hi) of B*Hkv and their query heads, from out and dout (B, Hq, Nq, Dv) contiguous and
// the forward's state, zsum and shift (linear_state). With dnum = dO / den and
// dden = -rowsum(dnum * O) (O = num / den):
//
//   dphi(Q) = dnum S^T + dden z^T       dS = sum over the group's heads of phi(Q)^T dnum
//   dphi(K) = V dS^T + 1 dz^T           dz = sum over the group's heads of phi(Q)^T dden
//   dV      = phi(K) dS
//
// and through the feature map: elu + 1: dx = dphi * min(phi, 1) (phi' = exp(min(x, 0)));
// FAVOR+: da = dphi * phi, dx = da W' (keys: - 2 h x rowsum(da)); the shifts cancel.
// proj_rows is W' as (F, D) rows (FAVOR+; empty for elu). D, Dv and F: multiples of 16.
void linear_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& proj, const torch::Tensor& proj_rows,
                     double half_scale, const torch::Tensor& out, const torch::Tensor& dout,
                     const torch::Tensor& state, const torch::Tensor& zsum,
                     const torch::Tensor& shift, const torch::Tensor& dq,
                     const torch::Tensor& dk, const torch::Tensor& dv, int64_t lo, int64_t hi) {
  check_float4d(q, "q");
  check_float4d(k, "k");
  check_float4d(v, "v");
  const int64_t B = q.size(0), Hq = q.size(1), Nq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Nk = k.size(2), Dv = v.size(3);
  const FeatureMap fm = feature_map(proj, D, half_scale);
  const int64_t F = fm.F;
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == Nk &&
                  k.size(3) == D && Hkv > 0 && Hq % Hkv == 0,
              "linear_backward: q, k, v shapes do not match");
  check_backward("linear_backward", q, k, v, fm, proj_rows, out, dout, dq, dk, dv);
  for (const torch::Tensor* t : {&state, &zsum, &shift})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == at::kFloat,
                "linear_backward: the states must be contiguous float32");
  TORCH_CHECK(state.numel() == B * Hkv * F * Dv && zsum.numel() == B * Hkv * F &&
                  shift.numel() == B * Hkv,
              "linear_backward: state must be (B, Hkv, F, Dv), zsum (B, Hkv, F), shift (B, Hkv)");
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= B * Hkv, "linear_backward: head range outside");
  const int64_t G = Hq / Hkv;
  const float* w = fm.favor() ? proj_rows.data_ptr<float>() : nullptr;  // (F, D)
  std::vector<float> st(static_cast<size_t>(Dv * F)), dst(static_cast<size_t>(Dv * F));
  std::vector<float> ds(static_cast<size_t>(F * Dv)), dz(static_cast<size_t>(F));
  std::vector<float> sg(static_cast<size_t>(F * Dv)), zg(static_cast<size_t>(F));  // a group's
  std::vector<float> zc(static_cast<size_t>(F));  // one chunk's phi(Q)^T dden
  std::vector<float> phi(static_cast<size_t>(kChunk * F)), dphi(static_cast<size_t>(kChunk * F));
  std::vector<float> dnum(static_cast<size_t>(kChunk * Dv)), dden(static_cast<size_t>(kChunk));
  std::vector<float> den(static_cast<size_t>(kChunk));
  std::vector<float> gx(static_cast<size_t>(kChunk * std::max(D, Dv)));  // a chunk's dx or dv
  for (int64_t head = lo; head < hi; ++head) {
    const int64_t n = head / Hkv, hk = head % Hkv;
    const float* s = state.data_ptr<float>() + head * F * Dv;  // (F, Dv)
    const float* z = zsum.data_ptr<float>() + head * F;  // (F,)
    const float top = shift.data_ptr<float>()[head];
    transpose_into(s, F, Dv, st.data());  // S^T (Dv, F): the right operand of dnum S^T
    std::fill(ds.begin(), ds.end(), 0.f);
    std::fill(dz.begin(), dz.end(), 0.f);
    std::fill(sg.begin(), sg.end(), 0.f);
    std::fill(zg.begin(), zg.end(), 0.f);
    int64_t chunks = 0;  // query chunks so far, over the group's heads
    const int64_t total = G * ((Nq + kChunk - 1) / kChunk);
    for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
      const int64_t qh = n * Hq + h;
      const float* qb = q.data_ptr<float>() + n * q.stride(0) + h * q.stride(1);
      const float* ob = out.data_ptr<float>() + qh * Nq * Dv;
      const float* gb = dout.data_ptr<float>() + qh * Nq * Dv;
      float* dqb = dq.data_ptr<float>() + qh * Nq * D;
      for (int64_t i0 = 0; i0 < Nq; i0 += kChunk) {
        const int64_t r = std::min(kChunk, Nq - i0);
        fm.queries(qb + i0 * q.stride(2), q.stride(2), r, phi.data());
        row_dots(phi.data(), F, r, z, F, den.data());  // as the forward
        for (int64_t i = 0; i < r; ++i) {
          scaled_copy(gb + (i0 + i) * Dv, &dnum[i * Dv], Dv, 1.f / std::max(den[i], FLT_MIN));
          dden[i] = -dot(&dnum[i * Dv], ob + (i0 + i) * Dv, Dv);
        }
        // phi(Q)^T dnum: three-level sums
        pvt_product(F, Dv, phi.data(), F, dnum.data(), Dv, r, sg.data(), Dv, Into::kAdd);
        std::fill(zc.begin(), zc.end(), 0.f);
        // dnum S^T
        pv_product(r, F, dnum.data(), Dv, st.data(), F, Dv, dphi.data(), F, Into::kStore);
        for (int64_t i = 0; i < r; ++i) {
          const Vec c(dden[i]);
          for (int64_t f = 0; f < F; f += Vec::size()) {  // + dden z^T; the chunk's dden phi
            at::vec::fmadd(c, Vec::loadu(z + f), Vec::loadu(&dphi[i * F + f])).store(&dphi[i * F + f]);
            at::vec::fmadd(c, Vec::loadu(&phi[i * F + f]), Vec::loadu(&zc[f])).store(&zc[f]);
          }
        }
        add_into(zg.data(), zc.data(), F);
        if (++chunks % kGroup == 0 || chunks == total) {  // the group joins dS and dz
          add_into(ds.data(), sg.data(), F * Dv);
          add_into(dz.data(), zg.data(), F);
          std::fill(sg.begin(), sg.end(), 0.f);
          std::fill(zg.begin(), zg.end(), 0.f);
        }
        through_features(fm, w, qb + i0 * q.stride(2), q.stride(2), r, false, dphi.data(),
                         phi.data(), gx.data());
        std::copy_n(gx.data(), r * D, dqb + i0 * D);
      }
    }
    // the keys: dV = phi(K) dS, dphi(K) = V dS^T + dz
    transpose_into(ds.data(), F, Dv, dst.data());
    const float* kb = k.data_ptr<float>() + n * k.stride(0) + hk * k.stride(1);
    const float* vb = v.data_ptr<float>() + n * v.stride(0) + hk * v.stride(1);
    float* dkb = dk.data_ptr<float>() + head * Nk * D;
    float* dvb = dv.data_ptr<float>() + head * Nk * Dv;
    for (int64_t j0 = 0; j0 < Nk; j0 += kChunk) {
      const int64_t r = std::min(kChunk, Nk - j0);
      keys_at(fm, kb + j0 * k.stride(2), k.stride(2), r, phi.data(), top);
      features_product(r, phi.data(), F, ds.data(), Dv, F, Dv, gx.data(), Dv);
      std::copy_n(gx.data(), r * Dv, dvb + j0 * Dv);
      pv_product(r, F, vb + j0 * v.stride(2), v.stride(2), dst.data(), F, Dv, dphi.data(), F,
                 Into::kStore);
      for (int64_t i = 0; i < r; ++i) add_into(&dphi[i * F], dz.data(), F);
      through_features(fm, w, kb + j0 * k.stride(2), k.stride(2), r, true, dphi.data(),
                       phi.data(), gx.data());
      std::copy_n(gx.data(), r * D, dkb + j0 * D);
    }
  }
}

// The causal backward (seq_q == seq_k = N): dq, dk, dv for kv heads [lo, hi) of B*Hkv and
// their query heads, from out, dout and the forward's prefix, zprefix and tops
// (linear_causal). Chunk c's output is (A_c V_c + phi(Q_c) S_<c) / den_c with
// A_c = tril(phi(Q_c) phi(K_c)^T) and den_c = A_c 1 + phi(Q_c) z_<c, all at the chunk's
// key shift t_c. Going through the chunks backwards, with dnum and dden as in the
// non-causal form:
//
//   dA_c     = tril(dnum V_c^T + dden 1^T)
//   dphi(Q_c) = dA_c phi(K_c) + dnum S_<c^T + dden z_<c^T
//   dphi(K_c) = dA_c^T phi(Q_c) + V_c G_c^T + gz_c        dV_c = A_c^T dnum + phi(K_c) G_c
//
// summed over the group's query heads, where G_c = sum_{c' > c} phi(Q_c')^T dnum_c' (and gz_c
// with dden) carries what the later chunks' reads of the state send back to chunk c's keys.
// FAVOR+: a later chunk c' saw these keys at its own shift t_c' >= t_c, so its terms enter
// G_c scaled by exp(t_c - t_c'), and S_<c is the kept state of chunk c - 1 scaled to t_c.
void linear_causal_backward(const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v, const torch::Tensor& proj,
                            const torch::Tensor& proj_rows, double half_scale,
                            const torch::Tensor& out, const torch::Tensor& dout,
                            const torch::Tensor& prefix, const torch::Tensor& zprefix,
                            const torch::Tensor& tops, const torch::Tensor& dq,
                            const torch::Tensor& dk, const torch::Tensor& dv, int64_t lo,
                            int64_t hi) {
  check_float4d(q, "q");
  check_float4d(k, "k");
  check_float4d(v, "v");
  const int64_t B = q.size(0), Hq = q.size(1), N = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Dv = v.size(3);
  const FeatureMap fm = feature_map(proj, D, half_scale);
  const int64_t F = fm.F, nc = (N + kChunk - 1) / kChunk;
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && k.size(2) == N && v.size(2) == N &&
                  v.size(1) == Hkv && k.size(3) == D && Hkv > 0 && Hq % Hkv == 0,
              "linear_causal_backward: q, k, v shapes do not match (seq_q must equal seq_k)");
  check_backward("linear_causal_backward", q, k, v, fm, proj_rows, out, dout, dq, dk, dv);
  for (const torch::Tensor* t : {&prefix, &zprefix, &tops})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == at::kFloat,
                "linear_causal_backward: the states must be contiguous float32");
  TORCH_CHECK(prefix.numel() == B * Hkv * nc * F * Dv && zprefix.numel() == B * Hkv * nc * F &&
                  tops.numel() == B * Hkv * nc,
              "linear_causal_backward: prefix must be (B, Hkv, nc, F, Dv), zprefix (B, Hkv, nc, "
              "F), tops (B, Hkv, nc)");
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= B * Hkv, "linear_causal_backward: head range");
  const int64_t G = Hq / Hkv;
  const float* w = fm.favor() ? proj_rows.data_ptr<float>() : nullptr;  // (F, D)
  auto buf = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> fk = buf(kChunk * F), fkp = buf(kChunk * F), vp = buf(kChunk * Dv);
  std::vector<float> sp = buf(F * Dv), spt = buf(Dv * F), zp = buf(F);
  std::vector<float> g = buf(F * Dv), gt = buf(Dv * F), gz = buf(F);
  std::vector<float> tg = buf(F * Dv), tgz = buf(F);  // this chunk's phi(Q)^T dnum, dden
  std::vector<float> fq = buf(kChunk * F), a = buf(kChunk * kChunk), da = buf(kChunk * kChunk);
  std::vector<float> dnum = buf(kChunk * Dv), dden = buf(kChunk), den = buf(kChunk);
  std::vector<float> sums = buf(kChunk);
  std::vector<float> dfq = buf(kChunk * F), dfk = buf(kChunk * F), dvc = buf(kChunk * Dv);
  std::vector<float> ts = buf(kChunk * F);  // terms through the states, before they are added
  std::vector<float> gx = buf(kChunk * std::max(D, Dv));
  for (int64_t head = lo; head < hi; ++head) {
    const int64_t n = head / Hkv, hk = head % Hkv;
    const float* kb = k.data_ptr<float>() + n * k.stride(0) + hk * k.stride(1);
    const float* vb = v.data_ptr<float>() + n * v.stride(0) + hk * v.stride(1);
    const float* pre = prefix.data_ptr<float>() + head * nc * F * Dv;  // (nc, F, Dv)
    const float* zpre = zprefix.data_ptr<float>() + head * nc * F;  // (nc, F)
    const float* tp = tops.data_ptr<float>() + head * nc;  // (nc,)
    float* dkb = dk.data_ptr<float>() + head * N * D;
    float* dvb = dv.data_ptr<float>() + head * N * Dv;
    std::fill(g.begin(), g.end(), 0.f);
    std::fill(gz.begin(), gz.end(), 0.f);
    for (int64_t c = nc - 1; c >= 0; --c) {
      const int64_t c0 = c * kChunk, r = std::min(kChunk, N - c0), rp = ceil_to(r, kPanel);
      keys_at(fm, kb + c0 * k.stride(2), k.stride(2), r, fk.data(), tp[c]);
      pack_keys(fk.data(), F, F, r, 0, rp, fkp.data());  // phi(K_c) as (F, 16) panels
      pack_keys(vb, v.stride(2), Dv, N, c0, c0 + rp, vp.data());  // V_c as (Dv, 16) panels
      if (c > 0) {  // the state before the chunk, at its shift
        const float scale = std::exp(tp[c - 1] - tp[c]);
        scaled_copy(pre + (c - 1) * F * Dv, sp.data(), F * Dv, scale);
        scaled_copy(zpre + (c - 1) * F, zp.data(), F, scale);
      } else {
        std::fill(sp.begin(), sp.end(), 0.f);
        std::fill(zp.begin(), zp.end(), 0.f);
      }
      transpose_into(sp.data(), F, Dv, spt.data());
      transpose_into(g.data(), F, Dv, gt.data());
      std::fill(dfk.begin(), dfk.begin() + r * F, 0.f);
      std::fill(dvc.begin(), dvc.begin() + r * Dv, 0.f);
      std::fill(tg.begin(), tg.end(), 0.f);
      std::fill(tgz.begin(), tgz.end(), 0.f);
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        const int64_t qh = n * Hq + h;
        const float* qb = q.data_ptr<float>() + n * q.stride(0) + h * q.stride(1);
        const float* ob = out.data_ptr<float>() + (qh * N + c0) * Dv;  // (r, Dv)
        const float* gb = dout.data_ptr<float>() + (qh * N + c0) * Dv;
        fm.queries(qb + c0 * q.stride(2), q.stride(2), r, fq.data());
        // A = tril(phi(Q_c) phi(K_c)^T)
        qk_product(r, rp, fq.data(), F, fkp.data(), F, 1.f, a.data(), kChunk);
        masked_row_sums(a.data(), r, rp, sums.data());  // as the forward
        row_dots(fq.data(), F, r, zp.data(), F, den.data());
        for (int64_t i = 0; i < r; ++i) {
          den[i] = std::max(den[i] + sums[i], FLT_MIN);
          scaled_copy(gb + i * Dv, &dnum[i * Dv], Dv, 1.f / den[i]);
          dden[i] = -dot(&dnum[i * Dv], ob + i * Dv, Dv);
        }
        // dnum V_c^T
        qk_product(r, rp, dnum.data(), Dv, vp.data(), Dv, 1.f, da.data(), kChunk);
        for (int64_t i = 0; i < r; ++i) {  // + dden 1^T, then tril
          float* row = &da[i * kChunk];
          add_scalar(row, i + 1, dden[i]);
          std::fill(row + i + 1, row + rp, 0.f);
        }
        // dphi(Q_c) = dA phi(K_c) + dnum S_<c^T
        pv_product(r, F, da.data(), kChunk, fk.data(), F, r, dfq.data(), F, Into::kStore);
        // two chains summed apart, then added
        pv_product(r, F, dnum.data(), Dv, spt.data(), F, Dv, dfq.data(), F, Into::kAdd);
        for (int64_t i = 0; i < r; ++i) {  // + dden z_<c^T; gz's share: phi(Q)^T dden
          const Vec cd(dden[i]);
          for (int64_t f = 0; f < F; f += Vec::size()) {
            at::vec::fmadd(cd, Vec::loadu(&zp[f]), Vec::loadu(&dfq[i * F + f])).store(&dfq[i * F + f]);
            at::vec::fmadd(cd, Vec::loadu(&fq[i * F + f]), Vec::loadu(&tgz[f])).store(&tgz[f]);
          }
        }
        // dphi(K_c) += dA^T phi(Q_c)
        pvt_product(r, F, da.data(), kChunk, fq.data(), F, r, dfk.data(), F, Into::kChain);
        // dV_c += A^T dnum; G's share
        pvt_product(r, Dv, a.data(), kChunk, dnum.data(), Dv, r, dvc.data(), Dv, Into::kChain);
        pvt_product(F, Dv, fq.data(), F, dnum.data(), Dv, r, tg.data(), Dv, Into::kChain);
        through_features(fm, w, qb + c0 * q.stride(2), q.stride(2), r, false, dfq.data(),
                         fq.data(), gx.data());
        std::copy_n(gx.data(), r * D, dq.data_ptr<float>() + (qh * N + c0) * D);
      }
      // what the later chunks send back: dphi(K_c) += V_c G^T + gz, dV_c += phi(K_c) G
      // (each summed apart from the chunk's own terms, then added)
      pv_product(r, F, vb + c0 * v.stride(2), v.stride(2), gt.data(), F, Dv, ts.data(), F,
                 Into::kStore);
      for (int64_t j = 0; j < r; ++j) add_into(&ts[j * F], gz.data(), F);
      add_into(dfk.data(), ts.data(), r * F);
      features_product(r, fk.data(), F, g.data(), Dv, F, Dv, gx.data(), Dv);
      add_into(dvc.data(), gx.data(), r * Dv);
      std::copy_n(dvc.data(), r * Dv, dvb + c0 * Dv);
      through_features(fm, w, kb + c0 * k.stride(2), k.stride(2), r, true, dfk.data(),
                       fk.data(), gx.data());
      std::copy_n(gx.data(), r * D, dkb + c0 * D);
      if (c > 0) {  // G for chunk c - 1: this chunk's share joins, at the earlier shift
        const float scale = std::exp(tp[c - 1] - tp[c]);
        add_into(g.data(), tg.data(), F * Dv);
        add_into(gz.data(), tgz.data(), F);
        if (scale != 1.f) {
          scale_in_place(g.data(), F * Dv, scale);
          scale_in_place(gz.data(), F, scale);
        }
      }
    }
  }
}

// The whole calls over the CPU threads, each in one parallel region (cpu_pieces.h).

// Non-causal forward: out, and the state (S, z, shift) its backward reads. With at least
// two kv heads per thread, one region whose pieces take whole kv heads: their states, then
// their query heads' rows (contiguous tasks); with fewer, two regions (the states, then
// the rows of every head), so that short sequences over few heads still use every thread.
void linear_forward_parallel(const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& proj,
                             double half_scale, const torch::Tensor& state,
                             const torch::Tensor& zsum, const torch::Tensor& shift,
                             const torch::Tensor& out, int64_t pieces_per_thread) {
  check_float4d(q, "q");
  check_float4d(k, "k");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "linear_forward: Hq must be a multiple of Hkv");
  const int64_t B = q.size(0), Hq = q.size(1), Nq = q.size(2), Hkv = k.size(1);
  const int64_t blocks = (Nq + kChunk - 1) / kChunk, per_head = (Hq / Hkv) * blocks;
  if (B * Hkv >= 2 * at::get_num_threads()) {
    run_in_pieces(B * Hkv, pieces_per_thread, [&](int64_t lo, int64_t hi) {
      linear_state(k, v, proj, half_scale, state, zsum, shift, lo, hi);
      linear_output(q, proj, state, zsum, out, lo * per_head, hi * per_head);
    });
    return;
  }
  run_in_pieces(B * Hkv, pieces_per_thread, [&](int64_t lo, int64_t hi) {
    linear_state(k, v, proj, half_scale, state, zsum, shift, lo, hi);
  });
  run_in_pieces(B * Hq * blocks, pieces_per_thread, [&](int64_t lo, int64_t hi) {
    linear_output(q, proj, state, zsum, out, lo, hi);
  });
}

void linear_causal_parallel(const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v, const torch::Tensor& proj,
                            double half_scale, const torch::Tensor& out,
                            const torch::Tensor& prefix, const torch::Tensor& zprefix,
                            const torch::Tensor& tops, int64_t pieces_per_thread) {
  check_float4d(q, "q");
  run_in_pieces(q.size(0) * q.size(1), pieces_per_thread, [&](int64_t lo, int64_t hi) {
    linear_causal(q, k, v, proj, half_scale, out, prefix, zprefix, tops, lo, hi);
  });
}

void linear_backward_parallel(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& proj,
                              const torch::Tensor& proj_rows, double half_scale,
                              const torch::Tensor& out, const torch::Tensor& dout,
                              const torch::Tensor& state, const torch::Tensor& zsum,
                              const torch::Tensor& shift, const torch::Tensor& dq,
                              const torch::Tensor& dk, const torch::Tensor& dv,
                              int64_t pieces_per_thread) {
  check_float4d(k, "k");
  run_in_pieces(k.size(0) * k.size(1), pieces_per_thread, [&](int64_t lo, int64_t hi) {
    linear_backward(q, k, v, proj, proj_rows, half_scale, out, dout, state, zsum, shift, dq, dk,
                    dv, lo, hi);
  });
}

void linear_causal_backward_parallel(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const torch::Tensor& proj,
                                     const torch::Tensor& proj_rows, double half_scale,
                                     const torch::Tensor& out, const torch::Tensor& dout,
                                     const torch::Tensor& prefix,
                                     const torch::Tensor& zprefix, const torch::Tensor& tops,
                                     const torch::Tensor& dq, const torch::Tensor& dk,
                                     const torch::Tensor& dv, int64_t pieces_per_thread) {
  check_float4d(k, "k");
  run_in_pieces(k.size(0) * k.size(1), pieces_per_thread, [&](int64_t lo, int64_t hi) {
    linear_causal_backward(q, k, v, proj, proj_rows, half_scale, out, dout, prefix, zprefix,
                           tops, dq, dk, dv, lo, hi);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("stream_bytes") = kStreamBytes;  // outputs above it are streamed
  m.def("linear_state", &linear_state,
        "S = phi(K)^T V and z = sum phi(K) for kv heads [lo, hi)",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_output", &linear_output,
        "phi(Q) S / (phi(Q) . z) for tasks [lo, hi) of (batch, head, 64-row block)",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_causal", &linear_causal,
        "causal linear attention (seq_q == seq_k) for query heads [lo, hi)",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_backward", &linear_backward,
        "dq, dk, dv of the non-causal form for kv heads [lo, hi)",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_causal_backward", &linear_causal_backward,
        "dq, dk, dv of the causal form (seq_q == seq_k) for kv heads [lo, hi)",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_forward_parallel", &linear_forward_parallel,
        "the non-causal forward (states, then outputs) over the CPU threads",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_causal_parallel", &linear_causal_parallel,
        "linear_causal over every query head, in pieces over the CPU threads",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_backward_parallel", &linear_backward_parallel,
        "linear_backward over every kv head, in pieces over the CPU threads",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_causal_backward_parallel", &linear_causal_backward_parallel,
        "linear_causal_backward over every kv head, in pieces over the CPU threads",
        py::call_guard<py::gil_scoped_release>());
}
