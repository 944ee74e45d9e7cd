#include "tools/train/rank_trainer.h"

#include "models/registry.h"
#include "models/tensor_parallel_gpt.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_trainer.h"
#include "tools/common/memory_estimate.h"

namespace zest {

namespace {

std::unique_ptr<Trainer> make_pipeline_trainer(RankContext& context, const TrainConfig& config,
                                               const TensorParallelGroups& groups) {
  const PipelineOptions pipeline = pipeline_options(config.pipeline);
  EngineOptions engine = config.engine;
  engine.gradient_accumulation_steps = 1;
  if (!config.tensor_parallel.enabled()) {
    const ModelSpec spec = config.model;
    return std::make_unique<PipelineTrainer>(
        context, engine, pipeline, [spec] { return make_model(spec); }, config.optimizer);
  }
  const GptConfig gpt = config.model.gpt;
  const TensorSlice slice{groups.at.tensor_parallel_index, config.tensor_parallel.size,
                          groups.tensor.get(), config.tensor_parallel.sequence_parallel};
  return std::make_unique<PipelineTrainer>(
      *groups.data_context, engine, pipeline,
      [gpt, slice] { return std::make_unique<TensorParallelGpt>(gpt, slice); }, config.optimizer);
}

}  // namespace

RankTrainer make_rank_trainer(RankContext& context, const TrainConfig& config) {
  RankTrainer built;
  if (config.tensor_parallel.enabled()) {
    built.tensor_groups = split_tensor_parallel_groups(
        context,
        DeviceMesh(context.world_size, config.pipeline.stages, config.tensor_parallel.size));
  }
  if (config.pipeline.enabled()) {
    built.trainer = make_pipeline_trainer(context, config, built.tensor_groups);
    return built;
  }
  RankContext* engine_context = &context;
  EngineOptions options = config.engine;
  if (config.tensor_parallel.enabled()) {
    // The rank's slice of the GPT over its tensor-parallel group, the ZeRO engine over its
    // data-parallel group. An out-of-memory's advice plans this rank's slices
    // (Module::unit_memory).
    const TensorParallelGroups& groups = built.tensor_groups;
    built.model = std::make_unique<TensorParallelGpt>(
        config.model.gpt,
        TensorSlice{groups.at.tensor_parallel_index, config.tensor_parallel.size,
                    groups.tensor.get(), config.tensor_parallel.sequence_parallel});
    engine_context = groups.data_context.get();
  } else {
    built.model = make_model(config.model);
    // An out-of-memory's advice may propose the model built another way (vocabulary pieces).
    if (options.out_of_memory_advice) {
      options.out_of_memory_advice = training_memory_advice_with(model_variants(config));
    }
  }
  built.engine = std::make_unique<Engine>(*engine_context, options);
  built.trainer = built.engine->shard(*built.model, make_optimizer(config.optimizer));
  return built;
}

int data_parallel_index(const RankContext& context, const TrainConfig& config) {
  return context.rank / config.tensor_parallel.size % config.pipeline.data_parallel;
}

int data_parallel_size(const TrainConfig& config) { return config.pipeline.data_parallel; }

BatchSlice pipeline_slice(const RankContext& context, const TrainConfig& config) {
  BatchSlice slice;
  slice.global_rows = config.train_batch_size;
  slice.world_size = data_parallel_size(config);
  slice.rank = data_parallel_index(context, config);
  return slice;
}

}  // namespace zest
