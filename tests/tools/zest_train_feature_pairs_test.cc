// The config's feature switches, met two at a time: every pair of levels of pipeline schedule,
// ZeRO stage, hybrid sharding, ZeRO++, recomputation, vocabulary pieces, logits by pieces,
// offload, precision, accumulation and injected faults appears in at least one row of a pairwise
// covering set (tests/support/pairwise_cover.h), and each row goes through `--print-config`,
// `zest-estimate` and two steps of `zest-train` on a tiny GPT. Each must end with exit 0 or one
// line and exit 2 (a fault row's training may end with one line and exit 1): never a signal,
// never a time-out. And a config that `--print-config` accepts trains, so that no combination is
// refused only at run time, by a random rank.
// ctest-labels: slow
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "tests/support/pairwise_cover.h"
#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"

namespace {

using ::testing::StartsWith;
using zest::testing::LimitedResult;
using zest::testing::lines_of;
using zest::testing::ProcessLimits;

const std::string kTrain = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kEstimate = ZEST_BINARY_DIR "/bin/zest-estimate";

// 4 ranks of a 2-layer GPT of width 32 on the repository's text, 2 steps, no evaluation. The
// micro-batch is one sequence, so every accumulation and pipeline layout divides it.
const std::string kBaseConfig = R"({
  "model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16},
  "data": {"type": "text", "path": ")" ZEST_SOURCE_DIR R"(/configs/corpus/stories.txt"},
  "world": {"backend": "local", "ranks": 4, "device": "cpu", "device_memory": "256MiB",
            "timeout_s": 5},
  "seed": 7,
  "steps": 2,
  "train_micro_batch_size_per_gpu": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "zero_optimization": {"stage": 3}
})";

struct Level {
  std::string name;
  std::vector<std::string> assignments;  // --set KEY=VALUE
};

struct Factor {
  std::string name;
  std::vector<Level> levels;
};

const std::vector<Factor>& factors() {
  static const std::vector<Factor> all = {
      {"pipeline",
       {{"none", {}},
        {"1f1b", {"pipeline.stages=2"}},
        {"interleaved", {"pipeline.stages=2", "pipeline.schedule=interleaved_1f1b"}},
        {"zbh1", {"pipeline.stages=2", "pipeline.schedule=zb_h1"}},
        {"gpipe", {"pipeline.stages=2", "pipeline.schedule=gpipe"}}}},
      {"zero",
       {{"z0", {"zero_optimization.stage=0"}},
        {"z1", {"zero_optimization.stage=1"}},
        {"z2", {"zero_optimization.stage=2"}},
        {"z3", {"zero_optimization.stage=3"}}}},
      {"hybrid", {{"flat", {}}, {"hybrid2", {"zero_optimization.hybrid_shard_size=2"}}}},
      {"zeropp",
       {{"plain", {}},
        {"qwz", {"zero_optimization.zero_quantized_weights=true"}},
        {"qgz", {"zero_optimization.zero_quantized_gradients=true"}},
        {"qgz4",
         {"zero_optimization.zero_quantized_gradients=true",
          "zero_optimization.zero_quantized_gradients_bits=4"}},
        {"hpz", {"zero_optimization.zero_hpz_partition_size=2"}}}},
      {"recompute",
       {{"keep", {}},
        {"full", {"activation_checkpointing.policy=full"}},
        {"selective", {"activation_checkpointing.policy=selective"}}}},
      {"tensor",
       {{"tp1", {}},
        {"tp2", {"tensor_parallel.size=2"}},
        {"tp2sp", {"tensor_parallel.size=2", "tensor_parallel.sequence_parallel=true"}}}},
      {"vocab", {{"whole", {}}, {"pieces2", {"model.vocab_pieces=2"}}}},
      {"logits", {{"logits", {}}, {"bypieces", {"model.logits_by_pieces=true"}}}},
      {"offload", {{"device", {}}, {"cpu", {"zero_optimization.offload_optimizer.device=cpu"}}}},
      {"precision",
       {{"fp32", {}}, {"bf16", {"bf16.enabled=true"}}, {"fp16", {"fp16.enabled=true"}}}},
      {"accumulation", {{"accum1", {}}, {"accum2", {"gradient_accumulation_steps=2"}}}},
      {"fault",
       {{"nofault", {}},
        {"throw", {"debug.fault.kind=throw", "debug.fault.rank=1", "debug.fault.step=2"}},
        {"nan", {"debug.fault.kind=nan_gradient", "debug.fault.rank=2", "debug.fault.step=1"}},
        {"allocation",
         {"debug.fault.kind=fail_allocation", "debug.fault.rank=3", "debug.fault.step=2"}},
        {"stall",
         {"debug.fault.kind=stall", "debug.fault.rank=1", "debug.fault.step=2",
          "debug.fault.stall_seconds=600", "world.timeout_s=2"}}}},
  };
  return all;
}

