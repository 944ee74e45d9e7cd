#include "models/gpt_pieces.h"

#include <algorithm>
#include <string>
#include <utility>

#include "base/error.h"
#include "models/describe_tensor.h"
#include "kernels/cross_entropy.h"
#include "kernels/cross_entropy_pieces.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "models/gpt_block.h"

namespace zest {
namespace {

// What the head keeps for backward and the pieces read in theirs: ln_f(x) [N, C], its mean and
// rstd [N] each, and the logits [N, V], which the head's backward turns into d(logits); with the
// logits by pieces, a log-sum-exp [N] in their place.
struct HeadSaved {
  Buffer buffer;
  std::int64_t batch = 0;
  std::int64_t seq = 0;
};

std::size_t head_saved_elements(std::int64_t N, std::int64_t C, std::int64_t V) {
  return static_cast<std::size_t>(N * C + 2 * N + N * V);
}
std::size_t head_workspace_elements(std::int64_t N, std::int64_t C) {
  return static_cast<std::size_t>(N * C);
}

// The logits by pieces: the head keeps ln_f(x), mean, rstd and the log-sum-exp; its forward's
// scratch is the loss's running state and one piece's logits, its backward's d(ln_f out) and one
// piece's logits, a piece's backward its own logits.
std::size_t lse_head_saved_bytes(std::int64_t N, std::int64_t C) {
  return static_cast<std::size_t>(N * C + 3 * N) * sizeof(float);
}
std::int64_t widest_piece(const std::vector<VocabPiece>& pieces) {
  std::int64_t widest = 0;
  for (const VocabPiece& piece : pieces) widest = std::max(widest, piece.rows);
  return widest;
}
std::size_t lse_head_forward_bytes(std::int64_t N, std::int64_t widest) {
  return cross_entropy_running_bytes(N) + static_cast<std::size_t>(N * widest) * sizeof(float);
}
std::size_t lse_head_backward_bytes(std::int64_t N, std::int64_t C, std::int64_t widest) {
  return static_cast<std::size_t>(N * C + N * widest) * sizeof(float);
}
std::size_t piece_logits_bytes(std::int64_t N, std::int64_t rows) {
  return static_cast<std::size_t>(N * rows) * sizeof(float);
}

// A piece of the token table: unit 0 ("embedding") holds rows [0, r) and wpe and starts the
// residual stream; the others add their rows to it. Backward adds the head's deferred product
// d(logits)[:, piece]ᵀ · ln_f(x), then its token rows (the uncut model's order: product, rows),
// and passes d(out) through.
class GptVocabPiece final : public Unit {
 public:
  GptVocabPiece(const GptConfig& config, int piece, VocabPiece rows,
                std::shared_ptr<HeadSaved> head)
      : config_(config), piece_(piece), rows_(rows), head_(std::move(head)),
        name_(piece == 0 ? "embedding" : "wte_piece" + std::to_string(piece)) {}

  const std::string& name() const override { return name_; }
  // Its d(wte) product reads the head's saved values and its rows only d(out): at stage 3 a
  // piece is not gathered for its backward (the head's were the piece's last reads). With the
  // logits by pieces it recomputes its logits from its rows.
  bool backward_reads_parameters() const override { return config_.logits_by_pieces; }
  std::vector<ParamSpec> parameters() const override {
    const std::int64_t C = config_.n_embd;
    // Note: drawn as the uncut wte's rows (unit 0, parameter 0), so that every k starts from
    // the uncut model's weights; the init is gpt.cc's.
    ParamSpec wte{"wte", {rows_.rows, C}, Initializer::normal(0.02f), true};
    wte.draw_unit = 0;
    wte.draw_param = 0;
    wte.draw_first = rows_.begin * C;
    if (piece_ != 0) return {wte};
    return {wte, {"wpe", {config_.seq_len, C}, Initializer::normal(0.01f), true}};
  }

