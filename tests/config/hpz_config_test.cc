// zero_optimization.zero_hpz_partition_size (DeepSpeed's ZeRO++ key, engine/secondary_shard.h):
// 1 (off) by default and in the resolved config; a group inside a node at stage 3, with qwZ and
// qgZ too; everything else one line naming the key.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "config/train_config.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json two_nodes() {
  return json::parse(R"({
    "model": {"type": "mlp", "sizes": [8, 16, 4]},
    "world": {"backend": "local", "ranks": 4, "ranks_per_node": 2},
    "steps": 10,
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 3}
  })");
}

std::string config_error(const json& config) {
  try {
    parse_train_config(config, {});
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig) << error.what();
    EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
    return error.what();
  }
  ADD_FAILURE() << "expected a kConfig error";
  return "";
}

TEST(HpzConfig, OffByDefaultAndAGroupInsideANodeAtStage3) {
  const TrainConfig plain = parse_train_config(two_nodes(), {});
  EXPECT_EQ(plain.engine.hpz_group_size, 1);
  EXPECT_EQ(plain.json["zero_optimization"]["zero_hpz_partition_size"], 1);
  json config = two_nodes();
  config["zero_optimization"]["zero_hpz_partition_size"] = 2;
  EXPECT_EQ(parse_train_config(config, {}).engine.hpz_group_size, 2);
  // Overrides reach it as any key.
  EXPECT_EQ(parse_train_config(two_nodes(), {"zero_optimization.zero_hpz_partition_size=2"})
                .engine.hpz_group_size,
            2);
  // 1 is off at every stage.
  config["zero_optimization"] = {{"stage", 1}, {"zero_hpz_partition_size", 1}};
  EXPECT_NO_THROW(parse_train_config(config, {}));
}

TEST(HpzConfig, EverythingElseIsOneLineNamingTheKey) {
  json config = two_nodes();
  config["zero_optimization"]["zero_hpz_partition_size"] = 4;
  EXPECT_EQ(config_error(config),
            "zero_optimization.zero_hpz_partition_size: 4 does not divide the 2 ranks of a node "
            "(world.ranks_per_node 2, world.ranks 4); a secondary shard's group lies inside "
            "one node");
  config["zero_optimization"]["zero_hpz_partition_size"] = 3;
  EXPECT_THAT(config_error(config), HasSubstr("3 does not divide the 2 ranks of a node"));
  config["zero_optimization"]["zero_hpz_partition_size"] = 0;
  EXPECT_EQ(config_error(config),
            "zero_optimization.zero_hpz_partition_size: must be 1 (off) or a number of ranks "
            "inside a node, got 0");
  config["zero_optimization"]["zero_hpz_partition_size"] = "node";
  EXPECT_THAT(config_error(config), HasSubstr("zero_hpz_partition_size: must be 1 (off)"));
  config["zero_optimization"]["zero_hpz_partition_size"] = true;
  EXPECT_THAT(config_error(config), HasSubstr("got boolean"));
  config["zero_optimization"] = {{"stage", 2}, {"zero_hpz_partition_size", 2}};
  EXPECT_EQ(config_error(config),
            "zero_optimization.zero_hpz_partition_size: 2 needs zero_optimization.stage 3 (got "
            "2): only stage 3 gathers parameters in backward; set it to 1 (off) or raise the "
            "stage");
  config["zero_optimization"] = {{"stage", 3}, {"zero_hpz_partition_size", 2},
                                 {"hybrid_shard_size", "node"}};
  EXPECT_THAT(config_error(config),
              HasSubstr("zero_hpz_partition_size: 2 with zero_optimization.hybrid_shard_size"));
  config = two_nodes();
  config["world"]["ranks_per_node"] = 1;
  config["zero_optimization"]["zero_hpz_partition_size"] = 2;
  EXPECT_THAT(config_error(config), HasSubstr("2 does not divide the 1 ranks of a node"));
}

// ZeRO++'s whole stack: the secondary shard keeps the quantized gather's values.
TEST(HpzConfig, WithQuantizedWeightsAndGradientsIsServed) {
  json config = two_nodes();
  config["zero_optimization"]["zero_hpz_partition_size"] = 2;
  config["zero_optimization"]["zero_quantized_weights"] = true;
  config["zero_optimization"]["zero_quantized_gradients"] = true;
  const TrainConfig parsed = parse_train_config(config, {});
  EXPECT_EQ(parsed.engine.hpz_group_size, 2);
  EXPECT_TRUE(parsed.engine.quantized_weights);
  EXPECT_TRUE(parsed.engine.quantized_gradients);
}

TEST(HpzConfig, InsidePipelineStagesIsRefusedInOneLine) {
  json config = two_nodes();
  config["model"]["sizes"] = {8, 16, 16, 4};
  config["world"]["ranks_per_node"] = 4;
  config["zero_optimization"]["zero_hpz_partition_size"] = 2;
  config["pipeline"] = {{"stages", 2}};
  EXPECT_EQ(config_error(config),
            "zero_optimization.zero_hpz_partition_size: the secondary shard inside pipeline "
            "stages is not supported yet, and pipeline.stages is 2; set zero_hpz_partition_size "
            "to 1 or leave the pipeline block out");
}

}  // namespace
}  // namespace zest
