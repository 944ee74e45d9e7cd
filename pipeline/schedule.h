// A pipeline schedule as data: for each pipeline stage, the ordered list of actions its ranks
// run in one step — forwards and backwards of micro-batches on model chunks, the sends and
// receives that move activations forward and their gradients back, then the step's reduction
// and optimizer step. Generators (schedule_generators.h) make GPipe, 1F1B, interleaved 1F1B and
// ZB-H1; the simulator (schedule_simulator.h) checks a schedule before the first step and
// predicts its bubble; an interpreter runs it. Invariant: with p pipeline stages and v chunks
// per pipeline stage, chunk c of pipeline stage s is virtual stage c·p + s (Megatron's
// interleaving), and micro-batches pass virtual stages 0, 1, ..., v·p − 1 in order.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace zest {

enum class ActionKind {
  kForward,
  kBackward,        // the whole backward: input gradient and weight gradient together
  kBackwardInput,   // the input gradient only (B), sent on at once
  kBackwardWeight,  // the weight gradient (W), deferred to fill idle time
  kSendActivations,
  kReceiveActivations,
  kSendGradients,
  kReceiveGradients,
  kReduce,          // the pipeline stage's gradients, once per step, in its data-parallel group
  kStep,            // the optimizer step
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = -1;  // -1 for kReduce and kStep
  int chunk = 0;         // the model chunk of this pipeline stage (0..v-1)
  int peer = -1;         // sends and receives: the pipeline stage at the other end
  bool operator==(const Action&) const = default;
};

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleavedOneFOneB, kZeroBubbleH1 };

struct Schedule {
  std::string name;  // "1f1b (4 pipeline stages, 8 micro-batches)", for errors
  int pipeline_stages = 1;
  int micro_batches = 1;
  int chunks = 1;                            // per pipeline stage
  std::vector<std::vector<Action>> actions;  // per pipeline stage, in order

  int virtual_stages() const { return pipeline_stages * chunks; }
  int virtual_stage(int pipeline_stage, int chunk) const {
    return chunk * pipeline_stages + pipeline_stage;
  }
  int stage_of(int virtual_stage) const { return virtual_stage % pipeline_stages; }
  int chunk_of(int virtual_stage) const { return virtual_stage / pipeline_stages; }
};

// "forward of micro-batch 3 (chunk 1)", "receive activations of micro-batch 0 from pipeline
// stage 1", "reduce": an action as errors and traces say it.
std::string describe_action(const Action& action, int chunks = 1);

// The config's names: "gpipe", "1f1b", "interleaved_1f1b", "zb_h1".
std::string_view schedule_kind_name(ScheduleKind kind);
// A kConfig Error naming pipeline.schedule and the allowed names for anything else.
ScheduleKind parse_schedule_kind(std::string_view name);

}  // namespace zest
