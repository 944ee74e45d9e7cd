// The CPU AdamW body over 1M..64M parameters, in bytes/s and params/s, beside the ceiling it
// is held against: STREAM-like copy and triad loops moving the same bytes per iteration, on
// one thread as the kernel runs (one stream's worker). AdamW reads p, g, m, v and writes p, m,
// v: 28 bytes per parameter, counted like STREAM (no write-allocate traffic).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/blocked_loop.h"

namespace {

constexpr std::int64_t kAdamWBytesPerParam = 7 * sizeof(float);
constexpr std::int64_t kTriadBytesPerElement = 3 * sizeof(float);  // a = b + s * c
constexpr std::int64_t kCopyBytesPerElement = 2 * sizeof(float);   // a = b

void report(benchmark::State& state, std::int64_t bytes_per_iteration, std::int64_t params) {
  const auto iterations = static_cast<std::int64_t>(state.iterations());
  state.SetBytesProcessed(iterations * bytes_per_iteration);
  state.counters["params/s"] =
      benchmark::Counter(static_cast<double>(iterations * params), benchmark::Counter::kIsRate);
  state.counters["MiB"] = static_cast<double>(bytes_per_iteration) / (1 << 20);
}

void BM_AdamW(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<float> p(n, 0.5f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f);  // filled: pages faulted
  zest::AdamWArgs args;
  args.weight_decay = 0.01f;
  for (auto _ : state) {
    zest::cpu::adamw(p.data(), g.data(), m.data(), v.data(), n, args);
    ++args.step;
    benchmark::ClobberMemory();
  }
  report(state, static_cast<std::int64_t>(n) * kAdamWBytesPerParam, static_cast<std::int64_t>(n));
}

// The ceiling loops, vectorized like the kernel (restrict parameters, fixed-size blocks).
inline void triad(float* __restrict out, const float* __restrict x, const float* __restrict y,
                  float scalar, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + scalar * y[i];
}

inline void copy(float* __restrict out, const float* __restrict in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = in[i];
}

// Ceiling: the triad over arrays sized so one iteration moves what AdamW over n params moves.
void BM_TriadCeiling(benchmark::State& state) {
  const std::int64_t params = state.range(0);
  const auto n = static_cast<std::size_t>(params * kAdamWBytesPerParam / kTriadBytesPerElement);
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  const float scalar = 0.5f;
  for (auto _ : state) {
    zest::for_each_block(n, [&](std::size_t offset, std::size_t count) {
      triad(a.data() + offset, b.data() + offset, c.data() + offset, scalar, count);
    });
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  report(state, static_cast<std::int64_t>(n) * kTriadBytesPerElement, params);
}

void BM_CopyCeiling(benchmark::State& state) {
  const std::int64_t params = state.range(0);
  const auto n = static_cast<std::size_t>(params * kAdamWBytesPerParam / kCopyBytesPerElement);
  std::vector<float> a(n, 0.0f), b(n, 1.0f);
  for (auto _ : state) {
    zest::for_each_block(n, [&](std::size_t offset, std::size_t count) {
      copy(a.data() + offset, b.data() + offset, count);
    });
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  report(state, static_cast<std::int64_t>(n) * kCopyBytesPerElement, params);
}

// The argument is the AdamW parameter count in every benchmark, so rows line up by size.
void parameter_counts(benchmark::internal::Benchmark* benchmark) {
  benchmark->RangeMultiplier(4)->Range(1 << 20, 1 << 26)->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_AdamW)->Apply(parameter_counts);
BENCHMARK(BM_TriadCeiling)->Apply(parameter_counts);
BENCHMARK(BM_CopyCeiling)->Apply(parameter_counts);

}  // namespace

BENCHMARK_MAIN();
