// A model measured by arithmetic on its config: the same parameter count and largest unit as the
// built model, a model-state floor never above the planner's prediction, and a refusal of the
// impossible that costs nothing whatever n_layer says.
#include "tools/common/model_size.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "base/error.h"
#include "resolve/resolved_config.h"
#include "engine/model_state.h"
#include "models/registry.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

TrainConfig gpt(int layers, int width, const std::string& extra_device_memory = "512MiB") {
  json config = {
      {"model",
       {{"type", "gpt"}, {"n_layer", layers}, {"n_head", 2}, {"n_embd", width}, {"seq_len", 16}}},
      {"data", {{"type", "text"}, {"path", "unused.txt"}}},
      {"world", {{"ranks", 4}, {"device_memory", extra_device_memory}}},
      {"steps", 1},
      {"train_batch_size", 8}};
  return parse_resolved_config(config);
}

TrainConfig mlp(const std::vector<std::int64_t>& sizes) {
  json config = {{"model", {{"type", "mlp"}, {"sizes", sizes}}},
                 {"world", {{"ranks", 2}}},
                 {"steps", 1},
                 {"train_batch_size", 8}};
  return parse_resolved_config(config);
}

std::uint64_t built_largest_unit(Module& module) {
  std::uint64_t largest = 0;
  for (Unit* unit : module.units()) {
    std::uint64_t count = 0;
    for (const ParamSpec& spec : unit->parameters()) {
      std::uint64_t numel = 1;
      for (std::int64_t d : spec.shape) numel *= static_cast<std::uint64_t>(d);
      count += numel;
    }
    largest = std::max(largest, count);
  }
  return largest;
}

TEST(ModelSize, EqualsTheBuiltModel) {
  for (const TrainConfig& config :
       {gpt(1, 8), gpt(3, 16), gpt(2, 64), mlp({64, 256, 256, 10}), mlp({3, 2})}) {
    const std::unique_ptr<Module> model = make_model(config.model);
    const ModelSize size = model_size(config.model);
    EXPECT_EQ(size.parameters, count_parameters(*model)) << config.json.dump();
    EXPECT_EQ(size.largest_unit, built_largest_unit(*model)) << config.json.dump();
    EXPECT_EQ(size.units, model->units().size()) << config.json.dump();
  }
}

TEST(ModelSize, CostsNothingForAnyNumberOfLayersAndSaturates) {
  const ModelSize billion = model_size(gpt(1'000'000'000, 192).model);
  EXPECT_EQ(billion.units, 1'000'000'002u);
  EXPECT_EQ(billion.parameters,
            1'000'000'000ull * (12 * 192 * 192 + 13 * 192) + (256 + 16) * 192 + 2 * 192);
  ModelConfig widest = gpt(1, 8).model;
  widest.gpt.n_layer = 1 << 30;
  widest.gpt.n_embd = 1 << 30;
  EXPECT_EQ(model_size(widest).parameters, ~std::uint64_t{0});
}

// The floor is what check and --fit rely on: never above what the engine's own rules predict.
TEST(ModelSize, TheModelStateFloorIsALowerBound) {
  for (TrainConfig config : {gpt(3, 16), mlp({64, 256, 256, 10})}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      config.engine.compute_dtype = dtype;
      const std::unique_ptr<Module> model = make_model(config.model);
      const std::size_t states = make_optimizer(config.optimizer)->state_count();
      const ModelStateShape shape = describe_model_state(*model, dtype, states);
      for (int stage = 0; stage <= 3; ++stage) {
        for (int ranks : {1, 3, 8}) {
          for (bool offload : {false, true}) {
            const MemoryPrediction p = predict_model_state(shape, stage, ranks, offload);
            const std::uint64_t device = p.params + p.grads + p.optimizer;
            const std::uint64_t floor = model_state_floor(config, stage, ranks, offload);
            EXPECT_LE(floor, device) << stage << " " << ranks << " " << offload;
            EXPECT_GE(floor, device / 2) << stage << " " << ranks << " " << offload;
          }
        }
      }
    }
  }
}

TEST(ModelSize, OnlyTheImpossibleIsRefused) {
  const CapacityLimit devices{512u << 20, "world.device_memory"};
  EXPECT_NO_THROW(check_model_fits_at_all(gpt(6, 192), devices));
  // 30000 layers need 12.4 GiB per rank at stage 3 on 4 ranks, but less than 512 MiB on 256: not
  // impossible on devices of their own (a GPU's), left to the planner's advice and the engine.
  // On CPU devices, whose memory is the host's, their 99 GiB of parameters and gradients are.
  TrainConfig on_gpus = gpt(30'000, 192);
  on_gpus.world.device = DeviceKind::kCuda;
  EXPECT_NO_THROW(check_model_fits_at_all(on_gpus, devices));
  // The MLP of FailureAtRunTimeExitsOne: 64 KiB cannot hold it on its 2 ranks, but could on 128.
  EXPECT_NO_THROW(check_model_fits_at_all(mlp({64, 256, 256, 10}), {64u << 10, "x"}));
  try {
    check_model_fits_at_all(gpt(1'000'000, 192), devices);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("model: 444864"));
    EXPECT_THAT(error.what(), HasSubstr("n_layer 1000000"));
    EXPECT_THAT(error.what(), HasSubstr("cannot fit devices of 512.00 MiB (world.device_memory)"));
    EXPECT_THAT(error.what(), HasSubstr("on 256 ranks (64 times world.ranks)"));
  }
  // Unlimited on a CPU device: the host's memory, which no host has 3.2 TiB of.
  try {
    check_model_fits_at_all(gpt(1'000'000, 192, "unlimited"), {kUnlimitedCapacity, "x"});
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("more than this host's"));
  }
  EXPECT_NO_THROW(check_model_fits_at_all(gpt(6, 192, "unlimited"), {kUnlimitedCapacity, "x"}));
}

// Bytes aside, no model has more than kMaxModelUnits units: a GPU of unknown size and a million
// tiny layers are refused alike.
TEST(ModelSize, TheNumberOfUnitsIsBounded) {
  TrainConfig most = gpt(65'534, 8, "unlimited");
  most.world.device = DeviceKind::kCuda;
  EXPECT_NO_THROW(check_model_fits_at_all(most, {kUnlimitedCapacity, "x"}));
  TrainConfig more = gpt(65'535, 8, "unlimited");
  more.world.device = DeviceKind::kCuda;
  try {
    check_model_fits_at_all(more, {kUnlimitedCapacity, "x"});
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("model.n_layer: must be at most 65534 (a model has at "
                                        "most 65536 units, a gpt n_layer + 2), got 65535"));
  }
}

}  // namespace
}  // namespace zest
