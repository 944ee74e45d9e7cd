#include "resolve/pipeline_partition.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_state.h"
#include "models/registry.h"
#include "optim/optimizer.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline_options.h"
#include "pipeline/schedule_generators.h"
#include "planner/peak_plan.h"
#include "planner/pipeline_plan.h"

namespace zest {
namespace {

using nlohmann::json;

std::vector<std::uint64_t> parameters_per_unit(const ModelStateShape& shapes) {
  std::vector<std::uint64_t> parameters;
  for (const UnitShapes& unit : shapes.units) {
    std::uint64_t count = 0;
    for (const ParamShape& param : unit.params) {
      std::uint64_t elements = 1;
      for (std::int64_t extent : param.shape) elements *= static_cast<std::uint64_t>(extent);
      count += elements;
    }
    parameters.push_back(count);
  }
  return parameters;
}

std::vector<std::size_t> partition_units(const TrainConfig& config) {
  const PipelineConfig& pipeline = config.pipeline;
  const std::size_t units = unit_count(config.model);
  const int virtual_stages = pipeline.virtual_stages();
  // Fewer units than virtual stages is the same error whichever the method.
  const std::vector<std::size_t> uniform = uniform_partition(units, virtual_stages);
  if (pipeline.partition == PartitionMethod::kExplicit) {
    return explicit_partition(pipeline.written_partition, units, virtual_stages);
  }
  if (pipeline.partition == PartitionMethod::kUniform || virtual_stages == 1) return uniform;
  std::unique_ptr<Module> model = make_model(config.model);  // shapes only: nothing allocated
  const std::size_t states = make_optimizer(config.optimizer)->state_count();
  if (pipeline.partition == PartitionMethod::kParameters) {
    return balanced_partition(
        parameters_per_unit(describe_model_state(*model, config.engine.compute_dtype, states,
                                                 config.engine.shard_alignment)),
        virtual_stages);
  }
  PeakPlanInput input = plan_input(*model, micro_batch_shape(config.model, config.micro_batch),
                                   config.engine, states, pipeline.data_parallel);
  input.device = config.world.device;
  input.batch_bytes = micro_batch_bytes(config.model, config.micro_batch);
  // The schedule the config checked when it parsed the block, made again for its action lists.
  const Schedule schedule = make_schedule(pipeline.schedule, pipeline.stages,
                                          pipeline.micro_batches, pipeline.virtual_chunks);
  return balanced_partition(units, virtual_stages, pipeline_memory_cost(input, schedule));
}

}  // namespace

void resolve_pipeline_partition(TrainConfig& config) {
  const auto block = config.json.find("pipeline");
  if (block == config.json.end()) return;
  PipelineConfig& pipeline = config.pipeline;
  pipeline.units_per_virtual_stage = partition_units(config);

  const std::vector<std::string> names = unit_names(config.model);
  json units = json::array();
  std::size_t next = 0;
  for (std::size_t count : pipeline.units_per_virtual_stage) {
    json stage = json::array();
    for (std::size_t i = 0; i < count; ++i) stage.push_back(names[next++]);
    units.push_back(std::move(stage));
  }
  (*block)["units"] = std::move(units);
  // What the interpreter refuses, refused now (the config's checks come first, with more to say).
  pipeline_options(pipeline).validate(names.size());
}

}  // namespace zest
