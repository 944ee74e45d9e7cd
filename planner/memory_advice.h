// What to change when a training configuration does not fit its devices: the planner's estimate
// (planner/peak_plan.h) of the configuration as given, then the smallest change that fits, tried
// in order — a smaller micro-batch first when the model state fits and the micro-batch's
// activations and workspace are what overflow (with activation checkpointing named beside it,
// or instead of it when no micro-batch fits), else a higher stage, offload_optimizer, the same
// model built another way at stage 3 (a GPT's vocabulary pieces: ModelVariant), more ranks at
// stage 3, and a smaller micro-batch last. Used by zest-estimate's verdict and by the
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

// The same model built another way, which the advice may propose (the tools make them: a GPT's
// model.vocab_pieces "auto", the logits by pieces): its units' shapes, their memory at a
// micro-batch of `rows` per rank, and how the advice names it.
struct ModelVariant {
  std::string change;  // "model.vocab_pieces \"auto\""
  ModelStateShape model;
  MicroBatchMemory units;
};

// "the planner estimates 70.00 MiB per rank (...); at zero_optimization.stage 3 it needs ..."
// `micro_batch` is the rows per rank of `input.units`. Each variant is tried at stage 3 (as
// given otherwise) after a higher stage and offload, before more ranks.
std::string memory_advice(const PeakPlanInput& input, std::size_t capacity,
                          std::int64_t micro_batch, const MicroBatchMemory& resize,
                          const std::vector<ModelVariant>& variants = {});

// For an out-of-memory while training (EngineOptions::out_of_memory_advice): memory_advice for
// the job at the micro-batch that overflowed, or "no estimate: <why>" when the planner cannot
// estimate it.
std::string training_memory_advice(const TrainingMemory& memory);
// The same hook proposing `variants` of the model being trained.
OutOfMemoryAdvice training_memory_advice_with(std::vector<ModelVariant> variants);

// The bytes the model state and the gather ring take (what no micro-batch changes).
std::size_t fixed_bytes(const PeakPrediction& prediction);

}  // namespace zest
