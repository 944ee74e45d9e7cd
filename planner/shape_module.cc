#include "planner/shape_module.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "runtime/shape_stream.h"

namespace zest {
namespace {
// Activations of any byte count: the shape-only device never reads them, so one byte each.
std::vector<std::int64_t> bytes_shape(std::size_t bytes) {
  return {static_cast<std::int64_t>(bytes)};
}
}  // namespace

class ShapeModule::ShapeUnit final : public Unit {
 public:
  ShapeUnit(const UnitShapes& shapes, const UnitMemory& memory, int index,
            std::vector<std::vector<Buffer>>& held)
      : shapes_(shapes), memory_(memory), index_(index), held_(held) {}

  const std::string& name() const override { return shapes_.name; }
  std::vector<ParamSpec> parameters() const override {
    std::vector<ParamSpec> specs;
    for (const ParamShape& param : shapes_.params) {
      specs.push_back({param.name, param.shape, Initializer::zeros()});
    }
    return specs;
  }
  std::vector<int> borrowed_units() const override { return shapes_.borrowed; }
  bool gradients_replace_parameters() const override {
    return shapes_.gradients_replace_parameters;
  }
  bool borrows_in_turn() const override { return shapes_.borrows_in_turn; }
  bool backward_reads_parameters() const override { return shapes_.backward_reads_parameters; }
  bool supports_selective_recompute() const override { return memory_.selective; }
  bool supports_split_backward() const override { return memory_.split_backward; }

  void forward(UnitContext& context) override {
    const bool selective = context.recompute_selectively();
    Buffer rebuilt;
    saved_ = context.allocate(selective ? memory_.selective_saved : memory_.saved,
                              Category::kActivations);
    if (selective) rebuilt = context.allocate(memory_.selective_rebuilt, Category::kActivations);
    Buffer workspace = context.allocate(
        selective ? memory_.selective_forward_workspace : memory_.forward_workspace,
        Category::kWorkspace);
    borrow_in_turn(context, false);
    context.make_output(bytes_shape(memory_.output), DType::kInt8);
    stream_workspace(context, memory_.forward_stream_scratch);
    // A first forward that backward does not follow (full recomputation) keeps nothing.
    if (!context.backward_follows()) context.release(std::move(saved_));
    context.release(std::move(rebuilt));
    context.release(std::move(workspace));
  }

  void recompute(UnitContext& context) override {
    rebuilt_ = context.allocate(memory_.selective_rebuilt, Category::kActivations);
    context.release(context.allocate(memory_.rebuild_workspace, Category::kWorkspace));
    stream_workspace(context, memory_.rebuild_stream_scratch);
  }

  void backward(UnitContext& context) override {
    if (memory_.grad_input > 0) {
      context.make_grad_input(bytes_shape(memory_.grad_input), DType::kInt8);
    }
    Buffer workspace = context.allocate(backward_workspace(context), Category::kWorkspace);
    borrow_in_turn(context, true);
    // A gradient that lives in its gather slot is made at the unit's first ask, after its own
    // allocations; every other gradient target exists already and these ask for nothing.
    if (!shapes_.params.empty()) context.grad(0);
    if (!shapes_.borrows_in_turn) {
      for (std::size_t b = 0; b < shapes_.borrowed.size(); ++b) context.borrowed_grad(b, 0);
    }
    stream_workspace(context, memory_.backward_stream_scratch);
    release_saved(context);
    context.release(std::move(rebuilt_));
    context.release(std::move(workspace));
  }

  // What the weight gradient reads is kept (with the backward workspace where the unit keeps
  // it), then the input gradient is made; backward_weight frees what was kept with `saved`.
  void backward_input(UnitContext& context) override {
    std::size_t kept = memory_.split_kept;
    if (memory_.split_keeps_workspace) kept += backward_workspace(context);
    kept_ = context.allocate(kept, Category::kActivations);
    if (memory_.grad_input > 0) {
      context.make_grad_input(bytes_shape(memory_.grad_input), DType::kInt8);
    }
    stream_workspace(context, memory_.backward_stream_scratch);
  }

