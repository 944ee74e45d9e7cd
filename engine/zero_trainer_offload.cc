// zero_optimization.offload_optimizer: the optimizer's fp32 state lives in host memory (the
// device's host arena, category offload) and the optimizer runs on the host. Per step and unit:
// the gradient shard goes to the host on the comm stream right after its last reduction, while
// backward goes on; the host stream updates the master shard from it (the same kernels, in the
// same order, as the device path, so results are bit-identical); the comm stream copies the
// updated shard back into the device's parameters and, at stages 1-2, all-gathers it. The next
// forward waits for a unit only when it reaches it, so later units' updates overlap it.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/convert.h"
#include "engine/zero_trainer.h"

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

void ZeroTrainer::allocate_offload_state() {
  Allocator& host = context_.device.host_allocator();
  for (FlatUnit& unit : units_) {
    const std::size_t shard = unit.layout.shard_length();
    // Note: in fp32 compute the device's parameters are their own master weights; offloaded, the
    // host needs its own fp32 copy to update, so the master exists at every compute dtype.
    unit.master = host.allocate(shard * sizeof(float), Category::kOffload);
    for (std::size_t s = 0; s < optimizer_->state_count(); ++s) {
      unit.optimizer_state.push_back(host.allocate(shard * sizeof(float), Category::kOffload));
      // Host memory, zeroed by the host stream that will update it (on CUDA the device's fill
      // is a GPU memset, which does not reach host memory).
      host_stream_->enqueue([data = unit.optimizer_state.back().data(),
                             bytes = unit.optimizer_state.back().bytes()] {
        std::memset(data, 0, bytes);
      });
    }
    unit.transfer = host.allocate(shard * element_size(), Category::kOffload);
  }
  if (options_.compute_dtype != DType::kFloat32) {
    // Note: allocated once, not per step: on CUDA the host arena is page-locked memory, whose
    // allocation (cudaHostAlloc) is slow and whose free may synchronize the device.
    std::size_t largest = 0;
    for (const FlatUnit& unit : units_) largest = std::max(largest, unit.layout.shard_length());
    host_widened_ = host.allocate(largest * sizeof(float), Category::kOffload);
  }
}

void ZeroTrainer::copy_gradients_to_host(FlatUnit& unit) {
  Stream& comm = context_.comm;
  const std::size_t shard_begin = unit.layout.shard_range(context_.rank).begin;
  // Stage 1 keeps full gradients (the rank's shard at its place); stages 2-3 only the shard.
  void* grads = byte_offset(unit.grads.data(),
                            (shard_begin - plan_.grads_first(shard_begin)) * element_size());
  for (const auto& [offset, count] : parameter_runs(unit, shard_begin)) {
    context_.device.copy(comm, byte_offset(unit.transfer.data(), offset * element_size()),
                         byte_offset(grads, offset * element_size()), count * element_size());
  }
  // Note: step() synchronizes comm before anything reads or zeroes the device's gradients
  // again, so this copy needs no event for the compute stream; the host stream waits for it.
  comm.record(*gradients_on_host_[unit.index]);
}

void ZeroTrainer::update_unit_on_host(FlatUnit& unit, const UpdateArgs& shared_args) {
  Stream& host = *host_stream_;
  Stream& comm = context_.comm;
  const DType held = options_.compute_dtype;
  const bool two_byte = held != DType::kFloat32;
  const std::size_t shard_begin = unit.layout.shard_range(context_.rank).begin;
  host.wait(*gradients_on_host_[unit.index]);
  // The same operations as ZeroTrainer::update_unit's, on host buffers: the 2-byte gradients
  // widened to fp32, the optimizer on the fp32 master, the rounded parameters written in its
  // pass. The rounded copy goes into the transfer shard, whose gradients were read first.
  for (const FlatUnit::UpdateRange& range : unit.update_ranges) {
    UpdateArgs args = shared_args;
    args.decay = range.decay;
    const std::size_t offset = range.flat_offset - shard_begin;
    std::vector<float*> state;
    for (Buffer& buffer : unit.optimizer_state) state.push_back(buffer.as<float>() + offset);
    float* master = unit.master.as<float>() + offset;
    void* transfer = byte_offset(unit.transfer.data(), offset * element_size());
    if (!two_byte) {
      optimizer_->update(host, master, static_cast<const float*>(transfer), state, range.count,
                         args);
      continue;
    }
    float* wide_grads = host_widened_.as<float>() + offset;
    convert(host, transfer, held, wide_grads, DType::kFloat32, range.count);
    optimizer_->update_and_round(host, master, wide_grads, state, range.count, args, transfer,
                                 held);
  }
  host.record(*host_updated_[unit.index]);

  // Back to the device on the comm stream: the rounded shard (2-byte) or the master itself.
  comm.wait(*host_updated_[unit.index]);
  // The device's shard: all of `params` at stage 3, the rank's slice of the full unit before.
  void* params = byte_offset(unit.params.data(),
                             (shard_begin - plan_.params_first(shard_begin)) * element_size());
  void* updated = two_byte ? unit.transfer.data() : unit.master.data();
  for (const auto& [offset, count] : parameter_runs(unit, shard_begin)) {
    context_.device.copy(comm, byte_offset(params, offset * element_size()),
                         byte_offset(updated, offset * element_size()), count * element_size());
  }
  if (plan_.gathers_after_step()) {
    const std::size_t shard = unit.layout.shard_length();
    context_.communicator.label_next(("gather updated " + unit.layout.unit_name()).c_str());
    context_.communicator.all_gather(comm, params, unit.params.data(), shard, held);
  }
  // Stages 1-2: the next forward (compute) waits for this when it reaches the unit; stage 3: the
  // unit's next gather (prefetch) does.
  comm.record(*unit_gathered_[unit.index]);
  awaiting_gather_[unit.index] = true;
}

void ZeroTrainer::offload_state_loaded() {
  if (options_.compute_dtype != DType::kFloat32) return;  // the master was loaded itself
  // fp32: checkpoints hold no master (it equals the parameters), so the host's copy is refreshed
  // from the loaded parameter shard.
  for (FlatUnit& unit : units_) {
    const std::size_t shard_begin = unit.layout.shard_range(context_.rank).begin;
    float* params = unit.params.as<float>() + (shard_begin - plan_.params_first(shard_begin));
    for (const auto& [offset, count] : parameter_runs(unit, shard_begin)) {
      context_.device.copy(context_.comm, unit.master.as<float>() + offset, params + offset,
                           count * sizeof(float));
    }
  }
}

}  // namespace zest
