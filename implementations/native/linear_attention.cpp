// Fused CPU forwards of linear attention with phi(x) = elu(x) + 1 (fp32), non-causal:
//
//   out = phi(Q) S / (phi(Q) . z),   S = phi(K)^T V (D x Dv),   z = sum_j phi(K_j) (D,)
//
// In eager PyTorch the elementwise feature map (an exp, a compare, a select over every
// element of Q and K) cost about a third of the forward's time beside matmuls whose
// operands came from memory (results/2026-12-01-family-profile-cpu). Here phi is computed
// for 64 rows at a time into a buffer that stays in L1 and consumed there by the
// register-blocked tiles of avx2_tiles.h:
//
// * linear_elu_state: per (batch, kv head), S and z over the keys, 64 key rows at a time
//   (the tile reads phi(K) of the rows transposed, so S += phi(K)^T V needs no copy).
// * linear_elu_output: per (batch, query head, 64-row block), phi(Q) of the block, then
//   phi(Q) S and each row divided by phi(Q_i) . z.
// * linear_elu_causal: per (batch, query head), chunks of 64 rows in order, each seeing the
//   state of the keys before it and, inside the chunk, a masked 64 x 64 product.
//
// Each runs a range of its tasks per call with the GIL released; attnbench's split_work
// hands the ranges to the CPU threads. Dv must be a multiple of 16 (the tiles' width).
#include <torch/extension.h>

#include "avx2_tiles.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using namespace attnbench;

constexpr int64_t kChunk = 64;  // rows of phi per step

inline Vec elu1(const Vec& x) {  // elu(x) + 1: x + 1 where x > 0, else exp(x)
  return Vec::blendv(x.exp_u20(), x + Vec(1.f), x > Vec(0.f));
}

// dst[0:n] = phi(src[0:n]), vectorized with a scalar tail.
inline void phi_row(const float* src, float* dst, int64_t n) {
  int64_t d = 0;
  for (; d + Vec::size() <= n; d += Vec::size()) elu1(Vec::loadu(src + d)).store(dst + d);
  for (; d < n; ++d) dst[d] = src[d] > 0.f ? src[d] + 1.f : std::exp(src[d]);
}

void check_float4d(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 4 &&
                  t.stride(3) == 1,
              "linear_elu: ", what, " must be a 4-d float32 CPU tensor, last dim contiguous");
}

}  // namespace

// state (B, Hkv, D, Dv) and zsum (B, Hkv, D), contiguous, for kv heads [lo, hi) of B*Hkv.
void linear_elu_state(const torch::Tensor& k, const torch::Tensor& v,
                      const torch::Tensor& state, const torch::Tensor& zsum, int64_t lo,
                      int64_t hi) {
  check_float4d(k, "k");
  check_float4d(v, "v");
  const int64_t B = k.size(0), Hkv = k.size(1), Nk = k.size(2), D = k.size(3);
  const int64_t Dv = v.size(3);
  TORCH_CHECK(v.size(0) == B && v.size(1) == Hkv && v.size(2) == Nk,
              "linear_elu_state: k and v shapes do not match");
  TORCH_CHECK(Dv % kPanel == 0, "linear_elu_state: Dv must be a multiple of 16");
  TORCH_CHECK(state.is_contiguous() && state.scalar_type() == at::kFloat &&
                  state.numel() == B * Hkv * D * Dv && zsum.is_contiguous() &&
                  zsum.scalar_type() == at::kFloat && zsum.numel() == B * Hkv * D,
              "linear_elu_state: state must be (B, Hkv, D, Dv) and zsum (B, Hkv, D), float32");
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= B * Hkv, "linear_elu_state: head range outside");
  std::vector<float> phik(static_cast<size_t>(kChunk * D));  // (kChunk, D)
  std::vector<float> zc(static_cast<size_t>(D));
  std::vector<float> sc(static_cast<size_t>(D * Dv));  // one chunk's phi(K)^T V
  std::vector<float> vc(static_cast<size_t>(kChunk * Dv));  // the chunk's V rows, in L1
  for (int64_t head = lo; head < hi; ++head) {
    const int64_t n = head / Hkv, h = head % Hkv;
    const float* kh = k.data_ptr<float>() + n * k.stride(0) + h * k.stride(1);
    const float* vh = v.data_ptr<float>() + n * v.stride(0) + h * v.stride(1);
    float* s = state.data_ptr<float>() + head * D * Dv;  // (D, Dv)
    float* z = zsum.data_ptr<float>() + head * D;  // (D,)
    std::fill(s, s + D * Dv, 0.f);
    std::fill(z, z + D, 0.f);
    for (int64_t j0 = 0; j0 < Nk; j0 += kChunk) {
      const int64_t r = std::min(kChunk, Nk - j0);
      std::fill(zc.begin(), zc.end(), 0.f);
      for (int64_t j = 0; j < r; ++j) {
        phi_row(kh + (j0 + j) * k.stride(2), &phik[j * D], D);
        add_into(zc.data(), &phik[j * D], D);
      }
      // The chunk's phi(K_rows)^T (D, r) @ V_rows (r, Dv) (phi(K) read transposed), then
      // added to S: sums in two levels (64 keys, then the chunks), not one fp32 chain.
      // V's rows copied once (a sequential read) rather than read in four 16-float
      // column slabs by the tiles
      for (int64_t j = 0; j < r; ++j)
        std::copy_n(vh + (j0 + j) * v.stride(2), Dv, &vc[j * Dv]);
      for (int64_t e = 0; e < Dv; e += kPanel)
        for_row_bands<PVTBand>(D, phik.data(), D, vc.data() + e, Dv, r, sc.data() + e, Dv,
                               false);
      add_into(z, zc.data(), D);
      add_into(s, sc.data(), D * Dv);
    }
  }
}