  void forward(UnitContext& context) override {
    const Tensor tokens = context.batch().inputs;
    const std::int32_t* ids = checked_tokens(name_, tokens, config_);
    const std::int64_t B = tokens.dim(0);
    const std::int64_t T = tokens.dim(1);
    const std::int64_t C = config_.n_embd;
    const float* in = nullptr;
    const float* wpe = nullptr;
    if (piece_ == 0) {
      wpe = context.param(1).as<const float>();
    } else {
      const Tensor input = context.input();
      check_stream(name_, "input", input, B, T, C);
      in = input.as<const float>();
    }
    float* out = context.make_output({B, T, C}, DType::kFloat32).as<float>();
    embedding_rows_forward(context.stream(), ids, B, T, context.param(0).as<const float>(),
                           rows_.begin, rows_.rows, wpe, in, config_.vocab_size, C, out);
  }

  void backward(UnitContext& context) override {
    const Tensor tokens = context.batch().inputs;
    const std::int32_t* ids = checked_tokens(name_, tokens, config_);
    const std::int64_t B = tokens.dim(0);
    const std::int64_t T = tokens.dim(1);
    const std::int64_t C = config_.n_embd;
    const std::int64_t V = config_.vocab_size;
    const Tensor grad_output = context.grad_output();
    check_stream(name_, "grad_output", grad_output, B, T, C);
    if (head_->buffer.empty() || head_->batch != B || head_->seq != T) {
      throw Error(ErrorKind::kUsage, name_ + ": backward without the head's backward");
    }
    Stream& stream = context.stream();
    const std::int64_t N = B * T;
    const float* ln = head_->buffer.as<const float>();
    float* dx = piece_ == 0 ? nullptr
                            : context.make_grad_input({B, T, C}, DType::kFloat32).as<float>();
    float* dwte = context.grad(0).as<float>();
    Buffer logits;
    const float* dlogits = ln + N * C + 2 * N + rows_.begin;  // columns of the head's [N, V]
    std::int64_t ld = V;
    if (config_.logits_by_pieces) {
      // This piece's d(logits) again, from its logits and the head's log-sum-exp.
      logits = context.allocate(piece_logits_bytes(N, rows_.rows), Category::kWorkspace);
      float* piece_logits = logits.as<float>();
      matmul_ld(stream, false, true, N, rows_.rows, C, 1.0f, ln, C,
                context.param(0).as<const float>(), C, 0.0f, piece_logits, rows_.rows);
      cross_entropy_piece_backward(stream, piece_logits, rows_.rows,
                                   checked_head_targets(name_, context.batch(), B, T), N,
                                   rows_.begin, rows_.rows, ln + N * C + 2 * N,
                                   context.loss_scale(), piece_logits, rows_.rows);
      dlogits = piece_logits;
      ld = rows_.rows;
    }
    // The tied head's part of d(wte) for these rows: d(logits)[:, rows]ᵀ · ln_f(x).
    matmul_ld(stream, true, false, rows_.rows, C, N, 1.0f, dlogits, ld, ln, C, 1.0f, dwte, C);
    embedding_rows_backward(stream, ids, B, T, grad_output.as<const float>(), rows_.begin,
                            rows_.rows, V, C, dwte,
                            piece_ == 0 ? context.grad(1).as<float>() : nullptr);
    if (!logits.empty()) context.release(std::move(logits));
    if (piece_ == 0) {
      // The last reader of the head's saved buffer.
      context.release(std::move(head_->buffer));
      return;
    }
    context.device().copy(stream, dx, grad_output.data, grad_output.bytes());
  }

 private:
  const GptConfig config_;
  const int piece_;
  const VocabPiece rows_;
  const std::shared_ptr<HeadSaved> head_;
  const std::string name_;
};

// ln_f, then logits[:, piece] = ln_f(x) · wte_pieceᵀ for each piece in turn, then the mean
// cross-entropy. Backward: d(ln_f out) = Σ d(logits)[:, piece] · wte_piece over the pieces in
// reverse (the last ones of forward may still be gathered), then ln_f's backward; d(wte) is left
// to the pieces.
class GptPiecedHead final : public Unit {
 public:
  GptPiecedHead(const GptConfig& config, std::vector<VocabPiece> pieces,
                std::shared_ptr<HeadSaved> saved)
      : config_(config), pieces_(std::move(pieces)), saved_(std::move(saved)) {}

