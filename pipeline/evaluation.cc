// PipelineTrainer::evaluate: held-out evaluation through the pipeline stages. No schedule: the
// batch is one micro-batch that passes the virtual stages 0, 1, ..., in order, each pipeline
// stage's chunks forward only, the activations sent on as in a step (a send stream after an event
// on compute, the receive on compute, every transfer after a header with its shape, since an
// evaluation batch may have another row count than the training one). Each pair of pipeline stages
// sends in virtual-stage order and receives in the same order, so the transfers pair up.
#include "base/error.h"
#include "engine/device_batch.h"
#include "pipeline/pipeline_trainer.h"
#include "runtime/host_collectives.h"
#include "runtime/host_copies.h"
#include "runtime/release_after.h"

namespace zest {

namespace {
constexpr std::size_t kHeader = 8;              // rank, up to 6 dimensions, dtype
constexpr DType kHeaderType = DType::kFloat64;  // int64 values travel as an 8-byte type
}  // namespace

float PipelineTrainer::evaluate(const Batch& batch) {
  if (step_pending_) throw Error(ErrorKind::kUsage, "evaluate() between forward_backward() and step()");
  const int s = at_.pipeline_stage;
  const int last = schedule_.virtual_stages() - 1;
  std::vector<Buffer> keep;  // headers and sent outputs, until the send stream is past them
  std::vector<std::unique_ptr<Event>> events;
  float loss = 0.0f;
  try {
    std::unique_ptr<DeviceBatch> staged;
    if (s == schedule_.stage_of(0) || s == schedule_.stage_of(last)) {
      staged = std::make_unique<DeviceBatch>(context_.device, context_.compute, batch);
    }
    Tensor input;
    Buffer input_owner;
    for (int v = 0; v <= last; ++v) {
      if (schedule_.stage_of(v) != s) continue;
      const std::string label = "evaluation activations of virtual stage " + std::to_string(v);
      if (v > 0 && schedule_.stage_of(v - 1) != s) {
        const int peer = schedule_.stage_of(v - 1);
        Buffer header = context_.allocator().allocate(kHeader * sizeof(std::int64_t),
                                                      Category::kWorkspace);
        activations_->label_next(("shape of the " + label).c_str());
        activations_->receive(context_.compute, header.data(), kHeader, kHeaderType, peer);
        std::int64_t shape[kHeader] = {};
        read_to_host(context_.device, context_.compute, shape, header.data(), sizeof shape);
        input = Tensor{nullptr, std::vector<std::int64_t>(shape + 1, shape + 1 + shape[0]),
                       static_cast<DType>(shape[kHeader - 1])};
        input_owner = context_.allocator().allocate(input.bytes(), Category::kActivations);
        input.data = input_owner.data();
        activations_->label_next(label.c_str());
        activations_->receive(context_.compute, input.data, input.numel(), input.dtype, peer);
      }
      Batch rows = staged ? staged->batch() : Batch{};
      if (v > 0) rows.inputs = input;
      Chunk& chunk = chunks_.at(static_cast<std::size_t>(schedule_.chunk_of(v)));
      Buffer output_owner;
      const Tensor output = chunk.runner->evaluate(rows, output_owner);
      release_after(context_.device, context_.compute, std::move(input_owner));
      if (v == last) {
        loss = chunk.runner->evaluation_loss();
        break;
      }
      if (schedule_.stage_of(v + 1) == s) {  // the next chunk is this pipeline stage's too
        input = output;
        input_owner = std::move(output_owner);
        continue;
      }
      const int peer = schedule_.stage_of(v + 1);
      events.push_back(context_.device.create_event());
      context_.compute.record(*events.back());
      send_activations_->wait(*events.back());
      std::int64_t shape[kHeader] = {};
      shape[0] = static_cast<std::int64_t>(output.rank());
      for (std::size_t d = 0; d < output.rank() && d < kHeader - 2; ++d) shape[1 + d] = output.dim(d);
      shape[kHeader - 1] = static_cast<std::int64_t>(output.dtype);
      Buffer header = context_.allocator().allocate(sizeof shape, Category::kWorkspace);
      write_from_host(context_.device, *send_activations_, header.data(), shape, sizeof shape);
      const std::string sent = "evaluation activations of virtual stage " + std::to_string(v + 1);
      activations_->label_next(("shape of the " + sent).c_str());
      activations_->send(*send_activations_, header.data(), kHeader, kHeaderType, peer);
      activations_->label_next(sent.c_str());
      activations_->send(*send_activations_, output.data, output.numel(), output.dtype, peer);
      keep.push_back(std::move(header));
      keep.push_back(std::move(output_owner));
    }
    send_activations_->synchronize();
    context_.synchronize();
  } catch (...) {
    for (Stream* stream : {send_activations_.get(), &context_.compute, &context_.comm}) {
      try {
        stream->synchronize();
      } catch (...) {
        // The first failure is the one rethrown.
      }
    }
    throw;
  }
  // The loss pipeline stage's ranks hold the loss of their rows; the mean over data-parallel
  // indices.
  float total = s == schedule_.stage_of(last)
                    ? loss / static_cast<float>(mesh_.data_parallel_size()) : 0.0f;
  context_.communicator.label_next("pipeline evaluation loss");
  all_reduce_host(context_, &total, &total, 1, DType::kFloat32, Reduction::kSum);
  return total;
}

}  // namespace zest
