// Fused CPU forward and backward of softmax attention over contiguous key segments (fp32).
//
// Query rows are cut into blocks of `block` rows. Block b attends the keys of its segments
// [seg_ptr[b], seg_ptr[b + 1]): each segment is a contiguous key range [start, start + len)
// of one K/V head, so a block's scores are one small matrix (block x total width) computed
// straight from K's rows (no gather, no padding). Row i (a query index) may see key j only
// if i + lo_off <= j <= i + hi_off: a sliding window is one segment per block with finite
// offsets, a block-sparse layout is a few segments per block (runs of consecutive key
// tiles) with unbounded offsets. Per row: max, exp and sum over the visible columns only
// (the rest are zeroed), then O = P V over each segment's keys, divided by the row's sum
// at the end. Rows that see no key output 0.
//
// The two products run in register-blocked SIMD tiles (simd_tiles.h) when Dv is a
// multiple of 16 (K packed once per head into 16-key panels), else in MKL's sgemm, which
// repacks both operands of every small call. The exponential is ATen's exp_u20, the one its
// CPU flash-attention kernel uses; the AVX-512 build takes simd_tiles.h's exp_nonpositive
// (scores less their row's max are never positive), closer to float64 and no slower.
//
// A range of (batch, head, block) tasks runs per call, with the GIL released; the
// *_parallel bindings share a call's tasks out over the CPU threads in one parallel region
// (cpu_pieces.h; sgemm, where called, inside it on its caller's thread, as in sdpa's CPU
// flash kernel). A call keeps one score buffer in cache from task to task.
//
// Under autograd the forward also keeps each row's max and 1 / sum, and the backward
// (segment_attention_backward) recomputes P from them block by block, as FlashAttention's
// does from its log-sum-exp: O(N) saved state instead of the eager path's O(N * W)
// probabilities.
#include <torch/extension.h>

#include "cpu_pieces.h"
#include "simd_tiles.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc);

namespace {

using namespace attnbench;

// Column-major BLAS call; a row-major (r x c) matrix is its column-major transpose.
void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  const int LDA = static_cast<int>(lda), LDB = static_cast<int>(ldb),
            LDC = static_cast<int>(ldc);
  sgemm_(&ta, &tb, &M, &N, &K, &alpha, a, &LDA, b, &LDB, &beta, c, &LDC);
}

constexpr int64_t kSumRun = 64;  // keys per partial sum of P V
// Query rows per partial sum of dK and dV: a block's runs are summed in a buffer, which is
// then added to the head's sums once (a key's sums over many blocks, as bigbird's global
// keys have, stay one add per block), which keeps dK's and dV's rounding error below the
// eager backward's.
constexpr int64_t kRowRun = 16;

struct Segment {
  int64_t start, len;
};

// The segments as the kernels read them, checked once per call: block b's are
// segs[ptr[b]] .. segs[ptr[b + 1] - 1]. With `fast` (the register tiles) a segment's S columns
// are whole 16-key panels, a superset of the segment whose extra columns are masked like the
// window's edges (a window span that starts off a panel boundary costs up to 15 more).
struct Geometry {
  const int64_t* ptr;
  std::vector<Segment> segs;
  int64_t nb;
  bool fast;
  int64_t wmax = 0;  // the widest block's columns
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  // [lo, hi): the union of every block's regions (keys off the sequence included)

  // The S columns of a segment: from key `a`, `wd` wide.
  void region(const Segment& sg, int64_t& a, int64_t& wd) const {
    a = fast ? floor_to(sg.start, kPanel) : sg.start;
    wd = (fast ? ceil_to(sg.start + sg.len, kPanel) : sg.start + sg.len) - a;
  }
  int64_t width(int64_t b) const {
    int64_t w = 0;
    for (int64_t t = ptr[b], a, wd; t < ptr[b + 1]; ++t) {
      region(segs[t], a, wd);
      w += wd;
    }
    return w;
  }
};

