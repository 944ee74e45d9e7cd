#include "models/gpt.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "base/error.h"
#include "models/describe_tensor.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "models/gpt_block.h"
#include "models/gpt_pieces.h"

namespace zest {
namespace {

// wte [vocab, C] and wpe [seq_len, C]: the sum of a token's and a position's embedding.
class GptEmbedding final : public Unit {
 public:
  explicit GptEmbedding(const GptConfig& config) : config_(config) {}

  const std::string& name() const override { return name_; }
  // Its backward reads no parameter, and the head reads wte before it asks for its gradient.
  bool gradients_replace_parameters() const override { return true; }
  std::vector<ParamSpec> parameters() const override {
    const std::int64_t C = config_.n_embd;
    // Note: OpenAI's GPT-2 (src/model.py) draws wte from N(0, 0.02) and wpe from N(0, 0.01);
    // llm.c's train_gpt2.py uses 0.02 for both. zest follows OpenAI. Both tables are matrices,
    // so both take weight decay (as in llm.c, which decays every parameter of rank >= 2).
    return {{"wte", {config_.vocab_size, C}, Initializer::normal(0.02f), true},
            {"wpe", {config_.seq_len, C}, Initializer::normal(0.01f), true}};
  }

  void forward(UnitContext& context) override {
    const Tensor tokens = context.input();
    const std::int32_t* ids = checked_tokens(name_, tokens, config_);
    const std::int64_t B = tokens.dim(0);
    const std::int64_t T = tokens.dim(1);
    float* out = context.make_output({B, T, config_.n_embd}, DType::kFloat32).as<float>();
    embedding_forward(context.stream(), ids, B, T, context.param(0).as<const float>(),
                      context.param(1).as<const float>(), config_.vocab_size, config_.n_embd, out);
  }

  void backward(UnitContext& context) override {
    const Tensor tokens = context.input();
    const std::int32_t* ids = checked_tokens(name_, tokens, config_);
    const std::int64_t B = tokens.dim(0);
    const std::int64_t T = tokens.dim(1);
    const Tensor grad_output = context.grad_output();
    check_stream(name_, "grad_output", grad_output, B, T, config_.n_embd);
    // d(wte) here adds to what the tied head has already accumulated into it.
    embedding_backward(context.stream(), ids, B, T, grad_output.as<const float>(),
                       config_.vocab_size, config_.n_embd, context.grad(0).as<float>(),
                       context.grad(1).as<float>());
  }

 private:
  const std::string name_ = "embedding";
  const GptConfig config_;
};

// The head keeps ln_f(x) [N, C], its mean and rstd [N] each and the logits [N, V]; backward's
// scratch is d(ln_f out) [N, C].
std::size_t head_saved_elements(std::int64_t N, std::int64_t C, std::int64_t V) {
  return static_cast<std::size_t>(N * C + 2 * N + N * V);
}
std::size_t head_workspace_elements(std::int64_t N, std::int64_t C) {
  return static_cast<std::size_t>(N * C);
}

// ln_f, then logits = ln_f(x) · wteᵀ with wte borrowed from the embedding, then the mean
// cross-entropy against the targets.
class GptHead final : public Unit {
 public:
  explicit GptHead(const GptConfig& config) : config_(config) {}

  const std::string& name() const override { return name_; }
  std::vector<ParamSpec> parameters() const override {
    const std::int64_t C = config_.n_embd;
    return {{"ln_f.weight", {C}, Initializer::ones(), false},
            {"ln_f.bias", {C}, Initializer::zeros(), false}};
  }
  std::vector<int> borrowed_units() const override { return {0}; }

  void forward(UnitContext& context) override {
    const Tensor input = context.input();
    const std::int64_t C = config_.n_embd;
    check_head_input(name_, input, C);
    const std::int64_t B = input.dim(0);
    const std::int64_t T = input.dim(1);
    const std::int32_t* targets = checked_targets(context.batch(), B, T);
    const std::int64_t N = B * T;
    const std::int64_t V = config_.vocab_size;
    Stream& stream = context.stream();

    // A forward whose backward never ran (evaluation, a failed step) may leave a buffer behind.
    if (!saved_.empty()) context.release(std::move(saved_));
    saved_ = context.allocate(head_saved_elements(N, C, V) * sizeof(float), Category::kActivations);
    saved_batch_ = B;
    saved_seq_ = T;
    float* ln = saved_.as<float>();
    float* logits = ln + N * C + 2 * N;
    layernorm_forward(stream, input.as<const float>(), context.param(0).as<const float>(),
                      context.param(1).as<const float>(), N, C, kLayerNormEps, ln, ln + N * C,
                      ln + N * C + N);
    matmul(stream, false, true, N, V, C, 1.0f, ln, context.borrowed_param(0, 0).as<const float>(),
           0.0f, logits);
    cross_entropy_forward(stream, logits, targets, N, V, context.loss());
    if (!context.backward_follows()) context.release(std::move(saved_));
  }

