// DeepSpeed's `activation_checkpointing` block, with zest's own choice of policy and units
// (engine/recompute.h). DeepSpeed's keys are acted on where they mean something here
// (cpu_checkpointing) and refused with the reason where they do not. The resolved config shows
// the units the policy recomputes (`recomputed`, resolve/recomputed_units.h), which the config
// accepts and never reads.
#include <algorithm>
#include <string>
#include <vector>

#include "config/blocks.h"
#include "engine/recompute.h"

namespace zest::config_blocks {

using namespace config_reading;

namespace {

// A DeepSpeed key zest does not act on: accepted at its default, refused otherwise with why.
void refuse_unless_default(Block& block, const std::string& key, const json& fallback,
                           const std::string& why) {
  const json& value = block.get_or(key, fallback);
  if (value != fallback) {
    config_error(block.path(key), "is not supported (got " + value.dump() + "): " + why);
  }
}

}  // namespace

void parse_activation_checkpointing(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("activation_checkpointing"), "activation_checkpointing",
              {"policy", "units", "cpu_checkpointing", "partition_activations",
               "contiguous_memory_optimization", "number_checkpoints",
               "synchronize_checkpoint_boundary", "profile", "recomputed"});
  ActivationCheckpointing& options = out.engine.activation_checkpointing;
  const std::vector<std::pair<std::string, RecomputePolicy>> policies = {
      {"none", RecomputePolicy::kNone},
      {"selective", RecomputePolicy::kSelective},
      {"full", RecomputePolicy::kFull}};
  const std::string policy = read_string(block.get_or("policy", "none"), block.path("policy"));
  auto found = std::find_if(policies.begin(), policies.end(),
                            [&](const auto& entry) { return entry.first == policy; });
  if (found == policies.end()) {
    config_error(block.path("policy"), "must be none, selective or full, got \"" + policy + "\"");
  }
  options.policy = found->second;

  Block units(block.object_or_empty("units"), block.path("units"), {"every", "first"});
  options.every = static_cast<std::size_t>(
      read_integer_at_least(units.get_or("every", 1), units.path("every"), 1));
  options.first = static_cast<std::size_t>(
      read_integer_at_least(units.get_or("first", 0), units.path("first"), 0));

  options.cpu_checkpointing =
      read_bool(block.get_or("cpu_checkpointing", false), block.path("cpu_checkpointing"));
  if (options.cpu_checkpointing && !options.enabled()) {
    config_error(block.path("cpu_checkpointing"),
                 "true needs activation_checkpointing.policy \"full\" or \"selective\": only a "
                 "recomputed unit's input is a checkpoint to offload");
  }
  refuse_unless_default(block, "partition_activations", false,
                        "it splits checkpoints across tensor-parallel replicas, and zest's ranks "
                        "are data-parallel: each holds its own micro-batch's activations");
  refuse_unless_default(block, "contiguous_memory_optimization", false,
                        "each checkpoint is already one buffer of the device arena (DeepSpeed "
                        "needs it with partition_activations)");
  refuse_unless_default(block, "number_checkpoints", nullptr,
                        "it sizes DeepSpeed's contiguous buffer; choose the recomputed units "
                        "with activation_checkpointing.units");
  refuse_unless_default(block, "synchronize_checkpoint_boundary", false,
                        "zest orders recomputation with its streams; a host synchronization "
                        "at each boundary would only serialize them");
  refuse_unless_default(block, "profile", false,
                        "recomputation appears as `recompute <unit>` slices in the timeline "
                        "(log.trace)");
}

}  // namespace zest::config_blocks
