#include "planner/pipeline_plan.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <utility>

#include "base/error.h"
#include "engine/secondary_shard.h"
#include "engine/state_bytes.h"
#include "memory/shard_layout.h"
#include "pipeline/pipeline_options.h"
#include "pipeline/pipeline_trainer.h"
#include "pipeline/schedule_simulator.h"
#include "planner/shape_module.h"
#include "runtime/shape_communicator.h"
#include "runtime/shape_device.h"

namespace zest {
namespace {

std::size_t element_size(const PeakPlanInput& model) {
  return dtype_size(model.engine.compute_dtype);
}

void check_partition(const PipelinePlanInput& input) {
  const std::size_t units = input.model.model.units.size();
  const std::size_t virtual_stages = static_cast<std::size_t>(input.schedule.virtual_stages());
  const auto& counts = input.units_per_virtual_stage;
  if (counts.size() != virtual_stages) {
    throw Error(ErrorKind::kConfig,
                "pipeline.partition: " + std::to_string(counts.size()) +
                    " virtual stages partitioned, but the schedule has " +
                    std::to_string(virtual_stages));
  }
  if (std::accumulate(counts.begin(), counts.end(), std::size_t{0}) != units ||
      std::find(counts.begin(), counts.end(), std::size_t{0}) != counts.end()) {
    throw Error(ErrorKind::kConfig, "pipeline.partition: does not cover the model's " +
                                        std::to_string(units) +
                                        " units with a non-empty run per virtual stage");
  }
}

// The activations each unit of a pipeline stage's list leaves from its forward to its backward, as
// the engine holds them: its output and what its policy keeps; with cpu_checkpointing a recomputed
// unit's input (the previous unit's output) waits on the host instead.
std::vector<std::size_t> kept_bytes(const std::vector<UnitMemory>& memory,
                                    const std::vector<RecomputePolicy>& recompute,
                                    bool cpu_checkpointing) {
  std::vector<std::size_t> kept;
  for (std::size_t i = 0; i < memory.size(); ++i) {
    std::size_t bytes = memory[i].output;
    if (recompute[i] == RecomputePolicy::kNone) bytes += memory[i].saved;
    if (recompute[i] == RecomputePolicy::kSelective) bytes += memory[i].selective_saved;
    kept.push_back(bytes);
  }
  for (std::size_t i = 1; cpu_checkpointing && i < memory.size(); ++i) {
    if (recompute[i] != RecomputePolicy::kNone) kept[i - 1] -= memory[i - 1].output;
  }
  return kept;
}

struct StageUnits {
  PeakPlanInput input;                     // the pipeline stage's list: own units and tied copies
  std::vector<std::size_t> global;         // the list's global indices, in model order
  std::vector<bool> own;                   // false: a tied copy (held, never run here)
};

// Per unit of the whole model, what it recomputes: the model's plan, so that a pipeline stage
// of units none of which can recompute (the embedding alone) recomputes nothing rather than
// failing, and a pipeline stage's last unit (whose backward waits for the later pipeline stages)
// may recompute.
std::vector<RecomputePolicy> model_recompute(const PeakPlanInput& model) {
  if (model.units.empty()) return {};
  std::vector<Recomputable> recomputable;
  for (std::size_t u = 0; u < model.units.size(); ++u) {
    recomputable.push_back(
        {!model.model.units[u].gradients_replace_parameters, model.units[u].selective});
  }
  return plan_recompute(model.engine.activation_checkpointing, recomputable);
}

StageUnits stage_units(const PipelinePlanInput& input, int pipeline_stage,
                       const std::vector<std::size_t>& boundaries,
                       const std::vector<RecomputePolicy>& recompute) {
  const Schedule& schedule = input.schedule;
  std::set<std::size_t> own;
  for (int chunk = 0; chunk < schedule.chunks; ++chunk) {
    const int v = schedule.virtual_stage(pipeline_stage, chunk);
    for (std::size_t u = boundaries[v]; u < boundaries[v + 1]; ++u) own.insert(u);
  }
  std::set<std::size_t> all = own;
  for (std::size_t u : own) {
    for (int borrowed : input.model.model.units[u].borrowed) {
      all.insert(static_cast<std::size_t>(borrowed));
    }
  }
  StageUnits out;
  out.input = input.model;
  out.input.model.units.clear();
  out.input.units.clear();
  std::map<std::size_t, int> local_of;
  for (std::size_t u : all) {
    local_of[u] = static_cast<int>(out.global.size());
    out.global.push_back(u);
    out.own.push_back(own.count(u) > 0);
  }
  const bool has_memory = !input.model.units.empty();
  for (std::size_t i = 0; i < out.global.size(); ++i) {
    UnitShapes shapes = input.model.model.units[out.global[i]];
    for (int& borrowed : shapes.borrowed) borrowed = local_of.at(static_cast<std::size_t>(borrowed));
    if (!out.own[i]) shapes.borrowed.clear();
    out.input.model.units.push_back(std::move(shapes));
    // A tied copy computes nothing here: only its model state (and its gathers and buckets as
    // the borrower's) count.
    if (has_memory) out.input.units.push_back(out.own[i] ? input.model.units[out.global[i]] : UnitMemory{});
    if (!recompute.empty()) {
      out.input.recompute.push_back(out.own[i] ? recompute[out.global[i]] : RecomputePolicy::kNone);
    }
  }
  return out;
}

// The splits rank (pipeline stage, 0) of the mesh makes (PipelineTrainer::build_groups, in its
// order): its data-parallel group, whose own splits are the hybrid shard and replica groups or each
// chunk trainer's hpZ group; the two pipeline groups; the tied units' group.
std::deque<shape::ShapeGroup> pipeline_splits(const PipelinePlanInput& input, int pipeline_stage) {
  const PeakPlanInput& model = input.model;
  const Schedule& schedule = input.schedule;
  std::vector<shape::ShapeGroup> data_parallel_splits;
  if (model.replicas > 1) {
    data_parallel_splits = {{0, model.world_size}, {0, model.replicas}};
  } else {
    const int hpz = hpz_group_size(model.engine.hpz_group_size, model.engine.stage,
                                       model.world_size, model.world_size);
    if (hpz > 0) data_parallel_splits.assign(static_cast<std::size_t>(schedule.chunks), {0, hpz});
  }
  return {{0, model.world_size * model.replicas, std::move(data_parallel_splits)},
          {pipeline_stage, schedule.pipeline_stages},
          {pipeline_stage, schedule.pipeline_stages},
          {pipeline_stage == 0 ? 0 : 1, 2}};
}

// Rank (pipeline stage, 0) of the mesh trains two steps on the shape-only device
// (runtime/shape_device.h): the real PipelineTrainer — its chunks' ZeroTrainers and StageRunners,
// the interpreter over the schedule's action list — over ShapeModules, its transfers answered by
// the shape communicator without data; its allocators are the ledger. The ranks of a pipeline stage
// are alike.
PeakPrediction train_stage_on_shape_device(const PipelinePlanInput& input, int pipeline_stage,
                                           const std::vector<std::size_t>& boundaries) {
  const PeakPlanInput& model = input.model;
  const Schedule& schedule = input.schedule;
  const int data_parallel = model.world_size * model.replicas;
  const int world = schedule.pipeline_stages * data_parallel;
  shape::ShapeDevice device(0, model.device);
  const auto compute = device.create_stream("compute");
  const auto comm = device.create_stream("comm");
  const auto prefetch = device.create_stream("prefetch");
  shape::ShapeCommunicator communicator(pipeline_stage * data_parallel, world,
                                        pipeline_splits(input, pipeline_stage));
  RankContext context{
      pipeline_stage * data_parallel, world, device, *compute, *comm, *prefetch, communicator};
  context.topology = Topology(world, world);
  EngineOptions options = model.engine;
  options.gradient_accumulation_steps = 1;  // the pipeline's micro-batches are the schedule's
  options.hybrid_shard_size = model.replicas > 1 ? model.world_size : 0;
  options.out_of_memory_advice = nullptr;
  if (model.units.empty()) options.activation_checkpointing = {};  // no activations to drop
  PipelineOptions pipeline;
  pipeline.stages = schedule.pipeline_stages;
  pipeline.micro_batches = schedule.micro_batches;
  pipeline.virtual_chunks = schedule.chunks;
  // The actions are `schedule`'s; the kind is checked only against the chunk count.
  pipeline.schedule =
      schedule.chunks > 1 ? ScheduleKind::kInterleavedOneFOneB : ScheduleKind::kOneFOneB;
  pipeline.units_per_virtual_stage = input.units_per_virtual_stage;
  pipeline.reshard_after_forward = input.reshard_after_forward;
  // A tensor-parallel rank's group (the model is that rank's slices): its collectives do
  // nothing here, but the pipeline runs its step's sums over it as it does in a run.
  std::unique_ptr<shape::ShapeCommunicator> tensor_group;
  if (model.tensor_parallel_size > 1) {
    tensor_group = std::make_unique<shape::ShapeCommunicator>(model.tensor_parallel_size - 1,
                                                              model.tensor_parallel_size);
  }
  std::size_t swap_bytes = 0;
  MemoryPrediction state;
  {
    PipelineTrainer trainer(
        context, options, pipeline, schedule,
        [&model, group = tensor_group.get()] {
          return std::make_unique<ShapeModule>(model, group);
        },
        shape_optimizer(model.model.optimizer_states));
    const auto output_of = [&](std::size_t unit) {
      return model.units.empty() ? std::size_t{0} : model.units[unit].output;
    };
    // An asynchronous checkpoint's snapshot buffers, held from before the steps as a run holds
    // them from its first save: each holds the units this pipeline stage saves.
    std::vector<Buffer> snapshots;
    if (model.snapshots > 0) {
      const std::size_t bytes = state_bytes(trainer, saved_units(*trainer.checkpoint_placement()));
      for (int i = 0; i < model.snapshots; ++i) {
        snapshots.push_back(device.host_allocator().allocate(bytes, Category::kSnapshot));
      }
    }
    trainer.answer_shape_headers([&](int v) {
      const auto bytes = static_cast<std::int64_t>(output_of(boundaries[v] - 1));
      return Tensor{nullptr, {bytes}, DType::kInt8};
    });
    if (!model.model_state_only) {
      const ShapeBatch batch(model.batch_bytes, schedule.micro_batches);
      for (int step = 0; step < 2; ++step) {
        trainer.forward_backward(batch.batch());
        trainer.step();
        if (model.synchronize_between_steps) context.comm.synchronize();
      }
    }
    swap_bytes = trainer.swap_bytes();
    state = trainer.predicted_memory();
  }
  PeakPrediction prediction;
  prediction.model_state = state;
  prediction.model_state.nvme = swap_bytes;
  const MemoryUsage usage = device.allocator().usage();
  for (Category category : all_categories()) {
    prediction.peak[static_cast<std::size_t>(category)] = usage.peak_of(category);
  }
  prediction.device_total = usage.total_peak;
  const MemoryUsage host = device.host_allocator().usage();
  prediction.peak[static_cast<std::size_t>(Category::kOffload)] = state.offload;
  for (Category category : all_categories()) {
    prediction.host_peak[static_cast<std::size_t>(category)] = host.peak_of(category);
  }
  prediction.host_peak_total = host.total_peak;
  return prediction;
}

}  // namespace

std::vector<PipelineStagePeak> predict_pipeline_peaks(const PipelinePlanInput& input) {
  check_partition(input);
  const Schedule& schedule = input.schedule;
  const std::vector<std::size_t> boundaries = partition_boundaries(input.units_per_virtual_stage);
  const ScheduleSimulation simulation = simulate_schedule(schedule);
  const int last_virtual = schedule.virtual_stages() - 1;
  const bool cuda = input.model.device == DeviceKind::kCuda;
  const std::vector<UnitMemory>& memory = input.model.units;
  const bool has_memory = !memory.empty();

  const std::vector<RecomputePolicy> recompute = model_recompute(input.model);
  std::vector<PipelineStagePeak> peaks;
  for (int pipeline_stage = 0; pipeline_stage < schedule.pipeline_stages; ++pipeline_stage) {
    StageUnits units = stage_units(input, pipeline_stage, boundaries, recompute);
    PipelineStagePeak peak;
    peak.pipeline_stage = pipeline_stage;
    peak.peak_in_flight = simulation.pipeline_stages[pipeline_stage].peak_in_flight;
    for (std::size_t i = 0; i < units.global.size(); ++i) {
      (units.own[i] ? peak.units : peak.tied_copies).push_back(units.global[i]);
    }
    peak.one_in_flight = predict_peak(units.input);

    // Per chunk: what a micro-batch leaves on this pipeline stage from forward to backward, as the
    // engine holds it (kept), and the received input it also keeps (received), then the gradient of
    // the chunk's output that its backward receives.
    std::vector<std::size_t> kept(schedule.chunks, 0), received(schedule.chunks, 0);
    std::size_t gradient_buffer = 0;
    if (has_memory) {
      const ActivationCheckpointing& checkpointing = input.model.engine.activation_checkpointing;
      const std::vector<std::size_t> unit_kept =
          kept_bytes(units.input.units, units.input.recompute, checkpointing.cpu_checkpointing);
      for (int chunk = 0; chunk < schedule.chunks; ++chunk) {
        const int v = schedule.virtual_stage(pipeline_stage, chunk);
        for (std::size_t i = 0; i < units.global.size(); ++i) {
          const std::size_t u = units.global[i];
          if (units.own[i] && u >= boundaries[v] && u < boundaries[v + 1]) kept[chunk] += unit_kept[i];
        }
        if (v == 0 && cuda) kept[chunk] += input.model.batch_bytes;
        if (v > 0) received[chunk] = memory[boundaries[v] - 1].output;
        if (v < last_virtual) {
          gradient_buffer = std::max(gradient_buffer, memory[boundaries[v + 1] - 1].output);
        }
      }
    }
    const std::size_t kept_total = std::accumulate(kept.begin(), kept.end(), std::size_t{0});
    peak.received_activations = std::accumulate(received.begin(), received.end(), std::size_t{0});
    peak.kept_per_micro_batch = kept_total + peak.received_activations;
    peak.received_gradients = gradient_buffer;

    // The schedule's order: a micro-batch's activations on a chunk are held from its forward to
    // its (weight-gradient) backward.
    std::size_t held = 0;
    for (const Action& action : schedule.actions[pipeline_stage]) {
      const std::size_t bytes = kept[action.chunk] + received[action.chunk];
      if (action.kind == ActionKind::kForward) {
        held += bytes;
        peak.in_flight_activations = std::max(peak.in_flight_activations, held);
      } else if (action.kind == ActionKind::kBackward ||
                 action.kind == ActionKind::kBackwardWeight) {
        held -= bytes;
      }
    }

    if (gathered_for_step(input.model.engine.stage, input.reshard_after_forward)) {
      for (const UnitShapes& shapes : units.input.model.units) {
        const ShardLayout layout = ShardLayout::build(shapes.name, shapes.params,
                                                      units.input.world_size,
                                                      units.input.model.alignment);
        peak.gathered_for_step += layout.flat_length() * element_size(input.model);
      }
    }
    peak.peak = train_stage_on_shape_device(input, pipeline_stage, boundaries);
    peaks.push_back(std::move(peak));
  }
  return peaks;
}

UnitCost pipeline_memory_cost(const PeakPlanInput& model, const Schedule& schedule) {
  const ScheduleSimulation simulation = simulate_schedule(schedule);
  std::vector<std::uint64_t> state, activations;
  for (std::size_t u = 0; u < model.model.units.size(); ++u) {
    ModelStateShape one = model.model;
    one.units = {model.model.units[u]};
    one.units[0].borrowed.clear();
    state.push_back(predict_model_state(one, model.engine.stage, model.world_size,
                                        model.engine.offload_optimizer.enabled())
                        .total());
    const UnitMemory unit = u < model.units.size() ? model.units[u] : UnitMemory{};
    activations.push_back(unit.output + unit.saved);
  }
  std::vector<std::uint64_t> in_flight;
  for (const StageTimeline& timeline : simulation.pipeline_stages) {
    in_flight.push_back(static_cast<std::uint64_t>(timeline.peak_in_flight));
  }
  return [state = std::move(state), activations = std::move(activations),
          in_flight = std::move(in_flight),
          pipeline_stages = schedule.pipeline_stages](int v, std::size_t u) {
    return state[u] + in_flight[static_cast<std::size_t>(v % pipeline_stages)] * activations[u];
  };
}

}  // namespace zest
