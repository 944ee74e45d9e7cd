// The GPT with its token table in vocabulary pieces (models/gpt_pieces.h) against the uncut
// GPT: the same initial model, the same losses and parameters within fp32 rounding at every
// stage and world size, the pieces' kernels (matmul with leading dimensions, the embedding by
// rows) against the whole ones, and model.vocab_pieces' errors.
#include "models/gpt_pieces.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "models/gpt.h"
#include "runtime/world.h"

namespace zest {
namespace {

// An embedding 2.5 blocks large: auto cuts it in 3.
GptConfig small_gpt(int pieces, bool logits_by_pieces = false) {
  return {2, 2, 16, 512, 8, pieces, logits_by_pieces};
}
constexpr std::int64_t kSequences = 2;

struct TrainedRun {
  std::vector<float> losses;                       // rank 0's, per micro-batch
  std::map<std::string, std::vector<float>> params;  // after the steps; wte whole
};

TrainedRun train(const GptConfig& config, int world, int stage, DType dtype,
                 const OptimizerOptions& opt, int steps = 3,
                 RecomputePolicy recompute = RecomputePolicy::kNone) {
  TrainedRun run;
  WorldOptions world_options;
  world_options.ranks = world;
  World(world_options).run([&](RankContext& context) {
    Gpt model(config);
    EngineOptions options;
    options.stage = stage;
    options.compute_dtype = dtype;
    options.communication_dtype = dtype;
    options.activation_checkpointing.policy = recompute;
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(opt));
    std::mt19937 rng(11 + context.rank);
    std::uniform_int_distribution<std::int32_t> token(0, config.vocab_size - 1);
    std::vector<std::int32_t> inputs(kSequences * config.seq_len);
    std::vector<std::int32_t> targets(inputs.size());
    for (int step = 0; step < steps; ++step) {
      for (auto& id : inputs) id = token(rng);
      for (auto& id : targets) id = token(rng);
      const Batch batch{Tensor{inputs.data(), {kSequences, config.seq_len}, DType::kInt32},
                        Tensor{targets.data(), {kSequences, config.seq_len}, DType::kInt32}};
      const float loss = trainer->forward_backward(batch);
      if (context.rank == 0) run.losses.push_back(loss);
      trainer->step();
      // Evaluation: the head frees its saved values itself (no backward follows).
      const float evaluated = trainer->evaluate(batch);
      if (context.rank == 0) run.losses.push_back(evaluated);
    }
    std::map<std::string, std::vector<float>> params;
    std::vector<float> wte;
    for (const std::string& name : trainer->parameter_names()) {
      std::vector<float> value = trainer->full_parameter(name);
      const bool piece = name == "embedding.wte" || name.rfind("wte_piece", 0) == 0;
      if (piece) {
        wte.insert(wte.end(), value.begin(), value.end());  // pieces come in vocabulary order
      } else {
        params[name] = std::move(value);
      }
    }
    params["embedding.wte"] = std::move(wte);
    if (context.rank == 0) run.params = std::move(params);
  });
  return run;
}

// The parity tolerances of tests/tools/pytorch_parity_test.cc: the pieces change only how BLAS
// blocks the vocabulary's products (fp32 rounding, about 1e-7 relative per product).
constexpr double kLossTolerance = 1e-5;
constexpr double kParamTolerance = 1e-4;

// Each parameter's difference, against how far training moved it from `start` (the initial
// model, the same for both): a rounding difference is a tiny fraction of the move, a wrong
// gradient a large one.
constexpr double kUpdateTolerance = 1e-3;

void expect_close(const TrainedRun& cut, const TrainedRun& whole, bool compare_params,
                  const TrainedRun* start = nullptr) {
  ASSERT_EQ(cut.losses.size(), whole.losses.size());
  for (std::size_t i = 0; i < cut.losses.size(); ++i) {
    EXPECT_NEAR(cut.losses[i], whole.losses[i], kLossTolerance * std::abs(whole.losses[i]))
        << "micro-batch " << i;
  }
  if (!compare_params) return;
  ASSERT_EQ(cut.params.size(), whole.params.size());
  for (const auto& [name, value] : whole.params) {
    const std::vector<float>& other = cut.params.at(name);
    ASSERT_EQ(other.size(), value.size()) << name;
    double worst = 0;
    double moved = 0;
    for (std::size_t i = 0; i < value.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(other[i] - value[i])));
      if (start) moved = std::max(moved, double(std::abs(value[i] - start->params.at(name)[i])));
    }
    EXPECT_LE(worst, kParamTolerance) << name;
    if (start) {
      EXPECT_GT(moved, 0.0) << name;
      // Plus two units in the last place of a norm's weight near 1, which barely moves.
      EXPECT_LE(worst, kUpdateTolerance * moved + 2.4e-7) << name << " moved " << moved;
    }
  }
}

