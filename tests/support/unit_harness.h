// A test-only driver that runs a Module's units without the engine: it implements UnitContext
// over a CpuDevice, allocates each unit's parameters and gradients itself (initialized as the
// engine does, from engine/parameter_init.h), runs forward over all units and backward in reverse
// on one stream, keeps outputs and input gradients alive until the step is done, then
// synchronizes. Invariant: gradients accumulate across run() calls until zero_grads().
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "memory/allocator.h"
#include "engine/module.h"
#include "engine/parameter_init.h"
#include "runtime/cpu_device.h"

namespace zest::testing {

class UnitHarness {
 public:
  explicit UnitHarness(Module& module, std::uint64_t seed = 1234,
                       std::size_t capacity = kUnlimitedCapacity)
      : device_(0, capacity), stream_(device_.create_stream("compute")) {
    loss_ = device_.allocator().allocate(sizeof(float), Category::kWorkspace);
    for (Unit* unit : module.units()) add_unit(*unit, seed);
  }

  // Nothing enqueued may still read the buffers freed below; a failure was reported by run().
  ~UnitHarness() {
    try {
      stream_->synchronize();
    } catch (const std::exception&) {
    }
  }

  // One micro-batch: forward over every unit, backward in reverse, synchronize. Returns the loss
  // the last unit wrote. Gradients are added to what the grads already hold.
  float run(const Batch& batch);

  void zero_grads() {
    for (UnitState& state : units_) {
      for (Buffer& grad : state.grads) device_.fill_zero(*stream_, grad.data(), grad.bytes());
    }
    stream_->synchronize();
  }

  void set_loss_scale(float scale) { loss_scale_ = scale; }

  std::size_t unit_count() const { return units_.size(); }
  const std::vector<ParamSpec>& specs(std::size_t unit) const { return units_.at(unit).specs; }
  Tensor param(std::size_t unit, std::size_t index) { return view(units_.at(unit), index, false); }
  Tensor grad(std::size_t unit, std::size_t index) { return view(units_.at(unit), index, true); }
  // The gradient of `unit`'s input from the last run(); empty if the unit made none.
  const std::vector<float>& grad_input(std::size_t unit) const {
    return units_.at(unit).grad_input_copy;
  }

  cpu::CpuDevice& device() { return device_; }
  Stream& stream() { return *stream_; }

 private:
  struct UnitState {
    Unit* unit = nullptr;
    std::vector<ParamSpec> specs;
    std::vector<Buffer> params, grads;
    Buffer output, grad_input;
    Tensor output_view, grad_input_view;
    std::vector<float> grad_input_copy;
  };

  class Context;

  void add_unit(Unit& unit, std::uint64_t seed) {
    UnitState state;
    state.unit = &unit;
    state.specs = unit.parameters();
    const int index = static_cast<int>(units_.size());
    for (std::size_t p = 0; p < state.specs.size(); ++p) {
      const ParamSpec& spec = state.specs[p];
      const std::size_t count = Tensor{nullptr, spec.shape, DType::kFloat32}.numel();
      state.params.push_back(
          device_.allocator().allocate(count * sizeof(float), Category::kParams));
      state.grads.push_back(device_.allocator().allocate(count * sizeof(float), Category::kGrads));
      fill_initial_values(spec.init, seed, index, p, 0, count, state.params.back().as<float>());
      device_.fill_zero(*stream_, state.grads.back().data(), state.grads.back().bytes());
    }
    units_.push_back(std::move(state));
    stream_->synchronize();
  }

  Tensor view(UnitState& state, std::size_t index, bool grad) {
    Buffer& buffer = (grad ? state.grads : state.params).at(index);
    return Tensor{buffer.data(), state.specs.at(index).shape, DType::kFloat32};
  }

  // Waits for the stream, keeps a copy of each input gradient, frees what the step allocated.
  float finish() {
    stream_->synchronize();
    released_.clear();
    for (UnitState& state : units_) {
      const float* data = state.grad_input_view.as<const float>();
      state.grad_input_copy.assign(data, data + (data ? state.grad_input_view.numel() : 0));
      state.output.reset();
      state.grad_input.reset();
      state.output_view = {};
      state.grad_input_view = {};
    }
    return *loss_.as<float>();
  }

