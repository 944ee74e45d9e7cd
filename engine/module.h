// The contract between a model and the engine. A Module is an ordered list of units; a unit is
// what is gathered and reduced together (one transformer block, the embedding, an
// MLP layer). A unit declares its parameters and runs forward and backward by enqueuing work on
// the context's stream; it never allocates its parameters or gradients — the engine owns them
// in flat buffers and hands the unit views. Invariants a unit author must keep:
//   - all work goes on ctx.stream(); the host returns at once (work runs in stream order);
//   - gradients are ACCUMULATED (+=) into ctx.grad(i): the engine zeroes them, and tied weights
//     and micro-batches add up;
//   - a Buffer used by enqueued work is handed to ctx.release(...) when done, never freed on the
//     host while the stream may still read it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory/allocator.h"
#include "memory/tensor.h"
#include "engine/unit_memory.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/stream.h"

namespace zest {

// How a parameter starts. Drawn from the engine's seeded generator in flat order on every
// rank, so the initial model is the same whatever the world size or stage.
struct Initializer {
  enum class Kind { kZeros, kOnes, kNormal, kUniform };
  Kind kind = Kind::kZeros;
  float a = 0.0f;  // normal: std; uniform: low
  float b = 0.0f;  // uniform: high

  static Initializer zeros() { return {Kind::kZeros, 0, 0}; }
  static Initializer ones() { return {Kind::kOnes, 0, 0}; }
  static Initializer normal(float std) { return {Kind::kNormal, std, 0}; }
  static Initializer uniform(float low, float high) { return {Kind::kUniform, low, high}; }
};

struct ParamSpec {
  std::string name;  // unique within its unit; the full name is "<unit>.<name>"
  std::vector<std::int64_t> shape;
  Initializer init;
  bool weight_decay = true;  // false for biases and norms (parameters of rank < 2)
  // Whose initial values it takes (engine/parameter_init.h): draw_unit -1 draws as itself. A
  // parameter cut from a larger one (a vocabulary piece) draws as parameter draw_param of unit
  // draw_unit from its element draw_first on, so the initial model does not depend on the cut.
  int draw_unit = -1;
  int draw_param = 0;
  std::int64_t draw_first = 0;
  // A tensor-parallel slice (models/tensor_parallel_gpt.h) draws as the block of the whole
  // parameter it was cut from, so that its values are the tensor-parallel-1 model's. Its row i
  // (the last dimension is the columns; a vector is one column) is row
  // (i / row_block) x row_stride + row_first + i % row_block of the whole parameter, which is
  // full_columns wide, and its columns start at column_first. full_columns 0: not a slice.
  struct DrawSlice {
    std::int64_t full_columns = 0;
    std::int64_t column_first = 0;
    std::int64_t row_block = 1;
    std::int64_t row_stride = 0;
    std::int64_t row_first = 0;
    bool enabled() const { return full_columns > 0; }
  };
  DrawSlice draw_slice{};
  // false: another rank holds the same values and counts them in the global gradient norm (a
  // LayerNorm replicated across a tensor-parallel group is counted by its first rank only).
  bool norm_counted = true;
};

// One global batch slice: what this rank computes on in one micro-batch.
struct Batch {
  Tensor inputs;   // e.g. float [B, features] or int32 tokens [B, T]
  Tensor targets;  // e.g. int32 class ids [B] or next tokens [B, T]
};

// What the engine gives a unit for one forward or backward call.
class UnitContext {
 public:
  virtual ~UnitContext() = default;

  virtual Stream& stream() = 0;  // the rank's compute stream
  virtual Device& device() = 0;
  virtual const Batch& batch() = 0;

  // Views of this unit's gathered parameters and (backward only) gradients, in declaration order.
  virtual Tensor param(std::size_t index) = 0;
  virtual Tensor grad(std::size_t index) = 0;
  // Views of a borrowed unit's parameters / gradients (tied weights); `borrowed` indexes
  // Unit::borrowed_units().
  virtual Tensor borrowed_param(std::size_t borrowed, std::size_t index) = 0;
  virtual Tensor borrowed_grad(std::size_t borrowed, std::size_t index) = 0;
  // A unit that borrows in turn (Unit::borrows_in_turn) is done with borrowed unit `borrowed`:
  // its parameters (and a 2-byte model's fp32 copy of them) may go once the work enqueued so
  // far has read them. Asking for them again pins them again. The engine unpins at the end of
  // the call whatever is still pinned.
  virtual void unpin_borrowed(std::size_t borrowed) { (void)borrowed; }

  // Forward and backward: the previous unit's output (for the first unit, batch().inputs). The
  // engine keeps it alive until this unit's backward has run, so a unit need not copy its input.
  virtual Tensor input() = 0;
  // Forward: allocates this unit's output (charged to activations; the engine frees it after
  // the next unit's backward).
  virtual Tensor make_output(const std::vector<std::int64_t>& shape, DType dtype) = 0;
  // Forward, last unit only: a device scalar (float) the unit writes the micro-batch's mean loss to.
  virtual float* loss() = 0;
  // Forward: false when no backward will follow (evaluation). A unit then releases what it
  // would keep for backward as soon as its forward is enqueued, so evaluating never holds a
  // second copy of the activations.
  virtual bool backward_follows() { return true; }
  // Forward, when backward follows: true when the engine will call Unit::recompute() before this
  // unit's backward (selective recomputation). A unit then keeps only what it cannot rebuild
  // cheaply and releases the rest when its forward is enqueued.
  virtual bool recompute_selectively() { return false; }

