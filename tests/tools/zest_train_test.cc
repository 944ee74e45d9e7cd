// Runs the built zest-train binary as a user would: bad input exits 2 with exactly one line on
// stderr and no output file left behind; a short good run writes its metrics.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_data.h"
#include "checkpoint/safetensors.h"
#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"
#include "tests/tools/zest_train_support.h"

#if ZEST_HAVE_CUDA
#include "runtime/cuda_device.h"
#endif

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using zest::testing::lines_of;
using zest::testing::ProcessResult;
using zest::testing::read_file;

const std::string& kBinary = zest::testing::kZestTrain;
// The MLP job (fast) for most checks; the default job, a GPT on the repository's text, for the
// end-to-end runs.
const std::string kMlpConfig = ZEST_SOURCE_DIR "/configs/mlp.json";
const std::string kGptConfig = ZEST_SOURCE_DIR "/configs/default.json";
// A GPT small enough for a test: a few seconds for a dozen steps on 2 cores.
const std::vector<std::string> kTinyGpt = {"--set",
                                           "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt",
                                           "--set", "model.n_layer=2", "--set", "model.n_head=2",
                                           "--set", "model.n_embd=32", "--set", "model.seq_len=32",
                                           "--set", "train_batch_size=8", "--set",
                                           "train_micro_batch_size_per_gpu=2", "--set",
                                           "scheduler={}"};

// The steps' losses as JSON writes them: equal only when equal to the bit.
std::vector<std::string> loss_texts(const std::vector<json>& records) {
  std::vector<std::string> values;
  for (const json& record : records) values.push_back(record["loss"].dump());
  return values;
}

class ZestTrain : public zest::testing::ScratchDirectoryTest {
 protected:
  // Runs zest-train with `args`, stdout and stderr captured in files.
  ProcessResult run(const std::vector<std::string>& args) const {
    return zest::testing::run_program(kBinary, args, {path("stdout.txt"), path("stderr.txt")});
  }

  // A bad input: exit status 2, exactly one line on stderr naming the problem, and neither the
  // metrics file nor its .tmp left behind.
  void expect_input_error(std::vector<std::string> args, const std::string& expected) const {
    const std::string metrics = path("metrics.jsonl");
    args.insert(args.end(), {"--metrics", metrics});
    const ProcessResult result = run(args);
    EXPECT_EQ(result.status, 2) << result.err;
    const std::vector<std::string> lines = lines_of(result.err);
    ASSERT_EQ(lines.size(), 1u) << result.err;
    EXPECT_THAT(lines[0], StartsWith("zest-train: error: "));
    EXPECT_THAT(lines[0], HasSubstr(expected));
    EXPECT_FALSE(std::filesystem::exists(metrics));
    EXPECT_FALSE(std::filesystem::exists(metrics + ".tmp"));
  }

