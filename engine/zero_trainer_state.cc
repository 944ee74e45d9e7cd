// Checkpoint access to the ZeRO engine's state: every rank exposes the shard of each state
// tensor it owns in the sharded layout, whatever the stage, so a checkpoint's files have the
// same shape at every stage and can be resharded by flat-coordinate arithmetic alone. With the
// optimizer offloaded the views of master and states are into host memory; the files are the same.
#include "base/error.h"
#include "engine/parameter_offload.h"
#include "engine/swapped_state.h"
#include "engine/zero_trainer.h"
#include "kernels/convert.h"
#include "runtime/host_copies.h"

namespace zest {

void ZeroTrainer::hold_state_for(std::shared_ptr<Event> readers) {
  wait_for_state_readers();
  state_readers_ = std::move(readers);
}

void ZeroTrainer::wait_for_state_readers() {
  if (!state_readers_) return;
  const std::shared_ptr<Event> readers = std::move(state_readers_);
  try {
    readers->synchronize();
  } catch (...) {
    // The reader (the checkpoint writer) raises its own copy's failure; the state is unchanged.
  }
}

std::vector<StateShard> ZeroTrainer::state_shards(std::size_t index) {
  wait_for_state_readers();  // a caller may write through the views
  FlatUnit& unit = units_.at(index);
  context_.synchronize();
  if (host_) host_->synchronize();
  const ElementRange shard = unit.layout.shard_range(context_.rank);
  // Buffers that hold the full flat unit are viewed from the shard's start; shard buffers from 0.
  auto shard_of = [&](Buffer& buffer, bool full, DType dtype) {
    return static_cast<char*>(buffer.data()) + (full ? shard.begin * dtype_size(dtype) : 0);
  };
  // Offloaded, master and states are the host optimizer's shards in host memory.
  Buffer& master = host_ ? host_->shards(index).master : unit.master;
  std::vector<Buffer>& states = host_ ? host_->shards(index).optimizer_state : unit.optimizer_state;
  std::vector<StateShard> shards;
  if (swapped_params_ && swapped_params_->holds(unit)) {
    // offload_param "nvme": moved a chunk at a time between the swap files and the host.
    swapped_params_->synchronize();
    shards.push_back({"params", options_.compute_dtype, nullptr, shard.begin, shard.end,
                      swapped_params_->access(unit)});
  } else {
    shards.push_back({"params", options_.compute_dtype,
                      shard_of(unit.params, !plan_.params_sharded, options_.compute_dtype),
                      shard.begin, shard.end});
  }
  // Note: an offloaded fp32 run keeps a host master too, but it equals the parameters between
  // steps, so its checkpoint holds what a run without offload holds (and either loads it).
  SwappedState* swapped = host_ ? host_->swapped() : nullptr;
  if (options_.compute_dtype != DType::kFloat32 && swapped == nullptr) {
    shards.push_back({"master", DType::kFloat32, shard_of(master, !plan_.optimizer_sharded, DType::kFloat32),
                      shard.begin, shard.end});
  }
  for (std::size_t s = 0; s < states.size(); ++s) {
    shards.push_back({"optimizer." + std::to_string(s), DType::kFloat32,
                      shard_of(states[s], !plan_.optimizer_sharded, DType::kFloat32), shard.begin,
                      shard.end});
  }
  if (swapped != nullptr) {
    // On NVMe: the same tensors, moved a chunk at a time between the swap files and the host.
    if (options_.compute_dtype != DType::kFloat32) {
      shards.push_back({"master", DType::kFloat32, nullptr, shard.begin, shard.end,
                        swapped->access(index, 0)});
    }
    for (std::size_t s = 0; s < optimizer_->state_count(); ++s) {
      shards.push_back({"optimizer." + std::to_string(s), DType::kFloat32, nullptr, shard.begin,
                        shard.end, swapped->access(index, 1 + s)});
    }
  }
  return shards;
}

void ZeroTrainer::initialize_master(FlatUnit& unit, const float* values) {
  const auto index = static_cast<std::size_t>(unit.index);
  if (SwappedState* swapped = host_ ? host_->swapped() : nullptr) {
    swapped->initialize(unit, values);
    return;
  }
  const Buffer& master = host_ ? host_->shards(index).master : unit.master;
  if (master.empty()) return;
  write_from_host(context_.device, context_.compute, master.data(), values, master.bytes());
}

MemoryPrediction ZeroTrainer::predicted_memory() const {
  MemoryPrediction prediction =
      predict_model_state(model_state_shape(), plan_.stage, context_.world_size, offloaded(),
                          options_.offload_param);
  if (const SwappedState* swapped = host_ ? host_->swapped() : nullptr) {
    // On NVMe the master and the states are in the swap files; the host keeps the transfer
    // shards and the buffers the sub-groups stream through.
    std::size_t state_bytes = 0;
    for (const FlatUnit& unit : units_) {
      state_bytes += unit.layout.shard_length() * sizeof(float) * (1 + optimizer_->state_count());
    }
    prediction.offload = prediction.offload - state_bytes + swapped->host_bytes();
    prediction.nvme += swapped->swap_bytes();  // offload_param's are counted already
  }
  return prediction;
}

std::size_t ZeroTrainer::swap_bytes() const {
  const SwappedState* swapped = host_ ? host_->swapped() : nullptr;
  return (swapped ? swapped->swap_bytes() : 0) +
         (swapped_params_ ? swapped_params_->swap_bytes() : 0);
}

SwapTraffic ZeroTrainer::swap_traffic() const {
  SwapTraffic traffic;
  for (const SwapStore* store :
       {host_ && host_->swapped() ? &host_->swapped()->store() : nullptr,
        swapped_params_ ? &swapped_params_->store() : nullptr}) {
    if (store == nullptr) continue;
    traffic.read += store->bytes_read();
    traffic.written += store->bytes_written();
  }
  return traffic;
}

void ZeroTrainer::state_loaded() {
  wait_for_state_readers();
  Stream& comm = context_.comm;
  // Note: a caller may have written its shards in compute-stream order (write_from_host: the
  // outer loop's meeting does); the all-gathers below run on comm and must read them written.
  context_.compute.synchronize();
  for (FlatUnit& unit : units_) {
    const std::size_t shard = unit.layout.shard_length();
    // A full buffer's copies agree again once every rank's loaded shard is all-gathered into it.
    auto replicate = [&](Buffer& buffer, DType dtype) {
      char* base = buffer.as<char>();
      context_.communicator.all_gather(comm, base + context_.rank * shard * dtype_size(dtype), base,
                                       shard, dtype);
    };
    if (!plan_.params_sharded) replicate(unit.params, options_.compute_dtype);
    if (!plan_.optimizer_sharded) {
      if (!unit.master.empty()) replicate(unit.master, DType::kFloat32);
      for (Buffer& state : unit.optimizer_state) replicate(state, DType::kFloat32);
    }
  }
  gatherer_->forget();
  if (host_) host_->state_loaded(units_);
  context_.synchronize();
}

std::optional<CheckpointPlacement> ZeroTrainer::checkpoint_placement() const {
  const Communicator* tensor_group = module_.tensor_parallel_group();
  const bool tensor_parallel = tensor_group != nullptr && tensor_group->world_size() > 1;
  if (context_.replicas <= 1 && !tensor_parallel) return std::nullopt;
  CheckpointPlacement placement;
  placement.shards = context_.world_size;
  placement.shard = context_.rank;
  placement.replicas = context_.replicas;
  // Note: shard groups are consecutive world ranks (runtime/hybrid_communicator.h), so the group
  // is the world rank over the group's size.
  placement.replica = context_.rank_in_world() / context_.world_size;
  placement.units = layouts_;
  placement.unit_parts.assign(layouts_.size(), 0);
  for (std::size_t u = 0; u < layouts_.size(); ++u) placement.local_units.push_back(u);
  if (tensor_parallel) {
    // The engine runs on the data-parallel group, the tensor index varying fastest
    // (runtime/device_mesh.h).
    placement.replica = 0;
    placement.tensor_ranks = tensor_group->world_size();
    placement.tensor_rank = tensor_group->rank();
    for (const FlatUnit& unit : units_) {
      std::vector<ParamSpec::DrawSlice>& slices = placement.slices.emplace_back();
      for (const ParamSpec& spec : unit.specs) slices.push_back(spec.draw_slice);
    }
  }
  return placement;
}

TrainerCounters ZeroTrainer::counters() const {
  return {steps_taken_, optimizer_steps_, scaler_.state()};
}

void ZeroTrainer::set_counters(const TrainerCounters& counters) {
  if (micro_batches_ != 0) {
    throw Error(ErrorKind::kUsage, "set_counters between micro-batches; restore between steps");
  }
  steps_taken_ = counters.steps_taken;
  optimizer_steps_ = counters.optimizer_steps;
  scaler_.restore(counters.loss_scaler);
}

std::vector<std::string> ZeroTrainer::parameter_names() const {
  std::vector<std::string> names;
  for (const FlatUnit& unit : units_) {
    for (std::size_t p = 0; p < unit.specs.size(); ++p) names.push_back(unit.param_name(p));
  }
  return names;
}

std::vector<float> ZeroTrainer::full_parameter(const std::string& name) {
  for (FlatUnit& unit : units_) {
    for (std::size_t p = 0; p < unit.specs.size(); ++p) {
      if (unit.param_name(p) != name) continue;
      const ParamPlace& place = unit.layout.params()[p];
      context_.synchronize();
      Buffer gathered;
      const void* params = unit.params.data();
      if (plan_.params_sharded) {
        gathered = context_.allocator().allocate(unit.layout.flat_length() * element_size(),
                                                 Category::kWorkspace);
        StagedShard shard(context_, options_, unit, context_.comm, swapped_params_.get());
        context_.communicator.all_gather(context_.comm, shard.data(), gathered.data(),
                                         unit.layout.shard_length(), options_.compute_dtype);
        context_.comm.synchronize();
        params = gathered.data();
      }
      std::vector<unsigned char> held(place.numel * element_size());
      read_to_host(context_.device, context_.comm, held.data(),
                   static_cast<const char*>(params) + place.offset * element_size(), held.size());
      std::vector<float> value(place.numel);
      cpu::convert(held.data(), options_.compute_dtype, value.data(), DType::kFloat32, place.numel);
      return value;
    }
  }
  throw Error(ErrorKind::kUsage, "no parameter named '" + name + "'");
}

}  // namespace zest
