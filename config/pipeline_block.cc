// The `pipeline` block (PipelineConfig): how many pipeline stages, the micro-batches of a step,
// the schedule, the model chunks per pipeline stage and how units are partitioned among the virtual
// pipeline stages. Validated here: the schedule is generated and simulated, so a config that parses
// has a schedule that does not hang. The partition is resolved against the model's units by the
// resolution step (resolve/pipeline_partition.h), which shows it in the resolved config as unit
// names per virtual stage (`units`, accepted here and never read). Without the block nothing is
// written.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "config/blocks.h"
#include "engine/stage_plan.h"
#include "models/registry.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_options.h"
#include "pipeline/schedule_generators.h"
#include "pipeline/schedule_simulator.h"

namespace zest {
namespace config_blocks {

using namespace config_reading;

namespace {

const std::vector<std::string> kKeys = {"stages",    "micro_batches",         "schedule",
                                        "virtual_chunks", "partition", "reshard_after_forward",
                                        "units"};

// The resolution step names every unit of a partition, and by parameters or memory declares them
// (shapes only), which costs time and memory per unit; the tools refuse a model of more units
// anyway (tools/common/model_size.h: kMaxModelUnits).
constexpr std::size_t kMaxPartitionedUnits = std::size_t{1} << 16;
// A schedule is generated and simulated at parse time: its actions are O(pipeline stages x
// micro-batches x chunks).
constexpr std::int64_t kMaxScheduleCells = std::int64_t{1} << 22;

// Note: a vocabulary piece's backward reads the head's saved ln_f(x) and d(logits) through the
// model object they share (models/gpt_pieces.h), and the embedding's pieces and the head are
// always on different pipeline stages: refused here, not crashed on later.
void refuse_vocab_pieces(const TrainConfig& config) {
  if (config.model.type != "gpt") return;
  const int pieces = resolved_vocab_pieces(config.model.gpt);
  if (pieces == 1 || config.pipeline.stages == 1) return;
  const bool automatic = config.model.gpt.vocab_pieces == kAutoVocabPieces;
  config_error("model.vocab_pieces",
               "must be 1 with pipeline.stages > 1 (got " + std::to_string(pieces) +
                   (automatic ? " from \"auto\"" : "") + ", pipeline.stages " +
                   std::to_string(config.pipeline.stages) +
                   "): a vocabulary piece's backward reads the head's saved values, which are on "
                   "another pipeline stage; leave vocab_pieces out or the pipeline block");
}

// The pipeline refuses it when it starts (pipeline/pipeline_trainer.h); refused here so that it
// is one line from the config, not a rank's error at run time.
void refuse_checkpoint_offload(const TrainConfig& config) {
  if (!config.engine.activation_checkpointing.cpu_checkpointing || config.pipeline.stages == 1) {
    return;
  }
  config_error("activation_checkpointing.cpu_checkpointing",
               "true is not supported with pipeline stages yet (pipeline.stages " +
                   std::to_string(config.pipeline.stages) +
                   "): it keeps one micro-batch's checkpoints, and a pipeline holds several; set "
                   "it to false or leave the pipeline block out");
}

// The method, or kExplicit with the written counts appended to `list`.
PartitionMethod read_partition(const json& value, const std::string& path,
                               std::vector<std::size_t>& list) {
  const std::vector<std::string> names = {"uniform", "parameters", "memory"};
  if (value.is_string()) {
    const std::string name = value.get<std::string>();
    for (PartitionMethod method :
         {PartitionMethod::kUniform, PartitionMethod::kParameters, PartitionMethod::kMemory}) {
      if (partition_method_name(method) == name) return method;
    }
    config_error(path, "must be " + one_of(names) + " or a list of unit counts per virtual "
                       "stage, got \"" + name + "\"");
  }
  if (!value.is_array()) {
    config_error(path, "must be " + one_of(names) + " or a list of unit counts per virtual "
                       "stage, got " + describe(value));
  }
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::int64_t count =
        read_integer_at_least(value[i], path + "[" + std::to_string(i) + "]", 0);
    list.push_back(static_cast<std::size_t>(count));
  }
  return PartitionMethod::kExplicit;
}

}  // namespace

void parse_pipeline_shape(Block& root, TrainConfig& out) {
  PipelineConfig& pipeline = out.pipeline;
  pipeline = PipelineConfig{};
  pipeline.data_parallel = out.world.ranks;
  pipeline.micro_batches = 0;  // not given: parse_batch derives it
  json* value = root.find("pipeline");
  if (value == nullptr) return;
  Block block(*value, "pipeline", kKeys);
  const std::int64_t pipeline_stages =
      read_integer_at_least(block.get_or("stages", 1), block.path("stages"), 1);
  if (pipeline_stages > out.world.ranks || out.world.ranks % pipeline_stages != 0) {
    config_error(block.path("stages"),
                 std::to_string(pipeline_stages) + " does not divide world.ranks (" +
                     std::to_string(out.world.ranks) +
                     "): world.ranks = pipeline stages x data-parallel ranks");
  }
  pipeline.stages = static_cast<int>(pipeline_stages);
  pipeline.data_parallel = out.world.ranks / pipeline.stages;
  if (const json* micro_batches = block.find("micro_batches")) {
    const std::int64_t count =
        read_integer_at_least(*micro_batches, block.path("micro_batches"), 1);
    if (count > (1 << 20)) {
      config_error(block.path("micro_batches"), "must be at most 2^20, got " + std::to_string(count));
    }
    pipeline.micro_batches = static_cast<int>(count);
  }
}

void parse_pipeline(Block& root, TrainConfig& out) {
  PipelineConfig& pipeline = out.pipeline;
  json* value = root.find("pipeline");
  if (value == nullptr) {
    pipeline.units_per_virtual_stage = {unit_count(out.model)};
    return;
  }
  refuse_vocab_pieces(out);
  refuse_checkpoint_offload(out);
  Block block(*value, "pipeline", kKeys);
  block.get_or("stages", pipeline.stages);
  block.get_or("micro_batches", pipeline.micro_batches);

  const std::string schedule_name =
      read_string(block.get_or("schedule", "1f1b"), block.path("schedule"));
  pipeline.schedule = parse_schedule_kind(schedule_name);
  const bool interleaved = pipeline.schedule == ScheduleKind::kInterleavedOneFOneB;
  const std::int64_t chunks = read_integer_at_least(
      block.get_or("virtual_chunks", interleaved ? 2 : 1), block.path("virtual_chunks"), 1);
  if (chunks > 1024) {
    config_error(block.path("virtual_chunks"), "must be at most 1024, got " + std::to_string(chunks));
  }
  pipeline.virtual_chunks = static_cast<int>(chunks);
  if (std::int64_t{pipeline.stages} * pipeline.micro_batches * chunks > kMaxScheduleCells) {
    config_error(block.path("micro_batches"),
                 std::to_string(pipeline.micro_batches) + " x " + std::to_string(pipeline.stages) +
                     " pipeline stages x " + std::to_string(chunks) +
                     " chunks is more than the 2^22 actions a schedule is checked with");
  }
  // Generated and checked now, so that a schedule that would hang is a config error, not a hang.
  const Schedule schedule = make_schedule(pipeline.schedule, pipeline.stages,
                                          pipeline.micro_batches, pipeline.virtual_chunks);
  try {
    simulate_schedule(schedule);
  } catch (const Error& error) {
    config_error(block.path("schedule"), error.what());
  }

  pipeline.reshard_after_forward = read_bool(block.get_or("reshard_after_forward", true),
                                             block.path("reshard_after_forward"));
  const StagePlan plan = StagePlan::of(out.engine.stage);
  if (!pipeline.reshard_after_forward && !plan.serves(StageFeature::kGatheredForStep)) {
    config_error(block.path("reshard_after_forward"),
                 "false " + plan.refusal(StageFeature::kGatheredForStep));
  }

  const std::size_t model_units = unit_count(out.model);
  if (model_units > kMaxPartitionedUnits) {
    // Before any unit is named or planned: the tools refuse such a model anyway
    // (tools/common/model_size.h), and naming its units would take its size in memory.
    config_error(block.path("partition"), "the model has " + std::to_string(model_units) +
                                              " units, more than the " +
                                              std::to_string(kMaxPartitionedUnits) +
                                              " a pipeline partitions");
  }
  pipeline.written_partition.clear();
  pipeline.partition = read_partition(block.get_or("partition", "parameters"),
                                      block.path("partition"), pipeline.written_partition);
}

}  // namespace config_blocks

PipelineOptions pipeline_options(const PipelineConfig& config) {
  PipelineOptions options;
  options.stages = config.stages;
  options.micro_batches = config.micro_batches;
  options.virtual_chunks = config.virtual_chunks;
  options.schedule = config.schedule;
  options.units_per_virtual_stage = config.units_per_virtual_stage;
  options.reshard_after_forward = config.reshard_after_forward;
  return options;
}

}  // namespace zest
