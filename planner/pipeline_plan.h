// The peak plan of each pipeline stage: one rank of the pipeline stage trains two steps of the real
// PipelineTrainer (pipeline/pipeline_trainer.h: each model chunk's ZeRO trainer in its
// data-parallel group, the interpreter over the schedule's action list) on the shape-only device
// (runtime/shape_device.h), and its allocators are read — the activations of every micro-batch
// it holds in flight, those received from the previous pipeline stage, the received gradient of its
// output, the gradient it sends, the shape headers, a copy of a tied unit it borrows from another
// pipeline stage, and at stage 3 without reshard_after_forward its units gathered for the whole
// step, all as the real code allocates them. Beside it, a few totals of the schedule's order that
// the tools print. Invariant: the measured peak equals the plan to the byte
// (tests/planner/pipeline_measured_test.cc).
#pragma once

#include <cstddef>
#include <vector>

#include "engine/job_shape.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "planner/peak_plan.h"

namespace zest {

struct PipelinePlanInput {
  // The whole model: its units and their memory per micro-batch, the engine options (ZeRO stage,
  // dtypes; gradient_accumulation_steps is the step's micro-batches), and world_size the
  // data-parallel ranks of one pipeline stage.
  PeakPlanInput model;
  std::vector<std::size_t> units_per_virtual_stage;  // pipeline/partition.h
  Schedule schedule;
  bool reshard_after_forward = true;  // stage 3 only: false keeps a pipeline stage's units gathered
};

struct PipelineStagePeak {
  int pipeline_stage = 0;
  std::vector<std::size_t> units;  // the model's units this pipeline stage runs, in model order
  std::vector<std::size_t>
      tied_copies;  // units of other pipeline stages it holds a copy of (borrowed)
  int peak_in_flight = 0;                // StageTimeline::peak_in_flight of the schedule
  // Activations one micro-batch leaves from its forward to its backward on all the pipeline stage's
  // chunks, the received input included, and the most the schedule's order holds at once.
  std::size_t kept_per_micro_batch = 0;
  std::size_t in_flight_activations = 0;
  std::size_t received_activations = 0;  // of one micro-batch (all chunks), part of the above
  std::size_t received_gradients = 0;    // the output's gradient, one backward at a time
  std::size_t gathered_for_step = 0;     // stage 3 without reshard_after_forward, else 0
  PeakPrediction
      one_in_flight;  // the pipeline stage's units as one ZeRO trainer, micro-batch by micro-batch
  PeakPrediction peak;  // the pipeline stage's actions run: what a rank of it measures
};

// Throws a kConfig Error naming pipeline.partition when the partition does not fit the schedule
// or the model, and what predict_peak throws.
std::vector<PipelineStagePeak> predict_pipeline_peaks(const PipelinePlanInput& input);

// The costs of partition "memory" (balanced_partition): a unit's model state on one rank of a
// pipeline stage's data-parallel group, plus its activations per micro-batch (output and what it
// keeps for backward) times the micro-batches the schedule holds in flight on that pipeline stage —
// so the first pipeline stages, which hold the most, get fewer units.
UnitCost pipeline_memory_cost(const PeakPlanInput& model, const Schedule& schedule);

}  // namespace zest
