// --fit's layouts: each way to arrange a config's world.ranks as pipeline stages × tensor-parallel
// ranks × data-parallel ranks (p × t × d) that the model allows, planned as zest-estimate plans
// the config itself (the largest rank's device peak: with pipeline stages the largest stage's,
// with tensor parallelism the group's last rank), at the config's global batch, and the layout
// proposed for a device capacity: of those that fit, Megatron's order of growth — tensor-parallel
// ranks first, as long as a group stays inside a node (its per-layer collectives want a node's
// links), then pipeline stages (a bubble, and activations across nodes) — so the fewest pipeline
// stages, then the fewest tensor-parallel ranks, and the most data-parallel ranks. A layout the
// config cannot take (a size that does not divide the heads, a composition refused with tensor
// parallelism, a batch the data-parallel ranks cannot split) is left out.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zest {

struct LayoutFit {
  int pipeline_stages = 1;
  int tensor_parallel = 1;
  int data_parallel = 1;
  std::size_t peak = 0;  // the largest rank's device bytes
  bool fits = false;
  bool tensor_group_crosses_nodes = false;  // world.ranks_per_node does not hold a group
};

// `config`: the config file's JSON with the user's overrides applied (not yet parsed).
std::vector<LayoutFit> fit_layouts(const nlohmann::json& config, std::size_t capacity);

// The proposal among `layouts` (see above); none when nothing fits.
std::optional<LayoutFit> proposed_layout(const std::vector<LayoutFit>& layouts);

// For the text output: a table of the layouts and the proposal.
void print_layouts(const std::vector<LayoutFit>& layouts, std::size_t capacity, int ranks);
nlohmann::ordered_json layouts_json(const std::vector<LayoutFit>& layouts);

}  // namespace zest
