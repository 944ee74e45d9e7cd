#include "planner/peak_plan.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <string>

#include "base/error.h"
#include "engine/parameter_offload.h"
#include "engine/secondary_shard.h"
#include "engine/stage_plan.h"
#include "engine/state_bytes.h"
#include "optim/optimizer.h"
#include "planner/shape_module.h"
#include "runtime/hybrid_communicator.h"
#include "runtime/shape_communicator.h"
#include "runtime/shape_device.h"

namespace zest {
namespace {

// The model state alone: what the trainer allocates first, with nothing after it.
PeakPrediction model_state_peaks(const PeakPlanInput& input) {
  PeakPrediction prediction;
  prediction.model_state =
      predict_model_state(input.model, input.engine.stage, input.world_size,
                          input.engine.offload_optimizer.enabled(), input.engine.offload_param);
  const MemoryPrediction& state = prediction.model_state;
  prediction.peak[static_cast<std::size_t>(Category::kParams)] = state.params;
  prediction.peak[static_cast<std::size_t>(Category::kGrads)] = state.grads;
  prediction.peak[static_cast<std::size_t>(Category::kOptimizer)] = state.optimizer;
  prediction.peak[static_cast<std::size_t>(Category::kOffload)] = state.offload;
  prediction.device_total = state.total();
  prediction.set_host(Category::kOffload, state.offload);
  prediction.set_host(Category::kParams, state.host_params);
  prediction.nvme[static_cast<std::size_t>(Category::kParams)] = state.nvme_params;
  return prediction;
}

// The groups the engine splits off the shard group, as rank 0 joins them: hpZ's (the first
// hpz_group_size ranks; engine/secondary_shard.h).
std::deque<shape::ShapeGroup> shard_group_splits(const PeakPlanInput& input) {
  const EngineOptions& options = input.engine;
  const int hpz = hpz_group_size(options.hpz_group_size, options.stage, input.world_size,
                                     input.world_size);
  if (hpz == 0) return {};
  return {{0, hpz}};
}

// The communicator rank 0 of the shard group trains with. With replicas (hybrid sharding) it is
// the hybrid communicator over the shard group and rank 0's replica group, as the engine is
// given one (engine/hybrid_shards.h); qgZ sizes its buffers across replicas by the latter.
struct ShapeCommunicators {
  std::unique_ptr<shape::ShapeCommunicator> world;
  std::unique_ptr<HybridCommunicator> hybrid;
  Communicator& shard_group() {
    return hybrid ? static_cast<Communicator&>(*hybrid) : *world;
  }
};

ShapeCommunicators shape_communicators(const PeakPlanInput& input) {
  ShapeCommunicators communicators;
  if (input.replicas <= 1) {
    communicators.world = std::make_unique<shape::ShapeCommunicator>(
        0, input.world_size, shard_group_splits(input));
    return communicators;
  }
  // HybridCommunicator splits the shard group first, then the replica group.
  communicators.world = std::make_unique<shape::ShapeCommunicator>(
      0, input.world_size * input.replicas,
      std::deque<shape::ShapeGroup>{{0, input.world_size}, {0, input.replicas}});
  communicators.hybrid = std::make_unique<HybridCommunicator>(*communicators.world,
                                                              input.world_size);
  return communicators;
}

// An asynchronous checkpoint's snapshot buffers in the host arena, each the size the writer
// gives its own (engine/state_bytes.h): the state of every unit the rank saves, all of them
// outside a pipeline.
std::vector<Buffer> allocate_snapshots(shape::ShapeDevice& device, Trainer& trainer, int count) {
  std::vector<Buffer> buffers;
  if (count <= 0) return buffers;
  std::vector<std::size_t> units(trainer.layouts().size());
  for (std::size_t u = 0; u < units.size(); ++u) units[u] = u;
  const std::size_t bytes = state_bytes(trainer, units);
  for (int i = 0; i < count; ++i) {
    buffers.push_back(device.host_allocator().allocate(bytes, Category::kSnapshot));
  }
  return buffers;
}

// One rank that believes it is rank 0 of the shard group trains two steps on the shape-only
// device; its allocators are the ledger. Ranks are alike: every shard has the same length.
PeakPrediction train_on_shape_device(const PeakPlanInput& input) {
  shape::ShapeDevice device(0, input.device);
  const auto compute = device.create_stream("compute");
  const auto comm = device.create_stream("comm");
  const auto prefetch = device.create_stream("prefetch");
  ShapeCommunicators communicators = shape_communicators(input);
  // An outer loop's groups (a count here) each shard over world_size ranks: the engine splits
  // them off a world of them all.
  const OuterLoopOptions& outer = input.engine.outer_loop;
  const int world = input.world_size * (outer.enabled() ? std::max(1, outer.groups) : 1);
  RankContext context{0, world, device, *compute, *comm, *prefetch, communicators.shard_group()};
  context.topology = Topology(world, world);
  context.replicas = input.replicas;
  EngineOptions options = input.engine;
  options.hybrid_shard_size = 0;  // the context is the shard group's already
  options.out_of_memory_advice = nullptr;
  options.recompute_plan = input.recompute;
  if (input.units.empty()) options.activation_checkpointing = {};  // no activations to drop
  // A tensor-parallel rank's group: its collectives do nothing here, as the data-parallel
  // group's do, but the engine runs its step's sums over it as it does in a run.
  std::unique_ptr<shape::ShapeCommunicator> tensor_group;
  if (input.tensor_parallel_size > 1) {
    tensor_group = std::make_unique<shape::ShapeCommunicator>(0, input.tensor_parallel_size);
  }
  ShapeModule module(input, tensor_group.get());
  ShapeBatch batch(input.batch_bytes);
  Engine engine(context, options);
  std::size_t swap_bytes = 0;
  std::size_t parameter_swap_bytes = 0;
  {
    const std::unique_ptr<Trainer> trainer =
        engine.shard(module, make_optimizer(shape_optimizer(input.model.optimizer_states)));
    // Held from before the steps, as a run holds them from its first saves on: the host's peak
    // is theirs plus a step's.
    const std::vector<Buffer> snapshots = allocate_snapshots(device, *trainer, input.snapshots);
    // Two steps: the second starts while the first's optimizer scratch may still be queued.
    for (int step = 0; step < 2; ++step) {
      for (int micro = 0; micro < options.gradient_accumulation_steps; ++micro) {
        trainer->forward_backward(batch.batch());
      }
      trainer->step();
      if (input.synchronize_between_steps) context.comm.synchronize();
    }
    swap_bytes = trainer->swap_bytes();
    parameter_swap_bytes = trainer->predicted_memory().nvme_params;
  }
  PeakPrediction prediction = model_state_peaks(input);
  // The swap files as the engine reserved them: offload_param's under params, the optimizer's
  // state under optimizer.
  prediction.nvme[static_cast<std::size_t>(Category::kParams)] = parameter_swap_bytes;
  prediction.nvme[static_cast<std::size_t>(Category::kOptimizer)] = swap_bytes - parameter_swap_bytes;
  prediction.model_state.nvme = swap_bytes;
  const MemoryUsage usage = device.allocator().usage();
  for (Category category : all_categories()) {
    if (in_host_memory(category)) continue;
    prediction.peak[static_cast<std::size_t>(category)] = usage.peak_of(category);
  }
  prediction.device_total = usage.total_peak;
  const MemoryUsage host = device.host_allocator().usage();
  for (Category category : all_categories()) {
    if (!in_host_memory(category)) continue;
    prediction.peak[static_cast<std::size_t>(category)] = host.peak_of(category);
  }
  for (Category category : all_categories()) {
    prediction.host_peak[static_cast<std::size_t>(category)] = host.peak_of(category);
  }
  prediction.host_peak_total = host.total_peak;
  return prediction;
}

}  // namespace

std::size_t PeakPrediction::nvme_total() const {
  std::size_t total = 0;
  for (std::size_t bytes : nvme) total += bytes;
  return total;
}

void PeakPrediction::set_host(Category category, std::size_t bytes) {
  host_peak[static_cast<std::size_t>(category)] = bytes;
  host_peak_total += bytes;
}

PeakPrediction predict_peak(const PeakPlanInput& input) {
  const EngineOptions& options = input.engine;
  const StagePlan plan = StagePlan::of(options.stage);
  if (options.offload_optimizer.enabled() && !plan.can_offload_optimizer()) {
    throw Error(ErrorKind::kConfig, "zero_optimization.offload_optimizer.device: \"cpu\" " +
                                        plan.refusal(StageFeature::kOffloadOptimizer));
  }
  check_parameter_offload(options);
  if (input.world_size < 1) {
    throw Error(ErrorKind::kConfig, "world.ranks: must be >= 1, got " +
                                        std::to_string(input.world_size));
  }
  if (input.tensor_parallel_size < 1) {
    throw Error(ErrorKind::kConfig, "tensor_parallel.size: must be >= 1, got " +
                                        std::to_string(input.tensor_parallel_size));
  }
  if (input.model_state_only) return model_state_peaks(input);
  return train_on_shape_device(input);
}

PeakPlanInput plan_input(Module& module, const std::vector<std::int64_t>& input_shape,
                         const EngineOptions& engine, std::size_t optimizer_states,
                         int world_size) {
  PeakPlanInput input;
  input.model = describe_model_state(module, engine.compute_dtype, optimizer_states,
                                     engine.shard_alignment);
  input.units = module.unit_memory(input_shape);
  input.engine = engine;
  input.world_size = world_size;
  return input;
}

}  // namespace zest
