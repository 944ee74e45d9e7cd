#include "planner/pipeline_replay.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "pipeline/pipeline_options.h"
#include "planner/engine_replay.h"
#include "planner/peak_ledger.h"

namespace zest {
namespace {

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
}  // namespace

PeakPrediction replay_cuda_stage(const PipelinePlanInput& input, int stage,
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

}  // namespace zest
