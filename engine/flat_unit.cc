#include "engine/flat_unit.h"

namespace zest {

FlatUnit plan_flat_unit(Unit& unit, int index, const StagePlan& plan, int rank, int world_size,
                        std::size_t alignment) {
  FlatUnit flat;
  flat.unit = &unit;
  flat.index = index;
  flat.specs = unit.parameters();
  flat.borrowed = unit.borrowed_units();
  flat.gradients_replace_parameters = unit.gradients_replace_parameters();
  flat.borrows_in_turn = unit.borrows_in_turn();
  flat.backward_reads_parameters = unit.backward_reads_parameters();
  std::vector<ParamShape> shapes;
  for (const ParamSpec& spec : flat.specs) shapes.push_back({spec.name, spec.shape});
  flat.layout = ShardLayout::build(unit.name(), shapes, world_size, alignment);

  if (!plan.optimizer_sharded) {
    // DDP: every rank updates every parameter (padding is never touched).
    for (std::size_t i = 0; i < flat.specs.size(); ++i) {
      const ParamPlace& place = flat.layout.params()[i];
      flat.update_ranges.push_back(
          {place.offset, place.numel, flat.specs[i].weight_decay, flat.specs[i].norm_counted});
    }
  } else {
    const std::size_t shard_begin = flat.layout.shard_range(rank).begin;
    for (const ParamInShard& part : flat.layout.params_in_shard(rank)) {
      const ParamSpec& spec = flat.specs[part.param_index];
      flat.update_ranges.push_back({shard_begin + part.shard_offset, part.param_elements.size(),
                                    spec.weight_decay, spec.norm_counted});
    }
  }
  return flat;
}

}  // namespace zest
