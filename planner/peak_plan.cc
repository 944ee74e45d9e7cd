#include "planner/peak_plan.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "engine/stage_plan.h"
#include "planner/engine_replay.h"
#include "planner/peak_ledger.h"

namespace zest {

PeakPrediction predict_peak(const PeakPlanInput& input) {
  const EngineOptions& options = input.engine;
  const StagePlan plan = StagePlan::of(options.stage);
  if (options.offload_optimizer.enabled() && !plan.can_offload_optimizer()) {
    throw Error(ErrorKind::kConfig,
                "zero_optimization.offload_optimizer.device: \"cpu\" needs "
                "zero_optimization.stage 1, 2 or 3 (got 0)");
  }
  if (input.world_size < 1) {
    throw Error(ErrorKind::kConfig, "world.ranks: must be >= 1, got " +
                                        std::to_string(input.world_size));
  }
  PeakLedger ledger(input.device == DeviceKind::kCuda);
  EngineReplay replay(input, ledger);
  replay.construct();
  if (input.model_state_only) return replay.result();
  // Two steps: the second starts while the first's optimizer scratch may still be queued.
  for (int step = 0; step < 2; ++step) {
    const int micro_batches = std::max(options.gradient_accumulation_steps, 1);
    for (int micro = 0; micro < micro_batches; ++micro) {
      replay.micro_batch(micro + 1 == micro_batches);
    }
    replay.step();
  }
  return replay.result();
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
