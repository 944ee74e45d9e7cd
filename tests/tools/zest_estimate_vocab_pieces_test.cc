// Runs the built zest-estimate binary on a large-vocabulary GPT (6 x 384, vocabulary 50257, 4
// ranks): where nothing else fits, its advice names model.vocab_pieces "auto" (with the logits by
// pieces where they decide), and --fit shows the larger model those fit at stage 3; a config
// already in pieces is not told to cut them again.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using zest::testing::ProcessResult;

const std::string kEstimate = ZEST_BINARY_DIR "/bin/zest-estimate";

std::vector<std::string> wide_vocabulary(const std::vector<std::string>& more) {
  std::vector<std::string> args = {
      "--config", ZEST_SOURCE_DIR "/configs/default.json",
      "--set", "model.n_embd=384",
      "--set", "model.vocab_size=50257",
      "--set", "data.type=tokens",
      "--set", "data.path=unused.bin",
      "--set", "train_batch_size=4",
      "--set", "train_micro_batch_size_per_gpu=1",
      "--set", "activation_checkpointing={\"policy\": \"full\"}",
      "--json"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

class ZestEstimateVocabPieces : public zest::testing::ScratchDirectoryTest {
 protected:
  json estimate(const std::vector<std::string>& more) const {
    const ProcessResult result = zest::testing::run_program(
        kEstimate, wide_vocabulary(more), {path("stdout.txt"), path("stderr.txt")});
    EXPECT_EQ(result.status, 0) << result.err;
    return json::parse(result.out);
  }
};

TEST_F(ZestEstimateVocabPieces, AdviceNamesAutoPiecesWhereNothingElseFits) {
  // Offload at stage 3 needs 167.70 MiB, "auto" pieces less.
  const json out = estimate({"--device-memory", "160MiB"});
  EXPECT_EQ(out["fits"], false);
  EXPECT_THAT(out["advice"].get<std::string>(),
              HasSubstr("; with model.vocab_pieces \"auto\" at zero_optimization.stage 3 it "
                        "needs"));
  // Already in pieces: not proposed again.
  const json cut = estimate({"--device-memory", "100MiB", "--set", "model.vocab_pieces=\"auto\""});
  EXPECT_THAT(cut["advice"].get<std::string>(), Not(HasSubstr("vocab_pieces")));
}

TEST_F(ZestEstimateVocabPieces, AdviceNamesTheLogitsByPiecesWhereTheLogitsDecide) {
  // Seq 1024: "auto" pieces need 448 MiB, offload 443.64 MiB, with the logits by pieces
  // 283.63 MiB.
  const json out = estimate({"--device-memory", "300MiB", "--set", "model.seq_len=1024"});
  EXPECT_THAT(out["advice"].get<std::string>(),
              HasSubstr("with model.vocab_pieces \"auto\" and model.logits_by_pieces true at "
                        "zero_optimization.stage 3 it needs"));
}

TEST_F(ZestEstimateVocabPieces, FitShowsTheLargerModelThePiecesFitAtStage3) {
  const json fit = estimate({"--device-memory", "190MiB", "--fit"})["fit"];
  ASSERT_EQ(fit.size(), 4u);
  for (std::size_t stage = 0; stage < 3; ++stage) EXPECT_FALSE(fit[stage].contains("variant"));
  ASSERT_TRUE(fit[3].contains("variant")) << fit.dump();
  const json& variant = fit[3]["variant"];
  EXPECT_THAT(variant["change"].get<std::string>(), HasSubstr("model.vocab_pieces \"auto\""));
  EXPECT_GT(variant["n_layer"].get<std::int64_t>(), fit[3]["n_layer"].get<std::int64_t>());
  EXPECT_GT(variant["n_embd"].get<std::int64_t>(), fit[3]["n_embd"].get<std::int64_t>());
}

// With pipeline stages the config refuses vocabulary pieces (they cannot cross stages), so the
// estimate says so in one line instead of crashing while it names the stages' units.
TEST_F(ZestEstimateVocabPieces, PipelineStagesWithPiecesAreOneInputError) {
  for (const std::string& stages : {std::string("pipeline.stages=2"),
                                    std::string("pipeline.stages=4")}) {
    const ProcessResult result = zest::testing::run_program(
        kEstimate, wide_vocabulary({"--set", "model.vocab_pieces=2", "--set", stages}),
        {path("stdout.txt"), path("stderr.txt")});
    EXPECT_EQ(result.status, 2) << stages << ": " << result.err;
    EXPECT_THAT(result.err, HasSubstr("model.vocab_pieces: must be 1 with pipeline.stages > 1"));
    EXPECT_EQ(zest::testing::lines_of(result.err).size(), 1u) << result.err;
  }
}

}  // namespace
