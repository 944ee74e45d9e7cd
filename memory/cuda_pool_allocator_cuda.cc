#include <cstdint>
#include <limits>
#include <utility>

#include "base/cuda_check.h"
#include "base/error.h"
#include "memory/cuda_pool_allocator.h"

namespace zest::cuda {
namespace {
thread_local bool in_host_function = false;
}  // namespace

CudaHostFunctionScope::CudaHostFunctionScope() : was_active_(in_host_function) {
  in_host_function = true;
}
CudaHostFunctionScope::~CudaHostFunctionScope() { in_host_function = was_active_; }
bool CudaHostFunctionScope::active() { return in_host_function; }

void CudaHostFunctionScope::refuse_allocation_if_active(const std::string& device_name) {
  if (!in_host_function) return;
  throw Error(ErrorKind::kInternal, "allocation on " + device_name +
                                        " inside a CUDA host function, where no CUDA call is "
                                        "allowed; allocate on the host thread before enqueuing");
}

CudaPoolAllocator::CudaPoolAllocator(std::string device_name, int device, std::size_t capacity,
                                     std::string advice)
    : Allocator(std::move(device_name), capacity, std::move(advice)), device_(device) {
  ZEST_CUDA_CHECK(cudaSetDevice(device_));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device_;
  ZEST_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
  // Note: by default a pool gives its unused memory back to the driver at every synchronize,
  // and the next step pays for cudaMalloc-like growth again; "never" keeps a step's high-water
  // mark mapped, which is what the engine's fixed per-step allocations want.
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  const cudaError_t status =
      cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (status != cudaSuccess) {
    (void)cudaMemPoolDestroy(pool_);
    ZEST_CUDA_CHECK(status);
  }
}

CudaPoolAllocator::~CudaPoolAllocator() {
  try {
    release_deferred();
  } catch (...) {
    // Nothing to report to: the device is broken and its next user says so.
  }
  // Note: a pool with allocations or frees still outstanding is released by CUDA once they
  // have all run, so this does not wait for the device.
  (void)cudaMemPoolDestroy(pool_);
  (void)cudaGetLastError();
}

void CudaPoolAllocator::set_stream(cudaStream_t stream) {
  std::lock_guard lock(mutex_);
  stream_ = stream;
}

bool CudaPoolAllocator::grant_peer_access(int peer) {
  if (peer == device_) return true;
  int reachable = 0;
  ZEST_CUDA_CHECK(cudaDeviceCanAccessPeer(&reachable, peer, device_));
  if (reachable == 0) return false;  // setting access would fail with cudaErrorInvalidDevice
  cudaMemAccessDesc access{};
  access.location.type = cudaMemLocationTypeDevice;
  access.location.id = peer;
  access.flags = cudaMemAccessFlagsProtReadWrite;
  ZEST_CUDA_CHECK(cudaMemPoolSetAccess(pool_, &access, 1));
  return true;
}

cudaStream_t CudaPoolAllocator::stream() const {
  std::lock_guard lock(mutex_);
  return stream_;
}

std::size_t CudaPoolAllocator::deferred_count() const {
  std::lock_guard lock(mutex_);
  return deferred_.size();
}

void CudaPoolAllocator::release_deferred() {
  if (CudaHostFunctionScope::active()) return;
  std::vector<void*> frees;
  std::string failure;
  cudaStream_t order;
  {
    std::lock_guard lock(mutex_);
    frees.swap(deferred_);
    failure.swap(free_failure_);
    order = stream_;
  }
  if (!failure.empty()) throw Error(ErrorKind::kDevice, failure);
  if (frees.empty()) return;
  ZEST_CUDA_CHECK(cudaSetDevice(device_));
  for (void* data : frees) ZEST_CUDA_CHECK(cudaFreeAsync(data, order));
}

void* CudaPoolAllocator::raw_allocate(std::size_t bytes) {
  CudaHostFunctionScope::refuse_allocation_if_active(device_name());
  release_deferred();
  ZEST_CUDA_CHECK(cudaSetDevice(device_));
  void* data = nullptr;
  const cudaError_t status = cudaMallocFromPoolAsync(&data, bytes, pool_, stream());
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;  // the Allocator reports it as the device refusing
  }
  check(status, "cudaMallocFromPoolAsync(&data, bytes, pool_, stream())", __FILE__, __LINE__);
  return data;
}

namespace {
// The stream of the free_after() in progress on this thread; null: the ordering stream.
thread_local cudaStream_t t_free_stream = nullptr;
}  // namespace

void CudaPoolAllocator::free_after(cudaStream_t stream, Buffer buffer) {
  // Note: Buffer::reset reaches raw_free through the base's accounting; the thread-local tells
  // raw_free which stream to free on without widening the Allocator interface.
  t_free_stream = stream;
  buffer.reset();
  t_free_stream = nullptr;
}

void CudaPoolAllocator::raw_free(void* data, std::size_t /*bytes*/) {
  if (CudaHostFunctionScope::active()) {
    // Note: the host function runs after its stream's earlier work, the buffer's last use there.
    // On the legacy default stream (the default ordering) a free issued later from a host thread
    // waits for all earlier work of the device's blocking streams, that host function included;
    // an owner that orders on another stream must order it after the host function itself.
    std::lock_guard lock(mutex_);
    deferred_.push_back(data);
    return;
  }
  // Note: a free is called from destructors, so it must not throw; a failure is kept and raised
  // by the next allocation (a failing free means a broken context, which its users see anyway).
  cudaError_t status = cudaSetDevice(device_);
  if (status == cudaSuccess) {
    status = cudaFreeAsync(data, t_free_stream != nullptr ? t_free_stream : stream());
  }
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    std::lock_guard lock(mutex_);
    if (free_failure_.empty()) {
      free_failure_ = std::string("CUDA call cudaFreeAsync on ") + device_name() +
                      " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                      ")";
    }
  }
}

}  // namespace zest::cuda
