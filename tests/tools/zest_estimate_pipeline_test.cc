// zest-estimate with a `pipeline` block: it prints each pipeline stage's plan as the planner
// computes it (planner/pipeline_plan.h) and the schedule's bubble beside the closed formula; a
// block of one pipeline stage plans exactly as no block; --fit holds every pipeline stage to the
// capacity; zest-train --print-config shows the resolved partition.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "resolve/resolved_config.h"
#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"
#include "tools/common/memory_estimate.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using zest::testing::lines_of;
using zest::testing::ProcessResult;

const std::string kEstimate = ZEST_BINARY_DIR "/bin/zest-estimate";
const std::string kTrain = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kGptConfig = ZEST_SOURCE_DIR "/configs/default.json";
// The default job made small, with 4 micro-batches per step on each of 2 data-parallel ranks.
const std::vector<std::string> kOverrides = {
    "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt",
    "model.n_layer=4", "model.n_head=2", "model.n_embd=64", "model.seq_len=32",
    "train_batch_size=32", "train_micro_batch_size_per_gpu=4", "scheduler={}", "eval_every=0"};
const std::string kPipeline = R"(pipeline={"stages": 2, "partition": "uniform"})";

std::vector<std::string> args_with(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--config", kGptConfig};
  for (const std::string& assignment : kOverrides) args.insert(args.end(), {"--set", assignment});
  for (const std::string& assignment : extra) args.insert(args.end(), {"--set", assignment});
  return args;
}

class ZestEstimatePipeline : public zest::testing::ScratchDirectoryTest {
 protected:
  ProcessResult run(const std::string& binary, const std::vector<std::string>& args) const {
    return zest::testing::run_program(binary, args, {path("stdout.txt"), path("stderr.txt")});
  }
  json estimate_json(std::vector<std::string> args) const {
    args.push_back("--json");
    const ProcessResult result = run(kEstimate, args);
    EXPECT_EQ(result.status, 0) << result.err;
    return json::parse(result.out);
  }
  void expect_input_error(const std::string& binary, const std::vector<std::string>& args,
                          const std::string& expected) const {
    const ProcessResult result = run(binary, args);
    EXPECT_EQ(result.status, 2) << result.err;
    const std::vector<std::string> lines = lines_of(result.err);
    ASSERT_EQ(lines.size(), 1u) << result.err;
    EXPECT_THAT(lines[0], HasSubstr(expected));
  }
};

