// DiLoCo's outer loop (Douillard et al., 2023) around the ZeRO trainer. The world's ranks form
// `groups` groups of consecutive ranks (a node each, by default); each group is a ZeRO run of its
// own — its own data, its own inner optimizer, collectives that stay inside the group — and the
// groups meet every `inner_steps` steps: each rank averages, with the ranks that hold the same
// shard in the other groups, how far its shard moved since the last meeting (the outer
// gradient), and every group takes the same outer step (SGD with Nesterov momentum) from the
// same anchor. So across groups only one shard-sized all-reduce crosses every H steps; with
// Streaming DiLoCo's fragments the units meet in runs, one run at a time, at staggered steps,
// and with its overlap a meeting's collective runs on a stream of its own beside the next
// overlap_steps inner steps, its mean landing after them (mixed with what the fragment learned
// meanwhile). The mean crosses in fp32 or in qgZ's int8 / int4 blocks (gradient_bits).
// Invariant: after a meeting every group holds the same parameters of the units that met, to
// the bit (with overlap and mixing < 1: to the outer step's values, each plus its own share of
// what it learned while the meeting was in flight); between meetings they differ. The outer state (this rank's shard of the anchor and of the momentum, fp32) lives
// in host memory, as DiLoCo's reference implementations keep it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/quantized_replicas.h"

namespace zest {

// How many groups `asked` means in a world of `world_size` ranks on nodes of `ranks_per_node`
// (kOuterGroupsNode: one per node). With `tensor_ranks` > 1 the world is one tensor index's
// data-parallel ranks, of which a node holds ranks_per_node / tensor_ranks (the tensor index
// varies fastest, runtime/device_mesh.h). A count that does not divide the world is a kConfig
// Error, one line naming outer_loop.groups.
int outer_groups(int asked, int world_size, int ranks_per_node, int tensor_ranks = 1);

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
  // Waits for a meeting still in flight (its collective reads this loop's buffers).
  ~OuterLoop() override;

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
  // The inner state, "outer.anchor" and "outer.momentum", and with overlap_steps
  // "outer.pending" (a meeting in flight: its mean outer gradient, waited for here). Note: only
  // group 0 writes, so with several groups a checkpoint taken between meetings resumes every
  // group from group 0's parameters and inner optimizer state.
  std::vector<StateShard> state_shards(std::size_t unit) override;
  void state_loaded() override;
  // The inner trainer's state, and this loop's own, change only in step() after the inner
  // trainer's update, which waits for the readers.
  void hold_state_for(std::shared_ptr<Event> readers) override {
    inner_->hold_state_for(std::move(readers));
  }
  TrainerCounters counters() const override { return inner_->counters(); }
  // The step count tells which meeting was in flight at the save, if any: it lands when it would
  // have.
  void set_counters(const TrainerCounters& counters) override;
  std::optional<CheckpointPlacement> checkpoint_placement() const override;
  std::size_t swap_bytes() const override { return inner_->swap_bytes(); }
  SwapTraffic swap_traffic() const override { return inner_->swap_traffic(); }

  std::int64_t meetings() const { return meetings_; }

 private:
  struct ShardState {
    Buffer anchor;    // host, fp32: the parameters at the last meeting
    Buffer momentum;  // host, fp32
    Buffer current;   // host, fp32 (the first unit's only): a shard read at a meeting
    Buffer pending;   // host, fp32, overlap_steps > 0: the outer gradient sent, then its mean
    std::size_t length = 0;
  };
  // This rank's fp32 view of unit `unit`'s parameter shard: the master weights in 2-byte
  // training, the parameters in fp32.
  StateShard master_of(std::size_t unit);
  void read_anchors();
  // Which fragment unit `unit` is in, and whether fragment `fragment` meets after step `step`.
  int fragment_of(std::size_t unit) const;
  bool meets(int fragment, std::int64_t step) const;
  bool overlapped() const { return options_.overlap_steps > 0; }
  // A meeting: every unit of the fragment sends its outer gradient and receives the groups'
  // mean; it lands at once, or overlap_steps steps later.
  void meet(int fragment);
  // Enqueues on `stream`: the outer gradient in `host` to the device, its mean across the
  // groups, back into `host`.
  void send_outer_gradient(std::size_t unit, float* host, Stream& stream);
  void land();
  // The outer step of `unit` from its groups' mean outer gradient `mean`.
  void land_unit(std::size_t unit, const float* mean);
  float mean_across(float value);

  OuterGroups& groups_;
  OuterLoopOptions options_;
  std::unique_ptr<Trainer> inner_;
  std::vector<ShardState> shards_;
  std::int64_t meetings_ = 0;
  // The outer gradient crosses between groups from device memory (NCCL reads nothing else).
  Buffer scratch_;
  // With overlap_steps: the meetings' own stream, and their own communicator across the
  // groups (the per-step loss mean uses the other while a meeting is in flight).
  std::unique_ptr<Stream> meeting_stream_;
  std::unique_ptr<Event> meeting_sent_;
  std::unique_ptr<Communicator> meeting_across_;
  std::unique_ptr<QuantizedReplicaMean> quantized_;  // gradient_bits 8 or 4
  int in_flight_ = -1;  // the fragment whose meeting lands at step lands_at_
  std::int64_t lands_at_ = 0;
};

}  // namespace zest