  // Trains the tiny GPT for `steps` steps (plus `extra` arguments) and returns its step records.
  std::vector<json> tiny_gpt_steps(int steps, const std::vector<std::string>& extra) const {
    const std::string metrics = path("metrics.jsonl");
    std::vector<std::string> args = {"--config", kGptConfig, "--set",
                                     "steps=" + std::to_string(steps), "--metrics", metrics};
    args.insert(args.end(), kTinyGpt.begin(), kTinyGpt.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return zest::testing::train_steps(args, metrics, {path("stdout.txt"), path("stderr.txt")});
  }
};

// activation_checkpointing reaches the engine through the config: each policy, and the
// checkpoints offloaded, train with the same losses to the bit; --print-config names the units.
TEST_F(ZestTrain, ActivationCheckpointingTrainsWithTheSameLosses) {
  const std::vector<std::string> plain = loss_texts(tiny_gpt_steps(3, {}));
  ASSERT_EQ(plain.size(), 3u);
  for (const char* policy : {"full", "selective"}) {
    SCOPED_TRACE(policy);
    const std::string set = std::string("activation_checkpointing.policy=\"") + policy + "\"";
    EXPECT_EQ(loss_texts(tiny_gpt_steps(3, {"--set", set})), plain);
    EXPECT_EQ(loss_texts(tiny_gpt_steps(3, {"--set", set, "--set",
                                        "activation_checkpointing.cpu_checkpointing=true"})),
              plain);
  }
  std::vector<std::string> args = {"--config", kGptConfig, "--print-config", "--set",
                                   "activation_checkpointing.policy=\"full\"", "--set",
                                   "activation_checkpointing.units.first=2"};
  args.insert(args.end(), kTinyGpt.begin(), kTinyGpt.end());
  const ProcessResult printed = run(args);
  ASSERT_EQ(printed.status, 0) << printed.err;
  EXPECT_EQ(json::parse(printed.out)["activation_checkpointing"]["recomputed"],
            json::parse(R"(["block0"])"));
}

TEST_F(ZestTrain, StageOutsideZeroToThree) {
  expect_input_error({"--config", kMlpConfig, "--set", "zero_optimization.stage=4"},
                     "zero_optimization.stage: must be 0, 1, 2 or 3, got 4");
}

TEST_F(ZestTrain, RanksBelowOne) {
  expect_input_error({"--config", kMlpConfig, "--set", "world.ranks=0"}, "world.ranks");
}

TEST_F(ZestTrain, ZeroWidthInModelSizes) {
  expect_input_error({"--config", kMlpConfig, "--set", "model.sizes=[64,0,10]"},
                     "model.sizes[1]: must be an integer >= 1, got 0");
}

TEST_F(ZestTrain, UnknownOptimizerType) {
  expect_input_error({"--config", kMlpConfig, "--set", "optimizer.type=Lion"},
                     "optimizer.type: must be AdamW, Adam or SGD, got \"Lion\"");
}

TEST_F(ZestTrain, UnknownKeySuggestsTheClosest) {
  const std::string config = write(
      "typo.json",
      R"({"model": {"type": "mlp", "sizes": [4, 2]}, "steps": 1, "train_batch_size": 4,
          "zero_optimization": {"stgae": 1}})");
  expect_input_error(
      {"--config", config},
      "zero_optimization.stgae: unknown key; did you mean 'zero_optimization.stage'?");
}

TEST_F(ZestTrain, WrongType) {
  expect_input_error({"--config", kMlpConfig, "--set", "steps=\"5\""},
                     "steps: must be an integer, got string \"5\"");
}

TEST_F(ZestTrain, ConfigThatIsNotJson) {
  const std::string config = write("bad.json", "{\n  \"steps\": 5,\n  \"model\": {oops}\n}\n");
  expect_input_error({"--config", config}, config + ":3:13: not valid JSON");
}

TEST_F(ZestTrain, ConfigThatDoesNotExist) {
  const std::string config = path("missing.json");
  expect_input_error({"--config", config}, "config file '" + config + "'");
}

TEST_F(ZestTrain, InconsistentBatchSizes) {
  expect_input_error({"--config", kMlpConfig, "--set", "gradient_accumulation_steps=2"},
                     "batch sizes are inconsistent: train_batch_size 64, "
                     "train_micro_batch_size_per_gpu 16, gradient_accumulation_steps 2");
}

TEST_F(ZestTrain, MalformedSet) {
  expect_input_error({"--config", kMlpConfig, "--set", "steps"}, "--set 'steps'");
  expect_input_error({"--config", kMlpConfig, "--set", "steps.count=3"},
                     "'steps' is 200, not an object");
}

TEST_F(ZestTrain, CommandLineMisuse) {
  expect_input_error({}, "--config is required");
  expect_input_error({"--config", kMlpConfig, "--no-such-flag"}, "--no-such-flag");
}

TEST_F(ZestTrain, HelpExitsZero) {
  const ProcessResult result = run({"--help"});
  EXPECT_EQ(result.status, 0);
  EXPECT_THAT(result.out, HasSubstr("--config"));
  EXPECT_THAT(result.out, HasSubstr("--set"));
  EXPECT_EQ(result.err, "");
}

