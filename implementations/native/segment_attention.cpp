// Fused CPU forward of softmax attention over contiguous key segments (fp32).
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
// multiple of 16 (K packed once per head into 16-key panels), else in MKL's sgemm. On the
// AMD AVX2 host, at N = 8192, window (255,0), 2 threads, the tiles took the forward from
// 104 to 53 ms (32-row blocks) and block_sparse bigbird from 147 to 89 ms, medians of 9
// interleaved rounds: MKL repacks both operands of every 32 x 287 x 64 call. The
// exponential is ATen's exp_u20, the one its CPU flash-attention kernel uses; against
// Sleef's exp it took the sgemm version from 64.7 to 61.4 ms and moved no output by more
// than 2.4e-7.
//
// The caller runs a range of (batch, head, block) tasks per call, with the GIL released:
// attnbench's ``split_work`` hands ranges to the CPU threads (torch single-threaded on each,
// so sgemm runs on its caller's thread, as in sdpa's CPU flash kernel). A call keeps one
// score buffer in cache from task to task.
#include <torch/extension.h>

#include "simd_tiles.h"

#include <algorithm>
#include <cmath>
#include <limits>
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

struct Segment {
  int64_t start, len;
};

}  // namespace

void segment_attention_forward(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& out,
                               const torch::Tensor& seg_ptr, const torch::Tensor& seg_start,
                               const torch::Tensor& seg_len, int64_t block, int64_t lo_off,
                               int64_t hi_off, double scale, int64_t task_lo,
                               int64_t task_hi) {
  for (const auto* t : {&q, &k, &v, &out}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->dim() == 4,
                "segment_attention_forward: q, k, v, out must be 4-d float32 CPU tensors");
    TORCH_CHECK(t->stride(3) == 1, "segment_attention_forward: last dim must be contiguous");
  }
  const int64_t B = q.size(0), Hq = q.size(1), Nq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Nk = k.size(2), Dv = v.size(3);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == Nk &&
                  k.size(3) == D && Hkv > 0 && Hq % Hkv == 0,
              "segment_attention_forward: q, k, v shapes do not match");
  TORCH_CHECK(out.is_contiguous() && out.size(0) == B && out.size(1) == Hq &&
                  out.size(2) == Nq && out.size(3) == Dv,
              "segment_attention_forward: out must be a contiguous (B, Hq, Nq, Dv) tensor");
  const int64_t G = Hq / Hkv, nb = seg_ptr.numel() - 1;
  TORCH_CHECK(block > 0 && nb == (Nq + block - 1) / block,
              "segment_attention_forward: seg_ptr must hold ceil(Nq / block) + 1 entries");

  TORCH_CHECK(seg_ptr.scalar_type() == at::kLong && seg_start.scalar_type() == at::kLong &&
                  seg_len.scalar_type() == at::kLong && seg_ptr.is_contiguous() &&
                  seg_start.is_contiguous() && seg_len.is_contiguous() &&
                  seg_start.numel() == seg_len.numel(),
              "segment_attention_forward: segments must be contiguous int64 tensors");
  const int64_t* sp = seg_ptr.data_ptr<int64_t>();
  const int64_t* starts = seg_start.data_ptr<int64_t>();
  const int64_t* lens = seg_len.data_ptr<int64_t>();
  const int64_t n_segs = seg_start.numel();
  std::vector<Segment> segs(n_segs);
  for (int64_t s = 0; s < n_segs; ++s) {
    segs[s] = {starts[s], lens[s]};
    TORCH_CHECK(segs[s].start >= 0 && segs[s].len >= 0 && segs[s].start + segs[s].len <= Nk,
                "segment_attention_forward: a segment reaches outside the keys");
  }
  const bool fast = Dv % kPanel == 0;  // else MKL's sgemm for both products
  // The S columns of a segment: from key `a`, `wd` wide. The fast path computes whole
  // 16-key panels, a superset of the segment whose extra columns are masked like the
  // window's edges (a window span that starts off a panel boundary costs up to 15 more).
  auto region = [&](const Segment& sg, int64_t& a, int64_t& wd) {
    a = fast ? floor_to(sg.start, kPanel) : sg.start;
    wd = (fast ? ceil_to(sg.start + sg.len, kPanel) : sg.start + sg.len) - a;
  };
  int64_t wmax = 0;
  for (int64_t b = 0; b < nb; ++b) {
    TORCH_CHECK(sp[0] == 0 && sp[b] <= sp[b + 1] && sp[b + 1] <= n_segs,
                "segment_attention_forward: seg_ptr is not a valid offset array");
    int64_t w = 0, a, wd;
    for (int64_t t = sp[b]; t < sp[b + 1]; ++t) {
      region(segs[t], a, wd);
      w += wd;
    }
    wmax = std::max(wmax, w);
  }

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
    const int64_t t0 = sp[b], t1 = sp[b + 1];
    int64_t w = 0;
    for (int64_t t = t0, a, wd; t < t1; ++t) {
      region(segs[t], a, wd);
      w += wd;
    }
    if (w == 0) {
      std::fill(ob, ob + m * Dv, 0.f);
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
        // than one over the whole span (window (255,0): the error against float64 fell from
        // 3.22e-7 to 2.72e-7 at N = 1024, below the eager path's 2.86e-7)
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("stream_bytes") = kStreamBytes;  // outputs above it are streamed
  m.def("segment_attention_forward", &segment_attention_forward,
        "softmax attention over contiguous key segments, fp32 CPU forward, tasks "
        "[task_lo, task_hi) of (batch, head, query block) into out",
        py::call_guard<py::gil_scoped_release>());
}
