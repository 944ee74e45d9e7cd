// Starting a model from weights made elsewhere: a safetensors file (checkpoint/safetensors.h) whose
// tensors carry the model's full parameter names ("<unit>.<name>", as zest-ckpt export writes
// them, or as tools/reference writes them for PyTorch parity). Each rank copies the elements of
// its own shard out of the file into the engine's parameters (and fp32 master weights, for
// 2-byte training); optimizer moments stay as they are (zero for a fresh trainer), so this
// starts training, it does not resume it (that is what checkpoints are for).
// Invariant: the file must hold exactly the model's parameters: a missing, extra or
// differently shaped tensor is a kData Error listing the first differences, raised on every
// rank (they agree before anything is written), and such a file leaves the trainer untouched.
#pragma once

#include <string>

#include "engine/engine.h"
#include "runtime/world.h"

namespace zest {

struct ImportResult {
  std::size_t tensors = 0;
  std::uint64_t parameters = 0;  // elements
};

// A collective: every rank calls it with the same path, between steps.
ImportResult import_parameters(RankContext& context, Trainer& trainer, const std::string& path);

}  // namespace zest