// The shipped GPU job where no GPU is (every CI machine): one line saying what world.device
// "cuda" needs (a GPU, or a build with CUDA), exit 2, nothing written.
TEST_F(ZestTrain, TheGpuJobWithoutAGpuSaysWhatItNeeds) {
#if ZEST_HAVE_CUDA
  if (zest::cuda::visible_devices().count > 0) {
    GTEST_SKIP() << "a GPU is visible: this checks the refusal without one";
  }
#endif
  expect_input_error({"--config", ZEST_SOURCE_DIR "/configs/gpt2_cuda.json"},
                     "world.device: \"cuda\" needs ");
}

TEST_F(ZestTrain, FailureAtRunTimeExitsOne) {
  // 64 KiB per rank cannot hold even a shard of the default model's state.
  const std::string metrics = path("metrics.jsonl");
  const ProcessResult result = run(
      {"--config", kMlpConfig, "--set", "world.device_memory=64KiB", "--metrics", metrics});
  EXPECT_EQ(result.status, 1) << result.err;
  const std::vector<std::string> lines = lines_of(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_THAT(lines[0], StartsWith("zest-train: error: "));
  EXPECT_THAT(lines[0], HasSubstr("out of memory"));
  EXPECT_FALSE(std::filesystem::exists(metrics));
  EXPECT_FALSE(std::filesystem::exists(metrics + ".tmp"));
}

TEST_F(ZestTrain, ShortRunWritesMetrics) {
  const std::string metrics = path("metrics.jsonl");
  const ProcessResult result =
      run({"--config", kMlpConfig, "--set", "steps=5", "--set", "steps_per_print=1",
           "--metrics", metrics});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_THAT(result.out, HasSubstr("zest-train: 4 ranks (local threads), cpu"));
  EXPECT_THAT(result.out, HasSubstr("stage 3"));
  EXPECT_THAT(result.out, HasSubstr("step 5/5  loss "));
  EXPECT_THAT(result.out, HasSubstr("peak bytes per rank"));
  EXPECT_FALSE(std::filesystem::exists(metrics + ".tmp"));

  const std::vector<std::string> lines = lines_of(read_file(metrics));
  ASSERT_EQ(lines.size(), 6u);
  for (int step = 1; step <= 5; ++step) {
    const json line = json::parse(lines[static_cast<std::size_t>(step - 1)]);
    EXPECT_EQ(line["step"], step);
    for (const char* key : {"loss", "lr", "grad_norm", "step_ms", "tokens_per_s"}) {
      EXPECT_TRUE(line[key].is_number()) << key << " in " << line.dump();
    }
    EXPECT_NEAR(line["lr"].get<double>(), 3e-3, 1e-9);
  }
  const json summary = json::parse(lines[5]);
  EXPECT_EQ(summary["summary"]["steps"], 5);
  for (const char* key : {"final_loss", "first_loss", "tokens_per_s", "step_ms"}) {
    EXPECT_TRUE(summary["summary"][key].is_number()) << key;
  }
  EXPECT_EQ(summary["summary"]["first_loss"], json::parse(lines[0])["loss"]);
  EXPECT_EQ(summary["summary"]["final_loss"], json::parse(lines[4])["loss"]);

  ASSERT_EQ(summary["peak_bytes"].size(), 4u);
  ASSERT_EQ(summary["predicted_model_state_bytes"].size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const json& peak = summary["peak_bytes"][static_cast<std::size_t>(rank)];
    EXPECT_EQ(peak["rank"], rank);
    for (const char* key : {"params", "grads", "optimizer", "gather", "buckets", "activations",
                            "workspace", "total"}) {
      EXPECT_TRUE(peak[key].is_number_unsigned()) << key << " in " << peak.dump();
    }
    EXPECT_GT(peak["total"].get<std::size_t>(), 0u);
    const json& predicted = summary["predicted_model_state_bytes"][static_cast<std::size_t>(rank)];
    EXPECT_EQ(predicted["rank"], rank);
    for (const char* key : {"params", "grads", "optimizer", "total"}) {
      EXPECT_TRUE(predicted[key].is_number_unsigned()) << key << " in " << predicted.dump();
    }
    EXPECT_EQ(predicted["total"].get<std::size_t>(),
              predicted["params"].get<std::size_t>() + predicted["grads"].get<std::size_t>() +
                  predicted["optimizer"].get<std::size_t>());
  }
  // The planner's row: the model state exactly, and never below a measured peak (a host that
  // falls behind its streams measures less, never more).
  EXPECT_THAT(result.out, HasSubstr("plan "));
  const json& planned = summary["planned_peak_bytes"];
  ASSERT_TRUE(planned.is_object()) << summary.dump();
  for (int rank = 0; rank < 4; ++rank) {
    const json& peak = summary["peak_bytes"][static_cast<std::size_t>(rank)];
    for (const char* key : {"params", "grads", "optimizer"}) {
      EXPECT_EQ(planned[key], peak[key]) << key;
    }
    for (const char* key : {"gather", "buckets", "activations", "workspace", "total"}) {
      EXPECT_GE(planned[key].get<std::size_t>(), peak[key].get<std::size_t>()) << key;
    }
  }
}

TEST_F(ZestTrain, PrintConfigShowsTheResolvedConfig) {
  const ProcessResult result = run({"--config", kMlpConfig, "--set", "steps=3", "--print-config"});
  ASSERT_EQ(result.status, 0) << result.err;
  const json resolved = json::parse(result.out);
  EXPECT_EQ(resolved["steps"], 3);
  EXPECT_EQ(resolved["zero_optimization"]["stage"], 3);
}

TEST_F(ZestTrain, GptOnTextTrainsAndEvaluates) {
  const std::string metrics = path("metrics.jsonl");
  std::vector<std::string> args = {"--config", kGptConfig, "--set", "steps=12", "--set",
                                   "eval_every=6", "--metrics", metrics};
  args.insert(args.end(), kTinyGpt.begin(), kTinyGpt.end());
  const ProcessResult result = run(args);
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_THAT(result.out, HasSubstr("gpt 2L 2H 32C vocab 256 seq 32"));
  EXPECT_THAT(result.out, HasSubstr("step  6/12  val_loss "));
  EXPECT_THAT(result.out, HasSubstr("tok/s"));

  // 12 step records, 2 evaluations, the summary.
  std::vector<json> steps, evaluations;
  json summary;
  for (const std::string& line : lines_of(read_file(metrics))) {
    const json record = json::parse(line);
    if (record.contains("summary")) summary = record;
    else if (record.contains("val_loss")) evaluations.push_back(record);
    else steps.push_back(record);
  }
  ASSERT_EQ(steps.size(), 12u);
  ASSERT_EQ(evaluations.size(), 2u);
  EXPECT_EQ(evaluations[0]["step"], 6);
  EXPECT_EQ(evaluations[1]["step"], 12);
  // Byte-level text starts near ln(256) = 5.55 and falls fast: the stories repeat their words.
  EXPECT_NEAR(steps.front()["loss"].get<double>(), 5.55, 0.3);
  EXPECT_LT(steps.back()["loss"].get<double>(), steps.front()["loss"].get<double>() - 1.0);
  EXPECT_LT(evaluations[1]["val_loss"].get<double>(), evaluations[0]["val_loss"].get<double>());
  for (const json& step : steps) {
    EXPECT_GT(step["tokens_per_s"].get<double>(), 0.0) << step.dump();
    EXPECT_TRUE(step["grad_norm"].is_number()) << step.dump();
  }
  EXPECT_EQ(summary["summary"]["val_loss"], evaluations[1]["val_loss"]);
  // 8 sequences x 32 tokens a step.
  const double step_ms = summary["summary"]["step_ms"].get<double>();
  EXPECT_NEAR(summary["summary"]["tokens_per_s"].get<double>(), 256.0 * 1000.0 / step_ms,
              0.01 * 256.0 * 1000.0 / step_ms + 0.1);
}

TEST_F(ZestTrain, InitFromStartsFromTheFilesParameters) {
  auto export_initial = [&](const std::string& file, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--config", kGptConfig, "--export-initial", file};
    args.insert(args.end(), kTinyGpt.begin(), kTinyGpt.end());
    args.insert(args.end(), extra.begin(), extra.end());
    const ProcessResult result = run(args);
    EXPECT_EQ(result.status, 0) << result.err;
  };
  auto losses = [&](const std::vector<std::string>& extra) {
    std::vector<double> values;
    for (const json& record : tiny_gpt_steps(3, extra)) values.push_back(record["loss"].get<double>());
    return values;
  };
  // The run's own initial parameters, read back in: the same run, bit for bit.
  const std::string own = path("own.safetensors");
  export_initial(own, {});
  const std::vector<double> seeded = losses({});
  ASSERT_EQ(seeded.size(), 3u);
  EXPECT_EQ(losses({"--set", "model.init_from=" + own}), seeded);

  // Another model's parameters (seed 99) with this run's data: another first loss, and the
  // parameters it starts from are the file's exactly.
  const std::string other = path("other.safetensors");
  export_initial(other, {"--set", "seed=99"});
  EXPECT_NE(losses({"--set", "model.init_from=" + other}).front(), seeded.front());
  const std::string reexported = path("reexported.safetensors");
  export_initial(reexported, {"--set", "model.init_from=" + other});
  const zest::SafetensorsReader expected(other);
  const zest::SafetensorsReader actual(reexported);
  ASSERT_EQ(actual.tensors().size(), expected.tensors().size());
  for (const zest::SafetensorsTensor& tensor : expected.tensors()) {
    EXPECT_EQ(actual.read_float32(tensor.name), expected.read_float32(tensor.name)) << tensor.name;
  }
}

TEST_F(ZestTrain, TokenShardConfigTrainsOnShards) {
  // Two training shards (a glob) and a validation shard of a repeating pattern over 512 tokens.
  std::vector<std::uint16_t> tokens(6000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i * 7 % 512);
  zest::write_token_shard(path("train_000.bin"), tokens);
  zest::write_token_shard(path("train_001.bin"), tokens);
  zest::write_token_shard(path("val.bin"), std::vector<std::uint16_t>(tokens.begin(), tokens.begin() + 2000));
  const std::string metrics = path("metrics.jsonl");
  const ProcessResult result = run(
      {"--config", ZEST_SOURCE_DIR "/configs/gpt_tokens.json", "--set", "data.path=" + path("train_*.bin"),
       "--set", "data.val_path=" + path("val.bin"), "--set", "model.vocab_size=512", "--set",
       "model.n_layer=1", "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set",
       "model.seq_len=16", "--set", "steps=4", "--set", "eval_every=2", "--set", "scheduler={}",
       "--set", "checkpoint={}", "--metrics", metrics});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("data " + path("train_*.bin")));
  EXPECT_THAT(result.out, HasSubstr("step 4/4  val_loss "));
  EXPECT_THAT(result.out, HasSubstr("bf16"));
}

