// What the CUDA suites share: skipping where no GPU is visible, with the reason CUDA gave (so a
// skipped run says why, and a machine with a GPU never skips silently), and device arrays for
// test data, cuBLAS handles, and the comparisons of a CUDA body against its CPU body. CUDA-side
// only: include it from *_cuda_test.cc files.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
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

// A cuBLASLt / cuBLAS handle for one test (create after ZEST_SKIP_WITHOUT_CUDA: it needs a GPU).
class LtHandle {
 public:
  LtHandle() { EXPECT_EQ(cublasLtCreate(&handle_), CUBLAS_STATUS_SUCCESS); }
  ~LtHandle() { cublasLtDestroy(handle_); }
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

class BlasHandle {
 public:
  BlasHandle() { EXPECT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS); }
  ~BlasHandle() { cublasDestroy(handle_); }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// `count` normal(mean, stddev) values from a fixed seed.
inline std::vector<float> random_floats(std::size_t count, unsigned seed, float stddev = 1.0f,
                                        float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, stddev);
  std::vector<float> values(count);
  for (float& value : values) value = normal(rng);
  return values;
}

// Expects |got[i] - want[i]| <= bound(i) for every i, reporting the first few that are not.
template <typename Bound>
void expect_within(const std::vector<float>& got, const std::vector<float>& want, Bound&& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size() && reported < 5; ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(error <= bound(i))) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i]
                    << " (error " << error << " > " << bound(i) << ")";
      ++reported;
    }
  }
}

// Elementwise: |got - want| <= relative * max(|want|, floor).
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                         double relative, double floor, const std::string& what) {
  expect_within(
      got, want,
      [&](std::size_t i) { return relative * std::max<double>(std::fabs(want[i]), floor); }, what);
}

// Norm-wise: max |got - want| <= relative * max |want|, for results where cancellation makes
// single elements' relative error meaningless (products, softmax gradients).
inline void expect_close_normwise(const std::vector<float>& got, const std::vector<float>& want,
                                  double relative, const std::string& what) {
  double largest = 0.0;
  for (float value : want) largest = std::max<double>(largest, std::fabs(value));
  expect_within(got, want, [&](std::size_t) { return relative * largest; }, what);
}

inline void expect_bit_identical(const std::vector<float>& got, const std::vector<float>& want,
                                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size() && reported < 5; ++i) {
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i])) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i]
                    << " (bits differ)";
      ++reported;
    }
  }
}

}  // namespace zest::testing
