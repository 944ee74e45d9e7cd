// The resolution step against the parser: parsing alone decides nothing that needs the model's
// shapes or the planner (no partition, no recomputed units, no advice), the step decides them
// as the loader always did, and its errors name the file and the key as the parser's do.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "engine/model_state.h"
#include "models/registry.h"
#include "resolve/resolved_config.h"
#include "tests/support/scratch_directory.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::StartsWith;

// A GPT of 6 units (embedding, block0..3, head) on 4 ranks in 2 pipeline stages, with blocks
// recomputed selectively.
json pipelined_gpt() {
  return json::parse(R"({
    "model": {"type": "gpt", "n_layer": 4, "n_head": 2, "n_embd": 32, "vocab_size": 256,
              "seq_len": 16},
    "data": {"type": "text", "path": "unused.txt"},
    "world": {"backend": "local", "ranks": 4},
    "steps": 10,
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 1},
    "activation_checkpointing": {"policy": "selective", "units": {"every": 2}},
    "pipeline": {"stages": 2, "partition": "parameters"}
  })");
}

TEST(ResolvedConfig, ParsingAloneDecidesNothingThatNeedsTheModelsShapes) {
  const TrainConfig parsed = parse_train_config(pipelined_gpt());
  EXPECT_TRUE(parsed.pipeline.units_per_virtual_stage.empty());
  EXPECT_FALSE(parsed.json["pipeline"].contains("units"));
  EXPECT_FALSE(parsed.json["activation_checkpointing"].contains("recomputed"));
  EXPECT_FALSE(parsed.engine.out_of_memory_advice);
}

// Reference: the partition by parameter count worked out from the model's shapes here, the
// balanced split of 6 units over 2 virtual stages that minimizes the larger stage's parameters
// (of equal splits, the one with the fuller first stage, as partition.h says).
TEST(ResolvedConfig, DecidesThePartitionTheRecomputedUnitsAndTheAdvice) {
  TrainConfig config = parse_train_config(pipelined_gpt());
  resolve_train_config(config);

  const ModelStateShape shapes =
      describe_model_state(*make_model(config.model), config.engine.compute_dtype, 2,
                           config.engine.shard_alignment);
  std::vector<std::uint64_t> parameters;
  for (const UnitShapes& unit : shapes.units) {
    std::uint64_t count = 0;
    for (const ParamShape& param : unit.params) {
      std::uint64_t elements = 1;
      for (std::int64_t extent : param.shape) elements *= static_cast<std::uint64_t>(extent);
      count += elements;
    }
    parameters.push_back(count);
  }
  ASSERT_EQ(parameters.size(), 6u);
  std::uint64_t best = UINT64_MAX;
  std::size_t best_first = 0;
  for (std::size_t first = 1; first < parameters.size(); ++first) {
    std::uint64_t left = 0, right = 0;
    for (std::size_t u = 0; u < parameters.size(); ++u) (u < first ? left : right) += parameters[u];
    if (std::max(left, right) <= best) {  // ties: the later boundary, as the greedy split
      best = std::max(left, right);
      best_first = first;
    }
  }
  EXPECT_THAT(config.pipeline.units_per_virtual_stage, ElementsAre(best_first, 6 - best_first));
  const std::vector<std::string> names = unit_names(config.model);
  json units = json::array({json(std::vector<std::string>(names.begin(), names.begin() + best_first)),
                            json(std::vector<std::string>(names.begin() + best_first, names.end()))});
  EXPECT_EQ(config.json["pipeline"]["units"], units);
  EXPECT_EQ(config.json["activation_checkpointing"]["recomputed"],
            json::parse(R"(["block0", "block2"])"));
  EXPECT_TRUE(config.engine.out_of_memory_advice);

  // The one-call loader resolves the same, and a resolved config read back resolves to itself.
  EXPECT_EQ(parse_resolved_config(pipelined_gpt()).json, config.json);
  EXPECT_EQ(parse_resolved_config(config.json).json, config.json);
}

class ResolvedConfigFile : public testing::ScratchDirectoryTest {};

TEST_F(ResolvedConfigFile, AnErrorOfTheStepNamesTheFileAndTheKey) {
  json config = pipelined_gpt();
  config["pipeline"]["partition"] = json::array({6, 0});
  const std::string file = write("config.json", config.dump());
  // The list is read as written when the file parses; the step checks it against the units.
  EXPECT_NO_THROW(load_train_config(file));
  try {
    load_resolved_config(file);
    FAIL() << "an empty virtual stage accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), StartsWith(file + ": pipeline.partition: [1] is 0: virtual stage 1 "
                                                "would hold no unit"));
  }
}

}  // namespace
}  // namespace zest
