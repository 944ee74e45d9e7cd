// The CPU AdamW update over 1M..64M parameters, in bytes/s and params/s, for each body this CPU
// runs (portable, avx2, avx512), beside a scalar loop of the same formulas (not vectorized) and
// the ceilings it is held against: STREAM-like triad and copy loops moving the same bytes per
// iteration, on as many threads (kernel_threads) as the kernel. AdamW reads p, g, m, v and writes
// p, m, v: 28 bytes per parameter, counted like STREAM (no write-allocate traffic); the fused
// bf16 copy-out writes 2 more. Times are wall-clock, so multithreaded rows count every thread.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kernels/adamw.h"
#include "kernels/blocked_loop.h"
#include "kernels/convert.h"
#include "kernels/kernel_threads.h"

namespace {

constexpr std::int64_t kAdamWBytesPerParam = 7 * sizeof(float);
constexpr std::int64_t kRoundedBytesPerParam = kAdamWBytesPerParam + sizeof(std::uint16_t);
constexpr std::int64_t kTriadBytesPerElement = 3 * sizeof(float);  // a = b + s * c
constexpr std::int64_t kCopyBytesPerElement = 2 * sizeof(float);   // a = b
// As kernels/adamw.cc: a thread's piece of a ceiling loop is as long as the kernel's.
constexpr std::size_t kMinElementsPerThread = std::size_t{1} << 19;

void report(benchmark::State& state, std::int64_t bytes_per_iteration, std::int64_t params) {
  const auto iterations = static_cast<std::int64_t>(state.iterations());
  state.SetBytesProcessed(iterations * bytes_per_iteration);
  state.counters["params/s"] =
      benchmark::Counter(static_cast<double>(iterations * params), benchmark::Counter::kIsRate);
  state.counters["MiB"] = static_cast<double>(bytes_per_iteration) / (1 << 20);
}

// Arrays start on a cache line, as the engine's buffers do (memory/allocator.h).
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  explicit CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* data, std::size_t) { ::operator delete(data, std::align_val_t{64}); }
  bool operator==(const CacheLineAllocator&) const = default;
};

template <typename T>
using Array = std::vector<T, CacheLineAllocator<T>>;

// The optimizer state of n parameters, filled so that every page is faulted in before timing.
struct AdamWState {
  explicit AdamWState(std::size_t n) : p(n, 0.5f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f) {}
  Array<float> p, g, m, v;
};

zest::AdamWArgs benchmark_args() {
  zest::AdamWArgs args;
  args.weight_decay = 0.01f;
  return args;
}

// Sets the kernel thread budget for one benchmark and puts it back after.
class ThreadBudget {
 public:
  explicit ThreadBudget(std::int64_t threads) {
    zest::set_kernel_threads(static_cast<int>(threads));
  }
  ~ThreadBudget() { zest::set_kernel_threads(1); }
  ThreadBudget(const ThreadBudget&) = delete;
  ThreadBudget& operator=(const ThreadBudget&) = delete;
};

void adamw(benchmark::State& state, zest::CpuBody body) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const ThreadBudget budget(state.range(1));
  AdamWState s(n);
  zest::AdamWArgs args = benchmark_args();
  for (auto _ : state) {
    zest::cpu::adamw(body, s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, args);
    ++args.step;
    benchmark::ClobberMemory();
  }
  report(state, static_cast<std::int64_t>(n) * kAdamWBytesPerParam, static_cast<std::int64_t>(n));
}

// The update with its bf16 copy written in the same pass (mixed precision's master -> params).
void adamw_rounded(benchmark::State& state, zest::CpuBody body) {
  const auto n = static_cast<std::size_t>(state.range(0));
  AdamWState s(n);
  Array<std::uint16_t> rounded(n, 0);
  zest::AdamWArgs args = benchmark_args();
  for (auto _ : state) {
    zest::cpu::adamw(body, s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, args,
                     {rounded.data(), zest::DType::kBFloat16});
    ++args.step;
    benchmark::ClobberMemory();
  }
  report(state, static_cast<std::int64_t>(n) * kRoundedBytesPerParam, static_cast<std::int64_t>(n));
}

