// Runs the built zest-ckpt binary as a user would, on a checkpoint this test saves: inspect
// summarizes, verify names a corrupt file and exits 1, export writes a safetensors file the
// strict reader accepts, reshard writes a checkpoint that loads at the new world size; bad
// input exits 2 with one line on stderr, a file that is not a regular file among them (refused
// by name, never opened: a FIFO used to block every command forever).
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/support/subprocess.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::ProcessResult;
using testing::ScratchDirectory;
using ::testing::StartsWith;
using testing::train_mlp;
using testing::TrainSpec;

const std::string kBinary = ZEST_BINARY_DIR "/bin/zest-ckpt";

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

  ProcessResult run(const std::vector<std::string>& args) const {
    return testing::run_program(kBinary, args,
                                {scratch_.path("stdout.txt"), scratch_.path("stderr.txt")});
  }

  void expect_error(const std::vector<std::string>& args, int status,
                    const std::string& text) const {
    const ProcessResult result = run(args);
    EXPECT_EQ(result.status, status) << result.err;
    EXPECT_THAT(result.err, StartsWith("zest-ckpt: error: "));
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    EXPECT_THAT(result.err, HasSubstr(text));
  }

  // As expect_error, under a time limit: a child blocked on a FIFO fails instead of hanging.
  void expect_refused(const std::vector<std::string>& args, const std::string& text) const {
    const testing::LimitedResult result = testing::run_program_limited(
        kBinary, args, {scratch_.path("stdout.txt"), scratch_.path("stderr.txt")}, {0, 30});
    EXPECT_FALSE(result.timed_out) << "still running after " << result.seconds << " s";
    EXPECT_EQ(result.status, 2) << result.err;
    EXPECT_THAT(result.err, StartsWith("zest-ckpt: error: "));
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    EXPECT_THAT(result.err, HasSubstr(text));
  }

  // Replaces `name` under the checkpoint root by a FIFO.
  std::string make_fifo(const std::string& name) const {
    const std::string target = root() + "/" + name;
    std::filesystem::remove(target);
    EXPECT_EQ(::mkfifo(target.c_str(), 0644), 0) << target;
    return target;
  }

  ScratchDirectory scratch_;
  testing::TrainResult run_;
};

TEST_F(ZestCkpt, InspectSummarizesTheCheckpoint) {
  const ProcessResult result = run({"inspect", root()});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("step-2"));
  EXPECT_THAT(result.out,
              HasSubstr("step 2 (optimizer steps 2), world size 4, stage 2, compute fp32"));
  EXPECT_THAT(result.out, HasSubstr("optimizer.1 (fp32)"));
  EXPECT_THAT(result.out, HasSubstr("layer1"));
  EXPECT_THAT(result.out, HasSubstr("rank-3.bin"));
}

TEST_F(ZestCkpt, VerifyPassesThenNamesTheCorruptFile) {
  const ProcessResult good = run({"verify", root()});
  EXPECT_EQ(good.status, 0) << good.err;
  EXPECT_THAT(good.out, HasSubstr("4 files verified"));
  testing::flip_byte(root() + "/step-2/rank-2.bin", 33);
  expect_error({"verify", root()}, 1, "rank-2.bin: checksum mismatch");
}

