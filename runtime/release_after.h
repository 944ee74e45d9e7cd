// Frees a Buffer after the work already enqueued on a stream, without blocking the host: how the
// engine drops activations, scratch and buckets while their last users are still queued.
// CPU device: a closure enqueued on the stream resets it (the memory returns when the stream
// reaches it). CUDA device: device memory is cudaFreeAsync'd on that stream now, from the calling
// host thread, with the accounting updated at once (a host function may not call CUDA, so the
// closure form would only defer the free to the pool's next allocation); host memory (the
// offload arena) keeps the closure form (on a CUDA stream its cudaFreeHost is deferred likewise,
// memory/pinned_host_allocator.h).
// Invariant: called from the rank's host thread, never from inside a closure.
#pragma once

#include "memory/allocator.h"
#include "runtime/device.h"
#include "runtime/stream.h"

namespace zest {

void release_after(Device& device, Stream& stream, Buffer buffer);

#if ZEST_HAVE_CUDA
namespace cuda {
// The CUDA device's form (runtime/release_after_cuda.cc); `device` must be a CudaDevice.
void release_after(Device& device, Stream& stream, Buffer buffer);
}  // namespace cuda
#endif

}  // namespace zest
