// Loading across tensor-parallel sizes: a rank's shard filled from a checkpoint whose tensor ranks
// cut the parameters otherwise (TP 2 saved, TP 1 or 4 loading; checkpoint/tensor_split.h). Each
// element is read through its place in the whole parameter, so any size loads any other; the
// data-parallel shards on either side are flat ranges, as for every other checkpoint
// (checkpoint/source.h).
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/source.h"
#include "engine/engine.h"

namespace zest {

// Whether loading `manifest` into `placement` needs the whole-parameter path: the tensor-parallel
// sizes differ. (At the same size, tensor rank r's part is the saved rank r's, read as flat
// ranges.)
bool crosses_tensor_parallel(const CheckpointManifest& manifest,
                             const CheckpointPlacement& placement);

// The model's units at their whole shapes, as the tensor-parallel-1 model has them; for
// model_differences, which then compares models of any tensor-parallel size.
std::vector<CheckpointUnit> whole_units(const CheckpointManifest& manifest);
std::vector<ShardLayout> whole_layouts(const CheckpointPlacement& placement);

// How this rank's tensor-parallel slices of the placement's unit `unit` are cut, per parameter.
std::vector<TensorSplit> tensor_splits(const CheckpointPlacement& placement, std::size_t unit);

class TensorParallelReader {
 public:
  // Both outlive the reader; the manifest's units are the placement's, in order (check that with
  // the whole forms above first).
  TensorParallelReader(const CheckpointSource& source, const CheckpointPlacement& placement);

  // Fills flat elements [begin, end) of the placement's unit `unit` (this rank's part; padding
  // zero) from saved tensor `tensor`, converted to `type`. Verifies each file before its first
  // read.
  void read(std::size_t unit, std::size_t tensor, std::size_t begin, std::size_t end, void* out,
            DType type);

 private:
  void verify_once(std::size_t unit, std::size_t first, std::size_t end, int tensor_rank);

  const CheckpointSource& source_;
  const CheckpointPlacement& placement_;
  std::vector<std::vector<TensorSplit>> splits_;  // per unit, per parameter: this rank's rule
  std::set<int> verified_;
};

}  // namespace zest
