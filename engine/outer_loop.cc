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

int outer_groups(int asked, int world_size, int ranks_per_node, int tensor_ranks) {
  if (asked == kOuterGroupsNode) {
    asked = world_size / std::max(1, ranks_per_node / std::max(1, tensor_ranks));
  }
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

std::unique_ptr<Communicator> split_across(RankContext& world, int groups, int size,
                                           const char* what = "outer loop's ranks") {
  const int place = world.rank % size;
  if (!runs_work(world.device)) {
    return std::make_unique<shape::ShapeCommunicator>(world.rank / size, groups);
  }
  return world.communicator.split(place, world.rank,
                                  fmt::format("{} at place {} of their groups", what, place));
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
  RankContext& world = groups_.world();
  // Held for the run, not a meeting, so that a plan of a few steps holds it too.
  scratch_ = world.allocator().allocate(largest * sizeof(float), Category::kBuckets);
  if (overlapped()) {
    for (ShardState& state : shards_) {
      state.pending = host.allocate(state.length * sizeof(float), Category::kOffload);
    }
    meeting_stream_ = world.device.create_stream("outer loop meeting");
    meeting_sent_ = world.device.create_event();
    meeting_across_ = split_across(world, groups_.groups(), world.world_size / groups_.groups(),
                                   "outer loop meetings' ranks");
  }
  if (options_.gradient_bits != 32) {
    quantized_ = std::make_unique<QuantizedReplicaMean>(
        world.device, meeting_across_ ? *meeting_across_ : groups_.across(), largest,
        inner_->options().quantization_block, options_.gradient_bits);
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

OuterLoop::~OuterLoop() {
  if (!meeting_stream_) return;
  try {
    meeting_stream_->synchronize();
  } catch (const std::exception&) {
    // Its error was raised at the landing, or the run is ending on another one.
  }
}

StepStats OuterLoop::step(float lr) {
  StepStats stats = inner_->step(lr);
  const std::int64_t steps = inner_->steps_taken();
  if (in_flight_ >= 0 && steps == lands_at_) land();
  for (int fragment = 0; fragment < options_.fragments; ++fragment) {
    if (meets(fragment, steps)) meet(fragment);
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
  world.synchronize();  // the inner step's parameters are final
  Stream& stream = overlapped() ? *meeting_stream_ : world.comm;
  for (std::size_t u = 0; u < shards_.size(); ++u) {
    if (fragment_of(u) != fragment) continue;
    float* outgoing = overlapped() ? shards_[u].pending.as<float>()
                                   : shards_.front().current.as<float>();
    send_outer_gradient(u, outgoing, stream);
    if (overlapped()) continue;
    stream.synchronize();
    land_unit(u, outgoing);
  }
  ++meetings_;
  if (!overlapped()) {
    inner_->state_loaded();
    return;
  }
  meeting_stream_->record(*meeting_sent_);
  in_flight_ = fragment;
  lands_at_ = inner_->steps_taken() + options_.overlap_steps;
}

void OuterLoop::send_outer_gradient(std::size_t unit, float* host, Stream& stream) {
  RankContext& world = groups_.world();
  ShardState& state = shards_[unit];
  const std::size_t bytes = state.length * sizeof(float);
  if (runs_work(world.device)) {
    const float* anchor = state.anchor.as<float>();
    read_state(world, master_of(unit), host);
    // This group's outer gradient: how far the shard moved since the last meeting, downhill.
    for (std::size_t i = 0; i < state.length; ++i) host[i] = anchor[i] - host[i];
  }
  float* device = scratch_.as<float>();
  world.device.copy(stream, device, host, bytes);
  if (quantized_) {
    quantized_->mean(stream, device, state.length, "outer loop's mean outer gradient");
  } else {
    Communicator& across = meeting_across_ ? *meeting_across_ : groups_.across();
    across.all_reduce(stream, device, device, state.length, DType::kFloat32, Reduction::kMean);
  }
  world.device.copy(stream, host, device, bytes);
}

void OuterLoop::land() {
  meeting_stream_->synchronize();  // raises the meeting's error, naming its stream
  groups_.world().synchronize();   // the inner step's parameters are final
  for (std::size_t u = 0; u < shards_.size(); ++u) {
    if (fragment_of(u) == in_flight_) land_unit(u, shards_[u].pending.as<float>());
  }
  inner_->state_loaded();
  in_flight_ = -1;
}

void OuterLoop::land_unit(std::size_t unit, const float* mean) {
  RankContext& world = groups_.world();
  if (!runs_work(world.device)) return;  // planning: nothing to compute
  ShardState& state = shards_[unit];
  float* anchor = state.anchor.as<float>();
  float* momentum = state.momentum.as<float>();
  // Nesterov (Sutskever et al.): m = mu m + g; x -= lr (g + mu m). Every group computes the same
  // bits from the same mean, anchor and momentum, so the groups agree again.
  const float mu = options_.momentum;
  for (std::size_t i = 0; i < state.length; ++i) {
    momentum[i] = mu * momentum[i] + mean[i];
    anchor[i] -= options_.lr * (mean[i] + mu * momentum[i]);
  }
  const StateShard master = master_of(unit);
  const float* parameters = anchor;
  if (overlapped()) {
    // The fragment trained on while its meeting was in flight: those steps are mixed in, not
    // lost (Streaming DiLoCo); the next outer gradient is taken from the outer step's values.
    float* local = shards_.front().current.as<float>();
    read_state(world, master, local);
    const float keep = options_.mixing;
    for (std::size_t i = 0; i < state.length; ++i) {
      local[i] = keep * local[i] + (1.0f - keep) * anchor[i];
    }
    parameters = local;
  }
  write_state(world, master, parameters);
  for (const StateShard& shard : inner_->state_shards(unit)) {
    if (shard.name != "params" || shard.dtype == DType::kFloat32) continue;
    // 2-byte training: the parameters are the master weights rounded, as the inner step makes
    // them.
    std::vector<unsigned char> rounded(state.length * dtype_size(shard.dtype));
    cpu::convert(parameters, DType::kFloat32, rounded.data(), shard.dtype, state.length);
    write_from_host(world.device, world.compute, shard.data, rounded.data(), rounded.size());
  }
}

void OuterLoop::set_counters(const TrainerCounters& counters) {
  inner_->set_counters(counters);
  // A meeting sent in the last overlap_steps steps before the save was in flight; its mean was
  // saved as "outer.pending".
  in_flight_ = -1;
  const std::int64_t steps = inner_->steps_taken();
  for (std::int64_t sent = steps; sent > steps - options_.overlap_steps && sent > 0; --sent) {
    for (int fragment = 0; fragment < options_.fragments; ++fragment) {
      if (!meets(fragment, sent)) continue;
      in_flight_ = fragment;
      lands_at_ = sent + options_.overlap_steps;
    }
  }
}

std::vector<StateShard> OuterLoop::state_shards(std::size_t unit) {
  if (in_flight_ >= 0) meeting_stream_->synchronize();  // the pending mean is whole
  std::vector<StateShard> shards = inner_->state_shards(unit);
  // Copied, not referenced: the push_backs below may move the vector's elements.
  const std::size_t begin = shards.front().begin;
  const std::size_t end = shards.front().end;
  shards.push_back({"outer.anchor", DType::kFloat32, shards_.at(unit).anchor.data(), begin, end});
  shards.push_back(
      {"outer.momentum", DType::kFloat32, shards_.at(unit).momentum.data(), begin, end});
  if (overlapped()) {
    shards.push_back(
        {"outer.pending", DType::kFloat32, shards_.at(unit).pending.data(), begin, end});
  }
  return shards;
}

void OuterLoop::state_loaded() {
  inner_->state_loaded();  // the anchor and the momentum were loaded into host memory
}

std::optional<CheckpointPlacement> OuterLoop::checkpoint_placement() const {
  // The inner trainer's says how its slices were cut under tensor parallelism; the groups are
  // this loop's replicas.
  CheckpointPlacement placement = inner_->checkpoint_placement().value_or(CheckpointPlacement{});
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
  placement.local_units.clear();
  for (std::size_t u = 0; u < placement.units.size(); ++u) placement.local_units.push_back(u);
  return placement;
}

MemoryPrediction OuterLoop::predicted_memory() const {
  MemoryPrediction prediction = inner_->predicted_memory();
  std::size_t largest = 0;
  const std::size_t copies = overlapped() ? 3 : 2;  // anchor, momentum (and pending)
  for (const ShardState& state : shards_) {
    prediction.offload += copies * state.length * sizeof(float);
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
  // With tensor parallelism this engine runs on one tensor index's data-parallel ranks.
  const Communicator* tensor = module.tensor_parallel_group();
  const int groups =
      outer_groups(options_.outer_loop.groups, context_.world_size,
                   context_.topology.ranks_per_node(), tensor ? tensor->world_size() : 1);
  if (!outer_) outer_ = std::make_shared<OuterGroups>(context_, groups);
  auto inner = std::make_unique<ZeroTrainer>(outer_->context(), options_, module,
                                             std::move(optimizer));
  return std::make_unique<OuterLoop>(*outer_, options_.outer_loop, std::move(inner));
}

}  // namespace zest