  void backward_weight(UnitContext& context) override {
    stream_workspace(context, memory_.backward_stream_scratch);
    if (!shapes_.params.empty()) context.grad(0);
    context.release(std::move(kept_));
    release_saved(context);
  }

 private:
  // On the CUDA device, attention's scratch comes from the stream (stream_workspace), not the
  // call's workspace (UnitMemory::backward_workspace_cpu_only).
  std::size_t backward_workspace(UnitContext& context) const {
    const bool cuda = context.device().kind() == DeviceKind::kCuda;
    return memory_.backward_workspace - (cuda ? memory_.backward_workspace_cpu_only : 0);
  }

  // What the call's CUDA kernels take from the compute stream (CudaStream::workspace), which
  // the shape-only device's stream charges in their place; nothing on the CPU device.
  static void stream_workspace(UnitContext& context, std::size_t bytes) {
    if (auto* stream = dynamic_cast<shape::ShapeStream*>(&context.stream())) {
      stream->workspace(bytes);
    }
  }

  // A unit that borrows in turn reads each borrowed unit alone: forward in order, backward in
  // reverse (the GPT's head tied to the vocabulary pieces).
  void borrow_in_turn(UnitContext& context, bool backward) {
    if (!shapes_.borrows_in_turn) return;
    const std::size_t count = shapes_.borrowed.size();
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t b = backward ? count - 1 - i : i;
      context.borrowed_param(b, 0);
      context.unpin_borrowed(b);
    }
  }

  // The saved activations go with this backward, or with that of the unit that frees them
  // (UnitMemory::saved_freed_by), with what later units left for this one.
  void release_saved(UnitContext& context) {
    const int freed_by = memory_.saved_freed_by;
    if (freed_by >= 0 && freed_by != index_) {
      held_.at(static_cast<std::size_t>(freed_by)).push_back(std::move(saved_));
    } else {
      context.release(std::move(saved_));
    }
    for (Buffer& held : held_.at(static_cast<std::size_t>(index_))) {
      context.release(std::move(held));
    }
    held_.at(static_cast<std::size_t>(index_)).clear();
  }

  const UnitShapes& shapes_;
  const UnitMemory memory_;
  const int index_;
  std::vector<std::vector<Buffer>>& held_;
  Buffer saved_;    // forward to backward
  Buffer rebuilt_;  // recompute() to backward
  Buffer kept_;     // split backward: backward_input to backward_weight
};

ShapeModule::ShapeModule(const PeakPlanInput& input, Communicator* tensor_parallel_group)
    : tensor_parallel_group_(tensor_parallel_group), held_(input.model.units.size()) {
  for (std::size_t u = 0; u < input.model.units.size(); ++u) {
    const UnitMemory memory = u < input.units.size() ? input.units[u] : UnitMemory{};
    units_.push_back(std::make_unique<ShapeUnit>(input.model.units[u], memory,
                                                 static_cast<int>(u), held_));
  }
}

ShapeModule::~ShapeModule() = default;

ShapeBatch::ShapeBatch(std::size_t row_bytes, std::int64_t rows) {
  // At least a byte: an address, so the rows are counted even where they hold nothing.
  held_ = loader_.allocate(std::max<std::size_t>(row_bytes * static_cast<std::size_t>(rows), 1),
                           Category::kActivations);
  batch_.inputs = {held_.data(), {rows, static_cast<std::int64_t>(row_bytes)}, DType::kInt8};
}

OptimizerOptions shape_optimizer(std::size_t states) {
  OptimizerOptions options;
  if (states != 2) options.type = "SGD";
  if (states == 1) options.momentum = 0.9f;
  return options;
}

std::vector<Unit*> ShapeModule::units() {
  std::vector<Unit*> units;
  for (auto& unit : units_) units.push_back(unit.get());
  return units;
}

}  // namespace zest
