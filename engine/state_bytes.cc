#include "engine/state_bytes.h"

#include <algorithm>
#include <string>

#include "base/dtype.h"
#include "base/error.h"

namespace zest {

std::size_t state_bytes(Trainer& trainer, const std::vector<std::size_t>& units) {
  std::size_t bytes = 0;
  for (std::size_t unit : units) {
    for (const StateShard& shard : trainer.state_shards(unit)) {
      bytes += (shard.end - shard.begin) * dtype_size(shard.dtype);
    }
  }
  return bytes;
}

std::vector<std::size_t> saved_units(const CheckpointPlacement& placement) {
  std::vector<std::size_t> saved;
  for (std::size_t i = 0; i < placement.local_units.size(); ++i) {
    if (placement.unit_parts[placement.local_units[i]] == placement.part) saved.push_back(i);
  }
  std::sort(saved.begin(), saved.end(), [&](std::size_t a, std::size_t b) {
    return placement.local_units[a] < placement.local_units[b];
  });
  const auto part_units = static_cast<std::size_t>(
      std::count(placement.unit_parts.begin(), placement.unit_parts.end(), placement.part));
  if (saved.size() != part_units) {
    throw Error(ErrorKind::kInternal,
                "pipeline stage " + std::to_string(placement.part) + " holds " +
                    std::to_string(saved.size()) + " of its " + std::to_string(part_units) +
                    " units");
  }
  return saved;
}

}  // namespace zest
