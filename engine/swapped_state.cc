#include "engine/swapped_state.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <cstring>
#include <string>

#include "runtime/host_copies.h"
#include "runtime/shape_device.h"
#include "runtime/swap_copies.h"

namespace zest {

namespace {

SwapOptions swap_options(const EngineOptions& options) {
  SwapOptions swap = options.aio;
  swap.path = options.offload_optimizer.nvme_path;
  return swap;
}

}  // namespace

SwappedState::SwappedState(RankContext& context, const EngineOptions& options, Stream& host_stream)
    : context_(context),
      options_(options),
      host_(host_stream),
      store_(swap_options(options), context.rank_in_world(), runs_work(context.device)) {
  const std::string rank = "rank " + std::to_string(context.rank);
  reads_ = context.device.create_host_stream(rank + " nvme read");
  writes_ = context.device.create_host_stream(rank + " nvme write");
}

SwappedState::~SwappedState() {
  try {
    synchronize();
  } catch (...) {
    // Whoever synchronizes next reports the failure; a destructor must not throw.
  }
}

void SwappedState::synchronize() {
  reads_->synchronize();
  writes_->synchronize();
}

void SwappedState::allocate(const std::vector<FlatUnit>& units, std::size_t optimizer_states) {
  tensors_ = 1 + optimizer_states;
  const std::size_t cut = std::max<std::size_t>(1, options_.offload_optimizer.sub_group_size);
  std::size_t largest = 0;
  groups_.assign(units.size(), {});
  for (const FlatUnit& unit : units) {
    const std::size_t shard = unit.layout.shard_length();
    for (std::size_t begin = 0; begin < shard; begin += cut) {
      SubGroup group;
      group.begin = begin;
      group.end = std::min(shard, begin + cut);
      group.stride = round_up((group.end - group.begin) * sizeof(float), kSwapAlignment);
      group.region = store_.reserve(group.stride * tensors_);
      largest = std::max(largest, group.region.bytes);
      groups_.at(static_cast<std::size_t>(unit.index)).push_back(group);
    }
  }
  Allocator& host = context_.device.host_allocator();
  const std::size_t count = std::max<std::size_t>(1, options_.offload_optimizer.buffer_count);
  for (std::size_t s = 0; s < count && largest > 0; ++s) {
    StagingBuffer staging;
    AlignedHostBuffer aligned = allocate_aligned(host, largest, Category::kOffload);
    staging.buffer = std::move(aligned.buffer);
    staging.data = aligned.data;
    staging.read = context_.device.create_host_event();
    staging.updated = context_.device.create_host_event();
    staging.written = context_.device.create_host_event();
    staging_.push_back(std::move(staging));
  }
  store_.open();
}

std::size_t SwappedState::host_bytes() const {
  std::size_t bytes = 0;
  for (const StagingBuffer& staging : staging_) bytes += staging.buffer.bytes();
  return bytes;
}

SwapTrace SwappedState::trace(const std::string& what, std::size_t unit, std::size_t group) const {
  if (context_.trace == nullptr) return {};
  return {context_.trace, context_.rank_in_world(),
          what + " unit " + std::to_string(unit) + " sub-group " + std::to_string(group)};
}

void SwappedState::write_tensor(const SubGroup& group, std::size_t tensor, const void* host) {
  store_.write(group.region, tensor * group.stride, host, group.stride);
}

void SwappedState::initialize(const FlatUnit& unit, const float* master) {
  if (!store_.backed() || staging_.empty()) return;
  synchronize();
  char* buffer = staging_.front().data;
  for (const SubGroup& group : groups_.at(static_cast<std::size_t>(unit.index))) {
    const std::size_t bytes = (group.end - group.begin) * sizeof(float);
    std::memset(buffer, 0, group.stride * tensors_);
    std::memcpy(buffer, master + group.begin, bytes);
    if (options_.offload_optimizer.fast_init) {
      write_tensor(group, 0, buffer);  // the states' blocks read as zeros already
    } else {
      store_.write(group.region, 0, buffer, group.region.bytes);
    }
  }
}

void SwappedState::update(const FlatUnit& unit, const SubGroupWork& work, double stall_seconds) {
  const auto index = static_cast<std::size_t>(unit.index);
  if (stall_seconds > 0.0) {
    writes_->enqueue([stall_seconds, rank = context_.rank_in_world(), index] {
      std::fprintf(stderr, "zest: debug.fault stall_nvme_write: rank %d stalls the optimizer's "
                   "NVMe writes before unit %zu for %g s\n", rank, index, stall_seconds);
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::duration<double>(stall_seconds));
    });
  }
  const std::vector<SubGroup>& groups = groups_.at(index);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const SubGroup& group = groups[g];
    StagingBuffer& staging = staging_.at(next_staging_);
    next_staging_ = (next_staging_ + 1) % staging_.size();
    reads_->wait(*staging.written);  // the staging buffer's previous sub-group is back on disk
    enqueue_swap_read(*reads_, store_, group.region, 0, staging.data, group.region.bytes,
                      trace("read", index, g));
    reads_->record(*staging.read);
    host_.wait(*staging.read);
    std::vector<float*> states;
    for (std::size_t t = 1; t < tensors_; ++t) {
      states.push_back(reinterpret_cast<float*>(staging.data + t * group.stride));
    }
    work(group.begin, group.end, reinterpret_cast<float*>(staging.data), states);
    host_.record(*staging.updated);
    writes_->wait(*staging.updated);
    enqueue_swap_write(*writes_, store_, group.region, 0, staging.data, group.region.bytes,
                       trace("write", index, g));
    writes_->record(*staging.written);
  }
}

std::function<void(bool, std::size_t, std::size_t, void*)> SwappedState::access(
    std::size_t unit, std::size_t tensor) {
  return [this, unit, tensor](bool write, std::size_t first, std::size_t count, void* host) {
    for (const SubGroup& group : groups_.at(unit)) {
      const std::size_t begin = std::max(first, group.begin);
      const std::size_t end = std::min(first + count, group.end);
      if (begin >= end) continue;
      const std::size_t offset = tensor * group.stride + (begin - group.begin) * sizeof(float);
      char* chunk = static_cast<char*>(host) + (begin - first) * sizeof(float);
      const std::size_t bytes = (end - begin) * sizeof(float);
      if (write) {
        store_.write(group.region, offset, chunk, bytes);
      } else {
        store_.read(group.region, offset, chunk, bytes);
      }
    }
  };
}

void SwappedState::master_from_parameters(const FlatUnit& unit, const float* params) {
  if (!store_.backed() || staging_.empty()) return;
  synchronize();
  char* buffer = staging_.front().data;
  for (const SubGroup& group : groups_.at(static_cast<std::size_t>(unit.index))) {
    const std::size_t bytes = (group.end - group.begin) * sizeof(float);
    std::memset(buffer, 0, group.stride);
    read_to_host(context_.device, context_.comm, buffer, params + group.begin, bytes);
    write_tensor(group, 0, buffer);
  }
}

}  // namespace zest
