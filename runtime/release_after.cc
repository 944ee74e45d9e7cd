#include "runtime/release_after.h"

#include <memory>
#include <utility>

namespace zest {

void release_after(Device& device, Stream& stream, Buffer buffer) {
  if (buffer.empty()) return;
#if ZEST_HAVE_CUDA
  if (device.kind() == DeviceKind::kCuda) {
    cuda::release_after(device, stream, std::move(buffer));
    return;
  }
#endif
  (void)device;
  // Note: std::function needs a copyable closure; the shared_ptr makes the move-only Buffer one.
  auto owned = std::make_shared<Buffer>(std::move(buffer));
  stream.enqueue([owned] { owned->reset(); });
}

}  // namespace zest
