// How a kernel's dispatch function reaches its body: on the CPU device the body is enqueued on
// the stream as a closure. A kernel with a CUDA body checks on_cuda() first, in its own .cc under
// ZEST_HAVE_CUDA, and launches it from the host on cuda::stream_handle(stream, kernel) (a launch
// is stream-ordered already: no closure, which could not call CUDA anyway). Any other device,
// and a CUDA stream in a build without CUDA, is refused at the call, on the host, before
// anything is enqueued. Invariant: the closure captures values and views
// only (pointers into buffers someone else keeps alive until the stream has run it).
#pragma once

#include <string>
#include <utility>

#include "base/error.h"
#include "runtime/stream.h"

namespace zest {

inline bool on_cuda(const Stream& stream) { return stream.device_kind() == DeviceKind::kCuda; }

template <typename Body>
void dispatch_kernel(Stream& stream, const char* kernel, Body&& cpu_body) {
  if (stream.device_kind() != DeviceKind::kCpu) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": no CUDA body yet");
  }
  stream.enqueue(std::forward<Body>(cpu_body));
}

}  // namespace zest
