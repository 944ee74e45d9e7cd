// Communication overlapped with compute gives the same bits as the serialized schedule, also
// with every collective delayed to widen race windows; the gather ring bounds stage 3's memory;
// the timeline is valid Chrome trace JSON.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/engine/engine_test_support.h"

namespace zest {
namespace {

using testing::RunResult;
using testing::RunSpec;
using testing::run_mlp;

void expect_bit_identical(const RunResult& a, const RunResult& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_EQ(std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float)), 0);
  for (const auto& [name, values] : a.params) {
    const auto& other = b.params.at(name);
    ASSERT_EQ(values.size(), other.size());
    EXPECT_EQ(std::memcmp(values.data(), other.data(), values.size() * sizeof(float)), 0) << name;
  }
}

RunSpec overlap_spec(int stage, int world, bool overlap) {
  RunSpec spec;
  spec.stage = stage;
  spec.world = world;
  spec.steps = 5;
  spec.sizes = {13, 40, 40, 40, 7};
  spec.accumulation = 2;
  spec.configure_engine = [overlap](EngineOptions& options) {
    options.overlap_comm = overlap;
    options.reduce_bucket_size = 1500;  // a bucket closes every unit or two
    options.stage3_prefetch_bucket_size = 4000;  // gather up to two units ahead
  };
  return spec;
}

class Overlap : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(Overlap, OnAndOffAreBitIdentical) {
  const auto [stage, world] = GetParam();
  expect_bit_identical(run_mlp(overlap_spec(stage, world, false)),
                       run_mlp(overlap_spec(stage, world, true)));
}

TEST_P(Overlap, DelayedCollectivesAreBitIdentical) {
  const auto [stage, world] = GetParam();
  RunSpec delayed = overlap_spec(stage, world, true);
  delayed.steps = 2;
  delayed.configure_world = [](WorldOptions& options) {
    options.collective_delay = std::chrono::milliseconds(2);
  };
  RunSpec plain = overlap_spec(stage, world, false);
  plain.steps = 2;
  expect_bit_identical(run_mlp(plain), run_mlp(delayed));
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, Overlap,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(2, 3, 4)),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) + "_world" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(Overlap, BucketSizeDoesNotChangeTheResult) {
  RunSpec per_unit = overlap_spec(1, 3, true);
  RunSpec one_bucket = per_unit;
  one_bucket.configure_engine = [](EngineOptions& options) {
    options.reduce_bucket_size = 500000000;
  };
  expect_bit_identical(run_mlp(per_unit), run_mlp(one_bucket));
}

TEST(GatherRing, PeakGatherBytesStayWithinTheRing) {
  RunSpec spec = overlap_spec(3, 4, true);
  const RunResult run = run_mlp(spec);
  // Units: 13×40+40, 40×40+40 (twice), 40×7+7 elements, padded to 4 × 32: 640, 1664, 1664, 384.
  // Size classes within a factor 2: {1664, 1664} and {640, 384}. Prefetch of 4000 elements asks
  // for more slots than either class has units, so each class has a slot per unit.
  for (int rank = 0; rank < spec.world; ++rank) {
    EXPECT_EQ(run.usage[rank].peak_of(Category::kGather), (2 * 1664 + 2 * 640) * sizeof(float));
  }
}

TEST(Trace, TimelineIsChromeTraceJsonWithATrackPerStream) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("zest_trace_" + std::to_string(::getpid()) + ".json"))
          .string();
  auto recorder = std::make_shared<TraceRecorder>();
  RunSpec spec = overlap_spec(3, 2, true);
  spec.configure_world = [recorder](WorldOptions& options) { options.trace = recorder; };
  run_mlp(spec);
  recorder->write(path);
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  ASSERT_TRUE(trace.contains("traceEvents"));
  std::set<std::pair<int, std::string>> tracks;
  int collectives = 0, computes = 0;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "thread_name") {
      tracks.insert({event["pid"].get<int>(), event["args"]["name"].get<std::string>()});
    }
    if (event["ph"] != "X") continue;
    EXPECT_GE(event["dur"].get<std::int64_t>(), 0);
    EXPECT_GE(event["ts"].get<std::int64_t>(), 0);
    if (event["cat"] == "collective") {
      ++collectives;
      EXPECT_GT(event["args"]["bytes"].get<std::int64_t>(), 0);
    } else {
      ++computes;
    }
  }
  for (int rank = 0; rank < 2; ++rank) {
    for (const char* track : {"compute", "comm", "prefetch"}) {
      EXPECT_TRUE(tracks.count({rank, track})) << "rank " << rank << " track " << track;
    }
  }
  EXPECT_GT(collectives, 0);
  EXPECT_GT(computes, 0);
  const auto overlap = recorder->overlap(2);
  for (const auto& rank : overlap) {
    EXPECT_GT(rank.compute_ms, 0.0);
    EXPECT_GE(rank.hidden_fraction, 0.0);
    EXPECT_LE(rank.hidden_fraction, 1.0);
  }
}

}  // namespace
}  // namespace zest
