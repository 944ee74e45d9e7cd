// The `pipeline` block: checked whole when a config is loaded (the schedule when it parses, the
// partition resolved to unit names by the resolution step), its batch rule (DeepSpeed's pipeline
// engine: micro-batches are the accumulation steps, the batch counts data-parallel ranks), and
// each bad value one line naming its key. Without the block every config resolves as before.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "resolve/resolved_config.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A GPT of 6 units (embedding, block0..3, head) on 4 ranks.
json gpt_config() {
  return json::parse(R"({
    "model": {"type": "gpt", "n_layer": 4, "n_head": 2, "n_embd": 32, "vocab_size": 256,
              "seq_len": 16},
    "data": {"type": "text", "path": "unused.txt"},
    "world": {"backend": "local", "ranks": 4},
    "steps": 10,
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 1}
  })");
}

json with_pipeline(json config, const json& pipeline) {
  config["pipeline"] = pipeline;
  return config;
}

std::string config_error(const json& config) {
  try {
    parse_resolved_config(config);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig) << error.what();
    EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "expected a kConfig Error for " << config.dump();
  return "";
}

TEST(PipelineConfig, WithoutTheBlockOnePipelineStageHoldsEveryUnitAndNothingIsWritten) {
  const TrainConfig config = parse_resolved_config(gpt_config());
  EXPECT_FALSE(config.json.contains("pipeline"));
  EXPECT_FALSE(config.pipeline.enabled());
  EXPECT_EQ(config.pipeline.stages, 1);
  EXPECT_EQ(config.pipeline.data_parallel, 4);
  EXPECT_EQ(config.pipeline.micro_batches, 2);  // 16 / (2 x 4)
  EXPECT_THAT(config.pipeline.units_per_virtual_stage, ElementsAre(6));
  EXPECT_EQ(config.gradient_accumulation_steps, 2);
  EXPECT_EQ(config.train_batch_size, 16);
}

TEST(PipelineConfig, ResolvesTheBlockWithTheBatchCountingDataParallelRanks) {
  const TrainConfig config =
      parse_resolved_config(with_pipeline(gpt_config(), {{"stages", 2}, {"partition", "uniform"}}));
  EXPECT_TRUE(config.pipeline.enabled());
  EXPECT_EQ(config.pipeline.data_parallel, 2);
  // 16 = 2 per micro-batch x 4 accumulation steps x 2 data-parallel ranks.
  EXPECT_EQ(config.gradient_accumulation_steps, 4);
  EXPECT_EQ(config.pipeline.micro_batches, 4);
  EXPECT_EQ(config.engine.gradient_accumulation_steps, 4);
  EXPECT_EQ(config.pipeline.schedule, ScheduleKind::kOneFOneB);
  EXPECT_THAT(config.pipeline.units_per_virtual_stage, ElementsAre(3, 3));
  EXPECT_EQ(config.json["pipeline"], json::parse(R"({
    "stages": 2, "micro_batches": 4, "schedule": "1f1b", "virtual_chunks": 1,
    "reshard_after_forward": true, "partition": "uniform",
    "units": [["embedding", "block0", "block1"], ["block2", "block3", "head"]]})"));
  // The resolved config parses to the same (its `units` are written, never read).
  const TrainConfig again = parse_resolved_config(config.json);
  EXPECT_EQ(again.json, config.json);
}

TEST(PipelineConfig, MicroBatchesSetTheAccumulationSteps) {
  json base = gpt_config();
  base.erase("train_batch_size");
  const TrainConfig config =
      parse_resolved_config(with_pipeline(base, {{"stages", 2}, {"micro_batches", 8}}));
  EXPECT_EQ(config.gradient_accumulation_steps, 8);
  EXPECT_EQ(config.train_batch_size, 2 * 8 * 2);
  EXPECT_EQ(config.json["gradient_accumulation_steps"], 8);
}

TEST(PipelineConfig, PartitionsByParametersByDefault) {
  json base = gpt_config();
  base["model"]["vocab_size"] = 4096;  // the embedding outweighs three blocks
  const TrainConfig config = parse_resolved_config(with_pipeline(base, {{"stages", 2}}));
  EXPECT_EQ(config.pipeline.partition, PartitionMethod::kParameters);
  EXPECT_THAT(config.pipeline.units_per_virtual_stage, ElementsAre(1, 5));
  EXPECT_EQ(config.json["pipeline"]["units"][0], json::array({"embedding"}));
}

