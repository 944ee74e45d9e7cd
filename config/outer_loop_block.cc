// The `outer_loop` block (zest's own; DiLoCo, Douillard et al. 2023, engine/outer_loop.h): groups
// of ranks train on their own and meet every inner_steps steps for one outer Nesterov step.
// Absent, or "type": "none": synchronous training as without it, to the bit.
#include <algorithm>
#include <string>
#include <vector>

#include "config/blocks.h"

namespace zest::config_blocks {

using namespace config_reading;

namespace {

void parse_outer_optimizer(Block& outer, OuterLoopOptions& options) {
  Block block(outer.object_or_empty("outer_optimizer"), outer.path("outer_optimizer"),
              {"type", "lr", "momentum"});
  const std::string type = read_string(block.get_or("type", "nesterov"), block.path("type"));
  if (type != "nesterov") {
    config_error(block.path("type"), "must be \"nesterov\" (DiLoCo's outer optimizer), got \"" +
                                         type + "\"");
  }
  const double lr = read_float(block.get_or("lr", 0.7), block.path("lr"));
  if (!(lr > 0)) config_error(block.path("lr"), "must be a number > 0, got " + json(lr).dump());
  const double momentum = read_float(block.get_or("momentum", 0.9), block.path("momentum"));
  if (!(momentum >= 0 && momentum < 1)) {
    config_error(block.path("momentum"), "must be a number in [0, 1), got " + json(momentum).dump());
  }
  options.lr = static_cast<float>(lr);
  options.momentum = static_cast<float>(momentum);
}

void parse_groups(Block& block, const TrainConfig& out, OuterLoopOptions& options) {
  const json& groups = block.get_or("groups", "node");
  if (groups == "node") {
    options.groups = kOuterGroupsNode;
    return;
  }
  const std::int64_t count = read_integer_at_least(groups, block.path("groups"), 1);
  if (out.world.ranks % count != 0) {
    config_error(block.path("groups"),
                 std::to_string(count) + " groups do not divide world.ranks (" +
                     std::to_string(out.world.ranks) + "); groups must be equal");
  }
  options.groups = static_cast<int>(count);
}

// Streaming DiLoCo's overlap: a fragment's meeting lands before the next fragment's starts, so
// one meeting is in flight at a time (fragments start inner_steps / fragments steps apart, or
// one more).
void parse_overlap(Block& block, OuterLoopOptions& options) {
  const std::int64_t most = options.inner_steps / options.fragments;
  const std::int64_t overlap =
      read_integer_at_least(block.get_or("overlap_steps", 0), block.path("overlap_steps"), 0);
  if (overlap > most) {
    config_error(block.path("overlap_steps"),
                 "must be at most outer_loop.inner_steps / outer_loop.fragments (" +
                     std::to_string(most) + "), so that a fragment's meeting lands before the "
                     "next one starts, got " + std::to_string(overlap));
  }
  options.overlap_steps = static_cast<int>(overlap);
  const double mixing = read_float(block.get_or("mixing", 0.5), block.path("mixing"));
  if (!(mixing >= 0 && mixing <= 1)) {
    config_error(block.path("mixing"), "must be a number in [0, 1], got " + json(mixing).dump());
  }
  options.mixing = static_cast<float>(mixing);
}

}  // namespace

void parse_outer_loop(Block& root, TrainConfig& out) {
  json* value = root.find("outer_loop");
  if (value == nullptr) return;  // nothing printed, as without the block
  if (!value->is_object()) {
    config_error("outer_loop", "must be an object (e.g. {\"type\": \"diloco\"}), got " +
                                   describe(*value));
  }
  Block block(*value, "outer_loop",
              {"type", "inner_steps", "outer_optimizer", "groups", "fragments", "overlap_steps",
               "mixing", "gradient_bits"});
  const std::string type = read_string(block.get_or("type", "none"), block.path("type"));
  if (type == "none") return;
  if (type != "diloco") {
    config_error(block.path("type"), "must be \"none\" or \"diloco\", got \"" + type + "\"");
  }
  OuterLoopOptions& options = out.engine.outer_loop;
  options.inner_steps = static_cast<int>(std::min<std::int64_t>(
      read_integer_at_least(block.get_or("inner_steps", 500), block.path("inner_steps"), 1),
      1 << 30));
  parse_outer_optimizer(block, options);
  parse_groups(block, out, options);
  const std::int64_t fragments =
      read_integer_at_least(block.get_or("fragments", 1), block.path("fragments"), 1);
  if (fragments > options.inner_steps) {
    config_error(block.path("fragments"),
                 "must be at most outer_loop.inner_steps (" + std::to_string(options.inner_steps) +
                     "): each fragment meets at its own step of the period, got " +
                     std::to_string(fragments));
  }
  options.fragments = static_cast<int>(fragments);
  parse_overlap(block, options);
  const std::int64_t bits = read_integer_at_least(block.get_or("gradient_bits", 32),
                                                  block.path("gradient_bits"), 1);
  if (bits != 32 && bits != 8 && bits != 4) {
    config_error(block.path("gradient_bits"),
                 "must be 32 (fp32), 8 or 4 (qgZ's int8 or int4 blocks), got " +
                     std::to_string(bits));
  }
  options.gradient_bits = static_cast<int>(bits);
  if (out.pipeline.stages > 1) {
    config_error(block.path("type"),
                 "\"diloco\" with pipeline.stages > 1 is not supported: the outer loop groups "
                 "data-parallel ranks of one pipeline stage; leave the pipeline block out");
  }
  if (out.engine.hybrid_shard_size != 0) {
    config_error(block.path("groups"),
                 "outer_loop with zero_optimization.hybrid_shard_size: each group is already its "
                 "own shard group; remove hybrid_shard_size");
  }
}

}  // namespace zest::config_blocks
