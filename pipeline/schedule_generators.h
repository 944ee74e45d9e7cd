// The schedules zest generates, each as data (schedule.h), with its sends and receives placed
// where their data is made and needed, and the step's reduce and step at the end:
// - GPipe: every forward, then every backward; holds all m micro-batches' activations.
// - 1F1B: p − s − 1 warm-up forwards on pipeline stage s, then one forward one backward; holds at
// most
//   p − s (PipeDream-flush, Megatron's default). Bubble (p − 1)/m of the compute.
// - interleaved 1F1B: v model chunks per pipeline stage, Megatron's order; bubble (p − 1)/(v·m).
// - ZB-H1 (Qi et al. 2023): 1F1B with each backward split into its input gradient B (sent on at
//   once) and weight gradient W, W deferred into what would be idle time, and no pipeline stage
//   holding more micro-batches than 1F1B's peak (p, on its first pipeline stage); bubble a third of
//   1F1B's.
// Invalid shapes are one-line kConfig Errors naming the key (pipeline.stages,
// pipeline.micro_batches, pipeline.virtual_chunks).
#pragma once

#include "pipeline/schedule.h"

namespace zest {

Schedule gpipe_schedule(int pipeline_stages, int micro_batches);
Schedule one_f_one_b_schedule(int pipeline_stages, int micro_batches);
// Needs chunks >= 2 and micro-batches a multiple of the pipeline stages (Megatron's rule: the order
// cycles through the pipeline stages' micro-batches in groups of p).
Schedule interleaved_schedule(int pipeline_stages, int micro_batches, int chunks);
Schedule zero_bubble_h1_schedule(int pipeline_stages, int micro_batches);

// The schedule of `kind`; `chunks` must be 1 but for interleaved_1f1b.
Schedule make_schedule(ScheduleKind kind, int pipeline_stages, int micro_batches, int chunks = 1);

}  // namespace zest
