#include "runtime/shape_stream.h"

#include <algorithm>
#include <utility>

#include "base/error.h"

namespace zest::shape {

void StreamQueue::add_free(std::function<void()> free) {
  operations_.push_back({std::move(free), nullptr, 0});
}

void StreamQueue::add_wait(std::shared_ptr<StreamQueue> on, std::size_t position) {
  operations_.push_back({{}, std::move(on), position});
}

void StreamQueue::run_through(std::size_t position) {
  // Note: `done_` moves before an operation runs, so streams that wait for each other (a wait
  // proving a wait back) end; the same order as the planner's ledger and the CPU device's
  // adopted frees.
  while (done_ < std::min(position, operations_.size())) {
    Operation operation = std::move(operations_[done_++]);
    if (operation.free) {
      operation.free();
    } else if (operation.on) {
      operation.on->run_through(operation.position);
    }
  }
}

void ShapeEvent::synchronize() {
  if (queue_) queue_->run_through(position_);
}

ShapeStream::ShapeStream(std::string name, DeviceKind stands_for, ShapeAllocator& allocator)
    : name_(std::move(name)),
      stands_for_(stands_for),
      allocator_(allocator),
      queue_(std::make_shared<StreamQueue>()) {}

ShapeStream::~ShapeStream() { queue_->run_through(queue_->position()); }

void ShapeStream::enqueue(std::function<void()> work) { (void)work; }

void ShapeStream::record(Event& event) {
  auto* shape_event = dynamic_cast<ShapeEvent*>(&event);
  if (!shape_event) {
    throw Error(ErrorKind::kUsage, "stream '" + name_ + "': record() of another device's event");
  }
  shape_event->queue_ = queue_;
  shape_event->position_ = queue_->position();
}

void ShapeStream::wait(Event& event) {
  auto* shape_event = dynamic_cast<ShapeEvent*>(&event);
  if (!shape_event) {
    throw Error(ErrorKind::kUsage, "stream '" + name_ + "': wait() on another device's event");
  }
  if (shape_event->queue_) queue_->add_wait(shape_event->queue_, shape_event->position_);
}

void ShapeStream::synchronize() { queue_->run_through(queue_->position()); }

void ShapeStream::release_after(Buffer buffer) {
  if (stands_for_ == DeviceKind::kCuda && allocator_.owns(buffer.data())) {
    buffer.reset();
    return;
  }
  // Note: std::function needs a copyable closure; the shared_ptr makes the move-only Buffer one.
  auto owned = std::make_shared<Buffer>(std::move(buffer));
  queue_->add_free([owned] { owned->reset(); });
}

void ShapeStream::workspace(std::size_t bytes) {
  if (stands_for_ != DeviceKind::kCuda || bytes <= workspace_.bytes()) return;
  workspace_.reset();
  workspace_ = allocator_.allocate(bytes, Category::kWorkspace);
}

}  // namespace zest::shape