// out (B, Hq, Nq, Dv) contiguous, for tasks [lo, hi) of (batch, query head, 64-row block).
void linear_elu_output(const torch::Tensor& q, const torch::Tensor& state,
                       const torch::Tensor& zsum, const torch::Tensor& out, int64_t lo,
                       int64_t hi) {
  check_float4d(q, "q");
  const int64_t B = q.size(0), Hq = q.size(1), Nq = q.size(2), D = q.size(3);
  TORCH_CHECK(state.dim() == 4 && state.size(0) == B && state.size(2) == D &&
                  state.is_contiguous() && zsum.is_contiguous() && state.size(1) > 0 &&
                  Hq % state.size(1) == 0,
              "linear_elu_output: state must be (B, Hkv, D, Dv) with Hq a multiple of Hkv");
  const int64_t Hkv = state.size(1), Dv = state.size(3), G = Hq / Hkv;
  TORCH_CHECK(out.is_contiguous() && out.numel() == B * Hq * Nq * Dv && Dv % kPanel == 0,
              "linear_elu_output: out must be a contiguous (B, Hq, Nq, Dv) tensor");
  const int64_t nb = (Nq + kChunk - 1) / kChunk;
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= B * Hq * nb, "linear_elu_output: task range");
  std::vector<float> phiq(static_cast<size_t>(kChunk * D));  // (kChunk, D)
  // The block's phi(Q) S goes to a buffer in L1 and is scaled into `out` in one pass: the
  // tiles storing straight into `out` (fresh lines each block) ran at half their speed.
  std::vector<float> ot(static_cast<size_t>(kChunk * Dv));  // (kChunk, Dv)
  for (int64_t task = lo; task < hi; ++task) {
    const int64_t b = task % nb, bh = task / nb, h = bh % Hq, n = bh / Hq;
    const int64_t head = n * Hkv + h / G, i0 = b * kChunk, m = std::min(kChunk, Nq - i0);
    const float* qb = q.data_ptr<float>() + n * q.stride(0) + h * q.stride(1);
    const float* s = state.data_ptr<float>() + head * D * Dv;  // (D, Dv)
    const float* z = zsum.data_ptr<float>() + head * D;  // (D,)
    float* ob = out.data_ptr<float>() + ((n * Hq + h) * Nq + i0) * Dv;  // (m, Dv)
    for (int64_t i = 0; i < m; ++i) phi_row(qb + (i0 + i) * q.stride(2), &phiq[i * D], D);
    for (int64_t e = 0; e < Dv; e += kPanel)
      for_row_bands<PVBand>(m, phiq.data(), D, s + e, Dv, D, ot.data() + e, Dv, false);
    for (int64_t i = 0; i < m; ++i)  // phi(Q_i) . z > 0: every feature is positive
      scaled_copy(&ot[i * Dv], ob + i * Dv, Dv, 1.f / dot(&phiq[i * D], z, D));
  }
}