  Tensor allocate_view(Buffer& buffer, Tensor& view, const std::vector<std::int64_t>& shape,
                       DType dtype) {
    view = Tensor{nullptr, shape, dtype};
    buffer = device_.allocator().allocate(view.bytes(), Category::kActivations);
    view.data = buffer.data();
    return view;
  }

  cpu::CpuDevice device_;
  std::unique_ptr<Stream> stream_;
  std::vector<UnitState> units_;
  std::vector<Buffer> released_;  // freed after the stream has drained, in finish()
  Buffer loss_;
  float loss_scale_ = 1.0f;
};

class UnitHarness::Context final : public UnitContext {
 public:
  Context(UnitHarness& harness, std::size_t index, const Batch& batch, bool backward)
      : h_(harness), index_(index), batch_(batch), backward_(backward) {}

  Stream& stream() override { return *h_.stream_; }
  Device& device() override { return h_.device_; }
  const Batch& batch() override { return batch_; }

  Tensor param(std::size_t index) override { return h_.view(self(), index, false); }
  Tensor grad(std::size_t index) override {
    require(backward_, "grad() is for backward");
    return h_.view(self(), index, true);
  }
  Tensor borrowed_param(std::size_t borrowed, std::size_t index) override {
    return h_.view(borrowed_unit(borrowed), index, false);
  }
  Tensor borrowed_grad(std::size_t borrowed, std::size_t index) override {
    require(backward_, "borrowed_grad() is for backward");
    return h_.view(borrowed_unit(borrowed), index, true);
  }

  Tensor input() override {
    return index_ == 0 ? batch_.inputs : h_.units_[index_ - 1].output_view;
  }
  Tensor make_output(const std::vector<std::int64_t>& shape, DType dtype) override {
    require(!backward_, "make_output() is for forward");
    return h_.allocate_view(self().output, self().output_view, shape, dtype);
  }
  float* loss() override {
    require(last(), "loss() is for the last unit");
    return h_.loss_.as<float>();
  }

  Tensor grad_output() override {
    require(backward_, "grad_output() is for backward");
    return last() ? Tensor{} : h_.units_[index_ + 1].grad_input_view;
  }
  Tensor make_grad_input(const std::vector<std::int64_t>& shape, DType dtype) override {
    require(backward_, "make_grad_input() is for backward");
    return h_.allocate_view(self().grad_input, self().grad_input_view, shape, dtype);
  }
  float loss_scale() override { return h_.loss_scale_; }

  Buffer allocate(std::size_t bytes, Category category) override {
    return h_.device_.allocator().allocate(bytes, category);
  }
  void release(Buffer buffer) override { h_.released_.push_back(std::move(buffer)); }

 private:
  UnitState& self() { return h_.units_[index_]; }
  bool last() const { return index_ + 1 == h_.units_.size(); }
  UnitState& borrowed_unit(std::size_t borrowed) {
    const std::vector<int> borrowed_units = self().unit->borrowed_units();
    return h_.units_.at(static_cast<std::size_t>(borrowed_units.at(borrowed)));
  }
  void require(bool ok, const std::string& what) const {
    if (!ok) {
      throw Error(ErrorKind::kUsage,
                  "unit '" + h_.units_[index_].unit->name() + "': " + what + " (unit harness)");
    }
  }

  UnitHarness& h_;
  std::size_t index_;
  const Batch& batch_;
  bool backward_;
};

inline float UnitHarness::run(const Batch& batch) {
  for (std::size_t u = 0; u < units_.size(); ++u) {
    Context context(*this, u, batch, /*backward=*/false);
    units_[u].unit->forward(context);
  }
  for (std::size_t u = units_.size(); u-- > 0;) {
    Context context(*this, u, batch, /*backward=*/true);
    units_[u].unit->backward(context);
  }
  return finish();
}

}  // namespace zest::testing