// Determinism: the same config and seed give bit-identical losses and gradient norms, run after
// run, and whether communication overlaps compute or not (the reductions' order is fixed).
TEST_F(ZestTrain, SameConfigAndSeedAreBitIdentical) {
  auto trajectory = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> values;
    for (const json& record : tiny_gpt_steps(4, extra)) {
      values.push_back(record["loss"].dump() + " " + record["grad_norm"].dump());
    }
    return values;
  };
  for (const char* stage : {"zero_optimization.stage=0", "zero_optimization.stage=3"}) {
    const std::vector<std::string> first = trajectory({"--set", stage});
    ASSERT_EQ(first.size(), 4u);
    EXPECT_EQ(trajectory({"--set", stage}), first) << stage;
    EXPECT_EQ(trajectory({"--set", stage, "--set", "zero_optimization.overlap_comm=false"}), first)
        << stage;
  }
}

TEST_F(ZestTrain, ANanGradientStopsTheRunNamingWhere) {
  const std::string metrics = path("metrics.jsonl");
  std::vector<std::string> args = {
      "--config", kGptConfig, "--set", "steps=4", "--metrics", metrics, "--set",
      "debug={\"check_collectives\": true, \"fault\": {\"kind\": \"nan_gradient\", "
      "\"rank\": 1, \"step\": 2, \"unit\": \"block0\"}}"};
  args.insert(args.end(), kTinyGpt.begin(), kTinyGpt.end());
  const ProcessResult result = run(args);
  EXPECT_EQ(result.status, 1) << result.err;
  const std::vector<std::string> lines = lines_of(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_THAT(lines[0], HasSubstr("non-finite gradient at step 2 on rank 1, unit block0"));
  EXPECT_FALSE(std::filesystem::exists(metrics));
}

TEST_F(ZestTrain, BadDataIsAnInputError) {
  const std::string empty = write("empty.txt", "");
  expect_input_error({"--config", kGptConfig, "--set", "data.path=" + empty}, empty);
  const std::string short_text = write("short.txt", "too short");
  expect_input_error({"--config", kGptConfig, "--set", "data.path=" + short_text},
                     "not enough tokens");
  expect_input_error({"--config", kGptConfig, "--set", "data.type=tokens", "--set",
                      "data.path=" + path("absent_*.bin")},
                     "absent_*.bin");
}

// zero_optimization.offload_optimizer (DeepSpeed's key): the run trains with the same losses as
// without it, the device holds no optimizer state, and the summary reports the host arena's
// `offload` peak beside its prediction. Stage 0, and nvme without an nvme_path, are refused as input errors.
TEST_F(ZestTrain, OffloadOptimizerTrainsAndReportsTheHostArena) {
  const std::string offload =
      "zero_optimization.offload_optimizer={\"device\": \"cpu\", \"pin_memory\": true}";
  const std::vector<std::string> plain = loss_texts(tiny_gpt_steps(3, {}));
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(loss_texts(tiny_gpt_steps(3, {"--set", offload, "--set", "world.host_memory=64MiB"})),
            plain);

  std::vector<std::string> args = {"--config", kGptConfig, "--set", "steps=2", "--set", offload,
                                   "--metrics", path("offload.jsonl")};
  args.insert(args.end(), kTinyGpt.begin(), kTinyGpt.end());
  const ProcessResult result = run(args);
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("optimizer offloaded to cpu"));
  const std::vector<std::string> lines = lines_of(read_file(path("offload.jsonl")));
  ASSERT_FALSE(lines.empty());
  const json summary = json::parse(lines.back());
  ASSERT_EQ(summary["peak_bytes"].size(), 4u);
  for (std::size_t rank = 0; rank < 4; ++rank) {
    const json& peak = summary["peak_bytes"][rank];
    const json& predicted = summary["predicted_model_state_bytes"][rank];
    ASSERT_TRUE(peak.contains("offload")) << peak.dump();
    EXPECT_GT(peak["offload"].get<std::size_t>(), 0u);
    EXPECT_EQ(peak["offload"], predicted["offload"]);
    EXPECT_EQ(peak["optimizer"], 0);
    EXPECT_EQ(predicted["optimizer"], 0);
  }

  std::filesystem::remove(path("metrics.jsonl"));  // tiny_gpt_steps' file
  expect_input_error({"--config", kGptConfig, "--set", offload, "--set",
                      "zero_optimization.stage=0"},
                     "zero_optimization.offload_optimizer.device: \"cpu\" needs "
                     "zero_optimization.stage 1, 2 or 3 (got 0)");
  expect_input_error({"--config", kGptConfig, "--set",
                      "zero_optimization.offload_optimizer.device=nvme"},
                     "zero_optimization.offload_optimizer.nvme_path: missing");
}

}  // namespace
