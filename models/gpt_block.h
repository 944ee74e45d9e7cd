// One pre-LN GPT-2 transformer block as a unit (models/gpt.h builds them):
//   x1 = x + c_proj(attn(c_attn(ln_1(x)))),   out = x1 + mlp.c_proj(gelu(mlp.c_fc(ln_2(x1)))).
// Weights are [out, in] as torch.nn.Linear (y = x Wᵀ + b). Forward keeps what backward reads in
// one activations buffer that backward releases (forward releases it itself when no backward
// follows: evaluation), or under selective recomputation only part of it, the rest rebuilt by
// recompute(). Invariant: input and output are float32 [B, T, n_embd].
//
// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): a block built with a TensorSlice of
// size t > 1 is rank r's part of the whole block: heads [r·H/t, (r+1)·H/t) — its rows of the
// column-parallel c_attn (q, k and v each) and mlp.c_fc, its columns of the row-parallel
// attn.c_proj and mlp.c_proj — and a whole copy of the LayerNorms and the row-parallel biases.
// Forward all-reduces the two row-parallel products' partial sums; backward all-reduces the
// gradients of the two LayerNorm outputs that the column-parallel products' inputs were, on the
// compute stream in stream order. With sequence parallelism (models/tensor_slice.h) the input,
// output, LayerNorms and residual additions hold the rank's rows only: the LayerNorm outputs are
// all-gathered before the column-parallel products (again in backward, not kept whole), the
// partial sums reduce-scattered, and the gradients of the LayerNorms and the row-parallel biases,
// which each rank computes from its own rows, summed across the group. Its parameters draw as the
// slices of the whole block's values (ParamSpec::DrawSlice), so the group computes what the whole
// block computes, up to the order of the sums. Size 1 (the default) is the whole block: no
// collective, the same kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/module.h"
#include "kernels/attention.h"
#include "memory/allocator.h"
#include "models/gpt.h"
#include "models/tensor_slice.h"

namespace zest {

class GptBlock final : public Unit {
 public:
  GptBlock(int index, const GptConfig& config, TensorSlice slice = {});

  const std::string& name() const override { return name_; }
  std::vector<ParamSpec> parameters() const override;
  void forward(UnitContext& context) override;
  void backward(UnitContext& context) override;
  // Selective recomputation and split backward: the whole block's (tensor-parallel size 1) only.
  bool supports_selective_recompute() const override { return slice_.size == 1; }
  void recompute(UnitContext& context) override;
  // Split backward (zero-bubble pipeline schedules): the input gradient first — it also makes
  // the LayerNorms' parameter gradients, one kernel with it, kept here — then the matmuls'
  // weight and bias gradients from the kept gradients of the block's intermediate values.
  bool supports_split_backward() const override { return slice_.size == 1; }
  void backward_input(UnitContext& context) override;
  void backward_weight(UnitContext& context) override;
  // What one block's forward and backward allocate for tokens [batch, seq] (the whole
  // sequence: a sequence-parallel slice's input holds seq / slice.size of its tokens), as the
  // block built with `slice` allocates it.
  static UnitMemory memory(const GptConfig& config, std::int64_t batch, std::int64_t seq,
                           const TensorSlice& slice = {});

 private:
  AttentionShape attention_shape(std::int64_t batch, std::int64_t seq) const;
  // A row-parallel product y Wᵀ (+ bias + residual) into the rank's rows of `out`, summed across
  // the group; `partial` [N, C] is scratch under sequence parallelism.
  void row_parallel_forward(Stream& stream, const float* y, const float* weight, const float* bias,
                            const float* residual, std::int64_t rows, std::int64_t inner,
                            float* partial, float* out) const;

  const std::string name_;
  const GptConfig config_;
  const TensorSlice slice_;
  Buffer saved_;  // category activations, from forward to backward
  // Selective recomputation: saved_ holds only the kept activations; rebuilt_ the rest, from
  // recompute() to the end of backward.
  Buffer rebuilt_;
  bool selective_ = false;
  std::int64_t saved_batch_ = 0;
  std::int64_t saved_seq_ = 0;
  // From backward_input to backward_weight (category activations): the backward's workspace
  // (d of x1, h, qkv), and the output's gradient with the LayerNorms' parameter gradients.
  Buffer split_workspace_;
  Buffer split_kept_;
};

}  // namespace zest
