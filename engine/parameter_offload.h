// zero_optimization.offload_param (stage 3): a rank's parameter shards live in the host tier
// (Device::host_allocator, category params) or, with "nvme", in the NVMe tier
// (engine/swapped_parameters.h; then a unit's `params` is empty) instead of the device's memory.
// The gather ring fetches a shard into its place in the unit's slot before the all-gather
// (gather_ring.h), the optimizer updates a device copy of the shard and writes it back
// (StagedShard below), and everything else that reads a shard (full_parameter, checkpoints)
// goes through Device::copy or the NVMe tier. Invariant: with offload_param no device kernel
// reads a FlatUnit's `params` in place.
#pragma once

#include "engine/engine.h"
#include "engine/flat_unit.h"
#include "engine/gather_ring.h"
#include "engine/swapped_parameters.h"
#include "runtime/world.h"

namespace zest {

// Throws a kConfig Error for options offload_param cannot run with: a stage other than 3 (only
// stage 3 shards the parameters), hpZ's and qwZ's gathers (they read the shard in place on the
// device), "nvme" without nvme_path or with the outer loop (which reads the shards in place).
void check_parameter_offload(const EngineOptions& options);

// The allocator a unit's parameter shard comes from: the host tier's with offload_param.
Allocator& parameter_allocator(RankContext& context, const EngineOptions& options);

// What the gather ring fetches a unit's shard with: a copy from the host tier, or `swapped`'s
// read for a unit on NVMe. Empty without offload_param.
ShardFetch shard_fetch(RankContext& context, const EngineOptions& options,
                       SwappedParameters* swapped);

// A device copy of `unit`'s parameter shard for the optimizer's update on `stream` (category
// workspace), filled from the host tier or NVMe in stream order (or zeroed, without
// `read_values`: an update that writes every parameter from the master needs no read);
// write_back() puts it home and releases it after the update. Empty (data() is the shard
// itself) without offload_param.
class StagedShard {
 public:
  StagedShard(RankContext& context, const EngineOptions& options, FlatUnit& unit, Stream& stream,
              SwappedParameters* swapped = nullptr, bool read_values = true);
  void* data() { return staged_.empty() ? unit_.params.data() : staged_.data(); }
  void write_back();

 private:
  RankContext& context_;
  FlatUnit& unit_;
  Stream& stream_;
  SwappedParameters* swapped_ = nullptr;  // set when the unit's shard is on NVMe
  Buffer staged_;
};

}  // namespace zest
