#include "planner/peak_ledger.h"

#include <algorithm>

namespace zest {

PeakLedger::Handle PeakLedger::allocate(std::size_t bytes, Category category) {
  if (bytes == 0) return kNone;
  const auto c = static_cast<std::size_t>(category);
  current_[c] += bytes;
  peak_[c] = std::max(peak_[c], current_[c]);
  total_current_ += bytes;
  total_peak_ = std::max(total_peak_, total_current_);
  allocations_.push_back({bytes, category});
  return allocations_.size() - 1;
}

void PeakLedger::release_on(Stream stream, Handle handle) {
  if (handle == kNone) return;
  if (frees_at_release_) return free(handle);
  queues_[index(stream)].push_back({handle, Stream::kCompute, 0});
}

std::size_t PeakLedger::record(Stream stream) const { return queues_[index(stream)].size(); }

void PeakLedger::wait(Stream waiter, Stream on, std::size_t position) {
  queues_[index(waiter)].push_back({kNone, on, position});
}

void PeakLedger::synchronize(Stream stream, std::size_t position) {
  std::vector<Operation>& queue = queues_[index(stream)];
  std::size_t& done = done_[index(stream)];
  while (done < std::min(position, queue.size())) {
    const Operation operation = queue[done++];
    if (operation.release != kNone) {
      free(operation.release);
    } else {
      synchronize(operation.on, operation.position);
    }
  }
}

void PeakLedger::synchronize(Stream stream) { synchronize(stream, record(stream)); }

void PeakLedger::free(Handle handle) {
  const Allocation& allocation = allocations_.at(handle);
  current_[static_cast<std::size_t>(allocation.category)] -= allocation.bytes;
  total_current_ -= allocation.bytes;
}

std::size_t PeakLedger::peak_of(Category category) const {
  return peak_[static_cast<std::size_t>(category)];
}

}  // namespace zest
