#include "models/tensor_parallel_gpt.h"

#include <utility>

#include "base/error.h"
#include "kernels/convert.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/vocab_parallel_cross_entropy.h"
#include "models/describe_tensor.h"

namespace zest {
namespace {

// What the embedding and the head allocate, in floats, for N = B·T tokens of which the rank holds
// Ns on the residual stream (TensorSlice::stream_rows): forward and backward ask for these, and
// TensorParallelGpt::unit_memory declares them, so the plan and the run cannot drift apart.
struct SliceSizes {
  std::size_t n, ns, c, nc, ns_c, vocab_rows, ranks;
  bool sequence;

  SliceSizes(const GptConfig& config, const TensorSlice& slice, std::int64_t tokens)
      : n(static_cast<std::size_t>(tokens)),
        ns(static_cast<std::size_t>(slice.stream_rows(tokens))),
        c(static_cast<std::size_t>(config.n_embd)),
        nc(n * c),
        ns_c(ns * c),
        vocab_rows(static_cast<std::size_t>(config.vocab_size / slice.size)),
        ranks(static_cast<std::size_t>(slice.size)),
        sequence(slice.sequence_parallel) {}

  // The embedding's sums of every row before the reduce-scatter (sequence parallelism), and a
  // rank other than the first's zero base (embedding_rows_forward's base must not alias).
  std::size_t embedding_whole_rows() const { return sequence ? nc : 0; }
  // The head's saved ln_f(x) [Ns, C], mean and rstd [Ns], lse [N] and logits' columns [N, V/t].
  std::size_t head_saved() const { return ns_c + 2 * ns + n + n * vocab_rows; }
  // The gathered row maxima [t, N], max [N], exp-sums and target logits [2, N], and the gathered
  // ln_f(x) [N, C] under sequence parallelism.
  std::size_t head_forward_workspace() const { return (ranks + 3) * n + (sequence ? nc : 0); }
  // d(ln_f out) [N, C]; under sequence parallelism the gathered ln_f(x) [N, C], the rank's rows
  // of d(ln_f out) [Ns, C] and ln_f's gradients (2C).
  std::size_t head_backward_workspace() const {
    return nc + (sequence ? nc + ns_c + 2 * c : 0);
  }
};

// wte rows [r·V/t, (r+1)·V/t) and a copy of wpe; the group's sum is the whole embedding.
class VocabularyParallelEmbedding final : public Unit {
 public:
  VocabularyParallelEmbedding(const GptConfig& config, TensorSlice slice)
      : config_(config), slice_(slice) {}

  const std::string& name() const override { return name_; }
  bool gradients_replace_parameters() const override { return true; }
  std::vector<ParamSpec> parameters() const override {
    const std::int64_t C = config_.n_embd;
    const std::int64_t rows = config_.vocab_size / slice_.size;
    std::vector<ParamSpec> specs = {{"wte", {rows, C}, Initializer::normal(0.02f), true},
                                    {"wpe", {config_.seq_len, C}, Initializer::normal(0.01f), true}};
    specs[0].draw_slice = {C, 0, rows, 0, slice_.rank * rows};
    specs[1].norm_counted = slice_.rank == 0;
    return specs;
  }

  void forward(UnitContext& context) override {
    const Tensor tokens = context.input();
    const std::int32_t* ids = checked_tokens(name_, tokens, config_);
    const std::int64_t B = tokens.dim(0);
    const std::int64_t T = tokens.dim(1);
    const std::int64_t C = config_.n_embd;
    const std::int64_t rows = config_.vocab_size / slice_.size;
    check_sequence_split(name_.c_str(), slice_, T);
    const std::int64_t split = slice_.sequence_parallel ? slice_.size : 1;
    Stream& stream = context.stream();
    float* out = context.make_output({B, T / split, C}, DType::kFloat32).as<float>();
    const std::size_t count = static_cast<std::size_t>(B * T * C);
    const SliceSizes sizes(config_, slice_, B * T);
    // Sequence parallelism: every row summed in `whole`, then reduce-scattered to the rank's rows.
    Buffer whole_rows;
    float* whole = out;
    if (slice_.sequence_parallel) {
      whole_rows = context.allocate(sizes.embedding_whole_rows() * sizeof(float),
                                    Category::kWorkspace);
      whole = whole_rows.as<float>();
    }
    // Note: the first rank adds wpe, every rank its rows (zero elsewhere): one nonzero row term
    // per token in the sum, so the all-reduce gives the whole embedding's values exactly.
    if (slice_.rank == 0) {
      embedding_rows_forward(stream, ids, B, T, context.param(0).as<const float>(), 0, rows,
                             context.param(1).as<const float>(), nullptr, config_.vocab_size, C,
                             whole);
    } else {
      // Zeros as the base (the kernel's base and output must not alias).
      Buffer zeros = context.allocate(count * sizeof(float), Category::kWorkspace);
      context.device().fill_zero(stream, zeros.data(), count * sizeof(float));
      embedding_rows_forward(stream, ids, B, T, context.param(0).as<const float>(),
                             slice_.rank * rows, rows, nullptr, zeros.as<const float>(),
                             config_.vocab_size, C, whole);
      context.release(std::move(zeros));
    }
    slice_.sum_rows(stream, whole, out, count, "tensor-parallel embedding");
    if (!whole_rows.empty()) context.release(std::move(whole_rows));
  }

