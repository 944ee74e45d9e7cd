#include "pipeline/schedule_generators.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"

namespace zest {

namespace {

void check_shape(int pipeline_stages, int micro_batches, int chunks) {
  if (pipeline_stages < 1) {
    throw Error(ErrorKind::kConfig,
                fmt::format("pipeline.stages: must be >= 1, got {}", pipeline_stages));
  }
  if (micro_batches < 1) {
    throw Error(ErrorKind::kConfig,
                fmt::format("pipeline.micro_batches: must be >= 1, got {}", micro_batches));
  }
  if (chunks < 1) {
    throw Error(ErrorKind::kConfig,
                fmt::format("pipeline.virtual_chunks: must be >= 1, got {}", chunks));
  }
}

Schedule empty_schedule(ScheduleKind kind, int pipeline_stages, int micro_batches, int chunks) {
  Schedule schedule;
  schedule.name = fmt::format("{} ({} pipeline stages, {} micro-batches{})",
                              schedule_kind_name(kind), pipeline_stages, micro_batches,
                              chunks > 1 ? fmt::format(", {} chunks", chunks) : "");
  schedule.pipeline_stages = pipeline_stages;
  schedule.micro_batches = micro_batches;
  schedule.chunks = chunks;
  schedule.actions.resize(static_cast<std::size_t>(pipeline_stages));
  return schedule;
}

// Appends a compute action to its pipeline stage's list with the transfers around it: the receive
// of what it needs from another pipeline stage just before it, the send of what it makes just
// after.
void add(Schedule& schedule, int pipeline_stage, ActionKind kind, int micro_batch, int chunk = 0) {
  std::vector<Action>& list = schedule.actions[static_cast<std::size_t>(pipeline_stage)];
  const int v = schedule.virtual_stage(pipeline_stage, chunk);
  const int last = schedule.virtual_stages() - 1;
  const auto other = [&](int virtual_stage) {
    return virtual_stage >= 0 && virtual_stage <= last &&
           schedule.stage_of(virtual_stage) != pipeline_stage;
  };
  if (kind == ActionKind::kForward) {
    if (other(v - 1)) {
      list.push_back({ActionKind::kReceiveActivations, micro_batch, chunk, schedule.stage_of(v - 1)});
    }
    list.push_back({kind, micro_batch, chunk});
    if (other(v + 1)) {
      list.push_back({ActionKind::kSendActivations, micro_batch, chunk, schedule.stage_of(v + 1)});
    }
  } else if (kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput) {
    if (other(v + 1)) {
      list.push_back({ActionKind::kReceiveGradients, micro_batch, chunk, schedule.stage_of(v + 1)});
    }
    list.push_back({kind, micro_batch, chunk});
    if (other(v - 1)) {
      list.push_back({ActionKind::kSendGradients, micro_batch, chunk, schedule.stage_of(v - 1)});
    }
  } else {
    list.push_back({kind, micro_batch, chunk});
  }
}

void finish(Schedule& schedule) {
  for (auto& list : schedule.actions) {
    list.push_back({ActionKind::kReduce});
    list.push_back({ActionKind::kStep});
  }
}

}  // namespace

Schedule gpipe_schedule(int pipeline_stages, int micro_batches) {
  check_shape(pipeline_stages, micro_batches, 1);
  Schedule schedule = empty_schedule(ScheduleKind::kGPipe, pipeline_stages, micro_batches, 1);
  for (int s = 0; s < pipeline_stages; ++s) {
    for (int b = 0; b < micro_batches; ++b) add(schedule, s, ActionKind::kForward, b);
    for (int b = 0; b < micro_batches; ++b) add(schedule, s, ActionKind::kBackward, b);
  }
  finish(schedule);
  return schedule;
}

Schedule one_f_one_b_schedule(int pipeline_stages, int micro_batches) {
  check_shape(pipeline_stages, micro_batches, 1);
  Schedule schedule = empty_schedule(ScheduleKind::kOneFOneB, pipeline_stages, micro_batches, 1);
  for (int s = 0; s < pipeline_stages; ++s) {
    const int warm_up = std::min(pipeline_stages - s - 1, micro_batches);
    int forward = 0, backward = 0;
    while (forward < warm_up) add(schedule, s, ActionKind::kForward, forward++);
    while (forward < micro_batches) {
      add(schedule, s, ActionKind::kForward, forward++);
      add(schedule, s, ActionKind::kBackward, backward++);
    }
    while (backward < micro_batches) add(schedule, s, ActionKind::kBackward, backward++);
  }
  finish(schedule);
  return schedule;
}

Schedule interleaved_schedule(int pipeline_stages, int micro_batches, int chunks) {
  check_shape(pipeline_stages, micro_batches, chunks);
  if (chunks < 2) {
    throw Error(ErrorKind::kConfig,
                fmt::format("pipeline.virtual_chunks: interleaved_1f1b needs at least 2 chunks per "
                            "pipeline stage, got {} (with 1 it is 1f1b)",
                            chunks));
  }
  if (micro_batches % pipeline_stages != 0) {
    throw Error(ErrorKind::kConfig,
                fmt::format("pipeline.micro_batches: interleaved_1f1b runs micro-batches in groups "
                            "of the {} pipeline stages, so it needs a multiple of {}, got {}",
                            pipeline_stages, pipeline_stages, micro_batches));
  }
  Schedule schedule =
      empty_schedule(ScheduleKind::kInterleavedOneFOneB, pipeline_stages, micro_batches, chunks);
  const int total = micro_batches * chunks;
  // Megatron's order: the k-th forward on a pipeline stage is chunk (k / p) mod v of micro-batch
  // (k / (p·v))·p + k mod p; backwards visit the chunks in reverse.
  const auto micro_batch = [&](int k) {
    return (k / (pipeline_stages * chunks)) * pipeline_stages + k % pipeline_stages;
  };
  const auto forward_chunk = [&](int k) { return (k / pipeline_stages) % chunks; };
  const auto backward_chunk = [&](int k) { return chunks - 1 - (k / pipeline_stages) % chunks; };
  for (int s = 0; s < pipeline_stages; ++s) {
    const int warm_up =
        micro_batches == pipeline_stages
            ? total
            : std::min(total, (pipeline_stages - s - 1) * 2 + (chunks - 1) * pipeline_stages);
    int forward = 0, backward = 0;
    while (forward < warm_up) {
      add(schedule, s, ActionKind::kForward, micro_batch(forward), forward_chunk(forward));
      ++forward;
    }
    while (forward < total) {
      add(schedule, s, ActionKind::kForward, micro_batch(forward), forward_chunk(forward));
      ++forward;
      add(schedule, s, ActionKind::kBackward, micro_batch(backward), backward_chunk(backward));
      ++backward;
    }
    while (backward < total) {
      add(schedule, s, ActionKind::kBackward, micro_batch(backward), backward_chunk(backward));
      ++backward;
    }
  }
  finish(schedule);
  return schedule;
}

Schedule zero_bubble_h1_schedule(int pipeline_stages, int micro_batches) {
  check_shape(pipeline_stages, micro_batches, 1);
  Schedule schedule =
      empty_schedule(ScheduleKind::kZeroBubbleH1, pipeline_stages, micro_batches, 1);
  // Note: 1F1B's order of forwards and backward-inputs, with pipeline stage s running the weight
  // gradient of micro-batch k only after the backward-input of micro-batch k + s, and the last
  // s + 1 weight gradients after its last backward. The later a pipeline stage, the sooner its
  // backward-inputs reach the first pipeline stage; their deferred W fill the time 1F1B leaves idle
  // waiting for them, and each pipeline stage holds at most p micro-batches (1F1B's first pipeline
  // stage's peak).
  for (int s = 0; s < pipeline_stages; ++s) {
    const int warm_up = std::min(pipeline_stages - s - 1, micro_batches);
    int forward = 0, backward = 0, weight = 0;
    const auto backward_then_weight = [&] {
      add(schedule, s, ActionKind::kBackwardInput, backward++);
      if (backward - 1 - weight >= s) add(schedule, s, ActionKind::kBackwardWeight, weight++);
    };
    while (forward < warm_up) add(schedule, s, ActionKind::kForward, forward++);
    while (forward < micro_batches) {
      add(schedule, s, ActionKind::kForward, forward++);
      backward_then_weight();
    }
    while (backward < micro_batches) backward_then_weight();
    while (weight < micro_batches) add(schedule, s, ActionKind::kBackwardWeight, weight++);
  }
  finish(schedule);
  return schedule;
}

Schedule make_schedule(ScheduleKind kind, int pipeline_stages, int micro_batches, int chunks) {
  if (kind != ScheduleKind::kInterleavedOneFOneB && chunks != 1) {
    throw Error(ErrorKind::kConfig,
                fmt::format("pipeline.virtual_chunks: {} chunks per pipeline stage need schedule "
                            "interleaved_1f1b, not {}",
                            chunks, schedule_kind_name(kind)));
  }
  switch (kind) {
    case ScheduleKind::kGPipe:
      return gpipe_schedule(pipeline_stages, micro_batches);
    case ScheduleKind::kOneFOneB:
      return one_f_one_b_schedule(pipeline_stages, micro_batches);
    case ScheduleKind::kInterleavedOneFOneB:
      return interleaved_schedule(pipeline_stages, micro_batches, chunks);
    case ScheduleKind::kZeroBubbleH1:
      return zero_bubble_h1_schedule(pipeline_stages, micro_batches);
  }
  throw Error(ErrorKind::kInternal, "make_schedule: unknown schedule kind");
}

}  // namespace zest
