// ctest-labels: mpi
// ctest-mpirun-np: none
// zest-train as processes: `mpirun -np 4 zest-train --set world.backend=mpi` trains the same
// model as `world.ranks: 4` with threads — the same per-step losses within 1e-6 relative, at
// stages 1 and 3, with 2 pipeline stages and with 2 tensor-parallel ranks — with rank 0 alone
// printing and writing metrics, and every rank's peak bytes gathered into them. Starts mpirun
// itself, bounded by `timeout`.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using zest::testing::ProcessResult;

const std::string kBinary = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kDefaultConfig = ZEST_SOURCE_DIR "/configs/mlp.json";
constexpr int kSteps = 12;

std::vector<json> read_lines(const std::filesystem::path& path) {
  std::vector<json> lines;
  std::ifstream file(path);
  for (std::string line; std::getline(file, line);) lines.push_back(json::parse(line));
  return lines;
}

// The steps' losses a metrics file records, in order.
std::vector<double> losses_of(const std::filesystem::path& metrics) {
  std::vector<double> losses;
  for (const json& line : read_lines(metrics)) {
    if (line.contains("loss")) losses.push_back(line["loss"].get<double>());
  }
  return losses;
}

class ZestTrainMpi : public zest::testing::ScratchDirectoryTest {
 protected:
  // Runs `command` in a shell, its stdout and stderr together in `out`.
  ProcessResult run_shell(const std::string& command) const {
    return zest::testing::run_program("/bin/sh", {"-c", command}, {path("output.txt")});
  }

  static std::string common_arguments(int stage) {
    return " --config '" + kDefaultConfig + "' --set steps=" + std::to_string(kSteps) +
           " --set zero_optimization.stage=" + std::to_string(stage) +
           " --set world.timeout_s=60";
  }

  ProcessResult run_threads(int stage, const std::string& metrics,
                            const std::string& extra = "") const {
    return run_shell("timeout -k 5 120 '" + kBinary + "'" + common_arguments(stage) +
                     " --set world.backend=local --set world.ranks=4" + extra + " --metrics '" +
                     metrics + "'");
  }

  ProcessResult run_processes(int stage, const std::string& metrics,
                              const std::string& extra = "") const {
    return run_shell("timeout -k 5 240 " ZEST_MPIEXEC " " ZEST_MPIEXEC_FLAGS " -np 4 '" +
                     kBinary + "'" + common_arguments(stage) + " --set world.backend=mpi" +
                     extra + " --metrics '" + metrics + "'");
  }
};

TEST_F(ZestTrainMpi, ProcessesTrainLikeThreadsAtStages1And3) {
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string threads_metrics = path("threads_" + std::to_string(stage) + ".jsonl");
    const std::string processes_metrics = path("processes_" + std::to_string(stage) + ".jsonl");
    const ProcessResult threads = run_threads(stage, threads_metrics);
    ASSERT_EQ(threads.status, 0) << threads.out;
    const ProcessResult processes = run_processes(stage, processes_metrics);
    ASSERT_EQ(processes.status, 0) << processes.out;
    EXPECT_THAT(processes.out, HasSubstr("4 processes (Open MPI), rank 0 local 0"));
    // Rank 0 alone prints: one line per logged step, not four.
    const std::string first_step = "step  1/" + std::to_string(kSteps);
    const auto first = processes.out.find(first_step);
    ASSERT_NE(first, std::string::npos) << processes.out;
    EXPECT_EQ(processes.out.find(first_step, first + 1), std::string::npos) << processes.out;

    const std::vector<json> expected = read_lines(threads_metrics);
    const std::vector<json> actual = read_lines(processes_metrics);
    ASSERT_EQ(actual.size(), expected.size());
    ASSERT_EQ(actual.size(), static_cast<std::size_t>(kSteps) + 1);  // steps, then the summary
    for (int step = 0; step < kSteps; ++step) {
      const double want = expected[step].at("loss").get<double>();
      const double got = actual[step].at("loss").get<double>();
      // 1e-6 relative: MPI may add the ranks' gradients in another order than the threads'
      // rank order, a difference of float rounding that the steps do not amplify past this.
      EXPECT_NEAR(got, want, 1e-6 * std::fabs(want)) << "step " << step + 1;
    }

    // Every rank's peaks reach rank 0's summary, and match the threads run's: the same shards.
    const json& summary = actual.back();
    const json& peaks = summary.at("peak_bytes");
    ASSERT_EQ(peaks.size(), 4u) << summary.dump();
    for (std::size_t rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(peaks[rank].at("rank"), rank);
      EXPECT_GT(peaks[rank].at("params").get<std::int64_t>(), 0);
      EXPECT_EQ(peaks[rank].at("params"), expected.back().at("peak_bytes")[rank].at("params"));
      EXPECT_EQ(peaks[rank].at("optimizer"),
                expected.back().at("peak_bytes")[rank].at("optimizer"));
    }
    EXPECT_EQ(summary.at("predicted_model_state_bytes"),
              expected.back().at("predicted_model_state_bytes"));
  }
}