  void backward(UnitContext& context) override {
    const Tensor tokens = context.input();
    const std::int32_t* ids = checked_tokens(name_, tokens, config_);
    const std::int64_t B = tokens.dim(0);
    const std::int64_t T = tokens.dim(1);
    const std::int64_t C = config_.n_embd;
    const std::int64_t rows = config_.vocab_size / slice_.size;
    const std::int64_t split = slice_.sequence_parallel ? slice_.size : 1;
    const Tensor grad_output = context.grad_output();
    check_stream(name_, "grad_output", grad_output, B, T / split, C);
    // Every token's gradient reaches this rank's rows of wte: the rows' gradients gathered whole.
    const std::size_t count = static_cast<std::size_t>(B * T * C);
    Buffer whole_rows;
    if (slice_.sequence_parallel) {
      whole_rows = context.allocate(SliceSizes(config_, slice_, B * T).embedding_whole_rows() *
                                        sizeof(float),
                                    Category::kWorkspace);
    }
    const float* dout =
        slice_.gather_rows(context.stream(), grad_output.as<const float>(), whole_rows.as<float>(),
                           count / split, "sequence-parallel d(embedding output)");
    embedding_rows_backward(context.stream(), ids, B, T, dout, slice_.rank * rows, rows,
                            config_.vocab_size, C, context.grad(0).as<float>(),
                            context.grad(1).as<float>());
    if (!whole_rows.empty()) context.release(std::move(whole_rows));
  }

 private:
  const std::string name_ = "embedding";
  const GptConfig config_;
  const TensorSlice slice_;
};

// ln_f, then this rank's columns of the logits (its wte rows, borrowed) and the
// vocabulary-parallel cross-entropy. Saved: ln_f(x) [Ns, C], mean, rstd [Ns] each, lse [N], and
// the logits' columns [N, V/t], which backward turns into their gradient in place (Ns: the rank's
// rows of the residual stream, all N without sequence parallelism, whose ln_f(x) is all-gathered
// before the logits and again in backward).
class VocabularyParallelHead final : public Unit {
 public:
  VocabularyParallelHead(const GptConfig& config, TensorSlice slice)
      : config_(config), slice_(slice) {}

  const std::string& name() const override { return name_; }
  std::vector<ParamSpec> parameters() const override {
    const std::int64_t C = config_.n_embd;
    std::vector<ParamSpec> specs = {{"ln_f.weight", {C}, Initializer::ones(), false},
                                    {"ln_f.bias", {C}, Initializer::zeros(), false}};
    for (ParamSpec& spec : specs) spec.norm_counted = slice_.rank == 0;
    return specs;
  }
  std::vector<int> borrowed_units() const override { return {0}; }