TEST_F(ZestCkpt, ExportWritesTheFullParameters) {
  const std::string out = scratch_.path("model.safetensors");
  const ProcessResult result = run({"export", root(), "--out", out, "--dtype", "bf16"});
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
  const ProcessResult result =
      run({"reshard", root(), "--world", "2", "--stage", "3", "--out", out});
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

// The manifest is checked like the shards, and what a malformed `latest` holds is shown escaped:
// the error line carries no byte the terminal would act on.
TEST_F(ZestCkpt, VerifyChecksTheManifestAndShowsLatestEscaped) {
  const ProcessResult good = run({"verify", root()});
  EXPECT_EQ(good.status, 0) << good.err;
  EXPECT_THAT(good.out, HasSubstr("manifest.json: ok\n"));
  EXPECT_THAT(run({"inspect", root()}).out, HasSubstr("manifest.json  xxh3 "));

  const std::string manifest = root() + "/step-2/manifest.json";
  const std::string text = testing::read_whole_file(manifest);
  testing::flip_byte(manifest, text.find("\"optimizer_steps\": 2") + 19);  // 2 -> "
  expect_error({"verify", root()}, 2, "manifest.json: checksum mismatch");
  testing::write_whole_file(manifest, text);

  testing::write_whole_file(root() + "/latest", std::string("step-2\0\x1b[2J\x1b]0;x\x07\n", 18));
  expect_error({"verify", root()}, 2,
               R"(latest holds "step-2\x00\x1b[2J\x1b]0;x\x07\n", not the name of a step directory)");
  const ProcessResult bad = run({"inspect", root()});
  EXPECT_TRUE(std::none_of(bad.err.begin(), bad.err.end() - 1,
                           [](char c) { return static_cast<unsigned char>(c) < 0x20; }))
      << bad.err;
}

// Each said too little or too much: "A subcommand is required" for a command CLI11 did not know,
// the range of --world up to the largest double (a 300-digit number).
TEST_F(ZestCkpt, UsageMessagesSayWhatIsAllowed) {
  expect_error({"frobnicate", root()}, 2,
               "unknown command 'frobnicate'; the commands are inspect, verify, export or "
               "reshard (see --help)");
  expect_error({}, 2, "a command is required: inspect, verify, export or reshard");
  for (const char* world : {"0", "-3", "65537", "two", "1.5"}) {
    const testing::LimitedResult result = testing::run_program_limited(
        kBinary, {"reshard", root(), "--world", world, "--out", scratch_.path("x")},
        {scratch_.path("stdout.txt"), scratch_.path("stderr.txt")}, {0, 30});
    EXPECT_EQ(result.status, 2) << world;
    EXPECT_THAT(result.err, HasSubstr(std::string("--world: must be an integer from 1 to 65536, "
                                                  "got '") + world + "'"));
    EXPECT_LT(result.err.size(), 200u) << result.err;
  }
  expect_error({"reshard", root(), "--world", "2", "--stage", "4", "--out", scratch_.path("x")},
               2, "--stage: must be an integer from 0 to 3, got '4'");
}

TEST_F(ZestCkpt, AShardOrLatestThatIsNotARegularFileIsRefusedByName) {
  const std::string shard = make_fifo("step-2/rank-1.bin");
  const std::string refused = "'" + shard + "' is a FIFO, not a regular file";
  expect_refused({"verify", root()}, refused);
  expect_refused({"export", root(), "--out", scratch_.path("model.safetensors")}, refused);
  expect_refused({"reshard", root(), "--world", "2", "--out", scratch_.path("resharded")},
                 refused);
  EXPECT_FALSE(std::filesystem::exists(scratch_.path("model.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(scratch_.path("resharded")));
  const std::string latest = make_fifo("latest");
  expect_refused({"inspect", root()}, "'" + latest + "' is a FIFO, not a regular file");
}

// Checked before the checkpoint is read, not at the rename after it was.
TEST_F(ZestCkpt, OutputPathsAreCheckedFirst) {
  const std::string folder = scratch_.path("folder");
  std::filesystem::create_directories(folder);
  expect_error({"export", root(), "--out", folder}, 2,
               "--out '" + folder + "' is a directory; give the path of a file to write");
  expect_error({"export", root(), "--out", scratch_.path("missing/model.safetensors")}, 2,
               "its folder '" + scratch_.path("missing") + "' does not exist");
  testing::write_whole_file(scratch_.path("file"), "x");
  expect_error({"reshard", root(), "--world", "2", "--out", scratch_.path("file") + "/new"}, 2,
               "'" + scratch_.path("file") + "' is a regular file, not a directory");
}

}  // namespace
}  // namespace zest