// Pipeline stages (2 x 2 data-parallel, 1F1B, ZeRO-1) as processes: the activations and their
// gradients cross processes point to point, and every step's loss is the threads' to the bit.
TEST_F(ZestTrainMpi, PipelineStagesAsProcessesTrainLikeThreads) {
  const std::string pipeline =
      " --set 'pipeline={\"stages\": 2, \"partition\": \"uniform\"}'";
  const std::string threads_metrics = path("pipeline_threads.jsonl");
  const std::string processes_metrics = path("pipeline_processes.jsonl");
  const ProcessResult threads = run_threads(1, threads_metrics, pipeline + " --set steps=6");
  ASSERT_EQ(threads.status, 0) << threads.out;
  const ProcessResult processes =
      run_processes(1, processes_metrics, pipeline + " --set steps=6");
  ASSERT_EQ(processes.status, 0) << processes.out;
  EXPECT_THAT(processes.out, HasSubstr("2 pipeline stages (1f1b)"));
  const std::vector<double> thread_losses = losses_of(threads_metrics);
  const std::vector<double> process_losses = losses_of(processes_metrics);
  ASSERT_EQ(thread_losses.size(), 6u);
  EXPECT_EQ(process_losses, thread_losses);
}

// Tensor parallelism (2 x 2 data-parallel, sequence-parallel, ZeRO-3) as processes: the tensor
// group's collectives cross processes, and every step's loss is the threads' within MPI's order of
// sums.
TEST_F(ZestTrainMpi, TensorParallelRanksAsProcessesTrainLikeThreads) {
  const std::string job =
      " --config '" ZEST_SOURCE_DIR "/configs/default.json' --set 'data.path=" ZEST_SOURCE_DIR
      "/configs/corpus/stories.txt' --set model.n_layer=2 --set model.n_head=4"
      " --set model.n_embd=64 --set model.vocab_size=256 --set 'scheduler={}' --set eval_every=0"
      " --set train_micro_batch_size_per_gpu=4 --set steps=4 --set zero_optimization.stage=3"
      " --set 'tensor_parallel={\"size\": 2, \"sequence_parallel\": true}'"
      " --set world.timeout_s=60";
  const std::string threads_metrics = path("tensor_threads.jsonl");
  const std::string processes_metrics = path("tensor_processes.jsonl");
  const ProcessResult threads =
      run_shell("timeout -k 5 120 '" + kBinary + "'" + job +
                " --set world.backend=local --set world.ranks=4 --metrics '" + threads_metrics + "'");
  ASSERT_EQ(threads.status, 0) << threads.out;
  const ProcessResult processes =
      run_shell("timeout -k 5 240 " ZEST_MPIEXEC " " ZEST_MPIEXEC_FLAGS " -np 4 '" + kBinary + "'" +
                job + " --set world.backend=mpi --metrics '" + processes_metrics + "'");
  ASSERT_EQ(processes.status, 0) << processes.out;
  EXPECT_THAT(processes.out, HasSubstr("2 tensor-parallel ranks (sequence-parallel)"));
  const std::vector<double> thread_losses = losses_of(threads_metrics);
  const std::vector<double> process_losses = losses_of(processes_metrics);
  ASSERT_EQ(thread_losses.size(), 4u);
  ASSERT_EQ(process_losses.size(), thread_losses.size());
  for (std::size_t step = 0; step < thread_losses.size(); ++step) {
    EXPECT_NEAR(process_losses[step], thread_losses[step], 1e-6 * std::fabs(thread_losses[step]))
        << "step " << step + 1;
  }
}