  void forward(UnitContext& context) override {
    const Tensor input = context.input();
    const std::int64_t C = config_.n_embd;
    check_head_input(name_, input, C);
    const std::int64_t B = input.dim(0);
    const std::int64_t T = input.dim(1) * (slice_.sequence_parallel ? slice_.size : 1);
    const std::int32_t* targets = checked_head_targets(name_, context.batch(), B, T);
    const std::int64_t N = B * T;
    const std::int64_t Ns = slice_.stream_rows(N);
    const std::int64_t Vl = config_.vocab_size / slice_.size;
    Stream& stream = context.stream();
    Communicator& group = *slice_.group;

    if (!saved_.empty()) context.release(std::move(saved_));
    const SliceSizes sizes(config_, slice_, N);
    saved_ = context.allocate(sizes.head_saved() * sizeof(float), Category::kActivations);
    saved_batch_ = B;
    saved_seq_ = T;
    float* ln = saved_.as<float>();
    float* mean = ln + Ns * C;
    float* rstd = mean + Ns;
    float* lse = rstd + Ns;
    float* logits = lse + N;
    const auto t = static_cast<std::size_t>(slice_.size);
    Buffer workspace =
        context.allocate(sizes.head_forward_workspace() * sizeof(float), Category::kWorkspace);
    float* gathered = workspace.as<float>();  // [t, N] row maxima
    float* max = gathered + t * N;            // [N]
    float* partial = max + N;                 // [2, N]: exp-sums, target logits
    float* whole = partial + 2 * N;           // [N, C] under sequence parallelism
    layernorm_forward(stream, input.as<const float>(), context.param(0).as<const float>(),
                      context.param(1).as<const float>(), Ns, C, kLayerNormEps, ln, mean, rstd);
    const float* ln_all = slice_.gather_rows(stream, ln, whole, static_cast<std::size_t>(Ns * C),
                                             "sequence-parallel ln_f");
    matmul(stream, false, true, N, Vl, C, 1.0f, ln_all,
           context.borrowed_param(0, 0).as<const float>(), 0.0f, logits);
    vocab_parallel_row_max(stream, logits, N, Vl, max);
    group.label_next("tensor-parallel logits' row maxima");
    group.all_gather(stream, max, gathered, static_cast<std::size_t>(N), DType::kFloat32);
    vocab_parallel_partials(stream, logits, targets, N, Vl, slice_.rank * Vl, config_.vocab_size,
                            gathered, slice_.size, max, partial);
    group.label_next("tensor-parallel exp-sums and target logits");
    group.all_reduce(stream, partial, partial, static_cast<std::size_t>(2 * N), DType::kFloat32);
    vocab_parallel_finish(stream, max, partial, N, lse, context.loss());
    context.release(std::move(workspace));
    if (!context.backward_follows()) context.release(std::move(saved_));
  }

  void backward(UnitContext& context) override {
    if (saved_.empty()) throw Error(ErrorKind::kUsage, name_ + ": backward without a forward");
    const std::int64_t B = saved_batch_;
    const std::int64_t T = saved_seq_;
    const std::int64_t N = B * T;
    const std::int64_t Ns = slice_.stream_rows(N);
    const std::int64_t C = config_.n_embd;
    const std::int64_t Vl = config_.vocab_size / slice_.size;
    const bool sequence = slice_.sequence_parallel;
    const std::int32_t* targets = checked_head_targets(name_, context.batch(), B, T);
    Stream& stream = context.stream();
    float* ln = saved_.as<float>();
    float* mean = ln + Ns * C;
    float* rstd = mean + Ns;
    float* lse = rstd + Ns;
    float* logits = lse + N;
    const float* wte = context.borrowed_param(0, 0).as<const float>();
    const auto nc = static_cast<std::size_t>(N * C);
    const auto ns_c = static_cast<std::size_t>(Ns * C);
    const auto c = static_cast<std::size_t>(C);
    // Sequence parallelism: a gathered ln_f(x) [N, C], the rank's rows of d(ln_f out) [Ns, C] and
    // ln_f's gradients from those rows (2C), summed across the group at the end.
    Buffer workspace = context.allocate(
        SliceSizes(config_, slice_, N).head_backward_workspace() * sizeof(float),
        Category::kWorkspace);
    float* dln = workspace.as<float>();
    float* whole = sequence ? dln + nc : nullptr;
    float* dln_own = sequence ? whole + nc : dln;
    float* sums = sequence ? dln_own + ns_c : nullptr;
    float* dx = context.make_grad_input({B, sequence ? T / slice_.size : T, C}, DType::kFloat32)
                    .as<float>();

    vocab_parallel_cross_entropy_backward(stream, logits, targets, N, Vl, slice_.rank * Vl, lse,
                                          context.loss_scale(), logits);
    // wte is read before its gradient is asked for (Unit::gradients_replace_parameters).
    matmul(stream, false, false, N, C, Vl, 1.0f, logits, wte, 0.0f, dln);
    const float* ln_all = slice_.gather_rows(stream, ln, whole, ns_c, "sequence-parallel ln_f");
    matmul(stream, true, false, Vl, C, N, 1.0f, logits, ln_all, 1.0f,
           context.borrowed_grad(0, 0).as<float>());
    slice_.sum_rows(stream, dln, dln_own, nc, "tensor-parallel d(ln_f output)");
    context.device().fill_zero(stream, dx, ns_c * sizeof(float));
    if (sequence) context.device().fill_zero(stream, sums, 2 * c * sizeof(float));
    layernorm_backward(stream, dln_own, context.input().as<const float>(),
                       context.param(0).as<const float>(), mean, rstd, Ns, C, dx,
                       sequence ? sums : context.grad(0).as<float>(),
                       sequence ? sums + c : context.grad(1).as<float>());
    if (sequence) {
      slice_.sum(stream, sums, 2 * c, "sequence-parallel ln_f gradients");
      for (std::size_t i = 0; i < 2; ++i) {
        accumulate_into(stream, context.grad(i).as<float>(), DType::kFloat32, sums + i * c,
                        DType::kFloat32, c);
      }
    }
    context.release(std::move(workspace));
    context.release(std::move(saved_));
  }