OptimizerOptions sgd() {
  OptimizerOptions options;
  options.type = "SGD";
  options.lr = 0.1f;
  return options;
}

TEST(GptPieces, UnitsAreTheEmbeddingThePiecesTheBlocksAndTheHead) {
  Gpt model(small_gpt(kAutoVocabPieces));
  EXPECT_EQ(model.config().vocab_pieces, 3);
  std::vector<std::string> names;
  for (Unit* unit : model.units()) names.push_back(unit->name());
  EXPECT_EQ(names, (std::vector<std::string>{"embedding", "wte_piece1", "wte_piece2", "block0",
                                             "block1", "head"}));
  EXPECT_TRUE(model.units().back()->borrows_in_turn());
  EXPECT_EQ(model.units().back()->borrowed_units(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(model.parameter_count(), Gpt(small_gpt(1)).parameter_count());
  EXPECT_EQ(resolved_vocab_pieces(GptConfig{12, 12, 768, 50257, 64, kAutoVocabPieces}), 6);
  EXPECT_EQ(resolved_vocab_pieces(GptConfig{6, 6, 384, 50257, 64, kAutoVocabPieces}), 11);
}

TEST(GptPieces, TheInitialModelIsTheUncutOne) {
  OptimizerOptions opt = sgd();
  const TrainedRun whole = train(small_gpt(1), 1, 0, DType::kFloat32, opt, 0);
  const TrainedRun cut = train(small_gpt(4), 1, 0, DType::kFloat32, opt, 0);
  EXPECT_EQ(cut.params, whole.params);  // bit for bit: the same draws
}

TEST(GptPieces, LossesAndParametersMatchTheUncutModelAtEveryStageAndWorld) {
  for (int world : {1, 4}) {
    const TrainedRun whole = train(small_gpt(1), world, 0, DType::kFloat32, sgd());
    const TrainedRun start = train(small_gpt(1), world, 0, DType::kFloat32, sgd(), 0);
    for (int stage = 0; stage <= 3; ++stage) {
      for (int pieces : {kAutoVocabPieces, 5}) {
        SCOPED_TRACE("world " + std::to_string(world) + " stage " + std::to_string(stage) +
                     " pieces " + std::to_string(pieces));
        expect_close(train(small_gpt(pieces), world, stage, DType::kFloat32, sgd()), whole, true,
                     &start);
      }
    }
  }
}

TEST(GptPieces, RecomputedPiecesAndHeadMatchTheUncutModel) {
  for (RecomputePolicy policy : {RecomputePolicy::kFull, RecomputePolicy::kSelective}) {
    const TrainedRun whole = train(small_gpt(1), 2, 3, DType::kFloat32, sgd(), 3, policy);
    const TrainedRun start = train(small_gpt(1), 2, 3, DType::kFloat32, sgd(), 0);
    expect_close(train(small_gpt(kAutoVocabPieces), 2, 3, DType::kFloat32, sgd(), 3, policy),
                 whole, true, &start);
  }
}

TEST(GptPieces, AdamWAndBf16LossesMatchTheUncutModel) {
  // AdamW's first steps move each element by about lr whatever its gradient's size, so a
  // gradient near zero amplifies rounding: the losses are compared, not the parameters.
  const OptimizerOptions adamw;
  expect_close(train(small_gpt(kAutoVocabPieces), 4, 3, DType::kFloat32, adamw),
               train(small_gpt(1), 4, 3, DType::kFloat32, adamw), false);
  // bf16: both round their parameters to bf16 the same way; the products in fp32 differ only
  // in rounding, so the losses agree to bf16's resolution of the logits (2^-8 relative).
  const TrainedRun cut = train(small_gpt(kAutoVocabPieces), 2, 3, DType::kBFloat16, sgd());
  const TrainedRun whole = train(small_gpt(1), 2, 3, DType::kBFloat16, sgd());
  for (std::size_t i = 0; i < whole.losses.size(); ++i) {
    EXPECT_NEAR(cut.losses[i], whole.losses[i], 4e-3 * std::abs(whole.losses[i]));
  }
}

// The logits by pieces (GptConfig::logits_by_pieces): a log-sum-exp per row instead of the
// logits, each piece's logits made again in the head's and the piece's backward.
TEST(GptPieces, LogitsByPiecesMatchTheUncutModelAtEveryStageAndWorld) {
  for (int world : {1, 4}) {
    const TrainedRun whole = train(small_gpt(1), world, 0, DType::kFloat32, sgd());
    const TrainedRun start = train(small_gpt(1), world, 0, DType::kFloat32, sgd(), 0);
    for (int stage = 0; stage <= 3; ++stage) {
      for (int pieces : {kAutoVocabPieces, 5}) {
        SCOPED_TRACE("world " + std::to_string(world) + " stage " + std::to_string(stage) +
                     " pieces " + std::to_string(pieces));
        expect_close(train(small_gpt(pieces, true), world, stage, DType::kFloat32, sgd()), whole,
                     true, &start);
      }
    }
  }
}

TEST(GptPieces, LogitsByPiecesRecomputedAdamWAndBf16MatchTheUncutModel) {
  const TrainedRun start = train(small_gpt(1), 2, 3, DType::kFloat32, sgd(), 0);
  for (RecomputePolicy policy : {RecomputePolicy::kFull, RecomputePolicy::kSelective}) {
    expect_close(train(small_gpt(kAutoVocabPieces, true), 2, 3, DType::kFloat32, sgd(), 3, policy),
                 train(small_gpt(1), 2, 3, DType::kFloat32, sgd(), 3, policy), true, &start);
  }
  const OptimizerOptions adamw;
  expect_close(train(small_gpt(kAutoVocabPieces, true), 4, 3, DType::kFloat32, adamw),
               train(small_gpt(1), 4, 3, DType::kFloat32, adamw), false);
  const TrainedRun cut = train(small_gpt(kAutoVocabPieces, true), 2, 3, DType::kBFloat16, sgd());
  const TrainedRun whole = train(small_gpt(1), 2, 3, DType::kBFloat16, sgd());
  for (std::size_t i = 0; i < whole.losses.size(); ++i) {
    EXPECT_NEAR(cut.losses[i], whole.losses[i], 4e-3 * std::abs(whole.losses[i]));
  }
}

TEST(GptPieces, LogitsByPiecesNeedVocabularyPieces) {
  try {
    Gpt model(small_gpt(1, true));
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_EQ(std::string(error.what()).rfind("model.logits_by_pieces: ", 0), 0u) << error.what();
  }
  Gpt model(small_gpt(kAutoVocabPieces, true));
  EXPECT_TRUE(model.units().front()->backward_reads_parameters());  // its logits again
  EXPECT_NE(model.describe().find("3 vocab pieces, logits by pieces"), std::string::npos);
}

TEST(GptPieces, VocabPiecesOutsideOneToTheVocabularyAreConfigErrors) {
  for (int pieces : {-1, 513}) {
    try {
      Gpt model(small_gpt(pieces));
      ADD_FAILURE() << pieces << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kConfig);
      EXPECT_NE(std::string(error.what()).find("model.vocab_pieces"), std::string::npos);
    }
  }
  EXPECT_NO_THROW(Gpt(small_gpt(512)));  // a row per piece
}

TEST(GptPieces, PiecesCoverTheVocabularyInOrder) {
  const std::vector<VocabPiece> pieces = vocab_pieces(10, 4);
  std::int64_t next = 0;
  for (const VocabPiece& piece : pieces) {
    EXPECT_EQ(piece.begin, next);
    EXPECT_GE(piece.rows, 2);
    next += piece.rows;
  }
  EXPECT_EQ(next, 10);
}

TEST(GptPieces, EmbeddingByRowsSumsToTheWholeEmbeddingBitForBit) {
  const std::int64_t B = 2, T = 5, V = 37, C = 6;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> wte(V * C), wpe(T * C), dout(B * T * C);
  for (auto* v : {&wte, &wpe, &dout}) {
    for (float& x : *v) x = normal(rng);
  }
  std::vector<std::int32_t> tokens(B * T);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(i * 7 % V);
  tokens[3] = tokens[8];  // a repeated token sums in order
  std::vector<float> whole(B * T * C), dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  cpu::embedding_forward(tokens.data(), B, T, wte.data(), wpe.data(), V, C, whole.data());
  cpu::embedding_backward(tokens.data(), B, T, dout.data(), V, C, dwte.data(), dwpe.data());

  std::vector<float> a(B * T * C), b(B * T * C), cut_dwte(V * C, 0.0f), cut_dwpe(T * C, 0.0f);
  const std::vector<VocabPiece> pieces = vocab_pieces(V, 3);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const VocabPiece& p = pieces[i];
    cpu::embedding_rows_forward(tokens.data(), B, T, wte.data() + p.begin * C, p.begin, p.rows,
                                i == 0 ? wpe.data() : nullptr, i == 0 ? nullptr : a.data(), V, C,
                                b.data());
    std::swap(a, b);
    cpu::embedding_rows_backward(tokens.data(), B, T, dout.data(), p.begin, p.rows, V, C,
                                 cut_dwte.data() + p.begin * C, i == 0 ? cut_dwpe.data() : nullptr);
  }
  EXPECT_EQ(a, whole);
  EXPECT_EQ(cut_dwte, dwte);
  EXPECT_EQ(cut_dwpe, dwpe);
  tokens[4] = static_cast<std::int32_t>(V);
  EXPECT_THROW(cpu::embedding_rows_forward(tokens.data(), B, T, wte.data(), 0, 3, wpe.data(),
                                           nullptr, V, C, a.data()),
               Error);
}

