// Shared by zest-train's suites that judge a run by its metrics file: the built binary, the step
// records a run writes (one JSON object a line; a step's record is the one with a loss) and their
// losses and gradient norms, a run of configs/default.json with --set assignments, a fixture for
// suites that vary one small such job, the mean loss over a window of steps, and a fixture that
// trains the default GPT on the text corpus over 2 nodes x 2 ranks.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"

namespace zest::testing {

inline const std::string kZestTrain = ZEST_BINARY_DIR "/bin/zest-train";

// The records of the metrics file `metrics` that carry a loss: one per step, in order.
inline std::vector<nlohmann::json> step_records(const std::string& metrics) {
  std::vector<nlohmann::json> records;
  for (const std::string& line : lines_of(read_file(metrics))) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) records.push_back(std::move(record));
  }
  return records;
}

// Runs zest-train with `args`, whose --metrics is `metrics`; a run that does not exit 0 fails
// the test (its stderr shown). Returns the step records.
inline std::vector<nlohmann::json> train_steps(const std::vector<std::string>& args,
                                               const std::string& metrics,
                                               const OutputFiles& output) {
  const ProcessResult result = run_program(kZestTrain, args, output);
  EXPECT_EQ(result.status, 0) << result.err;
  return step_records(metrics);
}

// A step's loss and gradient norm, as its record gives them.
struct StepLoss {
  double loss = 0;
  double grad_norm = 0;
};

// The loss and gradient norm of each step the metrics file `metrics` records, in order.
inline std::vector<StepLoss> step_losses(const std::string& metrics) {
  std::vector<StepLoss> steps;
  for (const nlohmann::json& record : step_records(metrics)) {
    steps.push_back({record["loss"].get<double>(), record["grad_norm"].get<double>()});
  }
  return steps;
}

// Runs zest-train on configs/default.json with each of `assignments` after a --set, then `flags`.
inline ProcessResult train_default_config(const std::vector<std::string>& assignments,
                                          const std::vector<std::string>& flags,
                                          const OutputFiles& output) {
  std::vector<std::string> args = {"--config", ZEST_SOURCE_DIR "/configs/default.json"};
  for (const std::string& assignment : assignments) args.insert(args.end(), {"--set", assignment});
  args.insert(args.end(), flags.begin(), flags.end());
  return run_program(kZestTrain, args, output);
}

// A suite's small job on configs/default.json (its own --set assignments, `overrides`), which each
// test varies with more.
class ZestTrainJobTest : public ScratchDirectoryTest {
 protected:
  explicit ZestTrainJobTest(std::vector<std::string> overrides)
      : overrides_(std::move(overrides)) {}

  // The job with `extra` after the suite's assignments, then `flags`; its output in the test's
  // stdout.txt and stderr.txt.
  ProcessResult train(const std::vector<std::string>& extra,
                      const std::vector<std::string>& flags = {}) const {
    std::vector<std::string> assignments = overrides_;
    assignments.insert(assignments.end(), extra.begin(), extra.end());
    return train_default_config(assignments, flags, {path("stdout.txt"), path("stderr.txt")});
  }

  // The steps a run logs, from metrics.jsonl started afresh (a resumed run appends to it); `out`
  // receives its stdout.
  std::vector<StepLoss> steps_of(const std::vector<std::string>& extra,
                                 std::vector<std::string> flags = {},
                                 std::string* out = nullptr) const {
    const std::string metrics = path("metrics.jsonl");
    std::filesystem::remove(metrics);
    flags.insert(flags.end(), {"--metrics", metrics});
    const ProcessResult result = train(extra, flags);
    EXPECT_EQ(result.status, 0) << result.err;
    if (out != nullptr) *out = result.out;
    return step_losses(metrics);
  }

  // The held-out losses the last steps_of run logged, in order.
  std::vector<double> held_out_losses() const {
    std::vector<double> losses;
    for (const std::string& line : lines_of(read_file(path("metrics.jsonl")))) {
      const nlohmann::json record = nlohmann::json::parse(line);
      if (record.contains("val_loss")) losses.push_back(record["val_loss"].get<double>());
    }
    return losses;
  }

 private:
  std::vector<std::string> overrides_;
};

// The mean loss of steps `first` to `last` (counted from 1, both included).
inline double mean_loss(const std::vector<nlohmann::json>& records, int first, int last) {
  double sum = 0.0;
  for (int step = first; step <= last; ++step) sum += records[step - 1]["loss"].get<double>();
  return sum / (last - first + 1);
}

// A suite that trains configs/default.json on the text corpus, its 4 ranks on 2 nodes, without
// evaluation: each run's files are named for it in the test's scratch directory.
class DefaultGptOnTwoNodesTest : public ScratchDirectoryTest {
 protected:
  // The step records of `steps` steps with `extra` arguments after the suite's own.
  std::vector<nlohmann::json> default_gpt_steps(const std::string& name, int steps,
                                                const std::vector<std::string>& extra) const {
    const std::string metrics = path(name + ".jsonl");
    std::vector<std::string> args = {
        "--config", ZEST_SOURCE_DIR "/configs/default.json", "--set",
        "steps=" + std::to_string(steps), "--set", "world.ranks_per_node=2", "--set",
        "eval_every=0", "--set", "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt",
        "--metrics", metrics};
    args.insert(args.end(), extra.begin(), extra.end());
    return train_steps(args, metrics, {path(name + ".out"), path(name + ".err")});
  }
};

}  // namespace zest::testing
