#include "runtime/cpu_device.h"

#include <cstring>

#include "runtime/cpu_stream.h"

namespace zest::cpu {

CpuDevice::CpuDevice(int index, std::size_t capacity, std::size_t host_capacity,
                     FreeTiming frees)
    : name_("cpu:" + std::to_string(index)),
      frees_(frees),
      allocator_(name_, capacity),
      host_allocator_(name_ + " host", host_capacity,
                      "give the host arena more memory (world.host_memory), or turn off "
                      "zero_optimization.offload_optimizer") {}

std::unique_ptr<Stream> CpuDevice::create_stream(const std::string& name) {
  return std::make_unique<CpuStream>(name, frees_);
}

std::unique_ptr<Event> CpuDevice::create_event() { return std::make_unique<CpuEvent>(); }

void CpuDevice::copy(Stream& stream, void* destination, const void* source, std::size_t bytes) {
  if (bytes == 0 || destination == source) return;
  stream.enqueue([=] { std::memmove(destination, source, bytes); });
}

void CpuDevice::fill_zero(Stream& stream, void* destination, std::size_t bytes) {
  if (bytes == 0) return;
  stream.enqueue([=] { std::memset(destination, 0, bytes); });
}

}  // namespace zest::cpu
