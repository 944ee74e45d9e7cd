#include "pipeline/pipeline_options.h"

#include <string>

#include "base/error.h"
#include "pipeline/partition.h"

namespace zest {

namespace {

[[noreturn]] void refuse(const std::string& message) { throw Error(ErrorKind::kConfig, message); }

std::string text(std::size_t value) { return std::to_string(value); }
std::string text(int value) { return std::to_string(value); }

}  // namespace

void PipelineOptions::validate(std::size_t units) const {
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
      refuse("pipeline.virtual_chunks: interleaved_1f1b needs >= 2 chunks per stage (got " +
             text(virtual_chunks) + "); use pipeline.schedule \"1f1b\" for one");
    }
    // Note: Megatron's interleaved order cycles through the stages' micro-batches in groups of
    // p, so fewer micro-batches than stages is the same refusal as a remainder.
    if (micro_batches % stages != 0) {
      refuse("pipeline.micro_batches: interleaved_1f1b needs a multiple of pipeline.stages (" +
             text(stages) + "), got " + text(micro_batches));
    }
  } else if (virtual_chunks != 1) {
    refuse("pipeline.virtual_chunks: " + name + " runs one chunk per stage (got " +
           text(virtual_chunks) + "); more need pipeline.schedule \"interleaved_1f1b\"");
  }
  const std::size_t virtual_count = static_cast<std::size_t>(virtual_stages());
  if (units < virtual_count) {
    refuse("pipeline.stages: the model has " + text(units) + " units, fewer than the " +
           text(virtual_count) + " virtual stages (pipeline.stages " + text(stages) +
           " x pipeline.virtual_chunks " + text(virtual_chunks) + ")");
  }
  if (units_per_virtual_stage.empty()) return;
  if (units_per_virtual_stage.size() != virtual_count) {
    refuse("pipeline.partition: " + text(units_per_virtual_stage.size()) +
           " entries for " + text(virtual_count) + " virtual stages");
  }
  std::size_t sum = 0;
  for (std::size_t v = 0; v < units_per_virtual_stage.size(); ++v) {
    if (units_per_virtual_stage[v] == 0) {
      refuse("pipeline.partition: virtual stage " + text(v) + " (stage " +
             text(static_cast<int>(v) % stages) + ", chunk " + text(static_cast<int>(v) / stages) +
             ") has no units");
    }
    sum += units_per_virtual_stage[v];
  }
  if (sum != units) {
    refuse("pipeline.partition: the entries sum to " + text(sum) + " units; the model has " +
           text(units) + " (a partition may not drop or repeat a unit)");
  }
}

std::vector<std::size_t> PipelineOptions::partition(std::size_t units) const {
  validate(units);
  if (!units_per_virtual_stage.empty()) return units_per_virtual_stage;
  return uniform_partition(units, virtual_stages());
}

}  // namespace zest
