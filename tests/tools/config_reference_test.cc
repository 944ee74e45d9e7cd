// The config reference (docs/config.md) names every key zest-train prints: the resolved config of
// the default job, and of jobs that open each optional block (the MLP, pipeline stages, offload,
// hybrid sharding with ZeRO++, hpZ, the debug block with a fault, the CSV monitor, checkpoints,
// fp16 with recomputation, the other schedulers and optimizers), flattened to dotted key paths,
// each of which must appear in the page as `path`. A key added to the parser without a line in
// the reference fails here, naming it.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"
#include "tests/tools/zest_train_support.h"

namespace {

using nlohmann::json;
using zest::testing::kZestTrain;
using zest::testing::ProcessResult;

const std::string kDefaultConfig = ZEST_SOURCE_DIR "/configs/default.json";
const std::string kMlpConfig = ZEST_SOURCE_DIR "/configs/mlp.json";
const std::string kReference = ZEST_SOURCE_DIR "/docs/config.md";

// Every leaf's dotted path. Arrays are values (betas, sizes, the pipeline's units), and an empty
// object is a leaf of its own, so a block printed empty still needs its line.
void flatten(const json& value, const std::string& path, std::set<std::string>& out) {
  if (value.is_object() && !value.empty()) {
    for (const auto& item : value.items()) {
      flatten(item.value(), path.empty() ? item.key() : path + "." + item.key(), out);
    }
    return;
  }
  out.insert(path);
}

std::string read_file(const std::string& file) {
  std::ifstream in(file);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class ConfigReference : public zest::testing::ScratchDirectoryTest {
 protected:
  // The key paths zest-train --print-config prints for `config` with `sets` applied.
  std::set<std::string> printed_keys(const std::string& config,
                                     const std::vector<std::string>& sets) const {
    std::vector<std::string> args = {"--config", config, "--print-config"};
    // The default job's corpus by its full path: the test does not run from the source tree.
    if (config == kDefaultConfig) {
      args.insert(args.end(), {"--set", "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt"});
    }
    for (const std::string& assignment : sets) {
      args.push_back("--set");
      args.push_back(assignment);
    }
    const ProcessResult result =
        zest::testing::run_program(kZestTrain, args, {path("stdout.txt"), path("stderr.txt")});
    EXPECT_EQ(result.status, 0) << config << " " << ::testing::PrintToString(sets) << ": "
                                << result.err;
    std::set<std::string> keys;
    if (result.status == 0) flatten(json::parse(result.out), "", keys);
    return keys;
  }

  // Every printed key of every job below.
  std::set<std::string> all_printed_keys() const {
    const std::string scratch = path("");
    const std::vector<std::pair<std::string, std::vector<std::string>>> jobs = {
        {kDefaultConfig, {}},
        {kMlpConfig, {}},
        {kDefaultConfig,
         {R"(pipeline={"stages": 2, "schedule": "interleaved_1f1b", "partition": "uniform"})"}},
        {kDefaultConfig,
         {R"(zero_optimization.offload_optimizer={"device": "cpu", "pin_memory": true})",
          R"(world.host_memory="1GiB")"}},
        {kDefaultConfig,
         {"world.ranks_per_node=2", R"(zero_optimization.hybrid_shard_size="node")",
          "zero_optimization.zero_quantized_weights=true",
          "zero_optimization.zero_quantized_gradients=true",
          "zero_optimization.zero_quantized_gradients_bits=4",
          R"(world.link={"model": "on", "bandwidth_gbit_s": 10, "latency_us": 5})"}},
        {kDefaultConfig, {"world.ranks_per_node=2", "zero_optimization.zero_hpz_partition_size=2"}},
        {kDefaultConfig,
         {R"(debug={"check_collectives": true, "collective_delay_ms": 1, "hold_frees": true,
             "fault": {"kind": "nan_gradient", "rank": 1, "step": 2, "unit": "block0"}})"}},
        {kDefaultConfig, {R"(debug={"fault": {"kind": "stall", "stall_seconds": 1}})"}},
        {kDefaultConfig,
         {R"(csv_monitor={"enabled": true, "output_path": ")" + scratch + R"(", "job_name": "run"})",
          R"(tensorboard={"enabled": false})", R"(wandb={"enabled": false})",
          R"(comet={"enabled": false})"}},
        {kDefaultConfig,
         {R"(checkpoint={"dir": ")" + scratch + R"(ckpt", "every_steps": 10, "keep_last": 2,
             "save_on_exit": true, "resume": "auto"})"}},
        {kDefaultConfig,
         {R"(fp16={"enabled": true})", R"(activation_checkpointing={"policy": "selective",
             "cpu_checkpointing": true, "units": {"every": 2}})",
          R"(log.trace=")" + scratch + R"(trace.json")", "wall_clock_breakdown=true"}},
        {kDefaultConfig, {R"(bf16={"enabled": true})", R"(communication_data_type="bf16")"}},
        {kDefaultConfig,
         {R"(scheduler={"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}})",
          R"(optimizer={"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}})"}},
        {kDefaultConfig, {R"(scheduler={"type": "WarmupLR"})"}},
        {kDefaultConfig, {R"(tensor_parallel={"size": 2})", "model.vocab_size=256"}},
        {kDefaultConfig,
         {R"(model.vocab_pieces="auto")", "model.vocab_size=1024", "model.logits_by_pieces=true",
          "data.val_fraction=0", "data.val_path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt"}},
    };
    std::set<std::string> keys;
    for (const auto& [config, sets] : jobs) keys.merge(printed_keys(config, sets));
    return keys;
  }
};

TEST_F(ConfigReference, EveryPrintedKeyIsInTheReference) {
  const std::set<std::string> keys = all_printed_keys();
  // The jobs opened the optional blocks: otherwise the check below would pass on too little.
  for (const char* key :
       {"pipeline.schedule", "pipeline.units", "zero_optimization.offload_optimizer.device",
        "zero_optimization.hybrid_shard_size", "zero_optimization.zero_hpz_partition_size",
        "debug.fault.kind", "csv_monitor.job_name", "checkpoint.dir", "model.sizes",
        "activation_checkpointing.recomputed", "fp16.loss_scale_window",
        "optimizer.params.momentum"}) {
    EXPECT_TRUE(keys.contains(key)) << "no job printed " << key;
  }
  const std::string reference = read_file(kReference);
  ASSERT_FALSE(reference.empty()) << kReference;
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (reference.find("`" + key + "`") == std::string::npos) missing.push_back(key);
  }
  EXPECT_THAT(missing, ::testing::IsEmpty())
      << "keys zest-train --print-config prints that docs/config.md does not name";
}

}  // namespace