 private:
  const std::string name_ = "head";
  const GptConfig config_;
  const TensorSlice slice_;
  Buffer saved_;
  std::int64_t saved_batch_ = 0;
  std::int64_t saved_seq_ = 0;
};

void check_divides(const char* key, int value, const char* what, int size) {
  if (value % size == 0) return;
  throw Error(ErrorKind::kConfig,
              std::string("model.") + key + ": " + std::to_string(value) + " " + what +
                  " do not divide among tensor_parallel.size " + std::to_string(size) +
                  " ranks; choose a tensor_parallel.size that divides model." + key);
}

}  // namespace

void validate_tensor_parallel(const GptConfig& config, int size) {
  if (size < 1) {
    throw Error(ErrorKind::kConfig,
                "tensor_parallel.size: must be >= 1, got " + std::to_string(size));
  }
  check_divides("n_embd", config.n_embd, "channels", size);
  check_divides("n_head", config.n_head, "attention heads", size);
  check_divides("vocab_size", config.vocab_size, "vocabulary rows", size);
  if (config.vocab_pieces != 1 && size > 1) {
    throw Error(ErrorKind::kConfig,
                "model.vocab_pieces: must be 1 with tensor_parallel.size " + std::to_string(size) +
                    " (the vocabulary is split across the tensor-parallel ranks instead)");
  }
}

TensorParallelGpt::TensorParallelGpt(GptConfig config, TensorSlice slice)
    : config_(config), slice_(slice) {
  validate(config_);
  validate_tensor_parallel(config_, slice_.size);
  if (slice_.group == nullptr || slice_.group->world_size() != slice_.size ||
      slice_.group->rank() != slice_.rank) {
    throw Error(ErrorKind::kUsage, "TensorParallelGpt: the group must have tensor_parallel.size " +
                                       std::to_string(slice_.size) + " ranks, this one rank " +
                                       std::to_string(slice_.rank));
  }
  units_.push_back(std::make_unique<VocabularyParallelEmbedding>(config_, slice_));
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    units_.push_back(std::make_unique<GptBlock>(layer, config_, slice_));
  }
  units_.push_back(std::make_unique<VocabularyParallelHead>(config_, slice_));
}

TensorParallelGpt::~TensorParallelGpt() = default;

std::vector<UnitMemory> TensorParallelGpt::unit_memory(
    const std::vector<std::int64_t>& input_shape) const {
  const std::int64_t B = input_shape.size() == 2 ? input_shape[0] : 0;
  const std::int64_t T = input_shape.size() == 2 ? input_shape[1] : 0;
  const SliceSizes sizes(config_, slice_, B * T);
  const std::size_t stream_bytes = sizes.ns_c * sizeof(float);  // the rank's rows of [B, T, C]
  std::vector<UnitMemory> memory;
  UnitMemory embedding;  // the first unit makes no input gradient
  embedding.output = stream_bytes;
  // Note: a rank other than the group's first also holds its zero base while it looks up its
  // rows, so its forward's workspace is the larger (forward() allocates the two in turn).
  embedding.forward_workspace =
      (sizes.embedding_whole_rows() + (slice_.rank == 0 ? 0 : sizes.nc)) * sizeof(float);
  embedding.backward_workspace = sizes.embedding_whole_rows() * sizeof(float);
  memory.push_back(embedding);
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    memory.push_back(GptBlock::memory(config_, B, T, slice_));
  }
  UnitMemory head;  // the last unit writes the loss, no output
  head.saved = sizes.head_saved() * sizeof(float);
  head.forward_workspace = sizes.head_forward_workspace() * sizeof(float);
  head.grad_input = stream_bytes;
  head.backward_workspace = sizes.head_backward_workspace() * sizeof(float);
  head.forward_stream_scratch = kCudaMatmulWorkspaceBytes;  // the tied head's product
  head.backward_stream_scratch = kCudaMatmulWorkspaceBytes;
  memory.push_back(head);
  return memory;
}

std::vector<Unit*> TensorParallelGpt::units() {
  std::vector<Unit*> units;
  for (const auto& unit : units_) units.push_back(unit.get());
  return units;
}

}  // namespace zest