// The same result as adamw_rounded by the engine's former route: update, then a convert pass.
// Counted with the same useful bytes, so its GB/s compares with the fused row like its time.
void BM_AdamWThenConvert(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  AdamWState s(n);
  Array<std::uint16_t> rounded(n, 0);
  zest::AdamWArgs args = benchmark_args();
  for (auto _ : state) {
    zest::cpu::adamw(s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, args);
    zest::cpu::convert(s.p.data(), zest::DType::kFloat32, rounded.data(), zest::DType::kBFloat16,
                       n);
    ++args.step;
    benchmark::ClobberMemory();
  }
  report(state, static_cast<std::int64_t>(n) * kRoundedBytesPerParam, static_cast<std::int64_t>(n));
}

// The baseline: kernels/adamw.cc's portable formulas as a plain loop that the compiler may not
// vectorize. Its sqrt keeps GCC's errno check (a compare and a branch never taken), which the
// optimize attribute cannot drop; the divide and the sqrt dominate the loop anyway.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((noinline, optimize("no-tree-vectorize")))
#else
__attribute__((noinline))
#endif
void scalar_adamw(float* p, const float* g, float* m, float* v, std::size_t n,
                  const zest::AdamWArgs& args) {
  const double bias_correction1 = 1.0 - std::pow(double{args.beta1}, double(args.step));
  const double bias_correction2 = 1.0 - std::pow(double{args.beta2}, double(args.step));
  const double weight_decay = args.weight_decay;
  const float l2 = static_cast<float>(args.decoupled ? 0.0 : weight_decay);
  const float decay = static_cast<float>(args.decoupled ? 1.0 - args.lr * weight_decay : 1.0);
  const float step_size = static_cast<float>(args.lr / bias_correction1);
  const float inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  const float one_minus_beta1 = 1.0f - args.beta1;
  const float one_minus_beta2 = 1.0f - args.beta2;
#if defined(__clang__)
#pragma clang loop vectorize(disable) interleave(disable)
#endif
  for (std::size_t i = 0; i < n; ++i) {
    const float grad = g[i] * args.grad_scale + l2 * p[i];
    const float mi = args.beta1 * m[i] + one_minus_beta1 * grad;
    const float vi = args.beta2 * v[i] + one_minus_beta2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    // The builtin: std::sqrt is not inlined into a function with its own optimize options.
    const float denom = __builtin_sqrtf(vi) * inv_sqrt_bias_correction2 + args.eps;
    p[i] = p[i] * decay - step_size * mi / denom;
  }
}

void BM_AdamWScalar(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  AdamWState s(n);
  zest::AdamWArgs args = benchmark_args();
  for (auto _ : state) {
    scalar_adamw(s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, args);
    ++args.step;
    benchmark::ClobberMemory();
  }
  report(state, static_cast<std::int64_t>(n) * kAdamWBytesPerParam, static_cast<std::int64_t>(n));
}

// The ceiling loops, vectorized like the kernel (restrict parameters, fixed-size blocks) and
// split over threads the way the kernel is.
inline void triad(float* __restrict out, const float* __restrict x, const float* __restrict y,
                  float scalar, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + scalar * y[i];
}

inline void add_in_place(float* __restrict out, const float* __restrict y, float scalar,
                         std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = out[i] + scalar * y[i];
}

inline void copy(float* __restrict out, const float* __restrict in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = in[i];
}

template <typename Body>
void run_split(std::size_t n, Body&& body) {
  zest::parallel_blocks(n, kMinElementsPerThread, [&](std::size_t first, std::size_t count) {
    zest::for_each_block(count, [&](std::size_t offset, std::size_t length) {
      body(first + offset, length);
    });
  });
}

