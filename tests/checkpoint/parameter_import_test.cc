// Starting a trainer from a safetensors file: every rank takes its shard's elements, so after
// import full_parameter() returns the file's values exactly at any world size and stage (and in
// bf16 training the fp32 master holds them, the compute copy their rounding). A file of another
// model is refused on every rank, naming the first differences, before anything is written.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "models/mlp.h"
#include "engine/engine.h"
#include "checkpoint/parameter_import.h"
#include "checkpoint/safetensors.h"
#include "runtime/world.h"
#include "tests/checkpoint/checkpoint_test_support.h"

namespace zest {
namespace {

using testing::ScratchDirectory;

const std::vector<std::int64_t> kSizes = {13, 31, 17, 7};

// The parameters of an Mlp(kSizes) with values that no initializer draws: i-th element of
// tensor t is t + i / 1000.
std::map<std::string, std::vector<float>> distinct_values(
    const std::vector<SafetensorsEntry>& entries) {
  std::map<std::string, std::vector<float>> values;
  for (std::size_t t = 0; t < entries.size(); ++t) {
    std::size_t numel = 1;
    for (std::int64_t d : entries[t].shape) numel *= static_cast<std::size_t>(d);
    std::vector<float>& v = values[entries[t].name];
    for (std::size_t i = 0; i < numel; ++i) v.push_back(static_cast<float>(t) + i / 1000.0f);
  }
  return values;
}

std::vector<SafetensorsEntry> mlp_entries(const std::vector<std::int64_t>& sizes) {
  std::vector<SafetensorsEntry> entries;
  for (std::size_t layer = 0; layer + 1 < sizes.size(); ++layer) {
    const std::string unit = "layer" + std::to_string(layer);
    entries.push_back({unit + ".weight", DType::kFloat32, {sizes[layer + 1], sizes[layer]}});
    entries.push_back({unit + ".bias", DType::kFloat32, {sizes[layer + 1]}});
  }
  return entries;
}

void write_file(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                const std::map<std::string, std::vector<float>>& values) {
  write_safetensors(path, entries, {}, [&](std::size_t i, const SafetensorsSink& write) {
    const std::vector<float>& v = values.at(entries[i].name);
    write(v.data(), v.size() * sizeof(float));
  });
}

struct ImportRun {
  std::map<std::string, std::vector<float>> params;
  ImportResult result;
};

// Builds an Mlp(kSizes) trainer on `world` ranks at `stage`, imports `path`, and reads every
// parameter back; `error` receives rank 0's error message instead when the import throws.
ImportRun import_into(const std::string& path, int world, int stage, DType dtype,
                      std::string* error = nullptr, int hybrid_shard_size = 0) {
  ImportRun run;
  WorldOptions world_options;
  world_options.ranks = world;
  world_options.timeout = std::chrono::seconds(60);
  World(world_options).run([&](RankContext& context) {
    Mlp model(MlpConfig{kSizes});
    EngineOptions options;
    options.stage = stage;
    options.compute_dtype = dtype;
    options.hybrid_shard_size = hybrid_shard_size;
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    try {
      const ImportResult result = import_parameters(context, *trainer, path);
      if (context.rank == 0) run.result = result;
    } catch (const Error& caught) {
      if (error == nullptr) throw;
      if (context.rank == 0) *error = caught.what();
    }
    for (const std::string& name : trainer->parameter_names()) {
      std::vector<float> values = trainer->full_parameter(name);
      if (context.rank == 0) run.params[name] = std::move(values);
    }
  });
  return run;
}

class ParameterImport : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ParameterImport, EveryRankHoldsTheFilesValues) {
  const auto [world, stage] = GetParam();
  ScratchDirectory scratch;
  const std::vector<SafetensorsEntry> entries = mlp_entries(kSizes);
  const auto values = distinct_values(entries);
  write_file(scratch.path("init.safetensors"), entries, values);

  const ImportRun run = import_into(scratch.path("init.safetensors"), world, stage, DType::kFloat32);
  EXPECT_EQ(run.result.tensors, entries.size());
  EXPECT_EQ(run.result.parameters, 13u * 31 + 31 + 31 * 17 + 17 + 17 * 7 + 7);
  ASSERT_EQ(run.params.size(), values.size());
  for (const auto& [name, expected] : values) {
    const std::vector<float>& got = run.params.at(name);
    ASSERT_EQ(got.size(), expected.size()) << name;
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStages, ParameterImport,
                         ::testing::Combine(::testing::Values(1, 3), ::testing::Values(0, 1, 2, 3)));

// Hybrid sharding: every shard group's rank takes its shard's elements, in every group.
TEST(ParameterImportHybrid, EveryShardGroupHoldsTheFilesValues) {
  ScratchDirectory scratch;
  const std::vector<SafetensorsEntry> entries = mlp_entries(kSizes);
  const auto values = distinct_values(entries);
  write_file(scratch.path("init.safetensors"), entries, values);
  for (int stage : {1, 2, 3}) {
    const ImportRun run = import_into(scratch.path("init.safetensors"), 4, stage,
                                      DType::kFloat32, nullptr, 2);
    for (const auto& [name, expected] : values) {
      EXPECT_EQ(run.params.at(name), expected) << name << " at stage " << stage;
    }
  }
}

TEST(ParameterImportBf16, MasterTakesTheFp32ValuesAndTheCopyTheirRounding) {
  ScratchDirectory scratch;
  const std::vector<SafetensorsEntry> entries = mlp_entries(kSizes);
  const auto values = distinct_values(entries);
  write_file(scratch.path("init.safetensors"), entries, values);
  // full_parameter reads the compute copy: the bf16 rounding of each value.
  const ImportRun run = import_into(scratch.path("init.safetensors"), 2, 3, DType::kBFloat16);
  for (const auto& [name, expected] : values) {
    for (std::size_t i = 0; i < expected.size(); ++i) {
      ASSERT_EQ(run.params.at(name)[i], static_cast<float>(BFloat16(expected[i]))) << name << i;
    }
  }
}

TEST(ParameterImportBadInput, AnotherModelIsRefusedNamingTheDifferences) {
  ScratchDirectory scratch;
  std::vector<SafetensorsEntry> entries = mlp_entries({13, 31, 17, 7});
  entries[2].shape = {16, 31};                           // layer1.weight: another width
  entries.push_back({"extra.weight", DType::kFloat32, {2}});  // not in the model
  entries.erase(entries.begin() + 1);                    // layer0.bias missing
  auto values = distinct_values(entries);
  write_file(scratch.path("other.safetensors"), entries, values);

  std::string error;
  const ImportRun run =
      import_into(scratch.path("other.safetensors"), 2, 3, DType::kFloat32, &error);
  EXPECT_NE(error.find("does not hold this model's parameters"), std::string::npos) << error;
  EXPECT_NE(error.find("'layer0.bias' [31] is missing"), std::string::npos) << error;
  EXPECT_NE(error.find("'layer1.weight' has shape [16, 31], the model's is [17, 31]"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("'extra.weight' is not a parameter of the model"), std::string::npos)
      << error;
  // Nothing was written: the parameters are the initializer's, not the file's.
  EXPECT_NE(run.params.at("layer0.weight")[1], 0.001f);
}

TEST(ParameterImportBadInput, AMissingFileIsOneClearError) {
  ScratchDirectory scratch;
  std::string error;
  import_into(scratch.path("absent.safetensors"), 2, 1, DType::kFloat32, &error);
  EXPECT_NE(error.find("absent.safetensors"), std::string::npos) << error;
}

}  // namespace
}  // namespace zest
