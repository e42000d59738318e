// ParallelFor: runs fn(i) for every i in [0, n) on a few threads, for plan-time work that is
// mostly system calls and small parses (indexing thousands of parameter folders).
//
// Indices are claimed in increasing order. fn returns a Status; after the first error no further
// index is claimed, and the error returned is the one of the lowest failing index, so the result
// is the same as a sequential loop that stops at its first error. fn must be safe to call
// concurrently for different indices. Blocks until every claimed call has returned.
// Public header: C++17.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include "reshard/base/status.h"

namespace reshard {

// Threads used for plan-time work: the hardware threads, at least 2 (the work waits on the
// kernel as much as it computes), at most 16.
inline size_t PlanThreads() {
  return std::clamp<size_t>(std::thread::hardware_concurrency(), 2, 16);
}

template <typename Fn>
Status ParallelFor(size_t n, Fn&& fn, size_t threads = PlanThreads()) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<Status> errors(n == 0 ? 0 : std::min(threads, n));
  std::vector<size_t> error_index(errors.size(), n);
  auto work = [&](size_t worker) {
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      Status status = fn(i);
      if (!status.ok()) {
        errors[worker] = std::move(status);
        error_index[worker] = i;
        failed.store(true, std::memory_order_relaxed);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < errors.size(); ++w) pool.emplace_back(work, w);
  if (!errors.empty()) work(0);
  for (std::thread& t : pool) t.join();
  size_t first = 0;
  for (size_t w = 1; w < errors.size(); ++w) {
    if (error_index[w] < error_index[first]) first = w;
  }
  return errors.empty() || error_index[first] == n ? Status::Ok() : errors[first];
}

}  // namespace reshard