Geometry read_geometry(const char* fn, const torch::Tensor& seg_ptr,
                       const torch::Tensor& seg_start, const torch::Tensor& seg_len,
                       int64_t block, int64_t Nq, int64_t Nk, bool fast) {
  const int64_t nb = seg_ptr.numel() - 1;
  TORCH_CHECK(block > 0 && nb == (Nq + block - 1) / block, fn,
              ": seg_ptr must hold ceil(Nq / block) + 1 entries");
  TORCH_CHECK(seg_ptr.scalar_type() == at::kLong && seg_start.scalar_type() == at::kLong &&
                  seg_len.scalar_type() == at::kLong && seg_ptr.is_contiguous() &&
                  seg_start.is_contiguous() && seg_len.is_contiguous() &&
                  seg_start.numel() == seg_len.numel(),
              fn, ": segments must be contiguous int64 tensors");
  Geometry g{seg_ptr.data_ptr<int64_t>(), {}, nb, fast};
  const int64_t* starts = seg_start.data_ptr<int64_t>();
  const int64_t* lens = seg_len.data_ptr<int64_t>();
  const int64_t n_segs = seg_start.numel();
  g.segs.resize(n_segs);
  for (int64_t s = 0; s < n_segs; ++s) {
    g.segs[s] = {starts[s], lens[s]};
    TORCH_CHECK(g.segs[s].start >= 0 && g.segs[s].len >= 0 &&
                    g.segs[s].start + g.segs[s].len <= Nk,
                fn, ": a segment reaches outside the keys");
  }
  for (int64_t b = 0; b < nb; ++b) {
    TORCH_CHECK(g.ptr[0] == 0 && g.ptr[b] <= g.ptr[b + 1] && g.ptr[b + 1] <= n_segs, fn,
                ": seg_ptr is not a valid offset array");
    g.wmax = std::max(g.wmax, g.width(b));
    for (int64_t t = g.ptr[b], a, wd; t < g.ptr[b + 1]; ++t) {
      g.region(g.segs[t], a, wd);
      g.lo = std::min(g.lo, a);
      g.hi = std::max(g.hi, a + wd);
    }
  }
  return g;
}

void check_inputs(const char* fn, std::initializer_list<const torch::Tensor*> ts) {
  for (const auto* t : ts) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->dim() == 4, fn,
                ": q, k, v and the outputs must be 4-d float32 CPU tensors");
    TORCH_CHECK(t->stride(3) == 1, fn, ": last dim must be contiguous");
  }
}

}  // namespace

