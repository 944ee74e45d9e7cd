// A Module made from a job's shape (engine/job_shape.h), for the memory planner to train on the
// shape-only device (runtime/shape_device.h): units that declare the shapes' parameters and
// whose forward, recompute and backward allocate and release what their UnitMemory says, in the
// order the built-in models do (models/*: the saved activations, the call's workspace, a
// borrowed unit's fp32 copy in turn, the output; backward's input gradient and workspace). The
// engine does the rest — gathers, buckets, the step — as it does for any model.
// Invariant: unit u allocates exactly UnitMemory u's bytes (engine/unit_memory.h), so the
// plan holds for every model whose unit_memory() holds.
#pragma once

#include <memory>
#include <vector>

#include "engine/job_shape.h"
#include "engine/module.h"
#include "optim/optimizer.h"

namespace zest {

class ShapeModule final : public Module {
 public:
  // `input` must outlive the module.
  explicit ShapeModule(const PeakPlanInput& input);
  ~ShapeModule() override;

  std::vector<Unit*> units() override;

 private:
  class ShapeUnit;
  std::vector<std::unique_ptr<ShapeUnit>> units_;
  // Per unit: the saved activations of later units that its backward frees
  // (UnitMemory::saved_freed_by).
  std::vector<std::vector<Buffer>> held_;
};

// The optimizer the planner trains a ShapeModule with: one with the shape's state arrays
// (AdamW's two moments, SGD's momentum, or none).
OptimizerOptions shape_optimizer(std::size_t states);

}  // namespace zest
