// zest-train with the optimizer's state and the parameters on NVMe. Killed with SIGKILL in the
// middle of the optimizer's NVMe writes (debug.fault "stall_nvme_write" holds the write stream
// there, so the kill lands with the swap files half updated, every time): the last checkpoint
// is intact, the killed run's swap folder is removed at the next start, and the run resumed from
// the checkpoint trains bit for bit as the uninterrupted run. Where the kernel refuses io_uring
// (here: a queue deeper than io_uring's 32768 entries, refused with EINVAL) the tier falls back
// to pread/pwrite threads, says so once for the whole process, and trains the same bits. Every
// step record carries the tier's traffic.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/support/subprocess.h"

namespace zest {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using testing::ProcessResult;
using testing::ScratchDirectory;

const std::string kBinary = ZEST_BINARY_DIR "/bin/zest-train";

class ZestTrainNvmeCrash : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return scratch_.path(name); }

  // A tiny MLP at stage 3 on 2 ranks, its parameters and optimizer state on NVMe in small
  // pieces, a checkpoint every 2 steps.
  std::string write_config(const json& fault) const {
    json config = {
        {"model", {{"type", "mlp"}, {"sizes", {16, 64, 64, 10}}}},
        {"data", {{"type", "synthetic"}}},
        {"world",
         {{"backend", "local"}, {"ranks", 2}, {"device_memory", "64MiB"}, {"timeout_s", 60}}},
        {"steps", 6},
        {"train_batch_size", 16},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}}}}},
        {"zero_optimization",
         {{"stage", 3},
          {"sub_group_size", 256},
          {"offload_optimizer",
           {{"device", "nvme"}, {"nvme_path", path("nvme")}, {"buffer_count", 2}}},
          {"offload_param",
           {{"device", "nvme"},
            {"nvme_path", path("nvme")},
            {"buffer_size", 2048},
            {"max_in_cpu", 0}}}}},
        {"checkpoint", {{"dir", path("ckpt")}, {"every_steps", 2}, {"save_on_exit", false}}},
        {"steps_per_print", 1}};
    if (!fault.is_null()) config["debug"] = {{"fault", fault}};
    const std::string file = path(fault.is_null() ? "plain.json" : "faulty.json");
    std::ofstream(file) << config.dump(2);
    return file;
  }

  testing::OutputFiles files(const std::string& name) const {
    return {path(name + ".out"), path(name + ".err")};
  }

  // The metrics lines of the steps, without their timings.
  std::vector<std::string> step_lines(const std::string& metrics) const {
    std::vector<std::string> lines;
    std::istringstream stream(testing::read_whole_file(metrics));
    for (std::string line; std::getline(stream, line);) {
      json value = json::parse(line);
      if (!value.contains("step")) continue;
      value.erase("step_ms");
      value.erase("tokens_per_s");
      value.erase("checkpoint_wait_s");
      // The tier's traffic since the previous record counts a save's reads too: not the
      // training's bits.
      value.erase("nvme_read_bytes");
      value.erase("nvme_written_bytes");
      lines.push_back(value.dump());
    }
    return lines;
  }

  ScratchDirectory scratch_;
};

