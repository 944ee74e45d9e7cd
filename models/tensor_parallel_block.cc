#include "models/tensor_parallel_block.h"

#include <cmath>
#include <utility>

#include "base/error.h"
#include "models/describe_tensor.h"
#include "models/gpt_block_layout.h"
#include "kernels/attention.h"
#include "kernels/bias.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/matmul.h"

namespace zest {
namespace {

using namespace gpt_block_layout;

// The slice of a whole [rows, columns] parameter (a vector: columns 1) that rank `rank` holds.
ParamSpec::DrawSlice rows_of(std::int64_t columns, std::int64_t block, std::int64_t stride,
                             std::int64_t first) {
  return {columns, 0, block, stride, first};
}
ParamSpec::DrawSlice columns_of(std::int64_t rows, std::int64_t columns, std::int64_t first) {
  return {columns, first, rows, 0, 0};
}

}  // namespace

TensorParallelBlock::TensorParallelBlock(int index, const GptConfig& config, TensorSlice slice)
    : name_("block" + std::to_string(index)), config_(config), slice_(slice) {}

std::vector<ParamSpec> TensorParallelBlock::parameters() const {
  const std::int64_t C = config_.n_embd;
  const std::int64_t Cl = C / slice_.size;
  const std::int64_t r = slice_.rank;
  const Initializer weight = Initializer::normal(0.02f);
  const Initializer residual =
      Initializer::normal(0.02f / std::sqrt(2.0f * static_cast<float>(config_.n_layer)));
  const Initializer ones = Initializer::ones();
  const Initializer zeros = Initializer::zeros();
  std::vector<ParamSpec> specs = {
      {"ln_1.weight", {C}, ones, false},          {"ln_1.bias", {C}, zeros, false},
      {"attn.c_attn.weight", {3 * Cl, C}, weight, true},
      {"attn.c_attn.bias", {3 * Cl}, zeros, false},
      {"attn.c_proj.weight", {C, Cl}, residual, true},
      {"attn.c_proj.bias", {C}, zeros, false},
      {"ln_2.weight", {C}, ones, false},          {"ln_2.bias", {C}, zeros, false},
      {"mlp.c_fc.weight", {4 * Cl, C}, weight, true},
      {"mlp.c_fc.bias", {4 * Cl}, zeros, false},
      {"mlp.c_proj.weight", {C, 4 * Cl}, residual, true},
      {"mlp.c_proj.bias", {C}, zeros, false},
  };
  // q, k and v: this rank's heads of each, C_l rows at r·C_l of each C rows.
  specs[kAttnWeight].draw_slice = rows_of(C, Cl, C, r * Cl);
  specs[kAttnBias].draw_slice = rows_of(1, Cl, C, r * Cl);
  specs[kAttnProjWeight].draw_slice = columns_of(C, C, r * Cl);
  specs[kFcWeight].draw_slice = rows_of(C, 4 * Cl, 0, r * 4 * Cl);
  specs[kFcBias].draw_slice = rows_of(1, 4 * Cl, 0, r * 4 * Cl);
  specs[kMlpProjWeight].draw_slice = columns_of(C, 4 * C, r * 4 * Cl);
  // Whole copies on every rank of the group: its first rank counts them in the norm.
  for (Param p : {kLn1Weight, kLn1Bias, kAttnProjBias, kLn2Weight, kLn2Bias, kMlpProjBias}) {
    specs[p].norm_counted = slice_.rank == 0;
  }
  return specs;
}

void TensorParallelBlock::forward(UnitContext& context) {
  const Tensor input = context.input();
  const std::int64_t C = config_.n_embd;
  if (input.dtype != DType::kFloat32 || input.rank() != 3 || input.dim(0) < 1 ||
      input.dim(1) < 1 || input.dim(1) > config_.seq_len || input.dim(2) != C || input.empty()) {
    throw Error(ErrorKind::kUsage, name_ + ": input must be float32 [B, T, " + std::to_string(C) +
                                       "] with 1 <= T <= " + std::to_string(config_.seq_len) +
                                       ", got " + describe_tensor(input));
  }
  const std::int64_t B = input.dim(0);
  const std::int64_t T = input.dim(1);
  const std::int64_t N = B * T;
  const std::int64_t Cl = C / slice_.size;
  const AttentionShape shape{B, T, config_.n_head / slice_.size, C / config_.n_head};
  const Saved at(shape, C);
  Stream& stream = context.stream();
  Communicator& group = *slice_.group;
  const bool first = slice_.rank == 0;
  auto param = [&context](Param p) { return context.param(p).as<const float>(); };

  if (!saved_.empty()) context.release(std::move(saved_));
  saved_ = context.allocate(at.total * sizeof(float), Category::kActivations);
  saved_batch_ = B;
  saved_seq_ = T;
  Buffer workspace = context.allocate(
      (static_cast<std::size_t>(3 * N * Cl) + shape.forward_scratch_elements()) * sizeof(float),
      Category::kWorkspace);
  float* s = saved_.as<float>();
  float* qkv = workspace.as<float>();
  float* scratch = qkv + 3 * N * Cl;
  const float* x = input.as<const float>();
  float* out = context.make_output({B, T, C}, DType::kFloat32).as<float>();
  const std::size_t nc = static_cast<std::size_t>(N * C);

  // Attention: x1 = x + c_proj.bias + Σ_ranks c_proj_r(attn(c_attn_r(ln_1(x)))).
  layernorm_forward(stream, x, param(kLn1Weight), param(kLn1Bias), N, C, kLayerNormEps,
                    s + at.ln1, s + at.mean1, s + at.rstd1);
  linear_forward(stream, s + at.ln1, param(kAttnWeight), param(kAttnBias), N, C, 3 * Cl, nullptr,
                 qkv);
  attention_forward(stream, shape, qkv, s + at.split, s + at.probs, s + at.y, scratch);
  // Note: the group's first rank adds the residual and the bias, the others their product only,
  // so the all-reduce adds each once.
  if (first) {
    linear_forward(stream, s + at.y, param(kAttnProjWeight), param(kAttnProjBias), N, Cl, C, x,
                   s + at.x1);
  } else {
    matmul(stream, false, true, N, C, Cl, 1.0f, s + at.y, param(kAttnProjWeight), 0.0f, s + at.x1);
  }
  group.label_next("tensor-parallel attention output");
  group.all_reduce(stream, s + at.x1, s + at.x1, nc, DType::kFloat32);

  // MLP: out = x1 + mlp.c_proj.bias + Σ_ranks mlp.c_proj_r(gelu(mlp.c_fc_r(ln_2(x1)))).
  layernorm_forward(stream, s + at.x1, param(kLn2Weight), param(kLn2Bias), N, C, kLayerNormEps,
                    s + at.ln2, s + at.mean2, s + at.rstd2);
  linear_gelu_forward(stream, s + at.ln2, param(kFcWeight), param(kFcBias), N, C, 4 * Cl,
                      s + at.h, s + at.g);
  if (first) {
    linear_forward(stream, s + at.g, param(kMlpProjWeight), param(kMlpProjBias), N, 4 * Cl, C,
                   s + at.x1, out);
  } else {
    matmul(stream, false, true, N, C, 4 * Cl, 1.0f, s + at.g, param(kMlpProjWeight), 0.0f, out);
  }
  group.label_next("tensor-parallel MLP output");
  group.all_reduce(stream, out, out, nc, DType::kFloat32);

  context.release(std::move(workspace));
  if (!context.backward_follows()) context.release(std::move(saved_));
}

void TensorParallelBlock::backward(UnitContext& context) {
  if (saved_.empty()) throw Error(ErrorKind::kUsage, name_ + ": backward without a forward");
  const std::int64_t B = saved_batch_;
  const std::int64_t T = saved_seq_;
  const std::int64_t C = config_.n_embd;
  const std::int64_t N = B * T;
  const std::int64_t Cl = C / slice_.size;
  const Tensor grad_output = context.grad_output();
  if (grad_output.dtype != DType::kFloat32 ||
      grad_output.shape != std::vector<std::int64_t>{B, T, C} || grad_output.empty()) {
    throw Error(ErrorKind::kUsage, name_ + ": grad_output must be float32 " +
                                       shape_to_string({B, T, C}) + ", got " +
                                       describe_tensor(grad_output));
  }
  const AttentionShape shape{B, T, config_.n_head / slice_.size, C / config_.n_head};
  const Saved at(shape, C);
  Stream& stream = context.stream();
  Device& device = context.device();
  Communicator& group = *slice_.group;
  auto param = [&context](Param p) { return context.param(p).as<const float>(); };
  auto grad = [&context](Param p) { return context.grad(p).as<float>(); };
  const float* s = saved_.as<const float>();
  const float* x = context.input().as<const float>();
  const float* dout = grad_output.as<const float>();
  const std::size_t nc = static_cast<std::size_t>(N * C);
  const std::size_t ncl = static_cast<std::size_t>(N * Cl);

  Buffer workspace = context.allocate(
      (2 * nc + 4 * ncl + ncl + 3 * ncl + shape.backward_scratch_elements()) * sizeof(float),
      Category::kWorkspace);
  float* dx1 = workspace.as<float>();  // [N, C]
  float* dln = dx1 + nc;               // [N, C]: d(ln_2 out), then d(ln_1 out), summed
  float* dh = dln + nc;                // [N, 4 C_l]
  float* dy = dh + 4 * ncl;            // [N, C_l]
  float* dqkv = dy + ncl;              // [N, 3 C_l]
  float* scratch = dqkv + 3 * ncl;
  float* dx = context.make_grad_input({B, T, C}, DType::kFloat32).as<float>();

  // MLP. d(out) is the same on every rank; the product's input gradient is this rank's share.
  device.copy(stream, dx1, dout, nc * sizeof(float));
  matmul(stream, true, false, C, 4 * Cl, N, 1.0f, dout, s + at.g, 1.0f, grad(kMlpProjWeight));
  bias_grad(stream, dout, grad(kMlpProjBias), N, C);
  matmul(stream, false, false, N, 4 * Cl, C, 1.0f, dout, param(kMlpProjWeight), 0.0f, dh);
  gelu_backward(stream, s + at.h, dh, dh, 4 * ncl);
  matmul(stream, true, false, 4 * Cl, C, N, 1.0f, dh, s + at.ln2, 1.0f, grad(kFcWeight));
  bias_grad(stream, dh, grad(kFcBias), N, 4 * Cl);
  matmul(stream, false, false, N, C, 4 * Cl, 1.0f, dh, param(kFcWeight), 0.0f, dln);
  group.label_next("tensor-parallel d(ln_2 output)");
  group.all_reduce(stream, dln, dln, nc, DType::kFloat32);
  layernorm_backward(stream, dln, s + at.x1, param(kLn2Weight), s + at.mean2, s + at.rstd2, N, C,
                     dx1, grad(kLn2Weight), grad(kLn2Bias));

  // Attention.
  matmul(stream, true, false, C, Cl, N, 1.0f, dx1, s + at.y, 1.0f, grad(kAttnProjWeight));
  bias_grad(stream, dx1, grad(kAttnProjBias), N, C);
  matmul(stream, false, false, N, Cl, C, 1.0f, dx1, param(kAttnProjWeight), 0.0f, dy);
  attention_backward(stream, shape, dy, s + at.split, s + at.probs, dqkv, scratch);
  matmul(stream, true, false, 3 * Cl, C, N, 1.0f, dqkv, s + at.ln1, 1.0f, grad(kAttnWeight));
  bias_grad(stream, dqkv, grad(kAttnBias), N, 3 * Cl);
  matmul(stream, false, false, N, C, 3 * Cl, 1.0f, dqkv, param(kAttnWeight), 0.0f, dln);
  group.label_next("tensor-parallel d(ln_1 output)");
  group.all_reduce(stream, dln, dln, nc, DType::kFloat32);
  device.copy(stream, dx, dx1, nc * sizeof(float));
  layernorm_backward(stream, dln, x, param(kLn1Weight), s + at.mean1, s + at.rstd1, N, C, dx,
                     grad(kLn1Weight), grad(kLn1Bias));

  context.release(std::move(workspace));
  context.release(std::move(saved_));
}

}  // namespace zest
