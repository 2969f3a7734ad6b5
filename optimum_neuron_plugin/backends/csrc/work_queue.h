// Work items of unequal cost shared by the threads: handed out costliest first, each to the next free thread.
// at::parallel_for's contiguous ranges split items by count, so where costs grow along the range (a prompt's
// successive chunks in one call, a decode batch of short and long rows) one thread gets the cheap half and waits.

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <vector>

namespace onp_work {

// Runs run(scratch, item) for every item, scratch = make_scratch() once per thread.
template <typename MakeScratch, typename Run>
void costliest_first(const std::vector<int64_t>& costs, MakeScratch make_scratch, Run run) {
  const int64_t items = static_cast<int64_t>(costs.size());
  std::vector<int64_t> order(items);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), items);
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {  // one call per worker, or one for all when serial
    auto scratch = make_scratch();
    for (int64_t k = next.fetch_add(1); k < items; k = next.fetch_add(1)) run(scratch, order[k]);
  });
}

}  // namespace onp_work
