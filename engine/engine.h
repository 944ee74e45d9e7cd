// The ZeRO engine. One Engine per rank; Engine::shard() lays a Module's units out in flat
// buffers, shards them across the world and returns the Trainer that runs steps. The stage
// decides what is sharded and nothing else changes in user code:
//   0: nothing (DDP: gradients all-reduced);   1: optimizer state;
//   2: + gradients (reduce-scattered per unit right after its backward);
//   3: + parameters (gathered before a unit's forward and backward, unpinned after each).
// Engine owns only its options; the Trainer it returns owns the model state
// (engine/zero_trainer.h). Invariant: every rank calls the same Trainer methods in the same order
// (they run collectives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "memory/allocator.h"
#include "memory/shard_layout.h"
#include "memory/swap_store.h"
#include "engine/fault_injection.h"
#include "optim/loss_scaler.h"
#include "engine/module.h"
#include "engine/recompute.h"
#include "optim/optimizer.h"
#include "runtime/world.h"

namespace zest {

// zero_optimization.offload_optimizer (DeepSpeed's key): where the optimizer's fp32 state lives.
// With kCpu, each rank's master weights and moments live in host memory (category `offload` of
// Device::host_allocator), its gradient shard is copied there in backward, the optimizer runs on
// the host, and the updated parameter shard is copied back. Stages 1-3 only. With kNvme the master
// weights and moments live in swap files under nvme_path (memory/swap_store.h) instead, a
// sub-group at a time streaming through buffer_count host buffers (engine/swapped_state.h).
enum class OffloadDevice { kNone, kCpu, kNvme };

struct OffloadOptions {
  OffloadDevice device = OffloadDevice::kNone;
  // Page-locked host buffers. Recorded only: the CUDA device's host arena is always page-locked
  // (its copies are asynchronous only then), the CPU device's is ordinary memory.
  bool pin_memory = false;
  std::string nvme_path;          // kNvme: the folder the rank's swap folder is made under
  std::size_t buffer_count = 4;   // kNvme: host buffers, one sub-group's state each
  // kNvme: the moments start as the zeros a preallocated file reads as, unwritten; false writes
  // them at start (DeepSpeed's fast_init skips the initial swap-out the same way).
  bool fast_init = false;
  // zero_optimization.sub_group_size: the most elements of a unit's shard updated as one piece
  // (kNvme: read, updated and written back together).
  std::size_t sub_group_size = 1000000000;
  bool enabled() const { return device != OffloadDevice::kNone; }
  bool on_nvme() const { return device == OffloadDevice::kNvme; }
};

// zero_optimization.offload_param (DeepSpeed's key; stage 3 only): where a rank's parameter
// shards live between their uses. With kCpu each unit's shard lives in host memory (category
// params of Device::host_allocator) instead of the device's; stage 3's gather copies it into its
// place in the unit's ring slot on the prefetch stream before the all-gather (so the fetch runs
// as far ahead as the ring's prefetch does), and the optimizer step writes the updated shard
// back to the host. Results are bit-identical to parameters on the device.
struct OffloadParamOptions {
  OffloadDevice device = OffloadDevice::kNone;
  // The NVMe tier's keys (DeepSpeed's meanings), read and checked; used only with "nvme".
  std::string nvme_path;
  std::size_t buffer_count = 5;            // host buffers parameters stream through
  std::size_t buffer_size = 100000000;     // elements per buffer
  std::size_t max_in_cpu = 1000000000;     // parameter elements kept in host memory
  bool pin_memory = false;  // recorded only, as OffloadOptions::pin_memory
  bool enabled() const { return device != OffloadDevice::kNone; }
};

struct TrainingMemory;  // engine/job_shape.h

// Advice appended to an out-of-memory while training: given the job at the micro-batch that
// overflowed, one sentence saying what would fit. Note: the engine never includes the planner
// (docs/architecture.md, "Floors"), so the planner's advice is injected here
// (planner/memory_advice.h: training_memory_advice; resolve/resolved_config.h sets it). Empty: the
// error says what ran out and nothing more.
using OutOfMemoryAdvice = std::function<std::string(const TrainingMemory&)>;

inline constexpr int kHybridShardNode = -1;  // EngineOptions::hybrid_shard_size: one node
inline constexpr int kOuterGroupsNode = -1;  // OuterLoopOptions::groups: one group per node

// The outer loop across groups of ranks (engine/outer_loop.h; DiLoCo, Douillard et al. 2023):
// each group trains on its own for `inner_steps` steps, then the groups average how far their
// parameters moved and take one outer step with Nesterov momentum. groups 0: off.
struct OuterLoopOptions {
  int groups = 0;          // groups of consecutive ranks; kOuterGroupsNode: one per node
  int inner_steps = 500;   // H: optimizer steps between two meetings of the groups
  float lr = 0.7f;         // the outer optimizer's learning rate (DiLoCo's)
  float momentum = 0.9f;   // its Nesterov momentum (DiLoCo's)
  // Streaming DiLoCo's fragments: the units in this many runs, each meeting every inner_steps
  // steps at its own offset, so one fragment crosses at a time. 1: the whole model meets.
  int fragments = 1;
  // Streaming DiLoCo's overlap (Douillard et al., 2025): a fragment's mean outer gradient lands
  // overlap_steps inner steps after it was sent, its collective running beside them, and the
  // fragment becomes mixing x its local parameters + (1 - mixing) x the outer step's. 0: the
  // meeting holds the step that starts it (DiLoCo's); at most inner_steps / fragments.
  int overlap_steps = 0;
  float mixing = 0.5f;
  // The bits a value of the outer gradient crosses between groups with: 32 (fp32), or 8 or 4
  // (qgZ's int8 / int4 blocks of quantization_block values, engine/quantized_replicas.h).
  int gradient_bits = 32;
  bool enabled() const { return groups != 0; }
};

struct EngineOptions {
  int stage = 0;                    // zero_optimization.stage
  std::uint64_t seed = 1234;        // parameter initialization
  float gradient_clipping = 0.0f;   // global-norm clip; 0 = off
  int gradient_accumulation_steps = 1;  // micro-batches per step
  std::size_t shard_alignment = kDefaultShardAlignment;  // elements
  // Communication overlap (DeepSpeed's zero_optimization keys). With overlap_comm false every
  // collective waits for the compute before it and compute waits for it: the serialized
  // schedule, for comparison and debugging. Results are bit-identical either way.
  bool overlap_comm = true;
  // Stages 0-1: units' gradients are reduced together once this many elements have been
  // produced by backward (whole units; DeepSpeed's default 5e8 means once, at the end, for most
  // models). Stages 2-3 reduce each unit as its backward ends: only shards may outlive it.
  std::size_t reduce_bucket_size = 500000000;
  // Stage 3: the ring holds enough units to gather this many elements ahead of compute, but
  // never fewer than two sets (a unit with its borrowed units, computing and being gathered).
  std::size_t stage3_prefetch_bucket_size = 0;
  std::size_t gather_slots = 2;     // stage 3: the minimum ring size, in units
  // Stage 3: at most this many gathered parameter elements live at once (the ring's slots times
  // the largest unit); 0 = no limit. Below two sets of units the gathers can no longer run
  // ahead of compute; below one set (a unit and the units it borrows) it is a kConfig Error.
  std::size_t stage3_max_live_parameters = 0;
  // The dtype parameters and gradients are stored in (bf16.enabled / fp16.enabled). With a
  // 2-byte type the optimizer keeps fp32 master weights; on the CPU device units still compute
  // in fp32 (the engine hands them fp32 copies and folds their fp32 gradients back).
  DType compute_dtype = DType::kFloat32;
  // The dtype gradients are reduced in (communication_data_type); 2-byte reductions accumulate
  // in fp32.
  DType communication_dtype = DType::kFloat32;
  LossScaleOptions loss_scale;  // fp16 only
  OffloadOptions offload_optimizer;
  // DeepSpeed's aio block: how the NVMe tier reads and writes (path unused: each offload has its
  // own nvme_path).
  SwapOptions aio;
  OffloadParamOptions offload_param;  // stage 3 only
  // Which units recompute their activations before backward, and whether their kept inputs
  // wait in host memory (engine/recompute.h). Results are bit-identical with or without.
  ActivationCheckpointing activation_checkpointing;
  // Per unit of the trainer's module, what it recomputes; empty: plan_recompute over its units.
  // Note: a pipeline chunk takes the whole model's plan for its units (pipeline_trainer.cc), as
  // the planner does (planner/pipeline_plan.cc): a chunk's last unit may recompute (its backward
  // waits for later pipeline stages), and a chunk that none of whose units can recompute (the
  // embedding alone) recomputes nothing rather than failing.
  std::vector<RecomputePolicy> recompute_plan;
  // zero_optimization.hybrid_shard_size (engine/hybrid_shards.h): shard over groups of this many
  // consecutive ranks and replicate across the groups. 0 or the world size: plain ZeRO;
  // kHybridShardNode: a node's ranks (RankContext::topology).
  int hybrid_shard_size = 0;
  OuterLoopOptions outer_loop;  // off unless outer_loop.type is "diloco"
  // ZeRO++'s quantized collectives (engine/quantized_collectives.h), in int8 blocks of
  // quantization_block elements with an fp32 scale each: stage 3's parameter gathers (qwZ,
  // zero_optimization.zero_quantized_weights) and the gradient reduce-scatter of stages 1-3
  // (qgZ, zero_quantized_gradients; accumulated in fp32, communication_dtype unused), whose
  // blocks are int8 or int4 (quantized_gradient_bits, 8 or 4; ZeRO++ sends int4).
  bool quantized_weights = false;
  bool quantized_gradients = false;
  std::size_t quantization_block = 256;  // zero_optimization.zero_quantized_block_size
  int quantized_gradient_bits = 8;       // zero_optimization.zero_quantized_gradients_bits
  // zero_optimization.zero_hpz_partition_size (ZeRO++'s hpZ, engine/secondary_shard.h):
  // stage 3 keeps a secondary shard of each unit over groups of this many consecutive ranks
  // inside a node, and gathers from it after a unit's first gather of a step, so backward's
  // gathers stay inside the node. 1: off.
  int hpz_group_size = 1;
  FaultInjection fault;         // debug: none unless a test or debug.fault asks
  OutOfMemoryAdvice out_of_memory_advice;
};

struct StepStats {
  std::int64_t step = 0;    // optimizer steps taken so far
  float loss = 0.0f;        // mean over the global batch (all micro-batches, all ranks)
  float grad_norm = 0.0f;   // global L2 norm of the mean gradient, before clipping
  float lr = 0.0f;
  bool skipped = false;     // fp16: gradients overflowed on some rank; nothing was updated
  float loss_scale = 1.0f;  // the scale this step's gradients were computed with
};

// Model-state bytes per rank predicted from the memory table (docs/architecture.md) for this stage
// and dtype, in the same categories the allocator measures (padding included, since it is real
// memory). The fp32 master weights of 2-byte training count as `optimizer`, as the table's K = 12
// does. With the optimizer offloaded, `optimizer` is 0 and `offload` holds what the host arena
// keeps instead: the fp32 master shard (in fp32 too), the moments and the transfer shard (compute
// dtype).
struct MemoryPrediction {
  std::size_t params = 0;
  std::size_t grads = 0;
  std::size_t optimizer = 0;
  std::size_t offload = 0;  // host memory, not the device's: not in total()
  // the NVMe tier's swap files (offload_optimizer and offload_param "nvme"): no memory
  std::size_t nvme = 0;
  std::size_t nvme_params = 0;  // of which offload_param's (the rest are the optimizer's)
  // offload_param: the parameter shards, in host memory (then `params` is 0; with "nvme" the
  // host buffers they stream through, and the shards kept under max_in_cpu); not in total()
  std::size_t host_params = 0;
  std::size_t total() const { return params + grads + optimizer; }
  std::size_t host_total() const { return offload + host_params; }
};

class Trainer;
class HybridShards;  // engine/hybrid_shards.h
class OuterGroups;   // engine/outer_loop.h

// One of a rank's state tensors for one unit, as a view into the engine's buffers: the rank's
// shard, elements [begin, end) of the unit's flat buffer (padding included).
struct StateShard {
  std::string name;  // "params" (compute dtype), "master" (fp32; 2-byte compute only),
                     // "optimizer.0", "optimizer.1", ... (fp32; the optimizer's states in order)
  DType dtype = DType::kFloat32;
  void* data = nullptr;  // view; valid while the Trainer lives
  std::size_t begin = 0;
  std::size_t end = 0;
  // Set, and `data` null, where the shard is in no memory (the NVMe tier): moves its elements
  // [first, first + count) from (write false) or to (write true) `host`, which holds count
  // elements. Valid while the Trainer lives.
  std::function<void(bool write, std::size_t first, std::size_t count, void* host)> swap = {};
};

// Where a rank's state goes in a checkpoint (checkpoint/manifest.h) when its units are not the
// whole model sharded over the world — a pipeline's, a hybrid-sharded run's. The model's units
// are split into `parts` (pipeline stages), each part's units sharded over `shards` ranks (its
// data-parallel group, or its shard group); this rank holds shard `shard` of part `part`, and its
// file is number part × shards + shard. With hybrid sharding `replicas` shard groups hold the
// same shards: this rank is in group `replica`, and only group 0 writes (the files are its). The
// world rank is ((part × replicas + replica) × shards + shard) × tensor_ranks + tensor_rank. A
// unit lent to another part (the tied embedding's copy) is saved by its own part only and restored
// into both. With tensor parallelism each of the `tensor_ranks` ranks of a tensor-parallel group
// holds its slice of every unit (models/tensor_slice.h) and writes files of its own, number
// (part × tensor_ranks + tensor_rank) × shards + shard; `slices` says where each slice sits in the
// whole parameter, so that another layout can read it.
struct CheckpointPlacement {
  int parts = 1;
  int part = 0;
  int shards = 1;
  int shard = 0;
  int replicas = 1;
  int replica = 0;
  int tensor_ranks = 1;
  int tensor_rank = 0;
  // Per `units` entry, per parameter: this rank's ParamSpec::draw_slice (tensor_ranks > 1 only).
  std::vector<std::vector<ParamSpec::DrawSlice>> slices;
  std::vector<ShardLayout> units;  // the whole model's units, at `shards` ranks, in model order
  std::vector<int> unit_parts;     // the part that saves each of `units`
  std::vector<std::size_t> local_units;  // per layouts() entry: its index in `units`
  // Whether the other replicas hold group 0's state to the bit (hybrid sharding: the writer
  // checks that they do), or their own (the outer loop's groups: only group 0's is saved).
  bool replicas_agree = true;
};

// The counters a resumed run needs to continue exactly.
struct TrainerCounters {
  std::int64_t steps_taken = 0;
  std::int64_t optimizer_steps = 0;
  LossScalerState loss_scaler;
};

class Engine {
 public:
  Engine(RankContext& context, EngineOptions options);