void segment_attention_forward(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& out,
                               const torch::Tensor& stats, const torch::Tensor& seg_ptr,
                               const torch::Tensor& seg_start, const torch::Tensor& seg_len,
                               int64_t block, int64_t lo_off, int64_t hi_off, double scale,
                               int64_t task_lo, int64_t task_hi) {
  const char* fn = "segment_attention_forward";
  check_inputs(fn, {&q, &k, &v, &out});
  const int64_t B = q.size(0), Hq = q.size(1), Nq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Nk = k.size(2), Dv = v.size(3);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == Nk &&
                  k.size(3) == D && Hkv > 0 && Hq % Hkv == 0,
              "segment_attention_forward: q, k, v shapes do not match");
  TORCH_CHECK(out.is_contiguous() && out.size(0) == B && out.size(1) == Hq &&
                  out.size(2) == Nq && out.size(3) == Dv,
              "segment_attention_forward: out must be a contiguous (B, Hq, Nq, Dv) tensor");
  const bool keep_stats = stats.numel() > 0;  // the backward's row statistics
  TORCH_CHECK(!keep_stats || (stats.scalar_type() == at::kFloat && stats.is_contiguous() &&
                              stats.numel() == B * Hq * Nq * 2),
              "segment_attention_forward: stats must be empty or a contiguous (B, Hq, Nq, 2) "
              "float32 tensor");
  const int64_t G = Hq / Hkv;
  const bool fast = Dv % kPanel == 0;  // else MKL's sgemm for both products
  const Geometry geo = read_geometry(fn, seg_ptr, seg_start, seg_len, block, Nq, Nk, fast);
  const int64_t nb = geo.nb, wmax = geo.wmax;
  const int64_t* sp = geo.ptr;
  const std::vector<Segment>& segs = geo.segs;
  auto region = [&](const Segment& sg, int64_t& a, int64_t& wd) { geo.region(sg, a, wd); };

  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), qs2 = q.stride(2);
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);
  const float alpha = static_cast<float>(scale);
  const float neg_inf = -std::numeric_limits<float>::infinity();

  const int64_t tasks = B * Hq * nb;
  TORCH_CHECK(0 <= task_lo && task_lo <= task_hi && task_hi <= tasks,
              "segment_attention_forward: task range outside [0, B * Hq * n_blocks]");

  // Fast path: K of the current (batch, kv head) packed into panels, over the union of the
  // regions this call's tasks of that head need (tasks run head by head).
  std::vector<float> packed;
  int64_t packed_head = -1, pk0 = 0;
  auto kv_head = [&](int64_t task) { return (task / nb / Hq) * Hkv + (task / nb % Hq) / G; };
  auto ensure_packed = [&](int64_t task) {
    const int64_t head = kv_head(task);
    if (head == packed_head) return;
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
    for (int64_t t2 = task; t2 < task_hi && kv_head(t2) == head; ++t2) {
      for (int64_t t = sp[t2 % nb], a, wd; t < sp[t2 % nb + 1]; ++t) {
        region(segs[t], a, wd);
        lo = std::min(lo, a);
        hi = std::max(hi, a + wd);
      }
    }
    packed_head = head;
    if (lo >= hi) return;
    packed.resize(static_cast<size_t>((hi - lo) * D));
    pack_keys(kp + (head / Hkv) * ks0 + (head % Hkv) * ks1, ks2, D, Nk, lo, hi, packed.data());
    pk0 = lo;
  };

  const bool stream = streams(out.numel());  // the output's rows: see scaled_store
  auto run_block = [&](int64_t task, float* s, float* inv, float* ot) {
    const int64_t b = task % nb, bh = task / nb;
    const int64_t h = bh % Hq, n = bh / Hq, hk = h / G;
    const int64_t i0 = b * block, m = std::min(block, Nq - i0);
    const float* qb = qp + n * qs0 + h * qs1 + i0 * qs2;  // (m, D) rows, stride qs2
    const float* kh = kp + n * ks0 + hk * ks1;  // (Nk, D)
    const float* vh = vp + n * vs0 + hk * vs1;  // (Nk, Dv)
    float* ob = op + ((n * Hq + h) * Nq + i0) * Dv;  // (m, Dv), contiguous
    float* rs = keep_stats ? stats.data_ptr<float>() + ((n * Hq + h) * Nq + i0) * 2
                           : nullptr;  // (m, 2): each row's max and 1 / sum
    const int64_t t0 = sp[b], t1 = sp[b + 1];
    const int64_t w = geo.width(b);
    if (w == 0) {
      std::fill(ob, ob + m * Dv, 0.f);
      if (rs) std::fill(rs, rs + 2 * m, 0.f);
      return;
    }
    if (fast) ensure_packed(task);
    // S (m, w) row-major = scale * Q_b K^T over each segment's region, region by region.
    for (int64_t t = t0, c = 0, a, wd; t < t1; ++t, c += wd) {
      region(segs[t], a, wd);
      if (!fast) {
        gemm('T', 'N', wd, m, D, alpha, kh + a * ks2, ks2, qb, qs2, 0.f, s + c, w);
        continue;
      }
      const float* panels = packed.data() + (a - pk0) * D;  // (wd / 16) panels of (D, 16)
      qk_product(m, wd, qb, qs2, panels, D, alpha, s + c, w);
    }
    // Softmax over the visible columns of each row: keys [lo, hi] within the segments.
    for (int64_t i = 0; i < m; ++i) {
      float* row = s + i * w;  // (w,)
      const int64_t lo = i0 + i + lo_off, hi = i0 + i + hi_off;
      float mx = neg_inf;
      for (int64_t t = t0, c = 0, a, wd; t < t1; ++t, c += wd) {
        region(segs[t], a, wd);
        const int64_t first = std::max(lo, segs[t].start) - a;  // visible columns
        const int64_t last = std::min(hi + 1, segs[t].start + segs[t].len) - a;  // [first, last)
        if (last <= first) {
          std::fill(row + c, row + c + wd, 0.f);
          continue;
        }
        std::fill(row + c, row + c + first, 0.f);
        std::fill(row + c + last, row + c + wd, 0.f);
        mx = max_of(row + c + first, last - first, mx);
      }
      if (mx == neg_inf) {  // sees no key: P row all zero, output row 0
        inv[i] = 0.f;
        if (rs) rs[2 * i] = rs[2 * i + 1] = 0.f;
        continue;
      }
      float sum = 0.f;
      for (int64_t t = t0, c = 0, a, wd; t < t1; ++t, c += wd) {
        region(segs[t], a, wd);
        const int64_t first = std::max(lo, segs[t].start) - a;
        const int64_t last = std::min(hi + 1, segs[t].start + segs[t].len) - a;
        if (last > first) sum += exp_sum(row + c + first, last - first, mx);
      }
      inv[i] = 1.f / sum;
      if (rs) {
        rs[2 * i] = mx;
        rs[2 * i + 1] = inv[i];
      }
    }
    // O_b (m, Dv) = P V over each segment's own keys (no V row outside the sequence is
    // read), summed over the segments in a buffer in L1, then each row divided by its sum
    // on the way to `out` (tiles storing into fresh lines of `out` ran at half speed).
    bool first = true;
    for (int64_t t = t0, c = 0, a, wd; t < t1; ++t, c += wd) {
      region(segs[t], a, wd);
      const float* ps = s + c + (segs[t].start - a);  // (m, len) columns of this segment
      const float* vseg = vh + segs[t].start * vs2;  // (len, Dv)
      if (!fast) {
        gemm('N', 'N', Dv, m, segs[t].len, 1.f, vseg, vs2, ps, w, first ? 0.f : 1.f, ot, Dv);
      } else {
        // in runs of kSumRun keys, each summed apart and then added: shorter fp32 chains
        // than one over the whole span, so the error against float64 stays below eager's
        for (int64_t j0 = 0; j0 < segs[t].len; j0 += kSumRun) {
          const int64_t len = std::min(kSumRun, segs[t].len - j0);
          const Into into = first && j0 == 0 ? Into::kStore : Into::kAdd;
          pv_product(m, Dv, ps + j0, w, vseg + j0 * vs2, vs2, len, ot, Dv, into);
        }
      }
      first = false;
    }
    for (int64_t i = 0; i < m; ++i) scaled_store(ot + i * Dv, ob + i * Dv, Dv, inv[i], stream);
  };

  std::vector<float> scores(static_cast<size_t>(block * std::max<int64_t>(wmax, 1)));
  std::vector<float> inv(static_cast<size_t>(block));
  std::vector<float> ot(static_cast<size_t>(block * Dv));  // (block, Dv)
  for (int64_t task = task_lo; task < task_hi; ++task)
    run_block(task, scores.data(), inv.data(), ot.data());
  if (stream) _mm_sfence();
}

