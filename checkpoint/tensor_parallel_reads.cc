#include "checkpoint/tensor_parallel_reads.h"

#include <algorithm>
#include <cstring>

namespace zest {

bool crosses_tensor_parallel(const CheckpointManifest& manifest,
                             const CheckpointPlacement& placement) {
  return manifest.tensor_parallel_size != placement.tensor_ranks;
}

std::vector<CheckpointUnit> whole_units(const CheckpointManifest& manifest) {
  std::vector<CheckpointUnit> units = manifest.units;
  for (CheckpointUnit& unit : units) {
    for (CheckpointParam& param : unit.params) {
      param.shape = whole_shape(param.shape, param.split, manifest.tensor_parallel_size);
      param.split = {};
    }
  }
  return units;
}

std::vector<TensorSplit> tensor_splits(const CheckpointPlacement& placement, std::size_t unit) {
  const ShardLayout& layout = placement.units.at(unit);
  std::vector<TensorSplit> splits(layout.params().size());
  if (placement.tensor_ranks == 1) return splits;
  for (std::size_t p = 0; p < splits.size(); ++p) {
    const ParamPlace& place = layout.params()[p];
    splits[p] = split_of(placement.slices.at(unit).at(p), place.shape, placement.tensor_rank,
                         placement.tensor_ranks, layout.unit_name() + "." + place.name);
  }
  return splits;
}

std::vector<ShardLayout> whole_layouts(const CheckpointPlacement& placement) {
  std::vector<ShardLayout> layouts;
  for (std::size_t u = 0; u < placement.units.size(); ++u) {
    const ShardLayout& layout = placement.units[u];
    const std::vector<TensorSplit> splits = tensor_splits(placement, u);
    std::vector<ParamShape> shapes;
    for (std::size_t p = 0; p < layout.params().size(); ++p) {
      const ParamPlace& place = layout.params()[p];
      shapes.push_back({place.name, whole_shape(place.shape, splits[p], placement.tensor_ranks)});
    }
    layouts.push_back(ShardLayout::build(layout.unit_name(), shapes, 1));
  }
  return layouts;
}

TensorParallelReader::TensorParallelReader(const CheckpointSource& source,
                                           const CheckpointPlacement& placement)
    : source_(source), placement_(placement) {
  for (std::size_t u = 0; u < placement.units.size(); ++u) {
    splits_.push_back(tensor_splits(placement, u));
  }
}

void TensorParallelReader::verify_once(std::size_t unit, std::size_t first, std::size_t end,
                                       int tensor_rank) {
  for (int file : source_.ranks_holding(unit, first, end, tensor_rank)) {
    if (verified_.insert(file).second) source_.verify(file);
  }
}

void TensorParallelReader::read(std::size_t unit, std::size_t tensor, std::size_t begin,
                                std::size_t end, void* out, DType type) {
  const std::size_t size = dtype_size(type);
  char* bytes = static_cast<char*>(out);
  std::memset(bytes, 0, (end - begin) * size);  // padding: zero in every float type
  const ShardLayout& layout = placement_.units.at(unit);
  const CheckpointUnit& saved_unit = source_.manifest().units.at(unit);
  const int saved_ranks = source_.manifest().tensor_parallel_size;
  for (std::size_t p = 0; p < layout.params().size(); ++p) {
    const ParamPlace& place = layout.params()[p];
    const std::size_t first = std::max(begin, place.offset);
    const std::size_t last = std::min(end, place.offset + place.numel);
    if (first >= last) continue;
    const SplitParameter here{place.shape, splits_[unit][p], placement_.tensor_ranks};
    const CheckpointParam& saved = saved_unit.params.at(p);
    const SplitParameter there{saved.shape, saved.split, saved_ranks};
    char* param_out = bytes + (first - begin) * size;
    here.for_each_whole_run(
        placement_.tensor_rank, first - place.offset, last - first,
        [&](std::size_t offset, std::int64_t row, std::int64_t column, std::size_t count) {
          there.for_each_part_run(
              row, column, count,
              [&](std::size_t within, int rank, std::size_t element, std::size_t run) {
                const std::size_t from = saved.offset + element;
                verify_once(unit, from, from + run, rank);
                source_.read(unit, tensor, from, from + run, param_out + (offset + within) * size,
                             type, rank);
              });
        });
  }
}

}  // namespace zest
