// The engine's out-of-memory advice while training: the memory planner (optim/peak_plan.h) at
// the micro-batch that overflowed, and the smallest change that fits (optim/memory_advice.h).
#include "base/error.h"
#include "optim/memory_advice.h"
#include "optim/zero_trainer.h"

namespace zest {

std::string ZeroTrainer::training_memory_advice(const Batch& batch) const {
  PeakPlanInput input;
  input.model = model_state_shape();
  input.units = module_.unit_memory(batch.inputs.shape);
  input.engine = options_;
  input.world_size = context_.world_size;
  input.device = context_.device.kind();
  input.batch_bytes = batch.inputs.bytes() + batch.targets.bytes();
  const std::int64_t rows = batch.inputs.shape.empty() ? 0 : batch.inputs.shape.front();
  const MicroBatchMemory resize = [this, shape = batch.inputs.shape](std::int64_t smaller) {
    std::vector<std::int64_t> resized = shape;
    resized.front() = smaller;
    return module_.unit_memory(resized);
  };
  try {
    return memory_advice(input, context_.allocator().capacity(), rows, resize);
  } catch (const Error& error) {
    return std::string("no estimate: ") + error.what();
  }
}

}  // namespace zest