  const std::string& name() const override { return name_; }
  std::vector<ParamSpec> parameters() const override {
    const std::int64_t C = config_.n_embd;
    // The uncut model's head is unit n_layer + 1.
    ParamSpec weight{"ln_f.weight", {C}, Initializer::ones(), false};
    ParamSpec bias{"ln_f.bias", {C}, Initializer::zeros(), false};
    weight.draw_unit = bias.draw_unit = config_.n_layer + 1;
    bias.draw_param = 1;
    return {weight, bias};
  }
  std::vector<int> borrowed_units() const override {
    std::vector<int> pieces;
    for (std::size_t i = 0; i < pieces_.size(); ++i) pieces.push_back(static_cast<int>(i));
    return pieces;
  }
  bool borrows_in_turn() const override { return true; }

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
    if (!saved_->buffer.empty()) context.release(std::move(saved_->buffer));
    saved_->buffer = context.allocate(config_.logits_by_pieces
                                          ? lse_head_saved_bytes(N, C)
                                          : head_saved_elements(N, C, V) * sizeof(float),
                                      Category::kActivations);
    saved_->batch = B;
    saved_->seq = T;
    if (config_.logits_by_pieces) return forward_by_pieces(context, input, targets);
    float* ln = saved_->buffer.as<float>();
    float* logits = ln + N * C + 2 * N;
    layernorm_forward(stream, input.as<const float>(), context.param(0).as<const float>(),
                      context.param(1).as<const float>(), N, C, kLayerNormEps, ln, ln + N * C,
                      ln + N * C + N);
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      const VocabPiece& piece = pieces_[i];
      matmul_ld(stream, false, true, N, piece.rows, C, 1.0f, ln, C,
                context.borrowed_param(i, 0).as<const float>(), C, 0.0f, logits + piece.begin, V);
      context.unpin_borrowed(i);
    }
    cross_entropy_forward(stream, logits, targets, N, V, context.loss());
    if (!context.backward_follows()) context.release(std::move(saved_->buffer));
  }

  void backward(UnitContext& context) override {
    if (saved_->buffer.empty()) {
      throw Error(ErrorKind::kUsage, name_ + ": backward without a forward");
    }
    const std::int64_t B = saved_->batch;
    const std::int64_t T = saved_->seq;
    const std::int64_t N = B * T;
    const std::int64_t C = config_.n_embd;
    const std::int64_t V = config_.vocab_size;
    const std::int32_t* targets = checked_targets(context.batch(), B, T);
    Stream& stream = context.stream();
    if (config_.logits_by_pieces) return backward_by_pieces(context, targets);
    float* ln = saved_->buffer.as<float>();
    float* logits = ln + N * C + 2 * N;
    Buffer workspace = context.allocate(head_workspace_elements(N, C) * sizeof(float),
                                        Category::kWorkspace);
    float* dln = workspace.as<float>();
    float* dx = context.make_grad_input({B, T, C}, DType::kFloat32).as<float>();

    cross_entropy_backward(stream, logits, targets, N, V, context.loss_scale(), logits);
    for (std::size_t i = pieces_.size(); i-- > 0;) {
      const VocabPiece& piece = pieces_[i];
      matmul_ld(stream, false, false, N, C, piece.rows, 1.0f, logits + piece.begin, V,
                context.borrowed_param(i, 0).as<const float>(), C,
                i + 1 == pieces_.size() ? 0.0f : 1.0f, dln, C);
      context.unpin_borrowed(i);
    }
    context.device().fill_zero(stream, dx, static_cast<std::size_t>(N * C) * sizeof(float));
    layernorm_backward(stream, dln, context.input().as<const float>(),
                       context.param(0).as<const float>(), ln + N * C, ln + N * C + N, N, C, dx,
                       context.grad(0).as<float>(), context.grad(1).as<float>());
    context.release(std::move(workspace));
    // Note: saved stays for the pieces' backward (their part of d(wte)); the embedding frees it.
  }

