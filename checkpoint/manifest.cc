// The manifest's layout arithmetic and names, and the manifest held against a model: its units
// described from shard layouts, a trainer's placement, the differences from another model.
// Reading and writing manifest.json: manifest_reading.cc, manifest_writing.cc.
#include "checkpoint/manifest.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "base/error.h"
#include "base/printable.h"

// Note: the build does not yet pass the project version to the sources; until it does
// (target_compile_definitions(zest PRIVATE ZEST_VERSION="${PROJECT_VERSION}")), this copy of
// CMakeLists.txt's project(VERSION) stands in.
#ifndef ZEST_VERSION
#define ZEST_VERSION "0.1.0"
#endif

namespace zest {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

std::uint64_t CheckpointManifest::block_offset(std::size_t unit, std::size_t tensor) const {
  const int part = unit < units.size() ? units[unit].pipeline_stage : 0;
  std::uint64_t offset = 0;
  for (std::size_t u = 0; u < units.size() && u <= unit; ++u) {
    if (units[u].pipeline_stage != part) continue;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      if (u == unit && t == tensor) return offset;
      offset += std::uint64_t{units[u].shard_length} * dtype_size(tensors[t].dtype);
    }
  }
  return offset;
}

std::uint64_t CheckpointManifest::rank_file_bytes(int part) const {
  std::uint64_t bytes = 0;
  for (const CheckpointUnit& unit : units) {
    if (unit.pipeline_stage != part) continue;
    for (const CheckpointTensor& tensor : tensors) {
      bytes += std::uint64_t{unit.shard_length} * dtype_size(tensor.dtype);
    }
  }
  return bytes;
}

int CheckpointManifest::find_tensor(const std::string& name) const {
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].name == name) return static_cast<int>(t);
  }
  return -1;
}

const char* zest_version() { return ZEST_VERSION; }

std::string rank_file_name(int rank) { return "rank-" + std::to_string(rank) + ".bin"; }

std::string step_directory_name(std::int64_t step) { return "step-" + std::to_string(step); }

std::int64_t parse_step_directory_name(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  if (name.size() - prefix.size() > 18) return -1;
  std::int64_t step = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::vector<CheckpointUnit> describe_units(const std::vector<ShardLayout>& layouts,
                                           const std::vector<int>& parts) {
  std::vector<CheckpointUnit> units;
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    const ShardLayout& layout = layouts[u];
    CheckpointUnit unit{
        layout.unit_name(), layout.numel(), layout.flat_length(), layout.shard_length(), {}};
    for (const ParamPlace& place : layout.params()) {
      unit.params.push_back({place.name, place.shape, place.offset, place.numel, {}});
    }
    unit.pipeline_stage = u < parts.size() ? parts[u] : 0;
    units.push_back(std::move(unit));
  }
  return units;
}

CheckpointPlacement placement_of(const Trainer& trainer, int rank, int world_size) {
  std::optional<CheckpointPlacement> given = trainer.checkpoint_placement();
  if (!given) {
    CheckpointPlacement plain;
    plain.shards = world_size;
    plain.shard = rank;
    plain.units = trainer.layouts();
    plain.unit_parts.assign(plain.units.size(), 0);
    for (std::size_t u = 0; u < plain.units.size(); ++u) plain.local_units.push_back(u);
    return plain;
  }
  const CheckpointPlacement& p = *given;
  bool fits =
      p.parts >= 1 && p.shards >= 1 && p.replicas >= 1 && p.replica >= 0 &&
      p.replica < p.replicas && p.tensor_ranks >= 1 && p.tensor_rank >= 0 &&
      p.tensor_rank < p.tensor_ranks &&
      p.parts * p.shards * p.replicas * p.tensor_ranks == world_size &&
      ((p.part * p.replicas + p.replica) * p.shards + p.shard) * p.tensor_ranks + p.tensor_rank ==
          rank &&
      p.unit_parts.size() == p.units.size() && p.local_units.size() == trainer.layouts().size() &&
      (p.tensor_ranks == 1 || p.slices.size() == p.units.size());
  for (std::size_t i = 0; fits && i < p.local_units.size(); ++i) {
    fits = p.local_units[i] < p.units.size() &&
           p.units[p.local_units[i]].unit_name() == trainer.layouts()[i].unit_name();
  }
  if (!fits) {
    throw Error(ErrorKind::kInternal,
                fmt::format("the trainer's checkpoint placement does not fit rank {} of {}", rank,
                            world_size));
  }
  return p;
}

std::vector<std::string> model_differences(const std::vector<CheckpointUnit>& checkpoint,
                                           const std::vector<ShardLayout>& model,
                                           std::size_t limit) {
  std::vector<std::string> lines;
  std::size_t total = 0;
  auto add = [&](std::string line) {
    if (total++ < limit) lines.push_back(std::move(line));
  };
  if (checkpoint.size() != model.size()) {
    add(fmt::format("the checkpoint has {} units, this model {}", checkpoint.size(), model.size()));
  }
  for (std::size_t u = 0; u < std::min(checkpoint.size(), model.size()); ++u) {
    const CheckpointUnit& saved = checkpoint[u];
    const ShardLayout& here = model[u];
    // Names from the checkpoint are the file's text: shown printable.
    const std::string unit = printable(saved.name);
    if (saved.name != here.unit_name()) {
      add(fmt::format("unit {}: '{}' in the checkpoint, '{}' here", u, unit, here.unit_name()));
      continue;
    }
    const auto& params = here.params();
    for (std::size_t p = 0; p < std::max(saved.params.size(), params.size()); ++p) {
      if (p >= params.size()) {
        add(fmt::format("{}.{}: in the checkpoint, not in this model", unit,
                        printable(saved.params[p].name)));
      } else if (p >= saved.params.size()) {
        add(fmt::format("{}.{}: in this model, not in the checkpoint", unit, params[p].name));
      } else if (saved.params[p].name != params[p].name) {
        add(fmt::format("{}: parameter {} is '{}' in the checkpoint, '{}' here", unit, p,
                        printable(saved.params[p].name), params[p].name));
      } else if (saved.params[p].shape != params[p].shape) {
        add(fmt::format("{}.{}: shape {} in the checkpoint, {} here", unit, params[p].name,
                        shape_text(saved.params[p].shape), shape_text(params[p].shape)));
      }
    }
  }
  if (total > limit) lines.push_back(fmt::format("and {} more", total - limit));
  return lines;
}

}  // namespace zest
