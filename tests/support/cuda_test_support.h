// What the CUDA suites share: skipping where no GPU is visible, with the reason CUDA gave (so a
// skipped run says why, and a machine with a GPU never skips silently), and device arrays for
// test data. CUDA-side only: include it from *_cuda_test.cc files.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/cuda_device.h"

namespace zest::testing {

// Empty where a CUDA device is visible; else why not (what cudaGetDeviceCount returned).
inline std::string cuda_skip_reason() {
  const cuda::DeviceCount devices = cuda::visible_devices();
  return devices.count > 0 ? std::string() : "no CUDA device: " + devices.reason;
}

// Skips the calling test, printing the reason, where no CUDA device is visible.
#define ZEST_SKIP_WITHOUT_CUDA()                                               \
  do {                                                                         \
    const std::string zest_skip_reason_ = ::zest::testing::cuda_skip_reason(); \
    if (!zest_skip_reason_.empty()) GTEST_SKIP() << zest_skip_reason_;         \
  } while (0)

// Device memory for test data, copied to and from host vectors. Tests may use cudaMalloc: they
// are not the step.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t count, std::size_t offset = 0) : count_(count) {
    // `offset` elements in front shift data() off the allocation's alignment.
    EXPECT_EQ(cudaMalloc(&base_, (count + offset) * sizeof(T) + 1), cudaSuccess);
    data_ = base_ + offset;
  }
  explicit DeviceArray(const std::vector<T>& values, std::size_t offset = 0)
      : DeviceArray(values.size(), offset) {
    upload(values);
  }
  ~DeviceArray() { cudaFree(base_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() const { return data_; }
  std::size_t size() const { return count_; }

  void upload(const std::vector<T>& values) {
    ASSERT_EQ(values.size(), count_);
    ASSERT_EQ(cudaMemcpy(data_, values.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> values(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(values.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return values;
  }

 private:
  std::size_t count_;
  T* base_ = nullptr;
  T* data_ = nullptr;
};

}  // namespace zest::testing
