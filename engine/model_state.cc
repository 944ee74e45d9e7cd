#include "engine/model_state.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "engine/stage_plan.h"
#include "engine/swapped_parameters.h"

namespace zest {

ModelStateShape describe_model_state(Module& module, DType compute_dtype,
                                     std::size_t optimizer_states, std::size_t alignment) {
  ModelStateShape shape;
  shape.compute_dtype = compute_dtype;
  shape.optimizer_states = optimizer_states;
  shape.alignment = alignment;
  for (Unit* unit : module.units()) {
    UnitShapes shapes{unit->name(), {}, unit->borrowed_units(),
                      unit->gradients_replace_parameters(), unit->borrows_in_turn(),
                      unit->backward_reads_parameters()};
    for (const ParamSpec& spec : unit->parameters()) shapes.params.push_back({spec.name, spec.shape});
    shape.units.push_back(std::move(shapes));
  }
  return shape;
}

MemoryPrediction predict_model_state(const ModelStateShape& model, int stage, int world_size,
                                     bool offload_optimizer, bool offload_param) {
  const StagePlan plan = StagePlan::of(stage);
  MemoryPrediction prediction;
  const std::size_t element = dtype_size(model.compute_dtype);
  const std::size_t states =
      model.optimizer_states + (model.compute_dtype == DType::kFloat32 ? 0 : 1);
  std::size_t largest_shard = 0;
  for (const UnitShapes& unit : model.units) {
    const ShardLayout layout = ShardLayout::build(unit.name, unit.params, world_size, model.alignment);
    largest_shard = std::max(largest_shard, layout.shard_length());
    const std::size_t full = layout.flat_length();
    const std::size_t shard = layout.shard_length();
    prediction.params += plan.params_length(full, shard) * element;
    prediction.grads += plan.grads_length(full, shard) * element;
    if (offload_optimizer) {
      prediction.offload += shard * (sizeof(float) * (1 + model.optimizer_states) + element);
    } else {
      prediction.optimizer += plan.optimizer_length(full, shard) * sizeof(float) * states;
    }
  }
  if (offload_optimizer && model.compute_dtype != DType::kFloat32) {
    // The fp32 widening of the 2-byte gradient shard the host optimizer reads: one, as large
    // as the largest shard, since the host stream updates the units one after another.
    prediction.offload += largest_shard * sizeof(float);
  }
  if (offload_param) prediction.host_params = std::exchange(prediction.params, 0);
  return prediction;
}

MemoryPrediction predict_model_state(const ModelStateShape& model, int stage, int world_size,
                                     bool offload_optimizer,
                                     const OffloadParamOptions& offload_param) {
  MemoryPrediction prediction = predict_model_state(model, stage, world_size, offload_optimizer,
                                                    offload_param.enabled());
  if (offload_param.device != OffloadDevice::kNvme) return prediction;
  std::vector<std::size_t> shards;
  for (const UnitShapes& unit : model.units) {
    shards.push_back(
        ShardLayout::build(unit.name, unit.params, world_size, model.alignment).shard_length());
  }
  const std::size_t element = dtype_size(model.compute_dtype);
  account_parameter_swap(prediction, parameter_swap_layout(shards, element, offload_param),
                         shards, element);
  return prediction;
}

namespace {

std::string needs(const MemoryPrediction& p) {
  return fmt::format("{} ({} params, {} grads, {} optimizer)", format_bytes(p.total()),
                     format_bytes(p.params), format_bytes(p.grads), format_bytes(p.optimizer));
}

const char* plural(int ranks) { return ranks == 1 ? "" : "s"; }

}  // namespace

std::string model_state_advice(const ModelStateShape& model, int stage, int world_size,
                               std::size_t capacity, bool offload_optimizer) {
  const MemoryPrediction now = predict_model_state(model, stage, world_size, offload_optimizer);
  std::string advice = fmt::format("the model state alone needs {} per rank at stage {} on {} "
                                   "rank{}",
                                   needs(now), stage, world_size, plural(world_size));
  // Note: "fits" leaves a quarter of the capacity for activations, buckets and the gather ring,
  // which depend on the micro-batch and the model's widest unit (zest-estimate says exactly).
  const std::size_t budget = capacity / 4 * 3;
  for (int higher = stage + 1; higher < StagePlan::kStages; ++higher) {
    const MemoryPrediction p = predict_model_state(model, higher, world_size, offload_optimizer);
    if (p.total() <= budget) {
      return advice + fmt::format("; at zero_optimization.stage {} it needs {}, which leaves "
                                  "room in {}",
                                  higher, format_bytes(p.total()), format_bytes(capacity));
    }
  }
  if (!offload_optimizer) {
    for (int offloaded = stage; offloaded < StagePlan::kStages; ++offloaded) {
      if (!StagePlan::of(offloaded).can_offload_optimizer()) continue;
      const MemoryPrediction p = predict_model_state(model, offloaded, world_size, true);
      if (p.total() <= budget) {
        return advice + fmt::format("; with zero_optimization.offload_optimizer.device \"cpu\" "
                                    "at stage {} it needs {} on the device ({} in host memory)",
                                    offloaded, format_bytes(p.total()), format_bytes(p.offload));
      }
    }
  }
  for (int ranks = world_size * 2; ranks <= world_size * 64; ranks *= 2) {
    const MemoryPrediction p =
        predict_model_state(model, StagePlan::kStages - 1, ranks, offload_optimizer);
    if (p.total() <= budget) {
      return advice + fmt::format("; even stage 3 does not fit on {} rank{}, but on {} ranks "
                                  "(world.ranks) it needs {} per rank",
                                  world_size, plural(world_size), ranks, format_bytes(p.total()));
    }
  }
  return advice + "; no stage fits on up to 64 times the ranks: the model is too large for "
                  "devices of this size";
}

}  // namespace zest
