// The memory table (docs/architecture.md) as arithmetic: the model-state bytes one rank holds for a
// model's units at any stage and world size, padding included (the flat layout pads each unit to a
// multiple of world size × alignment). The engine reports it beside what the allocator measures,
// and an out-of-memory while the model state is allocated uses it to say what would fit.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "memory/shard_layout.h"
#include "engine/engine.h"
#include "engine/module.h"

namespace zest {

struct UnitShapes {
  std::string name;
  std::vector<ParamShape> params;
  std::vector<int> borrowed;  // Unit::borrowed_units(): whose gathers and buckets it also holds
  bool gradients_replace_parameters = false;  // Unit::gradients_replace_parameters()
  bool borrows_in_turn = false;                // Unit::borrows_in_turn()
  bool backward_reads_parameters = true;       // Unit::backward_reads_parameters()
};

struct ModelStateShape {
  std::vector<UnitShapes> units;
  DType compute_dtype = DType::kFloat32;
  std::size_t optimizer_states = 2;  // AdamW: 2 moments; SGD with momentum: 1
  std::size_t alignment = kDefaultShardAlignment;
};

// The units' shapes of `module`, without allocating anything (units only declare them).
ModelStateShape describe_model_state(Module& module, DType compute_dtype,
                                     std::size_t optimizer_states,
                                     std::size_t alignment = kDefaultShardAlignment);

// The bytes per rank of params, grads and optimizer state (with the fp32 master of 2-byte
// compute counted as optimizer, as the table's K = 12 does). With the optimizer offloaded the
// device holds no optimizer state and `offload` (host) the fp32 master shard (in fp32 compute
// too: the host's copy to update), the states and the transfer shard in the compute dtype. With
// the parameters offloaded (stage 3) their shards are `host_params` and `params` is 0.
MemoryPrediction predict_model_state(const ModelStateShape& model, int stage, int world_size,
                                     bool offload_optimizer = false, bool offload_param = false);
// The same with offload_param's options: with "nvme" the shards on NVMe are `nvme` (and
// `nvme_params`) instead of `host_params`, which holds the host buffers they move through
// (engine/swapped_parameters.h lays them out).
MemoryPrediction predict_model_state(const ModelStateShape& model, int stage, int world_size,
                                     bool offload_optimizer,
                                     const OffloadParamOptions& offload_param);

// For an out-of-memory while allocating the model state: what this configuration needs per rank
// and the smallest change that fits `capacity` (a higher stage first, then offload_optimizer,
// then more ranks at stage 3), as one sentence for the error message.
std::string model_state_advice(const ModelStateShape& model, int stage, int world_size,
                               std::size_t capacity, bool offload_optimizer = false);

}  // namespace zest