  // Backward: the gradient of this unit's output (empty for the last unit, whose backward starts
  // from its loss scaled by loss_scale()).
  virtual Tensor grad_output() = 0;
  // Backward: allocates the gradient of this unit's input (not called by the first unit).
  virtual Tensor make_grad_input(const std::vector<std::int64_t>& shape, DType dtype) = 0;
  // The factor the last unit multiplies d(loss) by: loss scaling and 1/gradient-accumulation.
  virtual float loss_scale() = 0;

  // Memory a unit keeps between forward and backward (category activations) or uses inside one
  // call (workspace).
  virtual Buffer allocate(std::size_t bytes, Category category) = 0;
  // Frees `buffer` after the work enqueued so far on stream() has run.
  virtual void release(Buffer buffer) = 0;
};

class Unit {
 public:
  virtual ~Unit() = default;

  virtual const std::string& name() const = 0;
  virtual std::vector<ParamSpec> parameters() const = 0;
  // Indices (into Module::units()) of earlier units whose parameters this unit also reads and
  // whose gradients it accumulates into: a language model head tied to the embedding.
  virtual std::vector<int> borrowed_units() const { return {}; }
  // Whether every call that writes this unit's gradients (its backward, and the backward of the
  // units that borrow it) reads its parameters only before it first asks for those gradients
  // (grad() / borrowed_grad()). Stage 3 may then put the gradients where the gathered parameters
  // were, instead of in a bucket of their own: an embedding, whose backward reads no parameter,
  // tied to a head that multiplies by it before it asks for its gradient.
  virtual bool gradients_replace_parameters() const { return false; }
  // Whether this unit reads its borrowed units one at a time: the engine then pins a borrowed
  // unit at its first borrowed_param() / borrowed_grad() instead of before the call, and the
  // unit hands it back with UnitContext::unpin_borrowed(), so that at stage 3 the unit needs one
  // gather slot of a size class, not one per borrowed unit (a head tied to an embedding in
  // vocabulary pieces). Such a unit's borrowed units must not declare
  // gradients_replace_parameters (their slot comes and goes within the call).
  virtual bool borrows_in_turn() const { return false; }
  // Whether this unit's backward reads its own parameters (param()). A unit whose backward does
  // not (a vocabulary piece: its rows' gradient needs only d(out) and the head's saved values)
  // is not gathered for its backward at stage 3, unless it is recomputed there.
  virtual bool backward_reads_parameters() const { return true; }

  virtual void forward(UnitContext& context) = 0;
  virtual void backward(UnitContext& context) = 0;

  // Selective recomputation (engine/recompute.h). A unit that returns true keeps only part of
  // what backward reads when context.recompute_selectively() says so, and recompute() rebuilds
  // the rest before backward, bit for bit: the same kernels on the same inputs. Its
  // UnitMemory::selective_* fields say the bytes. Full recomputation needs nothing from a unit.
  virtual bool supports_selective_recompute() const { return false; }
  virtual void recompute(UnitContext& context) { (void)context; }

  // Split backward (zero-bubble pipeline schedules, pipeline/schedule.h): backward_input makes
  // the input's gradient (make_grad_input) and may accumulate some parameter gradients;
  // backward_weight, called later for the same micro-batch on the same Unit object — with other
  // micro-batches' calls on other objects in between — accumulates the rest. Together they do
  // what backward() does, bit for bit. Between the two, the engine keeps the unit's input and
  // parameters' gradients target; grad_output() is valid only in backward_input, so a unit keeps
  // what its weight gradient needs from it. A unit without it runs backward() where the input
  // gradient is scheduled.
  virtual bool supports_split_backward() const { return false; }
  virtual void backward_input(UnitContext& context) { backward(context); }
  virtual void backward_weight(UnitContext& context) { (void)context; }
};

class Module {
 public:
  virtual ~Module() = default;
  // In forward order. The module owns them; the pointers stay valid for its lifetime.
  virtual std::vector<Unit*> units() = 0;
  // Per unit, in forward order: what forward and backward allocate for a micro-batch whose
  // inputs have `input_shape` (planner/peak_plan.h). Empty when the module does not say: the
  // planner then predicts the model state, gathers and buckets only.
  virtual std::vector<UnitMemory> unit_memory(const std::vector<std::int64_t>& input_shape) const {
    (void)input_shape;
    return {};
  }
  // The index unit `unit` draws its initial values under (engine/parameter_init.h): its place in
  // the whole model. A part of a model (engine/sub_module.h: a pipeline stage's units) keeps the
  // whole model's indices, so that its initial values equal the single-rank run's.
  virtual int initialization_index(std::size_t unit) const { return static_cast<int>(unit); }
  // The group of ranks this module's units split their layers across (tensor parallelism), whose
  // collectives the units run on the compute stream; null: none. The engine sums the gradient
  // norm (Parameters with norm_counted false left out) and agrees on an overflow over it too.
  virtual Communicator* tensor_parallel_group() const { return nullptr; }
  // Whether unit `unit` is a copy of a unit another pipeline stage trains, held here only to lend
  // its parameters to later units (the tied embedding on the last pipeline stage): the engine runs
  // no forward or backward of it and leaves it out of the gradient norm, but reduces and updates
  // it.
  virtual bool holds_copy(std::size_t unit) const {
    (void)unit;
    return false;
  }
};

}  // namespace zest