 private:
  const std::int32_t* checked_targets(const Batch& batch, std::int64_t B, std::int64_t T) const {
    return checked_head_targets(name_, batch, B, T);
  }

  // ln_f(x) is in saved (allocated); each piece's logits are made in scratch and folded into
  // the rows' running log-sum-exp, which ends in saved beside ln_f(x).
  void forward_by_pieces(UnitContext& context, const Tensor& input, const std::int32_t* targets) {
    const std::int64_t N = input.dim(0) * input.dim(1);
    const std::int64_t C = config_.n_embd;
    const std::int64_t V = config_.vocab_size;
    Stream& stream = context.stream();
    float* ln = saved_->buffer.as<float>();
    layernorm_forward(stream, input.as<const float>(), context.param(0).as<const float>(),
                      context.param(1).as<const float>(), N, C, kLayerNormEps, ln, ln + N * C,
                      ln + N * C + N);
    Buffer workspace =
        context.allocate(lse_head_forward_bytes(N, widest_piece(pieces_)), Category::kWorkspace);
    void* running = workspace.data();
    float* logits = reinterpret_cast<float*>(static_cast<char*>(workspace.data()) +
                                             cross_entropy_running_bytes(N));
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      const VocabPiece& piece = pieces_[i];
      matmul_ld(stream, false, true, N, piece.rows, C, 1.0f, ln, C,
                context.borrowed_param(i, 0).as<const float>(), C, 0.0f, logits, piece.rows);
      context.unpin_borrowed(i);
      cross_entropy_piece_forward(stream, logits, piece.rows, targets, N, piece.begin, piece.rows,
                                  V, running);
    }
    cross_entropy_pieces_finish(stream, running, N, ln + N * C + 2 * N, context.loss());
    context.release(std::move(workspace));
    if (!context.backward_follows()) context.release(std::move(saved_->buffer));
  }

  // d(ln_f out) = Σ d(logits)[:, piece] · wte_piece, each piece's d(logits) from its logits made
  // again; d(wte) is left to the pieces, which make their logits a third time.
  void backward_by_pieces(UnitContext& context, const std::int32_t* targets) {
    const std::int64_t B = saved_->batch;
    const std::int64_t T = saved_->seq;
    const std::int64_t N = B * T;
    const std::int64_t C = config_.n_embd;
    Stream& stream = context.stream();
    float* ln = saved_->buffer.as<float>();
    const float* lse = ln + N * C + 2 * N;
    float* dx = context.make_grad_input({B, T, C}, DType::kFloat32).as<float>();
    Buffer workspace = context.allocate(lse_head_backward_bytes(N, C, widest_piece(pieces_)),
                                        Category::kWorkspace);
    float* dln = workspace.as<float>();
    float* logits = dln + N * C;
    for (std::size_t i = pieces_.size(); i-- > 0;) {
      const VocabPiece& piece = pieces_[i];
      const float* wte = context.borrowed_param(i, 0).as<const float>();
      matmul_ld(stream, false, true, N, piece.rows, C, 1.0f, ln, C, wte, C, 0.0f, logits,
                piece.rows);
      cross_entropy_piece_backward(stream, logits, piece.rows, targets, N, piece.begin,
                                   piece.rows, lse, context.loss_scale(), logits, piece.rows);
      matmul_ld(stream, false, false, N, C, piece.rows, 1.0f, logits, piece.rows, wte, C,
                i + 1 == pieces_.size() ? 0.0f : 1.0f, dln, C);
      context.unpin_borrowed(i);
    }
    context.device().fill_zero(stream, dx, static_cast<std::size_t>(N * C) * sizeof(float));
    layernorm_backward(stream, dln, context.input().as<const float>(),
                       context.param(0).as<const float>(), ln + N * C, ln + N * C + N, N, C, dx,
                       context.grad(0).as<float>(), context.grad(1).as<float>());
    context.release(std::move(workspace));
    // Note: saved stays for the pieces' backward; the embedding frees it.
  }

  const std::string name_ = "head";
  const GptConfig config_;
  const std::vector<VocabPiece> pieces_;
  const std::shared_ptr<HeadSaved> saved_;
};

