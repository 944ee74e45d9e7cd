#include "resolve/resolved_config.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "tests/config/stage3_config.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// A small valid config (the shared stage-3 MLP on 2 ranks); each test breaks one thing.
json base_config() {
  json config = testing::stage3_mlp_config();
  config["world"]["ranks"] = 2;
  return config;
}

// The message of the zest::Error that `action` throws, checking its kind.
std::string error_message(const std::function<void()>& action, ErrorKind kind) {
  try {
    action();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), kind) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "expected a zest::Error of kind " << error_kind_name(kind);
  return "";
}

std::string config_error(const json& config, const std::vector<std::string>& overrides = {}) {
  return error_message([&] { parse_resolved_config(config, overrides); }, ErrorKind::kConfig);
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("zest_train_config_test_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = (path_ / name).string();
    std::ofstream(file) << text;
    return file;
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

// ---- a valid config --------------------------------------------------------------------------

TEST(TrainConfig, ValidConfigFillsEveryField) {
  const TrainConfig config = parse_resolved_config(base_config());
  EXPECT_EQ(config.world.ranks, 2);
  EXPECT_EQ(config.world.backend, "local");
  EXPECT_EQ(config.world.device, DeviceKind::kCpu);
  EXPECT_EQ(config.world.device_memory, kUnlimitedCapacity);
  EXPECT_EQ(config.world.timeout, std::chrono::seconds(300));
  EXPECT_EQ(config.world.pin_ranks, RankPinning::kAuto);
  EXPECT_EQ(config.engine.stage, 3);
  EXPECT_EQ(config.engine.seed, 1234u);
  EXPECT_EQ(config.engine.gradient_clipping, 0.0f);
  EXPECT_EQ(config.optimizer.type, "AdamW");
  EXPECT_FLOAT_EQ(config.optimizer.lr, 0.01f);
  EXPECT_FLOAT_EQ(config.optimizer.beta2, 0.999f);
  EXPECT_EQ(config.model.type, "mlp");
  EXPECT_EQ(config.model.mlp.sizes, (std::vector<std::int64_t>{8, 16, 4}));
  EXPECT_EQ(config.data.type, "synthetic");
  EXPECT_EQ(config.data.features, 8);
  EXPECT_EQ(config.data.classes, 4);
  EXPECT_EQ(config.steps, 10);
  EXPECT_EQ(config.train_batch_size, 8);
  EXPECT_EQ(config.micro_batch, 4);
  EXPECT_EQ(config.gradient_accumulation_steps, 1);
  EXPECT_EQ(config.steps_per_print, 10);
  EXPECT_EQ(config.eval_every, 0);
}

TEST(TrainConfig, ResolvedJsonHasDefaultsAndParsesToTheSameConfig) {
  const TrainConfig config = parse_resolved_config(base_config());
  const json& resolved = config.json;
  EXPECT_EQ(resolved["world"]["device"], "cpu");
  EXPECT_EQ(resolved["world"]["timeout_s"], 300);
  EXPECT_EQ(resolved["world"]["pin_ranks"], "auto");
  EXPECT_EQ(resolved["train_micro_batch_size_per_gpu"], 4);
  EXPECT_EQ(resolved["gradient_accumulation_steps"], 1);
  EXPECT_EQ(resolved["optimizer"]["params"]["betas"], json::parse("[0.9, 0.999]"));
  EXPECT_EQ(resolved["optimizer"]["params"]["eps"], 1e-8);
  EXPECT_EQ(resolved["data"]["features"], 8);
  EXPECT_EQ(resolved["seed"], 1234);
  const TrainConfig again = parse_resolved_config(resolved);
  EXPECT_EQ(again.json, resolved);
}

TEST(TrainConfig, ShippedConfigsLoad) {
  for (const auto& entry : std::filesystem::directory_iterator(ZEST_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".json") continue;
    EXPECT_NO_THROW(load_resolved_config(entry.path().string())) << entry.path();
  }
  const TrainConfig config = load_resolved_config(ZEST_SOURCE_DIR "/configs/default.json");
  EXPECT_EQ(config.engine.stage, 3);
  EXPECT_EQ(config.world.ranks, 4);
}

TEST(TrainConfig, TheDefaultBackendIsTheDevices) {
  json config = base_config();
  config["world"].erase("backend");
  EXPECT_EQ(parse_resolved_config(config).world.backend, "local");
  config["world"]["device"] = "cuda";
  const TrainConfig cuda = parse_resolved_config(config);
  EXPECT_EQ(cuda.world.backend, "nccl");
  EXPECT_EQ(cuda.json["world"]["backend"], "nccl");  // the resolved config says so too
  config["world"]["backend"] = "local";  // given: kept, and World says what to set instead
  EXPECT_EQ(parse_resolved_config(config).world.backend, "local");
}

TEST(TrainConfig, DeviceMemoryTakesBytesOrAUnit) {
  json config = base_config();
  config["world"]["device_memory"] = "2GiB";
  EXPECT_EQ(parse_resolved_config(config).world.device_memory, std::size_t{2} << 30);
  config["world"]["device_memory"] = "1.5GB";
  EXPECT_EQ(parse_resolved_config(config).world.device_memory, std::size_t{1500000000});
  config["world"]["device_memory"] = 4096;
  EXPECT_EQ(parse_resolved_config(config).world.device_memory, std::size_t{4096});
  config["world"]["device_memory"] = "lots";
  EXPECT_THAT(config_error(config),
              AllOf(HasSubstr("world.device_memory"), HasSubstr("GiB"), HasSubstr("\"lots\"")));
}

TEST(TrainConfig, DebugHoldFreesReachesTheWorld) {
  json config = base_config();
  EXPECT_FALSE(parse_resolved_config(config).world.hold_frees);
  config["debug"]["hold_frees"] = true;
  EXPECT_TRUE(parse_resolved_config(config).world.hold_frees);
  config["debug"]["hold_frees"] = "yes";
  EXPECT_THAT(config_error(config), HasSubstr("debug.hold_frees"));
}

TEST(TrainConfig, PinRanksReachesTheWorld) {
  json config = base_config();
  config["world"]["pin_ranks"] = "off";
  EXPECT_EQ(parse_resolved_config(config).world.pin_ranks, RankPinning::kOff);
  config["world"]["pin_ranks"] = "on";
  EXPECT_EQ(parse_resolved_config(config).world.pin_ranks, RankPinning::kOn);
  config["world"]["pin_ranks"] = true;
  EXPECT_THAT(config_error(config), HasSubstr("world.pin_ranks"));
}

TEST(TrainConfig, OptimizerTypeIsCaseInsensitiveAndCanonical) {
  json config = base_config();
  config["optimizer"] = json::parse(R"({"type": "sgd", "params": {"lr": 0.1, "momentum": 0.9}})");
  const TrainConfig parsed = parse_resolved_config(config);
  EXPECT_EQ(parsed.optimizer.type, "SGD");
  EXPECT_FLOAT_EQ(parsed.optimizer.momentum, 0.9f);
  EXPECT_EQ(parsed.json["optimizer"]["type"], "SGD");
}

TEST(TrainConfig, ReadsDeepSpeedOverlapKeys) {
  json config = base_config();
  config["zero_optimization"] = json::parse(R"({
    "stage": 3, "reduce_bucket_size": 5e8, "overlap_comm": true, "contiguous_gradients": true,
    "stage3_prefetch_bucket_size": 0, "stage3_max_live_parameters": 1e9})");
  const TrainConfig parsed = parse_resolved_config(config);
  EXPECT_EQ(parsed.zero_overlap.reduce_bucket_size, 500000000);
  EXPECT_EQ(parsed.zero_overlap.overlap_comm, true);
  EXPECT_EQ(parsed.zero_overlap.contiguous_gradients, true);
  EXPECT_EQ(parsed.zero_overlap.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(parsed.engine.overlap_comm, true);
  EXPECT_EQ(parsed.engine.reduce_bucket_size, 500000000u);
  EXPECT_EQ(parsed.engine.stage3_prefetch_bucket_size, 0u);
  EXPECT_EQ(parsed.engine.stage3_max_live_parameters, 1000000000u);

  config["zero_optimization"] = json::parse(R"({"stage": 3, "overlap_comm": false,
                                                "stage3_prefetch_bucket_size": 4096})");
  const TrainConfig serialized = parse_resolved_config(config);
  EXPECT_FALSE(serialized.engine.overlap_comm);
  EXPECT_EQ(serialized.engine.stage3_prefetch_bucket_size, 4096u);
  EXPECT_EQ(serialized.json["zero_optimization"]["reduce_bucket_size"],
            EngineOptions{}.reduce_bucket_size);
  EXPECT_EQ(serialized.json["zero_optimization"]["stage3_max_live_parameters"], 0);
  EXPECT_EQ(serialized.json["zero_optimization"]["contiguous_gradients"], true);
}

TEST(TrainConfig, ReadsDeepSpeedOffloadOptimizerAndTheHostArena) {
  json config = base_config();
  const TrainConfig plain = parse_resolved_config(config);
  EXPECT_FALSE(plain.engine.offload_optimizer.enabled());
  EXPECT_EQ(plain.json["zero_optimization"]["offload_optimizer"],
            json::parse(R"({"device": "none", "pin_memory": false})"));
  EXPECT_EQ(plain.world.host_memory, kUnlimitedCapacity);
  EXPECT_EQ(plain.json["world"]["host_memory"], "unlimited");

  config["zero_optimization"] = json::parse(R"({"stage": 2,
      "offload_optimizer": {"device": "cpu", "pin_memory": true}})");
  config["world"]["host_memory"] = "2GiB";
  const TrainConfig offloaded = parse_resolved_config(config);
  EXPECT_EQ(offloaded.engine.offload_optimizer.device, OffloadDevice::kCpu);
  // Recorded, though the CPU device's host memory is ordinary memory either way.
  EXPECT_TRUE(offloaded.engine.offload_optimizer.pin_memory);
  EXPECT_EQ(offloaded.world.host_memory, std::size_t{2} << 30);
}

