// The memory planner: the peak bytes one rank reaches in every category while training, from the
// model's unit shapes and per-micro-batch allocations (Module::unit_memory), the stage, world
// size, dtypes, offload and the options that size ZeRO-3's gather ring and the reduction
// buckets. It trains the real engine two steps on the shape-only device (runtime/shape_device.h),
// standing in for the CPU or the CUDA device, over a ShapeModule (planner/shape_module.h) and
// reads the allocators. The prediction is what the allocator measures when the host runs ahead
// of the streams (the usual case; a host that falls behind only lowers the peaks).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "memory/category.h"
#include "engine/engine.h"
#include "engine/job_shape.h"
#include "engine/model_state.h"
#include "engine/unit_memory.h"
#include "runtime/stream.h"

namespace zest {

struct PeakPrediction {
  std::array<std::size_t, kCategoryCount> peak{};  // per rank; `offload` is host memory
  std::size_t device_total = 0;  // the peak of the device's sum, not the sum of peaks
  // The memory table (docs/architecture.md): params, grads, optimizer, offload
  MemoryPrediction model_state;
  // The host tier (the device's host arena) by category: an offloaded optimizer's state under
  // `offload`, offloaded parameter shards (offload_param) under `params`, an asynchronous
  // checkpoint's snapshot buffers under `snapshot`; and the peak of its sum.
  std::array<std::size_t, kCategoryCount> host_peak{};
  std::size_t host_peak_total = 0;
  // The NVMe tier by category (offload_optimizer "nvme": the master and the moments under
  // `optimizer`): the swap files' size exactly, as the engine reserved it on the shape-only
  // device. Neither device nor host memory; all 0 while nothing lives there.
  std::array<std::size_t, kCategoryCount> nvme{};

  std::size_t of(Category category) const { return peak[static_cast<std::size_t>(category)]; }
  std::size_t host_of(Category category) const {
    return host_peak[static_cast<std::size_t>(category)];
  }
  std::size_t nvme_of(Category category) const { return nvme[static_cast<std::size_t>(category)]; }
  // Note: a plan that filled no host tier (a pipeline's) knows its host bytes as `offload` only.
  std::size_t host_total() const { return std::max(of(Category::kOffload), host_peak_total); }
  std::size_t nvme_total() const;
  // Sets the host tier's bytes of `category`, whose peak is held for the whole run (model state
  // allocated once), and adds them to the total.
  void set_host(Category category, std::size_t bytes);
};

// Throws a kConfig Error for options the engine refuses (offload at stage 0, a
// stage3_max_live_parameters below one unit set).
PeakPrediction predict_peak(const PeakPlanInput& input);

// The same input for `module` at a micro-batch whose inputs have `input_shape` (shape only:
// nothing is allocated).
PeakPlanInput plan_input(Module& module, const std::vector<std::int64_t>& input_shape,
                         const EngineOptions& engine, std::size_t optimizer_states,
                         int world_size);

}  // namespace zest
