// The CUDA device: one GPU of a rank, its streams (cudaStream_t) and events (cudaEvent_t, timing
// disabled), and its memory from a stream-ordered pool kept between steps, with the same
// category accounting and optional capacity as the CPU device (memory/cuda_pool_allocator.h).
// Invariant: the device is made, and used, by its rank's thread: the constructor selects the GPU
// for that thread (cudaSetDevice), as each rank thread must before any CUDA call.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "runtime/cuda_device.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cstddef>
#include <string>

#include "memory/cuda_pool_allocator.h"
#include "memory/pinned_host_allocator.h"
#include "runtime/device.h"

namespace zest::cuda {

class CudaDevice final : public Device {
 public:
  // GPU `ordinal` (as CUDA numbers the visible devices); `capacity` caps the bytes its
  // allocator hands out, to emulate a smaller GPU; `host_capacity` caps the host arena.
  explicit CudaDevice(int ordinal, std::size_t capacity = kUnlimitedCapacity,
                      std::size_t host_capacity = kUnlimitedCapacity);

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  const std::string& name() const override { return name_; }
  Allocator& allocator() override { return allocator_; }
  Allocator& host_allocator() override { return host_allocator_; }
  std::unique_ptr<Stream> create_stream(const std::string& name) override;
  std::unique_ptr<Event> create_event() override;
  // A CPU stream and event (runtime/cpu_stream.h): the host's work, ordered against this
  // device's streams through Stream::wait.
  std::unique_ptr<Stream> create_host_stream(const std::string& name) override;
  std::unique_ptr<Event> create_host_event() override;
  // cudaMemcpyAsync with cudaMemcpyDefault: unified addressing tells the direction.
  void copy(Stream& stream, void* destination, const void* source, std::size_t bytes) override;
  void fill_zero(Stream& stream, void* destination, std::size_t bytes) override;

  int ordinal() const { return ordinal_; }
  // allocator() as what it is, for stream-ordered frees (runtime/release_after.h).
  CudaPoolAllocator& pool_allocator() { return allocator_; }

 private:
  const int ordinal_;
  std::string name_;
  CudaPoolAllocator allocator_;
  // Page-locked, so that the offloaded optimizer's copies run while compute goes on.
  PinnedHostAllocator host_allocator_;
};

// How many CUDA devices this process sees, or why it sees none: the reason names what
// cudaGetDeviceCount returned (no driver, no device, CUDA_VISIBLE_DEVICES empty, ...).
struct DeviceCount {
  int count = 0;
  std::string reason;  // empty when count > 0
};
DeviceCount visible_devices();

// The GPU a rank uses: the one numbered by its local rank (its index among the ranks of its
// machine), as torchrun and DeepSpeed do; CUDA_VISIBLE_DEVICES chooses which GPUs those are.
// Throws a kConfig Error naming world.device when no GPU is visible or fewer than local_rank + 1.
int select_device(int local_rank);

}  // namespace zest::cuda
