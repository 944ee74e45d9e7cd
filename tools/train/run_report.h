// What zest-train reports about a run as a whole: the opening line describing the job, and at
// the end the memory table (each rank's measured peak bytes per category beside the
// prediction), the summary record of the metrics file, and the timeline (log.trace,
// wall_clock_breakdown).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memory/allocator.h"
#include "memory/category.h"
#include "engine/engine.h"
#include "planner/peak_plan.h"
#include "runtime/trace.h"
#include "config/train_config.h"

namespace zest {

// "zest-train: 4 ranks (local threads), cpu (512 MiB per rank), stage 3, fp32, gpt 4L ..."
std::string describe_run(const TrainConfig& config, std::size_t parameter_count);

// One rank's peak bytes and predicted model state, as words an all-gather can move (with
// processes the other ranks' numbers live in other address spaces). The `offload` category is
// measured in the device's host arena (Device::host_allocator), the others on the device;
// `total_peak` is the device's.
// `host_params`: the peak of the offloaded parameter shards in the host arena
// (zero_optimization.offload_param), 0 without it.
inline constexpr std::size_t kMemoryWords = kCategoryCount + 7;
MemoryUsage rank_memory_usage(Device& device);
std::size_t rank_host_params(Device& device);
std::array<std::uint64_t, kMemoryWords> pack_memory(const MemoryUsage& usage,
                                                    const MemoryPrediction& predicted,
                                                    std::size_t host_params);
void unpack_memory(const std::uint64_t* words, MemoryUsage& usage, MemoryPrediction& predicted,
                   std::size_t& host_params);

// The measured peaks per rank beside the model state the memory table (docs/architecture.md)
// predicts, and, when the planner could plan this run (planner/peak_plan.h, as zest-estimate does),
// its every-category prediction as a last row: the two should agree byte for byte while the host
// runs ahead.
void print_memory_table(const std::vector<MemoryUsage>& usage,
                        const std::vector<MemoryPrediction>& predicted,
                        const std::optional<PeakPrediction>& planned);
// With offload_param: each rank's parameter shards in the host arena, measured and predicted.
void print_host_params(const std::vector<std::size_t>& measured,
                       const std::vector<MemoryPrediction>& predicted);

struct RunSummary {
  std::int64_t steps = 0;  // run in this invocation
  float first_loss = 0.0f;
  float final_loss = 0.0f;
  double tokens_per_s = 0.0;
  double mean_step_ms = 0.0;
  bool evaluated = false;
  float final_val_loss = 0.0f;
  // Seconds the step loop spent in checkpoint saves (TrainCheckpoints::total_save_wait_s); a
  // negative value: no checkpoint.dir, left out of the record.
  double checkpoint_wait_s = -1.0;
};

void print_summary(const RunSummary& summary);
nlohmann::ordered_json summary_record(const RunSummary& summary,
                                      const std::vector<MemoryUsage>& usage,
                                      const std::vector<MemoryPrediction>& predicted,
                                      const std::optional<PeakPrediction>& planned);

// The trace file (log.trace) and, per rank, how much of the communication time compute hid
// (wall_clock_breakdown). With processes, this process's ranks.
void report_timeline(const TraceRecorder& trace, const TrainConfig& config, int ranks);

// A float as the shortest decimal that reads back as the same float (2.3025851, not
// 2.3025851249694824), for the metrics file; non-finite values as null.
nlohmann::ordered_json shortest_json(float value);

}  // namespace zest