TEST_F(ZestTrainNvmeCrash, KilledMidWriteResumesFromTheLastCheckpointBitIdentically) {
  const std::string plain = write_config(nullptr);
  const ProcessResult whole =
      testing::run_program(kBinary,
                           {"--config", plain, "--set", "checkpoint.dir=" + path("whole-ckpt"),
                            "--metrics", path("whole.jsonl")},
                           files("whole"));
  ASSERT_EQ(whole.status, 0) << whole.err;
  EXPECT_THAT(whole.out, HasSubstr("parameters offloaded to nvme"));

  // Step 3's writes stall on rank 0 after half the units were written: killed there.
  const std::string faulty = write_config(
      {{"kind", "stall_nvme_write"}, {"rank", 0}, {"step", 3}, {"stall_seconds", 600}});
  const pid_t pid = testing::start_program(
      kBinary, {"--config", faulty, "--metrics", path("killed.jsonl")}, files("killed"));
  ASSERT_GT(pid, 0);  // not kill(-1, ...) below
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (testing::read_whole_file(path("killed.err")).find("stall_nvme_write") ==
             std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  const ProcessResult killed = testing::wait_for_program(pid, files("killed"));
  ASSERT_EQ(killed.status, 128 + SIGKILL) << killed.err;
  ASSERT_THAT(killed.err, HasSubstr("stall_nvme_write: rank 0")) << "killed before the stall";
  EXPECT_EQ(testing::read_whole_file(path("ckpt") + "/latest"), "step-2\n");
  // The killed run's swap folders stay behind: nobody removed them.
  EXPECT_FALSE(fs::is_empty(path("nvme") + "/zest-swap"));

  const ProcessResult resumed = testing::run_program(
      kBinary,
      {"--config", plain, "--resume", path("ckpt") + "/step-2", "--metrics", path("resumed.jsonl")},
      files("resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr("at step 2"));
  const std::vector<std::string> all = step_lines(path("whole.jsonl"));
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(step_lines(path("resumed.jsonl")),
            (std::vector<std::string>{all[2], all[3], all[4], all[5]}));
  // The killed run's folders were found by their dead pid and removed, the resumed run's at its
  // exit.
  EXPECT_FALSE(fs::exists(path("nvme") + "/zest-swap"));
}

TEST_F(ZestTrainNvmeCrash, RefusedIoUringFallsBackToThreadsSaidOnceWithTheSameBits) {
  const std::string plain = write_config(nullptr);
  const ProcessResult uring = testing::run_program(
      kBinary,
      {"--config", plain, "--set", "steps=3", "--set", "checkpoint.dir=" + path("uring-ckpt"),
       "--metrics", path("uring.jsonl")},
      files("uring"));
  ASSERT_EQ(uring.status, 0) << uring.err;
  EXPECT_THAT(uring.err, ::testing::Not(HasSubstr("io_uring unavailable")));
  // Every rank opens two stores (parameters, optimizer), each an engine per direction: eight
  // refusals, one line.
  const ProcessResult threads = testing::run_program(
      kBinary,
      {"--config", plain, "--set", "steps=3", "--set", "checkpoint.dir=" + path("threads-ckpt"),
       "--set", "aio={\"queue_depth\": 1048576}", "--metrics", path("threads.jsonl")},
      files("threads"));
  ASSERT_EQ(threads.status, 0) << threads.err;
  std::size_t said = 0;
  for (const std::string& line : testing::lines_of(threads.err)) {
    if (line.find("io_uring unavailable") != std::string::npos) {
      ++said;
      EXPECT_THAT(line, HasSubstr("pread/pwrite thread(s)"));
    }
  }
  EXPECT_EQ(said, 1u) << threads.err;
  EXPECT_EQ(step_lines(path("threads.jsonl")), step_lines(path("uring.jsonl")));
  EXPECT_EQ(step_lines(path("uring.jsonl")).size(), 3u);
}

// Each step record carries rank 0's NVMe traffic since the previous one. A step writes the
// optimizer's swap files zest-estimate plans whole, and the parameter shards (their bytes, not
// their blocks' padding: at most the parameters' swap files), and reads both tiers' files (the
// first step reads no moments: none were written yet). The write-back runs on beside the next
// step, so a record counts the writes that completed before it; but the next step reads what
// the last wrote, so by step n's record at least n - 1 steps' writes have landed, and at most n.
TEST_F(ZestTrainNvmeCrash, EveryStepRecordsItsNvmeTrafficTheStateWrittenOnceAStep) {
  const std::string plain = write_config(nullptr);
  const ProcessResult estimate = testing::run_program(
      ZEST_BINARY_DIR "/bin/zest-estimate", {"--config", plain, "--json"}, files("estimate"));
  ASSERT_EQ(estimate.status, 0) << estimate.err;
  const json nvme = json::parse(estimate.out)["per_rank_bytes"]["nvme"];
  const std::uint64_t planned = nvme["total"].get<std::uint64_t>();
  const std::uint64_t optimizer = nvme["optimizer"].get<std::uint64_t>();
  ASSERT_GT(nvme["params"].get<std::uint64_t>(), 0u);
  ASSERT_GT(nvme["optimizer"].get<std::uint64_t>(), 0u);
  const ProcessResult run = testing::run_program(
      kBinary, {"--config", plain, "--set", "steps=4", "--set", "checkpoint={}", "--metrics",
                path("traffic.jsonl")},
      files("traffic"));
  ASSERT_EQ(run.status, 0) << run.err;
  std::uint64_t written = 0;
  std::uint64_t read = 0;
  std::uint64_t steps = 0;
  for (const std::string& line : testing::lines_of(testing::read_whole_file(path("traffic.jsonl")))) {
    const json record = json::parse(line);
    if (!record.contains("step")) continue;
    SCOPED_TRACE(line);
    ++steps;
    written += record["nvme_written_bytes"].get<std::uint64_t>();
    read += record["nvme_read_bytes"].get<std::uint64_t>();
    EXPECT_GE(written, (steps - 1) * optimizer);
    EXPECT_LE(written, steps * planned);
    if (steps > 1) {
      EXPECT_GE(read, (steps - 1) * planned);
    }
  }
  EXPECT_EQ(steps, 4u);
}

}  // namespace
}  // namespace zest
