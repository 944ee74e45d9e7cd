// The shape of one training job as the memory planner reads it (planner/peak_plan.h): the
// model's units, their per-micro-batch memory, the engine's options and the world. The engine
// builds one when a micro-batch runs out of memory and hands it to the injected
// EngineOptions::out_of_memory_advice; it never includes the planner itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/engine.h"
#include "engine/model_state.h"
#include "engine/unit_memory.h"
#include "runtime/device.h"

namespace zest {

struct PeakPlanInput {
  ModelStateShape model;         // units' parameter shapes and borrowed units
  std::vector<UnitMemory> units;  // per unit, one micro-batch; empty: no activations / workspace
  EngineOptions engine;          // stage, dtypes, offload, ring and bucket sizes, accumulation
  // The ranks each unit is sharded over (a hybrid shard group's; an outer loop group's, with
  // engine.outer_loop.groups a count of such groups).
  int world_size = 1;
  int replicas = 1;    // hybrid sharding: how many shard groups hold the same shards
  // Tensor parallelism: the ranks of the group the model's layers are split across
  // (Module::tensor_parallel_group); `model` and `units` are then one rank's slices and
  // world_size counts the data-parallel ranks that hold the same slices.
  int tensor_parallel_size = 1;
  // Params, grads, optimizer and offload only (a bare parameter count has no units to gather,
  // reduce or run).
  bool model_state_only = false;
  // The device the rank trains on. CUDA adds what the CPU device does not have: the compute
  // stream's scratch (UnitMemory::*_stream_scratch), the batch copied in (batch_bytes), and
  // device memory freed when the free is enqueued (the stream-ordered pool's accounting).
  DeviceKind device = DeviceKind::kCpu;
  // A micro-batch's inputs and targets, which a CUDA device copies in (activations) for the
  // micro-batch; linear in its rows. Ignored on the CPU device, which reads them in place.
  std::size_t batch_bytes = 0;
  // The program waits for the comm stream after each step (zest-train does: its stop check is a
  // collective), which also proves the step's optimizer ran and frees its scratch before the
  // next forward. A bare loop of forward_backward and step does not.
  bool synchronize_between_steps = false;
  // Per unit, what it recomputes; empty: plan_recompute(engine.activation_checkpointing) over
  // these units. A pipeline stage's plan takes the whole model's plan for its units.
  std::vector<RecomputePolicy> recompute;
  // The host snapshot buffers an asynchronous checkpoint holds (checkpoint.async; 0, 1 or 2:
  // checkpoint/async_writer.h's snapshot_buffers), each the state of the units the rank saves.
  int snapshots = 0;
};

// The units' memory at another micro-batch (rows per rank); empty when unknown.
using MicroBatchMemory = std::function<std::vector<UnitMemory>(std::int64_t micro_batch)>;

// A micro-batch that ran out of device memory while training, as the advice hook sees it.
struct TrainingMemory {
  PeakPlanInput input;         // the job at the micro-batch that overflowed
  std::size_t capacity = 0;    // the device's capacity, bytes
  std::int64_t micro_batch = 0;  // rows per rank of input.units
  MicroBatchMemory resize;     // the units' memory at another micro-batch
};

}  // namespace zest
