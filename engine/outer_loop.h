// DiLoCo's outer loop (Douillard et al., 2023) around the ZeRO trainer. The world's ranks form
// `groups` groups of consecutive ranks (a node each, by default); each group is a ZeRO run of its
// own — its own data, its own inner optimizer, collectives that stay inside the group — and the
// groups meet every `inner_steps` steps: each rank averages, with the ranks that hold the same
// shard in the other groups, how far its shard moved since the last meeting (the outer
// gradient), and every group takes the same outer step (SGD with Nesterov momentum) from the
// same anchor. So across groups only one shard-sized all-reduce crosses every H steps; with
// Streaming DiLoCo's fragments the units meet in runs, one run at a time, at staggered steps.
// Invariant: after a meeting every group holds the same parameters of the units that met, to
// the bit; between meetings they differ. The outer state (this rank's shard of the anchor and of the momentum, fp32) lives
// in host memory, as DiLoCo's reference implementations keep it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"

namespace zest {

// How many groups `asked` means in a world of `world_size` ranks on nodes of `ranks_per_node`
// (kOuterGroupsNode: one per node). A count that does not divide the world is a kConfig Error,
// one line naming outer_loop.groups.
int outer_groups(int asked, int world_size, int ranks_per_node);

// The world split into groups, and each rank's peers in the other groups (the ranks at the same
// place in theirs). Collective over the world: every rank makes it alike.
class OuterGroups {
 public:
  OuterGroups(RankContext& world, int groups);
  OuterGroups(const OuterGroups&) = delete;
  OuterGroups& operator=(const OuterGroups&) = delete;

  RankContext& context() { return context_; }  // the group's view of this rank
  const RankContext& context() const { return context_; }
  Communicator& across() { return *across_; }
  // This rank among the ranks at its place in every group, for host values (a loss).
  const RankContext& across_context() const { return across_context_; }
  int groups() const { return groups_; }
  int group() const { return group_; }
  RankContext& world() { return world_; }

 private:
  RankContext& world_;
  int groups_;
  int group_;
  std::unique_ptr<Communicator> inside_;
  std::unique_ptr<Communicator> across_;
  RankContext context_;
  RankContext across_context_;
};

class OuterLoop final : public Trainer {
 public:
  // `inner` runs in groups.context(). Reads the parameters as the first anchor.
  OuterLoop(OuterGroups& groups, const OuterLoopOptions& options, std::unique_ptr<Trainer> inner);

  float forward_backward(const Batch& batch) override { return inner_->forward_backward(batch); }
  // The inner step, then the meeting when inner_steps steps have passed since the last. The
  // loss is the mean over every group's ranks (one scalar all-reduce across groups).
  StepStats step(float lr) override;
  float evaluate(const Batch& batch) override;  // the mean over the groups' models
  std::vector<float> full_parameter(const std::string& name) override {
    return inner_->full_parameter(name);
  }
  std::vector<std::string> parameter_names() const override { return inner_->parameter_names(); }
  const std::vector<ShardLayout>& layouts() const override { return inner_->layouts(); }
  MemoryPrediction predicted_memory() const override;
  int stage() const override { return inner_->stage(); }
  std::int64_t steps_taken() const override { return inner_->steps_taken(); }
  const EngineOptions& options() const override { return inner_->options(); }
  // The inner state, "outer.anchor" and "outer.momentum". Note: only group 0 writes, so with
  // several groups a checkpoint taken between meetings resumes every group from group 0's
  // parameters and inner optimizer state.
  std::vector<StateShard> state_shards(std::size_t unit) override;
  void state_loaded() override;
  TrainerCounters counters() const override { return inner_->counters(); }
  void set_counters(const TrainerCounters& counters) override { inner_->set_counters(counters); }
  std::optional<CheckpointPlacement> checkpoint_placement() const override;
  std::size_t swap_bytes() const override { return inner_->swap_bytes(); }

  std::int64_t meetings() const { return meetings_; }

 private:
  struct ShardState {
    Buffer anchor;    // host, fp32: the parameters at the last meeting
    Buffer momentum;  // host, fp32
    Buffer current;   // host, fp32: the shard read at a meeting, then the outer gradient
    std::size_t length = 0;
  };
  // This rank's fp32 view of unit `unit`'s parameter shard: the master weights in 2-byte
  // training, the parameters in fp32.
  StateShard master_of(std::size_t unit);
  void read_anchors();
  // Which fragment unit `unit` is in, and whether fragment `fragment` meets after step `step`.
  int fragment_of(std::size_t unit) const;
  bool meets(int fragment, std::int64_t step) const;
  void meet(int fragment);
  void meet_unit(std::size_t unit, Buffer& scratch);
  float mean_across(float value);

  OuterGroups& groups_;
  OuterLoopOptions options_;
  std::unique_ptr<Trainer> inner_;
  std::vector<ShardState> shards_;
  std::int64_t meetings_ = 0;
};

}  // namespace zest
