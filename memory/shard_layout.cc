#include "memory/shard_layout.h"

#include <algorithm>

#include "base/error.h"
#include "memory/tensor.h"

namespace zest {

namespace {

std::size_t checked_numel(const std::string& unit_name, const ParamShape& param) {
  std::size_t numel = 1;
  for (std::int64_t dim : param.shape) {
    if (dim <= 0) {
      throw Error(ErrorKind::kUsage, "unit '" + unit_name + "': parameter '" + param.name +
                                         "' has a zero-size or negative dimension (shape " +
                                         shape_to_string(param.shape) + "); every dimension must be >= 1");
    }
    if (__builtin_mul_overflow(numel, static_cast<std::size_t>(dim), &numel)) {
      throw Error(ErrorKind::kUsage, "unit '" + unit_name + "': parameter '" + param.name +
                                         "' (shape " + shape_to_string(param.shape) +
                                         ") has more elements than fit in 64 bits");
    }
  }
  return numel;
}

}  // namespace

ShardLayout ShardLayout::build(const std::string& unit_name, const std::vector<ParamShape>& params,
                               int world_size, std::size_t alignment) {
  if (world_size < 1) {
    throw Error(ErrorKind::kUsage, "unit '" + unit_name + "': world size must be >= 1, got " +
                                       std::to_string(world_size));
  }
  if (alignment == 0) {
    throw Error(ErrorKind::kUsage, "unit '" + unit_name + "': shard alignment must be >= 1");
  }
  if (params.empty()) {
    throw Error(ErrorKind::kUsage,
                "unit '" + unit_name + "' has no parameters; a unit must declare at least one");
  }
  ShardLayout layout;
  layout.unit_name_ = unit_name;
  layout.world_size_ = world_size;
  layout.alignment_ = alignment;
  const auto too_large = [&] {
    return Error(ErrorKind::kUsage, "unit '" + unit_name + "': its flat buffer (" +
                                        std::to_string(params.size()) + " parameters, world size " +
                                        std::to_string(world_size) + ", alignment " +
                                        std::to_string(alignment) + ") exceeds 64 bits");
  };
  for (const ParamShape& param : params) {
    std::size_t numel = checked_numel(unit_name, param);
    layout.params_.push_back({param.name, param.shape, numel, layout.numel_});
    if (__builtin_add_overflow(layout.numel_, numel, &layout.numel_)) throw too_large();
  }
  // Pad to a multiple of world_size × alignment: equal shards (what reduce-scatter and
  // all-gather need) whose starts are all aligned.
  std::size_t quantum = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(world_size), alignment, &quantum) ||
      __builtin_mul_overflow(layout.numel_ / quantum + (layout.numel_ % quantum != 0), quantum,
                             &layout.flat_length_)) {
    throw too_large();
  }
  return layout;
}

ElementRange ShardLayout::shard_range(int rank) const {
  if (rank < 0 || rank >= world_size_) {
    throw Error(ErrorKind::kUsage, "unit '" + unit_name_ + "': rank " + std::to_string(rank) +
                                       " is outside world size " + std::to_string(world_size_));
  }
  const std::size_t length = shard_length();
  return {static_cast<std::size_t>(rank) * length, static_cast<std::size_t>(rank + 1) * length};
}

std::vector<ParamInShard> ShardLayout::params_in_shard(int rank) const {
  const ElementRange shard = shard_range(rank);
  std::vector<ParamInShard> result;
  // Parameters are sorted by offset, so the first one ending after the shard's start is the
  // first that overlaps it.
  auto first = std::upper_bound(params_.begin(), params_.end(), shard.begin,
                                [](std::size_t element, const ParamPlace& place) {
                                  return element < place.offset + place.numel;
                                });
  for (auto it = first; it != params_.end() && it->offset < shard.end; ++it) {
    const std::size_t begin = std::max(shard.begin, it->offset);
    const std::size_t end = std::min(shard.end, it->offset + it->numel);
    result.push_back({static_cast<std::size_t>(it - params_.begin()),
                      {begin - it->offset, end - it->offset},
                      begin - shard.begin});
  }
  return result;
}

}  // namespace zest
