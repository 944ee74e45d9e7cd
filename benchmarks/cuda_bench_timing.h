// What the CUDA benchmarks share: GPU time of enqueued work by a pair of timing-enabled CUDA
// events on the benchmark's own stream, the median of those times, and the machine's facts in
// the benchmark context. Invariant: times are GPU times between the two events, so host launch
// overhead counts only where it starves the GPU; the median, not the mean, is what is reported.
// CUDA-side only (benchmarks/*_cuda_bench.cc).
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "benchmarks/cuda_bench_timing.h is CUDA-side only"
#endif

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/cuda_check.h"
#include "base/error.h"
#include "runtime/cuda_device.h"

namespace zest::bench {

// A stream of its own (blocking, so the pool allocator's legacy-stream ordering covers it) and
// two timing-enabled events. Made and used on one thread, after cudaSetDevice.
class EventTimer {
 public:
  EventTimer() {
    ZEST_CUDA_CHECK(cudaStreamCreate(&stream_));
    ZEST_CUDA_CHECK(cudaEventCreate(&start_));
    ZEST_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(stop_);
    cudaEventDestroy(start_);
    cudaStreamDestroy(stream_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  cudaStream_t stream() const { return stream_; }

  // Seconds of GPU time that `work(stream)` takes: it is enqueued between the two events and
  // this waits for the second.
  template <typename Work>
  double seconds(Work&& work) {
    ZEST_CUDA_CHECK(cudaEventRecord(start_, stream_));
    work(stream_);
    ZEST_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    ZEST_CUDA_CHECK(cudaEventSynchronize(stop_));
    float milliseconds = 0.0f;
    ZEST_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start_, stop_));
    return milliseconds / 1e3;
  }

  void synchronize() const { ZEST_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  if (values.size() % 2 == 1) return *middle;
  return (*middle + *std::max_element(values.begin(), middle)) / 2.0;
}

// Selects GPU 0 for this thread and names it in the benchmark context (the JSON "context"),
// with the driver and runtime versions. Throws a kConfig Error saying what CUDA reported when
// this process sees no GPU.
inline void select_gpu_and_describe() {
  const cuda::DeviceCount devices = cuda::visible_devices();
  if (devices.count == 0) {
    throw Error(ErrorKind::kConfig,
                "this benchmark needs a CUDA device, and this process sees none (" +
                    devices.reason + ")");
  }
  ZEST_CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp properties{};
  ZEST_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  int driver = 0;
  int runtime = 0;
  ZEST_CUDA_CHECK(cudaDriverGetVersion(&driver));
  ZEST_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  benchmark::AddCustomContext("gpu", properties.name);
  benchmark::AddCustomContext("gpu_sm_count", std::to_string(properties.multiProcessorCount));
  benchmark::AddCustomContext("gpu_memory_bytes", std::to_string(properties.totalGlobalMem));
  benchmark::AddCustomContext("gpu_l2_bytes", std::to_string(properties.l2CacheSize));
  benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
  benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));
}

// True when the command line only asks for the benchmarks' names (--benchmark_list_tests), which
// needs no GPU. Call it before benchmark::Initialize, which removes the flag.
inline bool listing_only(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--benchmark_list_tests" || arg == "--benchmark_list_tests=true") return true;
  }
  return false;
}

// The exit status of a tool for `error` (base/error.h): 2 for input kinds, 1 otherwise.
inline int exit_status(const std::exception& error) {
  const auto* zest_error = dynamic_cast<const Error*>(&error);
  return zest_error != nullptr && is_input_error(zest_error->kind()) ? 2 : 1;
}

}  // namespace zest::bench
