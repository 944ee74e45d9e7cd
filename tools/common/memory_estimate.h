// What zest-estimate plans (here, so that its tests can plan the same): a training config's
// model, built shape-only through the model factory (no weights are allocated), or a bare
// parameter count, turned into the memory planner's input (planner/peak_plan.h); and the --fit
// searches for the largest model that fits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/module.h"
#include "planner/memory_advice.h"
#include "pipeline/schedule_simulator.h"
#include "planner/peak_plan.h"
#include "planner/pipeline_plan.h"
#include "config/train_config.h"

namespace zest {

struct EstimateJob {
  std::string description;  // "gpt 2L 2H 64C ..., 4 ranks, stage 3, fp32, micro-batch 4"
  PeakPlanInput input;
  std::int64_t micro_batch = 0;  // rows per rank; 0 for a bare parameter count
  MicroBatchMemory resize;       // the units' memory at another micro-batch; empty if none
  // The advice's other builds of the model: model_variants(config), which the caller adds where
  // it gives advice (a --fit search plans many jobs and needs none).
  std::vector<ModelVariant> variants;
  std::size_t parameters = 0;       // the model's, every parameter once
  std::size_t rank_parameters = 0;  // the planned rank's (tensor parallelism: its slices)
  bool sequence_parallel = false;   // tensor_parallel.sequence_parallel, with tensor parallelism
  // The data-parallel ranks of one tensor index; input.world_size is fewer where hybrid sharding
  // or an outer loop's groups shard the state. 0: input.world_size (a bare parameter count).
  int data_parallel = 0;
};

// The same model built another way, for the memory advice: a GPT of one vocabulary piece gets
// model.vocab_pieces "auto" and then "auto" with the logits by pieces; a GPT in pieces whose
// logits are whole gets the logits by pieces. None for an MLP, or where "auto" makes one piece.
std::vector<ModelVariant> model_variants(const TrainConfig& config);

// `model`: config.model already declared (a run declares it once, for every use); declared here
// when null. The job's `resize` keeps it. A tensor-parallel config plans one rank of its group:
// `model` must then be tensor_parallel_rank_model(config) (or null), and the job's world_size
// counts the data-parallel ranks (world.ranks / tensor_parallel.size).
EstimateJob job_from_config(const TrainConfig& config, std::shared_ptr<Module> model = nullptr);

// Whose peak the job's plan is, for a heading: "every one of the 4 ranks holds the same", or with
// tensor parallelism "the largest of the 4 ranks, 2 data-parallel x 2 tensor-parallel".
std::string planned_ranks(const EstimateJob& job);

// The tensor-parallel rank the planner plans (the largest of its group): its TensorParallelGpt
// over a shape-only group of tensor_parallel.size ranks, which the returned pointer keeps.
std::shared_ptr<Module> tensor_parallel_rank_model(const TrainConfig& config);

// A config's pipeline block planned: its schedule, simulated (bubble, micro-batches in flight)
// beside the closed formula, and each pipeline stage's peak per rank (planner/pipeline_plan.h).
struct PipelineEstimate {
  Schedule schedule;
  ScheduleSimulation simulation;
  double closed_form_bubble_ratio = 0.0;
  std::vector<PipelineStagePeak> pipeline_stages;
  std::vector<std::string> unit_names;  // the model's, for the pipeline stages' units
  int data_parallel = 1;
  bool reshard_after_forward = true;
  // The pipeline stage with the largest device peak: the one a capacity is held against.
  std::size_t largest() const;
};

// `job`: job_from_config(config) of the same config (its model, planned on the data-parallel
// ranks of one pipeline stage here).
PipelineEstimate pipeline_estimate(const TrainConfig& config, const EstimateJob& job);

// --params beyond a quadrillion would overflow the plan's byte counts (16 bytes a parameter and
// more); --world as world.ranks allows.
inline constexpr std::size_t kMaxBareParameters = std::size_t{1} << 50;
inline constexpr int kMaxBareWorld = 65536;
struct BareModel {
  std::size_t parameters = 0;
  int world = 1;
  int stage = 0;
  DType dtype = DType::kFloat32;
  bool offload = false;
  bool offload_param = false;  // zero_optimization.offload_param "cpu" (stage 3)
};
// Model state only: the parameters as one unit, AdamW (two moments).
EstimateJob job_from_parameters(const BareModel& model);

// --fit, per stage 0-3: the largest model that fits `capacity` per rank (and `host_capacity`
// of offloaded state), or nothing when the smallest does not (or the engine refuses the stage).
struct StageFit {
  int stage = 0;
  std::optional<std::int64_t> n_layer;     // config mode, at the config's n_embd
  std::optional<std::int64_t> n_embd;      // config mode, at the config's n_layer
  std::optional<std::size_t> parameters;   // parameter-count mode
  // Config mode: n_layer at the config's n_embd with each activation_checkpointing.policy
  // (none, selective, full; the config's units), so that the report can say which fits most.
  std::vector<std::pair<RecomputePolicy, std::optional<std::int64_t>>> n_layer_by_policy;
  // Config mode, stage 3, a GPT of one vocabulary piece: n_layer and n_embd with
  // model.vocab_pieces "auto" (and the logits by pieces), when that fits more than the config.
  std::string variant;  // "model.vocab_pieces \"auto\"", empty when none fits more
  std::optional<std::int64_t> variant_n_layer;
  std::optional<std::int64_t> variant_n_embd;
};
std::vector<StageFit> fit_config(const TrainConfig& config, std::size_t capacity,
                                 std::size_t host_capacity);
// --fit with a pipeline block: per stage 0-3, the largest GPT whose every pipeline stage fits,
// with the config's pipeline (stages, schedule, partition resolved for each candidate).
std::vector<StageFit> fit_pipeline(const TrainConfig& config, std::size_t capacity,
                                   std::size_t host_capacity);
std::vector<StageFit> fit_parameters(const BareModel& model, std::size_t capacity,
                                     std::size_t host_capacity);

}  // namespace zest
