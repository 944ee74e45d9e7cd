#include "planner/pipeline_plan.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <utility>

#include "base/error.h"
#include "memory/shard_layout.h"
#include "pipeline/pipeline_options.h"
#include "pipeline/schedule_simulator.h"
#include "planner/engine_replay.h"
#include "planner/peak_ledger.h"

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

// The activations each unit of a stage's list leaves from its forward to its backward, as
// Replay::forward holds them: its output and what its policy keeps; with cpu_checkpointing a
// recomputed unit's input (the previous unit's output) waits on the host instead.
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
  PeakPlanInput input;                     // the stage's list: own units and tied copies
  std::vector<std::size_t> global;         // the list's global indices, in model order
  std::vector<bool> own;                   // false: a tied copy (held, never run here)
};

// Per unit of the whole model, what it recomputes: the model's plan, so that a pipeline stage
// of units none of which can recompute (the embedding alone) recomputes nothing rather than
// failing, and a stage's last unit (whose backward waits for the later stages) may recompute.
std::vector<RecomputePolicy> model_recompute(const PeakPlanInput& model) {
  if (model.units.empty()) return {};
  std::vector<Recomputable> recomputable;
  for (std::size_t u = 0; u < model.units.size(); ++u) {
    recomputable.push_back(
        {!model.model.units[u].gradients_replace_parameters, model.units[u].selective});
  }
  return plan_recompute(model.engine.activation_checkpointing, recomputable);
}

