// The fused AdamW update on the GPU (kernels/adamw_cuda.h, one launch over a flat fp32 shard)
// for 10M..1B parameters, beside its ceiling measured in the same run: a device-to-device
// cudaMemcpyAsync moving the same bytes. Rows for each size: the copy, the update alone, and the
// update writing the bf16 copy of the parameters in the same pass (mixed precision's master ->
// compute weights, as the engine runs it).
//
//   bytes counted   AdamW reads p, g, m, v and writes p, m, v: 28 bytes a parameter; with the
//                   bf16 copy 30. The copy counts what it reads and writes, 2 x its size, and
//                   is sized to 28 bytes a parameter (14 read, 14 written).
//   GB_per_s        counted bytes / median GPU time (10^9 bytes/s)
//   of_copy         GB_per_s / the same size's copy GB_per_s (the goal: >= 0.85 from 100M)
//
// Times are CUDA event pairs around each launch on the benchmark's stream, after 3 untimed
// launches; the counters come from the median over a fixed number of launches (about 0.2 s of
// GPU time per row), and the reported time column is the mean. Buffers come from zest's CUDA pool
// allocator; p and g are filled with the bytes 0x3c (0.0115 as fp32), m and v with zeros.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/cuda_check.h"
#include "base/dtype.h"
#include "benchmarks/cuda_bench_timing.h"
#include "kernels/adamw.h"
#include "kernels/adamw_cuda.h"
#include "memory/category.h"
#include "memory/cuda_pool_allocator.h"

