#include "runtime/cuda_device.h"

#include <cstdlib>

#include "base/cuda_check.h"
#include "base/error.h"
#include "runtime/cpu_stream.h"
#include "runtime/cuda_stream.h"

namespace zest::cuda {

CudaDevice::CudaDevice(int ordinal, std::size_t capacity, std::size_t host_capacity)
    : ordinal_(ordinal), name_("cuda:" + std::to_string(ordinal)),
      allocator_(name_, ordinal, capacity),
      host_allocator_(name_ + " host", host_capacity,
                      "give the host arena more memory (world.host_memory), or turn off "
                      "zero_optimization.offload_optimizer") {
  // The allocator's constructor selected the GPU already; this keeps it explicit.
  ZEST_CUDA_CHECK(cudaSetDevice(ordinal_));
}

std::unique_ptr<Stream> CudaDevice::create_stream(const std::string& name) {
  return std::make_unique<CudaStream>(name, ordinal_, &allocator_);
}

std::unique_ptr<Stream> CudaDevice::create_host_stream(const std::string& name) {
  return std::make_unique<cpu::CpuStream>(name);
}

std::unique_ptr<Event> CudaDevice::create_host_event() {
  return std::make_unique<cpu::CpuEvent>();
}

std::unique_ptr<Event> CudaDevice::create_event() {
  ZEST_CUDA_CHECK(cudaSetDevice(ordinal_));
  return std::make_unique<CudaEvent>();
}

void CudaDevice::copy(Stream& stream, void* destination, const void* source, std::size_t bytes) {
  if (bytes == 0 || destination == source) return;
  ZEST_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault,
                                  stream_handle(stream, "copy")));
}

void CudaDevice::fill_zero(Stream& stream, void* destination, std::size_t bytes) {
  if (bytes == 0) return;
  ZEST_CUDA_CHECK(cudaMemsetAsync(destination, 0, bytes, stream_handle(stream, "fill_zero")));
}

DeviceCount visible_devices() {
  DeviceCount result;
  const cudaError_t status = cudaGetDeviceCount(&result.count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    result.count = 0;
    result.reason = std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(status) +
                    " (" + cudaGetErrorString(status) + ")";
  } else if (result.count == 0) {
    result.reason = "cudaGetDeviceCount found 0 devices";
  }
  if (!result.reason.empty()) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible != nullptr) result.reason += std::string("; CUDA_VISIBLE_DEVICES=") + visible;
  }
  return result;
}

int select_device(int local_rank) {
  const DeviceCount devices = visible_devices();
  if (devices.count == 0) {
    throw Error(ErrorKind::kConfig,
                "world.device: \"cuda\" needs a CUDA device, and this process sees none (" +
                    devices.reason + "); use \"cpu\"");
  }
  if (local_rank < 0 || local_rank >= devices.count) {
    throw Error(ErrorKind::kConfig,
                "world.device: \"cuda\" runs one rank per GPU: local rank " +
                    std::to_string(local_rank) + " has none, since this process sees " +
                    std::to_string(devices.count) + " (start at most that many ranks per "
                    "machine, or set CUDA_VISIBLE_DEVICES)");
  }
  return local_rank;
}

}  // namespace zest::cuda