  // Builds flat units for `module`, initializes parameters (identically on every rank) and
  // shards them. `module` and this Engine must outlive the Trainer.
  std::unique_ptr<Trainer> shard(Module& module, std::unique_ptr<Optimizer> optimizer);

  RankContext& context() { return context_; }
  const EngineOptions& options() const { return options_; }

 private:
  // The context the trainer runs in: this rank's, or its shard group's view of it when the
  // options ask for hybrid sharding (engine/hybrid_shards.cc).
  RankContext& trainer_context(const Module& module);
  // The outer loop's: a ZeRO trainer in this rank's group, wrapped (engine/outer_loop.cc).
  std::unique_ptr<Trainer> shard_in_groups(Module& module, std::unique_ptr<Optimizer> optimizer);

  RankContext& context_;
  EngineOptions options_;
  std::shared_ptr<HybridShards> hybrid_;  // made by the first shard() that needs it
  std::shared_ptr<OuterGroups> outer_;    // the same, for the outer loop's groups
};

struct SwapTraffic {
  std::uint64_t read = 0;
  std::uint64_t written = 0;
};

class Trainer {
 public:
  virtual ~Trainer() = default;

  // Runs one micro-batch's forward and backward and reduces its gradients; returns this rank's
  // loss for it. Call it gradient_accumulation_steps times, then step().
  virtual float forward_backward(const Batch& batch) = 0;
  // Clips, updates each rank's shard, gathers the parameters back. `lr` overrides the
  // optimizer's learning rate for this step when >= 0 (schedules; a warmup may start at 0).
  virtual StepStats step(float lr = -1.0f) = 0;
  // Forward only, between steps: the mean loss of `batch` over every rank (each rank passes its
  // own slice). Nothing is kept for a backward and no gradient changes: held-out evaluation.
  virtual float evaluate(const Batch& batch) = 0;

