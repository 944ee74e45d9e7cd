#include "pipeline/schedule.h"

#include <fmt/format.h>

#include "base/error.h"

namespace zest {

namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                                   ScheduleKind::kInterleavedOneFOneB,
                                   ScheduleKind::kZeroBubbleH1};

}  // namespace

std::string describe_action(const Action& action, int chunks) {
  const std::string chunk = chunks > 1 ? fmt::format(" (chunk {})", action.chunk) : "";
  const auto of = [&](const char* what) {
    return fmt::format("{} of micro-batch {}{}", what, action.micro_batch, chunk);
  };
  switch (action.kind) {
    case ActionKind::kForward: return of("forward");
    case ActionKind::kBackward: return of("backward");
    case ActionKind::kBackwardInput: return of("backward-input");
    case ActionKind::kBackwardWeight: return of("backward-weight");
    case ActionKind::kSendActivations:
      return of("send activations") + fmt::format(" to pipeline stage {}", action.peer);
    case ActionKind::kReceiveActivations:
      return of("receive activations") + fmt::format(" from pipeline stage {}", action.peer);
    case ActionKind::kSendGradients:
      return of("send gradients") + fmt::format(" to pipeline stage {}", action.peer);
    case ActionKind::kReceiveGradients:
      return of("receive gradients") + fmt::format(" from pipeline stage {}", action.peer);
    case ActionKind::kReduce: return "reduce";
    case ActionKind::kStep: return "step";
  }
  return "?";
}

std::string_view schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleavedOneFOneB: return "interleaved_1f1b";
    case ScheduleKind::kZeroBubbleH1: return "zb_h1";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view name) {
  for (ScheduleKind kind : kKinds) {
    if (schedule_kind_name(kind) == name) return kind;
  }
  throw Error(ErrorKind::kConfig,
              fmt::format("pipeline.schedule: '{}' is not a schedule (allowed: gpipe, 1f1b, "
                          "interleaved_1f1b, zb_h1)",
                          name));
}

}  // namespace zest
