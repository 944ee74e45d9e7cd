// The `tensor_parallel` block: its size divides the ranks (one line naming the numbers otherwise),
// DeepSpeed's autotp_size is the same number, the batch counts the data-parallel ranks
// (world.ranks / size), the model's dimensions divide by it (the sequence too, with sequence
// parallelism), and what the first slice does not compose with yet is refused at config time, one
// line naming the key. Without the block (or at size 1) every config resolves as before.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "resolve/resolved_config.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json gpt_config() {
  return json::parse(R"({
    "model": {"type": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 256,
              "seq_len": 16},
    "data": {"type": "text", "path": "unused.txt"},
    "world": {"backend": "local", "ranks": 4},
    "steps": 10,
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 1},
    "tensor_parallel": {"size": 2}
  })");
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

TEST(TensorParallelConfig, TheBatchCountsTheDataParallelRanksAndTheResolvedConfigShowsTheBlock) {
  const TrainConfig config = parse_resolved_config(gpt_config());
  EXPECT_EQ(config.tensor_parallel.size, 2);
  EXPECT_EQ(config.pipeline.data_parallel, 2);  // 4 ranks / 2
  EXPECT_EQ(config.train_batch_size, 4);         // 2 per rank x 2 data-parallel ranks
  EXPECT_EQ(config.json["tensor_parallel"]["size"], 2);
  EXPECT_EQ(config.json["tensor_parallel"]["sequence_parallel"], false);
}

TEST(TensorParallelConfig, WithoutTheBlockNothingChanges) {
  json raw = gpt_config();
  raw.erase("tensor_parallel");
  const TrainConfig config = parse_resolved_config(raw);
  EXPECT_FALSE(config.tensor_parallel.enabled());
  EXPECT_EQ(config.pipeline.data_parallel, 4);
  EXPECT_FALSE(config.json.contains("tensor_parallel"));
}

TEST(TensorParallelConfig, DeepSpeedsAutotpSizeIsTheSize) {
  json raw = gpt_config();
  raw["tensor_parallel"] = {{"autotp_size", 4}};
  const TrainConfig config = parse_resolved_config(raw);
  EXPECT_EQ(config.tensor_parallel.size, 4);
  EXPECT_EQ(config.json["tensor_parallel"]["size"], 4);
  EXPECT_FALSE(config.json["tensor_parallel"].contains("autotp_size"));
  raw["tensor_parallel"] = {{"autotp_size", 4}, {"size", 2}};
  EXPECT_THAT(config_error(raw), HasSubstr("tensor_parallel.autotp_size: 4 differs from "
                                           "tensor_parallel.size 2"));
}

TEST(TensorParallelConfig, ASizeThatDoesNotDivideTheRanksIsOneErrorNamingTheNumbers) {
  json raw = gpt_config();
  raw["world"]["ranks"] = 6;
  raw["tensor_parallel"]["size"] = 4;
  EXPECT_THAT(config_error(raw), HasSubstr("tensor_parallel.size: pipeline.stages 1 x "
                                           "tensor_parallel.size 4 = 4 does not divide "
                                           "world.ranks 6"));
}

TEST(TensorParallelConfig, ModelDimensionsThatDoNotDivideAreOneErrorEach) {
  json raw = gpt_config();
  raw["model"]["vocab_size"] = 257;
  EXPECT_THAT(config_error(raw), HasSubstr("model.vocab_size: 257 vocabulary rows do not divide"));
  raw = gpt_config();
  raw["world"]["ranks"] = 8;
  raw["tensor_parallel"]["size"] = 8;
  EXPECT_THAT(config_error(raw), HasSubstr("model.n_head: 4 attention heads do not divide"));
  raw = gpt_config();
  raw["model"] = {{"type", "mlp"}, {"sizes", {8, 4}}};
  raw["data"] = {{"type", "synthetic"}};
  EXPECT_THAT(config_error(raw), HasSubstr("model.type: \"mlp\" has no tensor-parallel form"));
}

