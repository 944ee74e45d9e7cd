// ZeRO++'s quantized collectives in the config: DeepSpeed's zero_optimization.zero_quantized_weights
// and zero_quantized_gradients (booleans, default false) and zest's zero_quantized_block_size;
// their defaults in the resolved config and the one-line errors for bad values and combinations.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "resolve/resolved_config.h"
#include "tests/config/stage3_config.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json base_config() { return testing::stage3_mlp_config(); }

std::string config_error(const json& config) {
  try {
    parse_resolved_config(config, {});
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig) << error.what();
    EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
    return error.what();
  }
  ADD_FAILURE() << "expected a kConfig error";
  return "";
}

TEST(QuantizedConfig, OffByDefaultAndShownInTheResolvedConfig) {
  const TrainConfig plain = parse_resolved_config(base_config(), {});
  EXPECT_FALSE(plain.engine.quantized_weights);
  EXPECT_FALSE(plain.engine.quantized_gradients);
  EXPECT_EQ(plain.engine.quantization_block, 256u);
  EXPECT_EQ(plain.json["zero_optimization"]["zero_quantized_weights"], false);
  EXPECT_EQ(plain.json["zero_optimization"]["zero_quantized_gradients"], false);
  EXPECT_EQ(plain.json["zero_optimization"]["zero_quantized_block_size"], 256);
}

TEST(QuantizedConfig, DeepSpeedsKeysReachTheEngine) {
  json config = base_config();
  config["zero_optimization"]["zero_quantized_weights"] = true;
  config["zero_optimization"]["zero_quantized_gradients"] = true;
  config["zero_optimization"]["zero_quantized_block_size"] = 128;
  const TrainConfig parsed = parse_resolved_config(config, {});
  EXPECT_TRUE(parsed.engine.quantized_weights);
  EXPECT_TRUE(parsed.engine.quantized_gradients);
  EXPECT_EQ(parsed.engine.quantization_block, 128u);
}

TEST(QuantizedConfig, BadValuesAreOneLineNamingTheKey) {
  json config = base_config();
  config["zero_optimization"]["zero_quantized_weights"] = "yes";
  EXPECT_THAT(config_error(config), HasSubstr("zero_optimization.zero_quantized_weights: must be"));
  config = base_config();
  config["zero_optimization"]["zero_quantized_gradients"] = 1;
  EXPECT_THAT(config_error(config),
              HasSubstr("zero_optimization.zero_quantized_gradients: must be"));
  config = base_config();
  config["zero_optimization"]["zero_quantized_block_size"] = 0;
  EXPECT_THAT(config_error(config), HasSubstr("zero_optimization.zero_quantized_block_size"));
  config["zero_optimization"]["zero_quantized_block_size"] = 1 << 25;
  EXPECT_EQ(config_error(config),
            "zero_optimization.zero_quantized_block_size: must be at most 16777216 elements, got "
            "33554432");
}

TEST(QuantizedConfig, RefusedWhereMeaningless) {
  json config = base_config();
  config["zero_optimization"]["stage"] = 2;
  config["zero_optimization"]["zero_quantized_weights"] = true;
  EXPECT_EQ(config_error(config),
            "zero_optimization.zero_quantized_weights: true needs zero_optimization.stage 3 (got "
            "2): only stage 3 gathers parameters before each use");
  config = base_config();
  config["zero_optimization"]["stage"] = 0;
  config["zero_optimization"]["zero_quantized_gradients"] = true;
  EXPECT_THAT(config_error(config),
              HasSubstr("zero_optimization.zero_quantized_gradients: true needs "
                        "zero_optimization.stage 1, 2 or 3 (got 0)"));
  // qgZ at stages 1-2 is served.
  config["zero_optimization"]["stage"] = 1;
  EXPECT_TRUE(parse_resolved_config(config, {}).engine.quantized_gradients);
}

// qgZ with hybrid sharding quantizes the replicas' mean across nodes too
// (engine/quantized_replicas.h): served at any shard group size.
TEST(QuantizedConfig, QuantizedGradientsWithHybridShardingAreServed) {
  json config = base_config();
  config["zero_optimization"]["zero_quantized_gradients"] = true;
  config["zero_optimization"]["hybrid_shard_size"] = 2;
  EXPECT_TRUE(parse_resolved_config(config, {}).engine.quantized_gradients);
  config["world"]["ranks_per_node"] = 2;
  config["zero_optimization"]["hybrid_shard_size"] = "node";
  EXPECT_EQ(parse_resolved_config(config, {}).engine.hybrid_shard_size, kHybridShardNode);
  config["zero_optimization"]["hybrid_shard_size"] = 4;
  EXPECT_TRUE(parse_resolved_config(config, {}).engine.quantized_gradients);
  // qwZ with hybrid sharding is served (its gathers stay inside the node, in int8).
  config = base_config();
  config["zero_optimization"]["zero_quantized_weights"] = true;
  config["zero_optimization"]["hybrid_shard_size"] = 2;
  EXPECT_TRUE(parse_resolved_config(config, {}).engine.quantized_weights);
}

TEST(QuantizedConfig, QuantizedGradientsInsidePipelineStagesAreRefused) {
  json config = json::parse(R"({
    "model": {"type": "gpt", "n_layer": 4, "n_head": 2, "n_embd": 32, "vocab_size": 256,
              "seq_len": 16},
    "data": {"type": "text", "path": "unused.txt"},
    "world": {"backend": "local", "ranks": 4},
    "steps": 10,
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 1, "zero_quantized_gradients": true},
    "pipeline": {"stages": 2, "partition": "uniform"}
  })");
  EXPECT_EQ(config_error(config),
            "zero_optimization.zero_quantized_gradients: true is not supported inside pipeline "
            "stages yet, and pipeline.stages is 2; set zero_quantized_gradients to false or "
            "leave the pipeline block out");
}

}  // namespace
}  // namespace zest