TEST(GptPieces, MatmulWithLeadingDimensionsWritesAndReadsABlockOfColumns) {
  // C[:, 3:3+n] of a [m, 11] matrix = A · B[2:2+n, :]ᵀ, then back:
  // D = C[:, 3:3+n] · B[2:2+n, :].
  const std::int64_t m = 4, n = 5, k = 3, wide = 11;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> a(m * k), b(9 * k), c(m * wide, 7.0f), d(m * k);
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  cpu::matmul_ld(false, true, m, n, k, 1.0f, a.data(), k, b.data() + 2 * k, k, 0.0f, c.data() + 3,
                 wide);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < wide; ++j) {
      if (j < 3 || j >= 3 + n) {
        EXPECT_EQ(c[i * wide + j], 7.0f);  // outside the block: untouched
        continue;
      }
      double sum = 0;
      for (std::int64_t p = 0; p < k; ++p) sum += double(a[i * k + p]) * b[(2 + j - 3) * k + p];
      EXPECT_NEAR(c[i * wide + j], sum, 1e-5);
    }
  }
  cpu::matmul_ld(false, false, m, k, n, 1.0f, c.data() + 3, wide, b.data() + 2 * k, k, 0.0f,
                 d.data(), k);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t p = 0; p < k; ++p) {
      double sum = 0;
      for (std::int64_t j = 0; j < n; ++j) sum += double(c[i * wide + 3 + j]) * b[(2 + j) * k + p];
      EXPECT_NEAR(d[i * k + p], sum, 1e-5);
    }
  }
  EXPECT_THROW(cpu::matmul_ld(false, true, m, n, k, 1.0f, a.data(), k - 1, b.data(), k, 0.0f,
                              c.data(), wide),
               Error);
  EXPECT_THROW(cpu::matmul_ld(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
                              c.data(), n - 1),
               Error);
}

}  // namespace
}  // namespace zest
