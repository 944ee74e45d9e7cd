#include "engine/whole_parameter_gradients.h"

namespace zest {

void share_whole_parameter_gradients(RankContext& context, Communicator& tensor,
                                     std::vector<FlatUnit>& units, const StagePlan& plan,
                                     DType dtype) {
  const std::size_t element = dtype_size(dtype);
  for (FlatUnit& unit : units) {
    const std::size_t shard_begin = unit.layout.shard_range(context.rank).begin;
    // Full gradients (stage 1) hold the rank's shard at its place; sharded ones (2-3) only it.
    char* grads = static_cast<char*>(unit.grads.data()) +
                  (shard_begin - plan.grads_first(shard_begin)) * element;
    for (const ParamInShard& part : unit.layout.params_in_shard(context.rank)) {
      if (unit.specs[part.param_index].draw_slice.enabled()) continue;  // a slice: its own
      tensor.label_next("whole parameter's reduced gradient from the tensor-parallel group");
      tensor.broadcast(context.comm, grads + part.shard_offset * element,
                       part.param_elements.size(), dtype, 0);
    }
  }
}

}  // namespace zest
