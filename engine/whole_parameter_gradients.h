// qgZ under tensor parallelism: the parameters every rank of a tensor-parallel group holds whole
// (LayerNorms, the row-parallel biases, the position table) have the same gradient on every rank
// of the group, but each rank quantizes its own flat units, whose blocks mix those parameters with
// its slices, so their reduced gradients come back different by the quantization's error and the
// copies would drift apart step by step. After the step's reductions the group's first rank's
// reduced gradient of each whole parameter is broadcast to the others, which makes the copies
// take the same update again (one broadcast per whole parameter in the rank's shard: small).
#pragma once

#include <vector>

#include "engine/flat_unit.h"
#include "engine/stage_plan.h"
#include "runtime/communicator.h"
#include "runtime/world.h"

namespace zest {

// Comm stream, after the step's last reduction: every whole (not sliced: ParamSpec::draw_slice
// off) parameter's reduced gradient in this rank's shard of `units` becomes the group's first
// rank's. A collective over `tensor`: every rank of it calls it with the same units.
void share_whole_parameter_gradients(RankContext& context, Communicator& tensor,
                                     std::vector<FlatUnit>& units, const StagePlan& plan,
                                     DType dtype);

}  // namespace zest
