// The pipeline interpreter proper: one step of PipelineTrainer (pipeline_trainer.h) is its
// rank's action list of the schedule, run in order. How each action is issued, and why:
// - forward / backward: the chunk's PipelineStageRunner (stage_runner.h), which runs its
// ZeroTrainer on
//   the micro-batch's own Unit objects; the host returns at once, the work runs on compute.
// - send: on a stream of its own (one for activations, one for gradients) after an event on
//   compute. A send waits for its receive (rendezvous), so on compute it would hold up the rank,
//   which the simulator's check assumes never happens. Compute waits for an activation send
//   before the backward that frees the sent output; a sent gradient is freed in its send
//   stream's order.
// - receive: on compute, where the forward or backward that reads it follows. The first
//   activations a chunk receives in a step come after a header with their shape (the receiver
//   cannot know a unit's output shape); the rest of the step's micro-batches have the same one.
//   A gradient's shape is that of the output it belongs to.
// - backward-input / backward-weight: a chunk whose units all split their backward (the MLP's
//   layers) runs the input gradient at B and the weight gradients at W; any other chunk runs
//   its whole backward at B and nothing at W (the schedule stays valid: W only fills time).
// - reduce: nothing more — the chunk trainer reduced in its data-parallel group during the step's
//   last backward (stages 0-1 once per step, 2-3 per micro-batch as their plan says). After the
//   list, the tied units' reduced gradients are summed across their two pipeline stages (sum_tied).
//   step: PipelineTrainer::step().
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "base/error.h"
#include "engine/device_batch.h"
#include "pipeline/pipeline_trainer.h"
#include "runtime/host_collectives.h"
#include "runtime/host_copies.h"
#include "runtime/release_after.h"