namespace {

// Over a row's visible columns: p <- exp(s - mx) * inv, the forward's P from its row max
// and 1 / sum (the same exponentials as the forward's); returns sum_j p_j dp_j, the row's
// delta as the eager backward takes it (from P and dP, so that dS sums to 0 over the row
// up to rounding).
inline float probs_dot(float* p, const float* dp, int64_t n, float mx, float inv) {
  int64_t j = 0;
  float sum = 0.f;
  if (n >= Vec::size()) {
    const Vec vm(mx), vi(inv);
    Vec acc(0.f);
    for (; j + Vec::size() <= n; j += Vec::size()) {
      const Vec e = exp_le0(Vec::loadu(p + j) - vm) * vi;
      e.store(p + j);
      acc = at::vec::fmadd(e, Vec::loadu(dp + j), acc);
    }
    float lanes[Vec::size()];
    acc.store(lanes);
    for (int l = 0; l < Vec::size(); ++l) sum += lanes[l];
  }
  for (; j < n; ++j) {
    p[j] = std::exp(p[j] - mx) * inv;
    sum += p[j] * dp[j];
  }
  return sum;
}

// dp <- alpha * p * (dp - delta): the scores' gradient, the softmax scale included.
inline void score_grad(const float* p, float* dp, int64_t n, float delta, float alpha) {
  int64_t j = 0;
  const Vec vd(delta), va(alpha);
  for (; j + Vec::size() <= n; j += Vec::size())
    (Vec::loadu(p + j) * (Vec::loadu(dp + j) - vd) * va).store(dp + j);
  for (; j < n; ++j) dp[j] = alpha * p[j] * (dp[j] - delta);
}

}  // namespace