// A block of the cut model, drawing its initial values as the uncut model's block (whose unit
// index is one past its layer's, not k past it).
class RedrawnBlock final : public Unit {
 public:
  RedrawnBlock(int layer, const GptConfig& config) : block_(layer, config), layer_(layer) {}

  const std::string& name() const override { return block_.name(); }
  std::vector<ParamSpec> parameters() const override {
    std::vector<ParamSpec> specs = block_.parameters();
    for (std::size_t p = 0; p < specs.size(); ++p) {
      specs[p].draw_unit = layer_ + 1;
      specs[p].draw_param = static_cast<int>(p);
    }
    return specs;
  }
  void forward(UnitContext& context) override { block_.forward(context); }
  void backward(UnitContext& context) override { block_.backward(context); }
  bool supports_selective_recompute() const override {
    return block_.supports_selective_recompute();
  }
  void recompute(UnitContext& context) override { block_.recompute(context); }

 private:
  GptBlock block_;
  const int layer_;
};

}  // namespace

std::vector<VocabPiece> vocab_pieces(std::int64_t vocab, int pieces) {
  std::vector<VocabPiece> out;
  for (int i = 0; i < pieces; ++i) {
    const std::int64_t begin = vocab * i / pieces;
    const std::int64_t end = vocab * (i + 1) / pieces;
    out.push_back({begin, end - begin});
  }
  return out;
}

void add_pieced_units(const GptConfig& config, std::vector<std::unique_ptr<Unit>>& units) {
  const std::vector<VocabPiece> pieces = vocab_pieces(config.vocab_size, config.vocab_pieces);
  auto saved = std::make_shared<HeadSaved>();
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    units.push_back(std::make_unique<GptVocabPiece>(config, static_cast<int>(i), pieces[i], saved));
  }
  for (int layer = 0; layer < config.n_layer; ++layer) {
    units.push_back(std::make_unique<RedrawnBlock>(layer, config));
  }
  units.push_back(std::make_unique<GptPiecedHead>(config, pieces, saved));
}

std::vector<UnitMemory> pieced_unit_memory(const GptConfig& config, std::int64_t batch,
                                           std::int64_t seq) {
  const std::int64_t N = batch * seq;
  const std::int64_t C = config.n_embd;
  const std::size_t stream_bytes = Tensor{nullptr, {batch, seq, C}, DType::kFloat32}.bytes();
  std::vector<UnitMemory> memory;
  const std::vector<VocabPiece> pieces = vocab_pieces(config.vocab_size, config.vocab_pieces);
  for (int i = 0; i < config.vocab_pieces; ++i) {
    UnitMemory piece;
    piece.output = stream_bytes;
    if (i > 0) piece.grad_input = stream_bytes;  // the first unit makes no input gradient
    if (config.logits_by_pieces) piece.backward_workspace = piece_logits_bytes(N, pieces[i].rows);
    piece.backward_stream_scratch = kCudaMatmulWorkspaceBytes;  // the deferred d(wte) product
    memory.push_back(piece);
  }
  for (int layer = 0; layer < config.n_layer; ++layer) {
    memory.push_back(GptBlock::memory(config, batch, seq));
  }
  UnitMemory head;
  head.saved = head_saved_elements(N, C, config.vocab_size) * sizeof(float);
  head.saved_freed_by = 0;  // the embedding's backward reads it last
  head.grad_input = stream_bytes;
  head.backward_workspace = head_workspace_elements(N, C) * sizeof(float);
  if (config.logits_by_pieces) {
    head.saved = lse_head_saved_bytes(N, C);
    head.forward_workspace = lse_head_forward_bytes(N, widest_piece(pieces));
    head.backward_workspace = lse_head_backward_bytes(N, C, widest_piece(pieces));
  }
  head.forward_stream_scratch = kCudaMatmulWorkspaceBytes;
  head.backward_stream_scratch = kCudaMatmulWorkspaceBytes;
  memory.push_back(head);
  return memory;
}

}  // namespace zest
