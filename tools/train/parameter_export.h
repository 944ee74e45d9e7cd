// zest-train --export-initial: every parameter, whole, as one safetensors file written by world
// rank 0 — the file zest-ckpt export writes from a checkpoint of the same model. With tensor
// parallelism each rank holds its slices: they are gathered over the tensor-parallel group and
// put back where the tensor-parallel-1 model holds them (checkpoint/tensor_split.h), so the file
// is the same at every size.
#pragma once

#include <string>

#include "engine/engine.h"
#include "runtime/communicator.h"
#include "runtime/world.h"

namespace zest {

// A collective over every rank of the world (`context`); `tensor_group` is the rank's
// tensor-parallel group, or null without tensor parallelism.
void export_parameters(RankContext& context, Trainer& trainer, const std::string& path,
                       Communicator* tensor_group);

}  // namespace zest
