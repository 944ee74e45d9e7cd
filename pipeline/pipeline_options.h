// How a job is split into pipeline stages and how a step runs over them: the options of
// pipeline/pipeline_trainer.h, which the config's `pipeline` block fills. Invariant: validate()
// refuses, with one kConfig line naming the key, every shape the interpreter cannot run — so
// nothing hangs or silently drops a layer at run time.
#pragma once

#include <cstddef>
#include <vector>

#include "pipeline/schedule.h"

namespace zest {

struct PipelineOptions {
  int stages = 1;          // pipeline.stages (p); world.ranks = p × data-parallel ranks
  int micro_batches = 1;   // pipeline.micro_batches (m) per optimizer step
  int virtual_chunks =
      1;  // pipeline.virtual_chunks (v): model chunks per pipeline stage, interleaved only
  ScheduleKind schedule = ScheduleKind::kOneFOneB;  // pipeline.schedule
  // pipeline.partition: units per virtual stage, in model order (virtual stage c·p + s is chunk c
  // of pipeline stage s); their sum must be the module's units. Empty: uniform, the remainder on
  // the first virtual stages.
  std::vector<std::size_t> units_per_virtual_stage;
  // Stage 3 only. True: each unit's parameters are gathered for each micro-batch's forward and
  // backward (the least memory). False: a pipeline stage's units stay gathered from their first
  // forward of the step to their last backward (FSDP2's reshard_after_forward=False): one gather
  // per unit per step instead of 2m, for the pipeline stage's full parameters in memory.
  bool reshard_after_forward = true;

  int virtual_stages() const { return stages * virtual_chunks; }

  // Throws a kConfig Error, one line naming the key, when the options cannot run a module of
  // `units` units: pipeline stages, micro-batches or chunks < 1; chunks > 1 but for
  // interleaved_1f1b, or interleaved with fewer than 2; interleaved micro-batches not a multiple of
  // the pipeline stages; fewer micro-batches than pipeline stages where the schedule needs them
  // (gpipe and 1f1b run with fewer, interleaved cannot); fewer units than virtual stages; an
  // explicit partition of another length, another sum, or with an empty pipeline stage (those last
  // with partition.h's messages, the ones the config's `pipeline` block gives).
  void validate(std::size_t units) const;

  // The units of each virtual stage: the explicit partition, or the uniform one.
  std::vector<std::size_t> partition(std::size_t units) const;
};

// Whether a pipeline stage's units stay gathered from their first forward of the step to their
// last backward (a ring slot per unit): reshard_after_forward false, at a ZeRO stage that
// gathers before each use (engine/stage_plan.h: the config refuses it at the others).
bool gathered_for_step(int zero_stage, bool reshard_after_forward);

}  // namespace zest