// Causal, seq_q == seq_k: out (B, Hq, N, Dv) contiguous, for query heads [lo, hi) of B*Hq.
// Chunks of 64 rows in order, with the state of the keys before the chunk:
//   o_c = phi(Q_c) S + tril(phi(Q_c) phi(K_c)^T) V_c,  den_c = phi(Q_c) z + rowsum(tril(..)),
// then S += phi(K_c)^T V_c and z += sum phi(K_c) (two-level sums, as in linear_elu_state).
void linear_elu_causal(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& out, int64_t lo, int64_t hi) {
  check_float4d(q, "q");
  check_float4d(k, "k");
  check_float4d(v, "v");
  const int64_t B = q.size(0), Hq = q.size(1), N = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Dv = v.size(3);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && k.size(2) == N && v.size(2) == N &&
                  v.size(1) == Hkv && k.size(3) == D && Hkv > 0 && Hq % Hkv == 0,
              "linear_elu_causal: q, k, v shapes do not match (seq_q must equal seq_k)");
  TORCH_CHECK(Dv % kPanel == 0, "linear_elu_causal: Dv must be a multiple of 16");
  TORCH_CHECK(out.is_contiguous() && out.numel() == B * Hq * N * Dv,
              "linear_elu_causal: out must be a contiguous (B, Hq, N, Dv) tensor");
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= B * Hq, "linear_elu_causal: head range outside");
  const int64_t G = Hq / Hkv;
  std::vector<float> st(static_cast<size_t>(D * Dv)), z(static_cast<size_t>(D));
  std::vector<float> sc(static_cast<size_t>(D * Dv)), zc(static_cast<size_t>(D));
  std::vector<float> phiq(static_cast<size_t>(kChunk * D)), phik(static_cast<size_t>(kChunk * D));
  std::vector<float> panels(static_cast<size_t>(kChunk * D));  // phi(K_c) as (D, 16) panels
  std::vector<float> a(static_cast<size_t>(kChunk * kChunk));  // (C, C) masked scores
  std::vector<float> ot(static_cast<size_t>(kChunk * Dv)), den(static_cast<size_t>(kChunk));
  std::vector<float> inner(static_cast<size_t>(kChunk * Dv));  // the chunk's own keys' part
  for (int64_t head = lo; head < hi; ++head) {
    const int64_t n = head / Hq, h = head % Hq, hk = h / G;
    const float* qh = q.data_ptr<float>() + n * q.stride(0) + h * q.stride(1);
    const float* kh = k.data_ptr<float>() + n * k.stride(0) + hk * k.stride(1);
    const float* vh = v.data_ptr<float>() + n * v.stride(0) + hk * v.stride(1);
    float* oh = out.data_ptr<float>() + head * N * Dv;  // (N, Dv)
    std::fill(st.begin(), st.end(), 0.f);
    std::fill(z.begin(), z.end(), 0.f);
    for (int64_t c0 = 0; c0 < N; c0 += kChunk) {
      const int64_t r = std::min(kChunk, N - c0), rp = ceil_to(r, kPanel);
      std::fill(zc.begin(), zc.end(), 0.f);
      std::fill(panels.begin(), panels.begin() + rp * D, 0.f);
      for (int64_t i = 0; i < r; ++i) {
        phi_row(qh + (c0 + i) * q.stride(2), &phiq[i * D], D);
        phi_row(kh + (c0 + i) * k.stride(2), &phik[i * D], D);
        add_into(zc.data(), &phik[i * D], D);
        float* panel = &panels[(i / kPanel) * D * kPanel + i % kPanel];
        for (int64_t d = 0; d < D; ++d) panel[d * kPanel] = phik[i * D + d];
      }
      // the keys before the chunk: phi(Q_c) S and phi(Q_c) . z
      for (int64_t e = 0; e < Dv; e += kPanel)
        for_row_bands<PVBand>(r, phiq.data(), D, st.data() + e, Dv, D, ot.data() + e, Dv,
                              false);
      for (int64_t i = 0; i < r; ++i) den[i] = dot(&phiq[i * D], z.data(), D);
      // inside the chunk: row i sees keys 0..i
      for (int64_t p = 0; p < rp; p += kPanel)
        for_row_bands<QKBand>(r, phiq.data(), D, &panels[p * D], D, 1.f, a.data() + p, kChunk);
      for (int64_t i = 0; i < r; ++i) {
        float* row = &a[i * kChunk];
        std::fill(row + i + 1, row + rp, 0.f);
        float sum = 0.f;
        for (int64_t j = 0; j <= i; ++j) sum += row[j];
        den[i] += sum;
      }
      // summed apart from phi(Q_c) S and then added (two shorter fp32 chains than one)
      for (int64_t e = 0; e < Dv; e += kPanel)
        for_row_bands<PVBand>(r, a.data(), kChunk, vh + c0 * v.stride(2) + e, v.stride(2), r,
                              inner.data() + e, Dv, false);
      add_into(ot.data(), inner.data(), r * Dv);
      for (int64_t i = 0; i < r; ++i)  // den > 0: every row sees at least its own key
        scaled_copy(&ot[i * Dv], oh + (c0 + i) * Dv, Dv, 1.f / den[i]);
      // the chunk joins the state
      for (int64_t e = 0; e < Dv; e += kPanel)
        for_row_bands<PVTBand>(D, phik.data(), D, vh + c0 * v.stride(2) + e, v.stride(2), r,
                               sc.data() + e, Dv, false);
      add_into(st.data(), sc.data(), D * Dv);
      add_into(z.data(), zc.data(), D);
    }
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_elu_state", &linear_elu_state,
        "S = phi(K)^T V and z = sum phi(K) for kv heads [lo, hi)",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_elu_output", &linear_elu_output,
        "phi(Q) S / (phi(Q) . z) for tasks [lo, hi) of (batch, head, 64-row block)",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_elu_causal", &linear_elu_causal,
        "causal linear attention (seq_q == seq_k) for query heads [lo, hi)",
        py::call_guard<py::gil_scoped_release>());
}
