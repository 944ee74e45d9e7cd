#include "models/gpt_block.h"

#include <cmath>
#include <utility>

#include "base/error.h"
#include "models/describe_tensor.h"
#include "models/gpt_block_layout.h"
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/bias.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/matmul.h"

namespace zest {
namespace {

using namespace gpt_block_layout;

// Selective recomputation (Korthikanti et al. 2022): the block keeps the products' outputs (qkv
// rather than its per-head split, since attention's forward starts from qkv), the attention
// output, the residual stream and LayerNorm's statistics, and drops the LayerNorm outputs, the
// per-head split with the attention probabilities, and the GELU output, which recompute() makes
// again from the kept ones with the same kernels.
struct Kept {
  std::size_t qkv, mean1, rstd1, y, x1, mean2, rstd2, h, total;

  explicit Kept(const AttentionShape& a) {
    const std::size_t n = static_cast<std::size_t>(a.batch * a.seq);
    const std::size_t nc = n * static_cast<std::size_t>(a.channels());
    std::size_t at = 0;
    auto take = [&at](std::size_t count) { const std::size_t here = at; at += count; return here; };
    qkv = take(3 * nc); mean1 = take(n); rstd1 = take(n);
    y = take(nc); x1 = take(nc); mean2 = take(n); rstd2 = take(n);
    h = take(4 * nc);
    total = at;
  }
};
struct Rebuilt {
  std::size_t ln1, split, probs, ln2, g, total;

  explicit Rebuilt(const AttentionShape& a) {
    const std::size_t nc = static_cast<std::size_t>(a.batch * a.seq * a.channels());
    std::size_t at = 0;
    auto take = [&at](std::size_t count) { const std::size_t here = at; at += count; return here; };
    ln1 = take(nc); split = take(a.split_elements()); probs = take(a.probs_elements());
    ln2 = take(nc); g = take(4 * nc);
    total = at;
  }
};

// Where forward writes and backward reads each activation, in either layout. qkv is forward's
// scratch unless kept.
struct Activations {
  float *ln1, *mean1, *rstd1, *qkv, *split, *probs, *y, *x1, *ln2, *mean2, *rstd2, *h, *g;

