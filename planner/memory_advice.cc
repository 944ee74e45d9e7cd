#include "planner/memory_advice.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "base/error.h"
#include "engine/stage_plan.h"

namespace zest {
namespace {

std::string estimate(const PeakPrediction& p) {
  return fmt::format("{} per rank (params {}, grads {}, optimizer {}, gather {}, buckets {}, "
                     "activations {}, workspace {})",
                     format_bytes(p.device_total), format_bytes(p.of(Category::kParams)),
                     format_bytes(p.of(Category::kGrads)), format_bytes(p.of(Category::kOptimizer)),
                     format_bytes(p.of(Category::kGather)), format_bytes(p.of(Category::kBuckets)),
                     format_bytes(p.of(Category::kActivations)),
                     format_bytes(p.of(Category::kWorkspace)));
}

// A change to the input and how to say it; empty text when it does not fit.
std::string try_change(const PeakPlanInput& changed, std::size_t capacity,
                       const std::string& change) {
  try {
    const PeakPrediction p = predict_peak(changed);
    if (p.device_total > capacity) return "";
    return fmt::format("{} it needs {}", change, format_bytes(p.device_total));
  } catch (const Error&) {
    return "";  // a change the engine refuses (a ring limit below one unit, say)
  }
}

std::string smaller_micro_batch(const PeakPlanInput& input, std::size_t capacity,
                                std::int64_t micro_batch, const MicroBatchMemory& resize) {
  if (!resize || input.units.empty()) return "";
  for (std::int64_t rows = micro_batch / 2; rows >= 1; rows /= 2) {
    PeakPlanInput changed = input;
    changed.units = resize(rows);
    changed.batch_bytes = micro_batch > 0 ? input.batch_bytes / static_cast<std::size_t>(micro_batch) *
                                                static_cast<std::size_t>(rows)
                                          : 0;
    const std::string fits = try_change(
        changed, capacity,
        fmt::format("with train_micro_batch_size_per_gpu {} (gradient_accumulation_steps "
                    "keeps the global batch)",
                    rows));
    if (!fits.empty()) return fits;
  }
  return "";
}

// The model built another way, at stage 3 with the rest as given.
std::string model_variant(const PeakPlanInput& input, std::size_t capacity,
                          std::int64_t micro_batch, const std::vector<ModelVariant>& variants) {
  for (const ModelVariant& variant : variants) {
    if (input.units.empty() || !variant.units || micro_batch < 1) break;
    PeakPlanInput changed = input;
    changed.engine.stage = StagePlan::kFullySharded;
    changed.model = variant.model;
    changed.units = variant.units(micro_batch);
    changed.recompute.clear();  // a plan per unit of the model as given
    const std::string fits =
        try_change(changed, capacity, fmt::format("with {} at zero_optimization.stage {}",
                                                  variant.change, StagePlan::kFullySharded));
    if (!fits.empty()) return fits;
  }
  return "";
}

std::string larger_setup(const PeakPlanInput& input, std::size_t capacity,
                         std::int64_t micro_batch, const std::vector<ModelVariant>& variants) {
  const int stage = input.engine.stage;
  // A tensor-parallel job offloads nothing yet (config/tensor_parallel_block.cc refuses it).
  const bool offloaded =
      input.engine.offload_optimizer.enabled() || input.tensor_parallel_size > 1;
  for (int higher = stage + 1; higher < StagePlan::kStages; ++higher) {
    PeakPlanInput changed = input;
    changed.engine.stage = higher;
    const std::string fits =
        try_change(changed, capacity, fmt::format("at zero_optimization.stage {}", higher));
    if (!fits.empty()) return fits;
  }
  for (int at = stage; !offloaded && at < StagePlan::kStages; ++at) {
    if (!StagePlan::of(at).serves(StageFeature::kOffloadOptimizer)) continue;
    PeakPlanInput changed = input;
    changed.engine.stage = at;
    changed.engine.offload_optimizer.device = OffloadDevice::kCpu;
    const std::string fits = try_change(
        changed, capacity,
        fmt::format("with zero_optimization.offload_optimizer.device \"cpu\" at stage {}", at));
    if (!fits.empty()) return fits;
  }
  if (std::string fits = model_variant(input, capacity, micro_batch, variants); !fits.empty()) {
    return fits;
  }
  for (int ranks = input.world_size * 2; ranks <= input.world_size * 64; ranks *= 2) {
    PeakPlanInput changed = input;
    changed.engine.stage = StagePlan::kFullySharded;
    changed.world_size = ranks;
    // world.ranks counts every tensor-parallel rank of each data-parallel one.
    const std::string fits = try_change(
        changed, capacity,
        fmt::format("on {} ranks (world.ranks) at stage {}", ranks * input.tensor_parallel_size,
                    StagePlan::kFullySharded));
    if (!fits.empty()) return fits;
  }
  return "";
}

// Recomputation keeps the micro-batch and trades compute for activations: the lightest policy
// (selective before full) that fits, when the model can recompute.
std::string recomputation(const PeakPlanInput& input, std::size_t capacity) {
  // A tensor-parallel job does not recompute yet (config/tensor_parallel_block.cc refuses it).
  if (input.units.empty() || input.tensor_parallel_size > 1) return "";
  for (RecomputePolicy policy : {RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
    if (policy <= input.engine.activation_checkpointing.policy) continue;
    PeakPlanInput changed = input;
    changed.engine.activation_checkpointing.policy = policy;
    const std::string fits = try_change(
        changed, capacity,
        fmt::format("with activation_checkpointing.policy \"{}\"", recompute_policy_name(policy)));
    if (!fits.empty()) return fits;
  }
  return "";
}

}  // namespace

std::size_t fixed_bytes(const PeakPrediction& prediction) {
  return prediction.of(Category::kParams) + prediction.of(Category::kGrads) +
         prediction.of(Category::kOptimizer) + prediction.of(Category::kGather);
}

std::string memory_advice(const PeakPlanInput& input, std::size_t capacity,
                          std::int64_t micro_batch, const MicroBatchMemory& resize,
                          const std::vector<ModelVariant>& variants) {
  const PeakPrediction now = predict_peak(input);
  std::string advice = "the planner estimates " + estimate(now);
  if (now.device_total <= capacity) return advice + fmt::format(", which fits in {}", format_bytes(capacity));
  // The micro-batch is the smallest change when the model state fits and the rest overflows.
  const bool transient = fixed_bytes(now) < capacity;
  std::string fits = transient ? smaller_micro_batch(input, capacity, micro_batch, resize) : "";
  // Activation checkpointing, when activations overflow: the advice itself if no smaller
  // micro-batch fits, else the alternative that keeps the micro-batch.
  std::string recompute = transient ? recomputation(input, capacity) : "";
  if (fits.empty()) fits = std::exchange(recompute, "");
  if (fits.empty()) fits = larger_setup(input, capacity, micro_batch, variants);
  if (fits.empty()) fits = smaller_micro_batch(input, capacity, micro_batch, resize);
  if (fits.empty()) {
    return advice + "; no higher stage, offload, " +
           (variants.empty() ? std::string() : variants.back().change + ", ") +
           "up to 64 times the ranks or smaller micro-batch fits devices of " +
           format_bytes(capacity);
  }
  advice += "; " + fits + ", which fits in " + format_bytes(capacity);
  if (!recompute.empty()) advice += "; or, keeping the micro-batch, " + recompute;
  return advice;
}

std::string training_memory_advice(const TrainingMemory& memory) {
  return training_memory_advice_with({})(memory);
}

OutOfMemoryAdvice training_memory_advice_with(std::vector<ModelVariant> variants) {
  return [variants = std::move(variants)](const TrainingMemory& memory) {
    try {
      return memory_advice(memory.input, memory.capacity, memory.micro_batch, memory.resize,
                           variants);
    } catch (const Error& error) {
      return std::string("no estimate: ") + error.what();
    }
  };
}

}  // namespace zest
