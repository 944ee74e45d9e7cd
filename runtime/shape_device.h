// The shape-only device (PyTorch's `meta` device): streams and events with the CPU device's
// ordering rules that run nothing (runtime/shape_stream.h), and memory that is accounted but
// never backed (memory/shape_allocator.h), device and host alike. The memory planner runs the
// real engine on it and reads the allocators' peaks: what a rank would allocate, in its order,
// without the time or the memory of training. It stands in for the CPU device: kind() is kCpu,
// so the engine and the models take the CPU device's paths. Invariant: nothing may read its
// memory; runs_work() says which device this is, and the few host reads of device values (the
// loss, the gradient norm: runtime/host_copies.h) get zeros.
#pragma once

#include <string>

#include "memory/shape_allocator.h"
#include "runtime/device.h"

namespace zest::shape {

class ShapeDevice final : public Device {
 public:
  explicit ShapeDevice(int index, std::size_t capacity = kUnlimitedCapacity,
                       std::size_t host_capacity = kUnlimitedCapacity);

  DeviceKind kind() const override { return DeviceKind::kCpu; }
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
