#include "pipeline/measured_bubble.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "base/error.h"

namespace zest {

namespace {

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// Sums and counts of one kind of action.
struct Mean {
  double wall = 0.0, cpu = 0.0;
  int count = 0;
  double wall_mean() const { return count ? wall / count : 0.0; }
  double cpu_mean() const { return count ? cpu / count : 0.0; }
};

}  // namespace

bool is_pipeline_action(std::string_view slice_name) {
  return slice_name.find(" of micro-batch ") != std::string_view::npos &&
         (starts_with(slice_name, "forward") || starts_with(slice_name, "backward"));
}

MeasuredBubble measure_last_step_bubble(const std::vector<TraceRecorder::Slice>& slices,
                                        int steps) {
  if (steps < 1) {
    throw Error(ErrorKind::kUsage, "measure_last_step_bubble: steps must be >= 1, got " +
                                       std::to_string(steps));
  }
  std::map<int, std::vector<const TraceRecorder::Slice*>> by_rank;
  for (const TraceRecorder::Slice& slice : slices) {
    if (slice.track == "compute" && is_pipeline_action(slice.name)) {
      by_rank[slice.rank].push_back(&slice);
    }
  }
  if (by_rank.empty()) {
    throw Error(ErrorKind::kUsage, "measure_last_step_bubble: the trace has no pipeline action "
                                   "(was the trace set on the world before the trainer ran?)");
  }
  MeasuredBubble result;
  result.ranks = static_cast<int>(by_rank.size());
  std::int64_t begin = std::numeric_limits<std::int64_t>::max();
  std::int64_t end = std::numeric_limits<std::int64_t>::min();
  bool cpu_recorded = true;
  Mean forward, backward_input, backward_weight;
  double busy = 0.0, busy_cpu = 0.0;
  for (auto& [rank, actions] : by_rank) {
    if (actions.size() % static_cast<std::size_t>(steps) != 0) {
      throw Error(ErrorKind::kUsage,
                  "measure_last_step_bubble: rank " + std::to_string(rank) + " has " +
                      std::to_string(actions.size()) + " action slices, not a multiple of the " +
                      std::to_string(steps) + " steps");
    }
    std::sort(actions.begin(), actions.end(),
              [](const auto* x, const auto* y) { return x->begin_us < y->begin_us; });
    const std::size_t per_step = actions.size() / static_cast<std::size_t>(steps);
    for (std::size_t i = actions.size() - per_step; i < actions.size(); ++i) {
      const TraceRecorder::Slice& slice = *actions[i];
      begin = std::min(begin, slice.begin_us);
      end = std::max(end, slice.end_us);
      const auto wall = static_cast<double>(slice.end_us - slice.begin_us);
      const auto cpu = static_cast<double>(slice.cpu_us);
      cpu_recorded = cpu_recorded && slice.cpu_us >= 0;
      busy += wall;
      busy_cpu += cpu;
      Mean& kind = starts_with(slice.name, "forward")           ? forward
                   : starts_with(slice.name, "backward-weight") ? backward_weight
                                                                : backward_input;
      kind.wall += wall;
      kind.cpu += cpu;
      ++kind.count;
    }
  }
  result.makespan_us = static_cast<double>(end - begin);
  result.busy_us = busy;
  const double total = result.ranks * result.makespan_us;
  result.idle_fraction = total > 0 ? (total - busy) / total : 0.0;
  result.mean_wall_us = {forward.wall_mean(), backward_input.wall_mean(),
                         backward_weight.wall_mean(), 0.0};
  if (cpu_recorded) {
    result.busy_cpu_us = busy_cpu;
    result.cpu_idle_fraction = total > 0 ? (total - busy_cpu) / total : 0.0;
    result.mean_cpu_us = {forward.cpu_mean(), backward_input.cpu_mean(),
                          backward_weight.cpu_mean(), 0.0};
  }
  return result;
}

}  // namespace zest
