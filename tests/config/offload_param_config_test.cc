// zero_optimization.offload_param (DeepSpeed's key, engine/parameter_offload.h): "none" by
// default and in the resolved config with DeepSpeed's defaults for its NVMe keys; "cpu" at stage
// 3, alone or with offload_optimizer; everything else one line naming the key and what to do.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "config/train_config.h"
#include "tests/config/stage3_config.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json with_param_offload(json offload) {
  json config = testing::stage3_mlp_config();
  config["zero_optimization"]["offload_param"] = std::move(offload);
  return config;
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

TEST(OffloadParamConfig, NoneByDefaultWithDeepSpeedsDefaultsResolved) {
  const TrainConfig config = parse_train_config(testing::stage3_mlp_config(), {});
  EXPECT_FALSE(config.engine.offload_param.enabled());
  const json& resolved = config.json["zero_optimization"]["offload_param"];
  EXPECT_EQ(resolved["device"], "none");
  EXPECT_EQ(resolved["buffer_count"], 5);
  EXPECT_EQ(resolved["buffer_size"], 100000000);
  EXPECT_EQ(resolved["max_in_cpu"], 1000000000);
  EXPECT_EQ(resolved["pin_memory"], false);
}

TEST(OffloadParamConfig, CpuAtStageThreeAloneOrWithTheOptimizer) {
  const TrainConfig alone =
      parse_train_config(with_param_offload({{"device", "cpu"}, {"buffer_count", 2}}), {});
  EXPECT_EQ(alone.engine.offload_param.device, OffloadDevice::kCpu);
  EXPECT_EQ(alone.engine.offload_param.buffer_count, 2u);
  json both = with_param_offload({{"device", "cpu"}, {"pin_memory", true}});
  both["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  const TrainConfig config = parse_train_config(both, {});
  EXPECT_TRUE(config.engine.offload_param.enabled());
  EXPECT_TRUE(config.engine.offload_param.pin_memory);
  EXPECT_TRUE(config.engine.offload_optimizer.enabled());
}

TEST(OffloadParamConfig, NvmeAtStageThreeWithItsPathAndBuffers) {
  json config = with_param_offload({{"device", "nvme"},
                                    {"nvme_path", "/tmp/zest-nvme"},
                                    {"buffer_count", 3},
                                    {"buffer_size", 4096},
                                    {"max_in_cpu", 0}});
  config["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"},
                                                      {"nvme_path", "/tmp/zest-nvme"}};
  const TrainConfig parsed = parse_train_config(config, {});
  const OffloadParamOptions& offload = parsed.engine.offload_param;
  EXPECT_EQ(offload.device, OffloadDevice::kNvme);
  EXPECT_EQ(offload.nvme_path, "/tmp/zest-nvme");
  EXPECT_EQ(offload.buffer_count, 3u);
  EXPECT_EQ(offload.buffer_size, 4096u);
  EXPECT_EQ(offload.max_in_cpu, 0u);
  EXPECT_EQ(parsed.json["zero_optimization"]["offload_param"]["device"], "nvme");
}

TEST(OffloadParamConfig, NvmeWithTheOuterLoopIsRefused) {
  json config = with_param_offload({{"device", "nvme"}, {"nvme_path", "/tmp"}});
  config["outer_loop"] = {{"type", "diloco"}, {"groups", 2}};
  EXPECT_THAT(config_error(config), HasSubstr("outer_loop"));
}

TEST(OffloadParamConfig, BelowStageThreeIsOneLineSayingWhy) {
  for (int stage : {0, 1, 2}) {
    json config = with_param_offload({{"device", "cpu"}});
    config["zero_optimization"]["stage"] = stage;
    const std::string message = config_error(config);
    EXPECT_THAT(message, HasSubstr("zero_optimization.offload_param.device"));
    EXPECT_THAT(message, HasSubstr("only stage 3 shards the parameters"));
    EXPECT_THAT(message, HasSubstr("got " + std::to_string(stage)));
  }
  // Off, any stage is fine.
  json off = with_param_offload({{"device", "none"}});
  off["zero_optimization"]["stage"] = 1;
  EXPECT_NO_THROW(parse_train_config(off, {}));
}

TEST(OffloadParamConfig, BadValuesNameTheirKey) {
  EXPECT_THAT(config_error(with_param_offload({{"device", "gpu"}})),
              HasSubstr("zero_optimization.offload_param.device: must be none, cpu or nvme"));
  EXPECT_THAT(config_error(with_param_offload({{"device", "nvme"}})),
              HasSubstr("zero_optimization.offload_param.nvme_path: device \"nvme\" needs a "
                        "folder"));
  EXPECT_THAT(config_error(with_param_offload({{"device", "cpu"}, {"buffer_count", 0}})),
              HasSubstr("zero_optimization.offload_param.buffer_count: must be an integer >= 1"));
  EXPECT_THAT(config_error(with_param_offload({{"device", "cpu"}, {"buffer_size", -3}})),
              HasSubstr("zero_optimization.offload_param.buffer_size"));
  EXPECT_THAT(config_error(with_param_offload({{"device", "cpu"}, {"max_in_gpu", 1}})),
              HasSubstr("zero_optimization.offload_param.max_in_gpu"));
  EXPECT_THAT(config_error(with_param_offload({{"device", "cpu"}, {"pin_memory", "yes"}})),
              HasSubstr("zero_optimization.offload_param.pin_memory"));
}

TEST(OffloadParamConfig, QuantizedWeightsAndSecondaryShardsAreRefused) {
  json qwz = with_param_offload({{"device", "cpu"}});
  qwz["zero_optimization"]["zero_quantized_weights"] = true;
  EXPECT_THAT(config_error(qwz), HasSubstr("zero_quantized_weights"));
  json hpz = with_param_offload({{"device", "cpu"}});
  hpz["world"]["ranks_per_node"] = 2;
  hpz["zero_optimization"]["zero_hpz_partition_size"] = 2;
  EXPECT_THAT(config_error(hpz), HasSubstr("zero_hpz_partition_size"));
}

TEST(OffloadParamConfig, PipelineStagesAreRefused) {
  json config = json::parse(R"({
    "model": {"type": "gpt", "n_layer": 4, "n_head": 2, "n_embd": 32, "vocab_size": 256,
              "seq_len": 16},
    "data": {"type": "text", "path": "unused.txt"},
    "world": {"backend": "local", "ranks": 4},
    "steps": 10,
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
    "pipeline": {"stages": 2}
  })");
  const std::string message = config_error(config);
  EXPECT_THAT(message, HasSubstr("zero_optimization.offload_param.device"));
  EXPECT_THAT(message, HasSubstr("pipeline stages"));
}

}  // namespace
}  // namespace zest
