// Hybrid sharding inside pipeline stages (zero_optimization.hybrid_shard_size with a pipeline):
// each pipeline stage's data-parallel group in shard groups, the chunks' trainers in their shard
// group's view. The MLP and the GPT (its embedding tied across the first and last pipeline stage)
// train to the numbers of one rank, and of the same pipeline without hybrid sharding, within 1e-6
// relative at ZeRO 1-3, groups of 2 in 4 data-parallel ranks and groups of 1; a checkpoint holds
// each pipeline stage's shards once (the first shard group's files) and resumes on the same layout
// bit for bit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "tests/pipeline/pipeline_test_support.h"

namespace zest::testing {
namespace {

namespace fs = std::filesystem;

PipelineSpec hybrid_spec(TestModel model, int data_parallel, int zero_stage, int shard_size) {
  PipelineSpec spec;
  spec.model = model;
  spec.stages = 2;
  spec.data_parallel = data_parallel;
  spec.zero_stage = zero_stage;
  spec.pipeline.micro_batches = 4;
  spec.configure_engine = [shard_size](EngineOptions& engine) {
    engine.hybrid_shard_size = shard_size;
  };
  // Each chunk's units are sharded over the shard group, not the data-parallel group.
  spec.configure_trainer = [shard_size, data_parallel](int, PipelineTrainer& trainer) {
    EXPECT_EQ(trainer.chunk_trainer(0).layouts().front().world_size(),
              shard_size > 0 ? shard_size : data_parallel);
  };
  return spec;
}

TEST(PipelineHybrid, TrainsAsOneRankAndAsThePlainPipeline) {
  for (TestModel model : {TestModel::kMlp, TestModel::kGpt}) {
    const TrainResult single = train_single(model, 3, 48);
    for (int zero : {1, 2, 3}) {
      for (auto [data_parallel, shard] : std::vector<std::pair<int, int>>{{4, 2}, {2, 1}}) {
        const std::string what = std::string(is_mlp(model) ? "mlp" : "gpt") + " 2x" +
                                 std::to_string(data_parallel) + " groups of " +
                                 std::to_string(shard) + " zero " + std::to_string(zero);
        const TrainResult hybrid = train_pipeline(hybrid_spec(model, data_parallel, zero, shard));
        const TrainResult plain = train_pipeline(hybrid_spec(model, data_parallel, zero, 0));
        std::string where;
        EXPECT_LE(worst_relative_difference(single, hybrid, &where), 1.0) << what << ": " << where;
        EXPECT_LE(worst_relative_difference(plain, hybrid, &where), 1.0) << what << ": " << where;
      }
    }
  }
}

// 2 pipeline stages x 4 data-parallel ranks in groups of 2, the MLP at ZeRO 3: steps 1-2 saved,
// steps 3-4 resumed; losses and parameters equal the uninterrupted run's to the bit.
TEST(PipelineHybrid, ACheckpointHoldsEachStagesShardsOnceAndResumesBitIdentically) {
  const fs::path dir = fs::temp_directory_path() / ("zest_pipehybrid_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto run = [&](bool save, bool resume) {
    TrainResult result;
    WorldOptions world;
    world.ranks = 8;
    world.timeout = std::chrono::seconds(30);
    World(world).run([&](RankContext& context) {
      EngineOptions options;
      options.stage = 3;
      options.hybrid_shard_size = 2;
      PipelineOptions pipeline;
      pipeline.stages = 2;
      pipeline.micro_batches = 4;
      PipelineTrainer trainer(context, options, pipeline, model_factory(TestModel::kMlp),
                              test_optimizer(TestModel::kMlp));
      if (resume) load_checkpoint(context, trainer, dir.string());
      const std::int64_t local = 48 / 4;
      const std::int64_t first = trainer.mesh().coordinate(context.rank).data_parallel_index * local;
      while (trainer.steps_taken() < (save ? 2 : 4)) {
        GlobalBatch batch = make_batch(TestModel::kMlp, static_cast<int>(trainer.steps_taken()), 48);
        trainer.forward_backward(batch.rows_of(first, local));
        const StepStats stats = trainer.step();
        if (context.rank == 0) result.losses.push_back(stats.loss);
      }
      if (save) {
        CheckpointOptions checkpoint;
        checkpoint.dir = dir.string();
        save_checkpoint(context, trainer, checkpoint, nlohmann::json::object());
      }
      for (const std::string& name : trainer.parameter_names()) {
        std::vector<float> value = trainer.full_parameter(name);
        if (context.rank == 0) result.params[name] = std::move(value);
      }
    });
    return result;
  };
  const TrainResult whole = run(false, false);
  run(true, false);
  const CheckpointManifest manifest = read_manifest((dir / "step-2").string());
  EXPECT_EQ(manifest.pipeline_stages, 2);
  EXPECT_EQ(manifest.world_size, 2);
  EXPECT_EQ(manifest.hybrid_replicas, 2);
  EXPECT_EQ(manifest.files.size(), 4u);
  verify_checkpoint(dir.string());
  const TrainResult resumed = run(false, true);
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], whole.losses[2]);
  EXPECT_EQ(resumed.losses[1], whole.losses[3]);
  EXPECT_EQ(resumed.params, whole.params);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zest::testing
