#include "pipeline/pipeline_options.h"

#include <string>

#include "base/error.h"
#include "engine/stage_plan.h"
#include "pipeline/partition.h"

namespace zest {

namespace {

[[noreturn]] void refuse(const std::string& message) { throw Error(ErrorKind::kConfig, message); }

std::string text(int value) { return std::to_string(value); }

}  // namespace

// Note: the keys of the options themselves are checked here; the partition against the model's
// units (too few units, an explicit list's length, an empty virtual stage, its sum) is checked in
// one place, pipeline/partition.cc, with the messages zest-train's config shows.
void PipelineOptions::validate(std::size_t units) const { (void)partition(units); }

std::vector<std::size_t> PipelineOptions::partition(std::size_t units) const {
  if (stages < 1) refuse("pipeline.stages: must be >= 1 (got " + text(stages) + ")");
  if (micro_batches < 1) {
    refuse("pipeline.micro_batches: must be >= 1 (got " + text(micro_batches) + ")");
  }
  if (virtual_chunks < 1) {
    refuse("pipeline.virtual_chunks: must be >= 1 (got " + text(virtual_chunks) + ")");
  }
  const std::string name(schedule_kind_name(schedule));
  if (schedule == ScheduleKind::kInterleavedOneFOneB) {
    if (virtual_chunks < 2) {
      refuse(
          "pipeline.virtual_chunks: interleaved_1f1b needs >= 2 chunks per pipeline stage (got " +
          text(virtual_chunks) + "); use pipeline.schedule \"1f1b\" for one");
    }
    // Note: Megatron's interleaved order cycles through the pipeline stages' micro-batches in
    // groups of p, so fewer micro-batches than pipeline stages is the same refusal as a remainder.
    if (micro_batches % stages != 0) {
      refuse("pipeline.micro_batches: interleaved_1f1b needs a multiple of pipeline.stages (" +
             text(stages) + "), got " + text(micro_batches));
    }
  } else if (virtual_chunks != 1) {
    refuse("pipeline.virtual_chunks: " + name + " runs one chunk per pipeline stage (got " +
           text(virtual_chunks) + "); more need pipeline.schedule \"interleaved_1f1b\"");
  }
  if (units_per_virtual_stage.empty()) return uniform_partition(units, virtual_stages());
  return explicit_partition(units_per_virtual_stage, units, virtual_stages());
}

bool gathered_for_step(int zero_stage, bool reshard_after_forward) {
  return !reshard_after_forward &&
         StagePlan::of(zero_stage).serves(StageFeature::kGatheredForStep);
}

}  // namespace zest
