// GPT-2 split across the ranks of a tensor-parallel group (Megatron-LM's tensor parallelism):
// the same units as models/gpt.h ("embedding", "block0".., "head"), each rank holding its slice.
// The embedding is vocabulary-parallel (rank r holds wte rows [r·V/t, (r+1)·V/t) and a copy of
// wpe; the group all-reduces the rows it looked up); the blocks are models/gpt_block.h;
// the head, tied to the rank's wte rows, computes its columns of the logits and a
// vocabulary-parallel cross-entropy (kernels/vocab_parallel_cross_entropy.h: the row maxima
// all-gathered, the exp-sums and target logits all-reduced), so the [N, V] logits are never
// whole on any rank. Every parameter draws as its slice of the tensor-parallel-1 model's
// (ParamSpec::DrawSlice): with the same seed and data the group trains the same model up to the
// order of sums. With sequence parallelism (TensorSlice::sequence_parallel, models/tensor_slice.h)
// the embedding reduce-scatters its rows instead of all-reducing them, and the head's ln_f works
// on the rank's rows, gathered before the logits. Invariant: every rank of the group gets the same
// batch and computes the same loss; the ZeRO engine shards each rank's units within its
// data-parallel group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/module.h"
#include "models/gpt.h"
#include "models/gpt_block.h"

namespace zest {

// Throws a kConfig Error naming "model.<key>" when the heads, the vocabulary or the width do not
// divide among `size` ranks, or "tensor_parallel.size" when size < 1; validate(config) first.
void validate_tensor_parallel(const GptConfig& config, int size);

class TensorParallelGpt final : public Module {
 public:
  // `slice.group` has slice.size ranks, this one slice.rank; it outlives the model.
  TensorParallelGpt(GptConfig config, TensorSlice slice);
  ~TensorParallelGpt() override;

  std::vector<Unit*> units() override;
  // input_shape: tokens [B, T], the whole sequence, as every rank of the group is given them.
  // What this rank's units allocate (the ranks of a group differ only in the embedding's
  // forward workspace: a rank other than the first holds a zero base too).
  std::vector<UnitMemory> unit_memory(const std::vector<std::int64_t>& input_shape) const override;
  Communicator* tensor_parallel_group() const override { return slice_.group; }
  const GptConfig& config() const { return config_; }
  const TensorSlice& slice() const { return slice_; }

 private:
  GptConfig config_;
  TensorSlice slice_;
  std::vector<std::unique_ptr<Unit>> units_;
};

}  // namespace zest