namespace zest {
namespace {

constexpr std::int64_t kAdamWBytesPerParam = 7 * sizeof(float);
constexpr std::int64_t kRoundedBytesPerParam = kAdamWBytesPerParam + sizeof(std::uint16_t);
constexpr int kWarmupLaunches = 3;
// Launches per row: about this much GPU time at ~4 TB/s, within [kMinLaunches, kMaxLaunches].
constexpr double kTargetSeconds = 0.2;
constexpr double kAssumedBytesPerSecond = 4e12;
constexpr std::int64_t kMinLaunches = 20;
constexpr std::int64_t kMaxLaunches = 2000;

constexpr std::int64_t kParameterCounts[] = {10'000'000, 100'000'000, 300'000'000,
                                             1'000'000'000};

std::int64_t launches_for(std::int64_t bytes) {
  const double launches = kTargetSeconds * kAssumedBytesPerSecond / static_cast<double>(bytes);
  return std::clamp(static_cast<std::int64_t>(launches), kMinLaunches, kMaxLaunches);
}

// The allocator every row's buffers come from (main's, made once the GPU is selected); its pool
// keeps freed memory for the next row.
cuda::CudaPoolAllocator* pool = nullptr;

cuda::CudaPoolAllocator& allocator() { return *pool; }

std::map<std::int64_t, double>& copy_rates() {  // params -> the copy's GB/s in this run
  static std::map<std::int64_t, double> measured;
  return measured;
}

// Times `launch(stream)` once per benchmark iteration (after the warm-up) and returns the
// median seconds; each iteration's time is the benchmark's manual time.
template <typename Launch>
double time_launches(benchmark::State& state, bench::EventTimer& timer, Launch&& launch) {
  for (int i = 0; i < kWarmupLaunches; ++i) launch(timer.stream());
  timer.synchronize();
  std::vector<double> seconds;
  seconds.reserve(static_cast<std::size_t>(state.max_iterations));
  for (auto _ : state) {
    const double elapsed = timer.seconds(launch);
    state.SetIterationTime(elapsed);
    seconds.push_back(elapsed);
  }
  return bench::median(std::move(seconds));
}

void report(benchmark::State& state, double median_seconds, std::int64_t bytes,
            std::int64_t params) {
  state.counters["median_ms"] = median_seconds * 1e3;
  state.counters["GB_per_s"] = static_cast<double>(bytes) / median_seconds / 1e9;
  state.counters["params_per_s"] = static_cast<double>(params) / median_seconds;
  state.counters["bytes_per_param"] = static_cast<double>(bytes) / static_cast<double>(params);
}

// Runs `body` and turns a zest Error (an out-of-memory at 1B on a smaller GPU, a failed launch)
// into a skipped row with its message instead of ending the program.
template <typename Body>
void guarded(benchmark::State& state, Body&& body) {
  try {
    body();
  } catch (const std::exception& error) {
    state.SkipWithError(error.what());
  }
}

// Ceiling: cudaMemcpyAsync device to device, 14 bytes a parameter each way.
void BM_CopyCeiling(benchmark::State& state) {
  const std::int64_t params = state.range(0);
  guarded(state, [&] {
    const auto size = static_cast<std::size_t>(params * kAdamWBytesPerParam / 2);
    Buffer source = allocator().allocate(size, Category::kWorkspace);
    Buffer destination = allocator().allocate(size, Category::kWorkspace);
    bench::EventTimer timer;
    ZEST_CUDA_CHECK(cudaMemsetAsync(source.data(), 0x3c, size, timer.stream()));
    const double seconds = time_launches(state, timer, [&](cudaStream_t stream) {
      ZEST_CUDA_CHECK(cudaMemcpyAsync(destination.data(), source.data(), size,
                                      cudaMemcpyDeviceToDevice, stream));
    });
    report(state, seconds, static_cast<std::int64_t>(2 * size), params);
    copy_rates()[params] = state.counters["GB_per_s"];
    timer.synchronize();
  });
}

void adamw_rows(benchmark::State& state, bool rounded_copy) {
  const std::int64_t params = state.range(0);
  guarded(state, [&] {
    const auto n = static_cast<std::size_t>(params);
    Buffer p = allocator().allocate(n * sizeof(float), Category::kOptimizer);
    Buffer g = allocator().allocate(n * sizeof(float), Category::kGrads);
    Buffer m = allocator().allocate(n * sizeof(float), Category::kOptimizer);
    Buffer v = allocator().allocate(n * sizeof(float), Category::kOptimizer);
    Buffer copy = rounded_copy ? allocator().allocate(n * sizeof(std::uint16_t), Category::kParams)
                               : Buffer{};
    bench::EventTimer timer;
    ZEST_CUDA_CHECK(cudaMemsetAsync(p.data(), 0x3c, p.bytes(), timer.stream()));
    ZEST_CUDA_CHECK(cudaMemsetAsync(g.data(), 0x3c, g.bytes(), timer.stream()));
    ZEST_CUDA_CHECK(cudaMemsetAsync(m.data(), 0, m.bytes(), timer.stream()));
    ZEST_CUDA_CHECK(cudaMemsetAsync(v.data(), 0, v.bytes(), timer.stream()));
    AdamWArgs args;
    args.lr = 1e-4f;
    args.weight_decay = 0.1f;
    const RoundedCopy rounded{copy.data(), DType::kBFloat16};
    const double seconds = time_launches(state, timer, [&](cudaStream_t stream) {
      cuda::adamw(p.as<float>(), g.as<float>(), m.as<float>(), v.as<float>(), n, args, rounded,
                  stream);
      ++args.step;
    });
    const std::int64_t per_param = rounded_copy ? kRoundedBytesPerParam : kAdamWBytesPerParam;
    report(state, seconds, params * per_param, params);
    if (copy_rates().count(params)) {
      state.counters["copy_GB_per_s"] = copy_rates()[params];
      state.counters["of_copy"] = state.counters["GB_per_s"] / copy_rates()[params];
    }
    timer.synchronize();
  });
}

void BM_AdamW(benchmark::State& state) { adamw_rows(state, false); }
void BM_AdamWBf16Copy(benchmark::State& state) { adamw_rows(state, true); }

void add(const char* name, void (*function)(benchmark::State&), std::int64_t params,
         std::int64_t bytes_per_param) {
  benchmark::RegisterBenchmark(name, function)
      ->ArgName("params")
      ->Arg(params)
      ->Iterations(launches_for(params * bytes_per_param))
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

// Each size's copy runs first, so that its AdamW rows can report their share of it.
void register_benchmarks() {
  for (std::int64_t params : kParameterCounts) {
    add("BM_CopyCeiling", BM_CopyCeiling, params, kAdamWBytesPerParam);
    add("BM_AdamW", BM_AdamW, params, kAdamWBytesPerParam);
    add("BM_AdamWBf16Copy", BM_AdamWBf16Copy, params, kRoundedBytesPerParam);
  }
}

}  // namespace
}  // namespace zest

int main(int argc, char** argv) {
  const bool listing = zest::bench::listing_only(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (listing) {
    zest::register_benchmarks();
    benchmark::RunSpecifiedBenchmarks();
    return 0;
  }
  std::unique_ptr<zest::cuda::CudaPoolAllocator> pool;
  try {
    zest::bench::select_gpu_and_describe();
    pool = std::make_unique<zest::cuda::CudaPoolAllocator>("cuda:0", 0);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "adamw_cuda_bench: error: %s\n", error.what());
    return zest::bench::exit_status(error);
  }
  zest::pool = pool.get();
  zest::register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
