#include "engine/stage_plan.h"

#include <string>

#include "base/error.h"

namespace zest {
namespace {

constexpr auto kAllReduce = GradientReduction::kAllReduce;
constexpr auto kReduceScatter = GradientReduction::kReduceScatter;

// The table in stage_plan.h, row by row (fields in StagePlan's order).
constexpr StagePlan kPlans[StagePlan::kStages] = {
    // stage  params  grads  optimizer  reduced by     every micro-batch  per unit  gathers
    {0, false, false, false, kAllReduce, false, false, ParameterGathers::kNever},
    {1, false, false, true, kReduceScatter, false, false, ParameterGathers::kAfterStep},
    {2, false, true, true, kReduceScatter, true, true, ParameterGathers::kAfterStep},
    {3, true, true, true, kReduceScatter, true, true, ParameterGathers::kBeforeEachUse},
};

// Each feature's reason, worded for the stages that do not serve it.
std::string reason(StageFeature feature, int stage) {
  switch (feature) {
    case StageFeature::kOffloadOptimizer:
      return "only a sharded optimizer state is offloaded";
    case StageFeature::kOffloadParameters:
      return "only stage 3 shards the parameters, and a full copy would not leave the device";
    case StageFeature::kQuantizedWeights:
      return "only stage 3 gathers parameters before each use";
    case StageFeature::kQuantizedGradients:
      return "stage " + std::to_string(stage) +
             " all-reduces gradients instead of reduce-scattering them";
    case StageFeature::kSecondaryShard:
      return "only stage 3 gathers parameters in backward";
    case StageFeature::kGatheredForStep:
      return "only stage 3 gathers parameters per micro-batch";
  }
  return "";
}

// "3", "2 or 3", "1, 2 or 3": the stages whose row serves `feature`.
std::string stages_serving(StageFeature feature) {
  std::string text;
  int named = 0;
  for (int stage = StagePlan::kFullySharded; stage >= 0; --stage) {
    if (!kPlans[stage].serves(feature)) continue;
    text = std::to_string(stage) + (named == 0 ? "" : named == 1 ? " or " : ", ") + text;
    ++named;
  }
  return text;
}

}  // namespace

bool StagePlan::serves(StageFeature feature) const {
  switch (feature) {
    case StageFeature::kOffloadOptimizer:
      return optimizer_sharded;
    case StageFeature::kOffloadParameters:
      return params_sharded;
    case StageFeature::kQuantizedGradients:
      return reduction == GradientReduction::kReduceScatter;
    case StageFeature::kQuantizedWeights:
    case StageFeature::kSecondaryShard:
    case StageFeature::kGatheredForStep:
      return gathers_before_each_use();
  }
  return false;
}

std::string StagePlan::refusal(StageFeature feature) const {
  return "needs zero_optimization.stage " + stages_serving(feature) + " (got " +
         std::to_string(stage) + "): " + reason(feature, stage);
}

StagePlan StagePlan::of(int stage) {
  if (!valid(stage)) {
    throw Error(ErrorKind::kConfig, "zero_optimization.stage: must be 0, 1, 2 or 3, got " +
                                        std::to_string(stage));
  }
  return kPlans[stage];
}

}  // namespace zest