namespace zest {

namespace {

constexpr std::size_t kHeader = 8;  // rank, up to 6 dimensions, dtype
// Transfers move bytes: int64 values travel as an 8-byte type.
constexpr DType kHeaderType = DType::kFloat64;

// Rows [first, first + count) of a tensor whose first dimension is rows.
Tensor rows_of(const Tensor& tensor, std::int64_t first, std::int64_t count) {
  if (tensor.empty()) return {};
  Tensor part = tensor;
  const std::size_t row_bytes = tensor.bytes() / static_cast<std::size_t>(tensor.dim(0));
  part.data = static_cast<char*>(tensor.data) + static_cast<std::size_t>(first) * row_bytes;
  part.shape[0] = count;
  return part;
}

}  // namespace

struct PipelineTrainer::Step {
  struct MicroBatchState {  // one micro-batch on one chunk
    std::unique_ptr<DeviceBatch> staged;  // the first and last virtual stage's rows
    Batch batch;                          // what the chunk's forward and backward read
    Buffer received;                      // activations from the previous pipeline stage
    Tensor output;                        // the forward's output
    std::unique_ptr<Event> sent;          // the output's send has run
    Buffer received_gradient;  // the gradient of the output, from the next pipeline stage
    Tensor grad_input;
    Buffer grad_input_owner;
  };
  Batch host;
  std::int64_t rows = 0;                 // per micro-batch
  std::vector<std::vector<MicroBatchState>> states;  // [chunk][micro-batch]
  std::vector<bool> header_sent;         // per chunk
  std::vector<std::vector<std::int64_t>> received_shape;  // per chunk, from the header
  std::vector<DType> received_dtype;
  std::vector<Buffer> headers;           // freed after the streams that read them
  std::vector<std::unique_ptr<Event>> events;  // waited on by the send streams
  // Per chunk: its last gradient send and the release of the sent buffer have run.
  std::vector<std::unique_ptr<Event>> gradient_sent;
};

float PipelineTrainer::forward_backward(const Batch& batch) {
  if (step_pending_) {
    throw Error(ErrorKind::kUsage, "forward_backward() twice without step(); a pipeline runs "
                                   "the whole step's micro-batches in one call");
  }
  const int m = pipeline_.micro_batches;
  const Tensor& shaped = batch.inputs.empty() ? batch.targets : batch.inputs;
  if (shaped.rank() == 0 || shaped.dim(0) % m != 0) {
    throw Error(ErrorKind::kUsage, "forward_backward: the step's rows (" +
                                       (shaped.rank() ? std::to_string(shaped.dim(0)) : "none") +
                                       ") are not a multiple of pipeline.micro_batches (" +
                                       std::to_string(m) + ")");
  }
  const std::int64_t step_number = chunks_.front().trainer->steps_taken() + 1;
  for (Communicator* group : {&context_.communicator, data_parallel_.get(), activations_.get(),
                              gradients_.get(), tied_.get(),
                              static_cast<Communicator*>(hybrid_.get())}) {
    if (group) group->begin_step(step_number);
  }
  Step step;
  step.host = batch;
  step.rows = shaped.dim(0) / m;
  step.states.resize(chunks_.size());
  for (auto& chunk : step.states) chunk.resize(static_cast<std::size_t>(m));
  step.header_sent.assign(chunks_.size(), false);
  step.received_shape.resize(chunks_.size());
  step.received_dtype.assign(chunks_.size(), DType::kFloat32);
  step.gradient_sent.resize(chunks_.size());
  const std::vector<Action>& actions = schedule_.actions[static_cast<std::size_t>(at_.pipeline_stage)];
  // The step's buffers and events go with `step`: every stream that uses them must be past them
  // first, also when an action failed (a peer's failure ends the transfers waiting for it).
  try {
    for (std::size_t i = 0; i < actions.size(); ++i) {
      inject_fault(i, actions.size());
      run_action(step, actions[i]);
    }
    send_activations_->synchronize();
    send_gradients_->synchronize();
    context_.synchronize();
  } catch (...) {
    // Note: each stream on its own — a stream that failed must not keep the others from being
    // waited for, or `step`'s events would die under a stream still waiting on them.
    for (Stream* stream : {send_activations_.get(), send_gradients_.get(), &context_.compute,
                           &context_.comm, &context_.prefetch}) {
      try {
        stream->synchronize();
      } catch (...) {
        // The first failure is the one rethrown.
      }
    }
    throw;
  }
  sum_tied();
  ZeroTrainer::StepTotals totals;
  for (Chunk& chunk : chunks_) {
    const ZeroTrainer::StepTotals part =
        chunk.runner->step_totals(mesh_.data_parallel_size());
    for (int k = 0; k < 3; ++k) totals.values[k] += part.values[k];
  }
  // The loss lives on the last pipeline stage, the norm's parts on every pipeline stage: one
  // all-reduce over the world gives every rank both (lent copies left out of the norm: their owners
  // count them).
  context_.communicator.label_next("pipeline step loss, norm, overflow");
  all_reduce_host(context_, totals.values, totals.values, 3, DType::kFloat32, Reduction::kSum);
  if (tensor_ != nullptr) {
    // Each tensor-parallel rank counted its own slices (and the first, the replicated
    // parameters); the loss is the same on every one of them.
    tensor_->label_next("pipeline step norm, overflow across the tensor-parallel group");
    all_reduce_host(context_, *tensor_, totals.values + 1, totals.values + 1, 2, DType::kFloat32,
                    Reduction::kSum);
  }
  context_.synchronize();
  totals_ = totals;
  step_pending_ = true;
  return totals.values[0];
}

void PipelineTrainer::run_action(Step& step, const Action& action) {
  const int s = at_.pipeline_stage;
  const auto c = static_cast<std::size_t>(action.chunk);
  const int v = schedule_.virtual_stage(s, action.chunk);
  const int last = schedule_.virtual_stages() - 1;
  const std::string label = describe_action(action, schedule_.chunks);
  Chunk& chunk = chunks_.at(c);
  const auto state_at = [&](std::size_t chunk_index) -> Step::MicroBatchState& {
    return step.states.at(chunk_index).at(static_cast<std::size_t>(action.micro_batch));
  };
  // Trace: the compute (or send) work enqueued between the two calls is one slice. On the CPU
  // device that work runs on the stream's own thread (kernels use one thread unless the process
  // owner raises kernel_threads), so that thread's CPU time over the slice is the action's work
  // without the time it waited, for an event or for a core (benchmarks/pipeline_bubble_bench.cc).
  const bool cpu_time = context_.device.kind() != DeviceKind::kCuda;
  const auto traced = [&](Stream& stream, const char* track, const std::function<void()>& work) {
    if (!context_.trace) return work();
    auto begin = std::make_shared<std::pair<std::int64_t, std::int64_t>>(0, 0);
    stream.enqueue([begin, cpu_time] {
      begin->first = TraceRecorder::now_us();
      if (cpu_time) begin->second = TraceRecorder::thread_cpu_us();
    });
    work();
    stream.enqueue(
        [begin, cpu_time, trace = context_.trace, rank = context_.rank_in_world(), track, label] {
          TraceRecorder::Slice slice;
          slice.rank = rank;
          slice.track = track;
          slice.name = label;
          slice.begin_us = begin->first;
          slice.end_us = TraceRecorder::now_us();
          if (cpu_time) slice.cpu_us = TraceRecorder::thread_cpu_us() - begin->second;
          trace->add(std::move(slice));
        });
  };
  // Note: on the CPU device a free waits for its stream, so a host that enqueued the whole step
  // before the streams ran it would hold every micro-batch's scratch at once. The host waits for
  // compute after each forward and backward, for comm after each backward (its reductions: the
  // engine's host would wait for them in the next backward anyway), and for the chunk's last
  // gradient send before its next backward, so that what is held is what the schedule holds
  // (planner/pipeline_plan.cc runs this code). The stream idles only while the host
  // enqueues one action; a CUDA device, whose pool frees in stream order, never waits.
  const bool bounded = context_.device.kind() != DeviceKind::kCuda;
  const auto host_waits = [&](bool reductions) {
    if (!bounded) return;
    context_.compute.synchronize();
    if (reductions) context_.comm.synchronize();
  };
  const auto after_compute = [&](Stream& stream) {
    std::unique_ptr<Event> made = context_.device.create_event();
    context_.compute.record(*made);
    stream.wait(*made);
    return made;  // kept alive by the caller until the stream is past it
  };
  switch (action.kind) {
    case ActionKind::kForward: {
      Step::MicroBatchState& state = state_at(c);
      if (v == 0 || v == last) {
        Batch rows;
        rows.inputs = rows_of(step.host.inputs, action.micro_batch * step.rows, step.rows);
        rows.targets = rows_of(step.host.targets, action.micro_batch * step.rows, step.rows);
        state.staged = std::make_unique<DeviceBatch>(context_.device, context_.compute, rows);
        state.batch = state.staged->batch();
      }
      if (v > 0) {
        const int previous = v - 1;
        state.batch.inputs = schedule_.stage_of(previous) == s
                                ? state_at(static_cast<std::size_t>(schedule_.chunk_of(previous))).output
                                : Tensor{state.received.data(), step.received_shape[c],
                                         step.received_dtype[c]};
      }
      traced(context_.compute, "compute", [&] {
        state.output = chunk.runner->forward(action.micro_batch, state.batch);
      });
      host_waits(false);
      break;
    }
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput: {
      Step::MicroBatchState& state = state_at(c);
      Tensor grad_output;
      Buffer* local_owner = nullptr;
      if (v < last) {
        const int next = v + 1;
        if (schedule_.stage_of(next) == s) {
          Step::MicroBatchState& after = state_at(static_cast<std::size_t>(schedule_.chunk_of(next)));
          grad_output = after.grad_input;
          local_owner = &after.grad_input_owner;
        } else {
          grad_output = Tensor{state.received_gradient.data(), state.output.shape, state.output.dtype};
        }
      }
      // The backward frees the output that a send may still be reading.
      if (state.sent) context_.compute.wait(*state.sent);
      if (bounded && step.gradient_sent[c]) step.gradient_sent[c]->synchronize();
      const bool split =
          action.kind == ActionKind::kBackwardInput && chunk.runner->splits_backward();
      traced(context_.compute, "compute", [&] {
        state.grad_input =
            split ? chunk.runner->backward_input(action.micro_batch, state.batch, grad_output,
                                                 state.grad_input_owner)
                  : chunk.runner->backward(action.micro_batch, state.batch, grad_output,
                                           state.grad_input_owner);
      });
      release_after(context_.device, context_.compute, std::move(state.received_gradient));
      if (local_owner) release_after(context_.device, context_.compute, std::move(*local_owner));
      // The weight gradient reads the pipeline stage's input (and the loss pipeline stage its
      // targets) later.
      if (!split) {
        release_after(context_.device, context_.compute, std::move(state.received));
        state.staged.reset();  // frees the staged copies in compute order
      }
      host_waits(true);
      break;
    }
    case ActionKind::kBackwardWeight: {
      if (!chunk.runner->splits_backward()) break;  // the whole backward ran at B
      Step::MicroBatchState& state = state_at(c);
      traced(context_.compute, "compute", [&] {
        chunk.runner->backward_weight(action.micro_batch, state.batch);
      });
      release_after(context_.device, context_.compute, std::move(state.received));
      state.staged.reset();
      host_waits(true);
      break;
    }
    case ActionKind::kSendActivations: {
      Step::MicroBatchState& state = state_at(c);
      std::unique_ptr<Event> ready = after_compute(*send_activations_);
      if (!step.header_sent[c]) {
        std::int64_t header[kHeader] = {};
        header[0] = static_cast<std::int64_t>(state.output.rank());
        if (state.output.rank() > kHeader - 2) {
          throw Error(ErrorKind::kUsage, "activations of rank " + std::to_string(state.output.rank()) +
                                             " between pipeline stages; at most 6 dimensions");
        }
        for (std::size_t d = 0; d < state.output.rank(); ++d) header[1 + d] = state.output.dim(d);
        header[kHeader - 1] = static_cast<std::int64_t>(state.output.dtype);
        Buffer buffer = context_.allocator().allocate(sizeof header, Category::kWorkspace);
        write_from_host(context_.device, *send_activations_, buffer.data(), header, sizeof header);
        activations_->label_next(("shape of the " + label).c_str());
        activations_->send(*send_activations_, buffer.data(), kHeader, kHeaderType, action.peer);
        step.headers.push_back(std::move(buffer));
        step.header_sent[c] = true;
      }
      activations_->label_next(label.c_str());
      traced(*send_activations_, "send", [&] {
        activations_->send(*send_activations_, state.output.data, state.output.numel(),
                           state.output.dtype, action.peer);
      });
      state.sent = context_.device.create_event();
      send_activations_->record(*state.sent);
      step.events.push_back(std::move(ready));
      break;
    }
    case ActionKind::kReceiveActivations: {
      Step::MicroBatchState& state = state_at(c);
      if (step.received_shape[c].empty()) {
        Buffer buffer = context_.allocator().allocate(kHeader * sizeof(std::int64_t),
                                                      Category::kWorkspace);
        activations_->label_next(("shape of the " + label).c_str());
        activations_->receive(context_.compute, buffer.data(), kHeader, kHeaderType, action.peer);
        std::int64_t header[kHeader] = {};
        read_to_host(context_.device, context_.compute, header, buffer.data(), sizeof header);
        step.received_shape[c].assign(header + 1, header + 1 + header[0]);
        step.received_dtype[c] = static_cast<DType>(header[kHeader - 1]);
        if (received_shapes_) {  // the shape-only device: the header read as zeros
          const Tensor answer = received_shapes_(v);
          step.received_shape[c] = answer.shape;
          step.received_dtype[c] = answer.dtype;
        }
        if (bounded) {
          buffer = Buffer();  // compute is past the receive: read_to_host waited for it
        } else {
          release_after(context_.device, context_.compute, std::move(buffer));
        }
      }
      const Tensor shape{nullptr, step.received_shape[c], step.received_dtype[c]};
      state.received = context_.allocator().allocate(shape.bytes(), Category::kActivations);
      activations_->label_next(label.c_str());
      activations_->receive(context_.compute, state.received.data(), shape.numel(), shape.dtype,
                            action.peer);
      break;
    }
    case ActionKind::kSendGradients: {
      Step::MicroBatchState& state = state_at(c);
      std::unique_ptr<Event> ready = after_compute(*send_gradients_);
      gradients_->label_next(label.c_str());
      traced(*send_gradients_, "send", [&] {
        gradients_->send(*send_gradients_, state.grad_input.data, state.grad_input.numel(),
                         state.grad_input.dtype, action.peer);
      });
      release_after(context_.device, *send_gradients_, std::move(state.grad_input_owner));
      if (!step.gradient_sent[c]) step.gradient_sent[c] = context_.device.create_event();
      send_gradients_->record(*step.gradient_sent[c]);
      step.events.push_back(std::move(ready));
      break;
    }
    case ActionKind::kReceiveGradients: {
      Step::MicroBatchState& state = state_at(c);
      state.received_gradient = context_.allocator().allocate(state.output.bytes(),
                                                             Category::kActivations);
      gradients_->label_next(label.c_str());
      gradients_->receive(context_.compute, state.received_gradient.data(), state.output.numel(),
                          state.output.dtype, action.peer);
      break;
    }
    case ActionKind::kReduce:
    case ActionKind::kStep:
      break;
  }
}

void PipelineTrainer::inject_fault(std::size_t action_index, std::size_t actions) {
  const FaultInjection& fault = engine_.fault;
  const std::int64_t step = chunks_.front().trainer->steps_taken() + 1;
  // Note: mid-schedule, where a failing rank leaves its peers inside sends and receives — the
  // case the pipeline must end without a hang.
  if (!fault.hits(context_.rank_in_world(), step)) return;
  if (fault.kind == FaultInjection::Kind::kFailAllocation) {
    // The step's first activation allocation: the first action's.
    if (action_index == 0) context_.allocator().fail_next_allocation(Category::kActivations);
    return;
  }
  if (action_index != actions / 2) return;
  if (fault.kind == FaultInjection::Kind::kThrow) {
    throw Error(ErrorKind::kInternal, "injected failure (debug.fault \"throw\") at step " +
                                          std::to_string(step) + ", mid-schedule");
  }
  if (fault.kind == FaultInjection::Kind::kStall) {
    std::this_thread::sleep_for(std::chrono::duration<double>(fault.stall_seconds));
  }
}

// Note: the sum runs once per step, after the data-parallel reductions, on what each rank's
// optimizer reads (its shard from stage 1). Before the reductions it would have to run per
// micro-batch at stages 2-3, a collective between the first and last pipeline stage in the middle
// of the schedule: its comm stream then holds the last pipeline stage's gradient buffers, whose
// release its host waits for, while the first pipeline stage waits for that host's next backward —
// a deadlock the schedule's check cannot see (interleaved 1F1B at stage 3 hit it). Summing reduced
// shards is the same sum (the reduction is linear, and shard d is the same range on both pipeline
// stages), moves 1/D of the bytes, and can never mix a full local gradient with a reduced shard,
// which is the users' wrong-order bug.
void PipelineTrainer::sum_tied() {
  if (!tied_ || skip_tied_sum_) return;
  // Both pipeline stages walk the tied units in the whole model's order: the collectives pair up.
  for (const auto& [whole, chunk, unit] : tied_units_) {
    (void)whole;
    chunks_[chunk].runner->sum_reduced_gradient(
        unit, *tied_, "tied gradient of " + chunks_[chunk].replicas.front()->units()[unit]->name());
  }
}

}  // namespace zest