TEST(TrainConfig, GptOnTextFillsItsDefaults) {
  json config = base_config();
  config["model"] = json::parse(R"({"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 16,
                                    "seq_len": 8})");
  config["data"] = json::parse(R"({"type": "text", "path": "corpus.txt", "val_fraction": 0.1})");
  config["eval_every"] = 5;
  const TrainConfig parsed = parse_resolved_config(config);
  EXPECT_EQ(parsed.model.type, "gpt");
  EXPECT_EQ(parsed.model.gpt.vocab_size, 256);  // bytes
  EXPECT_EQ(parsed.model.gpt.seq_len, 8);
  EXPECT_EQ(parsed.data.path, "corpus.txt");
  EXPECT_DOUBLE_EQ(parsed.data.val_fraction, 0.1);
  EXPECT_EQ(parsed.data.val_batches, 4);
  EXPECT_EQ(parsed.eval_every, 5);
  EXPECT_EQ(parsed.json["model"]["vocab_size"], 256);
  EXPECT_EQ(parsed.json["model"]["init_from"], "");

  config["data"] = json::parse(R"({"type": "tokens", "path": "shards/*.bin",
                                   "val_path": "val.bin"})");
  const TrainConfig tokens = parse_resolved_config(config);
  EXPECT_EQ(tokens.model.gpt.vocab_size, 50257);  // GPT-2's tokenizer, as llm.c's shards
  EXPECT_EQ(tokens.data.val_path, "val.bin");
}

TEST(TrainConfig, AutoBatchSizesAreDerived) {
  json config = base_config();  // 2 ranks
  config["train_batch_size"] = 16;
  config["train_micro_batch_size_per_gpu"] = "auto";
  config["gradient_accumulation_steps"] = 2;
  TrainConfig parsed = parse_resolved_config(config);
  EXPECT_EQ(parsed.micro_batch, 4);
  EXPECT_EQ(parsed.json["train_micro_batch_size_per_gpu"], 4);  // resolved, not "auto"
  config["gradient_accumulation_steps"] = "auto";
  parsed = parse_resolved_config(config);
  EXPECT_EQ(parsed.micro_batch, 8);
  EXPECT_EQ(parsed.gradient_accumulation_steps, 1);
}

TEST(TrainConfig, MixedPrecisionUsesDeepSpeedKeys) {
  json config = base_config();
  EXPECT_EQ(parse_resolved_config(config).engine.compute_dtype, DType::kFloat32);
  config["bf16"] = json::parse(R"({"enabled": true})");
  config["communication_data_type"] = "bf16";
  TrainConfig parsed = parse_resolved_config(config);
  EXPECT_EQ(parsed.engine.compute_dtype, DType::kBFloat16);
  EXPECT_EQ(parsed.engine.communication_dtype, DType::kBFloat16);
  EXPECT_FALSE(parsed.engine.loss_scale.enabled);

  config.erase("bf16");
  config["fp16"] = json::parse(R"({"enabled": true, "initial_scale_power": 12, "hysteresis": 3})");
  parsed = parse_resolved_config(config);
  EXPECT_EQ(parsed.engine.compute_dtype, DType::kFloat16);
  EXPECT_TRUE(parsed.engine.loss_scale.enabled);
  EXPECT_EQ(parsed.engine.loss_scale.initial_scale_power, 12);
  EXPECT_EQ(parsed.engine.loss_scale.hysteresis, 3);
  EXPECT_EQ(parsed.json["fp16"]["loss_scale_window"], 1000);

  config["bf16"] = json::parse(R"({"enabled": true})");
  EXPECT_THAT(config_error(config), HasSubstr("fp16.enabled: true needs bf16.enabled false"));
  config.erase("bf16");
  config["fp16"]["min_loss_scale"] = 0;
  EXPECT_THAT(config_error(config), HasSubstr("fp16.min_loss_scale: must be a number > 0, got 0"));
  config["fp16"].erase("min_loss_scale");
  config["communication_data_type"] = "int8";
  EXPECT_THAT(config_error(config),
              HasSubstr("communication_data_type: must be fp32, bf16 or fp16, got \"int8\""));
}

// ---- batch sizes: DeepSpeed's rule ------------------------------------------------------------

TEST(TrainConfig, AnyTwoBatchSizesDetermineTheThird) {
  json config = base_config();  // 2 ranks
  config.erase("train_batch_size");
  config["train_micro_batch_size_per_gpu"] = 4;
  config["gradient_accumulation_steps"] = 3;
  EXPECT_EQ(parse_resolved_config(config).train_batch_size, 24);

  config.erase("gradient_accumulation_steps");
  config["train_batch_size"] = 32;
  EXPECT_EQ(parse_resolved_config(config).gradient_accumulation_steps, 4);

  config.erase("train_micro_batch_size_per_gpu");
  config["gradient_accumulation_steps"] = 2;
  EXPECT_EQ(parse_resolved_config(config).micro_batch, 8);

  config.erase("gradient_accumulation_steps");
  EXPECT_EQ(parse_resolved_config(config).micro_batch, 16);
}

TEST(TrainConfig, InconsistentBatchSizesNameAllThree) {
  json config = base_config();
  config["train_batch_size"] = 64;
  config["train_micro_batch_size_per_gpu"] = 16;
  config["gradient_accumulation_steps"] = 1;
  EXPECT_THAT(config_error(config),
              AllOf(HasSubstr("train_batch_size 64"),
                    HasSubstr("train_micro_batch_size_per_gpu 16"),
                    HasSubstr("gradient_accumulation_steps 1"), HasSubstr("world.ranks 2"),
                    HasSubstr("16 x 1 x 2 = 32, not 64")));

  config.erase("gradient_accumulation_steps");
  config["train_micro_batch_size_per_gpu"] = 5;
  EXPECT_THAT(config_error(config), AllOf(HasSubstr("train_batch_size 64"),
                                          HasSubstr("train_micro_batch_size_per_gpu 5"),
                                          HasSubstr("gradient_accumulation_steps unset"),
                                          HasSubstr("not a multiple")));
}

TEST(TrainConfig, SomeBatchSizeIsRequired) {
  json config = base_config();
  config.erase("train_batch_size");
  EXPECT_THAT(config_error(config),
              AllOf(HasSubstr("train_batch_size"), HasSubstr("train_micro_batch_size_per_gpu")));
}

// ---- the bad-input table ----------------------------------------------------------------------

TEST(TrainConfig, StageOutsideZeroToThree) {
  json config = base_config();
  config["zero_optimization"]["stage"] = 4;
  EXPECT_THAT(config_error(config),
              HasSubstr("zero_optimization.stage: must be 0, 1, 2 or 3, got 4"));
  config["zero_optimization"]["stage"] = -1;
  EXPECT_THAT(config_error(config),
              HasSubstr("zero_optimization.stage: must be 0, 1, 2 or 3, got -1"));
}

TEST(TrainConfig, RanksBelowOne) {
  json config = base_config();
  config["world"]["ranks"] = 0;
  EXPECT_THAT(config_error(config), AllOf(HasSubstr("world.ranks: must be an integer from 1"),
                                          HasSubstr("got 0")));
}

TEST(TrainConfig, ZeroWidthInModelSizes) {
  json config = base_config();
  config["model"]["sizes"] = json::parse("[8, 0, 4]");
  EXPECT_THAT(config_error(config), HasSubstr("model.sizes[1]: must be an integer >= 1, got 0"));
  config["model"]["sizes"] = json::parse("[8]");
  EXPECT_THAT(config_error(config), AllOf(HasSubstr("model.sizes"), HasSubstr("at least 2")));
}

TEST(TrainConfig, UnknownModelType) {
  json config = base_config();
  config["model"]["type"] = "transformer";
  EXPECT_THAT(config_error(config), HasSubstr("model.type: must be mlp or gpt, got \"transformer\""));
}

TEST(TrainConfig, UnknownOptimizerType) {
  json config = base_config();
  config["optimizer"]["type"] = "Lion";
  EXPECT_THAT(config_error(config),
              HasSubstr("optimizer.type: must be AdamW, Adam or SGD, got \"Lion\""));
}

TEST(TrainConfig, OptimizerParamsOutOfRangeOrOfAnotherType) {
  json config = base_config();
  config["optimizer"]["params"]["lr"] = 0;
  EXPECT_THAT(config_error(config), HasSubstr("optimizer.params.lr: must be a number > 0, got 0"));
  config = base_config();
  config["optimizer"]["params"]["betas"] = json::parse("[0.9, 1.0]");
  EXPECT_THAT(config_error(config),
              HasSubstr("optimizer.params.betas[1]: must be a number in [0, 1), got 1.0"));
  config = base_config();
  config["optimizer"]["params"]["momentum"] = 0.9;
  EXPECT_THAT(config_error(config),
              AllOf(HasSubstr("optimizer.params.momentum: is not a parameter of AdamW"),
                    HasSubstr("allowed: lr, weight_decay, betas or eps")));
  config = base_config();
  config["optimizer"] = json::parse(R"({"type": "SGD", "params": {"nesterov": true}})");
  EXPECT_THAT(config_error(config), HasSubstr("optimizer.params.nesterov"));
}

TEST(TrainConfig, UnknownKeySuggestsTheClosestKnownKey) {
  json config = base_config();
  config["zero_optimization"]["stgae"] = 2;
  EXPECT_THAT(config_error(config),
              HasSubstr("zero_optimization.stgae: unknown key; did you mean "
                        "'zero_optimization.stage'?"));

  config = base_config();
  config["Steps"] = 3;
  EXPECT_THAT(config_error(config), HasSubstr("Steps: unknown key; did you mean 'steps'?"));

  config = base_config();
  config["stage"] = 3;  // belongs under zero_optimization
  EXPECT_THAT(config_error(config),
              HasSubstr("stage: unknown key; did you mean 'zero_optimization.stage'?"));

  config = base_config();
  config["world"]["flavour"] = "x";
  EXPECT_THAT(config_error(config),
              AllOf(HasSubstr("world.flavour: unknown key"),
                    HasSubstr("allowed here: backend, ranks, ranks_per_node, link, device, "
                              "device_memory, host_memory, timeout_s or pin_ranks")));
}

TEST(TrainConfig, WrongTypeNamesWhatIsAllowed) {
  json config = base_config();
  config["steps"] = "5";
  EXPECT_THAT(config_error(config), HasSubstr("steps: must be an integer, got string \"5\""));
  config = base_config();
  config["zero_optimization"]["stage"] = 2.5;
  EXPECT_THAT(config_error(config),
              HasSubstr("zero_optimization.stage: must be an integer, got 2.5"));
  config = base_config();
  config["world"] = json::array();
  EXPECT_THAT(config_error(config), HasSubstr("world: must be an object, got array []"));
  config = base_config();
  config["zero_optimization"]["overlap_comm"] = 1;
  EXPECT_THAT(config_error(config),
              HasSubstr("zero_optimization.overlap_comm: must be true or false, got 1"));
  EXPECT_THAT(config_error(json::array()), HasSubstr("config: must be an object"));
}

TEST(TrainConfig, DataWidthsMustMatchTheModel) {
  json config = base_config();
  config["data"] = json::parse(R"({"features": 7})");
  EXPECT_THAT(config_error(config),
              AllOf(HasSubstr("data.features: must equal model.sizes[0] (8)"), HasSubstr("got 7")));
  config["data"] = json::parse(R"({"classes": 5})");
  EXPECT_THAT(config_error(config),
              AllOf(HasSubstr("data.classes: must equal model.sizes[2] (4)"), HasSubstr("got 5")));
}

TEST(TrainConfig, MissingRequiredKeys) {
  json config = base_config();
  config.erase("model");
  EXPECT_THAT(config_error(config), HasSubstr("model: missing"));
  config = base_config();
  config.erase("steps");
  EXPECT_THAT(config_error(config), HasSubstr("steps: missing"));
}

// ---- files ------------------------------------------------------------------------------------

TEST(TrainConfig, FileThatIsNotJsonNamesLineAndColumn) {
  TempDir dir;
  const std::string file = dir.write("bad.json", "{\n  \"steps\": 5,\n  \"model\": {oops}\n}\n");
  const std::string message =
      error_message([&] { load_resolved_config(file); }, ErrorKind::kConfig);
  // Line 3 is `  "model": {oops}`; the 'o' of oops is its 13th byte.
  EXPECT_THAT(message, HasSubstr(file + ":3:13: not valid JSON: "));
  EXPECT_THAT(message, Not(HasSubstr("json.exception")));

  const std::string empty = dir.write("empty.json", "");
  EXPECT_THAT(error_message([&] { load_resolved_config(empty); }, ErrorKind::kConfig),
              HasSubstr(empty + ":1:1: not valid JSON"));
}

TEST(TrainConfig, FileThatDoesNotExistIsNamed) {
  TempDir dir;
  const std::string file = dir.path("missing.json");
  EXPECT_THAT(error_message([&] { load_resolved_config(file); }, ErrorKind::kConfig),
              AllOf(HasSubstr("config file '" + file + "'"), HasSubstr("No such file")));
}

TEST(TrainConfig, ErrorsFromAFileNameTheFile) {
  TempDir dir;
  json config = base_config();
  config["zero_optimization"]["stage"] = 9;
  const std::string file = dir.write("stage.json", config.dump());
  EXPECT_THAT(error_message([&] { load_resolved_config(file); }, ErrorKind::kConfig),
              HasSubstr(file + ": zero_optimization.stage: must be 0, 1, 2 or 3, got 9"));
}

// ---- --set ------------------------------------------------------------------------------------

TEST(TrainConfigOverrides, ValuesParseAsJsonElseString) {
  json config = json::object();
  apply_override(config, "steps=5");
  apply_override(config, "optimizer.params.lr=3e-3");
  apply_override(config, "zero_optimization.overlap_comm=true");
  apply_override(config, "model.sizes=[4, 8, 2]");
  apply_override(config, "optimizer.type=SGD");
  apply_override(config, "world.device_memory=2GiB");
  apply_override(config, "data.type=\"synthetic\"");
  apply_override(config, "name=a=b");
  EXPECT_EQ(config["steps"], 5);
  EXPECT_EQ(config["optimizer"]["params"]["lr"], 3e-3);
  EXPECT_EQ(config["zero_optimization"]["overlap_comm"], true);
  EXPECT_EQ(config["model"]["sizes"], json::parse("[4, 8, 2]"));
  EXPECT_EQ(config["optimizer"]["type"], "SGD");
  EXPECT_EQ(config["world"]["device_memory"], "2GiB");
  EXPECT_EQ(config["data"]["type"], "synthetic");
  EXPECT_EQ(config["name"], "a=b");
}

TEST(TrainConfigOverrides, AreAppliedBeforeValidationInOrder) {
  const TrainConfig config = parse_resolved_config(
      base_config(), {"zero_optimization.stage=1", "world.ranks=4", "world.ranks=1", "steps=7"});
  EXPECT_EQ(config.engine.stage, 1);
  EXPECT_EQ(config.world.ranks, 1);
  EXPECT_EQ(config.steps, 7);
  EXPECT_EQ(config.micro_batch, 8);
  EXPECT_EQ(config.json["zero_optimization"]["stage"], 1);

  // A quoted number stays a string, so the override is checked like the file.
  EXPECT_THAT(config_error(base_config(), {"steps=\"5\""}),
              HasSubstr("steps: must be an integer, got string \"5\""));
  EXPECT_THAT(config_error(base_config(), {"zero_optimization.stage=4"}),
              HasSubstr("zero_optimization.stage: must be 0, 1, 2 or 3, got 4"));
}

TEST(TrainConfigOverrides, MalformedOverridesAreUsageErrors) {
  json config = base_config();
  EXPECT_THAT(error_message([&] { apply_override(config, "steps"); }, ErrorKind::kUsage),
              AllOf(HasSubstr("--set 'steps'"), HasSubstr("KEY=VALUE")));
  EXPECT_THAT(error_message([&] { apply_override(config, "steps.count=3"); }, ErrorKind::kUsage),
              HasSubstr("'steps' is 10, not an object"));
  EXPECT_THAT(error_message([&] { apply_override(config, "model.sizes.x=3"); }, ErrorKind::kUsage),
              HasSubstr("'model.sizes' is array [8,16,4], not an object"));
  EXPECT_THAT(error_message([&] { apply_override(config, "world..ranks=3"); }, ErrorKind::kUsage),
              HasSubstr("empty part"));
  EXPECT_THAT(error_message([&] { apply_override(config, "=3"); }, ErrorKind::kUsage),
              HasSubstr("empty part"));
  EXPECT_THAT(error_message([&] { parse_resolved_config(base_config(), {"stepz"}); },
                            ErrorKind::kUsage),
              HasSubstr("--set 'stepz'"));
}

}  // namespace
}  // namespace zest

namespace zest {
namespace {

// activation_checkpointing reaches the engine's options, and the resolved config names the units
// the policy recomputes (which a config read back ignores and writes again).
TEST(TrainConfigActivationCheckpointing, ResolvesThePolicyAndNamesTheRecomputedUnits) {
  nlohmann::json config = nlohmann::json::parse(R"({
    "model": {"type": "gpt", "n_layer": 4, "n_head": 2, "n_embd": 16, "seq_len": 8},
    "data": {"type": "text", "path": "corpus.txt"},
    "steps": 10, "train_batch_size": 8,
    "activation_checkpointing": {"policy": "selective", "units": {"every": 2},
                                 "cpu_checkpointing": true}
  })");
  const TrainConfig parsed = parse_resolved_config(config);
  const ActivationCheckpointing& options = parsed.engine.activation_checkpointing;
  EXPECT_EQ(options.policy, RecomputePolicy::kSelective);
  EXPECT_EQ(options.every, 2u);
  EXPECT_EQ(options.first, 0u);
  EXPECT_TRUE(options.cpu_checkpointing);
  const nlohmann::json& resolved = parsed.json["activation_checkpointing"];
  EXPECT_EQ(resolved["recomputed"], nlohmann::json::parse(R"(["block0", "block2"])"));
  EXPECT_EQ(resolved["partition_activations"], false);
  // Read back, the resolved config is the same config; a stale `recomputed` is rewritten.
  nlohmann::json again = parsed.json;
  again["activation_checkpointing"]["recomputed"] = nlohmann::json::array({"head"});
  EXPECT_EQ(parse_resolved_config(again).json, parsed.json);

  config["activation_checkpointing"] = {{"policy", "full"}, {"units", {{"first", 3}}}};
  EXPECT_EQ(parse_resolved_config(config).json["activation_checkpointing"]["recomputed"],
            nlohmann::json::parse(R"(["block0", "block1"])"));
  config.erase("activation_checkpointing");
  EXPECT_EQ(parse_resolved_config(config).engine.activation_checkpointing.policy,
            RecomputePolicy::kNone);
}

}  // namespace
}  // namespace zest