// dq, dk, dv of segment_attention_forward from its row statistics (stats: each row's max
// and 1 / sum), as FlashAttention's backward: per query block the scores are recomputed
// (S = scale Q K^T, P = exp(S - max) / sum), dP = dO V^T, dS = scale P (dP - delta) with
// delta = rowsum(P * dP), then dQ = dS K, dK += dS^T Q, dV += P^T dO, five products in the
// register tiles (D and Dv multiples of 16). A task is one (batch, kv head): every block of its G query heads,
// in order, so dk and dv of that head have one writer and their sums a fixed order (each
// block adds its own sum over its rows). dq, dk and dv are contiguous and fully written.
void segment_attention_backward(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& dout,
                                const torch::Tensor& stats,
                                const torch::Tensor& dq, const torch::Tensor& dk,
                                const torch::Tensor& dv, const torch::Tensor& seg_ptr,
                                const torch::Tensor& seg_start, const torch::Tensor& seg_len,
                                int64_t block, int64_t lo_off, int64_t hi_off, double scale,
                                int64_t task_lo, int64_t task_hi) {
  const char* fn = "segment_attention_backward";
  check_inputs(fn, {&q, &k, &v, &dout, &dq, &dk, &dv});
  const int64_t B = q.size(0), Hq = q.size(1), Nq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Nk = k.size(2), Dv = v.size(3);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == Nk &&
                  k.size(3) == D && Hkv > 0 && Hq % Hkv == 0,
              fn, ": q, k, v shapes do not match");
  TORCH_CHECK(D % kPanel == 0 && Dv % kPanel == 0, fn,
              ": head dims must be multiples of 16");
  for (const auto* t : {&dout, &dq, &dk, &dv, &stats})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == at::kFloat, fn,
                ": dout, stats, dq, dk, dv must be contiguous float32");
  TORCH_CHECK(dout.size(0) == B && dout.size(1) == Hq && dout.size(2) == Nq &&
                  dout.size(3) == Dv && dq.sizes() == q.sizes() && dk.sizes() == k.sizes() &&
                  dv.sizes() == v.sizes() && stats.numel() == B * Hq * Nq * 2,
              fn, ": dout, stats and the gradients do not match q, k, v");
  const int64_t G = Hq / Hkv;
  const Geometry geo = read_geometry(fn, seg_ptr, seg_start, seg_len, block, Nq, Nk, true);
  const int64_t nb = geo.nb;
  TORCH_CHECK(0 <= task_lo && task_lo <= task_hi && task_hi <= B * Hkv, fn,
              ": task range outside [0, B * Hkv]");

  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float* dop = dout.data_ptr<float>();
  const float* stp = stats.data_ptr<float>();
  float* dqp = dq.data_ptr<float>();
  float* dkp = dk.data_ptr<float>();
  float* dvp = dv.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), qs2 = q.stride(2);
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);
  const float alpha = static_cast<float>(scale);

  const int64_t span = std::max<int64_t>(geo.hi - geo.lo, 0);
  std::vector<float> kpanels(static_cast<size_t>(span * D));  // (span / 16) panels (D, 16)
  std::vector<float> vpanels(static_cast<size_t>(span * Dv));  // (span / 16) panels (Dv, 16)
  const size_t scores = static_cast<size_t>(block * std::max<int64_t>(geo.wmax, 1));
  std::vector<float> p(scores), ds(scores);  // (m, w) each: S then P; dP then dS
  int64_t seg_max = 0;
  for (const Segment& sg : geo.segs) seg_max = std::max(seg_max, sg.len);
  // one block's dK and dV over one segment's keys, added to the head's sums once
  std::vector<float> dkb(static_cast<size_t>(seg_max * D)), dvb(static_cast<size_t>(seg_max * Dv));

  for (int64_t task = task_lo; task < task_hi; ++task) {
    const int64_t n = task / Hkv, hk = task % Hkv;
    const float* kh = kp + n * ks0 + hk * ks1;  // (Nk, D)
    const float* vh = vp + n * vs0 + hk * vs1;  // (Nk, Dv)
    float* dkh = dkp + (n * Hkv + hk) * Nk * D;  // (Nk, D)
    float* dvh = dvp + (n * Hkv + hk) * Nk * Dv;  // (Nk, Dv)
    std::fill(dkh, dkh + Nk * D, 0.f);
    std::fill(dvh, dvh + Nk * Dv, 0.f);
    if (span > 0) {
      pack_keys(kh, ks2, D, Nk, geo.lo, geo.hi, kpanels.data());
      pack_keys(vh, vs2, Dv, Nk, geo.lo, geo.hi, vpanels.data());
    }
    for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
      const int64_t row0 = (n * Hq + h) * Nq;  // this query head's first row in dout, dq
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t i0 = b * block, m = std::min(block, Nq - i0);
        const float* qb = qp + n * qs0 + h * qs1 + i0 * qs2;  // (m, D), stride qs2
        const float* dob = dop + (row0 + i0) * Dv;  // (m, Dv)
        const float* rs = stp + (row0 + i0) * 2;  // (m, 2) max, 1 / sum
        float* dqb = dqp + (row0 + i0) * D;  // (m, D)
        const int64_t t0 = geo.ptr[b], t1 = geo.ptr[b + 1], w = geo.width(b);
        if (w == 0) {
          std::fill(dqb, dqb + m * D, 0.f);
          continue;
        }
        float* s = p.data();
        float* g = ds.data();
        for (int64_t t = t0, c = 0, a, wd; t < t1; ++t, c += wd) {  // S, dP (m, w)
          geo.region(geo.segs[t], a, wd);
          qk_product(m, wd, qb, qs2, kpanels.data() + (a - geo.lo) * D, D, alpha, s + c, w);
          qk_product(m, wd, dob, Dv, vpanels.data() + (a - geo.lo) * Dv, Dv, 1.f, g + c, w);
        }
        for (int64_t i = 0; i < m; ++i) {  // P and dS on the visible columns, 0 elsewhere
          float* srow = s + i * w;
          float* grow = g + i * w;
          const int64_t lo = i0 + i + lo_off, hi = i0 + i + hi_off;
          const float mx = rs[2 * i], inv = rs[2 * i + 1];  // inv = 0: the row sees no key
          float delta = 0.f;
          for (int64_t t = t0, c = 0, a, wd; t < t1; ++t, c += wd) {
            geo.region(geo.segs[t], a, wd);
            const Segment& sg = geo.segs[t];
            const int64_t first = inv != 0.f ? std::min(std::max(lo, sg.start) - a, wd) : wd;
            const int64_t last = std::max(std::min(hi + 1, sg.start + sg.len) - a, first);
            std::fill(srow + c, srow + c + first, 0.f);
            std::fill(grow + c, grow + c + first, 0.f);
            std::fill(srow + c + last, srow + c + wd, 0.f);
            std::fill(grow + c + last, grow + c + wd, 0.f);
            if (last > first)
              delta += probs_dot(srow + c + first, grow + c + first, last - first, mx, inv);
          }
          for (int64_t t = t0, c = 0, a, wd; t < t1; ++t, c += wd) {
            geo.region(geo.segs[t], a, wd);
            score_grad(srow + c, grow + c, wd, delta, alpha);  // 0 where P is
          }
        }
        // dQ = dS K over each segment's own keys, in runs of kSumRun keys as the forward's
        // P V; dK += dS^T Q and dV += P^T dO over the same keys, in runs of kRowRun rows.
        bool first = true;
        for (int64_t t = t0, c = 0, a, wd; t < t1; ++t, c += wd) {
          geo.region(geo.segs[t], a, wd);
          const Segment& sg = geo.segs[t];
          const int64_t col = c + (sg.start - a);  // the segment's first column
          for (int64_t j0 = 0; j0 < sg.len; j0 += kSumRun) {
            const int64_t len = std::min(kSumRun, sg.len - j0);
            pv_product(m, D, g + col + j0, w, kh + (sg.start + j0) * ks2, ks2, len, dqb, D,
                       first && j0 == 0 ? Into::kStore : Into::kAdd);
          }
          first = false;
          for (int64_t r0 = 0; r0 < m; r0 += kRowRun) {
            const int64_t r = std::min(kRowRun, m - r0);
            const Into into = r0 == 0 ? Into::kStore : Into::kAdd;
            pvt_product(sg.len, D, g + col + r0 * w, w, qb + r0 * qs2, qs2, r, dkb.data(), D,
                        into);
            pvt_product(sg.len, Dv, s + col + r0 * w, w, dob + r0 * Dv, Dv, r, dvb.data(), Dv,
                        into);
          }
          add_into(dkh + sg.start * D, dkb.data(), sg.len * D);
          add_into(dvh + sg.start * Dv, dvb.data(), sg.len * Dv);
        }
        if (first) std::fill(dqb, dqb + m * D, 0.f);  // only empty segments
      }
    }
  }
}

