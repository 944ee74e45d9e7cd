#include "engine/device_batch.h"

#include <utility>

#include "runtime/host_copies.h"
#include "runtime/release_after.h"

namespace zest {

DeviceBatch::DeviceBatch(Device& device, Stream& stream, const Batch& host)
    : device_(device), stream_(stream) {
  if (device.kind() == DeviceKind::kCpu) {
    batch_ = host;
    return;
  }
  batch_.inputs = copy_in(host.inputs, inputs_);
  batch_.targets = copy_in(host.targets, targets_);
}

DeviceBatch::~DeviceBatch() {
  try {
    if (!inputs_.empty()) release_after(device_, stream_, std::move(inputs_));
    if (!targets_.empty()) release_after(device_, stream_, std::move(targets_));
  } catch (...) {
    // A stream-ordered free fails only with the device; the stream's next synchronize says so.
  }
}

Tensor DeviceBatch::copy_in(const Tensor& host, Buffer& owner) {
  Tensor staged = host;
  if (host.empty()) return staged;
  owner = device_.allocator().allocate(host.bytes(), Category::kActivations);
  write_from_host(device_, stream_, owner.data(), host.data, host.bytes());
  staged.data = owner.data();
  return staged;
}

}  // namespace zest
