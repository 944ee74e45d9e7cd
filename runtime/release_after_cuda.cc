#include <cuda_runtime.h>

#include <memory>
#include <utility>

#include "base/error.h"
#include "runtime/cuda_device.h"
#include "runtime/cuda_stream.h"
#include "runtime/release_after.h"

namespace zest::cuda {

void release_after(Device& device, Stream& stream, Buffer buffer) {
  auto* cuda_device = dynamic_cast<CudaDevice*>(&device);
  if (cuda_device == nullptr) {
    throw Error(ErrorKind::kUsage, "release_after: device '" + device.name() +
                                       "' says CUDA but is not a CudaDevice");
  }
  // Why ask CUDA: a Buffer does not say which allocator made it, and only the device pool's
  // memory can be freed in stream order; host arena memory is freed by a closure as on the CPU.
  cudaPointerAttributes attributes{};
  const bool on_device = cudaPointerGetAttributes(&attributes, buffer.data()) == cudaSuccess &&
                         attributes.type == cudaMemoryTypeDevice;
  (void)cudaGetLastError();
  if (on_device) {
    cuda_device->pool_allocator().free_after(stream_handle(stream, "release_after"),
                                             std::move(buffer));
    return;
  }
  auto owned = std::make_shared<Buffer>(std::move(buffer));
  stream.enqueue([owned] { owned->reset(); });
}

}  // namespace zest::cuda
