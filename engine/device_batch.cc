#include "engine/device_batch.h"

#include <exception>
#include <utility>

#include "runtime/host_copies.h"
#include "runtime/release_after.h"

namespace zest {

DeviceBatch::DeviceBatch(Device& device, Stream& stream, const Batch& host)
    : device_(device), stream_(stream), exceptions_at_construction_(std::uncaught_exceptions()) {
  if (device.kind() == DeviceKind::kCpu) {
    batch_ = host;
    return;
  }
  batch_.inputs = copy_in(host.inputs, inputs_);
  batch_.targets = copy_in(host.targets, targets_);
}

DeviceBatch::~DeviceBatch() {
  const bool unwinding = std::uncaught_exceptions() > exceptions_at_construction_;
  if (device_.kind() == DeviceKind::kCpu && unwinding) {
    // Note: this wait ends. Of ranks failing at different points, the one that issued the
    // fewest collectives waits only on collectives its peers have issued too; it unwinds and
    // poisons the group, which fails the others' waits fast. A failed stream says so again at
    // its next synchronize; the error being unwound is the one to report.
    try {
      stream_.synchronize();
    } catch (...) {
    }
    return;
  }
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
