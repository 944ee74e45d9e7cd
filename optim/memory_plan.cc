#include "optim/memory_plan.h"

#include <fmt/format.h>

namespace zest {

MemoryPrediction predict_model_state(const ModelStateShape& model, int stage, int world_size) {
  MemoryPrediction prediction;
  const std::size_t element = dtype_size(model.compute_dtype);
  const std::size_t states =
      model.optimizer_states + (model.compute_dtype == DType::kFloat32 ? 0 : 1);
  for (const UnitShapes& unit : model.units) {
    const ShardLayout layout = ShardLayout::build(unit.name, unit.params, world_size, model.alignment);
    const std::size_t full = layout.flat_length();
    const std::size_t shard = layout.shard_length();
    prediction.params += (stage == 3 ? shard : full) * element;
    prediction.grads += (stage >= 2 ? shard : full) * element;
    prediction.optimizer += (stage == 0 ? full : shard) * sizeof(float) * states;
  }
  return prediction;
}

namespace {

std::string needs(const MemoryPrediction& p) {
  return fmt::format("{} ({} params, {} grads, {} optimizer)", format_bytes(p.total()),
                     format_bytes(p.params), format_bytes(p.grads), format_bytes(p.optimizer));
}

}  // namespace

std::string model_state_advice(const ModelStateShape& model, int stage, int world_size,
                               std::size_t capacity) {
  const MemoryPrediction now = predict_model_state(model, stage, world_size);
  std::string advice = fmt::format("the model state alone needs {} per rank at stage {} on {} "
                                   "rank{}",
                                   needs(now), stage, world_size, world_size == 1 ? "" : "s");
  // Note: "fits" leaves a quarter of the capacity for activations, buckets and the gather ring,
  // which depend on the micro-batch and the model's widest unit.
  const std::size_t budget = capacity / 4 * 3;
  for (int higher = stage + 1; higher <= 3; ++higher) {
    const MemoryPrediction p = predict_model_state(model, higher, world_size);
    if (p.total() <= budget) {
      return advice + fmt::format("; at zero_optimization.stage {} it needs {}, which leaves "
                                  "room in {}",
                                  higher, format_bytes(p.total()), format_bytes(capacity));
    }
  }
  for (int ranks = world_size * 2; ranks <= world_size * 64; ranks *= 2) {
    const MemoryPrediction p = predict_model_state(model, 3, ranks);
    if (p.total() <= budget) {
      return advice + fmt::format("; even stage 3 does not fit on {} rank{}, but on {} ranks "
                                  "(world.ranks) it needs {} per rank",
                                  world_size, world_size == 1 ? "" : "s", ranks,
                                  format_bytes(p.total()));
    }
  }
  return advice + "; no stage fits on up to 64 times the ranks: the model is too large for "
                  "devices of this size";
}

}  // namespace zest
