// zest-train with a `tensor_parallel` block, ranks as threads: 4 ranks as 2 data-parallel x 2
// tensor-parallel (with and without sequence parallelism, with full recomputation, with the
// optimizer's state and the parameters offloaded, with hybrid sharding) train the losses and
// gradient norms, step by step, of the same job on 2 ranks without it (the same global batch, the
// same seed: the slices start as the whole model's values); the description says the layout; a
// size that does not divide the ranks is one input error. (Its plan:
// zest_estimate_tensor_parallel_test.cc.)
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"
#include "tests/tools/zest_train_support.h"

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using zest::testing::lines_of;
using zest::testing::ProcessResult;
using zest::testing::StepLoss;

// The default job made small; the vocabulary (the text's bytes) divides by 2.
const std::vector<std::string> kOverrides = {
    "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt",
    "model.n_layer=2", "model.n_head=2", "model.n_embd=64", "model.vocab_size=256", "steps=3",
    "scheduler={}", "eval_every=0", "train_micro_batch_size_per_gpu=4"};

class ZestTrainTensorParallel : public zest::testing::ZestTrainJobTest {
 protected:
  ZestTrainTensorParallel() : ZestTrainJobTest(kOverrides) {}
};

TEST_F(ZestTrainTensorParallel, TrainsAsTheSameJobOnItsDataParallelRanksAlone) {
  const std::vector<StepLoss> reference = steps_of({"world.ranks=2"});
  ASSERT_EQ(reference.size(), 3u);
  const std::string sequence_parallel = "tensor_parallel.sequence_parallel=true";
  for (const std::string stage :
       {"zero_optimization.stage=1", "zero_optimization.stage=3", sequence_parallel.c_str(),
        R"(activation_checkpointing={"policy": "full"})",
        R"(zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"},)"
        R"( "offload_param": {"device": "cpu"}})",
        R"(zero_optimization={"stage": 3, "hybrid_shard_size": 1})"}) {
    std::string out;
    const std::vector<StepLoss> steps =
        steps_of({"world.ranks=4", R"(tensor_parallel={"size": 2})", stage}, {}, &out);
    ASSERT_EQ(steps.size(), reference.size()) << stage;
    // The description says the layout, and says sequence parallelism where it is on.
    EXPECT_THAT(out, HasSubstr("x 2 data-parallel ranks, 3 steps, 2 tensor-parallel ranks"))
        << stage;
    EXPECT_EQ(out.find("2 tensor-parallel ranks (sequence-parallel)") != std::string::npos,
              stage == sequence_parallel)
        << stage;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      // fp32; the group sums the row-parallel products and the vocabulary's exp-sums in another
      // order, and the metrics print 8 significant digits: a few ulps of the step.
      EXPECT_NEAR(steps[i].loss, reference[i].loss, 1e-5 * std::fabs(reference[i].loss))
          << stage << ", step " << i + 1;
      EXPECT_NEAR(steps[i].grad_norm, reference[i].grad_norm, 1e-5 * reference[i].grad_norm)
          << stage << ", step " << i + 1;
    }
  }
}

// 3D: 2 pipeline stages x 2 data-parallel ranks x 2 tensor-parallel ranks (8 ranks as threads),
// over 10 steps with a held-out loss after each, against the same job on 4 data-parallel ranks (a
// held-out batch is micro-batch x world.ranks / tensor_parallel.size rows at every pipeline mesh).
TEST_F(ZestTrainTensorParallel, PipelineStagesOverTheGroupsTrainAsDataParallelRanksAlone) {
  const std::vector<std::string> evaluated = {"steps=10", "eval_every=1", "data.val_fraction=0.1",
                                              "data.val_batches=1"};
  std::vector<std::string> plain = evaluated;
  plain.push_back("world.ranks=4");
  const std::vector<StepLoss> reference = steps_of(plain);
  const std::vector<double> reference_held_out = held_out_losses();
  ASSERT_EQ(reference.size(), 10u);
  ASSERT_EQ(reference_held_out.size(), 10u);
  for (const char* variant :
       {"tensor_parallel.sequence_parallel=false", "tensor_parallel.sequence_parallel=true"}) {
    std::vector<std::string> sets = evaluated;
    sets.insert(sets.end(), {"world.ranks=8", R"(tensor_parallel={"size": 2})", variant,
                             R"(pipeline={"stages": 2})", "zero_optimization.stage=3"});
    std::string out;
    const std::vector<StepLoss> steps = steps_of(sets, {}, &out);
    const std::vector<double> held_out = held_out_losses();
    ASSERT_EQ(steps.size(), reference.size()) << variant;
    EXPECT_THAT(out, HasSubstr("2 pipeline stages")) << variant;
    EXPECT_THAT(out, HasSubstr("2 tensor-parallel ranks")) << variant;
    ASSERT_EQ(held_out.size(), reference_held_out.size()) << variant;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      EXPECT_NEAR(steps[i].loss, reference[i].loss, 1e-5 * std::fabs(reference[i].loss))
          << variant << ", step " << i + 1;
      EXPECT_NEAR(steps[i].grad_norm, reference[i].grad_norm, 1e-5 * reference[i].grad_norm)
          << variant << ", step " << i + 1;
      EXPECT_NEAR(held_out[i], reference_held_out[i], 1e-5 * reference_held_out[i])
          << variant << ", held-out loss after step " << i + 1;
    }
  }
}

