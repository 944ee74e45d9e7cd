// zest-train with a `pipeline` block, ranks as threads: the PipelineTrainer trains the config's
// job and its losses and gradient norms, step by step, are those of the same job without
// pipeline stages (ZeRO over every rank at the same global batch); a block of one pipeline stage
// trains to the bit as no block; the held-out loss is the same rows' as without pipeline stages;
// a checkpoint saved with pipeline stages resumes with them to the bit and without them within
// rounding; --export-initial with pipeline stages writes the plain run's file byte for byte, and
// a run with pipeline stages started from model.init_from takes the plain run's losses.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"
#include "tests/tools/zest_train_support.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using zest::testing::lines_of;
using zest::testing::ProcessResult;
using zest::testing::StepLoss;

// The default job (4 ranks, stage 3, fp32) made small: 2 micro-batches of 4 rows per step on each
// of the data-parallel ranks without a pipeline.
const std::vector<std::string> kOverrides = {
    "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt",
    "model.n_layer=2", "model.n_head=2", "model.n_embd=64", "steps=3", "scheduler={}",
    "eval_every=0", "train_micro_batch_size_per_gpu=4"};

class ZestTrainPipeline : public zest::testing::ZestTrainJobTest {
 protected:
  ZestTrainPipeline() : ZestTrainJobTest(kOverrides) {}

  void expect_input_error(const std::vector<std::string>& extra,
                          const std::vector<std::string>& flags, const std::string& expected) const {
    const ProcessResult result = train(extra, flags);
    EXPECT_EQ(result.status, 2) << result.err;
    const std::vector<std::string> lines = lines_of(result.err);
    ASSERT_EQ(lines.size(), 1u) << result.err;
    EXPECT_THAT(lines[0], StartsWith("zest-train: error: "));
    EXPECT_THAT(lines[0], HasSubstr(expected));
  }
};

TEST_F(ZestTrainPipeline, TrainsAsTheSameJobWithoutPipelineStages) {
  const std::vector<StepLoss> reference = steps_of({});
  ASSERT_EQ(reference.size(), 3u);
  for (const std::string& pipeline :
       {std::string(R"(pipeline={"stages": 2})"),
        std::string(R"(pipeline={"stages": 4, "schedule": "gpipe"})"),
        std::string(R"(pipeline={"stages": 2, "schedule": "zb_h1"})"),
        std::string(R"(pipeline={"stages": 2, "schedule": "interleaved_1f1b", "partition": "uniform"})")}) {
    for (const char* pipeline_stage : {"zero_optimization.stage=1", "zero_optimization.stage=3"}) {
      const std::vector<StepLoss> steps = steps_of({pipeline, pipeline_stage});
      ASSERT_EQ(steps.size(), reference.size()) << pipeline;
      for (std::size_t i = 0; i < steps.size(); ++i) {
        // fp32; the pipeline sums the same rows' losses and gradients in another order (its
        // micro-batches are a data-parallel index's contiguous rows, the reference's interleave
        // across ranks), and the metrics print 8 significant digits: a few ulps of the step.
        EXPECT_NEAR(steps[i].loss, reference[i].loss, 1e-5 * std::fabs(reference[i].loss))
            << pipeline << ", " << pipeline_stage << ", step " << i + 1;
        EXPECT_NEAR(steps[i].grad_norm, reference[i].grad_norm, 1e-5 * reference[i].grad_norm)
            << pipeline << ", " << pipeline_stage << ", step " << i + 1;
      }
    }
  }
  const ProcessResult shown = train({R"(pipeline={"stages": 2})"});
  ASSERT_EQ(shown.status, 0) << shown.err;
  EXPECT_THAT(shown.out, HasSubstr("batch 32 = 4 x 4 micro-batches x 2 data-parallel ranks, 3 "
                                   "steps, 2 pipeline stages (1f1b)"));
}

