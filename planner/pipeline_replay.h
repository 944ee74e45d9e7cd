// A pipeline stage's plan on the CUDA device, until the shape-only device stands in for it
// (planner/pipeline_plan.h runs the real PipelineTrainer for the CPU device): the stage's two
// steps replayed as the interpreter (pipeline/interpreter.cc) runs its action list, each chunk's
// trainer by EngineReplay (planner/engine_replay.h), the transfers' buffers around them.
// Invariant: every allocation and release the stage's rank makes, in its order.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/recompute.h"
#include "planner/pipeline_plan.h"

namespace zest {

// `boundaries`: the first unit of each virtual stage and the model's unit count; `recompute`:
// the whole model's plan (empty without unit memory).
PeakPrediction replay_cuda_stage(const PipelinePlanInput& input, int stage,
                                 const std::vector<std::size_t>& boundaries,
                                 const std::vector<RecomputePolicy>& recompute);

}  // namespace zest
