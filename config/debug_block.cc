// The `debug` block (zest's own): checks and faults for finding and testing failures, never for
// production runs. `check_collectives` turns on the collective-order check
// (runtime/checked_communicator.h); `collective_delay_ms` delays every collective (to widen race
// windows); `hold_frees` runs the CPU device's stream-ordered frees only when a wait proves
// them (the order the planner replays: runtime/cpu_stream.h); `fault` injects one fault on one
// rank at one step (engine/fault_injection.h).
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "config/blocks.h"
#include "models/registry.h"

namespace zest::config_blocks {

using namespace config_reading;

namespace {

constexpr int kMostStallSeconds = 86400;

void parse_fault(json& value, TrainConfig& out) {
  Block block(value, "debug.fault", {"kind", "rank", "step", "unit", "stall_seconds"});
  FaultInjection& fault = out.engine.fault;
  const std::vector<std::string> kinds = {"throw", "stall", "nan_gradient", "fail_allocation",
                                          "stall_nvme_write"};
  const std::string kind = read_string(block.require("kind", "one of " + one_of(kinds)),
                                       block.path("kind"));
  fault.kind = fault_kind_from_name(kind);
  if (fault.kind == FaultInjection::Kind::kNone) {
    config_error(block.path("kind"), "must be " + one_of(kinds) + ", got \"" + kind + "\"");
  }
  const std::int64_t rank = read_integer_at_least(block.get_or("rank", 0), block.path("rank"), 0);
  if (rank >= out.world.ranks) {
    config_error(block.path("rank"), "must be below world.ranks (" +
                                         std::to_string(out.world.ranks) + "), got " +
                                         std::to_string(rank));
  }
  fault.rank = static_cast<int>(rank);
  fault.step = read_integer_at_least(block.get_or("step", 1), block.path("step"), 1);
  if (fault.step > out.steps) {
    config_error(block.path("step"), "must be at most steps (" + std::to_string(out.steps) +
                                         "), got " + std::to_string(fault.step));
  }
  fault.unit = read_string(block.get_or("unit", ""), block.path("unit"));
  if (!fault.unit.empty()) {
    // From the registry, without declaring the model: the run declares it once, later.
    const std::vector<std::string> names = unit_names(out.model);
    if (std::find(names.begin(), names.end(), fault.unit) == names.end()) {
      config_error(block.path("unit"), "must name a unit of the model (" + one_of(names) +
                                           "), got \"" + fault.unit + "\"");
    }
  }
  fault.stall_seconds =
      read_number(block.get_or("stall_seconds", 0.0), block.path("stall_seconds"));
  // Note: a day outlasts any timeout worth testing; 1e300 s overflowed the sleep into none.
  if (!(fault.stall_seconds >= 0 && fault.stall_seconds <= kMostStallSeconds)) {
    config_error(block.path("stall_seconds"),
                 "must be a number of seconds from 0 to " + std::to_string(kMostStallSeconds) +
                     ", got " + block.find("stall_seconds")->dump());
  }
}

}  // namespace

void parse_debug(Block& root, TrainConfig& out) {
  json& value = root.object_or_empty("debug");
  Block block(value, "debug", {"check_collectives", "collective_delay_ms", "hold_frees",
                                       "fault"});
  if (const json* check = block.find("check_collectives")) {
    out.world.check_collectives = read_bool(*check, block.path("check_collectives"));
  }
  const std::int64_t delay = read_integer_at_least(block.get_or("collective_delay_ms", 0),
                                                   block.path("collective_delay_ms"), 0);
  // Every collective sleeps this long before it meets its peers: a delay of the timeout or more
  // makes every collective a stalled one (1e8 ms slept for days, deaf to the timeout).
  const std::int64_t timeout_ms = out.world.timeout.count();
  if (delay >= timeout_ms) {
    config_error(block.path("collective_delay_ms"),
                 "must be an integer of milliseconds from 0 to below world.timeout_s (" +
                     std::to_string(timeout_ms) + " ms), got " + std::to_string(delay));
  }
  out.world.collective_delay = std::chrono::milliseconds(delay);
  if (const json* hold = block.find("hold_frees")) {
    out.world.hold_frees = read_bool(*hold, block.path("hold_frees"));
  }
  if (json* fault = block.find("fault")) parse_fault(*fault, out);
}

}  // namespace zest::config_blocks