// Sequence parallelism splits each sequence's tokens among the tensor-parallel ranks: accepted
// where the size divides model.seq_len, refused naming both numbers where it does not.
TEST(TensorParallelConfig, SequenceParallelNeedsASequenceLengthTheSizeDivides) {
  json raw = gpt_config();
  raw["tensor_parallel"]["sequence_parallel"] = true;
  const TrainConfig config = parse_resolved_config(raw);
  EXPECT_TRUE(config.tensor_parallel.sequence_parallel);
  EXPECT_EQ(config.json["tensor_parallel"]["sequence_parallel"], true);
  raw["model"]["seq_len"] = 15;
  EXPECT_THAT(config_error(raw),
              HasSubstr("tensor_parallel.sequence_parallel: true splits each sequence's tokens "
                        "among the tensor_parallel.size 2 ranks, which do not divide "
                        "model.seq_len 15"));
}

// world.ranks = pipeline stages x data-parallel ranks x tensor-parallel ranks.
TEST(TensorParallelConfig, PipelineStagesComposeAndCountTheDataParallelRanks) {
  json raw = gpt_config();
  raw["pipeline"] = {{"stages", 2}};
  raw["world"] = {{"backend", "local"}, {"ranks", 8}};
  const TrainConfig config = parse_resolved_config(raw);
  EXPECT_EQ(config.pipeline.stages, 2);
  EXPECT_EQ(config.tensor_parallel.size, 2);
  EXPECT_EQ(config.pipeline.data_parallel, 2);
  raw["world"]["ranks"] = 6;
  EXPECT_THAT(config_error(raw),
              HasSubstr("pipeline.stages 2 x tensor_parallel.size 2 = 4 does not divide "
                        "world.ranks 6"));
}

// Full recomputation re-runs each block's slice, collectives and all, in the same order on every
// rank of the group; offload keeps each rank's own slices' state elsewhere: accepted.
TEST(TensorParallelConfig, FullRecomputationAndOffloadAreAccepted) {
  json raw = gpt_config();
  raw["activation_checkpointing"] = {{"policy", "full"}};
  raw["zero_optimization"] = {{"stage", 3},
                              {"offload_optimizer", {{"device", "cpu"}}},
                              {"offload_param", {{"device", "cpu"}}}};
  const TrainConfig config = parse_resolved_config(raw);
  EXPECT_EQ(config.engine.activation_checkpointing.policy, RecomputePolicy::kFull);
  EXPECT_EQ(config.engine.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(config.engine.offload_param.device, OffloadDevice::kCpu);
  EXPECT_EQ(config.tensor_parallel.size, 2);
}

// Each composition tensor parallelism does not do yet: refused, one line naming the key and
// saying it is not supported with tensor parallelism yet. Hybrid sharding is refused only inside
// pipeline stages; alone, it and ZeRO++'s qwZ, qgZ and hpZ are accepted.
TEST(TensorParallelConfig, CompositionsNotSupportedYetAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"zero_optimization.hybrid_shard_size",
       {{"world", {{"ranks", 8}}},
        {"pipeline", {{"stages", 2}}},
        {"zero_optimization", {{"stage", 3}, {"hybrid_shard_size", 1}}}}},
      {"model.vocab_pieces", {{"model", {{"vocab_pieces", 2}}}}},
      {"activation_checkpointing.policy",
       {{"activation_checkpointing", {{"policy", "selective"}}}}},
  };
  for (const auto& [key, patch] : cases) {
    json raw = gpt_config();
    raw.merge_patch(patch);
    const std::string message = config_error(raw);
    EXPECT_THAT(message, HasSubstr(key)) << message;
    if (key != "model.vocab_pieces") {
      EXPECT_THAT(message, HasSubstr("not supported with tensor parallelism yet")) << message;
    }
  }
  for (const json& accepted :
       {json{{"zero_optimization", {{"stage", 3}, {"hybrid_shard_size", 1}}}},
        json{{"zero_optimization", {{"stage", 3}, {"zero_quantized_weights", true}}}},
        json{{"zero_optimization", {{"stage", 2}, {"zero_quantized_gradients", true}}}},
        json{{"world", {{"ranks", 8}}},
             {"zero_optimization", {{"stage", 3}, {"zero_hpz_partition_size", 2}}}}}) {
    json raw = gpt_config();
    raw.merge_patch(accepted);
    EXPECT_NO_THROW(parse_resolved_config(raw)) << accepted.dump();
  }
}

}  // namespace
}  // namespace zest
