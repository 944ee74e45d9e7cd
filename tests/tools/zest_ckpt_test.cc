// Runs the built zest-ckpt binary as a user would, on a checkpoint this test saves: inspect
// summarizes, verify names a corrupt file and exits 1, export writes a safetensors file the
// strict reader accepts, reshard writes a checkpoint that loads at the new world size; bad
// input exits 2 with one line on stderr.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "optim/checkpoint_manifest.h"
#include "optim/safetensors.h"
#include "tests/optim/checkpoint_test_support.h"

extern char** environ;

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDirectory;
using ::testing::StartsWith;
using testing::train_mlp;
using testing::TrainSpec;

const std::string kBinary = ZEST_BINARY_DIR "/bin/zest-ckpt";

struct Result {
  int status = -1;
  std::string out;
  std::string err;
};

class ZestCkpt : public ::testing::Test {
 protected:
  void SetUp() override {
    TrainSpec spec;
    spec.world = 4;
    spec.stage = 2;
    spec.steps = 2;
    spec.save_dir = root();
    spec.save_at = 2;
    run_ = train_mlp(spec);
  }
  std::string root() const { return scratch_.path("ckpt"); }

  Result run(std::vector<std::string> args) const {
    args.insert(args.begin(), kBinary);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const std::string out = scratch_.path("stdout.txt");
    const std::string err = scratch_.path("stderr.txt");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = 0;
    const int spawned = posix_spawn(&pid, kBinary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    Result result;
    if (spawned != 0) {
      ADD_FAILURE() << "cannot run " << kBinary << ": " << std::strerror(spawned);
      return result;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status)) result.status = WEXITSTATUS(status);
    result.out = testing::read_whole_file(out);
    result.err = testing::read_whole_file(err);
    return result;
  }

  void expect_error(const std::vector<std::string>& args, int status,
                    const std::string& text) const {
    const Result result = run(args);
    EXPECT_EQ(result.status, status) << result.err;
    EXPECT_THAT(result.err, StartsWith("zest-ckpt: error: "));
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    EXPECT_THAT(result.err, HasSubstr(text));
  }

  ScratchDirectory scratch_;
  testing::TrainResult run_;
};

TEST_F(ZestCkpt, InspectSummarizesTheCheckpoint) {
  const Result result = run({"inspect", root()});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("step-2"));
  EXPECT_THAT(result.out,
              HasSubstr("step 2 (optimizer steps 2), world size 4, stage 2, compute fp32"));
  EXPECT_THAT(result.out, HasSubstr("optimizer.1 (fp32)"));
  EXPECT_THAT(result.out, HasSubstr("layer1"));
  EXPECT_THAT(result.out, HasSubstr("rank-3.bin"));
}

TEST_F(ZestCkpt, VerifyPassesThenNamesTheCorruptFile) {
  const Result good = run({"verify", root()});
  EXPECT_EQ(good.status, 0) << good.err;
  EXPECT_THAT(good.out, HasSubstr("4 files verified"));
  testing::flip_byte(root() + "/step-2/rank-2.bin", 33);
  expect_error({"verify", root()}, 1, "rank-2.bin: checksum mismatch");
}

TEST_F(ZestCkpt, ExportWritesTheFullParameters) {
  const std::string out = scratch_.path("model.safetensors");
  const Result result = run({"export", root(), "--out", out, "--dtype", "bf16"});
  ASSERT_EQ(result.status, 0) << result.err;
  const SafetensorsReader reader(out);
  ASSERT_EQ(reader.tensors().size(), 6u);
  EXPECT_EQ(reader.tensors()[0].dtype, "BF16");
  for (const auto& [name, values] : run_.params) {
    const std::vector<float> exported = reader.read_float32(name);
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(exported[i], static_cast<float>(BFloat16(values[i]))) << name << "[" << i << "]";
    }
  }
}

TEST_F(ZestCkpt, ReshardWritesACheckpointForTheNewWorld) {
  const std::string out = scratch_.path("two");
  const Result result = run({"reshard", root(), "--world", "2", "--stage", "3", "--out", out});
  ASSERT_EQ(result.status, 0) << result.err;
  const CheckpointManifest manifest = read_manifest(out);
  EXPECT_EQ(manifest.world_size, 2);
  EXPECT_EQ(manifest.stage, 3);
  EXPECT_EQ(run({"verify", out}).status, 0);
  TrainSpec spec;
  spec.world = 2;
  spec.stage = 3;
  spec.steps = 2;
  spec.resume = out;
  const testing::TrainResult loaded = train_mlp(spec);
  EXPECT_FALSE(loaded.loaded.resharded);
  for (const auto& [name, values] : run_.params) EXPECT_EQ(loaded.params.at(name), values) << name;
  expect_error({"reshard", root(), "--world", "2", "--out", out}, 2, "already exists");
}

TEST_F(ZestCkpt, BadInputExitsTwoWithOneLine) {
  expect_error({"inspect", scratch_.path("nowhere")}, 2, "does not exist");
  expect_error({"frobnicate"}, 2, "see --help");
  expect_error({"export", root()}, 2, "--out");
  expect_error({"reshard", root(), "--world", "0", "--out", scratch_.path("x")}, 2, "--world");
  testing::write_whole_file(root() + "/latest", "step-7\n");
  expect_error({"verify", root()}, 2, "latest names step-7, which does not exist");
}

}  // namespace
}  // namespace zest
