#include "runtime/release_after.h"

#include <memory>
#include <utility>

#include "runtime/cpu_stream.h"
#include "runtime/shape_stream.h"

namespace zest {

void release_after(Device& device, Stream& stream, Buffer buffer) {
  if (buffer.empty()) return;
  // Before the CUDA device's path: the shape-only device may stand in for CUDA.
  if (auto* shape_stream = dynamic_cast<shape::ShapeStream*>(&stream)) {
    shape_stream->release_after(std::move(buffer));  // held until proven, or the pool's at once
    return;
  }
#if ZEST_HAVE_CUDA
  if (device.kind() == DeviceKind::kCuda) {
    cuda::release_after(device, stream, std::move(buffer));
    return;
  }
#endif
  (void)device;
  // Note: std::function needs a copyable closure; the shared_ptr makes the move-only Buffer one.
  auto owned = std::make_shared<Buffer>(std::move(buffer));
  auto free = [owned] { owned->reset(); };
  if (auto* cpu_stream = dynamic_cast<cpu::CpuStream*>(&stream)) {
    cpu_stream->enqueue_free(std::move(free));  // parked until proven, when the world says so
  } else {
    stream.enqueue(std::move(free));
  }
}

}  // namespace zest