// The whole call over the CPU threads in one parallel region (cpu_pieces.h): the forward's
// (batch, head, query block) tasks, the backward's (batch, kv head) tasks, in pieces.
void segment_attention_forward_parallel(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
    const torch::Tensor& out, const torch::Tensor& stats, const torch::Tensor& seg_ptr,
    const torch::Tensor& seg_start, const torch::Tensor& seg_len, int64_t block,
    int64_t lo_off, int64_t hi_off, double scale, int64_t pieces_per_thread) {
  const char* fn = "segment_attention_forward";
  check_inputs(fn, {&q, &k, &v, &out});
  TORCH_CHECK(seg_ptr.dim() == 1 && seg_ptr.numel() >= 1, fn,
              ": seg_ptr must be a 1-d tensor of n_blocks + 1 offsets");
  const int64_t tasks = q.size(0) * q.size(1) * (seg_ptr.numel() - 1);
  run_in_pieces(tasks, pieces_per_thread, [&](int64_t lo, int64_t hi) {
    segment_attention_forward(q, k, v, out, stats, seg_ptr, seg_start, seg_len, block, lo_off,
                              hi_off, scale, lo, hi);
  });
}

void segment_attention_backward_parallel(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
    const torch::Tensor& dout, const torch::Tensor& stats, const torch::Tensor& dq,
    const torch::Tensor& dk, const torch::Tensor& dv, const torch::Tensor& seg_ptr,
    const torch::Tensor& seg_start, const torch::Tensor& seg_len, int64_t block,
    int64_t lo_off, int64_t hi_off, double scale, int64_t pieces_per_thread) {
  check_inputs("segment_attention_backward", {&q, &k, &v, &dout, &dq, &dk, &dv});
  run_in_pieces(k.size(0) * k.size(1), pieces_per_thread, [&](int64_t lo, int64_t hi) {
    segment_attention_backward(q, k, v, dout, stats, dq, dk, dv, seg_ptr, seg_start, seg_len,
                               block, lo_off, hi_off, scale, lo, hi);
  });
}

