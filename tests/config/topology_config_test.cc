// The config keys of nodes, the link model and hybrid sharding: world.ranks_per_node, world.link,
// zero_optimization.hybrid_shard_size; their defaults in the resolved config and their errors.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "config/train_config.h"
#include "tests/config/stage3_config.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json base_config() { return testing::stage3_mlp_config(); }

std::string config_error(const json& config) {
  try {
    parse_train_config(config, {});
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "expected a kConfig error";
  return "";
}

TEST(TopologyConfig, RanksPerNodeIsAutoUnlessSet) {
  const TrainConfig plain = parse_train_config(base_config(), {});
  EXPECT_EQ(plain.world.ranks_per_node, 0);
  EXPECT_EQ(plain.json["world"]["ranks_per_node"], "auto");
  json config = base_config();
  config["world"]["ranks_per_node"] = 2;
  EXPECT_EQ(parse_train_config(config, {}).world.ranks_per_node, 2);
}

TEST(TopologyConfig, RanksPerNodeThatDoNotDivideTheRanksAreRefused) {
  json config = base_config();
  config["world"]["ranks_per_node"] = 3;
  EXPECT_EQ(config_error(config),
            "world.ranks_per_node: 3 does not divide world.ranks 4; every node runs the same "
            "number of ranks");
  config["world"]["ranks_per_node"] = 0;
  EXPECT_THAT(config_error(config), HasSubstr("must be \"auto\" or an integer from 1 to 65536"));
  config["world"]["ranks_per_node"] = "two";
  EXPECT_THAT(config_error(config), HasSubstr("world.ranks_per_node: must be \"auto\""));
}

TEST(TopologyConfig, TheLinkModelIsAutoAt25GigabytesAnd10Microseconds) {
  const TrainConfig plain = parse_train_config(base_config(), {});
  EXPECT_FALSE(plain.world.link.modelled.has_value());
  EXPECT_EQ(plain.world.link.bandwidth_gbit_s, 200.0);
  EXPECT_EQ(plain.world.link.latency_us, 10.0);
  EXPECT_EQ(plain.json["world"]["link"],
            json::parse(R"({"model": "auto", "bandwidth_gbit_s": 200.0, "latency_us": 10.0})"));
  json config = base_config();
  config["world"]["link"] = {{"model", "off"}, {"bandwidth_gbit_s", 10}, {"latency_us", 0}};
  const TrainConfig set = parse_train_config(config, {});
  EXPECT_EQ(set.world.link.modelled, std::optional<bool>(false));
  EXPECT_EQ(set.world.link.bandwidth_gbit_s, 10.0);
  EXPECT_EQ(set.world.link.latency_us, 0.0);
  config["world"]["link"] = {{"model", "yes"}};
  EXPECT_EQ(config_error(config),
            "world.link.model: must be \"auto\", \"on\" or \"off\", got \"yes\"");
  config["world"]["link"] = {{"bandwidth_gbit_s", 0}};
  EXPECT_THAT(config_error(config), HasSubstr("world.link.bandwidth_gbit_s: must be a number of "
                                              "gigabits per second from 0.001 to 1e6"));
  config["world"]["link"] = {{"latency_us", -1}};
  EXPECT_THAT(config_error(config), HasSubstr("world.link.latency_us: must be a number"));
  config["world"]["link"] = {{"bandwith_gbit_s", 1}};
  EXPECT_THAT(config_error(config), HasSubstr("did you mean 'world.link.bandwidth_gbit_s'?"));
}

TEST(TopologyConfig, HybridShardSizeIsOffANodeOrADivisorOfTheRanks) {
  const TrainConfig plain = parse_train_config(base_config(), {});
  EXPECT_EQ(plain.engine.hybrid_shard_size, 0);
  EXPECT_EQ(plain.json["zero_optimization"]["hybrid_shard_size"], "off");
  json config = base_config();
  config["zero_optimization"]["hybrid_shard_size"] = "node";
  EXPECT_EQ(parse_train_config(config, {}).engine.hybrid_shard_size, kHybridShardNode);
  config["zero_optimization"]["hybrid_shard_size"] = 2;
  EXPECT_EQ(parse_train_config(config, {}).engine.hybrid_shard_size, 2);
  config["zero_optimization"]["hybrid_shard_size"] = 3;
  EXPECT_EQ(config_error(config),
            "zero_optimization.hybrid_shard_size: must be \"off\", \"node\" or a number of "
            "ranks that divides world.ranks (4), got 3");
  config["zero_optimization"]["hybrid_shard_size"] = true;
  EXPECT_THAT(config_error(config), HasSubstr("got boolean"));
}

// A hybrid run's checkpoints hold one shard group's files (checkpoint/manifest.h), and an import
// fills every group's shards: nothing is refused.
TEST(TopologyConfig, AHybridRunSavesResumesAndImports) {
  json config = base_config();
  config["zero_optimization"]["hybrid_shard_size"] = 2;
  config["checkpoint"] = {{"dir", "/tmp/somewhere"}, {"resume", "auto"}};
  config["model"]["init_from"] = "/tmp/somewhere.safetensors";
  EXPECT_NO_THROW(parse_train_config(config, {}));
}

// Hybrid sharding inside pipeline stages splits each stage's data-parallel group: a size that
// divides the world but not that group is one line.
TEST(TopologyConfig, HybridShardingInsidePipelineStagesDividesTheirDataParallelGroup) {
  json config = base_config();
  config["model"]["sizes"] = {8, 16, 16, 4};
  config["zero_optimization"]["hybrid_shard_size"] = 1;
  config["pipeline"] = {{"stages", 2}};
  EXPECT_NO_THROW(parse_train_config(config, {}));
  config["zero_optimization"]["hybrid_shard_size"] = 4;
  EXPECT_EQ(config_error(config),
            "zero_optimization.hybrid_shard_size: must divide the data-parallel ranks of each "
            "pipeline stage (world.ranks 4 / pipeline.stages 2 = 2), got 4");
  config["zero_optimization"]["hybrid_shard_size"] = "off";
  EXPECT_NO_THROW(parse_train_config(config, {}));
}

// At ZeRO stage 0 too: nothing is sharded there, but the pipeline checks the size against the
// stage's group when it starts, so the config refuses it as at stages 1-3, not a rank at run time.
TEST(TopologyConfig, HybridShardingInsidePipelineStagesIsCheckedAtEveryZeroStage) {
  json config = base_config();
  config["model"]["sizes"] = {8, 16, 16, 4};
  config["pipeline"] = {{"stages", 2}};
  config["zero_optimization"]["hybrid_shard_size"] = 4;
  for (int stage : {0, 1, 2, 3}) {
    config["zero_optimization"]["stage"] = stage;
    EXPECT_EQ(config_error(config),
              "zero_optimization.hybrid_shard_size: must divide the data-parallel ranks of each "
              "pipeline stage (world.ranks 4 / pipeline.stages 2 = 2), got 4")
        << "stage " << stage;
  }
  // "node" where the config knows the node: given, or the local backend's threads (one node).
  config["zero_optimization"]["hybrid_shard_size"] = "node";
  EXPECT_EQ(config_error(config),
            "zero_optimization.hybrid_shard_size: must divide the data-parallel ranks of each "
            "pipeline stage (world.ranks 4 / pipeline.stages 2 = 2), got \"node\" (4 ranks)");
  config["world"]["ranks_per_node"] = 2;
  EXPECT_NO_THROW(parse_train_config(config, {}));
}

}  // namespace
}  // namespace zest
