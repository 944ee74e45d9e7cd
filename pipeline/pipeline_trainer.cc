#include "pipeline/pipeline_trainer.h"

#include <algorithm>
#include <set>
#include <utility>

#include "base/error.h"
#include "engine/divergence_report.h"
#include "engine/hybrid_shards.h"
#include "pipeline/schedule_generators.h"
#include "pipeline/schedule_simulator.h"
#include "runtime/host_collectives.h"

namespace zest {

namespace {

// The virtual stage of each unit of the whole model under `partition`.
std::vector<int> virtual_stage_of_units(const std::vector<std::size_t>& partition) {
  std::vector<int> owner;
  for (std::size_t v = 0; v < partition.size(); ++v) {
    owner.insert(owner.end(), partition[v], static_cast<int>(v));
  }
  return owner;
}

}  // namespace

PipelineTrainer::PipelineTrainer(RankContext& context, const EngineOptions& engine,
                                 const PipelineOptions& pipeline, const ModuleFactory& make_module,
                                 const OptimizerOptions& optimizer)
    : PipelineTrainer(context, engine, pipeline,
                      make_schedule(pipeline.schedule, pipeline.stages, pipeline.micro_batches,
                                    pipeline.virtual_chunks),
                      make_module, optimizer) {}

PipelineTrainer::PipelineTrainer(RankContext& context, const EngineOptions& engine,
                                 const PipelineOptions& pipeline, Schedule schedule,
                                 const ModuleFactory& make_module, const OptimizerOptions& optimizer)
    : context_(context), engine_(engine), pipeline_(pipeline),
      mesh_(context.world_size, pipeline.stages), at_(mesh_.coordinate(context.rank)),
      schedule_(std::move(schedule)) {
  if (engine_.gradient_accumulation_steps != 1) {
    throw Error(ErrorKind::kConfig,
                "gradient_accumulation_steps: a pipeline accumulates over pipeline.micro_batches; "
                "set it to 1 (got " + std::to_string(engine_.gradient_accumulation_steps) + ")");
  }
  if (engine_.activation_checkpointing.cpu_checkpointing) {
    throw Error(ErrorKind::kConfig,
                "activation_checkpointing.cpu_checkpointing: not with pipeline stages yet (it "
                "keeps one micro-batch's checkpoints; a pipeline holds several)");
  }
  const int m = pipeline_.micro_batches;
  for (int i = 0; i < std::max(m, 1); ++i) {
    models_.push_back(make_module());
    if (!models_.back()) throw Error(ErrorKind::kUsage, "the module factory returned nothing");
  }
  // A tensor-parallel model: this trainer runs on the ranks of the rank's tensor-parallel index
  // (runtime/tensor_parallel_groups.h), each pipeline stage's layers split across the group.
  tensor_ = models_.front()->tensor_parallel_group();
  if (tensor_ != nullptr && tensor_->world_size() == 1) tensor_ = nullptr;
  std::vector<Unit*> whole = models_.front()->units();
  const std::vector<std::size_t> partition = pipeline_.partition(whole.size());
  // Checked before the first step: a schedule that would hang or compute wrongly never runs.
  try {
    (void)simulate_schedule(schedule_);
  } catch (const Error& error) {
    throw Error(ErrorKind::kConfig, std::string("pipeline.schedule: ") + error.what());
  }

  // Units lent across virtual stages (GPT's embedding, read by its head): which two pipeline
  // pipeline stages hold them. Note: one pair of pipeline stages is what the one tied group serves;
  // a model that ties units across other pairs, or across chunks of one pipeline stage, is refused.
  const std::vector<int> owner = virtual_stage_of_units(partition);
  std::set<std::pair<int, int>> pairs;
  std::set<int> lent_units;
  for (std::size_t w = 0; w < whole.size(); ++w) {
    for (int b : whole[w]->borrowed_units()) {
      if (b < 0 || b >= static_cast<int>(whole.size()) || owner[b] == owner[w]) continue;
      const int a = schedule_.stage_of(owner[b]);
      const int c = schedule_.stage_of(owner[w]);
      if (a == c) {
        throw Error(ErrorKind::kConfig,
                    "pipeline.partition: unit '" + whole[w]->name() + "' reads unit '" +
                        whole[b]->name() + "' of another chunk of the same pipeline stage; tied "
                        "units must be in one chunk or on two pipeline stages");
      }
      pairs.insert({std::min(a, c), std::max(a, c)});
      lent_units.insert(b);
    }
  }
  if (pairs.size() > 1) {
    throw Error(ErrorKind::kConfig,
                "pipeline.partition: the model's tied units span more than "
                "two pipeline stages; one pair of pipeline stages is supported");
  }
  const bool tied_here =
      !pairs.empty() && (pairs.begin()->first == at_.pipeline_stage ||
                         pairs.begin()->second == at_.pipeline_stage);
  build_groups(pairs.empty() ? std::pair<int, int>{-1, -1} : *pairs.begin());
  // Hybrid sharding inside each pipeline stage: its data-parallel group in shard groups
  // (engine/hybrid_shards.h), the chunks' trainers in their shard group's view of the rank.
  const int shard_size = hybrid_shard_size(engine_.hybrid_shard_size, engine_.stage,
                                           mesh_.data_parallel_size(),
                                           context_.topology.ranks_per_node());
  if (shard_size > 0 && tensor_ != nullptr) {
    throw Error(ErrorKind::kConfig,
                "zero_optimization.hybrid_shard_size: hybrid sharding is not supported with "
                "tensor parallelism yet; remove it (ZeRO shards within each tensor-parallel "
                "index's data-parallel group)");
  }
  if (shard_size > 0) hybrid_ = std::make_unique<HybridCommunicator>(*data_parallel_, shard_size);
  if (!tied_here) tied_.reset();

  send_activations_ = context_.device.create_stream("send activations");
  send_gradients_ = context_.device.create_stream("send gradients");

  // The whole model's recompute plan, each chunk's units taking their entries (engine.h).
  const std::vector<RecomputePolicy> recompute =
      plan_recompute(engine_.activation_checkpointing, recomputable_of(whole));

  std::vector<std::size_t> first(partition.size(), 0);
  for (std::size_t v = 1; v < partition.size(); ++v) first[v] = first[v - 1] + partition[v - 1];
  for (std::size_t w = 0; w < whole.size(); ++w) {
    for (const ParamSpec& spec : whole[w]->parameters()) {
      parameter_names_.push_back(whole[w]->name() + "." + spec.name);
      std::size_t numel = 1;
      for (std::int64_t d : spec.shape) numel *= static_cast<std::size_t>(d);
      parameter_sizes_.push_back(numel);
      parameter_stage_.push_back(schedule_.stage_of(owner[w]));
    }
  }

  for (int c = 0; c < pipeline_.virtual_chunks; ++c) {
    Chunk chunk;
    chunk.virtual_stage = schedule_.virtual_stage(at_.pipeline_stage, c);
    const auto v = static_cast<std::size_t>(chunk.virtual_stage);
    chunk.first_unit = first[v];
    for (auto& model : models_) {
      chunk.replicas.push_back(
          std::make_unique<SubModule>(*model, first[v], first[v] + partition[v]));
    }
    const SubModule& part = *chunk.replicas.front();
    for (std::size_t u = 0; u < part.whole_indices().size(); ++u) {
      const int w = part.whole_indices()[u];
      chunk.lent.push_back(lent_units.count(w) > 0);
      if (chunk.lent.back() && tied_) tied_units_.emplace_back(w, chunks_.size(), u);
    }
    chunk.context = hybrid_ ? hybrid_context() : std::make_unique<RankContext>(RankContext{
        at_.data_parallel_index, mesh_.data_parallel_size(), context_.device, context_.compute,
        context_.comm, context_.prefetch, *data_parallel_, context_.trace, context_.topology,
        context_.wire, 1, context_.rank_in_world()});
    EngineOptions options = engine_;
    options.gradient_accumulation_steps = m;
    options.fault = chunk_fault(part, c + 1 == pipeline_.virtual_chunks);
    options.recompute_plan.clear();
    for (std::size_t u = 0; u < part.whole_indices().size(); ++u) {
      options.recompute_plan.push_back(
          u < part.copies() ? RecomputePolicy::kNone
                            : recompute[static_cast<std::size_t>(part.whole_indices()[u])]);
    }
    if (gathered_for_step(engine_.stage, pipeline_.reshard_after_forward)) {
      // A gather-ring slot per unit: a unit once gathered stays until the step changes its shards.
      options.gather_slots = std::max(options.gather_slots, part.whole_indices().size());
    }
    chunk.trainer = std::make_unique<ZeroTrainer>(*chunk.context, options, *chunk.replicas.front(),
                                                  make_optimizer(optimizer));
    std::vector<Module*> replicas;
    for (auto& replica : chunk.replicas) replicas.push_back(replica.get());
    chunk.runner =
        std::make_unique<PipelineStageRunner>(*chunk.context, *chunk.trainer, std::move(replicas));
    const std::vector<ShardLayout>& chunk_layouts = chunk.trainer->layouts();
    for (std::size_t u = 0; u < chunk_layouts.size(); ++u) {
      layouts_.push_back(chunk_layouts[u]);
      layout_units_.emplace_back(chunks_.size(), u);
      placement_.local_units.push_back(static_cast<std::size_t>(part.whole_indices()[u]));
    }
    chunks_.push_back(std::move(chunk));
  }
  std::sort(tied_units_.begin(), tied_units_.end());
  check_fault_unit_is_here();

  // A checkpoint lists the whole model, each unit laid out as its pipeline stage's data-parallel
  // group shards it (the same size on every pipeline stage).
  placement_.parts = pipeline_.stages;
  placement_.part = at_.pipeline_stage;
  placement_.shards = mesh_.data_parallel_size();
  placement_.shard = at_.data_parallel_index;
  if (hybrid_) {  // each shard group holds the pipeline stage's units once; the first saves them
    placement_.shards = hybrid_->world_size();
    placement_.shard = hybrid_->rank();
    placement_.replicas = hybrid_->replicas();
    placement_.replica = hybrid_->shard_group();
  }
  if (tensor_ !=
      nullptr) {  // each tensor-parallel rank saves its slices (checkpoint/tensor_split.h)
    placement_.tensor_ranks = tensor_->world_size();
    placement_.tensor_rank = tensor_->rank();
  }
  for (std::size_t w = 0; w < whole.size(); ++w) {
    std::vector<ParamShape> shapes;
    for (const ParamSpec& spec : whole[w]->parameters()) shapes.push_back({spec.name, spec.shape});
    placement_.units.push_back(ShardLayout::build(whole[w]->name(), shapes, placement_.shards,
                                                  engine_.shard_alignment));
    placement_.unit_parts.push_back(schedule_.stage_of(owner[w]));
    if (tensor_ != nullptr) {
      std::vector<ParamSpec::DrawSlice>& slices = placement_.slices.emplace_back();
      for (const ParamSpec& spec : whole[w]->parameters()) slices.push_back(spec.draw_slice);
    }
  }
}

// Note: "throw", "stall" and "fail_allocation" the pipeline injects itself (inject_fault), once
// per step; a NaN gradient goes to the chunk trainer that owns its unit (not a lent copy), or,
// unnamed, to this rank's last chunk, whose last unit is then the one hit.
FaultInjection PipelineTrainer::chunk_fault(const SubModule& part, bool last_chunk) const {
  const FaultInjection& fault = engine_.fault;
  if (fault.kind != FaultInjection::Kind::kNanGradient) return {};
  if (fault.unit.empty()) return last_chunk ? fault : FaultInjection{};
  for (std::size_t u = part.copies(); u < part.whole_indices().size(); ++u) {
    if (models_.front()->units()[part.whole_indices()[u]]->name() == fault.unit) return fault;
  }
  return {};
}

void PipelineTrainer::check_fault_unit_is_here() const {
  const FaultInjection& fault = engine_.fault;
  if (fault.kind != FaultInjection::Kind::kNanGradient || fault.unit.empty() ||
      fault.rank != context_.rank_in_world()) {
    return;
  }
  std::vector<std::string> here;
  for (const Chunk& chunk : chunks_) {
    const SubModule& part = *chunk.replicas.front();
    for (std::size_t u = part.copies(); u < part.whole_indices().size(); ++u) {
      here.push_back(models_.front()->units()[part.whole_indices()[u]]->name());
    }
  }
  if (std::find(here.begin(), here.end(), fault.unit) != here.end()) return;
  std::string list;
  for (const std::string& name : here) list += (list.empty() ? "" : ", ") + name;
  throw Error(ErrorKind::kConfig,
              "debug.fault.unit: unit '" + fault.unit + "' is not on rank " +
                  std::to_string(fault.rank) + ", whose pipeline stage " +
                  std::to_string(at_.pipeline_stage) + " holds " + list +
                  "; name one of those or a rank of the unit's pipeline stage");
}

std::unique_ptr<RankContext> PipelineTrainer::hybrid_context() const {
  return std::make_unique<RankContext>(RankContext{
      hybrid_->rank(), hybrid_->world_size(), context_.device, context_.compute, context_.comm,
      context_.prefetch, *hybrid_, context_.trace, context_.topology, context_.wire,
      hybrid_->replicas(), context_.rank_in_world()});
}

PipelineTrainer::~PipelineTrainer() {
  for (Stream* stream : {send_activations_.get(), send_gradients_.get(), &context_.compute,
                         &context_.comm, &context_.prefetch}) {
    try {
      if (stream) stream->synchronize();
    } catch (...) {
      // Whoever synchronizes next reports the failure; a destructor must not throw.
    }
  }
  chunks_.clear();  // the trainers before the groups they use
}

void PipelineTrainer::build_groups(std::pair<int, int> tied) {
  // Every rank splits the same groups in the same order (split is collective over the world).
  const int s = at_.pipeline_stage;
  const int d = at_.data_parallel_index;
  Communicator& world = context_.communicator;
  // The names say world ranks: with tensor parallelism, the world holds tensor-parallel size
  // times this trainer's ranks, the tensor index varying fastest (runtime/device_mesh.h).
  const int tensor_size = tensor_ != nullptr ? tensor_->world_size() : 1;
  const int t = tensor_ != nullptr ? tensor_->rank() : 0;
  const DeviceMesh named(mesh_.world_size() * tensor_size, mesh_.pipeline_stages(), tensor_size);
  data_parallel_ = world.split(s, d, named.data_parallel_group_name(s, t));
  const std::string pipeline_group = named.pipeline_group_name(d, t);
  activations_ = world.split(d, s, "activations of the " + pipeline_group);
  gradients_ = world.split(d, s, "gradients of the " + pipeline_group);
  if (tied.first >= 0) {
    const bool member = s == tied.first || s == tied.second;
    const std::string tensor_index =
        tensor_ != nullptr ? ", tensor-parallel index " + std::to_string(t) : "";
    tied_ = world.split(member ? d : -1, s,
                        "tied parameters of pipeline stages " + std::to_string(tied.first) +
                            " and " + std::to_string(tied.second) + " (data-parallel index " +
                            std::to_string(d) + tensor_index + ")");
  }
}

StepStats PipelineTrainer::step(float lr) {
  if (!step_pending_) {
    throw Error(ErrorKind::kUsage, "step() without forward_backward(); call it once per step");
  }
  step_pending_ = false;
  ZeroTrainer& first = *chunks_.front().trainer;
  if (first.diverges(totals_)) {
    // The flag was summed over every pipeline stage (and the tensor-parallel group), so the
    // report is gathered over them too: a pipeline stage whose own units were finite names the
    // rank whose were not, as that rank does.
    NonFiniteFinding mine;
    for (Chunk& chunk : chunks_) {
      const NonFiniteFinding found = chunk.trainer->non_finite_finding();
      if (found.where > mine.where) mine = found;
    }
    raise_divergence(context_, {&context_.communicator, tensor_}, first.steps_taken() + 1,
                     first.options().compute_dtype, mine);
  }
  StepStats stats;
  for (Chunk& chunk : chunks_) stats = chunk.runner->finish_step(lr, totals_);
  return stats;
}

std::vector<float> PipelineTrainer::full_parameter(const std::string& name) {
  const auto at = std::find(parameter_names_.begin(), parameter_names_.end(), name);
  if (at == parameter_names_.end()) throw Error(ErrorKind::kUsage, "no parameter named '" + name + "'");
  const auto index = static_cast<std::size_t>(at - parameter_names_.begin());
  const int owner = parameter_stage_[index];
  std::vector<float> value(parameter_sizes_[index], 0.0f);
  if (owner == at_.pipeline_stage) {
    for (Chunk& chunk : chunks_) {
      const std::vector<std::string> names = chunk.trainer->parameter_names();
      if (std::find(names.begin(), names.end(), name) == names.end()) continue;
      // A lent copy holds the same values, but the owner's chunk answers (every data-parallel
      // rank of the pipeline stage asks the same chunk, since its gather is a collective).
      const SubModule& part = *chunk.replicas.front();
      bool owned = false;
      for (std::size_t u = part.copies(); u < part.whole_indices().size(); ++u) {
        const std::string unit = models_.front()->units()[part.whole_indices()[u]]->name();
        if (name.compare(0, unit.size() + 1, unit + ".") == 0) owned = true;
      }
      if (!owned) continue;
      value = chunk.trainer->full_parameter(name);
      break;
    }
  }
  context_.communicator.label_next(("parameter " + name).c_str());
  broadcast_host(context_, value.data(), value.size(), DType::kFloat32,
                 mesh_.rank_of({owner, 0}));
  return value;
}

std::vector<std::string> PipelineTrainer::parameter_names() const { return parameter_names_; }

MemoryPrediction PipelineTrainer::predicted_memory() const {
  MemoryPrediction total;
  for (const Chunk& chunk : chunks_) {
    const MemoryPrediction part = chunk.trainer->predicted_memory();
    total.params += part.params;
    total.grads += part.grads;
    total.optimizer += part.optimizer;
    total.offload += part.offload;
    total.nvme += part.nvme;
  }
  return total;
}

std::size_t PipelineTrainer::swap_bytes() const {
  std::size_t total = 0;
  for (const Chunk& chunk : chunks_) total += chunk.trainer->swap_bytes();
  return total;
}

std::vector<StateShard> PipelineTrainer::state_shards(std::size_t unit) {
  if (unit >= layout_units_.size()) {
    throw Error(ErrorKind::kUsage, "state_shards: this rank holds " +
                                       std::to_string(layout_units_.size()) + " units, not " +
                                       std::to_string(unit + 1));
  }
  const auto [chunk, index] = layout_units_[unit];
  return chunks_[chunk].trainer->state_shards(index);
}

void PipelineTrainer::state_loaded() {
  if (step_pending_) {
    throw Error(ErrorKind::kUsage, "state_loaded between forward_backward() and step()");
  }
  for (Chunk& chunk : chunks_) chunk.trainer->state_loaded();
}

void PipelineTrainer::hold_state_for(std::shared_ptr<Event> readers) {
  // Every chunk's update and views wait for them (a stage's update is its chunk trainer's).
  for (Chunk& chunk : chunks_) chunk.trainer->hold_state_for(readers);
}

void PipelineTrainer::set_counters(const TrainerCounters& counters) {
  for (Chunk& chunk : chunks_) chunk.trainer->set_counters(counters);
}

}  // namespace zest
