#include "engine/checkpoint_offload.h"

#include <memory>
#include <string>
#include <utility>

#include "base/error.h"
#include "runtime/release_after.h"

namespace zest {

CheckpointOffload::CheckpointOffload(RankContext& context, std::size_t unit_count)
    : context_(context),
      host_(unit_count),
      bound_copies_(context.device.kind() != DeviceKind::kCuda) {
  if (context.device.host_allocator().capacity() == 0) {
    throw Error(ErrorKind::kConfig,
                "activation_checkpointing.cpu_checkpointing: true needs a host arena to keep the "
                "checkpoints in, and this device has none (world.host_memory is 0)");
  }
  for (std::size_t u = 0; u < unit_count; ++u) {
    read_.push_back(context.device.create_event());
    fetched_.push_back(context.device.create_event());
  }
  stream_ = context.device.create_stream("rank " + std::to_string(context.rank) + " checkpoints");
}

CheckpointOffload::~CheckpointOffload() {
  try {
    stream_->synchronize();
  } catch (...) {
    // Whoever synchronizes next reports the failure; a destructor must not throw.
  }
}

void CheckpointOffload::synchronize() { stream_->synchronize(); }

void CheckpointOffload::traced_copy(void* destination, const void* source, std::size_t bytes,
                                    std::string name) {
  if (!context_.trace) {
    context_.device.copy(*stream_, destination, source, bytes);
    return;
  }
  auto begin = std::make_shared<std::int64_t>(0);
  stream_->enqueue([begin] { *begin = TraceRecorder::now_us(); });
  context_.device.copy(*stream_, destination, source, bytes);
  stream_->enqueue([begin, trace = context_.trace, rank = context_.rank_in_world(), name = std::move(name),
                    bytes] {
    trace->add({rank, "checkpoints", name, *begin, TraceRecorder::now_us(),
                static_cast<std::int64_t>(bytes)});
  });
}

void CheckpointOffload::offload(std::size_t producer, Buffer output) {
  Buffer& host = host_.at(producer);
  if (host.bytes() != output.bytes()) {
    // Another micro-batch shape: the old host copy goes once the stream is done with it.
    if (!host.empty()) release_after(context_.device, *stream_, std::move(host));
    host = context_.device.host_allocator().allocate(output.bytes(), Category::kOffload);
  }
  context_.compute.record(*read_[producer]);
  stream_->wait(*read_[producer]);
  traced_copy(host.data(), output.data(), output.bytes(),
              "offload input of unit " + std::to_string(producer + 1));
  release_after(context_.device, *stream_, std::move(output));
  std::unique_ptr<Event> copied;
  if (spare_events_.empty()) {
    copied = context_.device.create_event();
  } else {
    copied = std::move(spare_events_.back());
    spare_events_.pop_back();
  }
  stream_->record(*copied);
  copies_in_flight_.push_back(std::move(copied));
}

void CheckpointOffload::bound_copies() {
  while (!copies_in_flight_.empty()) {
    if (bound_copies_) copies_in_flight_.front()->synchronize();
    spare_events_.push_back(std::move(copies_in_flight_.front()));
    copies_in_flight_.pop_front();
  }
}

Buffer CheckpointOffload::fetch(std::size_t producer) {
  const Buffer& host = host_.at(producer);
  Buffer output = context_.allocator().allocate(host.bytes(), Category::kActivations);
  traced_copy(output.data(), host.data(), host.bytes(),
              "fetch input of unit " + std::to_string(producer + 1));
  stream_->record(*fetched_[producer]);
  return output;
}

void CheckpointOffload::wait_fetched(std::size_t producer) {
  context_.compute.wait(*fetched_.at(producer));
}

}  // namespace zest