TEST_F(ZestEstimatePipeline, PrintsEachPipelineStagesPlanAndTheBubble) {
  const json printed = estimate_json(args_with({kPipeline}));
  std::vector<std::string> overrides = kOverrides;
  overrides.push_back(kPipeline);
  const zest::TrainConfig config = zest::load_resolved_config(kGptConfig, overrides);
  const zest::EstimateJob job = zest::job_from_config(config);
  const zest::PipelineEstimate planned = zest::pipeline_estimate(config, job);
  const json& pipeline = printed["pipeline"];
  EXPECT_EQ(pipeline["stages"], 2);
  EXPECT_EQ(pipeline["data_parallel"], 2);
  EXPECT_EQ(pipeline["micro_batches"], 4);
  // 1F1B's bubble at p = 2, m = 4: (p - 1) / m, simulated and by the formula.
  EXPECT_DOUBLE_EQ(pipeline["bubble_ratio"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(pipeline["closed_form_bubble_ratio"].get<double>(), 0.25);
  ASSERT_EQ(pipeline["per_stage"].size(), 2u);
  EXPECT_EQ(pipeline["per_stage"][0]["units"], json::array({"embedding", "block0", "block1"}));
  EXPECT_EQ(pipeline["per_stage"][1]["units"], json::array({"block2", "block3", "head"}));
  EXPECT_EQ(pipeline["per_stage"][1]["tied_copies"], json::array({"embedding"}));
  EXPECT_EQ(pipeline["per_stage"][0]["peak_in_flight"], 2);
  EXPECT_EQ(pipeline["per_stage"][1]["peak_in_flight"], 1);
  for (std::size_t s = 0; s < 2; ++s) {
    const json& bytes = pipeline["per_stage"][s]["per_rank_bytes"];
    for (zest::Category category : zest::all_categories()) {
      EXPECT_EQ(bytes[zest::category_name(category)].get<std::size_t>(),
                planned.pipeline_stages[s].peak.of(category))
          << zest::category_name(category) << " of pipeline stage " << s;
    }
  }
  // The top-level numbers are the largest pipeline stage's, on its data-parallel ranks.
  const std::size_t largest = planned.largest();
  EXPECT_EQ(printed["per_rank_bytes"]["device_total"].get<std::size_t>(),
            planned.pipeline_stages[largest].peak.device_total);
  EXPECT_EQ(printed["ranks"], 2);

  const ProcessResult text = run(kEstimate, args_with({kPipeline}));
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("bubble 0.2500 of the compute simulated, 0.2500 by the closed "
                                  "formula"));
  EXPECT_THAT(text.out, HasSubstr("pipeline stage 0: embedding..block1; 2 micro-batches in flight"));
  EXPECT_THAT(text.out, HasSubstr("pipeline stage 1: block2..head (+ a copy of embedding, tied); "
                                  "1 micro-batch in flight"));
  EXPECT_THAT(text.out, HasSubstr(std::to_string(planned.pipeline_stages[0].peak.device_total)));
  EXPECT_THAT(text.out, HasSubstr("verdict: fits in 512.00 MiB per rank (the largest, pipeline "
                                  "stage " + std::to_string(largest)));
}

TEST_F(ZestEstimatePipeline, OnePipelineStagePlansAsNoBlock) {
  json without = estimate_json(args_with({}));
  json with = estimate_json(args_with({R"(pipeline={"stages": 1})"}));
  EXPECT_EQ(with, without);
}

TEST_F(ZestEstimatePipeline, FitFindsTheLargestModelWhoseEveryPipelineStageFits) {
  std::vector<std::string> args = args_with({kPipeline});
  args.insert(args.end(), {"--fit", "--device-memory", "24MiB"});
  const json fits = estimate_json(args)["fit"];
  ASSERT_EQ(fits.size(), 4u);
  std::vector<std::string> overrides = kOverrides;
  overrides.push_back(kPipeline);
  auto fits_at = [&](int pipeline_stage, std::int64_t layers) {
    std::vector<std::string> changed = overrides;
    changed.push_back("zero_optimization.stage=" + std::to_string(pipeline_stage));
    changed.push_back("model.n_layer=" + std::to_string(layers));
    const zest::TrainConfig config = zest::load_resolved_config(kGptConfig, changed);
    const zest::PipelineEstimate estimate =
        zest::pipeline_estimate(config, zest::job_from_config(config));
    return estimate.pipeline_stages[estimate.largest()].peak.device_total <= 24u << 20;
  };
  for (int pipeline_stage = 0; pipeline_stage < 4; ++pipeline_stage) {
    ASSERT_TRUE(fits[pipeline_stage]["n_layer"].is_number()) << fits[pipeline_stage].dump();
    const std::int64_t layers = fits[pipeline_stage]["n_layer"].get<std::int64_t>();
    EXPECT_TRUE(fits_at(pipeline_stage, layers)) << "stage " << pipeline_stage;
    EXPECT_FALSE(fits_at(pipeline_stage, layers + 1)) << "stage " << pipeline_stage;
  }
  // A higher pipeline stage never fits fewer layers.
  EXPECT_LE(fits[0]["n_layer"], fits[3]["n_layer"]);
}

TEST_F(ZestEstimatePipeline, HtmlIsRefusedInOneLine) {
  std::vector<std::string> html = args_with({kPipeline});
  html.insert(html.end(), {"--html", path("plan.html")});
  expect_input_error(kEstimate, html, "zest-estimate: error: --html: not with pipeline stages");
}

TEST_F(ZestEstimatePipeline, ZestTrainPrintsThePartition) {
  std::vector<std::string> args = args_with({kPipeline});
  args.push_back("--print-config");
  const ProcessResult printed = run(kTrain, args);
  ASSERT_EQ(printed.status, 0) << printed.err;
  const json resolved = json::parse(printed.out);
  EXPECT_EQ(resolved["pipeline"]["units"],
            json::parse(R"([["embedding", "block0", "block1"], ["block2", "block3", "head"]])"));
  EXPECT_EQ(resolved["gradient_accumulation_steps"], 4);
  expect_input_error(kTrain, args_with({R"(pipeline={"stages": 3})"}),
                     "pipeline.stages: 3 does not divide world.ranks (4)");
}

}  // namespace
