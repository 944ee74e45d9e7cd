// Runs the built zest-train binary as a user would: bad input exits 2 with exactly one line on
// stderr and no output file left behind; a short good run writes its metrics.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

extern char** environ;

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::string kBinary = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kDefaultConfig = ZEST_SOURCE_DIR "/configs/default.json";

struct Result {
  int status = -1;  // exit status, or -1 when it did not exit normally
  std::string out;
  std::string err;
};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

class ZestTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("zest_train_test_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name)) << text;
    return path(name);
  }

  // Runs zest-train with `args`, stdout and stderr captured in files (no pipes to drain).
  Result run(const std::vector<std::string>& args) const {
    std::vector<std::string> argv_strings = {kBinary};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const std::string out_path = path("stdout.txt");
    const std::string err_path = path("stderr.txt");

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = 0;
    const int spawned = posix_spawn(&pid, kBinary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    Result result;
    if (spawned != 0) {
      ADD_FAILURE() << "cannot run " << kBinary << ": " << std::strerror(spawned);
      return result;
    }
    int wait_status = 0;
    waitpid(pid, &wait_status, 0);
    if (WIFEXITED(wait_status)) result.status = WEXITSTATUS(wait_status);
    result.out = read_file(out_path);
    result.err = read_file(err_path);
    return result;
  }

  // A bad input: exit status 2, exactly one line on stderr naming the problem, and neither the
  // metrics file nor its .tmp left behind.
  void expect_input_error(std::vector<std::string> args, const std::string& expected) const {
    const std::string metrics = path("metrics.jsonl");
    args.insert(args.end(), {"--metrics", metrics});
    const Result result = run(args);
    EXPECT_EQ(result.status, 2) << result.err;
    const std::vector<std::string> lines = lines_of(result.err);
    ASSERT_EQ(lines.size(), 1u) << result.err;
    EXPECT_THAT(lines[0], StartsWith("zest-train: error: "));
    EXPECT_THAT(lines[0], HasSubstr(expected));
    EXPECT_FALSE(std::filesystem::exists(metrics));
    EXPECT_FALSE(std::filesystem::exists(metrics + ".tmp"));
  }

  std::filesystem::path dir_;
};

TEST_F(ZestTrain, StageOutsideZeroToThree) {
  expect_input_error({"--config", kDefaultConfig, "--set", "zero_optimization.stage=4"},
                     "zero_optimization.stage: must be 0, 1, 2 or 3, got 4");
}

TEST_F(ZestTrain, RanksBelowOne) {
  expect_input_error({"--config", kDefaultConfig, "--set", "world.ranks=0"}, "world.ranks");
}

TEST_F(ZestTrain, ZeroWidthInModelSizes) {
  expect_input_error({"--config", kDefaultConfig, "--set", "model.sizes=[64,0,10]"},
                     "model.sizes[1]: must be an integer >= 1, got 0");
}

TEST_F(ZestTrain, UnknownOptimizerType) {
  expect_input_error({"--config", kDefaultConfig, "--set", "optimizer.type=Lion"},
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
  expect_input_error({"--config", kDefaultConfig, "--set", "steps=\"5\""},
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
  expect_input_error({"--config", kDefaultConfig, "--set", "gradient_accumulation_steps=2"},
                     "batch sizes are inconsistent: train_batch_size 64, "
                     "train_micro_batch_size_per_gpu 16, gradient_accumulation_steps 2");
}

TEST_F(ZestTrain, MalformedSet) {
  expect_input_error({"--config", kDefaultConfig, "--set", "steps"}, "--set 'steps'");
  expect_input_error({"--config", kDefaultConfig, "--set", "steps.count=3"},
                     "'steps' is 200, not an object");
}

TEST_F(ZestTrain, CommandLineMisuse) {
  expect_input_error({}, "--config is required");
  expect_input_error({"--config", kDefaultConfig, "--no-such-flag"}, "--no-such-flag");
}

TEST_F(ZestTrain, HelpExitsZero) {
  const Result result = run({"--help"});
  EXPECT_EQ(result.status, 0);
  EXPECT_THAT(result.out, HasSubstr("--config"));
  EXPECT_THAT(result.out, HasSubstr("--set"));
  EXPECT_EQ(result.err, "");
}

TEST_F(ZestTrain, FailureAtRunTimeExitsOne) {
  // 64 KiB per rank cannot hold even a shard of the default model's state.
  const std::string metrics = path("metrics.jsonl");
  const Result result = run({"--config", kDefaultConfig, "--set", "world.device_memory=64KiB",
                             "--metrics", metrics});
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
  const Result result =
      run({"--config", kDefaultConfig, "--set", "steps=5", "--set", "log_interval=1",
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
    for (const char* key : {"loss", "lr", "grad_norm", "step_ms"}) {
      EXPECT_TRUE(line[key].is_number()) << key << " in " << line.dump();
    }
    EXPECT_NEAR(line["lr"].get<double>(), 3e-3, 1e-9);
  }
  const json summary = json::parse(lines[5]);
  EXPECT_EQ(summary["summary"]["steps"], 5);
  for (const char* key : {"final_loss", "first_loss", "tokens_or_samples_per_s"}) {
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
}

TEST_F(ZestTrain, PrintConfigShowsTheResolvedConfig) {
  const Result result = run({"--config", kDefaultConfig, "--set", "steps=3", "--print-config"});
  ASSERT_EQ(result.status, 0) << result.err;
  const json resolved = json::parse(result.out);
  EXPECT_EQ(resolved["steps"], 3);
  EXPECT_EQ(resolved["zero_optimization"]["stage"], 3);
}

}  // namespace