// For the tests of run_in_pieces: the (lo, hi) pieces it ran over [0, n_items), in the
// order they started; a piece holding item `fail_at` throws (and the call with it).
std::vector<std::pair<int64_t, int64_t>> pieces_run(int64_t n_items, int64_t pieces_per_thread,
                                                    int64_t fail_at) {
  std::vector<std::pair<int64_t, int64_t>> ran;
  std::mutex lock;
  run_in_pieces(n_items, pieces_per_thread, [&](int64_t lo, int64_t hi) {
    {
      std::lock_guard<std::mutex> guard(lock);
      ran.emplace_back(lo, hi);
    }
    TORCH_CHECK(!(lo <= fail_at && fail_at < hi), "pieces_run: piece [", lo, ", ", hi,
                ") holds item ", fail_at);
  });
  return ran;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("stream_bytes") = kStreamBytes;  // outputs above it are streamed
  m.def("segment_attention_forward", &segment_attention_forward,
        "softmax attention over contiguous key segments, fp32 CPU forward, tasks "
        "[task_lo, task_hi) of (batch, head, query block) into out (and each row's max "
        "and 1 / sum into stats, unless empty)",
        py::call_guard<py::gil_scoped_release>());
  m.def("segment_attention_backward", &segment_attention_backward,
        "dq, dk, dv of segment_attention_forward from its row stats, tasks [task_lo, "
        "task_hi) of (batch, kv head)",
        py::call_guard<py::gil_scoped_release>());
  m.def("segment_attention_forward_parallel", &segment_attention_forward_parallel,
        "segment_attention_forward over all its tasks, in pieces over the CPU threads",
        py::call_guard<py::gil_scoped_release>());
  m.def("segment_attention_backward_parallel", &segment_attention_backward_parallel,
        "segment_attention_backward over all its tasks, in pieces over the CPU threads",
        py::call_guard<py::gil_scoped_release>());
  m.def("pieces_run", &pieces_run, "run_in_pieces' pieces over [0, n_items) (tests)",
        py::call_guard<py::gil_scoped_release>());
}
