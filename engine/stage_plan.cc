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

}  // namespace

StagePlan StagePlan::of(int stage) {
  if (!valid(stage)) {
    throw Error(ErrorKind::kConfig, "zero_optimization.stage: must be 0, 1, 2 or 3, got " +
                                        std::to_string(stage));
  }
  return kPlans[stage];
}

}  // namespace zest
