// The out-of-memory advice names activation checkpointing when activations are what overflows:
// instead of a smaller micro-batch when none fits (one sequence per rank), beside it otherwise.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <string>

#include "base/byte_size.h"
#include "models/gpt.h"
#include "planner/memory_advice.h"
#include "planner/peak_plan.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const GptConfig kGpt{/*n_layer=*/4, /*n_head=*/2, /*n_embd=*/64, /*vocab_size=*/256,
                     /*seq_len=*/64};

PeakPlanInput job(std::int64_t sequences, RecomputePolicy policy = RecomputePolicy::kNone) {
  Gpt model(kGpt);
  EngineOptions options;
  options.stage = 3;
  options.activation_checkpointing.policy = policy;
  return plan_input(model, {sequences, kGpt.seq_len}, options, 2, 2);
}

MicroBatchMemory resize() {
  return [](std::int64_t sequences) { return Gpt(kGpt).unit_memory({sequences, kGpt.seq_len}); };
}

TEST(MemoryAdvice, NamesActivationCheckpointingWhenNoSmallerMicroBatchFits) {
  const std::size_t none = predict_peak(job(1)).device_total;
  const std::size_t full = predict_peak(job(1, RecomputePolicy::kFull)).device_total;
  const std::size_t selective = predict_peak(job(1, RecomputePolicy::kSelective)).device_total;
  ASSERT_LT(full, selective);
  ASSERT_LT(selective, none);
  // Between full and selective: only full fits.
  const std::string advice = memory_advice(job(1), full + 1, 1, resize());
  EXPECT_THAT(advice, HasSubstr("; with activation_checkpointing.policy \"full\" it needs " +
                                format_bytes(full) + ", which fits in"));
  // Between selective and none: selective, the lighter, is named.
  EXPECT_THAT(memory_advice(job(1), selective + 1, 1, resize()),
              HasSubstr("with activation_checkpointing.policy \"selective\" it needs"));
  // Already recomputing fully: nothing more to name.
  EXPECT_THAT(memory_advice(job(1, RecomputePolicy::kFull), full - 1, 1, resize()),
              Not(HasSubstr("activation_checkpointing")));
}

TEST(MemoryAdvice, NamesActivationCheckpointingBesideASmallerMicroBatch) {
  const std::size_t capacity = predict_peak(job(2)).device_total + 1;
  ASSERT_LE(predict_peak(job(4, RecomputePolicy::kFull)).device_total, capacity);
  const std::string advice = memory_advice(job(4), capacity, 4, resize());
  EXPECT_THAT(advice, HasSubstr("with train_micro_batch_size_per_gpu 2"));
  EXPECT_THAT(advice, HasSubstr("; or, keeping the micro-batch, with "
                                "activation_checkpointing.policy"));
}

}  // namespace
}  // namespace zest
