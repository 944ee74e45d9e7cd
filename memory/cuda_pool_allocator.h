// A CUDA device's memory: stream-ordered allocations (cudaMallocFromPoolAsync / cudaFreeAsync)
// from a pool of the device's own (cudaMemPool_t) whose release threshold is "never", so memory a
// step frees stays in the pool for the next step and no cudaMalloc / cudaFree runs inside a step.
// The Allocator base gives it the same category accounting, peaks and optional capacity as the
// CPU device (a capacity emulates a smaller GPU). Invariant: allocations and frees are ordered on
// one stream (set_stream; the legacy default stream by default, which orders them with all work
// on the device's blocking streams), and a Buffer freed inside a CUDA host function, where no
// CUDA call is allowed, is returned to the pool later, from the next allocation on a host thread.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "memory/cuda_pool_allocator.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "memory/allocator.h"

namespace zest::cuda {

// Marks the calling thread, for its lifetime, as running a CUDA host function (cudaLaunchHostFunc
// work; runtime/cuda_stream.h sets it around each closure it runs). There CUDA calls are not
// allowed, so frees are deferred and allocations refused.
class CudaHostFunctionScope {
 public:
  CudaHostFunctionScope();
  ~CudaHostFunctionScope();
  CudaHostFunctionScope(const CudaHostFunctionScope&) = delete;
  CudaHostFunctionScope& operator=(const CudaHostFunctionScope&) = delete;

  static bool active();
  // Throws kInternal naming `device_name` where active(): allocating is a CUDA call, which a
  // host function may not make. Allocators call it first thing.
  static void refuse_allocation_if_active(const std::string& device_name);

 private:
  bool was_active_;
};

class CudaPoolAllocator final : public Allocator {
 public:
  // A new pool on CUDA device `device` (an ordinal). Throws an Error (kDevice) if CUDA refuses.
  CudaPoolAllocator(std::string device_name, int device, std::size_t capacity = kUnlimitedCapacity,
                    std::string advice = "");
  // Frees what was deferred; the pool's memory goes back to CUDA once its last free has run.
  ~CudaPoolAllocator() override;

  CudaPoolAllocator(const CudaPoolAllocator&) = delete;
  CudaPoolAllocator& operator=(const CudaPoolAllocator&) = delete;

  // The stream that orders allocations and frees from now on.
  void set_stream(cudaStream_t stream);
  // Lets kernels on GPU `peer` read and write this pool's memory, existing and future
  // (cudaMemPoolSetAccess), where CUDA says `peer` can reach this GPU (cudaDeviceCanAccessPeer);
  // returns whether it could. A pool's memory is its own GPU's alone until then, whatever
  // cudaDeviceEnablePeerAccess says. Throws kDevice if CUDA refuses.
  bool grant_peer_access(int peer);
  cudaMemPool_t pool() const { return pool_; }
  int device() const { return device_; }

  // Returns the frees deferred from host functions to the pool now (stream-ordered), and raises
  // the first failure of a free since the last call. Every allocation does this first.
  void release_deferred();
  // How many frees are waiting for release_deferred().
  std::size_t deferred_count() const;

  // Frees `buffer` (this allocator's) with cudaFreeAsync on `stream` instead of the ordering
  // stream: it runs after the work already enqueued there, and the accounting drops now. For the
  // engine's frees after a buffer's last use on one stream (runtime/release_after.h); called
  // from a host thread (inside a host function it is deferred as any free).
  void free_after(cudaStream_t stream, Buffer buffer);

 protected:
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* data, std::size_t bytes) override;

 private:
  cudaStream_t stream() const;

  const int device_;
  cudaMemPool_t pool_ = nullptr;
  mutable std::mutex mutex_;
  cudaStream_t stream_ = cudaStreamLegacy;  // guarded by mutex_
  std::vector<void*> deferred_;             // guarded by mutex_
  std::string free_failure_;                // guarded by mutex_: raised by release_deferred()
};

}  // namespace zest::cuda
