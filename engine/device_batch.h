// A micro-batch where the units can read it. Batches come from the host (the data loaders read
// files into host memory, and Trainer::forward_backward takes host memory); on a device whose
// memory is not host memory the engine first copies the inputs and targets in, charged to
// activations, and frees them in stream order after the micro-batch. On the CPU device the
// batch is used where it is: no copy. Invariant: the host batch may change once the
// DeviceBatch is gone. On a device with its own memory the copy has read it by then; on the CPU
// device the engine has read the loss (which waits for the stream) on the way out, and on the
// way out of an error the destructor waits for the stream, since the caller frees or reuses
// the batch the moment the exception reaches it.
#pragma once

#include "memory/allocator.h"
#include "engine/module.h"
#include "runtime/device.h"
#include "runtime/stream.h"

namespace zest {

class DeviceBatch {
 public:
  DeviceBatch(Device& device, Stream& stream, const Batch& host);
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;
  // Frees the copies after the work enqueued on the stream so far (it uses them). Unwinding
  // on the CPU device, first waits for that work (it reads the caller's batch).
  ~DeviceBatch();

  const Batch& batch() const { return batch_; }

 private:
  Tensor copy_in(const Tensor& host, Buffer& owner);

  Device& device_;
  Stream& stream_;
  Batch batch_;
  Buffer inputs_;
  Buffer targets_;
  int exceptions_at_construction_;  // std::uncaught_exceptions(): more at destruction = unwinding
};

}  // namespace zest
