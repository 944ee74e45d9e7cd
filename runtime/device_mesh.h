// The device mesh: `world.ranks` = pipeline stages × data-parallel ranks × tensor-parallel ranks,
// and where each rank sits in it. Rank order (Megatron's): the tensor-parallel index varies
// fastest, then the data-parallel index, so rank = (pipeline stage × D + index) × T + tensor and
// the ranks of one tensor-parallel group are consecutive — its per-layer collectives stay inside a
// node. Without tensor parallelism (T = 1) the ranks of one data-parallel group are consecutive.
// Note: a data-parallel group carries the heavy traffic — every step's reduction of a pipeline
// stage's gradients, and at ZeRO-3 a gather of its parameters per micro-batch — while a pipeline
// group moves one micro-batch's activations between neighbours; launchers number a node's processes
// consecutively, so this order keeps the collectives inside a node and sends only activations
// across nodes. A plain value: it checks its shape and computes, nothing more.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace zest {

struct MeshCoordinate {
  int pipeline_stage = 0;
  int data_parallel_index = 0;
  int tensor_parallel_index = 0;
  bool operator==(const MeshCoordinate&) const = default;
};

class DeviceMesh {
 public:
  // `world_size` ranks in `pipeline_stages` pipeline stages. A kConfig Error, one line naming
  // pipeline.stages and world.ranks, when either is < 1 or the pipeline stages do not divide the
  // ranks. With `tensor_parallel_size` ranks per tensor-parallel group: a kConfig Error naming
  // tensor_parallel.size, pipeline.stages and world.ranks when the product of the two does not
  // divide the ranks.
  DeviceMesh(int world_size, int pipeline_stages, int tensor_parallel_size = 1);

  int world_size() const { return pipeline_stages_ * data_parallel_size_ * tensor_parallel_size_; }
  int pipeline_stages() const { return pipeline_stages_; }
  int data_parallel_size() const { return data_parallel_size_; }
  int tensor_parallel_size() const { return tensor_parallel_size_; }

  MeshCoordinate coordinate(int rank) const;
  int rank_of(MeshCoordinate coordinate) const;

  // The ranks of pipeline stage `pipeline_stage`'s data-parallel group of tensor-parallel index
  // `tensor`, by data-parallel index: the ranks that hold the same slice of the same units.
  std::vector<int> data_parallel_group(int pipeline_stage, int tensor = 0) const;
  // The ranks holding data-parallel index `index` (and tensor-parallel index `tensor`) at every
  // pipeline stage, by pipeline stage: the ranks one micro-batch's activations pass through.
  std::vector<int> pipeline_group(int index, int tensor = 0) const;
  // The ranks of pipeline stage `pipeline_stage` and data-parallel index `index`, by
  // tensor-parallel index: the ranks that split each of the pipeline stage's layers between them.
  std::vector<int> tensor_parallel_group(int pipeline_stage, int index) const;

  // `rank`'s neighbours in its pipeline group: the rank of the pipeline stage before (it sends this
  // rank activations) and after (it sends this rank gradients); none at the ends.
  std::optional<int> previous_stage_rank(int rank) const;
  std::optional<int> next_stage_rank(int rank) const;

  // The groups' names in errors: "data-parallel group of pipeline stage 1 (ranks 2, 3)",
  // "pipeline group of data-parallel index 0 (ranks 0, 2)", "tensor-parallel group of pipeline
  // stage 0, data-parallel index 1 (ranks 2, 3)"; with T > 1 the first two name the tensor index.
  std::string data_parallel_group_name(int pipeline_stage, int tensor = 0) const;
  std::string pipeline_group_name(int index, int tensor = 0) const;
  std::string tensor_parallel_group_name(int pipeline_stage, int index) const;

 private:
  void check_rank(int rank) const;

  int pipeline_stages_ = 1;
  int data_parallel_size_ = 1;
  int tensor_parallel_size_ = 1;
};

// "0, 1, 2": ranks as errors list them; past 16, "0, 1, ..., 15 and 4080 more".
std::string rank_list_text(const std::vector<int>& ranks);

}  // namespace zest
