// The bytes of a rank's state shards (Trainer::state_shards) over some of its units: the size
// of a checkpoint's rank file and of an asynchronous checkpoint's host snapshot
// (checkpoint/async_writer.h), which sizes its buffer with this function, as the memory planner
// (planner/peak_plan.h, planner/pipeline_plan.h) plans the snapshot with it. Invariant: the
// bytes that streaming those shards in full hands out, to the byte.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/engine.h"

namespace zest {

// `units` are layouts() indices. Call between steps: state_shards() drains the streams.
std::size_t state_bytes(Trainer& trainer, const std::vector<std::size_t>& units);

// The layouts() entries a rank's checkpoint file holds, in the whole model's order: its part's
// units, each once (a lent copy belongs to its lender's part). A kInternal Error when the rank
// does not hold every unit of its part.
std::vector<std::size_t> saved_units(const CheckpointPlacement& placement);

}  // namespace zest
