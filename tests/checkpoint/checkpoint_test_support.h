// Shared by the checkpoint tests: train the MLP on the engine tests' fixed batches (the batch of
// step k depends on k alone), optionally resuming from a checkpoint first and saving at a given
// step, and collect per-step losses and final parameters. A scratch directory per test.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/mlp.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "engine/engine.h"
#include "runtime/world.h"
#include "tests/engine/engine_test_support.h"

namespace zest::testing {

struct TrainSpec {
  int stage = 0;
  int world = 1;
  std::string backend = "local";  // "mpi": the processes of the job (world = their count)
  DeviceKind device = DeviceKind::kCpu;  // kCuda: backend nccl, one GPU per rank
  std::string optimizer = "AdamW";
  std::vector<std::int64_t> sizes = {13, 31, 17, 7};
  int global_batch = 60;
  DType compute_dtype = DType::kFloat32;
  LossScaleOptions loss_scale;
  std::int64_t steps = 6;  // train until the trainer has taken this many steps
  std::string resume;      // load this checkpoint (dir or root) before training
  std::string save_dir;    // save here when steps_taken reaches save_at
  std::int64_t save_at = -1;
  std::int64_t save_every = 0;     // also save whenever steps_taken is a multiple of this (> 0)
  CheckpointOptions save_options;  // dir is save_dir
  // Runs on every rank after loading (or at the start) and at the end, with the trainer.
  std::function<void(RankContext&, Trainer&)> at_start;
  std::function<void(RankContext&, Trainer&)> at_end;
  // Adjusts the engine's options beyond the fields above (offload_optimizer, ...).
  std::function<void(EngineOptions&)> configure_engine;
};

struct TrainResult {
  std::map<std::int64_t, float> losses;  // by step index (the batch's number)
  std::map<std::string, std::vector<float>> params;
  LoadedCheckpoint loaded;
  SavedCheckpoint saved;
};

inline nlohmann::json spec_config(const TrainSpec& spec) {
  return {{"model", {{"type", "mlp"}, {"sizes", spec.sizes}}},
          {"optimizer", {{"type", spec.optimizer}}},
          {"zero_optimization", {{"stage", spec.stage}}},
          {"world", {{"ranks", spec.world}}}};
}

inline TrainResult train_mlp(const TrainSpec& spec) {
  TrainResult result;
  WorldOptions world_options;
  world_options.ranks = spec.world;
  world_options.backend = spec.device == DeviceKind::kCuda ? "nccl" : spec.backend;
  world_options.device = spec.device;
  world_options.timeout = std::chrono::seconds(60);
  World world(world_options);
  world.run([&](RankContext& context) {
    Mlp model(MlpConfig{spec.sizes});
    EngineOptions options;
    options.stage = spec.stage;
    options.compute_dtype = spec.compute_dtype;
    options.loss_scale = spec.loss_scale;
    if (spec.configure_engine) spec.configure_engine(options);
    Engine engine(context, options);
    OptimizerOptions optimizer;
    optimizer.type = spec.optimizer;
    optimizer.lr = spec.optimizer == "SGD" ? 0.05f : 3e-3f;
    optimizer.weight_decay = 0.01f;
    optimizer.momentum = 0.9f;
    auto trainer = engine.shard(model, make_optimizer(optimizer));
    if (!spec.resume.empty()) {
      LoadedCheckpoint loaded = load_checkpoint(context, *trainer, spec.resume);
      if (context.rank == 0) result.loaded = loaded;
    }
    if (spec.at_start) spec.at_start(context, *trainer);
    const int features = static_cast<int>(spec.sizes.front());
    const int classes = static_cast<int>(spec.sizes.back());
    const int local_rows = spec.global_batch / spec.world;
    std::vector<float> inputs;
    std::vector<std::int32_t> targets;
    auto maybe_save = [&] {
      const std::int64_t taken = trainer->steps_taken();
      const bool due = taken == spec.save_at ||
                       (spec.save_every > 0 && taken > 0 && taken % spec.save_every == 0);
      if (!due || spec.save_dir.empty()) return;
      CheckpointOptions save = spec.save_options;
      save.dir = spec.save_dir;
      SavedCheckpoint saved = save_checkpoint(context, *trainer, save, spec_config(spec),
                                              {{"next_batch", trainer->steps_taken()}});
      if (context.rank == 0) result.saved = saved;
    };
    maybe_save();
    while (trainer->steps_taken() < spec.steps) {
      const std::int64_t step = trainer->steps_taken();
      make_global_batch(static_cast<int>(step), spec.global_batch, features, classes, inputs,
                        targets);
      const std::size_t first = static_cast<std::size_t>(context.rank) * local_rows;
      Batch batch;
      batch.inputs =
          Tensor{inputs.data() + first * features, {local_rows, features}, DType::kFloat32};
      batch.targets = Tensor{targets.data() + first, {local_rows}, DType::kInt32};
      trainer->forward_backward(batch);
      const StepStats stats = trainer->step();
      if (context.rank == 0) result.losses[step] = stats.loss;
      maybe_save();
    }
    if (spec.at_end) spec.at_end(context, *trainer);
    for (const std::string& name : trainer->parameter_names()) {
      std::vector<float> value = trainer->full_parameter(name);
      if (context.rank == 0) result.params[name] = std::move(value);
    }
  });
  return result;
}

// A fresh directory under the system's temporary directory, removed with the fixture.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = std::filesystem::temp_directory_path() /
            ("zest_ckpt_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDirectory() { std::filesystem::remove_all(path_); }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;

  std::string path(const std::string& name = "") const {
    return name.empty() ? path_.string() : (path_ / name).string();
  }

 private:
  std::filesystem::path path_;
};

inline std::string read_whole_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

inline void write_whole_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Flips one bit of the byte at `offset`.
inline void flip_byte(const std::string& path, std::size_t offset) {
  std::string bytes = read_whole_file(path);
  bytes.at(offset) = static_cast<char>(bytes[offset] ^ 0x10);
  write_whole_file(path, bytes);
}

}  // namespace zest::testing
