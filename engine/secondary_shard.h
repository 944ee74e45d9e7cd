// ZeRO++'s hpZ (zero_optimization.zero_hpz_partition_size) at stage 3: besides its shard of each
// unit over the whole data-parallel group (the primary partition), a rank keeps a secondary shard,
// 1/h of the unit, over a group of h consecutive ranks inside its node (category secondary). A
// unit's first gather after its parameters changed runs across the whole group, as without hpZ,
// and copies this rank's part of the gathered unit into its secondary shard; every later gather
// of the unit until they change again — its backward, a recomputation, the next micro-batches'
// forward — runs inside the node group from the secondary shards, so no parameter byte crosses
// nodes there. Invariant: a secondary shard is read only while fresh, that is after a gather
// since the parameters last changed (an applied step or a loaded checkpoint; a skipped step
// changes nothing, and the shards stay fresh as the gather ring's slots stay resident).
// With qwZ (ZeRO++'s qwZ + hpZ) the gather across the whole group is the quantized one, and the
// secondary shards keep its dequantized values, so every later gather of the unit yields them to
// the bit: forward and backward compute with the same weights, as with qwZ alone.
#pragma once

#include <memory>
#include <vector>

#include "engine/flat_unit.h"
#include "engine/quantized_collectives.h"
#include "runtime/world.h"

namespace zest {

// The secondary shard's group size hpZ uses, or 0 when it is off. `asked` is
// zero_hpz_partition_size: 1 (DeepSpeed's default) is off; anything above needs stage 3 and must
// divide a node's ranks (so it divides the world and every group lies inside one node). Any
// other value is a kConfig Error, one line naming the key.
int hpz_group_size(int asked, int stage, int world_size, int ranks_per_node);

class SecondaryShard {
 public:
  // Splits `context`'s communicator into groups of `size` consecutive ranks (collective: every
  // rank makes it alike). A kConfig Error, one line, when a group would span nodes (a pipeline's
  // data-parallel group, whose ranks are not consecutive in the world) or the rank is a hybrid
  // shard group's view (its gathers stay in the node already).
  SecondaryShard(RankContext& context, int size, DType dtype);
  SecondaryShard(const SecondaryShard&) = delete;
  SecondaryShard& operator=(const SecondaryShard&) = delete;

  // One secondary shard per unit, flat length / size elements (category secondary).
  void allocate(const std::vector<FlatUnit>& units);
  // Makes `unit`'s full flat parameters in `slot`, on `stream`: inside the node group from the
  // secondary shards when they are fresh, else across the whole group from the primary shards
  // (through `quantized`'s int8 blocks with qwZ), then keeps this rank's part of the result as
  // its secondary shard.
  void gather(const FlatUnit& unit, Stream& stream, void* slot,
              QuantizedGather* quantized = nullptr);
  // The parameters changed (or may have): the next gather of every unit crosses the whole group.
  void parameters_changed();

  int size() const { return size_; }
  // For tests: how many units' secondary shards are fresh now.
  std::size_t fresh_units() const;

 private:
  RankContext& context_;
  int size_;
  DType dtype_;
  std::unique_ptr<Communicator> group_;
  std::vector<Buffer> shards_;  // per unit
  std::vector<bool> fresh_;     // per unit
};

}  // namespace zest