  void backward(UnitContext& context) override {
    if (saved_.empty()) throw Error(ErrorKind::kUsage, name_ + ": backward without a forward");
    const std::int64_t B = saved_batch_;
    const std::int64_t T = saved_seq_;
    const std::int64_t N = B * T;
    const std::int64_t C = config_.n_embd;
    const std::int64_t V = config_.vocab_size;
    const std::int32_t* targets = checked_targets(context.batch(), B, T);
    Stream& stream = context.stream();
    float* ln = saved_.as<float>();
    float* logits = ln + N * C + 2 * N;
    const float* wte = context.borrowed_param(0, 0).as<const float>();
    Buffer workspace = context.allocate(head_workspace_elements(N, C) * sizeof(float),
                                        Category::kWorkspace);
    float* dln = workspace.as<float>();
    float* dx = context.make_grad_input({B, T, C}, DType::kFloat32).as<float>();

    // The logits become d(loss)/d(logits) in place, seeded with the loss scale.
    cross_entropy_backward(stream, logits, targets, N, V, context.loss_scale(), logits);
    // Note: wte is read before its gradient is asked for (Unit::gradients_replace_parameters):
    // at stage 3 the gradient may take the place of the gathered wte.
    matmul(stream, false, false, N, C, V, 1.0f, logits, wte, 0.0f, dln);
    // The tied weight: d(wte) += dlogitsᵀ · ln_f(x), into the embedding's gradient.
    matmul(stream, true, false, V, C, N, 1.0f, logits, ln, 1.0f,
           context.borrowed_grad(0, 0).as<float>());
    context.device().fill_zero(stream, dx, static_cast<std::size_t>(N * C) * sizeof(float));
    layernorm_backward(stream, dln, context.input().as<const float>(),
                       context.param(0).as<const float>(), ln + N * C, ln + N * C + N, N, C, dx,
                       context.grad(0).as<float>(), context.grad(1).as<float>());

    context.release(std::move(workspace));
    context.release(std::move(saved_));
  }

 private:
  const std::int32_t* checked_targets(const Batch& batch, std::int64_t B, std::int64_t T) const {
    return checked_head_targets(name_, batch, B, T);
  }

  const std::string name_ = "head";
  const GptConfig config_;
  Buffer saved_;  // ln_f(x) [N, C], its mean and rstd [N] each, logits [N, V]; activations
  std::int64_t saved_batch_ = 0;
  std::int64_t saved_seq_ = 0;
};

void check_positive(const char* key, int value) {
  if (value < 1) {
    throw Error(ErrorKind::kConfig,
                std::string("model.") + key + ": must be >= 1, got " + std::to_string(value));
  }
}

}  // namespace

const std::int32_t* checked_head_targets(const std::string& unit, const Batch& batch, std::int64_t B,
                                         std::int64_t T) {
  const Tensor& targets = batch.targets;
  if (targets.dtype != DType::kInt32 || targets.shape != std::vector<std::int64_t>{B, T} ||
      targets.empty()) {
    throw Error(ErrorKind::kUsage, unit + ": targets must be int32 " + shape_to_string({B, T}) +
                                       " like the inputs, got " + describe_tensor(targets));
  }
  return targets.as<const std::int32_t>();
}

const std::int32_t* checked_tokens(const std::string& unit, const Tensor& tokens,
                                   const GptConfig& config) {
  if (tokens.dtype != DType::kInt32 || tokens.rank() != 2 || tokens.dim(0) < 1 ||
      tokens.dim(1) < 1 || tokens.dim(1) > config.seq_len || tokens.empty()) {
    throw Error(ErrorKind::kUsage, unit + ": inputs must be int32 [B, T] with B >= 1 and " +
                                       "1 <= T <= seq_len (" + std::to_string(config.seq_len) +
                                       "), got " + describe_tensor(tokens));
  }
  return tokens.as<const std::int32_t>();
}

void check_stream(const std::string& unit, const char* what, const Tensor& tensor,
                  std::int64_t B, std::int64_t T, std::int64_t C) {
  if (tensor.dtype != DType::kFloat32 || tensor.shape != std::vector<std::int64_t>{B, T, C} ||
      tensor.empty()) {
    throw Error(ErrorKind::kUsage, unit + ": " + what + " must be float32 " +
                                       shape_to_string({B, T, C}) + ", got " +
                                       describe_tensor(tensor));
  }
}

void check_head_input(const std::string& unit, const Tensor& input, std::int64_t C) {
  if (input.dtype != DType::kFloat32 || input.rank() != 3 || input.dim(2) != C || input.empty()) {
    throw Error(ErrorKind::kUsage, unit + ": input must be float32 [B, T, " + std::to_string(C) +
                                       "], got " + describe_tensor(input));
  }
}

void validate(const GptConfig& config) {
  check_positive("n_layer", config.n_layer);
  check_positive("n_head", config.n_head);
  check_positive("n_embd", config.n_embd);
  check_positive("vocab_size", config.vocab_size);
  check_positive("seq_len", config.seq_len);
  if (config.vocab_pieces < 0 || config.vocab_pieces > config.vocab_size) {
    throw Error(ErrorKind::kConfig, "model.vocab_pieces: must be \"auto\" or in [1, " +
                                        std::to_string(config.vocab_size) +
                                        "] (the vocabulary size), got " +
                                        std::to_string(config.vocab_pieces));
  }
  if (config.logits_by_pieces && config.vocab_pieces == 1) {
    throw Error(ErrorKind::kConfig,
                "model.logits_by_pieces: needs model.vocab_pieces > 1 or \"auto\" (the logits are "
                "computed a piece of the vocabulary at a time), got vocab_pieces 1");
  }
  if (config.n_embd % config.n_head != 0) {
    throw Error(ErrorKind::kConfig, "model.n_embd: must be divisible by model.n_head (" +
                                        std::to_string(config.n_embd) + " % " +
                                        std::to_string(config.n_head) + " != 0)");
  }
  // Note: 4·n_embd is the widest matrix dimension inside a block; cblas takes 32-bit sizes.
  if (config.n_embd > INT_MAX / 4) {
    throw Error(ErrorKind::kConfig, "model.n_embd: must be <= " + std::to_string(INT_MAX / 4) +
                                        ", got " + std::to_string(config.n_embd));
  }
}

int resolved_vocab_pieces(const GptConfig& config) {
  if (config.vocab_pieces != kAutoVocabPieces) return config.vocab_pieces;
  const std::int64_t C = config.n_embd;
  const std::int64_t block = 12 * C * C + 13 * C;
  const std::int64_t table = static_cast<std::int64_t>(config.vocab_size) * C;
  const std::int64_t pieces = (table + block - 1) / block;
  return static_cast<int>(std::clamp<std::int64_t>(pieces, 1, config.vocab_size));
}

Gpt::Gpt(GptConfig config) : config_(config) {
  validate(config_);
  config_.vocab_pieces = resolved_vocab_pieces(config_);
  if (config_.vocab_pieces > 1) {
    add_pieced_units(config_, units_);
    return;
  }
  units_.push_back(std::make_unique<GptEmbedding>(config_));
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    units_.push_back(std::make_unique<GptBlock>(layer, config_));
  }
  units_.push_back(std::make_unique<GptHead>(config_));
}

