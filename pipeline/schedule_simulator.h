// Checks a schedule before the first step by running it in simulated time, and predicts its
// bubble. Every rank runs its actions in order, each as soon as what it needs is there: a
// forward needs its input (received, or made on this rank by the previous virtual stage), a
// backward its forward and its output's gradient, a weight gradient its input gradient, a
// reduce every backward of the step. Sends never hold up their rank (the interpreter issues them
// on streams of their own, communicator.h); a receive waits for its send. A schedule that would
// hang or compute wrongly — a receive whose send never comes or comes in another order, a rank
// sending to itself, a deadlock, an action before what it needs, a micro-batch left without its
// forward or backward — is a kUsage Error naming the schedule, the pipeline stage and the action.
#pragma once

#include <vector>

#include "pipeline/schedule.h"

namespace zest {

// Unit costs: the bubble depends only on their ratios. Defaults F = B = W = 1 (a whole backward
// costs B + W), transfers free.
struct ScheduleCosts {
  double forward = 1.0;
  double backward_input = 1.0;
  double backward_weight = 1.0;
  double transfer = 0.0;  // from a send to its receive's earliest completion
};

struct StageTimeline {
  double busy = 0.0;    // time computing
  double finish = 0.0;  // when its last action ends
  // The most micro-batches whose activations this pipeline stage holds at once (forward begun,
  // weight gradient not yet done), over all its chunks: what its activation memory is sized by.
  int peak_in_flight = 0;
  std::vector<double> start;  // of each action, in schedule order
};

struct ScheduleSimulation {
  double makespan = 0.0;
  std::vector<StageTimeline> pipeline_stages;
  // Idle time over busy time, summed over pipeline stages: (p·makespan − Σ busy) / Σ busy — the
  // quantity the closed formulas give ((p − 1)/m for 1F1B).
  double bubble_ratio = 0.0;
  // Idle time over all time: (p·makespan − Σ busy) / (p·makespan).
  double idle_fraction = 0.0;
};

ScheduleSimulation simulate_schedule(const Schedule& schedule, const ScheduleCosts& costs = {});

// The closed formulas, for F = B = W: (p − 1)/m for GPipe and 1F1B, (p − 1)/(v·m) interleaved,
// (p − 1)/(3m) for ZB-H1 (its bubble (p − 1)(F + B − W) against 1F1B's (p − 1)(F + B + W)).
double closed_form_bubble_ratio(ScheduleKind kind, int pipeline_stages, int micro_batches,
                                int chunks = 1);

}  // namespace zest