// Ceiling: the triad over arrays sized so one iteration moves what AdamW over n params moves.
void BM_TriadCeiling(benchmark::State& state) {
  const std::int64_t params = state.range(0);
  const ThreadBudget budget(state.range(1));
  const auto n = static_cast<std::size_t>(params * kAdamWBytesPerParam / kTriadBytesPerElement);
  Array<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  const float scalar = 0.5f;
  for (auto _ : state) {
    run_split(n, [&](std::size_t offset, std::size_t count) {
      triad(a.data() + offset, b.data() + offset, c.data() + offset, scalar, count);
    });
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  report(state, static_cast<std::int64_t>(n) * kTriadBytesPerElement, params);
}

// Ceiling without write-allocate traffic: every line written was just read, as in AdamW (which
// writes p, m, v in place). The triad's counted bytes leave out the write-allocate read of `a`
// (its traffic is 4/3 of what it counts), so AdamW can count more GB/s than the triad.
void BM_InPlaceCeiling(benchmark::State& state) {
  const std::int64_t params = state.range(0);
  const ThreadBudget budget(state.range(1));
  const auto n = static_cast<std::size_t>(params * kAdamWBytesPerParam / kTriadBytesPerElement);
  Array<float> a(n, 0.0f), b(n, 1.0f);
  const float scalar = 0.5f;
  for (auto _ : state) {
    run_split(n, [&](std::size_t offset, std::size_t count) {
      add_in_place(a.data() + offset, b.data() + offset, scalar, count);
    });
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  report(state, static_cast<std::int64_t>(n) * kTriadBytesPerElement, params);
}

void BM_CopyCeiling(benchmark::State& state) {
  const std::int64_t params = state.range(0);
  const ThreadBudget budget(state.range(1));
  const auto n = static_cast<std::size_t>(params * kAdamWBytesPerParam / kCopyBytesPerElement);
  Array<float> a(n, 0.0f), b(n, 1.0f);
  for (auto _ : state) {
    run_split(n, [&](std::size_t offset, std::size_t count) {
      copy(a.data() + offset, b.data() + offset, count);
    });
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  report(state, static_cast<std::int64_t>(n) * kCopyBytesPerElement, params);
}

// The first argument is the AdamW parameter count in every benchmark, so rows line up by size;
// the second, where there is one, the kernel thread budget. 64Ki parameters (1.8 MiB) stay in a
// core's L2 and show the arithmetic; the others stream from memory.
constexpr std::int64_t kParameterCounts[] = {1 << 16, 1 << 20, 1 << 24, 1 << 26};

benchmark::internal::Benchmark* sized(benchmark::internal::Benchmark* benchmark, bool threads) {
  for (std::int64_t params : kParameterCounts) {
    if (!threads) {
      benchmark->Arg(params);
      continue;
    }
    for (std::int64_t thread_count : {1, 2}) benchmark->Args({params, thread_count});
  }
  benchmark->ArgNames(threads ? std::vector<std::string>{"params", "kernel_threads"}
                              : std::vector<std::string>{"params"});
  return benchmark->Unit(benchmark::kMillisecond)->UseRealTime();
}

void register_benchmarks() {
  using zest::CpuBody;
  for (CpuBody body : {CpuBody::kPortable, CpuBody::kAvx2, CpuBody::kAvx512}) {
    if (!zest::cpu_body_supported(body)) continue;
    const std::string name = zest::cpu_body_name(body);
    sized(benchmark::RegisterBenchmark(("BM_AdamW/" + name).c_str(), adamw, body), true);
    sized(benchmark::RegisterBenchmark(("BM_AdamWRounded/" + name).c_str(), adamw_rounded, body),
          false);
  }
  sized(benchmark::RegisterBenchmark("BM_AdamWThenConvert", BM_AdamWThenConvert), false);
  sized(benchmark::RegisterBenchmark("BM_AdamWScalar", BM_AdamWScalar), false);
  sized(benchmark::RegisterBenchmark("BM_TriadCeiling", BM_TriadCeiling), true);
  sized(benchmark::RegisterBenchmark("BM_InPlaceCeiling", BM_InPlaceCeiling), true);
  sized(benchmark::RegisterBenchmark("BM_CopyCeiling", BM_CopyCeiling), true);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("zest_cpu_body", zest::cpu_body_name(zest::selected_cpu_body()));
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
