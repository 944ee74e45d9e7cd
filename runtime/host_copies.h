// The engine's host reads and writes of device memory (the loss, fault injection's NaN), routed
// through the device so they work where device memory is not host memory. CPU device: exactly
// what the engine did before (synchronize then read; a closure that writes in stream order).
// The shape-only device: the wait, then zeros (it backs nothing). Other devices: Device::copy on
// the stream (CUDA: cudaMemcpyAsync, which for pageable host memory has read the source before
// it returns, so `source` may be a local).
#pragma once

#include <cstddef>

#include "runtime/device.h"
#include "runtime/stream.h"

namespace zest {

// Copies `bytes` at device address `source` into `host` once `stream`'s queued work has run;
// blocks until then, and throws the stream's error if it failed.
void read_to_host(Device& device, Stream& stream, void* host, const void* source,
                  std::size_t bytes);

// Writes `bytes` from `host` (read at the call: it may die when this returns) to device address
// `destination` in `stream` order.
void write_from_host(Device& device, Stream& stream, void* destination, const void* host,
                     std::size_t bytes);

}  // namespace zest
