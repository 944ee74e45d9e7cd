// The stage plan: what a ZeRO stage keeps full or sharded, and when it reduces gradients and
// gathers parameters. Made once from zero_optimization.stage; the engine, the model-state
// prediction, the planner and the tools ask it instead of comparing stage numbers.
// Invariant: a plan exists only for stages 0-3 (StagePlan::of throws a kConfig Error otherwise).
//
//   stage | params | grads | optimizer | reduced by     | reduced           | in       | params gathered
//   ------+--------+-------+-----------+----------------+-------------------+----------+----------------------------------
//     0   | full   | full  | full      | all-reduce     | once per step     | buckets  | never (every rank updates all)
//     1   | full   | full  | shard     | reduce-scatter | once per step     | buckets  | after the step
//     2   | full   | shard | shard     | reduce-scatter | every micro-batch | per unit | after the step
//     3   | shard  | shard | shard     | reduce-scatter | every micro-batch | per unit | before each unit's forward and backward
//
// "Once per step": full gradients accumulate over the micro-batches and only the last one is
// reduced, in buckets of reduce_bucket_size elements. "Every micro-batch, per unit": only the
// shard outlives a unit's backward, so each unit is reduced as soon as its backward ends.
// The optimizer state (and the fp32 master) is sharded from stage 1, so offload_optimizer,
// which offloads a shard, needs stage 1 or more. Every rule of that kind — a feature only some
// stages serve — is a StageFeature below, read from the table, with the one reason that the
// config, the engine and the planner give alike when they refuse it.
#pragma once

#include <cstddef>
#include <string>

namespace zest {

enum class GradientReduction { kAllReduce, kReduceScatter };
enum class ParameterGathers { kNever, kAfterStep, kBeforeEachUse };

// A feature that only some stages serve, and the column of the table it needs.
enum class StageFeature {
  kOffloadOptimizer,    // offload_optimizer: moves a shard of the optimizer state (optimizer)
  kOffloadParameters,   // offload_param: moves a shard of the parameters (params)
  kQuantizedWeights,    // zero_quantized_weights (qwZ): the gathers before each use (gathers)
  kQuantizedGradients,  // zero_quantized_gradients (qgZ): a reduce-scatter (reduced by)
  kSecondaryShard,      // zero_hpz_partition_size (hpZ): the gathers in backward (gathers)
  kGatheredForStep,     // pipeline.reshard_after_forward false: per-micro-batch gathers (gathers)
};

struct StagePlan {
  static constexpr int kStages = 4;  // 0, 1, 2, 3
  static constexpr int kFullySharded = kStages - 1;  // params, grads and optimizer state

  static constexpr bool valid(long long stage) { return stage >= 0 && stage < kStages; }
  // Throws a kConfig Error naming zero_optimization.stage when `stage` is not 0-3.
  static StagePlan of(int stage);

  int stage = 0;
  bool params_sharded = false;
  bool grads_sharded = false;
  bool optimizer_sharded = false;  // master weights and optimizer states
  GradientReduction reduction = GradientReduction::kAllReduce;
  bool reduce_every_micro_batch = false;  // else only the step's last micro-batch is reduced
  bool reduce_per_unit = false;           // else in buckets of reduce_bucket_size elements
  ParameterGathers gathers = ParameterGathers::kNever;

  bool gathers_before_each_use() const { return gathers == ParameterGathers::kBeforeEachUse; }
  bool gathers_after_step() const { return gathers == ParameterGathers::kAfterStep; }
  bool can_offload_optimizer() const { return serves(StageFeature::kOffloadOptimizer); }
  bool can_offload_parameters() const { return serves(StageFeature::kOffloadParameters); }

  bool serves(StageFeature feature) const;
  // Why this stage does not serve `feature`, the stages that do named from the table: "needs
  // zero_optimization.stage 3 (got 2): only stage 3 gathers parameters before each use". The
  // caller puts the key (and its value) in front, and what to do after.
  std::string refusal(StageFeature feature) const;

  // Elements a rank holds of a unit whose flat buffer is `full` long and whose shard is `shard`.
  std::size_t params_length(std::size_t full, std::size_t shard) const {
    return params_sharded ? shard : full;
  }
  std::size_t grads_length(std::size_t full, std::size_t shard) const {
    return grads_sharded ? shard : full;
  }
  std::size_t optimizer_length(std::size_t full, std::size_t shard) const {
    return optimizer_sharded ? shard : full;
  }
  // Where a rank's buffer starts in the unit's flat coordinates: at its shard's first element
  // when it holds the shard, at 0 when it holds the whole unit.
  std::size_t params_first(std::size_t shard_begin) const { return params_sharded ? shard_begin : 0; }
  std::size_t grads_first(std::size_t shard_begin) const { return grads_sharded ? shard_begin : 0; }
  std::size_t optimizer_first(std::size_t shard_begin) const {
    return optimizer_sharded ? shard_begin : 0;
  }
};

}  // namespace zest
