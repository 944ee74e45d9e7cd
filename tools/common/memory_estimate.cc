#include "tools/common/memory_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <functional>

#include "base/error.h"
#include "checkpoint/async_writer.h"
#include "engine/hybrid_shards.h"
#include "engine/outer_loop.h"
#include "engine/stage_plan.h"
#include "models/registry.h"
#include "models/tensor_parallel_gpt.h"
#include "pipeline/schedule_generators.h"
#include "resolve/resolved_config.h"
#include "runtime/shape_communicator.h"
#include "tools/common/model_size.h"

namespace zest {
namespace {

std::string setup(int ranks, const EngineOptions& engine) {
  return fmt::format("{} rank{}, stage {}, {}{}{}", ranks, ranks == 1 ? "" : "s", engine.stage,
                     dtype_name(engine.compute_dtype),
                     engine.offload_optimizer.enabled() ? ", optimizer offloaded" : "",
                     engine.offload_param.device == OffloadDevice::kNvme ? ", parameters on nvme"
                     : engine.offload_param.enabled()                    ? ", parameters offloaded"
                                                                         : "");
}

// The most saves a run of config.steps steps makes with checkpoint.async (every_steps' saves,
// then save_on_exit's at the end or at a stop signal, unless a periodic save was that step),
// as the host snapshot buffers it holds.
int planned_snapshots(const TrainConfig& config) {
  const CheckpointConfig& checkpoint = config.checkpoint;
  if (!checkpoint.async || checkpoint.dir.empty()) return 0;
  const std::int64_t every = checkpoint.every_steps;
  std::int64_t saves = every > 0 ? config.steps / every : 0;
  if (checkpoint.save_on_exit && (every <= 0 || config.steps % every != 0)) ++saves;
  return snapshot_buffers(saves);
}

std::string describe_model(const ModelConfig& model) {
  if (model.type == "gpt") {
    const GptConfig& g = model.gpt;
    return fmt::format("gpt {}L {}H {}C, vocab {}, seq {}", g.n_layer, g.n_head, g.n_embd,
                       g.vocab_size, g.seq_len);
  }
  std::string widths;
  for (std::int64_t size : model.mlp.sizes) widths += (widths.empty() ? "" : "-") + std::to_string(size);
  return "mlp " + widths;
}

bool fits(const EstimateJob& job, std::size_t capacity, std::size_t host_capacity) {
  try {
    const PeakPrediction p = predict_peak(job.input);
    return p.device_total <= capacity && p.host_total() <= host_capacity;
  } catch (const Error&) {
    return false;  // a setup the engine refuses (offload at stage 0, a ring limit) fits nothing
  }
}

// The largest value in [first, limit] for which `ok` holds, given that it holds for all smaller
// values once it holds for one (more layers, wider, more parameters never need less memory).
std::optional<std::int64_t> largest(const std::function<bool(std::int64_t)>& ok,
                                    std::int64_t limit, std::int64_t first = 1) {
  if (first > limit || !ok(first)) return std::nullopt;
  std::int64_t good = first;
  std::int64_t bad = 0;  // the smallest value known not to fit
  for (std::int64_t probe = std::max<std::int64_t>(2, first * 2); good < limit;
       probe = probe > limit / 2 ? limit : probe * 2) {
    if (!ok(probe)) {
      bad = probe;
      break;
    }
    good = probe;
  }
  if (bad == 0) return good;
  while (bad - good > 1) {
    const std::int64_t middle = good + (bad - good) / 2;
    (ok(middle) ? good : bad) = middle;
  }
  return good;
}

// The ranks that hold the same units: world.ranks, or with tensor parallelism the data-parallel
// ranks of the tensor-parallel ranks' slices (world.ranks = pipeline stages x data-parallel x
// tensor-parallel ranks). Pipeline stages are planned by pipeline_estimate, on their own.
int data_parallel_ranks(const TrainConfig& config) {
  return config.tensor_parallel.enabled() ? config.pipeline.data_parallel : config.world.ranks;
}

// The ranks each unit is sharded over: the data-parallel ranks, an outer loop's group
// (engine/outer_loop.h: each group is a ZeRO run of its own), or a hybrid shard group's
// (engine/hybrid_shards.h), which is what each rank's model state is divided by.
int shard_ranks(const TrainConfig& config) {
  if (config.world.ranks <= 1) return config.world.ranks;  // processes: the launcher's count
  const int ranks = data_parallel_ranks(config);
  const int per_node = config.world.ranks_per_node > 0 ? config.world.ranks_per_node : ranks;
  if (config.engine.outer_loop.enabled()) {
    return ranks / outer_groups(config.engine.outer_loop.groups, ranks, per_node,
                                config.tensor_parallel.size);
  }
  const int size = hybrid_shard_size(config.engine.hybrid_shard_size, config.engine.stage, ranks,
                                     per_node, config.tensor_parallel.size);
  return size == 0 ? ranks : size;
}

// ", sharded in groups of 2 (hybrid)" where hybrid sharding divides the state by fewer ranks than
// the world's, so that "every one of the 2 ranks" below it reads right.
std::string hybrid_note(const TrainConfig& config) {
  const int shard = shard_ranks(config);
  if (shard == data_parallel_ranks(config)) return std::string();
  return fmt::format(", sharded in groups of {} ({})", shard,
                     config.engine.outer_loop.enabled() ? "outer-loop groups" : "hybrid");
}

// ", 2 data-parallel x 2 tensor-parallel ranks (sequence-parallel)", as zest-train says it.
std::string tensor_parallel_note(const TrainConfig& config) {
  if (!config.tensor_parallel.enabled()) return std::string();
  const int data = data_parallel_ranks(config);
  return fmt::format(", {} data-parallel x {} tensor-parallel ranks{}", data,
                     config.tensor_parallel.size,
                     config.tensor_parallel.sequence_parallel ? " (sequence-parallel)" : "");
}

}  // namespace

std::shared_ptr<Module> tensor_parallel_rank_model(const TrainConfig& config) {
  struct Held {
    std::unique_ptr<shape::ShapeCommunicator> group;
    std::unique_ptr<TensorParallelGpt> model;
  };
  const int size = config.tensor_parallel.size;
  // Note: the group's last rank. Every rank holds slices of the same sizes, but one other than
  // the first also holds a zero base in the embedding's forward (models/tensor_parallel_gpt.h),
  // so the last is the largest of them, and a plan for it holds for every rank.
  const int rank = size - 1;
  auto held = std::make_shared<Held>();
  // Its collectives do nothing, as the planner's data-parallel group's (planner/peak_plan.cc):
  // the plan runs the units' declared memory (Module::unit_memory), not their kernels.
  held->group = std::make_unique<shape::ShapeCommunicator>(rank, size);
  held->model = std::make_unique<TensorParallelGpt>(
      config.model.gpt,
      TensorSlice{rank, size, held->group.get(), config.tensor_parallel.sequence_parallel});
  return std::shared_ptr<Module>(held, held->model.get());
}

std::string planned_ranks(const EstimateJob& job) {
  const int tensor = job.input.tensor_parallel_size;
  if (tensor <= 1) {
    return fmt::format("every one of the {} ranks holds the same", job.input.world_size);
  }
  const int data = job.data_parallel > 0 ? job.data_parallel : job.input.world_size;
  // The ranks of a tensor-parallel group differ by the embedding's zero base at most.
  return fmt::format("the largest of the {} ranks, {} data-parallel x {} tensor-parallel",
                     data * tensor, data, tensor);
}

EstimateJob job_from_config(const TrainConfig& config, std::shared_ptr<Module> model) {
  EstimateJob job;
  const bool tensor_parallel = config.tensor_parallel.enabled();
  if (!model) {
    model = tensor_parallel ? tensor_parallel_rank_model(config) : make_model(config.model);
  }
  const std::size_t states = make_optimizer(config.optimizer)->state_count();
  job.input = plan_input(*model, micro_batch_shape(config.model, config.micro_batch), config.engine,
                         states, shard_ranks(config));
  job.input.synchronize_between_steps = true;  // zest-train's stop check after every step
  job.input.snapshots = planned_snapshots(config);
  const int shard = shard_ranks(config);
  if (config.engine.outer_loop.enabled()) {
    // The groups as a count: the planner's world is every group's shard ranks (peak_plan.h).
    job.input.engine.outer_loop.groups =
        std::max(1, data_parallel_ranks(config) / std::max(1, shard));
  } else if (shard > 0 && data_parallel_ranks(config) > shard) {
    job.input.replicas = data_parallel_ranks(config) / shard;
  }
  job.input.tensor_parallel_size = config.tensor_parallel.size;
  job.sequence_parallel = tensor_parallel && config.tensor_parallel.sequence_parallel;
  job.data_parallel = data_parallel_ranks(config);
  job.input.device = config.world.device;
  job.input.batch_bytes = micro_batch_bytes(config.model, config.micro_batch);
  job.micro_batch = config.micro_batch;
  job.rank_parameters = count_parameters(*model);
  // A tensor-parallel rank's slices (with the copies every rank holds) are not the model's count.
  job.parameters = tensor_parallel ? model_size(config.model).parameters : job.rank_parameters;
  // The one declaration serves every micro-batch the advice tries.
  job.resize = [model, spec = static_cast<const ModelSpec&>(config.model)](std::int64_t rows) {
    return model->unit_memory(micro_batch_shape(spec, rows));
  };
  const std::string rank_count =
      tensor_parallel ? fmt::format(", {} on each tensor-parallel rank", job.rank_parameters) : "";
  job.description =
      fmt::format("{} ({} parameters{}), {}, micro-batch {}", describe_model(config.model),
                  job.parameters, rank_count,
                  setup(config.world.ranks, config.engine) + hybrid_note(config) +
                      tensor_parallel_note(config),
                  config.micro_batch);
  if (config.pipeline.enabled()) {
    const PipelineConfig& pipeline = config.pipeline;
    job.description += fmt::format(
        ", {} pipeline stages x {} data-parallel rank{}, {}{}, {} micro-batches",
        pipeline.stages, pipeline.data_parallel, pipeline.data_parallel == 1 ? "" : "s",
        schedule_kind_name(pipeline.schedule),
        pipeline.virtual_chunks > 1 ? fmt::format(" ({} chunks)", pipeline.virtual_chunks) : "",
        pipeline.micro_batches);
  }
  return job;
}

namespace {

// The GPT's other builds model_variants proposes, each with how it is named.
std::vector<std::pair<std::string, GptConfig>> gpt_variants(const TrainConfig& config) {
  std::vector<std::pair<std::string, GptConfig>> variants;
  // Tensor parallelism splits the vocabulary across its ranks instead of in pieces.
  if (config.model.type != "gpt" || config.pipeline.enabled() ||
      config.tensor_parallel.enabled()) {
    return variants;
  }
  const GptConfig& gpt = config.model.gpt;
  auto add = [&](const std::string& change, int pieces, bool logits) {
    GptConfig changed = gpt;
    changed.vocab_pieces = pieces;
    changed.logits_by_pieces = logits;
    if (resolved_vocab_pieces(changed) >= 2) variants.emplace_back(change, changed);
  };
  const std::string logits = "model.logits_by_pieces true";
  if (gpt.vocab_pieces == 1) {
    add("model.vocab_pieces \"auto\"", kAutoVocabPieces, false);
    add("model.vocab_pieces \"auto\" and " + logits, kAutoVocabPieces, true);
  } else if (!gpt.logits_by_pieces) {
    add(logits, gpt.vocab_pieces, true);
  }
  return variants;
}

}  // namespace

std::vector<ModelVariant> model_variants(const TrainConfig& config) {
  std::vector<ModelVariant> variants;
  for (const auto& [change, gpt] : gpt_variants(config)) {
    ModelSpec spec = config.model;
    spec.gpt = gpt;
    std::shared_ptr<Module> model = make_model(spec);
    ModelVariant variant;
    variant.change = change;
    variant.model = describe_model_state(*model, config.engine.compute_dtype,
                                         make_optimizer(config.optimizer)->state_count(),
                                         config.engine.shard_alignment);
    variant.units = [model, spec](std::int64_t rows) {
      return model->unit_memory(micro_batch_shape(spec, rows));
    };
    variants.push_back(std::move(variant));
  }
  return variants;
}

std::size_t PipelineEstimate::largest() const {
  std::size_t largest = 0;
  for (std::size_t s = 1; s < pipeline_stages.size(); ++s) {
    if (pipeline_stages[s].peak.device_total > pipeline_stages[largest].peak.device_total)
      largest = s;
  }
  return largest;
}

PipelineEstimate pipeline_estimate(const TrainConfig& config, const EstimateJob& job) {
  const PipelineConfig& pipeline = config.pipeline;
  PipelineEstimate estimate;
  estimate.schedule = make_schedule(pipeline.schedule, pipeline.stages, pipeline.micro_batches,
                                    pipeline.virtual_chunks);
  estimate.simulation = simulate_schedule(estimate.schedule);
  estimate.closed_form_bubble_ratio = closed_form_bubble_ratio(
      pipeline.schedule, pipeline.stages, pipeline.micro_batches, pipeline.virtual_chunks);
  PipelinePlanInput input;
  input.model = job.input;
  // Each stage's units are sharded over its data-parallel group, or a hybrid shard group of it.
  const int per_node = config.world.ranks_per_node > 0 ? config.world.ranks_per_node
                                                       : pipeline.data_parallel;
  const int shard = hybrid_shard_size(config.engine.hybrid_shard_size, config.engine.stage,
                                      pipeline.data_parallel, per_node);
  input.model.world_size = shard == 0 ? pipeline.data_parallel : shard;
  input.units_per_virtual_stage = pipeline.units_per_virtual_stage;
  input.schedule = estimate.schedule;
  input.reshard_after_forward = pipeline.reshard_after_forward;
  estimate.pipeline_stages = predict_pipeline_peaks(input);
  estimate.unit_names = unit_names(config.model);
  estimate.data_parallel = pipeline.data_parallel;
  estimate.reshard_after_forward = pipeline.reshard_after_forward;
  return estimate;
}

EstimateJob job_from_parameters(const BareModel& model) {
  if (model.parameters < 1) throw Error(ErrorKind::kUsage, "--params: must be >= 1");
  if (model.parameters > kMaxBareParameters) {
    throw Error(ErrorKind::kUsage, "--params: must be at most 2^50 (" +
                                       std::to_string(kMaxBareParameters) + "), got " +
                                       std::to_string(model.parameters));
  }
  if (model.world < 1 || model.world > kMaxBareWorld) {
    throw Error(ErrorKind::kUsage, "--world: must be from 1 to " + std::to_string(kMaxBareWorld) +
                                       ", got " + std::to_string(model.world));
  }
  if (!StagePlan::valid(model.stage)) {
    throw Error(ErrorKind::kUsage, "--stage: must be 0, 1, 2 or 3, got " + std::to_string(model.stage));
  }
  EstimateJob job;
  job.parameters = model.parameters;
  job.input.model.compute_dtype = model.dtype;
  job.input.model.optimizer_states = 2;  // AdamW
  job.input.model.units.push_back(
      {"model", {{"parameters", {static_cast<std::int64_t>(model.parameters)}}}, {}});
  job.input.engine.stage = model.stage;
  job.input.engine.compute_dtype = model.dtype;
  job.input.engine.communication_dtype = model.dtype;
  if (model.offload) job.input.engine.offload_optimizer.device = OffloadDevice::kCpu;
  if (model.offload_param) job.input.engine.offload_param.device = OffloadDevice::kCpu;
  job.input.world_size = model.world;
  job.input.model_state_only = true;
  job.description = fmt::format("{} parameters (model state only), {}", model.parameters,
                                setup(model.world, job.input.engine));
  return job;
}

std::vector<StageFit> fit_config(const TrainConfig& config, std::size_t capacity,
                                 std::size_t host_capacity) {
  if (config.model.type != "gpt") {
    throw Error(ErrorKind::kUsage, "--fit: needs a gpt model (model.type is \"" +
                                       config.model.type + "\"), or --params");
  }
  std::vector<StageFit> fits_by_stage;
  for (int stage = 0; stage < StagePlan::kStages; ++stage) {
    TrainConfig changed = config;
    changed.engine.stage = stage;
    auto try_gpt = [&](int layers, int width) {
      TrainConfig candidate = changed;
      candidate.model.gpt.n_layer = layers;
      candidate.model.gpt.n_embd = width;
      // A candidate whose model state alone is too large is known without building its units
      // (the search probes up to kMaxModelUnits - 2 layers). Not for a tensor-parallel rank,
      // which holds less than the whole model's state that the floor counts.
      if (!candidate.tensor_parallel.enabled() &&
          model_state_floor(candidate, stage, shard_ranks(candidate),
                            candidate.engine.offload_optimizer.enabled()) > capacity) {
        return false;
      }
      return fits(job_from_config(candidate), capacity, host_capacity);
    };
    const GptConfig& gpt = config.model.gpt;
    StageFit fit{stage, {}, {}, {}, {}, {}, {}, {}};
    fit.n_layer = largest([&](std::int64_t layers) { return try_gpt(static_cast<int>(layers), gpt.n_embd); },
                          static_cast<std::int64_t>(kMaxModelUnits) - 2);
    // n_embd stays divisible by n_head: the search runs over n_embd / n_head.
    const auto heads = largest(
        [&](std::int64_t per_head) {
          return try_gpt(gpt.n_layer, static_cast<int>(per_head * gpt.n_head));
        },
        INT_MAX / 4 / gpt.n_head);
    if (heads) fit.n_embd = *heads * gpt.n_head;
    // Each recomputation policy at the config's n_embd (the config's own is the search above);
    // none with tensor parallelism, which does not recompute yet.
    const TrainConfig as_given = changed;
    const std::vector<RecomputePolicy> policies =
        config.tensor_parallel.enabled()
            ? std::vector<RecomputePolicy>()
            : std::vector<RecomputePolicy>{RecomputePolicy::kNone, RecomputePolicy::kSelective,
                                           RecomputePolicy::kFull};
    for (RecomputePolicy policy : policies) {
      ActivationCheckpointing& checkpointing = changed.engine.activation_checkpointing;
      if (policy == checkpointing.policy) {
        fit.n_layer_by_policy.emplace_back(policy, fit.n_layer);
        continue;
      }
      checkpointing.policy = policy;
      if (policy == RecomputePolicy::kNone) checkpointing.cpu_checkpointing = false;
      fit.n_layer_by_policy.emplace_back(
          policy, largest(
                      [&](std::int64_t layers) {
                        return try_gpt(static_cast<int>(layers), gpt.n_embd);
                      },
                      static_cast<std::int64_t>(kMaxModelUnits) - 2));
      changed = as_given;
    }
    // Stage 3: the model built another way (vocabulary pieces), where it fits more layers.
    const auto variants = StagePlan::of(stage).params_sharded
                              ? gpt_variants(config)
                              : std::vector<std::pair<std::string, GptConfig>>();
    for (const auto& [change, variant] : variants) {
      changed.model.gpt.vocab_pieces = variant.vocab_pieces;
      changed.model.gpt.logits_by_pieces = variant.logits_by_pieces;
      const auto layers = largest(
          [&](std::int64_t n) { return try_gpt(static_cast<int>(n), gpt.n_embd); },
          static_cast<std::int64_t>(kMaxModelUnits) - 2);
      if (layers && (!fit.n_layer || *layers > *fit.n_layer) &&
          (!fit.variant_n_layer || *layers > *fit.variant_n_layer)) {
        fit.variant = change;
        fit.variant_n_layer = layers;
        const auto heads = largest(
            [&](std::int64_t per_head) {
              return try_gpt(gpt.n_layer, static_cast<int>(per_head * gpt.n_head));
            },
            INT_MAX / 4 / gpt.n_head);
        fit.variant_n_embd =
            heads ? std::optional<std::int64_t>(*heads * gpt.n_head) : std::nullopt;
      }
      changed = as_given;
    }
    fits_by_stage.push_back(fit);
  }
  return fits_by_stage;
}

std::vector<StageFit> fit_pipeline(const TrainConfig& config, std::size_t capacity,
                                   std::size_t host_capacity) {
  if (config.model.type != "gpt") {
    throw Error(ErrorKind::kUsage, "--fit: needs a gpt model (model.type is \"" +
                                       config.model.type + "\")");
  }
  const GptConfig& gpt = config.model.gpt;
  // The partition needs a unit per virtual stage: embedding and head, and the rest blocks.
  const std::int64_t fewest_layers =
      std::max<std::int64_t>(1, config.pipeline.virtual_stages() - 2);
  std::vector<StageFit> fits_by_stage;
  for (int stage = 0; stage < StagePlan::kStages; ++stage) {
    auto try_gpt = [&](std::int64_t layers, std::int64_t width) {
      // A pipeline stage's state is at least the whole model's at stage 3 on every rank: known
      // without parsing (which plans each unit for the partition).
      TrainConfig floor = config;
      floor.model.gpt.n_layer = static_cast<int>(layers);
      floor.model.gpt.n_embd = static_cast<int>(width);
      if (model_state_floor(floor, StagePlan::kFullySharded, floor.world.ranks,
                            floor.engine.offload_optimizer.enabled()) > capacity) {
        return false;
      }
      nlohmann::json changed = config.json;
      changed["zero_optimization"]["stage"] = stage;
      changed["model"]["n_layer"] = layers;
      changed["model"]["n_embd"] = width;
      try {
        // Parsed and resolved again: the partition is resolved for the candidate's units.
        const TrainConfig candidate = parse_resolved_config(changed);
        const PipelineEstimate estimate = pipeline_estimate(candidate, job_from_config(candidate));
        for (const PipelineStagePeak& peak : estimate.pipeline_stages) {
          if (peak.peak.device_total > capacity || peak.peak.host_total() > host_capacity) {
            return false;
          }
        }
        return true;
      } catch (const Error&) {
        return false;  // a setup the config or the engine refuses fits nothing
      }
    };
    StageFit fit{stage, {}, {}, {}, {}, {}, {}, {}};
    fit.n_layer = largest([&](std::int64_t layers) { return try_gpt(layers, gpt.n_embd); },
                          static_cast<std::int64_t>(kMaxModelUnits) - 2, fewest_layers);
    const auto heads = largest(
        [&](std::int64_t per_head) { return try_gpt(gpt.n_layer, per_head * gpt.n_head); },
        INT_MAX / 4 / gpt.n_head);
    if (heads) fit.n_embd = *heads * gpt.n_head;
    fits_by_stage.push_back(fit);
  }
  return fits_by_stage;
}

std::vector<StageFit> fit_parameters(const BareModel& model, std::size_t capacity,
                                     std::size_t host_capacity) {
  std::vector<StageFit> fits_by_stage;
  for (int stage = 0; stage < StagePlan::kStages; ++stage) {
    BareModel changed = model;
    changed.stage = stage;
    StageFit fit{stage, {}, {}, {}, {}, {}, {}, {}};
    const auto count = largest(
        [&](std::int64_t parameters) {
          changed.parameters = static_cast<std::size_t>(parameters);
          return fits(job_from_parameters(changed), capacity, host_capacity);
        },
        std::int64_t{1} << 50);
    if (count) fit.parameters = static_cast<std::size_t>(*count);
    fits_by_stage.push_back(fit);
  }
  return fits_by_stage;
}

}  // namespace zest
