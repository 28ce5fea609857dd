// The team of threads a whole-step op keeps up for the whole step (decode_step.cpp, dense_decode_step.cpp): a fork
// and join of torch's OpenMP pool measured ~3.5 us on this 2-core machine, hundreds of them a step when each op
// opens its own. The team meets at a spin barrier after each product instead (llama.cpp's threads do the same).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace modelplex_team {

class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void reset(int n) { n_ = n; }
  void wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int spins = 0; gen_.load(std::memory_order_acquire) == gen; ++spins) {
#if defined(__x86_64__)
      if (spins < (1 << 12)) {
        _mm_pause();
        continue;
      }
#endif
      std::this_thread::yield();  // the other thread lost its core (a shared machine): let it have ours
    }
  }

 private:
  int n_;
  std::atomic<int> count_{0}, gen_{0};
};

// The first exception a team's threads throw; the others skip their work (still meeting at the barriers) once
// one has failed, and the caller rethrows it after the region.
class FirstError {
 public:
  template <typename Body>
  void guard(Body&& body) {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      body();
    } catch (...) {
      if (!failed_.exchange(true)) error_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
};

// The team's size: torch's intra-op threads (at most 64).
inline int team_size() {
#if defined(_OPENMP)
  return std::max(1, std::min(at::get_num_threads(), 64));
#else
  return 1;
#endif
}

// run(part) on each of `parts` threads of one OpenMP region; where the runtime gives a smaller team than asked
// (nothing ran), parts and the barrier become 1 and the caller's thread runs it all.
template <typename Run>
void run_team(int& parts, SpinBarrier& barrier, Run&& run) {
  bool ran = false;
#if defined(_OPENMP)
  if (parts > 1) {
#pragma omp parallel num_threads(parts)
    if (omp_get_num_threads() == parts) {
      run(omp_get_thread_num());
#pragma omp master
      ran = true;
    }
  }
#endif
  if (!ran) {
    parts = 1;
    barrier.reset(1);
    run(0);
  }
}

}  // namespace modelplex_team
