// The byte-exact check of the measured = planned suites: every category's peak on every rank,
// and the total, equal the plan. Frees run in stream order, so a host descheduled on a loaded
// machine can only measure less than the plan, never more: the largest peaks of up to twelve
// runs are taken before comparing (with WorldOptions::hold_frees one run is normally enough).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "memory/allocator.h"
#include "planner/peak_plan.h"

namespace zest::testing {

// `train_once()` runs the job and returns each rank's allocator usage; `planned_for(rank)` is
// that rank's plan (a pipeline's stages plan differently).
template <typename PlannedFor, typename TrainOnce>
void expect_largest_peaks_equal_plans(PlannedFor&& planned_for, TrainOnce&& train_once) {
  auto equal = [&](const std::vector<MemoryUsage>& measured) {
    for (std::size_t rank = 0; rank < measured.size(); ++rank) {
      const PeakPrediction& planned = planned_for(rank);
      if (measured[rank].total_peak != planned.device_total) return false;
      for (Category category : all_categories()) {
        if (measured[rank].peak_of(category) != planned.of(category)) return false;
      }
    }
    return true;
  };
  std::vector<MemoryUsage> measured = train_once();
  for (int run = 1; run < 12 && !equal(measured); ++run) {
    const std::vector<MemoryUsage> again = train_once();
    for (std::size_t rank = 0; rank < measured.size(); ++rank) {
      for (std::size_t c = 0; c < kCategoryCount; ++c) {
        measured[rank].peak[c] = std::max(measured[rank].peak[c], again[rank].peak[c]);
      }
      measured[rank].total_peak = std::max(measured[rank].total_peak, again[rank].total_peak);
    }
  }
  for (std::size_t rank = 0; rank < measured.size(); ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const PeakPrediction& planned = planned_for(rank);
    for (Category category : all_categories()) {
      EXPECT_EQ(measured[rank].peak_of(category), planned.of(category)) << category_name(category);
    }
    EXPECT_EQ(measured[rank].total_peak, planned.device_total);
  }
}

// Every rank against one plan.
template <typename TrainOnce>
void expect_largest_peaks_equal_plan(const PeakPrediction& planned, TrainOnce&& train_once) {
  expect_largest_peaks_equal_plans([&](std::size_t) -> const PeakPrediction& { return planned; },
                                   train_once);
}

}  // namespace zest::testing
