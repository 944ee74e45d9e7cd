// The CUDA device's stream and event: a cudaStream_t (blocking, so that it orders with the
// allocator's frees on the legacy default stream) and a cudaEvent_t made with timing disabled.
// Host closures run in stream order as CUDA host functions (cudaLaunchHostFunc); as on the CPU
// device, an exception inside one makes the stream fail: its later closures are skipped, and
// synchronize() and the streams and events that wait on it re-raise the failure. Invariant: a
// closure must not call CUDA (CUDA forbids it in host functions: it may deadlock); Buffers it
// frees are returned to the pool later, from a host thread (memory/cuda_pool_allocator.h).
// Kernels launched on a failed stream still run: CUDA cannot skip them.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "runtime/cuda_stream.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "base/dtype.h"
#include "memory/allocator.h"
#include "runtime/stream.h"

namespace zest::cuda {

namespace detail {
struct StreamState;  // a stream's failure and the events it waited on; shared with its events
}  // namespace detail

class CudaEvent final : public Event {
 public:
  // Makes the event on the calling thread's current device.
  CudaEvent();
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void synchronize() override;
  cudaEvent_t handle() const { return event_; }

 private:
  friend class CudaStream;

  cudaEvent_t event_ = nullptr;
  int device_ = 0;  // the device it was made on: synchronize() waits from that device
  std::mutex mutex_;
  std::shared_ptr<detail::StreamState> source_;  // the stream of the last record(); null: never
  std::uint64_t mark_ = 0;                       // closures enqueued there before that record()
};

class CudaStream final : public Stream {
 public:
  // A new stream on CUDA device `device` (made the calling thread's current device).
  // `allocator` (the device's) backs workspace(); null: kernels needing one are refused.
  CudaStream(std::string name, int device, Allocator* allocator = nullptr);
  ~CudaStream() override;  // waits for the stream's work, then destroys it; never throws
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  const std::string& name() const override { return name_; }
  DeviceKind device_kind() const override { return DeviceKind::kCuda; }
  void enqueue(std::function<void()> work) override;
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;

  cudaStream_t handle() const { return stream_; }
  int device() const { return device_; }

  // Scratch of at least `bytes` for a kernel about to be launched on this stream, charged to
  // Category::kWorkspace. Why per stream: launches on one stream run in order, so each can
  // reuse the same scratch without events; one per device would race between the streams.
  // It only grows (a larger request frees the old scratch: the pool frees in stream order).
  // Called from the host thread at launch, never from a closure. Throws naming `kernel`.
  void* workspace(std::size_t bytes, const char* kernel);
  // This stream's cuBLASLt handle, made at first use (cublasLtCreate), destroyed with it.
  cublasLtHandle_t blas_handle();
  // What the fp32 products launched on this stream may round their inputs to (kFloat32: none);
  // set through kernels/matmul.h's set_fp32_matmul_rounding, read by the product kernels.
  void set_fp32_matmul_rounding(DType rounding) { fp32_matmul_rounding_ = rounding; }
  DType fp32_matmul_rounding() const { return fp32_matmul_rounding_; }

 private:
  const std::string name_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<detail::StreamState> state_;
  Allocator* const allocator_;
  Buffer workspace_;  // invariant: freed before the device's allocator (streams die first)
  cublasLtHandle_t blas_ = nullptr;
  DType fp32_matmul_rounding_ = DType::kFloat32;
};

// The cudaStream_t of a CudaStream, for launching kernels on it; a kUsage Error naming `kernel`
// for a stream of another device.
cudaStream_t stream_handle(Stream& stream, const char* kernel);
// The same, for kernels that need the stream's workspace or cuBLASLt handle.
CudaStream& cuda_stream(Stream& stream, const char* kernel);

}  // namespace zest::cuda
