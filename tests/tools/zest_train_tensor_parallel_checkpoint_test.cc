// zest-train's checkpoints with a `tensor_parallel` block, ranks as threads: a checkpoint saved
// at tensor-parallel size 2 resumes at size 1, and that run's at size 4, to the losses and
// gradient norms of the uninterrupted size-2 run; zest-ckpt exports it as the whole model's
// tensors, which are the tensor-parallel-1 run's parameters at the same step; and zest-ckpt
// reshards it over another number of data-parallel ranks, each tensor rank's part on its own. A
// size-2 run started from an exported model (model.init_from) trains as the size-1 run does. With
// pipeline stages over the tensor-parallel groups (3D), the checkpoint resumes without them at
// size 1 and back, and exports the same whole tensors.
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "checkpoint/safetensors.h"
#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"
#include "tests/tools/zest_train_support.h"

namespace {

using ::testing::HasSubstr;
using zest::testing::ProcessResult;
using zest::testing::StepLoss;

// The default job made small: 4 heads, so that sizes 1, 2 and 4 all divide them; the vocabulary
// (the text's bytes) divides by 4.
const std::vector<std::string> kOverrides = {
    "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt",
    "model.n_layer=2", "model.n_head=4", "model.n_embd=64", "model.vocab_size=256",
    "scheduler={}", "eval_every=0", "train_micro_batch_size_per_gpu=4"};

const std::string kSize2 = R"(tensor_parallel={"size": 2})";
const std::string kSize4 = R"(tensor_parallel={"size": 4})";

// fp32, sums in another order at each size (zest_train_tensor_parallel_test.cc): the losses and
// norms agree to a few ulps per step, and the metrics print 8 significant digits.
constexpr double kRelative = 1e-5;

class ZestTrainTensorParallelCheckpoint : public zest::testing::ZestTrainJobTest {
 protected:
  ZestTrainTensorParallelCheckpoint() : ZestTrainJobTest(kOverrides) {}

  ProcessResult ckpt(const std::vector<std::string>& args) const {
    return zest::testing::run_program(ZEST_BINARY_DIR "/bin/zest-ckpt", args,
                                      {path("ckpt-stdout.txt"), path("ckpt-stderr.txt")});
  }

  std::map<std::string, std::vector<float>> exported(const std::string& checkpoint,
                                                     const std::string& name) const {
    const std::string out = path(name);
    const ProcessResult result = ckpt({"export", checkpoint, "--out", out});
    EXPECT_EQ(result.status, 0) << result.err;
    std::map<std::string, std::vector<float>> tensors;
    const zest::SafetensorsReader reader(out);
    for (const zest::SafetensorsTensor& tensor : reader.tensors()) {
      tensors[tensor.name] = reader.read_float32(tensor.name);
    }
    return tensors;
  }
};

void expect_same_steps(const std::vector<StepLoss>& resumed, const std::vector<StepLoss>& whole,
                       std::size_t first, const std::string& what) {
  ASSERT_FALSE(resumed.empty()) << what;
  ASSERT_GE(whole.size(), first + resumed.size()) << what;
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    const StepLoss& expected = whole[first + i];
    EXPECT_NEAR(resumed[i].loss, expected.loss, kRelative * std::fabs(expected.loss))
        << what << ", step " << first + i + 1;
    EXPECT_NEAR(resumed[i].grad_norm, expected.grad_norm, kRelative * expected.grad_norm)
        << what << ", step " << first + i + 1;
  }
}

