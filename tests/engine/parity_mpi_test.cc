// ctest-labels: mpi
// The engine with ranks as processes (the `mpi` backend, under mpirun -np 2 and 4) trains the
// MLP to the same numbers as one rank at stage 0, at every stage: the communicator is the only
// thing that differs from the threads runs of engine_parity_test.cc.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>

#include "runtime/mpi_process.h"
#include "tests/engine/engine_test_support.h"

namespace zest {
namespace {

using testing::RunResult;
using testing::RunSpec;
using testing::run_mlp;

// As in engine_parity_test.cc: the runs differ in the order fp32 sums are taken — here also the
// order MPI adds the ranks' contributions in — about 1e-7 relative per step, which 20 steps of
// Adam do not amplify past 1e-6 on this problem. The absolute floor covers values near zero.
constexpr double kRelative = 1e-6;
constexpr double kAbsolute = 1e-7;

void expect_close(float expected, float actual, const std::string& what) {
  EXPECT_NEAR(expected, actual, kRelative * std::abs(expected) + kAbsolute) << what;
}

class EngineOverMpi : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

TEST_P(EngineOverMpi, MatchesSingleRankUnshardedRun) {
  const auto [optimizer, stage] = GetParam();
  RunSpec reference_spec;
  reference_spec.optimizer = optimizer;
  const RunResult reference = testing::run_mlp_as_threads(reference_spec);

  RunSpec spec = reference_spec;
  spec.stage = stage;
  spec.world = MpiProcess::get().size();
  spec.configure_world = [](WorldOptions& options) {
    options.backend = "mpi";
    options.ranks = 1;  // the launcher decides
  };
  const RunResult run = run_mlp(spec);
  if (MpiProcess::get().rank() != 0) return;  // rank 0's process holds the losses and params

  ASSERT_EQ(reference.losses.size(), run.losses.size());
  for (std::size_t step = 0; step < reference.losses.size(); ++step) {
    expect_close(reference.losses[step], run.losses[step], "loss at step " + std::to_string(step));
  }
  ASSERT_EQ(reference.params.size(), run.params.size());
  for (const auto& [name, values] : reference.params) {
    const std::vector<float>& other = run.params.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    for (std::size_t i = 0; i < values.size(); ++i) {
      expect_close(values[i], other[i], name + "[" + std::to_string(i) + "]");
      if (::testing::Test::HasFailure()) return;  // one mismatch says enough
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineOverMpi,
                         ::testing::Combine(::testing::Values("AdamW", "SGD"),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_stage" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace zest