  static Activations whole(float* s, float* qkv, const AttentionShape& a, std::int64_t channels,
                           std::int64_t stream_rows) {
    const Saved at(a, channels, stream_rows);
    return {s + at.ln1, s + at.mean1, s + at.rstd1, qkv,         s + at.split,
            s + at.probs, s + at.y,   s + at.x1,    s + at.ln2,  s + at.mean2,
            s + at.rstd2, s + at.h,   s + at.g};
  }
  static Activations selective(float* k, float* r, const AttentionShape& a) {
    const Kept kept(a);
    const Rebuilt re(a);
    return {r + re.ln1,   k + kept.mean1, k + kept.rstd1, k + kept.qkv,   r + re.split,
            r + re.probs, k + kept.y,     k + kept.x1,    r + re.ln2,     k + kept.mean2,
            k + kept.rstd2, k + kept.h,   r + re.g};
  }
};

// Scratch of one forward: qkv [N, 3C], then attention's own.
std::size_t forward_workspace_elements(const AttentionShape& a) {
  const std::size_t nc = static_cast<std::size_t>(a.batch * a.seq * a.channels());
  return 3 * nc + a.forward_scratch_elements();
}

// Scratch of one backward: dx1 [N, C], dh [N, 4C_l], dln [N, C], dy [N, C_l], dqkv [N, 3C_l]
// (C_l = a.channels(), the block's heads: C at tensor-parallel size 1), then attention's own
// where the device asks the caller for it (the CPU; attention's CUDA body takes a larger one
// from the stream: AttentionShape::cuda_stream_scratch_bytes).
std::size_t backward_workspace_elements(const AttentionShape& a, std::int64_t channels,
                                        bool with_attention_scratch) {
  const std::size_t n = static_cast<std::size_t>(a.batch * a.seq);
  const std::size_t nc = n * static_cast<std::size_t>(channels);
  const std::size_t ncl = n * static_cast<std::size_t>(a.channels());
  return 2 * nc + 8 * ncl + (with_attention_scratch ? a.backward_scratch_elements() : 0);
}

// The slice of a whole [rows, columns] parameter (a vector: columns 1) that a tensor rank holds.
ParamSpec::DrawSlice rows_of(std::int64_t columns, std::int64_t block, std::int64_t stride,
                             std::int64_t first) {
  return {columns, 0, block, stride, first};
}
ParamSpec::DrawSlice columns_of(std::int64_t rows, std::int64_t columns, std::int64_t first) {
  return {columns, first, rows, 0, 0};
}

// A tensor-parallel slice's allocations (GptBlock::forward and backward with slice.size > 1):
// the rank's heads, the residual stream's rows it holds (all of them without sequence
// parallelism), and under sequence parallelism an [N, C] buffer for the gathered rows beside
// forward's workspace, and the gathered rows, the rank's d(LayerNorm out) and the 6 gradient
// vectors summed across the group beside backward's. No selective recomputation, no split
// backward: the slice supports neither.
UnitMemory slice_memory(const GptConfig& config, std::int64_t batch, std::int64_t seq,
                        const TensorSlice& slice) {
  const std::int64_t C = config.n_embd;
  const AttentionShape shape{batch, seq, config.n_head / slice.size, C / config.n_head};
  const std::int64_t N = batch * seq;
  const std::int64_t Ns = slice.stream_rows(N);
  const auto nc = static_cast<std::size_t>(N * C);
  const auto ns_c = static_cast<std::size_t>(Ns * C);
  const std::size_t stream_bytes = ns_c * sizeof(float);
  const bool sequence = slice.sequence_parallel;
  UnitMemory memory;
  memory.saved = Saved(shape, C, Ns).total * sizeof(float);
  memory.forward_workspace =
      (forward_workspace_elements(shape) + (sequence ? nc : 0)) * sizeof(float);
  memory.output = stream_bytes;
  memory.grad_input = stream_bytes;
  memory.backward_workspace =
      (backward_workspace_elements(shape, C, true) +
       (sequence ? nc + ns_c + 6 * static_cast<std::size_t>(C) : 0)) *
      sizeof(float);
  memory.backward_workspace_cpu_only = shape.backward_scratch_elements() * sizeof(float);
  memory.forward_stream_scratch = shape.cuda_stream_scratch_bytes(false);
  memory.backward_stream_scratch = shape.cuda_stream_scratch_bytes(true);
  return memory;
}

}  // namespace

GptBlock::GptBlock(int index, const GptConfig& config, TensorSlice slice)
    : name_("block" + std::to_string(index)), config_(config), slice_(slice) {}

AttentionShape GptBlock::attention_shape(std::int64_t batch, std::int64_t seq) const {
  return {batch, seq, config_.n_head / slice_.size, config_.n_embd / config_.n_head};
}

UnitMemory GptBlock::memory(const GptConfig& config, std::int64_t batch, std::int64_t seq,
                            const TensorSlice& slice) {
  if (slice.size > 1) return slice_memory(config, batch, seq, slice);
  const AttentionShape shape{batch, seq, config.n_head, config.n_embd / config.n_head};
  const std::size_t stream_bytes = Tensor{nullptr, {batch, seq, config.n_embd}, DType::kFloat32}.bytes();
  UnitMemory memory;
  memory.saved = Saved(shape).total * sizeof(float);
  memory.forward_workspace = forward_workspace_elements(shape) * sizeof(float);
  memory.output = stream_bytes;
  memory.grad_input = stream_bytes;
  memory.backward_workspace =
      backward_workspace_elements(shape, config.n_embd, true) * sizeof(float);
  memory.backward_workspace_cpu_only = shape.backward_scratch_elements() * sizeof(float);
  memory.forward_stream_scratch = shape.cuda_stream_scratch_bytes(false);
  memory.backward_stream_scratch = shape.cuda_stream_scratch_bytes(true);
  memory.selective = true;
  memory.selective_saved = Kept(shape).total * sizeof(float);
  memory.selective_rebuilt = Rebuilt(shape).total * sizeof(float);
  memory.selective_forward_workspace = shape.forward_scratch_elements() * sizeof(float);
  memory.rebuild_workspace = shape.forward_scratch_elements() * sizeof(float);
  memory.rebuild_stream_scratch = shape.cuda_stream_scratch_bytes(false);
  // backward_input keeps its workspace and the output's gradient with the LayerNorms' four
  // parameter gradients (`kept`) for backward_weight.
  memory.split_backward = true;
  memory.split_keeps_workspace = true;
  memory.split_kept = (stream_bytes / sizeof(float) + 4 * static_cast<std::size_t>(config.n_embd)) *
                      sizeof(float);
  return memory;
}

std::vector<ParamSpec> GptBlock::parameters() const {
  const std::int64_t C = config_.n_embd;
  const std::int64_t Cl = C / slice_.size;
  const Initializer weight = Initializer::normal(0.02f);
  // GPT-2's scaled init of the projections that add to the residual stream: 0.02 / sqrt(2 L),
  // so the stream's variance does not grow with depth (2 such additions per block).
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
  if (slice_.size == 1) return specs;
  // q, k and v: this rank's heads of each, C_l rows at r·C_l of each C rows.
  const std::int64_t r = slice_.rank;
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

void GptBlock::row_parallel_forward(Stream& stream, const float* y, const float* weight,
                                    const float* bias, const float* residual, std::int64_t rows,
                                    std::int64_t inner, float* partial, float* out) const {
  const std::int64_t C = config_.n_embd;
  const auto whole = static_cast<std::size_t>(rows * C);
  if (slice_.sequence_parallel) {
    // Every row's partial sum, reduce-scattered to the row's rank, which then adds the residual
    // and the bias once.
    matmul(stream, false, true, rows, C, inner, 1.0f, y, weight, 0.0f, partial);
    slice_.sum_rows(stream, partial, out, whole, "sequence-parallel row-parallel product");
    const std::int64_t own = slice_.stream_rows(rows);
    accumulate_into(stream, out, DType::kFloat32, residual, DType::kFloat32,
                    static_cast<std::size_t>(own * C));
    add_bias(stream, out, bias, own, C);
    return;
  }
  // Note: under tensor parallelism the group's first rank adds the residual and the bias, the
  // others their product only, so the all-reduce adds each once.
  if (slice_.rank == 0) {
    linear_forward(stream, y, weight, bias, rows, inner, C, residual, out);
  } else {
    matmul(stream, false, true, rows, C, inner, 1.0f, y, weight, 0.0f, out);
  }
  slice_.sum_rows(stream, out, out, whole, "tensor-parallel row-parallel product");
}

void GptBlock::forward(UnitContext& context) {
  const Tensor input = context.input();
  const std::int64_t C = config_.n_embd;
  const std::int64_t split = slice_.sequence_parallel ? slice_.size : 1;
  if (input.dtype != DType::kFloat32 || input.rank() != 3 || input.dim(0) < 1 ||
      input.dim(1) < 1 || input.dim(1) * split > config_.seq_len || input.dim(2) != C ||
      input.empty()) {
    throw Error(ErrorKind::kUsage, name_ + ": input must be float32 [B, T, " + std::to_string(C) +
                                       "] with B >= 1 and 1 <= T <= " +
                                       std::to_string(config_.seq_len / split) + ", got " +
                                       describe_tensor(input));
  }
  const std::int64_t B = input.dim(0);
  const std::int64_t T = input.dim(1) * split;  // the whole sequence
  const std::int64_t N = B * T;
  const std::int64_t Ns = slice_.stream_rows(N);
  const std::int64_t Cl = C / slice_.size;
  const AttentionShape shape = attention_shape(B, T);
  Stream& stream = context.stream();
  auto param = [&context](Param p) { return context.param(p).as<const float>(); };

  // A forward whose backward never ran (evaluation, a failed step) may leave buffers behind.
  if (!saved_.empty()) context.release(std::move(saved_));
  if (!rebuilt_.empty()) context.release(std::move(rebuilt_));
  if (!split_workspace_.empty()) context.release(std::move(split_workspace_));
  if (!split_kept_.empty()) context.release(std::move(split_kept_));
  selective_ = supports_selective_recompute() && context.backward_follows() &&
               context.recompute_selectively();
  // Sequence parallelism: one [N, C] buffer for the gathered LayerNorm outputs and the partial
  // sums in turn.
  const std::size_t whole_rows = slice_.sequence_parallel ? static_cast<std::size_t>(N * C) : 0;
  Buffer workspace;
  Activations act{};
  if (selective_) {
    saved_ = context.allocate(Kept(shape).total * sizeof(float), Category::kActivations);
    rebuilt_ = context.allocate(Rebuilt(shape).total * sizeof(float), Category::kActivations);
    workspace = context.allocate(shape.forward_scratch_elements() * sizeof(float),
                                 Category::kWorkspace);
    act = Activations::selective(saved_.as<float>(), rebuilt_.as<float>(), shape);
  } else {
    saved_ = context.allocate(Saved(shape, C, Ns).total * sizeof(float), Category::kActivations);
    workspace = context.allocate((forward_workspace_elements(shape) + whole_rows) * sizeof(float),
                                 Category::kWorkspace);
    act = Activations::whole(saved_.as<float>(), workspace.as<float>(), shape, C, Ns);
  }
  saved_batch_ = B;
  saved_seq_ = T;
  float* scratch = selective_ ? workspace.as<float>() : workspace.as<float>() + 3 * N * Cl;
  float* whole = selective_ ? nullptr : workspace.as<float>() + forward_workspace_elements(shape);
  const float* x = input.as<const float>();
  float* out = context.make_output({B, T / split, C}, DType::kFloat32).as<float>();
  const auto ns_c = static_cast<std::size_t>(Ns * C);

  // Attention: x1 = x + c_proj.bias + Σ_ranks c_proj_r(attn(c_attn_r(ln_1(x)))).
  layernorm_forward(stream, x, param(kLn1Weight), param(kLn1Bias), Ns, C, kLayerNormEps, act.ln1,
                    act.mean1, act.rstd1);
  const float* ln1 = slice_.gather_rows(stream, act.ln1, whole, ns_c, "sequence-parallel ln_1");
  linear_forward(stream, ln1, param(kAttnWeight), param(kAttnBias), N, C, 3 * Cl, nullptr,
                 act.qkv);
  attention_forward(stream, shape, act.qkv, act.split, act.probs, act.y, scratch);
  row_parallel_forward(stream, act.y, param(kAttnProjWeight), param(kAttnProjBias), x, N, Cl,
                       whole, act.x1);

  // MLP: out = x1 + mlp.c_proj.bias + Σ_ranks mlp.c_proj_r(gelu(mlp.c_fc_r(ln_2(x1)))).
  layernorm_forward(stream, act.x1, param(kLn2Weight), param(kLn2Bias), Ns, C, kLayerNormEps,
                    act.ln2, act.mean2, act.rstd2);
  const float* ln2 = slice_.gather_rows(stream, act.ln2, whole, ns_c, "sequence-parallel ln_2");
  linear_gelu_forward(stream, ln2, param(kFcWeight), param(kFcBias), N, C, 4 * Cl, act.h, act.g);
  row_parallel_forward(stream, act.g, param(kMlpProjWeight), param(kMlpProjBias), act.x1, N,
                       4 * Cl, whole, out);

  context.release(std::move(workspace));
  if (!context.backward_follows()) context.release(std::move(saved_));
  if (!rebuilt_.empty()) context.release(std::move(rebuilt_));
}

void GptBlock::recompute(UnitContext& context) {
  if (saved_.empty() || !selective_) {
    throw Error(ErrorKind::kUsage, name_ + ": recompute without a selective forward");
  }
  const std::int64_t B = saved_batch_;
  const std::int64_t T = saved_seq_;
  const std::int64_t C = config_.n_embd;
  const std::int64_t N = B * T;
  const AttentionShape shape{B, T, config_.n_head, C / config_.n_head};
  Stream& stream = context.stream();
  auto param = [&context](Param p) { return context.param(p).as<const float>(); };
  rebuilt_ = context.allocate(Rebuilt(shape).total * sizeof(float), Category::kActivations);
  Buffer workspace =
      context.allocate(shape.forward_scratch_elements() * sizeof(float), Category::kWorkspace);
  const Activations act = Activations::selective(saved_.as<float>(), rebuilt_.as<float>(), shape);
  // The forward's kernels on the forward's inputs: what they write again over kept activations
  // (LayerNorm's statistics, the attention output) is the same bytes.
  layernorm_forward(stream, context.input().as<const float>(), param(kLn1Weight), param(kLn1Bias),
                    N, C, kLayerNormEps, act.ln1, act.mean1, act.rstd1);
  attention_forward(stream, shape, act.qkv, act.split, act.probs, act.y, workspace.as<float>());
  layernorm_forward(stream, act.x1, param(kLn2Weight), param(kLn2Bias), N, C, kLayerNormEps,
                    act.ln2, act.mean2, act.rstd2);
  if (linear_gelu_post_is_gelu_of_pre(stream, 4 * C)) {
    gelu_forward(stream, act.h, act.g, static_cast<std::size_t>(4 * N * C));
  } else {
    linear_gelu_forward(stream, act.ln2, param(kFcWeight), param(kFcBias), N, C, 4 * C, act.h,
                        act.g);
  }
  context.release(std::move(workspace));
}

void GptBlock::backward(UnitContext& context) {
  if (saved_.empty()) throw Error(ErrorKind::kUsage, name_ + ": backward without a forward");
  const std::int64_t B = saved_batch_;
  const std::int64_t T = saved_seq_;
  const std::int64_t C = config_.n_embd;
  const std::int64_t N = B * T;
  const std::int64_t Ns = slice_.stream_rows(N);
  const std::int64_t Cl = C / slice_.size;
  const bool sequence = slice_.sequence_parallel;
  const Tensor grad_output = context.grad_output();
  check_stream(name_, "grad_output", grad_output, B, sequence ? T / slice_.size : T, C);
  const AttentionShape shape = attention_shape(B, T);
  Stream& stream = context.stream();
  Device& device = context.device();
  auto param = [&context](Param p) { return context.param(p).as<const float>(); };
  auto grad = [&context](Param p) { return context.grad(p).as<float>(); };
  if (selective_ && rebuilt_.empty()) {
    throw Error(ErrorKind::kUsage,
                name_ + ": backward after a selective forward needs recompute()");
  }
  const Activations act =
      selective_ ? Activations::selective(saved_.as<float>(), rebuilt_.as<float>(), shape)
                 : Activations::whole(saved_.as<float>(), nullptr, shape, C, Ns);
  const float* x = context.input().as<const float>();
  const float* dout = grad_output.as<const float>();
  const std::size_t nc = static_cast<std::size_t>(N * C);
  const std::size_t ncl = static_cast<std::size_t>(N * Cl);
  const std::size_t ns_c = static_cast<std::size_t>(Ns * C);
  const auto c = static_cast<std::size_t>(C);

  const bool attention_scratch = device.kind() != DeviceKind::kCuda;
  const std::size_t base = backward_workspace_elements(shape, C, attention_scratch);
  // Sequence parallelism: a gathered [N, C], the rank's rows of d(ln out) [Ns, C], and the
  // gradients every rank computes from its rows only, summed across the group at the end: ln_2
  // and ln_1 weight and bias, the two row-parallel biases (6C).
  const std::size_t extra = sequence ? nc + ns_c + 6 * c : 0;
  Buffer workspace = context.allocate((base + extra) * sizeof(float), Category::kWorkspace);
  float* dx1 = workspace.as<float>();  // [Ns, C]: d(loss)/d(x1), the residual stream after attn
  float* dh = dx1 + nc;                // [N, 4C_l]
  float* dln = dh + 4 * ncl;           // [N, C]: d(ln_2 out), then d(ln_1 out), partial sums
  float* dy = dln + nc;                // [N, C_l]: d(attention output), before c_proj
  float* dqkv = dy + ncl;              // [N, 3C_l]
  float* scratch = attention_scratch ? dqkv + 3 * ncl : nullptr;
  float* whole = sequence ? workspace.as<float>() + base : nullptr;  // [N, C]
  float* dln_own = sequence ? whole + nc : dln;                         // [Ns, C]
  float* sums = sequence ? dln_own + ns_c : nullptr;                    // [6C]
  auto own_grad = [&](Param p, std::size_t at) { return sequence ? sums + at * c : grad(p); };
  if (sequence) device.fill_zero(stream, sums, 6 * c * sizeof(float));
  float* dx = context.make_grad_input({B, sequence ? T / slice_.size : T, C}, DType::kFloat32)
                  .as<float>();

  // MLP. Parameter gradients accumulate (beta = 1); input gradients are made fresh (beta = 0).
  // d(out) is the same on every tensor rank; the product's input gradient is this rank's share.
  device.copy(stream, dx1, dout, ns_c * sizeof(float));
  bias_grad(stream, dout, own_grad(kMlpProjBias, 4), Ns, C);
  const float* dout_all = slice_.gather_rows(stream, dout, whole, ns_c, "sequence-parallel d(out)");
  matmul(stream, true, false, C, 4 * Cl, N, 1.0f, dout_all, act.g, 1.0f, grad(kMlpProjWeight));
  matmul(stream, false, false, N, 4 * Cl, C, 1.0f, dout_all, param(kMlpProjWeight), 0.0f, dh);
  gelu_backward(stream, act.h, dh, dh, 4 * ncl);
  const float* ln2 = slice_.gather_rows(stream, act.ln2, whole, ns_c, "sequence-parallel ln_2");
  matmul(stream, true, false, 4 * Cl, C, N, 1.0f, dh, ln2, 1.0f, grad(kFcWeight));
  bias_grad(stream, dh, grad(kFcBias), N, 4 * Cl);
  matmul(stream, false, false, N, C, 4 * Cl, 1.0f, dh, param(kFcWeight), 0.0f, dln);
  slice_.sum_rows(stream, dln, dln_own, nc, "tensor-parallel d(ln_2 output)");
  layernorm_backward(stream, dln_own, act.x1, param(kLn2Weight), act.mean2, act.rstd2, Ns, C,
                     dx1, own_grad(kLn2Weight, 0), own_grad(kLn2Bias, 1));

  // Attention.
  bias_grad(stream, dx1, own_grad(kAttnProjBias, 5), Ns, C);
  const float* dx1_all = slice_.gather_rows(stream, dx1, whole, ns_c, "sequence-parallel d(x1)");
  matmul(stream, true, false, C, Cl, N, 1.0f, dx1_all, act.y, 1.0f, grad(kAttnProjWeight));
  matmul(stream, false, false, N, Cl, C, 1.0f, dx1_all, param(kAttnProjWeight), 0.0f, dy);
  attention_backward(stream, shape, dy, act.split, act.probs, dqkv, scratch);
  const float* ln1 = slice_.gather_rows(stream, act.ln1, whole, ns_c, "sequence-parallel ln_1");
  matmul(stream, true, false, 3 * Cl, C, N, 1.0f, dqkv, ln1, 1.0f, grad(kAttnWeight));
  bias_grad(stream, dqkv, grad(kAttnBias), N, 3 * Cl);
  matmul(stream, false, false, N, C, 3 * Cl, 1.0f, dqkv, param(kAttnWeight), 0.0f, dln);
  slice_.sum_rows(stream, dln, dln_own, nc, "tensor-parallel d(ln_1 output)");
  device.copy(stream, dx, dx1, ns_c * sizeof(float));
  layernorm_backward(stream, dln_own, x, param(kLn1Weight), act.mean1, act.rstd1, Ns, C, dx,
                     own_grad(kLn1Weight, 2), own_grad(kLn1Bias, 3));

  if (sequence) {
    slice_.sum(stream, sums, 6 * c, "sequence-parallel LayerNorm and bias gradients");
    const Param order[6] = {kLn2Weight, kLn2Bias, kLn1Weight, kLn1Bias, kMlpProjBias,
                            kAttnProjBias};
    for (std::size_t i = 0; i < 6; ++i) {
      accumulate_into(stream, grad(order[i]), DType::kFloat32, sums + i * c, DType::kFloat32, c);
    }
  }
  context.release(std::move(workspace));
  context.release(std::move(saved_));
  if (!rebuilt_.empty()) context.release(std::move(rebuilt_));
}

// backward() in two calls: the same kernels on the same operands, but for the LayerNorms'
// parameter gradients, which go to a zeroed buffer first and are added in backward_weight.
void GptBlock::backward_input(UnitContext& context) {
  if (saved_.empty() || !split_workspace_.empty()) {
    throw Error(ErrorKind::kUsage, name_ + ": backward_input without a forward");
  }
  const std::int64_t B = saved_batch_;
  const std::int64_t T = saved_seq_;
  const std::int64_t C = config_.n_embd;
  const std::int64_t N = B * T;
  const Tensor grad_output = context.grad_output();
  check_stream(name_, "grad_output", grad_output, B, T, C);
  if (selective_ && rebuilt_.empty()) {
    throw Error(ErrorKind::kUsage, name_ + ": backward after a selective forward needs recompute()");
  }
  const AttentionShape shape{B, T, config_.n_head, C / config_.n_head};
  Stream& stream = context.stream();
  Device& device = context.device();
  auto param = [&context](Param p) { return context.param(p).as<const float>(); };
  const Activations act =
      selective_ ? Activations::selective(saved_.as<float>(), rebuilt_.as<float>(), shape)
                 : Activations::whole(saved_.as<float>(), nullptr, shape, C, N);
  const float* x = context.input().as<const float>();
  const float* dout = grad_output.as<const float>();
  const std::size_t nc = static_cast<std::size_t>(N * C);
  const auto c = static_cast<std::size_t>(C);
  const bool attention_scratch = device.kind() != DeviceKind::kCuda;
  Buffer workspace = context.allocate(
      backward_workspace_elements(shape, C, attention_scratch) * sizeof(float),
      Category::kActivations);
  Buffer kept = context.allocate((nc + 4 * c) * sizeof(float), Category::kActivations);
  float* dx1 = workspace.as<float>();
  float* dh = dx1 + nc;
  float* dln = dh + 4 * nc;
  float* dy = dln + nc;
  float* dqkv = dy + nc;
  float* scratch = attention_scratch ? dqkv + 3 * nc : nullptr;
  float* dx = context.make_grad_input({B, T, C}, DType::kFloat32).as<float>();
  float* ln_grads = kept.as<float>() + nc;  // ln_2 weight, bias, ln_1 weight, bias
  device.copy(stream, kept.as<float>(), dout, nc * sizeof(float));
  device.fill_zero(stream, ln_grads, 4 * c * sizeof(float));

  device.copy(stream, dx1, dout, nc * sizeof(float));
  matmul(stream, false, false, N, 4 * C, C, 1.0f, dout, param(kMlpProjWeight), 0.0f, dh);
  gelu_backward(stream, act.h, dh, dh, 4 * nc);
  matmul(stream, false, false, N, C, 4 * C, 1.0f, dh, param(kFcWeight), 0.0f, dln);
  layernorm_backward(stream, dln, act.x1, param(kLn2Weight), act.mean2, act.rstd2, N, C, dx1,
                     ln_grads, ln_grads + c);
  matmul(stream, false, false, N, C, C, 1.0f, dx1, param(kAttnProjWeight), 0.0f, dy);
  attention_backward(stream, shape, dy, act.split, act.probs, dqkv, scratch);
  matmul(stream, false, false, N, C, 3 * C, 1.0f, dqkv, param(kAttnWeight), 0.0f, dln);
  device.copy(stream, dx, dx1, nc * sizeof(float));
  layernorm_backward(stream, dln, x, param(kLn1Weight), act.mean1, act.rstd1, N, C, dx,
                     ln_grads + 2 * c, ln_grads + 3 * c);
  split_workspace_ = std::move(workspace);
  split_kept_ = std::move(kept);
}

void GptBlock::backward_weight(UnitContext& context) {
  if (split_workspace_.empty()) {
    throw Error(ErrorKind::kUsage, name_ + ": backward_weight before backward_input");
  }
  const std::int64_t B = saved_batch_;
  const std::int64_t T = saved_seq_;
  const std::int64_t C = config_.n_embd;
  const std::int64_t N = B * T;
  const AttentionShape shape{B, T, config_.n_head, C / config_.n_head};
  Stream& stream = context.stream();
  auto grad = [&context](Param p) { return context.grad(p).as<float>(); };
  const Activations act =
      selective_ ? Activations::selective(saved_.as<float>(), rebuilt_.as<float>(), shape)
                 : Activations::whole(saved_.as<float>(), nullptr, shape, C, N);
  const std::size_t nc = static_cast<std::size_t>(N * C);
  const auto c = static_cast<std::size_t>(C);
  const float* dx1 = split_workspace_.as<const float>();
  const float* dh = dx1 + nc;
  const float* dqkv = dh + 6 * nc;  // after dh [4nc], dln [nc], dy [nc]
  const float* dout = split_kept_.as<const float>();
  const float* ln_grads = dout + nc;
  matmul(stream, true, false, C, 4 * C, N, 1.0f, dout, act.g, 1.0f, grad(kMlpProjWeight));
  bias_grad(stream, dout, grad(kMlpProjBias), N, C);
  matmul(stream, true, false, 4 * C, C, N, 1.0f, dh, act.ln2, 1.0f, grad(kFcWeight));
  bias_grad(stream, dh, grad(kFcBias), N, 4 * C);
  matmul(stream, true, false, C, C, N, 1.0f, dx1, act.y, 1.0f, grad(kAttnProjWeight));
  bias_grad(stream, dx1, grad(kAttnProjBias), N, C);
  matmul(stream, true, false, 3 * C, C, N, 1.0f, dqkv, act.ln1, 1.0f, grad(kAttnWeight));
  bias_grad(stream, dqkv, grad(kAttnBias), N, 3 * C);
  const Param ln[4] = {kLn2Weight, kLn2Bias, kLn1Weight, kLn1Bias};
  for (std::size_t i = 0; i < 4; ++i) {
    accumulate_into(stream, grad(ln[i]), DType::kFloat32, ln_grads + i * c, DType::kFloat32, c);
  }
  context.release(std::move(split_workspace_));
  context.release(std::move(split_kept_));
  context.release(std::move(saved_));
  if (!rebuilt_.empty()) context.release(std::move(rebuilt_));
}

}  // namespace zest
