// offload_optimizer.device "nvme" with its keys, zero_optimization.sub_group_size and the aio
// block: DeepSpeed's defaults in the resolved config, the values reach the engine's options, and
// every bad value is one line naming the key.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "config/train_config.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json with_nvme() {
  return json::parse(R"({
    "model": {"type": "mlp", "sizes": [8, 16, 4]},
    "world": {"backend": "local", "ranks": 2},
    "steps": 10,
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 2, "sub_group_size": 4096,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/swap", "buffer_count": 3,
                            "fast_init": true}},
    "aio": {"block_size": 262144, "queue_depth": 16, "thread_count": 3, "single_submit": true,
            "backend": "threads"}
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

TEST(NvmeConfig, KeysReachTheEngineOptions) {
  const TrainConfig config = parse_train_config(with_nvme(), {});
  const OffloadOptions& offload = config.engine.offload_optimizer;
  EXPECT_EQ(offload.device, OffloadDevice::kNvme);
  EXPECT_EQ(offload.nvme_path, "/tmp/swap");
  EXPECT_EQ(offload.buffer_count, 3u);
  EXPECT_TRUE(offload.fast_init);
  EXPECT_EQ(offload.sub_group_size, 4096u);
  EXPECT_EQ(config.engine.aio.block_size, 262144u);
  EXPECT_EQ(config.engine.aio.io.queue_depth, 16u);
  EXPECT_EQ(config.engine.aio.io.thread_count, 3);
  EXPECT_TRUE(config.engine.aio.io.single_submit);
  EXPECT_EQ(config.engine.aio.io.backend, SwapBackend::kThreads);
}

TEST(NvmeConfig, ResolvedConfigShowsDeepSpeedsDefaultsAndWhyOverlapEventsIsNotApplied) {
  json config = with_nvme();
  config.erase("aio");
  config["zero_optimization"].erase("sub_group_size");
  const TrainConfig parsed = parse_train_config(config, {});
  const json& aio = parsed.json.at("aio");
  EXPECT_EQ(aio.at("block_size"), 1048576);
  EXPECT_EQ(aio.at("queue_depth"), 8);
  EXPECT_EQ(aio.at("thread_count"), 1);
  EXPECT_EQ(aio.at("single_submit"), false);
  EXPECT_EQ(aio.at("overlap_events"), true);
  EXPECT_EQ(aio.at("backend"), "auto");
  EXPECT_THAT(aio.at("not_applied").at("overlap_events").get<std::string>(), HasSubstr("streams"));
  EXPECT_EQ(parsed.json.at("zero_optimization").at("sub_group_size"), 1000000000);
  // The printed config reads back as itself.
  EXPECT_EQ(parse_train_config(parsed.json, {}).json, parsed.json);
}

TEST(NvmeConfig, BadValuesNameTheKey) {
  json config = with_nvme();
  config["zero_optimization"]["offload_optimizer"].erase("nvme_path");
  EXPECT_THAT(config_error(config), HasSubstr("zero_optimization.offload_optimizer.nvme_path"));
  config = with_nvme();
  config["zero_optimization"]["offload_optimizer"]["buffer_count"] = 0;
  EXPECT_THAT(config_error(config), HasSubstr("offload_optimizer.buffer_count"));
  config = with_nvme();
  config["zero_optimization"]["sub_group_size"] = 0;
  EXPECT_THAT(config_error(config), HasSubstr("zero_optimization.sub_group_size"));
  config = with_nvme();
  config["aio"]["block_size"] = 5000;
  EXPECT_THAT(config_error(config), HasSubstr("aio.block_size: must be a multiple of 4096"));
  config = with_nvme();
  config["aio"]["overlap_events"] = false;
  EXPECT_THAT(config_error(config), HasSubstr("aio.overlap_events: false is not supported"));
  config = with_nvme();
  config["aio"]["backend"] = "libaio";
  EXPECT_THAT(config_error(config), HasSubstr("aio.backend: must be auto, io_uring or threads"));
  config = with_nvme();
  config["zero_optimization"]["stage"] = 0;
  EXPECT_THAT(config_error(config), HasSubstr("needs zero_optimization.stage 1, 2 or 3"));
}

}  // namespace
}  // namespace zest