TEST_F(ZestTrainMpi, ProcessesStartedWithDifferentConfigsStopBeforeTraining) {
  // Rank 2's override differs: the config check names it, and nothing is trained or written.
  const std::string metrics = path("metrics.jsonl");
  const std::string per_rank_seed = "seed=$((1234 + (OMPI_COMM_WORLD_RANK == 2)))";
  const ProcessResult result = run_shell(
      "timeout -k 5 120 " ZEST_MPIEXEC " " ZEST_MPIEXEC_FLAGS " -np 4 sh -c '" + kBinary +
      " --config " + kDefaultConfig + " --set steps=2 --set world.backend=mpi --set " +
      per_rank_seed + " --metrics " + metrics + "'");
  EXPECT_EQ(result.status, 2) << result.out;
  EXPECT_THAT(result.out, HasSubstr("zest-train: error: the processes were started with "
                                    "different configs: rank(s) 2 ("));
  EXPECT_THAT(result.out, ::testing::Not(HasSubstr("step  1/")));
  EXPECT_FALSE(std::filesystem::exists(metrics));
}

TEST_F(ZestTrainMpi, WorldRanksThatDisagreeWithMpirunAreAConfigError) {
  const ProcessResult result = run_shell("timeout -k 5 120 " ZEST_MPIEXEC " " ZEST_MPIEXEC_FLAGS
                                         " -np 2 '" + kBinary + "'" + common_arguments(1) +
                                         " --set world.backend=mpi");
  EXPECT_EQ(result.status, 2) << result.out;
  EXPECT_THAT(result.out, HasSubstr("world.ranks: is 4, but Open MPI started 2 processes"));
}

TEST_F(ZestTrainMpi, AStalledProcessEndsTheJobWithinTheTimeoutNamingTheCollectiveAndStep) {
  // Process 2 sleeps 1000 s before step 2; processes 0 and 1 time out in the stage-3 gather
  // they issued (named as issued, with the collective-order check on), and the job ends with
  // one line, rank 0's.
  const std::string metrics = path("metrics.jsonl");
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult result = run_shell(
      "timeout -k 5 60 " ZEST_MPIEXEC " " ZEST_MPIEXEC_FLAGS " -np 3 '" + kBinary +
      "' --config '" + kDefaultConfig + "' --set steps=3 --set world.backend=mpi "
      "--set world.ranks=3 --set train_batch_size=48 --set world.timeout_s=5 "
      "--set 'debug={\"check_collectives\": true, \"fault\": {\"kind\": \"stall\", "
      "\"rank\": 2, \"step\": 2, \"stall_seconds\": 1000}}' "
      "--metrics '" + metrics + "'");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.status, 1) << result.out;
  EXPECT_LT(seconds, 15.0) << result.out;
  std::vector<std::string> errors;
  for (const std::string& line : zest::testing::lines_of(result.out)) {
    const auto at = line.find("zest-train: error: ");
    if (at != std::string::npos) errors.push_back(line.substr(at));
  }
  ASSERT_EQ(errors.size(), 1u) << result.out;
  EXPECT_THAT(errors[0], ::testing::MatchesRegex(
                             "zest-train: error: rank 0: all_gather #[0-9]+ \\([0-9]+ x fp32\\) "
                             "'gather layer[0-9]' at step 2 on rank 0 of 3: timed out after 5 s "
                             "waiting for the other ranks; .*"));
  EXPECT_THAT(errors[0], ::testing::Not(HasSubstr("int32")));  // the order check's records
  EXPECT_FALSE(std::filesystem::exists(metrics));  // a failed run takes its records back
}

}  // namespace
