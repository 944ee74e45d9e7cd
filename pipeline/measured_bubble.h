// The bubble of one step as a trace shows it (runtime/trace.h): each rank's forward and backward
// action slices of the step, as the interpreter records them on its compute track, against the
// step's span. The one home of that arithmetic, for the trace test and the bubble benchmark
// (benchmarks/pipeline_bubble_bench.cc), which set it beside simulate_schedule's prediction.
// Invariant: every step records the same number of action slices on a rank, so a trace of
// `steps` steps holds each rank's last step in its last 1/steps of them.
#pragma once

#include <string_view>
#include <vector>

#include "pipeline/schedule_simulator.h"
#include "runtime/trace.h"

namespace zest {

struct MeasuredBubble {
  int ranks = 0;             // with action slices in the trace
  double makespan_us = 0.0;  // the step's first action's start to its last action's end, any rank
  double busy_us = 0.0;      // the actions' wall time, summed over the ranks
  double busy_cpu_us = -1.0;  // their threads' CPU time (Slice::cpu_us); -1 when not recorded
  // Idle over all time, as ScheduleSimulation::idle_fraction: (ranks × makespan − busy) /
  // (ranks × makespan); with CPU time for busy (-1 without it). Wall time counts a rank that
  // waited for a core (more ranks than cores) as busy, CPU time counts it as idle.
  double idle_fraction = 0.0;
  double cpu_idle_fraction = -1.0;
  // The mean action in microseconds, as simulate_schedule's costs: forward, backward-input (or
  // the whole backward where it did not split), backward-weight (0 where none ran). From wall
  // time, and from CPU time (all -1 without it); transfers are left at 0.
  ScheduleCosts mean_wall_us{0.0, 0.0, 0.0, 0.0};
  ScheduleCosts mean_cpu_us{-1.0, -1.0, -1.0, 0.0};
};

// An interpreter's action slice ("backward-input of micro-batch 2"), not the engine's per-unit
// slice inside it ("backward-input layer1") nor a send.
bool is_pipeline_action(std::string_view slice_name);

// The last of `steps` steps in `slices` (a whole trace, any order). A kUsage Error when there is
// no action slice, or a rank's count is not a multiple of `steps`.
MeasuredBubble measure_last_step_bubble(const std::vector<TraceRecorder::Slice>& slices,
                                        int steps);

}  // namespace zest
