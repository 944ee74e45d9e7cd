// The shape-only device (PyTorch's `meta` device): streams and events with the CPU device's
// ordering rules that run nothing (runtime/shape_stream.h), and memory that is accounted but
// never backed (memory/shape_allocator.h), device and host alike. The memory planner runs the
// real engine on it and reads the allocators' peaks: what a rank would allocate, in its order,
// without the time or the memory of training. It stands in for the CPU or the CUDA device:
// kind() is that device's, so the engine and the models take its paths (on CUDA: the batch
// copied in, a stream-ordered free accounted at once as the pool does, no CPU-only scratch),
// while its streams show kernels the CPU device, whose bodies are closures the stream drops —
// no kernel needs to know about this device. Invariant: nothing may read its memory;
// runs_work() says which device this is, and the few host reads of device values (the loss,
// the gradient norm: runtime/host_copies.h) get zeros.
#pragma once

#include <string>

#include "memory/shape_allocator.h"
#include "runtime/device.h"

namespace zest::shape {

class ShapeDevice final : public Device {
 public:
  // `stands_for`: the device whose paths the engine takes (kCpu or kCuda).
  explicit ShapeDevice(int index, DeviceKind stands_for = DeviceKind::kCpu,
                       std::size_t capacity = kUnlimitedCapacity,
                       std::size_t host_capacity = kUnlimitedCapacity);

  DeviceKind kind() const override { return stands_for_; }
  const std::string& name() const override { return name_; }
  Allocator& allocator() override { return allocator_; }
  Allocator& host_allocator() override { return host_allocator_; }
  std::unique_ptr<Stream> create_stream(const std::string& name) override;
  std::unique_ptr<Event> create_event() override;
  std::unique_ptr<Stream> create_host_stream(const std::string& name) override {
    return create_stream(name);
  }
  std::unique_ptr<Event> create_host_event() override { return create_event(); }
  // Nothing to move or fill.
  void copy(Stream&, void*, const void*, std::size_t) override {}
  void fill_zero(Stream&, void*, std::size_t) override {}

 private:
  DeviceKind stands_for_;
  std::string name_;
  ShapeAllocator allocator_;
  ShapeAllocator host_allocator_;
};

}  // namespace zest::shape

namespace zest {
// False for the shape-only device: its streams run nothing and its memory is never backed, so
// nothing may be read from it and nothing need be written to it (the engine skips parameter
// initialization). Note: a function here rather than a virtual of Device, which every layer
// includes, so that only the few places that ask depend on this device.
inline bool runs_work(const Device& device) {
  return dynamic_cast<const shape::ShapeDevice*>(&device) == nullptr;
}
}  // namespace zest