TEST_F(ZestTrainTensorParallelCheckpoint, ResumesAtOtherTensorParallelSizesToTheSameLosses) {
  // Size 2 x 2 data-parallel ranks, 6 steps, saved at 2, 4 and 6.
  const std::string first = path("size2");
  const std::vector<StepLoss> whole =
      steps_of({"world.ranks=4", kSize2, "steps=6", "zero_optimization.stage=3",
                "checkpoint.every_steps=2", "checkpoint.dir=" + first});
  ASSERT_EQ(whole.size(), 6u);

  // Its step 2 at size 1 on 2 data-parallel ranks (stage 1), saving its own step 4 ...
  const std::string second = path("size1");
  const std::vector<StepLoss> at_size1 =
      steps_of({"world.ranks=2", "steps=4", "zero_optimization.stage=1", "checkpoint.every_steps=2",
                "checkpoint.dir=" + second},
               {"--resume", first + "/step-2"});
  expect_same_steps(at_size1, whole, 2, "size 2 -> 1");
  const std::string said = zest::testing::read_file(path("stdout.txt"));
  EXPECT_THAT(said, HasSubstr("saved by 4 ranks, tensor-parallel size 2 at stage 3; resharded"));

  // ... which resumes at size 4 on 1 data-parallel rank with sequence parallelism.
  const std::vector<StepLoss> at_size4 =
      steps_of({"world.ranks=4", kSize4, "tensor_parallel.sequence_parallel=true", "steps=6"},
               {"--resume", second + "/step-4"});
  expect_same_steps(at_size4, whole, 4, "size 2 -> 1 -> 4");
}

// The outer loop's state (its anchor and momentum beside the parameters and the inner optimizer)
// saved at size 2 resumes at size 1: with one group, resuming is exact
// (zest_train_outer_loop_test), so steps 3-5 are the uninterrupted run's — step 5 comes after the
// meeting at step 4, whose outer step uses the momentum the checkpoint kept (measured: resumed with
// outer momentum 0 instead, step 5's loss is 4.43 against 4.03).
TEST_F(ZestTrainTensorParallelCheckpoint, TheOuterLoopsStateResumesAtAnotherSize) {
  const std::string outer = R"(outer_loop={"type": "diloco", "inner_steps": 2, "groups": 1})";
  const std::string saved = path("outer");
  const std::vector<StepLoss> whole =
      steps_of({"world.ranks=8", kSize2, outer, "steps=5", "checkpoint.every_steps=2",
                "checkpoint.dir=" + saved});
  ASSERT_EQ(whole.size(), 5u);
  const std::vector<StepLoss> at_size1 =
      steps_of({"world.ranks=4", outer, "steps=5"}, {"--resume", saved + "/step-2"});
  expect_same_steps(at_size1, whole, 2, "outer loop, size 2 -> 1");
}

// Pipeline stages over the tensor-parallel groups: each (pipeline stage, tensor rank,
// data-parallel rank) saves its own file, and the checkpoint resumes without pipeline stages at
// size 1, whose checkpoint resumes with them again.
TEST_F(ZestTrainTensorParallelCheckpoint, ResumesAcrossPipelineAndTensorParallelLayouts) {
  // 2 pipeline stages x 2 data-parallel ranks x size 2, sequence-parallel, ZeRO 3, 6 steps.
  const std::string first = path("pipelined");
  const std::vector<StepLoss> whole =
      steps_of({"world.ranks=8", kSize2, "tensor_parallel.sequence_parallel=true",
                R"(pipeline={"stages": 2})", "steps=6", "zero_optimization.stage=3",
                "checkpoint.every_steps=2", "checkpoint.dir=" + first});
  ASSERT_EQ(whole.size(), 6u);
  // Its step 2 at size 1 on 2 data-parallel ranks without pipeline stages, saving step 4 ...
  const std::string second = path("plain");
  const std::vector<StepLoss> plain =
      steps_of({"world.ranks=2", "steps=4", "zero_optimization.stage=1", "checkpoint.every_steps=2",
                "checkpoint.dir=" + second},
               {"--resume", first + "/step-2"});
  expect_same_steps(plain, whole, 2, "size 2 x 2 pipeline stages -> size 1");
  // ... which resumes at size 2 x 2 pipeline stages (interleaved) on 1 data-parallel rank.
  const std::vector<StepLoss> again =
      steps_of({"world.ranks=4", kSize2,
                R"(pipeline={"stages": 2, "schedule": "interleaved_1f1b", "partition": "uniform"})",
                "steps=6"},
               {"--resume", second + "/step-4"});
  expect_same_steps(again, whole, 4, "size 2 x 2 pipeline stages -> size 1 -> again");
}