TEST_F(ZestTrainPipeline, EvaluatesTheSameHeldOutRowsAsWithoutPipelineStages) {
  auto val_losses = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> sets = extra;
    sets.insert(sets.end(), {"eval_every=1", "data.val_fraction=0.1", "data.val_batches=2"});
    steps_of(sets);
    return held_out_losses();
  };
  const std::vector<double> reference = val_losses({});
  const std::vector<double> pipelined = val_losses({R"(pipeline={"stages": 2})"});
  ASSERT_EQ(reference.size(), 3u);
  ASSERT_EQ(pipelined.size(), reference.size());
  for (std::size_t i = 0; i < reference.size(); ++i) {
    // The same rows and parameters; the mean summed in another order.
    EXPECT_NEAR(pipelined[i], reference[i], 1e-5 * reference[i]) << "evaluation " << i + 1;
  }
}

TEST_F(ZestTrainPipeline, OnePipelineStageTrainsToTheBitAsNoBlock) {
  const std::vector<StepLoss> without = steps_of({});
  const std::vector<StepLoss> with = steps_of({R"(pipeline={"stages": 1})"});
  ASSERT_EQ(with.size(), without.size());
  for (std::size_t i = 0; i < with.size(); ++i) {
    EXPECT_EQ(with[i].loss, without[i].loss);
    EXPECT_EQ(with[i].grad_norm, without[i].grad_norm);
  }
}

TEST_F(ZestTrainPipeline, ACheckpointSavedWithPipelineStagesResumesWithAndWithoutThem) {
  const std::string pipeline = R"(pipeline={"stages": 2})";
  const std::vector<StepLoss> uninterrupted = steps_of({pipeline, "steps=4"});
  ASSERT_EQ(uninterrupted.size(), 4u);
  const std::string dir = "checkpoint.dir=" + path("ckpt");
  ASSERT_EQ(steps_of({pipeline, "steps=2", dir, "checkpoint.every_steps=2"}).size(), 2u);
  // The same mesh (2 pipeline stages x 2 data-parallel ranks): steps 3 and 4 to the bit.
  const std::vector<StepLoss> resumed =
      steps_of({pipeline, "steps=4", dir, R"(checkpoint.resume="auto")"});
  ASSERT_EQ(resumed.size(), 2u);
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i].loss, uninterrupted[i + 2].loss) << "step " << i + 3;
    EXPECT_EQ(resumed[i].grad_norm, uninterrupted[i + 2].grad_norm) << "step " << i + 3;
  }
  // Without pipeline stages (ZeRO over the 4 ranks): the same state, summed in another order.
  std::remove(path("metrics.jsonl").c_str());
  // (From step 2 by its path: the resumed run above saved step 4 on exit.)
  const ProcessResult resumed_plain =
      train({"steps=4", "checkpoint.resume=\"" + path("ckpt") + "/step-2\""},
            {"--metrics", path("metrics.jsonl")});
  ASSERT_EQ(resumed_plain.status, 0) << resumed_plain.err;
  // The same global and micro-batch: the accumulation steps changed with the data-parallel
  // ranks (2 -> 4), which is no change of the run to warn about.
  EXPECT_THAT(resumed_plain.out, HasSubstr("resumed from"));
  EXPECT_THAT(resumed_plain.out, Not(HasSubstr("warning")));
  const std::vector<StepLoss> plain = zest::testing::step_losses(path("metrics.jsonl"));
  ASSERT_EQ(plain.size(), 2u);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_NEAR(plain[i].loss, uninterrupted[i + 2].loss, 1e-5 * uninterrupted[i + 2].loss)
        << "step " << i + 3;
  }
}

std::string file_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(ZestTrainPipeline, ExportInitialWritesThePlainRunsFileByteForByte) {
  const ProcessResult plain = train({}, {"--export-initial", path("plain.safetensors")});
  ASSERT_EQ(plain.status, 0) << plain.err;
  const std::string expected = file_bytes(path("plain.safetensors"));
  ASSERT_FALSE(expected.empty());
  // 2 x 2 (the embedding tied to the head's pipeline stage), 4 x 1, and ZeRO 1 inside the pipeline
  // stages.
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{R"(pipeline={"stages": 2})"},
        std::vector<std::string>{R"(pipeline={"stages": 4, "schedule": "gpipe"})"},
        std::vector<std::string>{R"(pipeline={"stages": 2})", "zero_optimization.stage=1"}}) {
    std::remove(path("pipeline.safetensors").c_str());
    const ProcessResult result = train(extra, {"--export-initial", path("pipeline.safetensors")});
    ASSERT_EQ(result.status, 0) << result.err;
    EXPECT_THAT(result.out, HasSubstr("wrote the initial parameters"));
    EXPECT_TRUE(file_bytes(path("pipeline.safetensors")) == expected) << extra.front();
  }
}