// The outer loop's groups by node: with 2 tensor-parallel ranks on nodes of 4 ranks, each node
// holds 2 data-parallel ranks of each tensor index, so 8 ranks train in the 2 groups that 4 ranks
// on nodes of 2 do, and the same losses (a meeting after step 2).
TEST_F(ZestTrainTensorParallel, OuterLoopGroupsByNodeTrainAsWithoutTensorParallelism) {
  const std::string outer = R"(outer_loop={"type": "diloco", "inner_steps": 2})";
  const std::vector<StepLoss> reference =
      steps_of({"world.ranks=4", "world.ranks_per_node=2", outer});
  ASSERT_EQ(reference.size(), 3u);
  const std::vector<StepLoss> steps = steps_of(
      {"world.ranks=8", "world.ranks_per_node=4", R"(tensor_parallel={"size": 2})", outer});
  ASSERT_EQ(steps.size(), reference.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    EXPECT_NEAR(steps[i].loss, reference[i].loss, 1e-5 * std::fabs(reference[i].loss))
        << "step " << i + 1;
  }
  // Grouped otherwise (ranks_per_node 2 or 8 here: 4 groups of 1, 1 group of 4) the second step's
  // loss moves by about 1e-3 (measured), as it does without the outer loop.
  const std::vector<StepLoss> synchronous = steps_of({"world.ranks=4"});
  EXPECT_GT(std::fabs(synchronous[2].loss - reference[2].loss), 1e-4 * reference[2].loss);
}

std::string file_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// --export-initial gathers each parameter's slices over the group and writes it whole: the same
// file, byte for byte, as the run without tensor parallelism (the slices are drawn as the parts
// of that model), with sequence parallelism and under pipeline stages too.
TEST_F(ZestTrainTensorParallel, ExportInitialWritesTheSameFileAsWithoutIt) {
  const ProcessResult plain = train({"world.ranks=2"}, {"--export-initial", path("plain.st")});
  ASSERT_EQ(plain.status, 0) << plain.err;
  const std::string expected = file_bytes(path("plain.st"));
  ASSERT_FALSE(expected.empty());
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"world.ranks=4", R"(tensor_parallel={"size": 2})"},
        std::vector<std::string>{"world.ranks=4",
                                 R"(tensor_parallel={"size": 2, "sequence_parallel": true})",
                                 "zero_optimization.stage=1"},
        std::vector<std::string>{"world.ranks=8", R"(tensor_parallel={"size": 2})",
                                 R"(pipeline={"stages": 2})"}}) {
    std::remove(path("sliced.st").c_str());
    const ProcessResult result = train(extra, {"--export-initial", path("sliced.st")});
    ASSERT_EQ(result.status, 0) << result.err;
    EXPECT_THAT(result.out, HasSubstr("wrote the initial parameters"));
    EXPECT_TRUE(file_bytes(path("sliced.st")) == expected) << extra[1];
  }
}

TEST_F(ZestTrainTensorParallel, ASizeThatDoesNotDivideTheRanksIsOneInputError) {
  const ProcessResult result = train({"world.ranks=4", R"(tensor_parallel={"size": 3})"});
  EXPECT_EQ(result.status, 2) << result.err;
  const std::vector<std::string> lines = lines_of(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_THAT(lines[0], StartsWith("zest-train: error: "));
  EXPECT_THAT(lines[0], HasSubstr("tensor_parallel.size 3 = 3 does not divide world.ranks 4"));
}

// A NaN on one rank of a tensor-parallel group: every rank of the group saw the group's flag,
// and the run's one line names the rank and unit where it arose, not a rank that echoed it (with
// pipeline stages too, where the flag also crosses the stages).
TEST_F(ZestTrainTensorParallel, ANanGradientStopsTheRunNamingTheRankWhereItArose) {
  for (const char* pipeline : {"pipeline={}", "pipeline.stages=2"}) {
    const ProcessResult result =
        train({"world.ranks=4", R"(tensor_parallel={"size": 2})", pipeline,
               R"(debug={"fault": {"kind": "nan_gradient", "rank": 1, "step": 2}})"});
    EXPECT_EQ(result.status, 1) << result.err;
    const std::vector<std::string> lines = lines_of(result.err);
    ASSERT_EQ(lines.size(), 1u) << result.err;
    EXPECT_THAT(lines[0], HasSubstr("non-finite gradient at step 2 on rank 1, unit ")) << pipeline;
  }
}

}  // namespace
