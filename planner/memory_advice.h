// What to change when a training configuration does not fit its devices: the planner's estimate
// (planner/peak_plan.h) of the configuration as given, then the smallest change that fits, tried
// in order — a smaller micro-batch first when the model state fits and the micro-batch's
// activations and workspace are what overflow (with activation checkpointing named beside it,
// or instead of it when no micro-batch fits), else a higher stage, offload_optimizer, more
// ranks at stage 3, and a smaller micro-batch last. Used by zest-estimate's verdict and by the
// engine's out-of-memory while training.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/job_shape.h"
#include "planner/peak_plan.h"

namespace zest {

// "the planner estimates 70.00 MiB per rank (...); at zero_optimization.stage 3 it needs ..."
// `micro_batch` is the rows per rank of `input.units`.
std::string memory_advice(const PeakPlanInput& input, std::size_t capacity,
                          std::int64_t micro_batch, const MicroBatchMemory& resize);

// For an out-of-memory while training (EngineOptions::out_of_memory_advice): memory_advice for
// the job at the micro-batch that overflowed, or "no estimate: <why>" when the planner cannot
// estimate it.
std::string training_memory_advice(const TrainingMemory& memory);

// The bytes the model state and the gather ring take (what no micro-batch changes).
std::size_t fixed_bytes(const PeakPrediction& prediction);

}  // namespace zest