Gpt::~Gpt() = default;

std::vector<Unit*> Gpt::units() {
  std::vector<Unit*> units;
  for (const auto& unit : units_) units.push_back(unit.get());
  return units;
}

std::vector<UnitMemory> Gpt::unit_memory(const std::vector<std::int64_t>& input_shape) const {
  const std::int64_t B = input_shape.size() == 2 ? input_shape[0] : 0;
  const std::int64_t T = input_shape.size() == 2 ? input_shape[1] : 0;
  const std::int64_t N = B * T;
  const std::int64_t C = config_.n_embd;
  const std::size_t stream_bytes = Tensor{nullptr, {B, T, C}, DType::kFloat32}.bytes();
  if (config_.vocab_pieces > 1) return pieced_unit_memory(config_, B, T);
  std::vector<UnitMemory> memory;
  UnitMemory embedding;  // only its output; the first unit makes no input gradient
  embedding.output = stream_bytes;
  memory.push_back(embedding);
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    memory.push_back(GptBlock::memory(config_, B, T));
  }
  UnitMemory head;  // the last unit writes the loss, no output
  head.saved = head_saved_elements(N, C, config_.vocab_size) * sizeof(float);
  head.grad_input = stream_bytes;
  head.backward_workspace = head_workspace_elements(N, C) * sizeof(float);
  head.forward_stream_scratch = kCudaMatmulWorkspaceBytes;  // the tied head's product
  head.backward_stream_scratch = kCudaMatmulWorkspaceBytes;
  memory.push_back(head);
  return memory;
}

std::int64_t Gpt::parameter_count() const {
  const std::int64_t C = config_.n_embd;
  const std::int64_t block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C +
                             (4 * C * C + 4 * C) + (4 * C * C + C);
  return static_cast<std::int64_t>(config_.vocab_size + config_.seq_len) * C +
         config_.n_layer * block + 2 * C;
}

std::string Gpt::describe() const {
  return "Gpt " + std::to_string(config_.n_layer) + "L " + std::to_string(config_.n_head) + "H " +
         std::to_string(config_.n_embd) + "C, vocab " + std::to_string(config_.vocab_size) +
         ", seq " + std::to_string(config_.seq_len) +
         (config_.vocab_pieces > 1 ? ", " + std::to_string(config_.vocab_pieces) + " vocab pieces"
                                   : std::string()) +
         (config_.vocab_pieces > 1 && config_.logits_by_pieces ? ", logits by pieces"
                                                               : std::string()) +
         ": " + std::to_string(parameter_count()) + " parameters";
}

}  // namespace zest