  // The full value of a parameter ("<unit>.<name>") as fp32. A collective: every rank calls it.
  virtual std::vector<float> full_parameter(const std::string& name) = 0;
  // Every parameter's full name, in flat order.
  virtual std::vector<std::string> parameter_names() const = 0;
  virtual const std::vector<ShardLayout>& layouts() const = 0;

  virtual MemoryPrediction predicted_memory() const = 0;
  virtual int stage() const = 0;
  virtual std::int64_t steps_taken() const = 0;
  virtual const EngineOptions& options() const = 0;

  // Checkpoints. Between steps only (after step(), before the next forward_backward). Reading
  // the views needs no collective; after writing into them, call state_loaded() on every rank,
  // which makes the replicated copies agree again (it all-gathers the parameters at stages
  // 0-2 and, at stage 0, the optimizer state).
  virtual std::vector<StateShard> state_shards(std::size_t unit) = 0;
  virtual void state_loaded() = 0;
  // Work still reading the state views after the caller returns (an asynchronous checkpoint's
  // snapshot copy, on a stream of its own): the trainer waits for `readers` before it next
  // changes its state (the optimizer update, state_shards(), state_loaded()) and before it frees
  // it. So the copy runs beside the next forward and backward, and nothing can overwrite the
  // state under it.
  virtual void hold_state_for(std::shared_ptr<Event> readers) = 0;
  virtual TrainerCounters counters() const = 0;
  virtual void set_counters(const TrainerCounters& counters) = 0;
  // How this rank's units sit in the whole model for a checkpoint; none (the default): layouts()
  // is the whole model, sharded over the world.
  virtual std::optional<CheckpointPlacement> checkpoint_placement() const { return std::nullopt; }
  // Bytes of this rank's swap files (the NVMe tier), as reserved: on the shape-only device what a
  // run would make, on a real one their size on disk. 0 without the tier.
  virtual std::size_t swap_bytes() const { return 0; }
  // Bytes this rank has read from and written to its swap files since it was made (the metrics'
  // NVMe traffic per step is the difference between two calls).
  virtual SwapTraffic swap_traffic() const { return {}; }
};

}  // namespace zest
