// One micro-batch's pass through a ZeroTrainer's units: the Unit objects that run it and what
// each unit keeps from its forward to its backward in engine memory (its output, and the
// gradient of its input once its backward made it). A caller that keeps several micro-batches in
// flight (a pipeline stage's runner, pipeline/stage_runner.h) holds one pass per micro-batch and
// makes each on its own Unit objects, since a unit keeps what its backward reads in itself.
// Invariant: a pass is made by the trainer that runs it (ZeroTrainer::make_pass) and lives until
// its last backward call has been enqueued; the buffers it still holds then are handed out with
// take_output / take_grad_input or released in stream order (ZeroTrainer::release_pass).
#pragma once

#include <cstddef>
#include <vector>

#include "engine/module.h"
#include "memory/allocator.h"
#include "memory/tensor.h"

namespace zest {

class ZeroTrainer;

class MicroBatchPass {
 public:
  MicroBatchPass() = default;

  // The last unit's output after the forward: what the pass hands on (empty when the last unit
  // is the loss, or before the forward).
  Tensor output() const { return activations_.empty() ? Tensor{} : activations_.back().output_view; }
  // The gradient of the last unit's output, made outside the trainer (a later pipeline stage's);
  // empty on the loss unit. It must stay valid until the last unit's backward has been enqueued.
  void set_grad_output(const Tensor& grad_output) { grad_output_ = grad_output; }
  // Hands the last unit's output out with the buffer that owns it (empty tensor when none).
  Tensor take_output(Buffer& owner);
  // Hands the gradient of the first computing unit's input out with its buffer (empty when its
  // input is tokens, which have no gradient).
  Tensor take_grad_input(Buffer& owner);

 private:
  friend class ZeroTrainer;
  struct UnitActivations {
    Buffer output;      // this unit's forward output
    Buffer grad_input;  // the gradient of this unit's input, made in backward
    Tensor output_view;
    Tensor grad_input_view;
  };

  std::vector<Unit*> units_;  // per flat unit of the trainer, owned by a Module
  std::vector<UnitActivations> activations_;
  std::size_t first_computing_ = 0;  // lent copies come first and run nothing
  Tensor grad_output_;
  bool evaluating_ = false;         // forward only: units keep nothing for a backward
  std::size_t recomputed_calls_ = 0;  // since the pass's forward began (kRecomputeLag)
};

}  // namespace zest
