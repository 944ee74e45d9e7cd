// One pre-LN GPT-2 block split across the ranks of a tensor-parallel group (Megatron-LM,
// Shoeybi et al. 2019): rank r of t holds heads [r·H/t, (r+1)·H/t) — its rows of the
// column-parallel c_attn (q, k and v each) and mlp.c_fc, its columns of the row-parallel
// attn.c_proj and mlp.c_proj — and a whole copy of the LayerNorms and the row-parallel biases.
// Forward all-reduces the two row-parallel products' partial sums; backward all-reduces the
// gradients of the two LayerNorm outputs that the column-parallel products' inputs were. The
// collectives run on the compute stream in stream order. Parameters are named and ordered as
// GptBlock's (models/gpt_block.h) and draw as the slices of its values (ParamSpec::DrawSlice),
// so the group computes what the whole block computes, up to the order of the sums. Invariant:
// input and output are float32 [B, T, n_embd], the same on every rank of the group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/module.h"
#include "memory/allocator.h"
#include "models/gpt.h"
#include "runtime/communicator.h"

namespace zest {

// Where a rank sits in its tensor-parallel group, and the group (borrowed: it outlives the model).
struct TensorSlice {
  int rank = 0;
  int size = 1;
  Communicator* group = nullptr;
};

class TensorParallelBlock final : public Unit {
 public:
  TensorParallelBlock(int index, const GptConfig& config, TensorSlice slice);

  const std::string& name() const override { return name_; }
  std::vector<ParamSpec> parameters() const override;
  void forward(UnitContext& context) override;
  void backward(UnitContext& context) override;

 private:
  const std::string name_;
  const GptConfig config_;
  const TensorSlice slice_;
  Buffer saved_;  // category activations, from forward to backward
  std::int64_t saved_batch_ = 0;
  std::int64_t saved_seq_ = 0;
};

}  // namespace zest
