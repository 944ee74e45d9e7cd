// zero_optimization.offload_optimizer: the optimizer's fp32 state lives in host memory (the
// device's host arena, category offload) and the optimizer runs on a host stream. Per step and
// unit: the gradient shard goes to the host on the comm stream right after its last reduction,
// while backward goes on; the host stream updates the master shard from it (the same kernels, in
// the same order, as the device path, so results are bit-identical); the comm stream copies the
// updated shard back into the device's parameters. Owns the host stream, each unit's host shards
// (fp32 master, optimizer states, and the transfer shard in the compute dtype that takes the
// gradients in and the parameters out) and the events between comm and the host stream.
// Invariant: the host stream touches a unit's shards only after that unit's gradients reached
// the host, and it is drained before any of them is freed.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/flat_unit.h"
#include "engine/stage_plan.h"
#include "optim/optimizer.h"
#include "runtime/world.h"

namespace zest {

class SwappedState;       // engine/swapped_state.h
class SwappedParameters;  // engine/swapped_parameters.h

class HostOptimizer {
 public:
  struct HostShards {
    Buffer master;                        // fp32, at every compute dtype: the host's copy to update
    std::vector<Buffer> optimizer_state;  // fp32
    Buffer transfer;                      // compute dtype: gradients in, parameters out
  };

  // `parameters` (offload_param "nvme"): where the updated shards of the units it holds go,
  // written from the host instead of copied to `params`; null otherwise.
  HostOptimizer(RankContext& context, const EngineOptions& options, const StagePlan& plan,
                std::size_t unit_count, SwappedParameters* parameters = nullptr);
  ~HostOptimizer();  // drains the host stream
  HostOptimizer(const HostOptimizer&) = delete;
  HostOptimizer& operator=(const HostOptimizer&) = delete;

  // The host shards of every unit, the states zeroed by the host stream.
  void allocate(const std::vector<FlatUnit>& units, std::size_t optimizer_states);
  HostShards& shards(std::size_t unit) { return shards_.at(unit); }
  // offload_optimizer.device "nvme": where master and states live instead of the host shards
  // (whose master and optimizer_state are then empty); null otherwise.
  SwappedState* swapped() { return swapped_.get(); }
  const SwappedState* swapped() const { return swapped_.get(); }

  // Comm stream, after the step's last reduction of `unit`: its gradient shard to the host.
  void copy_gradients_to_host(const FlatUnit& unit);
  // The optimizer on the host stream over `unit`'s host shards, then (comm stream) the updated
  // parameter shard copied back into the device's parameters.
  void update(FlatUnit& unit, Optimizer& optimizer, const UpdateArgs& args);
  // After a checkpoint load: the host's fp32 master from the loaded parameter shard (fp32
  // compute; a 2-byte run loaded the master itself).
  void state_loaded(const std::vector<FlatUnit>& units);
  void synchronize();

 private:
  std::size_t element_size() const { return dtype_size(options_.compute_dtype); }
  // The rank's shard of the device's parameters: all of `params` when they are sharded, the
  // rank's slice of the full unit before.
  std::size_t params_shard_offset(const FlatUnit& unit) const;
  // fp32, after a checkpoint load: the master of a unit whose shard is on NVMe, a piece at a time.
  void master_from_swapped_parameters(const FlatUnit& unit);

  RankContext& context_;
  const EngineOptions& options_;
  const StagePlan& plan_;
  std::vector<HostShards> shards_;
  // 2-byte compute: the host's fp32 widening of a unit's gradient shard, as long as the largest
  // shard, reused by every unit (the host stream updates them in turn); empty otherwise.
  Buffer widened_;
  std::vector<std::unique_ptr<Event>> gradients_on_host_;  // per unit, recorded by comm
  std::vector<std::unique_ptr<Event>> updated_;            // per unit, by the host stream
  std::unique_ptr<SwappedState> swapped_;  // drains its own streams when it goes
  SwappedParameters* parameters_ = nullptr;  // the trainer's; outlives this
  // The last member: drained and destroyed before the events and buffers its work uses.
  std::unique_ptr<Stream> stream_;
};

}  // namespace zest
