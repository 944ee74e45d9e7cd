// The device mesh: `world.ranks` = pipeline stages × data-parallel ranks, and where each rank
// sits in it. Rank order: the data-parallel index varies fastest, so rank = stage × D + index
// and the ranks of one data-parallel group are consecutive (Megatron's default order, with no
// tensor parallelism). Note: a data-parallel group carries the heavy traffic — every step's
// reduction of a pipeline stage's gradients, and at ZeRO-3 a gather of its parameters per
// micro-batch — while a pipeline group moves one micro-batch's activations between neighbours;
// launchers number a node's processes consecutively, so this order keeps the collectives inside
// a node and sends only activations across nodes. A plain value: it checks its shape and
// computes, nothing more.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace zest {

struct MeshCoordinate {
  int pipeline_stage = 0;
  int data_parallel_index = 0;
  bool operator==(const MeshCoordinate&) const = default;
};

class DeviceMesh {
 public:
  // `world_size` ranks in `pipeline_stages` pipeline stages. A kConfig Error, one line naming
  // pipeline.stages and world.ranks, when either is < 1 or the stages do not divide the ranks.
  DeviceMesh(int world_size, int pipeline_stages);

  int world_size() const { return pipeline_stages_ * data_parallel_size_; }
  int pipeline_stages() const { return pipeline_stages_; }
  int data_parallel_size() const { return data_parallel_size_; }

  MeshCoordinate coordinate(int rank) const;
  int rank_of(MeshCoordinate coordinate) const;

  // The ranks of pipeline stage `stage`'s data-parallel group, by data-parallel index.
  std::vector<int> data_parallel_group(int stage) const;
  // The ranks holding data-parallel index `index` at every pipeline stage, by stage: the ranks
  // one micro-batch's activations pass through.
  std::vector<int> pipeline_group(int index) const;

  // `rank`'s neighbours in its pipeline group: the rank of the stage before (it sends this rank
  // activations) and after (it sends this rank gradients); none at the ends.
  std::optional<int> previous_stage_rank(int rank) const;
  std::optional<int> next_stage_rank(int rank) const;

  // The groups' names in errors: "data-parallel group of pipeline stage 1 (ranks 2, 3)",
  // "pipeline group of data-parallel index 0 (ranks 0, 2)".
  std::string data_parallel_group_name(int stage) const;
  std::string pipeline_group_name(int index) const;

 private:
  void check_rank(int rank) const;

  int pipeline_stages_ = 1;
  int data_parallel_size_ = 1;
};

// "0, 1, 2": ranks as errors list them; past 16, "0, 1, ..., 15 and 4080 more".
std::string rank_list_text(const std::vector<int>& ranks);

}  // namespace zest
