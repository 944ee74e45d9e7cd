// A Module made from a job's shape (engine/job_shape.h), for the memory planner to train on the
// shape-only device (runtime/shape_device.h): units that declare the shapes' parameters and
// whose forward, recompute and backward allocate and release what their UnitMemory says, in the
// order the built-in models do (models/*: the saved activations, the call's workspace, a
// borrowed unit's fp32 copy in turn, the output; backward's input gradient and workspace). The
// engine does the rest — gathers, buckets, the step — as it does for any model.
// Invariant: unit u allocates exactly UnitMemory u's bytes (engine/unit_memory.h), so the
// plan holds for every model whose unit_memory() holds.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/job_shape.h"
#include "engine/module.h"
#include "memory/shape_allocator.h"
#include "optim/optimizer.h"

namespace zest {

class ShapeModule final : public Module {
 public:
  // `input` must outlive the module, and `tensor_parallel_group` (null: none) too: the group of
  // input.tensor_parallel_size ranks that a tensor-parallel model's units split their layers
  // across, which the engine sums the gradient norm over (Module::tensor_parallel_group).
  explicit ShapeModule(const PeakPlanInput& input, Communicator* tensor_parallel_group = nullptr);
  ~ShapeModule() override;

  std::vector<Unit*> units() override;
  Communicator* tensor_parallel_group() const override { return tensor_parallel_group_; }

 private:
  Communicator* tensor_parallel_group_ = nullptr;
  class ShapeUnit;
  std::vector<std::unique_ptr<ShapeUnit>> units_;
  // Per unit: the saved activations of later units that its backward frees
  // (UnitMemory::saved_freed_by).
  std::vector<std::vector<Buffer>> held_;
};

// `rows` micro-batches of `row_bytes` each in host memory that is never read, for the
// ShapeModule: the data loader's buffers, which no allocator of the engine's holds. On the CUDA device the engine
// copies it in first (engine/device_batch.h), charged to activations; on the CPU device it is
// used where it is. Note: one tensor where a model has inputs and targets, so the copy is one
// allocation where the engine makes two; they differ by the alignment's rounding at most.
class ShapeBatch {
 public:
  explicit ShapeBatch(std::size_t row_bytes, std::int64_t rows = 1);
  const Batch& batch() const { return batch_; }

 private:
  ShapeAllocator loader_{"data loader"};
  Buffer held_;
  Batch batch_;
};

// The optimizer the planner trains a ShapeModule with: one with the shape's state arrays
// (AdamW's two moments, SGD's momentum, or none).
OptimizerOptions shape_optimizer(std::size_t states);

}  // namespace zest