TEST(PipelineConfig, PartitionByMemoryGivesTheFirstStageFewerUnits) {
  // Equal layers whose activations outweigh their state: 1F1B holds two micro-batches on
  // pipeline stage 0 and one on stage 1.
  const json config = json::parse(R"({
    "model": {"type": "mlp", "sizes": [64, 64, 64, 64, 64, 64, 64, 64, 64]},
    "world": {"ranks": 2}, "steps": 1, "train_micro_batch_size_per_gpu": 256,
    "gradient_accumulation_steps": 4,
    "pipeline": {"stages": 2, "partition": "memory"}})");
  const TrainConfig parsed = parse_resolved_config(config);
  const auto& split = parsed.pipeline.units_per_virtual_stage;
  ASSERT_EQ(split.size(), 2u);
  EXPECT_EQ(split[0] + split[1], 8u);
  EXPECT_LT(split[0], split[1]);
}

TEST(PipelineConfig, InterleavedDefaultsToTwoChunksAndPartitionsEveryVirtualStage) {
  const TrainConfig config = parse_resolved_config(with_pipeline(
      gpt_config(), {{"stages", 2}, {"schedule", "interleaved_1f1b"}, {"partition", "uniform"}}));
  EXPECT_EQ(config.pipeline.virtual_chunks, 2);
  EXPECT_THAT(config.pipeline.units_per_virtual_stage, ElementsAre(2, 2, 1, 1));
  EXPECT_EQ(config.json["pipeline"]["virtual_chunks"], 2);
}

TEST(PipelineConfig, StageThreeMayKeepParametersGathered) {
  json base = gpt_config();
  base["zero_optimization"]["stage"] = 3;
  const TrainConfig config = parse_resolved_config(
      with_pipeline(base, {{"stages", 2}, {"reshard_after_forward", false}}));
  EXPECT_FALSE(config.pipeline.reshard_after_forward);
}

