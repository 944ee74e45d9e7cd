// The pipeline's partition, resolved against the model's units: which units each virtual stage
// holds, by the method the `pipeline` block names — uniform, by parameter count (the model's
// shapes declared, nothing allocated), by the planner's per-stage memory, or the written list.
// Invariant: afterwards pipeline.units_per_virtual_stage has one entry per virtual stage, none
// zero, summing to the model's units, and the interpreter accepts the pipeline's options.
#pragma once

#include "config/train_config.h"

namespace zest {

// Fills config.pipeline.units_per_virtual_stage and writes it to config.json as unit names per
// virtual stage (`pipeline.units`, which the config writes and never reads). Without a
// `pipeline` block it leaves the config as parsed (one pipeline stage holding every unit).
// Throws a kConfig Error naming pipeline.partition (or the key the interpreter refuses).
void resolve_pipeline_partition(TrainConfig& config);

}  // namespace zest