TEST_F(ZestTrainTensorParallelCheckpoint, ExportsTheWholeModelAsTheTensorParallelOneRunHasIt) {
  const std::string plain = path("size1");
  ASSERT_EQ(
      train({"world.ranks=2", "steps=2", "checkpoint.every_steps=2", "checkpoint.dir=" + plain})
          .status,
      0);
  const auto from_plain = exported(plain, "plain.safetensors");
  // Size 2 alone, and under 2 pipeline stages (each pipeline stage's tensor ranks save its units).
  for (const std::string& pipeline :
       {std::string("pipeline={}"), std::string(R"(pipeline={"stages": 2})")}) {
    const std::string cut = path("size2");
    std::filesystem::remove_all(cut);
    const int ranks = pipeline == "pipeline={}" ? 4 : 8;
    ASSERT_EQ(train({"world.ranks=" + std::to_string(ranks), kSize2, pipeline, "steps=2",
                     "checkpoint.every_steps=2", "checkpoint.dir=" + cut})
                  .status,
              0)
        << pipeline;
    const auto from_cut = exported(cut, "cut.safetensors");
    ASSERT_EQ(from_cut.size(), from_plain.size()) << pipeline;
    for (const auto& [name, values] : from_plain) {
      ASSERT_TRUE(from_cut.count(name)) << pipeline << ": " << name;
      const std::vector<float>& other = from_cut.at(name);
      ASSERT_EQ(other.size(), values.size()) << name;
      for (std::size_t i = 0; i < values.size(); ++i) {
        // models/tensor_parallel_gpt_test.cc's bound: 2 AdamW steps, sums in another order.
        ASSERT_NEAR(other[i], values[i], 1e-5 * std::fabs(values[i]) + 2e-6)
            << pipeline << ": " << name << "[" << i << "]";
      }
    }
  }
}

TEST_F(ZestTrainTensorParallelCheckpoint, StartsFromAnExportedModelAsTheSizeOneRunDoes) {
  // A model trained 2 steps at size 1, exported whole, is where both runs start.
  const std::string saved = path("saved");
  ASSERT_EQ(
      train({"world.ranks=2", "steps=2", "checkpoint.every_steps=2", "checkpoint.dir=" + saved})
          .status,
      0);
  const std::string model = path("model.safetensors");
  ASSERT_EQ(ckpt({"export", saved, "--out", model}).status, 0);
  const std::vector<StepLoss> plain =
      steps_of({"world.ranks=2", "steps=3", "model.init_from=" + model});
  const std::vector<StepLoss> cut =
      steps_of({"world.ranks=4", kSize2, "steps=3", "model.init_from=" + model});
  ASSERT_EQ(plain.size(), 3u);
  expect_same_steps(cut, plain, 0, "size 2 from the exported model");
}

TEST_F(ZestTrainTensorParallelCheckpoint, ReshardedOverOtherDataParallelRanksItResumesAlike) {
  const std::string saved = path("saved");
  const std::vector<StepLoss> whole = steps_of(
      {"world.ranks=4", kSize2, "steps=4", "checkpoint.every_steps=2", "checkpoint.dir=" + saved});
  ASSERT_EQ(whole.size(), 4u);
  const std::string resharded = path("resharded");
  const ProcessResult result =
      ckpt({"reshard", saved + "/step-2", "--out", resharded, "--world", "1"});
  ASSERT_EQ(result.status, 0) << result.err;
  const std::string manifest = zest::testing::read_file(resharded + "/manifest.json");
  EXPECT_THAT(manifest, HasSubstr("\"tensor_parallel_size\": 2"));
  EXPECT_THAT(manifest, HasSubstr("\"axis\": \"columns\""));
  const std::vector<StepLoss> resumed =
      steps_of({"world.ranks=2", kSize2, "steps=4"}, {"--resume", resharded});
  expect_same_steps(resumed, whole, 2, "resharded to 1 data-parallel rank");
}

}  // namespace
