// One parallel region per kernel call: [0, n_items) cut into contiguous pieces that the CPU
// threads claim in turn from an atomic counter, inside ATen's OpenMP region (the runtime,
// thread count and wait policy sdpa's CPU kernels run under).
#pragma once

#include <ATen/Parallel.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace attnbench {

// A child forked after the parent ran a parallel region inherits GNU OpenMP's pool without
// its threads, and its next region waits for them forever (torch's own ops too). The
// kernels run single-threaded in such a child instead: a fork after this library loaded
// sets the flag there.
inline std::atomic<bool>& in_forked_child() {
  static std::atomic<bool> forked{false};
  return forked;
}
// (static: an inline variable nothing reads would not be emitted, nor its handler registered)
static const bool kForkWatched =
    pthread_atfork(nullptr, nullptr, [] { in_forked_child().store(true); }) == 0;

// f(lo, hi) over [0, n_items) in at most threads * pieces_per_thread contiguous pieces
// whose sizes differ by at most one; each thread claims the next piece until none is left,
// so a thread slowed down (a shared machine's vCPU taken away) does fewer. One thread, one
// item, a caller already inside a parallel region, or a forked child: one call
// f(0, n_items). After an exception no new piece starts, and the first one is rethrown
// once the region has ended. No items: one call f(0, 0), so the kernel still checks its
// arguments.
template <typename F>
void run_in_pieces(int64_t n_items, int64_t pieces_per_thread, const F& f) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n_items);
  if (threads < 2 || at::in_parallel_region() || in_forked_child().load()) {
    f(0, std::max<int64_t>(n_items, 0));
    return;
  }
  const int64_t parts = std::min(n_items, threads * std::max<int64_t>(pieces_per_thread, 1));
  const int64_t base = n_items / parts, extra = n_items % parts;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t p; !failed.load(std::memory_order_relaxed) &&
                    (p = next.fetch_add(1, std::memory_order_relaxed)) < parts;) {
      const int64_t lo = p * base + std::min(p, extra);
      try {
        f(lo, lo + base + (p < extra ? 1 : 0));
      } catch (...) {
        failed.store(true, std::memory_order_relaxed);
        throw;  // at::parallel_for keeps the first and rethrows it after the region
      }
    }
  });
}

}  // namespace attnbench
