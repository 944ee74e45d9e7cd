#include "engine/secondary_shard.h"

#include <fmt/format.h>

#include "base/error.h"
#include "engine/stage_plan.h"

namespace zest {
namespace {

constexpr const char* kKey = "zero_optimization.zero_hpz_partition_size";

[[noreturn]] void refuse(const std::string& message) {
  throw Error(ErrorKind::kConfig, fmt::format("{}: {}", kKey, message));
}

}  // namespace

int hpz_group_size(int asked, int stage, int world_size, int ranks_per_node) {
  if (asked == 1) return 0;
  if (asked < 1) refuse(fmt::format("must be 1 (off) or a number of ranks, got {}", asked));
  const StagePlan plan = StagePlan::of(stage);
  if (!plan.serves(StageFeature::kSecondaryShard)) {
    refuse(fmt::format("{} {}; set it to 1 (off) or raise the stage", asked,
                       plan.refusal(StageFeature::kSecondaryShard)));
  }
  if (ranks_per_node < 1 || ranks_per_node > world_size) ranks_per_node = world_size;
  if (ranks_per_node % asked != 0) {
    refuse(fmt::format("{} does not divide the {} ranks of a node (world.ranks_per_node {}, "
                       "world.ranks {}); a secondary shard's group lies inside one node",
                       asked, ranks_per_node, ranks_per_node, world_size));
  }
  return asked;
}

SecondaryShard::SecondaryShard(RankContext& context, int size, DType dtype)
    : context_(context), size_(size), dtype_(dtype) {
  if (context.replicas > 1) {
    refuse(fmt::format("{} with zero_optimization.hybrid_shard_size: a hybrid shard group's "
                       "gathers stay inside its node already; set one of them off",
                       size));
  }
  Communicator& world = context.communicator;
  if (world.world_size() % size != 0) {
    refuse(fmt::format("{} does not divide the {} data-parallel ranks", size, world.world_size()));
  }
  const int groups = world.world_size() / size;
  // Note: every rank checks every group, so that all refuse alike before the split (which is
  // collective: a rank that went on to it alone would wait out the timeout).
  for (int g = 0; g < groups; ++g) {
    std::vector<int> members;
    for (int r = g * size; r < (g + 1) * size; ++r) members.push_back(world.world_rank_of(r));
    if (context.topology.nodes_spanned(members) != 1) {
      refuse(fmt::format("{}: the group of data-parallel ranks {}..{} (world ranks {}..{}) spans "
                         "nodes; a secondary shard's group lies inside one node",
                         size, g * size, (g + 1) * size - 1, members.front(), members.back()));
    }
  }
  const int group = world.rank() / size;
  group_ = world.split(group, world.rank() % size,
                       fmt::format("hpZ group {} (ranks {}..{})", group,
                                   world.world_rank_of(group * size),
                                   world.world_rank_of((group + 1) * size - 1)));
}

void SecondaryShard::allocate(const std::vector<FlatUnit>& units) {
  for (const FlatUnit& unit : units) {
    shards_.push_back(context_.allocator().allocate(
        unit.layout.flat_length() / static_cast<std::size_t>(size_) * dtype_size(dtype_),
        Category::kSecondary));
  }
  fresh_.assign(units.size(), false);
}

void SecondaryShard::gather(const FlatUnit& unit, Stream& stream, void* slot,
                                QuantizedGather* quantized) {
  const auto index = static_cast<std::size_t>(unit.index);
  const std::size_t part = unit.layout.flat_length() / static_cast<std::size_t>(size_);
  Buffer& shard = shards_.at(index);
  if (fresh_[index]) {
    // Note: unquantized even with qwZ: the shards hold the dequantized values of the unit's
    // quantized gather, and an exact copy of them is what keeps backward on forward's weights
    // (quantizing them again, in blocks cut at other places, would move every value by up to
    // half a scale); the bytes stay inside the node, where the link is the fast one.
    group_->label_next(("gather " + unit.layout.unit_name() + " (secondary)").c_str());
    group_->all_gather(stream, shard.data(), slot, part, dtype_);
    return;
  }
  Communicator& world = context_.communicator;
  world.label_next(("gather " + unit.layout.unit_name()).c_str());
  if (quantized) {
    quantized->all_gather(world, stream, unit.layout, unit.params.data(), slot, dtype_);
  } else {
    world.all_gather(stream, unit.params.data(), slot, unit.layout.shard_length(), dtype_);
  }
  // Part r of the gathered unit is what rank r of the node group holds; the group's all-gather
  // lays the parts out in its rank order, which is this one (split by rank % size).
  const std::size_t mine = static_cast<std::size_t>(group_->rank()) * part * dtype_size(dtype_);
  context_.device.copy(stream, shard.data(), static_cast<const char*>(slot) + mine, shard.bytes());
  fresh_[index] = true;
}

void SecondaryShard::parameters_changed() { fresh_.assign(fresh_.size(), false); }

std::size_t SecondaryShard::fresh_units() const {
  std::size_t count = 0;
  for (bool fresh : fresh_) count += fresh ? 1 : 0;
  return count;
}

}  // namespace zest
