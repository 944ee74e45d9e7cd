// The shape-only device's stream and event (runtime/shape_device.h): work enqueued on it is
// dropped, never run, and a stream-ordered free is held until a wait proves the stream passed
// it — the host's synchronize of the stream or of an event recorded on it, or a stream's wait
// that the host then proves in turn. Those are the CPU device's ordering rules with
// debug.hold_frees (runtime/cpu_stream.h, FreeTiming::kWhenWaited), so the peaks the engine
// reaches on this device equal the CPU device's measured ones to the byte, with no thread: a
// stream runs no further than a synchronization requires. Invariant: used from one host thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "memory/shape_allocator.h"
#include "runtime/stream.h"

namespace zest::shape {

// What a stream holds, in its order: frees, and waits for another stream to reach a point.
// Shared with the events recorded on it and the streams that wait for it, so that a wait can
// still prove it after the stream has gone.
class StreamQueue {
 public:
  // The point after the work enqueued so far (what an event recorded now marks).
  std::size_t position() const { return operations_.size(); }
  void add_free(std::function<void()> free);
  void add_wait(std::shared_ptr<StreamQueue> on, std::size_t position);
  // The host learns that the stream has run to `position`: the frees before it run, and the
  // streams it waited for before it are proven to the points it waited for.
  void run_through(std::size_t position);

 private:
  struct Operation {
    std::function<void()> free;         // a free, or (empty)
    std::shared_ptr<StreamQueue> on;    // a wait for `on` to reach `position`
    std::size_t position = 0;
  };
  std::vector<Operation> operations_;
  std::size_t done_ = 0;  // operations run
};

class ShapeEvent final : public Event {
 public:
  void synchronize() override;

 private:
  friend class ShapeStream;
  std::shared_ptr<StreamQueue> queue_;  // of the last record(); null before one
  std::size_t position_ = 0;
};

class ShapeStream final : public Stream {
 public:
  // `stands_for`: the device the shape-only device stands in for. Kernels see the CPU device
  // whatever it is: a CPU body is a closure, which this stream drops, while a CUDA body would
  // be launched. `allocator`: the device's (not its host's), for the CUDA kernels' scratch
  // (workspace()) and to tell device buffers from host ones; it must outlive the stream.
  ShapeStream(std::string name, DeviceKind stands_for, ShapeAllocator& allocator);
  ~ShapeStream() override;  // runs the frees still held

  ShapeStream(const ShapeStream&) = delete;
  ShapeStream& operator=(const ShapeStream&) = delete;

  const std::string& name() const override { return name_; }
  DeviceKind device_kind() const override { return DeviceKind::kCpu; }
  void enqueue(std::function<void()> work) override;  // dropped
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;

  // A stream-ordered free (runtime/release_after.h). Standing in for CUDA, device memory is
  // freed at once: the stream-ordered pool accounts the bytes free at the release
  // (cudaFreeAsync) and only keeps them from reuse until the stream gets there. Host memory,
  // and every buffer standing in for the CPU device, is held until a wait proves the stream
  // passed the release.
  void release_after(Buffer buffer);

  // Standing in for CUDA, the scratch a kernel of `bytes` takes from its stream
  // (runtime/cuda_stream.h, CudaStream::workspace): one region per stream that only grows, the
  // old one freed first. The CUDA kernels that ask are not run here, so the planner's units ask
  // for the scratch their UnitMemory declares. Nothing on the CPU device, whose kernels take
  // their scratch from the model.
  void workspace(std::size_t bytes);

 private:
  const std::string name_;
  const DeviceKind stands_for_;
  ShapeAllocator& allocator_;
  Buffer workspace_;
  std::shared_ptr<StreamQueue> queue_;
};

}  // namespace zest::shape
