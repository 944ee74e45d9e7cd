#include "engine/host_optimizer.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "engine/swapped_parameters.h"
#include "engine/swapped_state.h"
#include "kernels/convert.h"
#include "runtime/shape_device.h"

namespace zest {

namespace {

char* byte_offset(void* base, std::size_t bytes) { return static_cast<char*>(base) + bytes; }

// The runs of the unit's shard that hold parameters (in shard coordinates): the update ranges,
// adjacent ones merged. Padding is never copied either way.
std::vector<std::pair<std::size_t, std::size_t>> parameter_runs(const FlatUnit& unit,
                                                                std::size_t shard_begin) {
  std::vector<std::pair<std::size_t, std::size_t>> runs;  // (offset, count)
  for (const FlatUnit::UpdateRange& range : unit.update_ranges) {
    const std::size_t offset = range.flat_offset - shard_begin;
    if (!runs.empty() && runs.back().first + runs.back().second == offset) {
      runs.back().second += range.count;
    } else {
      runs.emplace_back(offset, range.count);
    }
  }
  return runs;
}

}  // namespace

HostOptimizer::HostOptimizer(RankContext& context, const EngineOptions& options,
                             const StagePlan& plan, std::size_t unit_count,
                             SwappedParameters* parameters)
    : context_(context), options_(options), plan_(plan), shards_(unit_count),
      parameters_(parameters) {
  for (std::size_t i = 0; i < unit_count; ++i) {
    gradients_on_host_.push_back(context.device.create_event());  // recorded by comm
    updated_.push_back(context.device.create_host_event());       // by the host stream
  }
  stream_ = context.device.create_host_stream("rank " + std::to_string(context.rank) + " host");
  if (options.offload_optimizer.on_nvme()) {
    swapped_ = std::make_unique<SwappedState>(context, options, *stream_);
  }
}

HostOptimizer::~HostOptimizer() {
  try {
    stream_->synchronize();
  } catch (...) {
    // Whoever synchronizes next reports the failure; a destructor must not throw.
  }
}

void HostOptimizer::synchronize() {
  stream_->synchronize();
  if (swapped_) swapped_->synchronize();
}

std::size_t HostOptimizer::params_shard_offset(const FlatUnit& unit) const {
  const std::size_t shard_begin = unit.layout.shard_range(context_.rank).begin;
  return shard_begin - plan_.params_first(shard_begin);
}

void HostOptimizer::allocate(const std::vector<FlatUnit>& units, std::size_t optimizer_states) {
  Allocator& host = context_.device.host_allocator();
  for (const FlatUnit& unit : units) {
    HostShards& mine = shards_.at(static_cast<std::size_t>(unit.index));
    const std::size_t shard = unit.layout.shard_length();
    mine.transfer = host.allocate(shard * element_size(), Category::kOffload);
    if (parameters_ != nullptr && runs_work(context_.device)) {
      // Written to NVMe whole, padding included, so the padding must be zeros (the gradient
      // copies never touch it). Now, on the host: no stream has touched it yet.
      std::memset(mine.transfer.data(), 0, mine.transfer.bytes());
    }
    if (swapped_) continue;  // master and states are on NVMe (SwappedState::allocate)
    // Note: in fp32 compute the device's parameters are their own master weights; offloaded, the
    // host needs its own fp32 copy to update, so the master exists at every compute dtype.
    mine.master = host.allocate(shard * sizeof(float), Category::kOffload);
    for (std::size_t s = 0; s < optimizer_states; ++s) {
      mine.optimizer_state.push_back(host.allocate(shard * sizeof(float), Category::kOffload));
      // Host memory, zeroed by the host stream that will update it (on CUDA the device's fill
      // is a GPU memset, which does not reach host memory).
      stream_->enqueue([data = mine.optimizer_state.back().data(),
                        bytes = mine.optimizer_state.back().bytes()] {
        std::memset(data, 0, bytes);
      });
    }
  }
  if (swapped_) swapped_->allocate(units, optimizer_states);
  if (options_.compute_dtype != DType::kFloat32) {
    // Note: allocated once, not per step: on CUDA the host arena is page-locked memory, whose
    // allocation (cudaHostAlloc) is slow and whose free may synchronize the device.
    std::size_t largest = 0;
    for (const FlatUnit& unit : units) largest = std::max(largest, unit.layout.shard_length());
    widened_ = host.allocate(largest * sizeof(float), Category::kOffload);
  }
}

void HostOptimizer::copy_gradients_to_host(const FlatUnit& unit) {
  Stream& comm = context_.comm;
  const std::size_t shard_begin = unit.layout.shard_range(context_.rank).begin;
  HostShards& mine = shards_.at(static_cast<std::size_t>(unit.index));
  // Full gradients (stage 1) hold the rank's shard at its place; sharded ones (2-3) only it.
  void* grads = byte_offset(unit.grads.data(),
                            (shard_begin - plan_.grads_first(shard_begin)) * element_size());
  for (const auto& [offset, count] : parameter_runs(unit, shard_begin)) {
    context_.device.copy(comm, byte_offset(mine.transfer.data(), offset * element_size()),
                         byte_offset(grads, offset * element_size()), count * element_size());
  }
  // Note: step() synchronizes comm before anything reads or zeroes the device's gradients
  // again, so this copy needs no event for the compute stream; the host stream waits for it.
  comm.record(*gradients_on_host_[static_cast<std::size_t>(unit.index)]);
}

void HostOptimizer::update(FlatUnit& unit, Optimizer& optimizer, const UpdateArgs& shared_args) {
  Stream& host = *stream_;
  Stream& comm = context_.comm;
  const DType held = options_.compute_dtype;
  const bool two_byte = held != DType::kFloat32;
  const auto index = static_cast<std::size_t>(unit.index);
  HostShards& mine = shards_.at(index);
  const std::size_t shard_begin = unit.layout.shard_range(context_.rank).begin;
  host.wait(*gradients_on_host_[index]);
  // The same operations as ZeroTrainer::update_unit's, on host buffers: the 2-byte gradients
  // widened to fp32, the optimizer on the fp32 master, the rounded parameters written in its
  // pass. The rounded copy goes into the transfer shard, whose gradients were read first.
  // Elements [begin, end) of the shard, master and states pointing at element `begin`.
  auto update_piece = [&](std::size_t begin, std::size_t end, float* master_base,
                          const std::vector<float*>& state_base) {
    for (const FlatUnit::UpdateRange& range : unit.update_ranges) {
      const std::size_t first = std::max(range.flat_offset - shard_begin, begin);
      const std::size_t last = std::min(range.flat_offset - shard_begin + range.count, end);
      if (first >= last) continue;
      UpdateArgs args = shared_args;
      args.decay = range.decay;
      std::vector<float*> state;
      for (float* base : state_base) state.push_back(base + (first - begin));
      float* master = master_base + (first - begin);
      void* transfer = byte_offset(mine.transfer.data(), first * element_size());
      if (!two_byte) {
        optimizer.update(host, master, static_cast<const float*>(transfer), state, last - first,
                         args);
        // On NVMe the master goes back to disk: the device's copy comes from the transfer.
        if (swapped_) host.enqueue([=] { std::memcpy(transfer, master, (last - first) * sizeof(float)); });
        continue;
      }
      float* wide_grads = widened_.as<float>() + first;
      convert(host, transfer, held, wide_grads, DType::kFloat32, last - first);
      optimizer.update_and_round(host, master, wide_grads, state, last - first, args, transfer,
                                 held);
    }
  };
  if (swapped_) {
    // debug.fault "stall_nvme_write": before the middle unit's writes of the step.
    const FaultInjection& fault = options_.fault;
    const bool stall = fault.kind == FaultInjection::Kind::kStallNvmeWrite &&
                       fault.hits(context_.rank_in_world(), shared_args.step) &&
                       index == shards_.size() / 2;
    swapped_->update(unit, update_piece, stall ? fault.stall_seconds : 0.0);
  } else {
    std::vector<float*> states;
    for (Buffer& buffer : mine.optimizer_state) states.push_back(buffer.as<float>());
    update_piece(0, unit.layout.shard_length(), mine.master.as<float>(), states);
  }
  host.record(*updated_[index]);

  // Back to the device on the comm stream: the rounded shard (2-byte) or the master itself.
  void* updated = two_byte || swapped_ ? mine.transfer.data() : mine.master.data();
  if (parameters_ != nullptr && parameters_->holds(unit)) {
    // offload_param "nvme": written from the host; no read of the old shard (the update starts
    // from the master), and comm waits for the write before the next gradients fill `transfer`.
    parameters_->store_from_host(unit, updated, *updated_[index], comm);
    return;
  }
  comm.wait(*updated_[index]);
  void* params = byte_offset(unit.params.data(), params_shard_offset(unit) * element_size());
  for (const auto& [offset, count] : parameter_runs(unit, shard_begin)) {
    context_.device.copy(comm, byte_offset(params, offset * element_size()),
                         byte_offset(updated, offset * element_size()), count * element_size());
  }
}

void HostOptimizer::state_loaded(const std::vector<FlatUnit>& units) {
  if (options_.compute_dtype != DType::kFloat32) return;  // the master was loaded itself
  // fp32: checkpoints hold no master (it equals the parameters), so the host's copy is refreshed
  // from the loaded parameter shard.
  for (const FlatUnit& unit : units) {
    const std::size_t shard_begin = unit.layout.shard_range(context_.rank).begin;
    if (parameters_ != nullptr && parameters_->holds(unit)) {
      master_from_swapped_parameters(unit);
      continue;
    }
    const float* params = unit.params.as<float>() + params_shard_offset(unit);
    if (swapped_) {
      swapped_->master_from_parameters(unit, params);
      continue;
    }
    HostShards& mine = shards_.at(static_cast<std::size_t>(unit.index));
    for (const auto& [offset, count] : parameter_runs(unit, shard_begin)) {
      context_.device.copy(context_.comm, mine.master.as<float>() + offset, params + offset,
                           count * sizeof(float));
    }
  }
}

void HostOptimizer::master_from_swapped_parameters(const FlatUnit& unit) {
  context_.synchronize();
  synchronize();
  parameters_->synchronize();
  const std::size_t shard = unit.layout.shard_length();
  // Note: a piece at a time, never the whole shard in host memory beside the state's own.
  constexpr std::size_t kPiece = std::size_t{4} << 20;  // elements
  std::vector<float> piece(std::min(shard, kPiece));
  HostShards& mine = shards_.at(static_cast<std::size_t>(unit.index));
  const auto master = swapped_ ? swapped_->access(static_cast<std::size_t>(unit.index), 0)
                               : std::function<void(bool, std::size_t, std::size_t, void*)>{};
  for (std::size_t first = 0; first < shard; first += piece.size()) {
    const std::size_t count = std::min(piece.size(), shard - first);
    parameters_->read(unit, first, count, piece.data());
    if (master) {
      master(true, first, count, piece.data());
    } else {
      std::memcpy(mine.master.as<float>() + first, piece.data(), count * sizeof(float));
    }
  }
}

}  // namespace zest
