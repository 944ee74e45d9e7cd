// A contiguous run of a Module's units, [begin, end), as a Module of its own: what one pipeline
// stage (or one model chunk of it) trains. Each unit keeps the whole model's index for its
// initial values (Module::initialization_index), so the part starts exactly as the single-rank
// model does, and borrowed_units() are remapped to the part's indices. A unit of the range that
// borrows a unit before the range (GPT's head borrows the embedding) gets a copy of the lender,
// placed first (Module::holds_copy): Megatron's way of tying the embedding across the first and
// last stage — same initial values, the two gradients summed before either stage's update
// (pipeline/pipeline_trainer.h), so the copies stay identical. Invariant: the whole module
// outlives the part, and the part's units are the whole's objects (views, not copies).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/module.h"

namespace zest {

class SubModule final : public Module {
 public:
  // A kUsage Error when the range is empty or outside the module.
  SubModule(Module& whole, std::size_t begin, std::size_t end);
  ~SubModule() override;

  std::vector<Unit*> units() override;
  int initialization_index(std::size_t unit) const override;
  bool holds_copy(std::size_t unit) const override { return unit < copies_; }
  // The whole model's: a part of a tensor-parallel model is split across the same group.
  Communicator* tensor_parallel_group() const override { return tensor_parallel_group_; }

  // The whole model's index of each unit here, copies first.
  const std::vector<int>& whole_indices() const { return whole_; }
  // How many lent copies come first.
  std::size_t copies() const { return copies_; }

 private:
  class View;
  std::vector<std::unique_ptr<View>> views_;
  std::vector<int> whole_;
  std::size_t copies_ = 0;
  Communicator* tensor_parallel_group_ = nullptr;
};

}  // namespace zest
