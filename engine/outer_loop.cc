#include "engine/outer_loop.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/error.h"
#include "engine/zero_trainer.h"
#include "kernels/convert.h"
#include "runtime/host_collectives.h"
#include "runtime/host_copies.h"
#include "runtime/shape_communicator.h"
#include "runtime/shape_device.h"

namespace zest {

int outer_groups(int asked, int world_size, int ranks_per_node) {
  if (asked == kOuterGroupsNode) asked = world_size / std::max(1, ranks_per_node);
  if (asked < 1 || world_size % asked != 0) {
    throw Error(ErrorKind::kConfig,
                fmt::format("outer_loop.groups: {} groups do not divide the {} ranks; groups must "
                            "be equal (a divisor of {})",
                            asked, world_size, world_size));
  }
  return asked;
}

namespace {

RankContext group_context(RankContext& world, Communicator& inside) {
  return RankContext{inside.rank(),  inside.world_size(), world.device,   world.compute,
                     world.comm,     world.prefetch,      inside,         world.trace,
                     world.topology, world.wire,          1,              world.rank_in_world()};
}

// The group this rank is in, and the ranks at its place in every group. Note: the shape-only
// communicator has no peers to split from; planning, the group's view is the same rank in
// communicators of the groups' sizes.
std::unique_ptr<Communicator> split_inside(RankContext& world, int group, int size) {
  if (!runs_work(world.device)) {
    return std::make_unique<shape::ShapeCommunicator>(world.rank % size, size);
  }
  return world.communicator.split(group, world.rank, fmt::format("outer loop group {}", group));
}

std::unique_ptr<Communicator> split_across(RankContext& world, int groups, int size) {
  const int place = world.rank % size;
  if (!runs_work(world.device)) {
    return std::make_unique<shape::ShapeCommunicator>(world.rank / size, groups);
  }
  return world.communicator.split(
      place, world.rank, fmt::format("outer loop's ranks at place {} of their groups", place));
}

// A state shard's fp32 elements to and from host memory, wherever the shard lives (device, host,
// or the NVMe tier, which moves them itself).
void read_state(RankContext& world, const StateShard& shard, float* host) {
  const std::size_t count = shard.end - shard.begin;
  if (shard.swap) return shard.swap(false, 0, count, host);
  read_to_host(world.device, world.compute, host, shard.data, count * sizeof(float));
}

void write_state(RankContext& world, const StateShard& shard, const float* host) {
  const std::size_t count = shard.end - shard.begin;
  if (shard.swap) return shard.swap(true, 0, count, const_cast<float*>(host));
  write_from_host(world.device, world.compute, shard.data, host, count * sizeof(float));
}

}  // namespace

OuterGroups::OuterGroups(RankContext& world, int groups)
    : world_(world),
      groups_(groups),
      group_(world.rank / (world.world_size / groups)),
      inside_(split_inside(world, group_, world.world_size / groups)),
      across_(split_across(world, groups, world.world_size / groups)),
      context_(group_context(world, *inside_)),
      across_context_(group_context(world, *across_)) {}

OuterLoop::OuterLoop(OuterGroups& groups, const OuterLoopOptions& options,
                     std::unique_ptr<Trainer> inner)
    : groups_(groups), options_(options), inner_(std::move(inner)) {
  const std::size_t units = inner_->layouts().size();
  if (static_cast<std::size_t>(options_.fragments) > units) {
    throw Error(ErrorKind::kConfig,
                fmt::format("outer_loop.fragments: {} fragments of a model of {} units; at most "
                            "one fragment a unit",
                            options_.fragments, units));
  }
  Allocator& host = groups_.world().device.host_allocator();
  std::size_t largest = 0;
  for (std::size_t u = 0; u < inner_->layouts().size(); ++u) {
    const StateShard master = master_of(u);
    ShardState state;
    state.length = master.end - master.begin;
    state.anchor = host.allocate(state.length * sizeof(float), Category::kOffload);
    state.momentum = host.allocate(state.length * sizeof(float), Category::kOffload);
    largest = std::max(largest, state.length);
    shards_.push_back(std::move(state));
  }
  // One host buffer for the shard being met, as long as the largest: units meet in turn.
  if (!shards_.empty()) {
    shards_.front().current = host.allocate(largest * sizeof(float), Category::kOffload);
  }
  read_anchors();
  if (runs_work(groups_.world().device)) {
    for (ShardState& state : shards_) std::memset(state.momentum.data(), 0, state.momentum.bytes());
  }
}

StateShard OuterLoop::master_of(std::size_t unit) {
  for (const StateShard& shard : inner_->state_shards(unit)) {
    if (shard.name == "master") return shard;
  }
  return inner_->state_shards(unit).front();  // "params", in fp32
}

void OuterLoop::read_anchors() {
  RankContext& world = groups_.world();
  if (!runs_work(world.device)) return;  // the shape-only device backs no host memory either
  for (std::size_t u = 0; u < shards_.size(); ++u) {
    read_state(world, master_of(u), shards_[u].anchor.as<float>());
  }
}

int OuterLoop::fragment_of(std::size_t unit) const {
  return static_cast<int>(unit * static_cast<std::size_t>(options_.fragments) / shards_.size());
}

bool OuterLoop::meets(int fragment, std::int64_t step) const {
  // Fragment f meets H (f + 1) / F steps into each period: evenly spread, the last at H.
  const std::int64_t offset =
      static_cast<std::int64_t>(options_.inner_steps) * (fragment + 1) / options_.fragments;
  return step >= offset && (step - offset) % options_.inner_steps == 0;
}

StepStats OuterLoop::step(float lr) {
  StepStats stats = inner_->step(lr);
  for (int fragment = 0; fragment < options_.fragments; ++fragment) {
    if (meets(fragment, inner_->steps_taken())) meet(fragment);
  }
  stats.loss = mean_across(stats.loss);
  return stats;
}

float OuterLoop::evaluate(const Batch& batch) { return mean_across(inner_->evaluate(batch)); }

float OuterLoop::mean_across(float value) {
  float mean = value;
  groups_.across().label_next("outer loop's mean over the groups");
  all_reduce_host(groups_.across_context(), &value, &mean, 1, DType::kFloat32, Reduction::kMean);
  return runs_work(groups_.world().device) ? mean : value;
}

void OuterLoop::meet(int fragment) {
  RankContext& world = groups_.world();
  world.synchronize();
  std::size_t largest = 0;
  for (const ShardState& state : shards_) largest = std::max(largest, state.length);
  // The outer gradient crosses between groups from device memory (NCCL reads nothing else).
  Buffer scratch = world.allocator().allocate(largest * sizeof(float), Category::kWorkspace);
  for (std::size_t u = 0; u < shards_.size(); ++u) {
    if (fragment_of(u) == fragment) meet_unit(u, scratch);
  }
  inner_->state_loaded();
  ++meetings_;
}

void OuterLoop::meet_unit(std::size_t unit, Buffer& scratch) {
  RankContext& world = groups_.world();
  ShardState& state = shards_[unit];
  if (!runs_work(world.device)) {  // planning: the collective's bytes and order only
    groups_.across().all_reduce(world.comm, scratch.data(), scratch.data(), state.length,
                                DType::kFloat32, Reduction::kMean);
    return;
  }
  float* current = shards_.front().current.as<float>();
  float* anchor = state.anchor.as<float>();
  float* momentum = state.momentum.as<float>();
  const std::size_t bytes = state.length * sizeof(float);
  const StateShard master = master_of(unit);
  read_state(world, master, current);
  // This group's outer gradient: how far the shard moved since the last meeting, downhill.
  for (std::size_t i = 0; i < state.length; ++i) current[i] = anchor[i] - current[i];
  write_from_host(world.device, world.comm, scratch.data(), current, bytes);
  groups_.across().all_reduce(world.comm, scratch.data(), scratch.data(), state.length,
                              DType::kFloat32, Reduction::kMean);
  read_to_host(world.device, world.comm, current, scratch.data(), bytes);
  // Nesterov (Sutskever et al.): m = mu m + g; x -= lr (g + mu m). Every group computes the same
  // bits from the same mean, anchor and momentum, so the groups agree again.
  const float mu = options_.momentum;
  for (std::size_t i = 0; i < state.length; ++i) {
    momentum[i] = mu * momentum[i] + current[i];
    anchor[i] -= options_.lr * (current[i] + mu * momentum[i]);
  }
  write_state(world, master, anchor);
  for (const StateShard& shard : inner_->state_shards(unit)) {
    if (shard.name != "params" || shard.dtype == DType::kFloat32) continue;
    // 2-byte training: the parameters are the master weights rounded, as the inner step makes
    // them.
    std::vector<unsigned char> rounded(state.length * dtype_size(shard.dtype));
    cpu::convert(anchor, DType::kFloat32, rounded.data(), shard.dtype, state.length);
    write_from_host(world.device, world.compute, shard.data, rounded.data(), rounded.size());
  }
}

std::vector<StateShard> OuterLoop::state_shards(std::size_t unit) {
  std::vector<StateShard> shards = inner_->state_shards(unit);
  const StateShard& first = shards.front();
  shards.push_back({"outer.anchor", DType::kFloat32, shards_.at(unit).anchor.data(),
                    first.begin, first.end});
  shards.push_back({"outer.momentum", DType::kFloat32, shards_.at(unit).momentum.data(),
                    first.begin, first.end});
  return shards;
}

void OuterLoop::state_loaded() {
  inner_->state_loaded();  // the anchor and the momentum were loaded into host memory
}

std::optional<CheckpointPlacement> OuterLoop::checkpoint_placement() const {
  CheckpointPlacement placement;
  const RankContext& group = groups_.context();
  placement.shards = group.world_size;
  placement.shard = group.rank;
  placement.replicas = groups_.groups();
  placement.replica = groups_.group();
  // Note: the groups' parameters and inner optimizer states differ between meetings, and their
  // optimizer states always: group 0's are the checkpoint, the others' are not compared.
  placement.replicas_agree = false;
  placement.units = inner_->layouts();
  placement.unit_parts.assign(placement.units.size(), 0);
  for (std::size_t u = 0; u < placement.units.size(); ++u) placement.local_units.push_back(u);
  return placement;
}

MemoryPrediction OuterLoop::predicted_memory() const {
  MemoryPrediction prediction = inner_->predicted_memory();
  std::size_t largest = 0;
  for (const ShardState& state : shards_) {
    prediction.offload += 2 * state.length * sizeof(float);
    largest = std::max(largest, state.length);
  }
  prediction.offload += largest * sizeof(float);
  return prediction;
}

std::unique_ptr<Trainer> Engine::shard_in_groups(Module& module,
                                                 std::unique_ptr<Optimizer> optimizer) {
  if (options_.hybrid_shard_size != 0) {
    throw Error(ErrorKind::kConfig,
                "outer_loop with zero_optimization.hybrid_shard_size: each outer-loop group is "
                "already its own shard group; remove hybrid_shard_size");
  }
  const int groups = outer_groups(options_.outer_loop.groups, context_.world_size,
                                  context_.topology.ranks_per_node());
  if (!outer_) outer_ = std::make_shared<OuterGroups>(context_, groups);
  auto inner = std::make_unique<ZeroTrainer>(outer_->context(), options_, module,
                                             std::move(optimizer));
  return std::make_unique<OuterLoop>(*outer_, options_.outer_loop, std::move(inner));
}

}  // namespace zest