StageUnits stage_units(const PipelinePlanInput& input, int stage,
                       const std::vector<std::size_t>& boundaries,
                       const std::vector<RecomputePolicy>& recompute) {
  const Schedule& schedule = input.schedule;
  std::set<std::size_t> own;
  for (int chunk = 0; chunk < schedule.chunks; ++chunk) {
    const int v = schedule.virtual_stage(stage, chunk);
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

// One chunk's trainer as the pipeline builds it: a SubModule of virtual stage v's units, lenders
// before the range placed first as copies (engine/sub_module.h).
struct ChunkUnits {
  PeakPlanInput input;
  std::size_t copies = 0;
};

ChunkUnits chunk_units(const PipelinePlanInput& input, int v,
                       const std::vector<std::size_t>& boundaries,
                       const std::vector<RecomputePolicy>& recompute) {
  const std::size_t begin = boundaries[v];
  const std::size_t end = boundaries[v + 1];
  const auto& whole = input.model.model.units;
  std::set<std::size_t> lenders;
  std::vector<int> pending;
  for (std::size_t u = begin; u < end; ++u) {
    pending.insert(pending.end(), whole[u].borrowed.begin(), whole[u].borrowed.end());
  }
  while (!pending.empty()) {
    const auto b = static_cast<std::size_t>(pending.back());
    pending.pop_back();
    if (b >= begin || !lenders.insert(b).second) continue;
    pending.insert(pending.end(), whole[b].borrowed.begin(), whole[b].borrowed.end());
  }
  std::vector<std::size_t> global(lenders.begin(), lenders.end());
  ChunkUnits out;
  out.copies = global.size();
  for (std::size_t u = begin; u < end; ++u) global.push_back(u);
  std::map<std::size_t, int> local_of;
  for (std::size_t i = 0; i < global.size(); ++i) local_of[global[i]] = static_cast<int>(i);
  out.input = input.model;
  out.input.model.units.clear();
  out.input.units.clear();
  out.input.recompute.clear();
  for (std::size_t i = 0; i < global.size(); ++i) {
    UnitShapes shapes = whole[global[i]];
    std::vector<int> borrowed;
    for (int b : shapes.borrowed) {
      const auto at = local_of.find(static_cast<std::size_t>(b));
      if (at != local_of.end()) borrowed.push_back(at->second);
    }
    shapes.borrowed = std::move(borrowed);
    out.input.model.units.push_back(std::move(shapes));
    const bool copy = i < out.copies;
    if (!input.model.units.empty()) {
      out.input.units.push_back(copy ? UnitMemory{} : input.model.units[global[i]]);
    }
    if (!recompute.empty()) {
      out.input.recompute.push_back(copy ? RecomputePolicy::kNone : recompute[global[i]]);
    }
  }
  if (gathered_for_step(input.model.engine.stage, input.reshard_after_forward)) {
    // PipelineTrainer: a slot per unit, so a unit once gathered stays for the step.
    out.input.engine.gather_slots = std::max(out.input.engine.gather_slots, global.size());
  }
  return out;
}

// The stage's two steps as the interpreter (pipeline/interpreter.cc) runs its action list: a
// chunk trainer's calls replayed by EngineReplay, the transfers' buffers around them, and on the
// CPU device the host's waits — for compute after each forward or backward, for comm after each
// backward, for the chunk's last gradient send before its next backward.
PeakPrediction replay_stage(const PipelinePlanInput& input, int stage,
                            const std::vector<std::size_t>& boundaries,
                            const std::vector<RecomputePolicy>& recompute) {
  using Handle = PeakLedger::Handle;
  using Stream = PeakLedger::Stream;
  constexpr Handle kNone = PeakLedger::kNone;
  constexpr std::size_t kHeaderBytes = 8 * sizeof(std::int64_t);
  const Schedule& schedule = input.schedule;
  const int last_virtual = schedule.virtual_stages() - 1;
  const int m = std::max(schedule.micro_batches, 1);
  const bool cuda = input.model.device == DeviceKind::kCuda;
  const std::vector<UnitMemory>& memory = input.model.units;
  const auto output_of = [&](std::size_t unit) { return memory.empty() ? 0 : memory[unit].output; };
  PeakLedger ledger(cuda);
  EngineReplay::StreamScratch scratch;  // the chunks' trainers share the compute stream
  std::vector<ChunkUnits> inputs;
  std::vector<std::unique_ptr<EngineReplay>> chunks;
  for (int c = 0; c < schedule.chunks; ++c) {
    inputs.push_back(chunk_units(input, schedule.virtual_stage(stage, c), boundaries, recompute));
  }
  for (int c = 0; c < schedule.chunks; ++c) {
    chunks.push_back(
        std::make_unique<EngineReplay>(inputs[c].input, ledger, inputs[c].copies, &scratch));
    chunks.back()->construct();
  }
  if (input.model.model_state_only) return chunks.front()->result();
  struct Slot {
    Handle staged = kNone, received = kNone, received_gradient = kNone, grad_input = kNone;
    std::size_t sent = 0;
  };
  for (int step = 0; step < 2; ++step) {
    std::vector<std::vector<Slot>> slots(schedule.chunks, std::vector<Slot>(m));
    std::vector<bool> header_sent(schedule.chunks, false), header_received(schedule.chunks, false);
    std::vector<Handle> headers;
    std::vector<std::size_t> gradient_sent(schedule.chunks, 0);
    std::vector<int> backwards(schedule.chunks, 0);
    const auto reduce_now = [&](int c) {
      return chunks[c]->reduces_every_micro_batch() || ++backwards[c] == m;
    };
    const auto host_waits = [&](bool reductions) {
      if (cuda) return;
      ledger.synchronize(Stream::kCompute);
      if (reductions) ledger.synchronize(Stream::kComm);
    };
    for (const Action& action : schedule.actions[stage]) {
      // kReduce and kStep (micro_batch -1) hold no buffers here: the chunk trainers' step does.
      if (action.micro_batch < 0) continue;
      const int c = action.chunk;
      const int v = schedule.virtual_stage(stage, c);
      Slot& slot = slots[c][action.micro_batch];
      EngineReplay& chunk = *chunks[c];
      switch (action.kind) {
        case ActionKind::kForward:
          if (cuda && (v == 0 || v == last_virtual)) {
            slot.staged = ledger.allocate(input.model.batch_bytes, Category::kActivations);
          }
          chunk.forward_micro_batch(action.micro_batch);
          host_waits(false);
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput: {
          if (!cuda) ledger.synchronize(Stream::kSendGradients, gradient_sent[c]);
          ledger.wait(Stream::kCompute, Stream::kSendActivations, slot.sent);
          const bool split = action.kind == ActionKind::kBackwardInput && chunk.splits_backward();
          Handle local = kNone;
          if (v < last_virtual && schedule.stage_of(v + 1) == stage) {
            Slot& next = slots[schedule.chunk_of(v + 1)][action.micro_batch];
            local = std::exchange(next.grad_input, kNone);
          }
          slot.grad_input = split ? chunk.backward_input_micro_batch(action.micro_batch)
                                  : chunk.backward_micro_batch(action.micro_batch, reduce_now(c));
          ledger.release_on(Stream::kCompute, std::exchange(slot.received_gradient, kNone));
          ledger.release_on(Stream::kCompute, local);
          if (!split) {
            ledger.release_on(Stream::kCompute, std::exchange(slot.received, kNone));
            ledger.release_on(Stream::kCompute, std::exchange(slot.staged, kNone));
          }
          host_waits(true);
          break;
        }
        case ActionKind::kBackwardWeight:
          if (!chunk.splits_backward()) break;
          chunk.backward_weight_micro_batch(action.micro_batch, reduce_now(c));
          ledger.release_on(Stream::kCompute, std::exchange(slot.received, kNone));
          ledger.release_on(Stream::kCompute, std::exchange(slot.staged, kNone));
          host_waits(true);
          break;
        case ActionKind::kSendActivations:
          ledger.wait(Stream::kSendActivations, Stream::kCompute, ledger.record(Stream::kCompute));
          if (!header_sent[c]) {  // the shape header, kept until the step's end
            headers.push_back(ledger.allocate(kHeaderBytes, Category::kWorkspace));
            header_sent[c] = true;
          }
          slot.sent = ledger.record(Stream::kSendActivations);
          break;
        case ActionKind::kReceiveActivations:
          if (!header_received[c]) {  // read by the host at once, then freed
            const Handle header = ledger.allocate(kHeaderBytes, Category::kWorkspace);
            ledger.synchronize(Stream::kCompute);
            ledger.release(header);
            header_received[c] = true;
          }
          slot.received = ledger.allocate(output_of(boundaries[v] - 1), Category::kActivations);
          break;
        case ActionKind::kSendGradients:
          ledger.wait(Stream::kSendGradients, Stream::kCompute, ledger.record(Stream::kCompute));
          ledger.release_on(Stream::kSendGradients, std::exchange(slot.grad_input, kNone));
          gradient_sent[c] = ledger.record(Stream::kSendGradients);
          break;
        case ActionKind::kReceiveGradients:
          slot.received_gradient =
              ledger.allocate(output_of(boundaries[v + 1] - 1), Category::kActivations);
          break;
        case ActionKind::kReduce:
        case ActionKind::kStep:
          break;
      }
    }
    // forward_backward's end: every stream waited for, then the step's buffers go.
    for (Stream stream : {Stream::kSendActivations, Stream::kSendGradients, Stream::kCompute,
                          Stream::kComm}) {
      ledger.synchronize(stream);
    }
    for (Handle header : headers) ledger.release(header);
    for (auto& chunk_slots : slots) {
      for (Slot& slot : chunk_slots) ledger.release(slot.grad_input);
    }
    for (auto& chunk : chunks) chunk->step();
  }
  PeakPrediction prediction = chunks.front()->result();
  MemoryPrediction state;
  for (const auto& chunk : chunks) {
    const MemoryPrediction part = chunk->result().model_state;
    state.params += part.params;
    state.grads += part.grads;
    state.optimizer += part.optimizer;
    state.offload += part.offload;
  }
  prediction.model_state = state;
  prediction.peak[static_cast<std::size_t>(Category::kOffload)] = state.offload;
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
  for (int stage = 0; stage < schedule.stages; ++stage) {
    StageUnits units = stage_units(input, stage, boundaries, recompute);
    PipelineStagePeak peak;
    peak.stage = stage;
    peak.peak_in_flight = simulation.stages[stage].peak_in_flight;
    for (std::size_t i = 0; i < units.global.size(); ++i) {
      (units.own[i] ? peak.units : peak.tied_copies).push_back(units.global[i]);
    }
    peak.one_in_flight = predict_peak(units.input);

    // Per chunk: what a micro-batch leaves on this stage from forward to backward, as the replay
    // holds it (kept), and the received input it also keeps (received), then the gradient of
    // the chunk's output that its backward receives.
    std::vector<std::size_t> kept(schedule.chunks, 0), received(schedule.chunks, 0);
    std::size_t gradient_buffer = 0;
    if (has_memory) {
      const ActivationCheckpointing& checkpointing = input.model.engine.activation_checkpointing;
      const std::vector<std::size_t> unit_kept =
          kept_bytes(units.input.units, units.input.recompute, checkpointing.cpu_checkpointing);
      for (int chunk = 0; chunk < schedule.chunks; ++chunk) {
        const int v = schedule.virtual_stage(stage, chunk);
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
    for (const Action& action : schedule.actions[stage]) {
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
    peak.peak = replay_stage(input, stage, boundaries, recompute);
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
  for (const StageTimeline& timeline : simulation.stages) {
    in_flight.push_back(static_cast<std::uint64_t>(timeline.peak_in_flight));
  }
  return [state = std::move(state), activations = std::move(activations),
          in_flight = std::move(in_flight), stages = schedule.stages](int v, std::size_t u) {
    return state[u] + in_flight[static_cast<std::size_t>(v % stages)] * activations[u];
  };
}

}  // namespace zest
