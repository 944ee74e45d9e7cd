// Exporting a checkpoint consolidates its shards into one safetensors file, by the model's
// parameter names, that the strict reader accepts and whose values are the trainer's own
// full parameters — from any world size and stage, in fp32 and in bf16 (master weights).
#include <cstring>
#include <tuple>

#include <gtest/gtest.h>

#include "base/error.h"
#include "checkpoint/export.h"
#include "checkpoint/safetensors.h"
#include "tests/checkpoint/checkpoint_test_support.h"

namespace zest {
namespace {

using testing::ScratchDirectory;
using testing::train_mlp;
using testing::TrainResult;
using testing::TrainSpec;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

class CheckpointExport : public ::testing::TestWithParam<std::tuple<int, int, DType>> {};

TEST_P(CheckpointExport, HoldsTheFullParametersByName) {
  ScratchDirectory scratch;
  TrainSpec spec;
  std::tie(spec.world, spec.stage, spec.compute_dtype) = GetParam();
  spec.steps = 3;
  spec.save_dir = scratch.path("ckpt");
  spec.save_at = 3;
  const TrainResult run = train_mlp(spec);

  // Exported in the compute dtype the values are full_parameter's exactly (bf16: the master
  // weights rounded as the engine rounds them).
  const std::string path = scratch.path("model.safetensors");
  const ExportResult result = export_safetensors(spec.save_dir, path, spec.compute_dtype);
  EXPECT_EQ(result.taken_from, spec.compute_dtype == DType::kFloat32 ? "params" : "master");
  const SafetensorsReader reader(path);
  ASSERT_EQ(reader.tensors().size(), run.params.size());
  EXPECT_EQ(result.tensors, run.params.size());
  EXPECT_EQ(reader.metadata().at("zest.step"), "3");
  std::vector<std::string> names;
  for (const SafetensorsTensor& tensor : reader.tensors()) names.push_back(tensor.name);
  EXPECT_EQ(names, (std::vector<std::string>{"layer0.weight", "layer0.bias", "layer1.weight",
                                             "layer1.bias", "layer2.weight", "layer2.bias"}));
  EXPECT_EQ(reader.find("layer1.weight")->shape, (std::vector<std::int64_t>{17, 31}));
  for (const auto& [name, values] : run.params) {
    const std::vector<float> exported = reader.read_float32(name);
    ASSERT_EQ(exported.size(), values.size()) << name;
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(same_bits(values[i], exported[i])) << name << "[" << i << "]";
    }
  }
  if (spec.compute_dtype == DType::kFloat32) return;
  // fp32 from a bf16 run: the master weights, which round to the run's parameters.
  const std::string fp32_path = scratch.path("master.safetensors");
  export_safetensors(spec.save_dir, fp32_path, DType::kFloat32);
  const SafetensorsReader fp32(fp32_path);
  EXPECT_EQ(fp32.tensors()[0].dtype, "F32");
  for (const auto& [name, values] : run.params) {
    const std::vector<float> master = fp32.read_float32(name);
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(same_bits(values[i], static_cast<float>(BFloat16(master[i])))) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Runs, CheckpointExport,
                         ::testing::Values(std::make_tuple(1, 0, DType::kFloat32),
                                           std::make_tuple(4, 3, DType::kFloat32),
                                           std::make_tuple(3, 1, DType::kFloat32),
                                           std::make_tuple(2, 2, DType::kBFloat16)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_stage" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  dtype_name(std::get<2>(info.param));
                         });

TEST(CheckpointExportErrors, ACorruptCheckpointWritesNothing) {
  ScratchDirectory scratch;
  TrainSpec spec;
  spec.world = 2;
  spec.steps = 1;
  spec.save_dir = scratch.path("ckpt");
  spec.save_at = 1;
  train_mlp(spec);
  testing::flip_byte(scratch.path("ckpt") + "/step-1/rank-1.bin", 7);
  EXPECT_THROW(
      export_safetensors(scratch.path("ckpt"), scratch.path("out.safetensors"), DType::kFloat32),
      Error);
  EXPECT_FALSE(std::filesystem::exists(scratch.path("out.safetensors")));
}

}  // namespace
}  // namespace zest
