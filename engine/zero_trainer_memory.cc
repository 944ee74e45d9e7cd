// The engine's out-of-memory advice while training: the job at the micro-batch that overflowed,
// handed to the injected EngineOptions::out_of_memory_advice (the planner's, where a program
// asks for it: the engine itself never includes the planner).
#include "engine/job_shape.h"
#include "engine/zero_trainer.h"

namespace zest {

std::string ZeroTrainer::training_memory_advice(const Batch& batch) const {
  if (!options_.out_of_memory_advice) return "";
  TrainingMemory memory;
  PeakPlanInput& input = memory.input;
  input.model = model_state_shape();
  input.units = module_.unit_memory(batch.inputs.shape);
  input.engine = options_;
  input.world_size = context_.world_size;
  input.replicas = context_.replicas;
  if (const Communicator* tensor = module_.tensor_parallel_group()) {
    input.tensor_parallel_size = tensor->world_size();  // the module is this rank's slices
  }
  input.device = context_.device.kind();
  input.batch_bytes = batch.inputs.bytes() + batch.targets.bytes();
  memory.capacity = context_.allocator().capacity();
  memory.micro_batch = batch.inputs.shape.empty() ? 0 : batch.inputs.shape.front();
  memory.resize = [this, shape = batch.inputs.shape](std::int64_t smaller) {
    std::vector<std::int64_t> resized = shape;
    resized.front() = smaller;
    return module_.unit_memory(resized);
  };
  return options_.out_of_memory_advice(memory);
}

}  // namespace zest
