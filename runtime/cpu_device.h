// The CPU device: streams are worker threads, memory is host memory behind a capacity. With a
// capacity it emulates a GPU of that size, out-of-memory included. Its host memory (offload) is
// a second arena, "cpu:N host", with its own capacity, so offloading is accounted and can run
// out of memory as on a GPU machine; a copy between the two is a memcpy in stream order.
#pragma once

#include "memory/host_allocator.h"
#include "runtime/cpu_stream.h"
#include "runtime/device.h"

namespace zest::cpu {

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, std::size_t capacity = kUnlimitedCapacity,
            std::size_t host_capacity = kUnlimitedCapacity,
            FreeTiming frees = FreeTiming::kWhenReached);

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
  void copy(Stream& stream, void* destination, const void* source, std::size_t bytes) override;
  void fill_zero(Stream& stream, void* destination, std::size_t bytes) override;

 private:
  std::string name_;
  FreeTiming frees_;
  HostAllocator allocator_;
  HostAllocator host_allocator_;
};

}  // namespace zest::cpu
