// Checkpoints of a pipeline run: saved at (pipeline stages p, data-parallel ranks d), resumed at
// another (p', d') or by a plain ZeRO trainer and back, and resharded offline; the resumed run's
// losses and final parameters match the uninterrupted run's — bit for bit on the same mesh,
// within the pipeline parity tolerance (tests/pipeline/pipeline_test_support.h) on another,
// where the fp32 sums are taken in another order. Ranks are threads.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "checkpoint/writer.h"
#include "engine/engine.h"
#include "pipeline/pipeline_trainer.h"
#include "tests/pipeline/pipeline_test_support.h"

namespace zest {
namespace {

namespace fs = std::filesystem;
using testing::GlobalBatch;
using testing::TestModel;

struct RunSpec {
  TestModel model = TestModel::kMlp;
  int pipeline_stages = 2;  // 0: a plain ZeRO trainer (Engine::shard) over `data_parallel` ranks
  int data_parallel = 2;
  int zero_stage = 1;
  int micro_batches = 4;
  std::int64_t steps = 4;  // train until the trainer has taken this many steps
  std::int64_t rows = 48;  // global batch
  std::string resume;
  std::string save_dir;  // saved when steps_taken reaches save_at
  std::int64_t save_at = -1;
  CheckpointOptions save_options;  // dir is save_dir
};

struct Outcome {
  std::map<std::int64_t, float> losses;  // by step index
  std::map<std::string, std::vector<float>> params;
  LoadedCheckpoint loaded;
};

void train_steps(RankContext& context, Trainer& trainer, const RunSpec& run, int data_parallel_index,
                 Outcome& outcome) {
  if (!run.resume.empty()) {
    LoadedCheckpoint loaded = load_checkpoint(context, trainer, run.resume);
    if (context.rank == 0) outcome.loaded = loaded;
  }
  const std::int64_t local = run.rows / run.data_parallel;
  while (trainer.steps_taken() < run.steps) {
    const std::int64_t step = trainer.steps_taken();
    GlobalBatch batch = testing::make_batch(run.model, static_cast<int>(step), run.rows);
    trainer.forward_backward(batch.rows_of(data_parallel_index * local, local));
    const StepStats stats = trainer.step();
    if (context.rank == 0) outcome.losses[step] = stats.loss;
    if (trainer.steps_taken() == run.save_at) {
      CheckpointOptions options = run.save_options;
      options.dir = run.save_dir;
      save_checkpoint(context, trainer, options, {{"pipeline", {{"stages", run.pipeline_stages}}}},
                      {{"next_batch", trainer.steps_taken()}});
    }
  }
  for (const std::string& name : trainer.parameter_names()) {
    std::vector<float> value = trainer.full_parameter(name);
    if (context.rank == 0) outcome.params[name] = std::move(value);
  }
}

Outcome train(const RunSpec& run) {
  Outcome outcome;
  WorldOptions world;
  world.ranks = std::max(run.pipeline_stages, 1) * run.data_parallel;
  world.timeout = std::chrono::seconds(30);
  World(world).run([&](RankContext& context) {
    EngineOptions options;
    options.stage = run.zero_stage;
    const OptimizerOptions optimizer = testing::test_optimizer(run.model);
    if (run.pipeline_stages == 0) {
      std::unique_ptr<Module> module = testing::model_factory(run.model)();
      Engine engine(context, options);
      std::unique_ptr<Trainer> trainer = engine.shard(*module, make_optimizer(optimizer));
      train_steps(context, *trainer, run, context.rank, outcome);
      return;
    }
    PipelineOptions pipeline;
    pipeline.stages = run.pipeline_stages;
    pipeline.micro_batches = run.micro_batches;
    PipelineTrainer trainer(context, options, pipeline, testing::model_factory(run.model),
                            optimizer);
    train_steps(context, trainer, run,
                trainer.mesh().coordinate(context.rank).data_parallel_index, outcome);
  });
  return outcome;
}

// Steps from `first` on and the final parameters, as the parity helper reads them.
testing::TrainResult tail(const Outcome& outcome, std::int64_t first) {
  testing::TrainResult result;
  for (const auto& [step, loss] : outcome.losses) {
    if (step >= first) result.losses.push_back(loss);
  }
  result.params = outcome.params;
  return result;
}

void expect_bit_identical(const Outcome& resumed, const Outcome& reference, std::int64_t first) {
  const testing::TrainResult a = tail(resumed, first);
  const testing::TrainResult b = tail(reference, first);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "loss of step " << first + 1 + static_cast<int>(i);
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (const auto& [name, value] : b.params) {
    EXPECT_EQ(a.params.at(name), value) << name;
  }
}

void expect_parity(const Outcome& resumed, const Outcome& reference, std::int64_t first) {
  std::string where;
  const testing::TrainResult a = tail(resumed, first);
  const testing::TrainResult b = tail(reference, first);
  ASSERT_EQ(a.losses.size(), 2u);
  EXPECT_LE(testing::worst_relative_difference(a, b, &where), 1.0) << where;
}

class Scratch {
 public:
  Scratch() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = fs::temp_directory_path() / ("zest_pipeckpt_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() { fs::remove_all(path_); }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Saves `base`'s run after two of its four steps; returns the uninterrupted run.
Outcome save_and_reference(const RunSpec& base, const std::string& dir) {
  RunSpec save = base;
  save.steps = 2;
  save.save_dir = dir;
  save.save_at = 2;
  train(save);
  return train(base);
}

class PipelineCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(PipelineCheckpoint, ResumesOnTheSameMeshBitIdentically) {
  Scratch scratch;
  RunSpec run;
  run.zero_stage = GetParam();
  const Outcome reference = save_and_reference(run, scratch.path("ckpt"));

  const CheckpointManifest manifest = read_manifest(scratch.path("ckpt") + "/step-2");
  EXPECT_EQ(manifest.format_version, kCheckpointFormatVersion);
  EXPECT_EQ(manifest.pipeline_stages, 2);
  EXPECT_EQ(manifest.world_size, 2);
  ASSERT_EQ(manifest.units.size(), 5u);  // every layer once
  std::vector<int> parts;
  for (const CheckpointUnit& unit : manifest.units) parts.push_back(unit.pipeline_stage);
  EXPECT_EQ(parts, (std::vector<int>{0, 0, 0, 1, 1}));  // uniform: 3 and 2 layers
  EXPECT_EQ(manifest.files.size(), 4u);
  EXPECT_EQ(manifest.tensors.size(), 3u);  // params and AdamW's two moments
  EXPECT_EQ(manifest.counters.optimizer_steps, 2);
  verify_checkpoint(scratch.path("ckpt"));

  run.resume = scratch.path("ckpt");
  const Outcome resumed = train(run);
  EXPECT_EQ(resumed.loaded.step, 2);
  EXPECT_EQ(resumed.loaded.saved_pipeline_stages, 2);
  EXPECT_FALSE(resumed.loaded.resharded);
  EXPECT_EQ(resumed.losses.size(), 2u);
  expect_bit_identical(resumed, reference, 2);
}

TEST_P(PipelineCheckpoint, ResumesOnOtherMeshesWithinParity) {
  Scratch scratch;
  RunSpec run;
  run.zero_stage = GetParam();
  const Outcome reference = save_and_reference(run, scratch.path("ckpt"));
  for (const auto& [pipeline_stages, data_parallel] : {std::pair{1, 4}, std::pair{4, 1}}) {
    SCOPED_TRACE(std::to_string(pipeline_stages) + " x " + std::to_string(data_parallel));
    RunSpec other = run;
    other.pipeline_stages = pipeline_stages;
    other.data_parallel = data_parallel;
    other.resume = scratch.path("ckpt");
    const Outcome resumed = train(other);
    EXPECT_TRUE(resumed.loaded.resharded);
    expect_parity(resumed, reference, 2);
  }
}

INSTANTIATE_TEST_SUITE_P(ZeroStages, PipelineCheckpoint, ::testing::Values(1, 3),
                         [](const auto& info) { return "Zero" + std::to_string(info.param); });

// The GPT ties its embedding across the first and last pipeline stage: the manifest lists it once
// (the first pipeline stage's), and both copies are restored from it.
TEST(PipelineCheckpointTied, GptEmbeddingSavedOnceAndRestoredToBothStages) {
  Scratch scratch;
  RunSpec run;
  run.model = TestModel::kGpt;
  const Outcome reference = save_and_reference(run, scratch.path("ckpt"));
  const CheckpointManifest manifest = read_manifest(scratch.path("ckpt") + "/step-2");
  ASSERT_EQ(manifest.units.size(), 6u);
  EXPECT_EQ(manifest.units.front().name, "embedding");
  EXPECT_EQ(manifest.units.front().pipeline_stage, 0);
  EXPECT_EQ(manifest.units.back().pipeline_stage, 1);
  EXPECT_EQ(manifest.tensors.size(), 2u);  // params and SGD's momentum

  run.resume = scratch.path("ckpt");
  expect_bit_identical(train(run), reference, 2);
  for (const auto& [pipeline_stages, data_parallel] : {std::pair{4, 1}, std::pair{1, 4}}) {
    SCOPED_TRACE(std::to_string(pipeline_stages) + " x " + std::to_string(data_parallel));
    RunSpec other = run;
    other.pipeline_stages = pipeline_stages;
    other.data_parallel = data_parallel;
    expect_parity(train(other), reference, 2);
  }
}

TEST(PipelineCheckpointPlain, PlainCheckpointResumesAsAPipelineAndBack) {
  Scratch scratch;
  RunSpec plain;
  plain.pipeline_stages = 0;
  plain.data_parallel = 4;
  plain.zero_stage = 2;
  const Outcome plain_reference = save_and_reference(plain, scratch.path("plain"));
  RunSpec as_pipeline;
  as_pipeline.zero_stage = 2;
  as_pipeline.resume = scratch.path("plain");
  expect_parity(train(as_pipeline), plain_reference, 2);

  RunSpec pipeline;
  pipeline.zero_stage = 2;
  const Outcome pipeline_reference = save_and_reference(pipeline, scratch.path("pipeline"));
  RunSpec as_plain = plain;
  as_plain.data_parallel = 2;
  as_plain.resume = scratch.path("pipeline");
  const Outcome resumed = train(as_plain);
  EXPECT_EQ(resumed.loaded.saved_pipeline_stages, 2);
  expect_parity(resumed, pipeline_reference, 2);
}

// zest-ckpt reshard: a pipeline's checkpoint rewritten for 3 ranks, plain, resumes at 3 plain
// ranks and at 3 pipeline stages.
TEST(PipelineCheckpointReshard, OfflineReshardOfAPipelineCheckpoint) {
  Scratch scratch;
  RunSpec run;
  const Outcome reference = save_and_reference(run, scratch.path("ckpt"));
  const ReshardResult result = reshard_checkpoint(scratch.path("ckpt"), scratch.path("three"), 3);
  EXPECT_EQ(result.world_size, 3);
  const CheckpointManifest manifest = read_manifest(scratch.path("three"));
  EXPECT_EQ(manifest.pipeline_stages, 1);
  EXPECT_EQ(manifest.files.size(), 3u);
  verify_checkpoint(scratch.path("three"));

  RunSpec plain = run;
  plain.pipeline_stages = 0;
  plain.data_parallel = 3;
  plain.resume = scratch.path("three");
  expect_parity(train(plain), reference, 2);
  RunSpec three_stages = run;
  three_stages.pipeline_stages = 3;
  three_stages.data_parallel = 1;
  three_stages.resume = scratch.path("three");
  expect_parity(train(three_stages), reference, 2);
}

// A save that fails on the last pipeline stage's rank (its disk full) fails on every rank and
// leaves the previous checkpoint and `latest` as they were, with nothing half-written beside them.
TEST(PipelineCheckpointErrors, AFailedSaveLeavesThePreviousCheckpoint) {
  Scratch scratch;
  RunSpec run;
  run.steps = 2;
  run.save_dir = scratch.path("ckpt");
  run.save_at = 2;
  train(run);
  RunSpec failing = run;
  failing.steps = 3;
  failing.save_at = 3;
  failing.resume = scratch.path("ckpt");
  failing.save_options.fail_rank = 3;
  failing.save_options.fail_after_bytes = 100;
  try {
    train(failing);
    FAIL() << "the save did not fail";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("No space left"), std::string::npos) << error.what();
  }
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(scratch.path("ckpt"))) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-2"}));
  verify_checkpoint(scratch.path("ckpt"));
  EXPECT_EQ(read_manifest(scratch.path("ckpt") + "/step-2").step, 2);
}

TEST(PipelineCheckpointErrors, AnotherModelIsRefusedNamingTheDifference) {
  Scratch scratch;
  RunSpec run;
  run.steps = 2;
  run.save_dir = scratch.path("ckpt");
  run.save_at = 2;
  train(run);
  RunSpec gpt;
  gpt.model = TestModel::kGpt;
  gpt.resume = scratch.path("ckpt");
  try {
    train(gpt);
    FAIL() << "loaded an MLP's checkpoint into a GPT";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint) << error.what();
    EXPECT_NE(std::string(error.what()).find("saved from another model"), std::string::npos)
        << error.what();
  }
}

// A manifest whose unit names a pipeline stage past pipeline_stages, or that lists too few
// files for its pipeline stages, is refused naming the key.
TEST(PipelineCheckpointManifest, BadPipelineFieldsAreRefused) {
  CheckpointManifest manifest;
  manifest.world_size = 2;
  manifest.pipeline_stages = 2;
  manifest.shard_alignment = 4;
  manifest.tensors = {{"params", DType::kFloat32}};
  const std::vector<ShardLayout> layouts = {
      ShardLayout::build("a", {{"w", {4}}}, 2, 4), ShardLayout::build("b", {{"w", {8}}}, 2, 4)};
  manifest.units = describe_units(layouts, {0, 1});
  for (int r = 0; r < 4; ++r) {
    manifest.files.push_back({rank_file_name(r), manifest.rank_file_bytes(r / 2), 0});
  }
  const std::string good = manifest_text(manifest);
  const CheckpointManifest back = parse_manifest(good, "m");
  EXPECT_EQ(back.pipeline_stages, 2);
  EXPECT_EQ(back.units[1].pipeline_stage, 1);
  EXPECT_EQ(back.block_offset(1, 0), 0u);  // first in its part's files
  EXPECT_EQ(back.file_of(1, 1), 3);

  auto refused = [&](const CheckpointManifest& bad, const std::string& key) {
    try {
      parse_manifest(manifest_text(bad), "m");
      ADD_FAILURE() << "accepted; expected an error naming " << key;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
      EXPECT_NE(std::string(error.what()).find(key), std::string::npos) << error.what();
    }
  };
  CheckpointManifest bad = manifest;
  bad.units[1].pipeline_stage = 2;
  refused(bad, "units[1].pipeline_stage");
  bad = manifest;
  bad.files.pop_back();
  refused(bad, "files");
  bad = manifest;
  bad.files[2].bytes += 4;
  refused(bad, "files[2].bytes");
}

}  // namespace
}  // namespace zest