TEST(PipelineConfig, EveryBadValueIsOneLineNamingItsKey) {
  const json base = gpt_config();
  auto error = [&](const json& pipeline) { return config_error(with_pipeline(base, pipeline)); };
  EXPECT_EQ(error({{"stages", 3}}),
            "pipeline.stages: 3 does not divide world.ranks (4): world.ranks = pipeline stages x "
            "data-parallel ranks");
  EXPECT_THAT(error({{"stages", 8}}), StartsWith("pipeline.stages: 8 does not divide"));
  EXPECT_THAT(error({{"stages", 0}}), StartsWith("pipeline.stages: must be an integer >= 1"));
  EXPECT_THAT(error({{"stages", 2}, {"micro_batches", 8}}),
              StartsWith("batch sizes are inconsistent: train_batch_size 16, "
                         "train_micro_batch_size_per_gpu 2, gradient_accumulation_steps 8 "
                         "(pipeline.micro_batches), data-parallel ranks 2 (2 x 8 x 2 = 32, not "
                         "16)"));
  json accumulating = base;
  accumulating["gradient_accumulation_steps"] = 4;
  EXPECT_EQ(config_error(with_pipeline(accumulating, {{"stages", 2}, {"micro_batches", 8}})),
            "pipeline.micro_batches: 8 differs from gradient_accumulation_steps 4: a pipeline's "
            "micro-batches are the step's accumulation steps; set one");
  EXPECT_THAT(error({{"stages", 2}, {"schedule", "pipedream"}}),
              StartsWith("pipeline.schedule: 'pipedream' is not a schedule"));
  json unbatched = base;
  unbatched.erase("train_batch_size");
  EXPECT_EQ(config_error(with_pipeline(
                unbatched, {{"stages", 2}, {"micro_batches", 3}, {"schedule", "interleaved_1f1b"}})),
            "pipeline.micro_batches: interleaved_1f1b runs micro-batches in groups of the 2 "
            "pipeline stages, so it needs a multiple of 2, got 3");
  EXPECT_THAT(error({{"stages", 2}, {"virtual_chunks", 2}}),
              StartsWith("pipeline.virtual_chunks: 2 chunks per pipeline stage need schedule "
                         "interleaved_1f1b"));
  EXPECT_EQ(error({{"stages", 2}, {"partition", {3, 2}}}),
            "pipeline.partition: the list sums to 5 units, but the model has 6 (units would be "
            "dropped)");
  EXPECT_THAT(error({{"stages", 2}, {"partition", {6, 0}}}),
              StartsWith("pipeline.partition: [1] is 0"));
  EXPECT_THAT(
      error({{"stages", 2}, {"partition", {2, 2, 2}}}),
      StartsWith("pipeline.partition: lists 3 entries, not one per virtual stage (2"));
  EXPECT_THAT(error({{"stages", 2}, {"partition", "best"}}),
              StartsWith("pipeline.partition: must be uniform, parameters or memory or a list"));
  EXPECT_THAT(error({{"stages", 2}, {"partition", {1.5, 4.5}}}),
              StartsWith("pipeline.partition[0]: must be an integer"));
  EXPECT_THAT(error({{"stages", 2}, {"reshard_after_forward", false}}),
              StartsWith("pipeline.reshard_after_forward: false needs zero_optimization.stage 3"));
  EXPECT_THAT(error({{"stage", 2}}), HasSubstr("did you mean 'pipeline.stages'?"));
  EXPECT_THAT(error({{"stages", 4}, {"micro_batches", 1 << 21}}),
              StartsWith("pipeline.micro_batches: must be at most 2^20"));

  json huge = base;
  huge["model"]["n_layer"] = 1 << 30;
  EXPECT_EQ(config_error(with_pipeline(huge, {{"stages", 2}, {"partition", "uniform"}})),
            "pipeline.partition: the model has 1073741826 units, more than the 65536 a pipeline "
            "partitions");

  // Fewer units than virtual stages, whichever the method: an MLP of 2 layers on 4 pipeline stages.
  json mlp = json::parse(R"({"model": {"type": "mlp", "sizes": [8, 16, 4]},
    "world": {"ranks": 4}, "steps": 1, "train_micro_batch_size_per_gpu": 1})");
  for (const json& partition : {json("uniform"), json("parameters"), json("memory")}) {
    EXPECT_THAT(config_error(with_pipeline(mlp, {{"stages", 4}, {"partition", partition}})),
                StartsWith("pipeline.partition: the model has 2 units, fewer than its 4 virtual "
                           "stages"));
  }
  // The batch rule names the data-parallel ranks.
  json odd = gpt_config();
  odd["train_batch_size"] = 6;
  odd.erase("train_micro_batch_size_per_gpu");
  EXPECT_THAT(config_error(with_pipeline(odd, {{"stages", 2}, {"micro_batches", 4}})),
              HasSubstr("data-parallel ranks (world.ranks / pipeline.stages)"));
  json misplaced = gpt_config();
  misplaced["micro_batches"] = 4;
  EXPECT_THAT(config_error(misplaced), HasSubstr("did you mean 'pipeline.micro_batches'?"));
}

// Each pipeline stage recomputes what the whole model's plan gives its units, which the config
// lists; offloading the checkpoints is not served inside pipeline stages, and the config says
// so in one line rather than a rank at run time.
TEST(PipelineConfig, RecomputationListsTheWholeModelsPlanAndRefusesCheckpointOffload) {
  json config = with_pipeline(gpt_config(), {{"stages", 4}});
  config["activation_checkpointing"] = {{"policy", "full"}};
  EXPECT_EQ(parse_resolved_config(config).json["activation_checkpointing"]["recomputed"],
            json({"block0", "block1", "block2", "block3"}));
  config["activation_checkpointing"]["cpu_checkpointing"] = true;
  EXPECT_EQ(config_error(config),
            "activation_checkpointing.cpu_checkpointing: true is not supported with pipeline "
            "stages yet (pipeline.stages 4): it keeps one micro-batch's checkpoints, and a "
            "pipeline holds several; set it to false or leave the pipeline block out");
  config["pipeline"]["stages"] = 1;
  EXPECT_NO_THROW(parse_resolved_config(config));
}

TEST(PipelineConfig, OverridesReachTheBlock) {
  const TrainConfig config =
      parse_resolved_config(gpt_config(), {"pipeline.stages=4", "pipeline.partition=[1,1,2,2]"});
  EXPECT_EQ(config.pipeline.stages, 4);
  EXPECT_EQ(config.pipeline.data_parallel, 1);
  EXPECT_EQ(config.pipeline.micro_batches, 8);
  EXPECT_THAT(config.pipeline.units_per_virtual_stage, ElementsAre(1, 1, 2, 2));
}

}  // namespace
}  // namespace zest