TEST_F(ZestTrainPipeline, StartsFromAnExportedModelAsThePlainRunDoes) {
  // Another seed's model: the runs below start from the file, not from their own seed.
  const ProcessResult exported =
      train({"seed=77"}, {"--export-initial", path("init.safetensors")});
  ASSERT_EQ(exported.status, 0) << exported.err;
  const std::string init = "model.init_from=" + path("init.safetensors");
  const std::vector<StepLoss> plain = steps_of({init});
  const std::vector<StepLoss> own_seed = steps_of({});
  ASSERT_EQ(plain.size(), 3u);
  ASSERT_NE(plain[0].loss, own_seed[0].loss);
  for (const std::string& pipeline :
       {std::string(R"(pipeline={"stages": 2})"),
        std::string(R"(pipeline={"stages": 4, "schedule": "gpipe"})")}) {
    const std::vector<StepLoss> steps = steps_of({pipeline, init});
    ASSERT_EQ(steps.size(), plain.size()) << pipeline;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      // fp32, the same rows summed in another order: within 1e-6 relative.
      EXPECT_NEAR(steps[i].loss, plain[i].loss, 1e-6 * std::fabs(plain[i].loss))
          << pipeline << ", step " << i + 1;
    }
  }
  // A file of another model is refused on every rank, in one line.
  expect_input_error({R"(pipeline={"stages": 2})", "model.n_layer=3", init}, {},
                     "does not hold this model's parameters");
}

// Recomputation inside pipeline stages follows the whole model's plan, which --print-config
// lists: 4 pipeline stages put the embedding (which never recomputes) alone on the first.
TEST_F(ZestTrainPipeline, RecomputesInsidePipelineStagesToTheBit) {
  for (const std::string& pipeline : {std::string(R"(pipeline={"stages": 2})"),
                                      std::string(R"(pipeline={"stages": 4})")}) {
    const std::vector<StepLoss> plain = steps_of({pipeline});
    const std::vector<StepLoss> recomputed =
        steps_of({pipeline, "activation_checkpointing.policy=\"full\""});
    ASSERT_EQ(plain.size(), 3u) << pipeline;
    ASSERT_EQ(recomputed.size(), plain.size()) << pipeline;
    for (std::size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(recomputed[i].loss, plain[i].loss) << pipeline << ", step " << i + 1;
      EXPECT_EQ(recomputed[i].grad_norm, plain[i].grad_norm) << pipeline << ", step " << i + 1;
    }
  }
  const ProcessResult printed =
      train({R"(pipeline={"stages": 2})", "activation_checkpointing.policy=\"full\""},
            {"--print-config"});
  ASSERT_EQ(printed.status, 0) << printed.err;
  EXPECT_EQ(json::parse(printed.out)["activation_checkpointing"]["recomputed"],
            json({"block0", "block1"}));
}

// Vocabulary pieces cannot cross pipeline stages (the pieces read the head's saved values): one
// input error from the config, before anything runs, at any pipeline shape — never a crash.
TEST_F(ZestTrainPipeline, VocabularyPiecesWithPipelineStagesAreOneInputError) {
  for (const std::string& pipeline_stages :
       {std::string("pipeline.stages=2"), std::string("pipeline.stages=4")}) {
    for (const std::vector<std::string>& flags :
         {std::vector<std::string>{}, std::vector<std::string>{"--print-config"}}) {
      expect_input_error({"model.vocab_pieces=2", pipeline_stages}, flags,
                         "model.vocab_pieces: must be 1 with pipeline.stages > 1");
    }
  }
}

}  // namespace
