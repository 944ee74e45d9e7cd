// The out-of-memory advice proposes the model built another way (ModelVariant: a GPT's
// model.vocab_pieces "auto", then with the logits by pieces) when a higher stage and offload do
// not fit and the variant does, before more ranks; never when the model as given fits.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <memory>
#include <string>
#include <vector>

#include "base/byte_size.h"
#include "engine/model_state.h"
#include "models/gpt.h"
#include "planner/memory_advice.h"
#include "planner/peak_plan.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// 6 x 384, vocabulary 50257 on 4 ranks, fully recomputed (so that recomputation is no advice)
// and one sequence per rank (so that no smaller micro-batch is).
constexpr int kWorld = 4;
constexpr std::size_t kAdamStates = 2;

EngineOptions stage3() {
  EngineOptions options;
  options.stage = 3;
  options.activation_checkpointing.policy = RecomputePolicy::kFull;
  return options;
}

PeakPlanInput job(const GptConfig& config, const EngineOptions& options = stage3()) {
  Gpt model(config);
  return plan_input(model, {1, config.seq_len}, options, kAdamStates, kWorld);
}

ModelVariant variant(const GptConfig& config, const std::string& change) {
  auto model = std::make_shared<Gpt>(config);
  return {change, describe_model_state(*model, DType::kFloat32, kAdamStates, 1),
          [model](std::int64_t rows) {
            return model->unit_memory({rows, model->config().seq_len});
          }};
}

std::vector<ModelVariant> variants_of(GptConfig config) {
  config.vocab_pieces = kAutoVocabPieces;
  std::vector<ModelVariant> variants{variant(config, "model.vocab_pieces \"auto\"")};
  config.logits_by_pieces = true;
  variants.push_back(
      variant(config, "model.vocab_pieces \"auto\" and model.logits_by_pieces true"));
  return variants;
}

TEST(MemoryAdviceVocabPieces, ProposesAutoPiecesWhenNeitherOffloadNorTheStageFits) {
  const GptConfig uncut{6, 6, 384, 50257, 64, 1};
  GptConfig cut = uncut;
  cut.vocab_pieces = kAutoVocabPieces;
  const std::size_t pieces = predict_peak(job(cut)).device_total;
  EngineOptions offloaded = stage3();
  offloaded.offload_optimizer.device = OffloadDevice::kCpu;
  const std::size_t capacity = pieces + 1;
  ASSERT_GT(predict_peak(job(uncut, offloaded)).device_total, capacity);
  ASSERT_GT(predict_peak(job(uncut)).device_total, capacity);
  const std::string advice = memory_advice(job(uncut), capacity, 1, {}, variants_of(uncut));
  EXPECT_THAT(advice, HasSubstr("; with model.vocab_pieces \"auto\" at zero_optimization.stage 3 "
                                "it needs " +
                                format_bytes(pieces) + ", which fits in"));
  EXPECT_THAT(advice, Not(HasSubstr("ranks")));
  // Without the variants, today's advice: more ranks.
  EXPECT_THAT(memory_advice(job(uncut), capacity, 1, {}), HasSubstr("ranks (world.ranks)"));
  // A job that fits gets no change.
  EXPECT_THAT(memory_advice(job(uncut), predict_peak(job(uncut)).device_total, 1, {},
                            variants_of(uncut)),
              Not(HasSubstr("vocab_pieces")));
}

TEST(MemoryAdviceVocabPieces, ProposesTheLogitsByPiecesWhereTheLogitsDecide) {
  // Seq 1024: the head's [1024, 50257] logits are 196 MiB a rank, the rest small.
  const GptConfig uncut{6, 6, 384, 50257, 1024, 1};
  GptConfig cut = uncut;
  cut.vocab_pieces = kAutoVocabPieces;
  cut.logits_by_pieces = true;
  const std::size_t logits = predict_peak(job(cut)).device_total;
  cut.logits_by_pieces = false;
  ASSERT_GT(predict_peak(job(cut)).device_total, logits + 1);
  const std::string advice = memory_advice(job(uncut), logits + 1, 1, {}, variants_of(uncut));
  EXPECT_THAT(advice, HasSubstr("; with model.vocab_pieces \"auto\" and model.logits_by_pieces "
                                "true at zero_optimization.stage 3 it needs " +
                                format_bytes(logits)));
}

TEST(MemoryAdviceVocabPieces, TheTrainingHookCarriesTheVariants) {
  const GptConfig uncut{6, 6, 384, 50257, 64, 1};
  GptConfig cut = uncut;
  cut.vocab_pieces = kAutoVocabPieces;
  TrainingMemory memory;
  memory.input = job(uncut);
  memory.capacity = predict_peak(job(cut)).device_total + 1;
  memory.micro_batch = 1;
  EXPECT_THAT(training_memory_advice_with(variants_of(uncut))(memory),
              HasSubstr("model.vocab_pieces \"auto\" at zero_optimization.stage 3"));
  EXPECT_THAT(training_memory_advice(memory), Not(HasSubstr("vocab_pieces")));
}

}  // namespace
}  // namespace zest