struct Row {
  std::string name;
  std::vector<std::string> assignments;
  bool faulted = false;
};

// gtest shows a failing row by its name, not its bytes.
void PrintTo(const Row& row, std::ostream* out) { *out << row.name; }

std::vector<Row> rows() {
  std::vector<std::size_t> levels;
  for (const Factor& factor : factors()) levels.push_back(factor.levels.size());
  std::vector<Row> out;
  for (const std::vector<std::size_t>& choice : zest::testing::pairwise_cover(levels)) {
    Row row;
    for (std::size_t f = 0; f < choice.size(); ++f) {
      const Level& level = factors()[f].levels[choice[f]];
      row.name += (f == 0 ? "" : "_") + level.name;
      row.assignments.insert(row.assignments.end(), level.assignments.begin(),
                             level.assignments.end());
      if (factors()[f].name == "fault" && choice[f] != 0) row.faulted = true;
    }
    out.push_back(std::move(row));
  }
  return out;
}

class FeaturePairs : public zest::testing::ScratchDirectoryTest,
                     public ::testing::WithParamInterface<Row> {
 protected:
  LimitedResult run(const std::string& program, const std::string& config,
                    std::vector<std::string> extra, const std::string& name) const {
    std::vector<std::string> args = {"--config", config};
    for (const std::string& assignment : GetParam().assignments) {
      args.insert(args.end(), {"--set", assignment});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    // Far above a tiny run's seconds (a stall row ends at its 2 s timeout plus the grace
    // period): past it the tool hangs, which is what this test exists to catch.
    ProcessLimits limits;
    limits.timeout_s = 90.0;
    return zest::testing::run_program_limited(
        program, args, {path(name + ".out"), path(name + ".err")}, limits);
  }
};

// Exit 0, or one line "PROGRAM: error: ..." with the status `failure` allows.
void expect_clean_end(const LimitedResult& result, const std::string& program,
                      const std::vector<int>& failures) {
  EXPECT_FALSE(result.timed_out) << program << " ran past 90 s";
  EXPECT_LT(result.status, 128) << program << " ended by signal " << result.status - 128 << "\n"
                                << result.err;
  if (result.status == 0) return;
  EXPECT_THAT(failures, ::testing::Contains(result.status)) << program << ":\n" << result.err;
  const std::vector<std::string> lines = lines_of(result.err);
  ASSERT_EQ(lines.size(), 1u) << program << ":\n" << result.err;
  EXPECT_THAT(lines[0], StartsWith(program + ": error: "));
}

TEST_P(FeaturePairs, EveryToolEndsCleanlyAndAnAcceptedConfigTrains) {
  const std::string config = write("config.json", kBaseConfig);
  const LimitedResult printed = run(kTrain, config, {"--print-config"}, "print");
  expect_clean_end(printed, "zest-train", {2});

  const LimitedResult estimated = run(kEstimate, config, {}, "estimate");
  expect_clean_end(estimated, "zest-estimate", {2});

  const LimitedResult trained = run(kTrain, config, {"--metrics", path("metrics.jsonl")}, "train");
  if (printed.status != 0) {
    expect_clean_end(trained, "zest-train", {2});
    EXPECT_EQ(trained.status, 2) << "refused by --print-config, but zest-train:\n" << trained.err;
    return;
  }
  // Accepted by the config: it trains, or (with a fault injected) stops with one line.
  expect_clean_end(trained, "zest-train", GetParam().faulted ? std::vector<int>{1}
                                                             : std::vector<int>{});
  EXPECT_EQ(estimated.status, 0) << "accepted by --print-config, refused by zest-estimate:\n"
                                 << estimated.err;
}

INSTANTIATE_TEST_SUITE_P(Rows, FeaturePairs, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<Row>& info) {
                           return std::to_string(info.index) + "_" + info.param.name;
                         });

// The covering set covers: every pair of levels of two factors is in some row.
TEST(FeaturePairsCover, EveryPairOfLevelsAppearsInSomeRow) {
  std::vector<std::size_t> levels;
  for (const Factor& factor : factors()) levels.push_back(factor.levels.size());
  const auto cover = zest::testing::pairwise_cover(levels);
  for (std::size_t f = 0; f < levels.size(); ++f) {
    for (std::size_t g = f + 1; g < levels.size(); ++g) {
      for (std::size_t a = 0; a < levels[f]; ++a) {
        for (std::size_t b = 0; b < levels[g]; ++b) {
          bool found = false;
          for (const auto& row : cover) found = found || (row[f] == a && row[g] == b);
          EXPECT_TRUE(found) << factors()[f].name << "=" << factors()[f].levels[a].name << " with "
                             << factors()[g].name << "=" << factors()[g].levels[b].name;
        }
      }
    }
  }
  EXPECT_LE(cover.size(), 45u) << "the greedy cover grew: every row costs three runs";
}

}  // namespace
