// The generated schedules against the closed formulas: the simulator's bubble (unit costs
// F = B = W = 1) for GPipe and 1F1B is (p − 1)/m, interleaved 1F1B (p − 1)/(v·m), and ZB-H1's
// about a third of 1F1B's, at p = 2 and 4, m = 4, 8 and 16; and the activations each pipeline
// pipeline stage holds (GPipe all m, 1F1B at most p − s, ZB-H1 no more than 1F1B's peak, p).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "pipeline/schedule_generators.h"
#include "pipeline/schedule_simulator.h"

namespace zest {
namespace {

constexpr int kStages[] = {2, 4};
constexpr int kMicroBatches[] = {4, 8, 16};
// Unit costs are small integers, so simulated times are exact in double; the ratios are a
// division of exact values, hence the tolerance of a few ulps.
constexpr double kExact = 1e-12;

TEST(ScheduleBubble, GPipeAndOneFOneBMatchTheClosedFormula) {
  for (int p : kStages) {
    for (int m : kMicroBatches) {
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
        const ScheduleSimulation run = simulate_schedule(make_schedule(kind, p, m));
        EXPECT_NEAR(run.bubble_ratio, closed_form_bubble_ratio(kind, p, m), kExact)
            << schedule_kind_name(kind) << " p=" << p << " m=" << m;
        EXPECT_NEAR(run.makespan, 3.0 * (m + p - 1), kExact);
      }
    }
  }
}

TEST(ScheduleBubble, InterleavedMatchesTheClosedFormula) {
  for (int p : kStages) {
    for (int m : kMicroBatches) {
      for (int v : {2, 3}) {
        const ScheduleSimulation run = simulate_schedule(interleaved_schedule(p, m, v));
        EXPECT_NEAR(run.bubble_ratio,
                    closed_form_bubble_ratio(ScheduleKind::kInterleavedOneFOneB, p, m, v), kExact)
            << "p=" << p << " m=" << m << " v=" << v;
      }
    }
  }
}

TEST(ScheduleBubble, ZeroBubbleH1IsAboutAThirdOfOneFOneB) {
  for (int p : kStages) {
    for (int m : kMicroBatches) {
      const double zb = simulate_schedule(zero_bubble_h1_schedule(p, m)).bubble_ratio;
      const double one_f_one_b = simulate_schedule(one_f_one_b_schedule(p, m)).bubble_ratio;
      EXPECT_NEAR(zb, closed_form_bubble_ratio(ScheduleKind::kZeroBubbleH1, p, m), kExact)
          << "p=" << p << " m=" << m;
      EXPECT_NEAR(zb / one_f_one_b, 1.0 / 3.0, kExact);
    }
  }
}

TEST(ScheduleBubble, InFlightMicroBatchesAreGPipesAllAndOneFOneBsAtMostPMinusS) {
  for (int p : kStages) {
    for (int m : kMicroBatches) {
      const ScheduleSimulation gpipe = simulate_schedule(gpipe_schedule(p, m));
      const ScheduleSimulation ofob = simulate_schedule(one_f_one_b_schedule(p, m));
      const ScheduleSimulation zb = simulate_schedule(zero_bubble_h1_schedule(p, m));
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(gpipe.pipeline_stages[s].peak_in_flight, m);
        EXPECT_EQ(ofob.pipeline_stages[s].peak_in_flight, std::min(p - s, m))
            << "p=" << p << " s=" << s;
        EXPECT_LE(zb.pipeline_stages[s].peak_in_flight,
                  ofob.pipeline_stages[0].peak_in_flight);  // 1F1B's peak
      }
    }
  }
}

TEST(ScheduleBubble, ARicherCostModelStillOrdersTheSchedules) {
  // Transfers that cost a tenth of a forward: every schedule's bubble grows, the order stays.
  ScheduleCosts costs;
  costs.transfer = 0.1;
  for (int p : kStages) {
    const double gpipe = simulate_schedule(gpipe_schedule(p, 8), costs).bubble_ratio;
    const double ofob = simulate_schedule(one_f_one_b_schedule(p, 8), costs).bubble_ratio;
    const double interleaved = simulate_schedule(interleaved_schedule(p, 8, 2), costs).bubble_ratio;
    const double zb = simulate_schedule(zero_bubble_h1_schedule(p, 8), costs).bubble_ratio;
    EXPECT_GT(ofob, closed_form_bubble_ratio(ScheduleKind::kOneFOneB, p, 8));  // transfers add
    EXPECT_GT(gpipe, closed_form_bubble_ratio(ScheduleKind::kGPipe, p, 8));
    EXPECT_LT(interleaved, ofob);
    EXPECT_LT(zb, ofob);
  }
}

}  // namespace
}  // namespace zest
