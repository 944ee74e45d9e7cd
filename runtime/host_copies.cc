#include "runtime/host_copies.h"

#include <cstring>
#include <memory>
#include <vector>

#include "runtime/shape_device.h"

namespace zest {

void read_to_host(Device& device, Stream& stream, void* host, const void* source,
                  std::size_t bytes) {
  if (!runs_work(device)) {
    // Note: the shape-only device backs nothing; the wait still proves the stream's frees, as
    // it does on the CPU device, so the planner's peaks keep the CPU device's order.
    stream.synchronize();
    std::memset(host, 0, bytes);
    return;
  }
  if (device.kind() == DeviceKind::kCpu) {
    // Device memory is host memory: no copy in stream order is needed, only the wait.
    stream.synchronize();
    std::memcpy(host, source, bytes);
    return;
  }
  // Note: a copy into pageable memory blocks inside the CUDA driver until the stream reaches
  // it. With ranks as threads, a peer that must first allocate (cudaMalloc, cudaHostAlloc)
  // before it issues its half of the collective this stream waits on could then wait on the
  // driver behind us (JAX saw this: jax#11637). Waiting with cudaStreamSynchronize first holds
  // nothing, and the copy after it finds the stream idle.
  stream.synchronize();
  device.copy(stream, host, source, bytes);
  stream.synchronize();
}

void write_from_host(Device& device, Stream& stream, void* destination, const void* host,
                     std::size_t bytes) {
  if (bytes == 0 || !runs_work(device)) return;
  if (device.kind() == DeviceKind::kCpu) {
    // The bytes are copied now, so the caller's source may go; the closure owns its copy.
    auto bytes_copy = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(host), static_cast<const unsigned char*>(host) + bytes);
    stream.enqueue([destination, bytes_copy] {
      std::memcpy(destination, bytes_copy->data(), bytes_copy->size());
    });
    return;
  }
  device.copy(stream, destination, host, bytes);
}

}  // namespace zest
