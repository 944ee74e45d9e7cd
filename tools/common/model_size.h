// A config's model measured by arithmetic on the config, before anything is built: its parameter
// count and largest unit, and the bytes a rank needs for them at least. The tools check a model
// with it before they build units, read data or open files, so that an impossible model (n_layer
// 1e9) is refused as fast as a typo, in the memory a typo takes.
// Invariant: every byte bound here is a lower bound of what the engine allocates (padding,
// activations, buckets and the gather ring only add), so no model refused for its bytes could have
// run; sums saturate at 2^64 - 1 instead of wrapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "config/train_config.h"

namespace zest {

// The most units a model may have (a GPT has n_layer + 2). Each costs host memory and time to
// plan, build and step whatever its size (the planner alone: about 4 KiB and 80 us), so a model of
// a million tiny layers is refused here instead of after minutes and gigabytes.
inline constexpr std::uint64_t kMaxModelUnits = std::uint64_t{1} << 16;

struct ModelSize {
  std::uint64_t parameters = 0;    // every parameter once (GPT's tied head adds none)
  std::uint64_t largest_unit = 0;  // the parameters of the largest unit, gathered whole at stage 3
  std::string largest_unit_name;   // "embedding", "block0", "layer1", ...
  std::uint64_t units = 0;
};

// O(1) for a GPT whatever its n_layer; O(layers) for an MLP, whose config lists every width.
ModelSize model_size(const ModelSpec& model);

// The device bytes one rank holds at least for the model state at `stage` on `world_size` ranks:
// parameters (not offloaded: zero_optimization.offload_param), gradients and (not offloaded)
// optimizer state, each shard rounded down.
std::uint64_t model_state_floor(const TrainConfig& config, int stage, int world_size,
                                bool offload_optimizer);

// Where the capacity of check_model_fits_at_all comes from, for its message.
struct CapacityLimit {
  std::size_t bytes;
  std::string source;  // "world.device_memory", "--device-memory"
};

// Refuses (kConfig, naming the model's sizes and the capacity) a model that no setting within the
// planner's advice could hold: at zero_optimization.stage 3 with the optimizer offloaded on 64
// times world.ranks, a rank still needs its parameter and gradient shards. `capacity` is per rank;
// unlimited on a CPU device means the host's memory, which the ranks that are threads of one
// process share (unlimited on CUDA is not held against bytes: the GPU's size is not known before
// it is opened). Then refuses a model of more than kMaxModelUnits units, whatever its bytes.
void check_model_fits_at_all(const TrainConfig& config, const CapacityLimit& capacity);

// The physical memory of this host, in bytes (0 when the system does not say).
std::size_t host_memory_bytes();

}  // namespace zest
