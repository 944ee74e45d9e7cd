// zest's CPU kernels at the GPT's shapes, one thread, beside the memory-bandwidth ceiling
// measured in the same run (a read+write stream over the same bytes), for the table against
// PyTorch's ops (tools/reference/torch_kernels_bench.py runs the same shapes).
//
//   GB_per_s    bytes the kernel must move (each input read once, each output written once)
//               per second; of_bandwidth: that over the stream's rate at the same size
//
// Shapes: rows = 512 (4 sequences of 128, one rank of the 4 x 256 GPT), GELU over [512, 1024],
// LayerNorm over [512, 256], softmax + cross-entropy over [512, 256] and [512, 50257], AdamW
// and the gradient statistics over the 4 x 256 GPT's 3.26M parameters. GeluLibmTanh is the scalar libm-tanh form the GELU
// bodies replaced, for reference.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/cross_entropy.h"
#include "kernels/gelu.h"
#include "kernels/gradient_statistics.h"
#include "kernels/layernorm.h"

namespace zest {
namespace {

std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["GB_per_s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

// The ceiling: read n floats, write n floats (memcpy between two arrays of the given size).
void BM_Stream(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<float> a = random_vector(n, 1), b(n);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * n * sizeof(float));
}
BENCHMARK(BM_Stream)->Arg(512 * 1024)->Arg(512 * 256)->Arg(512 * 50257)->Arg(3257856);

constexpr std::size_t kGeluCount = 512 * 1024;

void BM_GeluForward(benchmark::State& state) {
  const std::vector<float> x = random_vector(kGeluCount, 2);
  std::vector<float> y(kGeluCount);
  for (auto _ : state) {
    cpu::gelu_forward(x.data(), y.data(), kGeluCount);
    benchmark::DoNotOptimize(y.data());
  }
  set_bytes(state, 2.0 * kGeluCount * sizeof(float));
}
BENCHMARK(BM_GeluForward);

void BM_GeluBackward(benchmark::State& state) {
  const std::vector<float> x = random_vector(kGeluCount, 3), dy = random_vector(kGeluCount, 4);
  std::vector<float> dx(kGeluCount);
  for (auto _ : state) {
    cpu::gelu_backward(x.data(), dy.data(), dx.data(), kGeluCount);
    benchmark::DoNotOptimize(dx.data());
  }
  set_bytes(state, 3.0 * kGeluCount * sizeof(float));
}
BENCHMARK(BM_GeluBackward);

void BM_GeluLibmTanhForward(benchmark::State& state) {
  const std::vector<float> x = random_vector(kGeluCount, 2);
  std::vector<float> y(kGeluCount);
  for (auto _ : state) {
    for (std::size_t i = 0; i < kGeluCount; ++i) {
      const float v = x[i];
      y[i] = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
    benchmark::DoNotOptimize(y.data());
  }
  set_bytes(state, 2.0 * kGeluCount * sizeof(float));
}
BENCHMARK(BM_GeluLibmTanhForward);

constexpr std::int64_t kRows = 512, kCols = 256;

void BM_LayerNormForward(benchmark::State& state) {
  const std::vector<float> x = random_vector(kRows * kCols, 5), w = random_vector(kCols, 6),
                           b = random_vector(kCols, 7);
  std::vector<float> y(kRows * kCols), mean(kRows), rstd(kRows);
  for (auto _ : state) {
    cpu::layernorm_forward(x.data(), w.data(), b.data(), kRows, kCols, 1e-5f, y.data(),
                           mean.data(), rstd.data());
    benchmark::DoNotOptimize(y.data());
  }
  set_bytes(state, 2.0 * kRows * kCols * sizeof(float));
}
BENCHMARK(BM_LayerNormForward);

void BM_LayerNormBackward(benchmark::State& state) {
  const std::vector<float> x = random_vector(kRows * kCols, 5), w = random_vector(kCols, 6),
                           b = random_vector(kCols, 7), dy = random_vector(kRows * kCols, 8);
  std::vector<float> y(kRows * kCols), mean(kRows), rstd(kRows), dx(kRows * kCols), dw(kCols),
      db(kCols);
  cpu::layernorm_forward(x.data(), w.data(), b.data(), kRows, kCols, 1e-5f, y.data(), mean.data(),
                         rstd.data());
  for (auto _ : state) {
    cpu::layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), kRows, kCols,
                            dx.data(), dw.data(), db.data());
    benchmark::DoNotOptimize(dx.data());
  }
  set_bytes(state, 3.0 * kRows * kCols * sizeof(float));
}
BENCHMARK(BM_LayerNormBackward);

// Forward then backward, as a step runs them.
void BM_CrossEntropy(benchmark::State& state) {
  const std::int64_t classes = state.range(0);
  const std::vector<float> logits = random_vector(kRows * classes, 9, 2.0f);
  std::vector<std::int32_t> targets(kRows);
  for (std::int64_t r = 0; r < kRows; ++r) targets[r] = static_cast<std::int32_t>((r * 31) % classes);
  std::vector<float> dlogits(kRows * classes);
  float loss = 0.0f;
  for (auto _ : state) {
    cpu::cross_entropy_forward(logits.data(), targets.data(), kRows, classes, &loss);
    cpu::cross_entropy_backward(logits.data(), targets.data(), kRows, classes, 1.0f,
                                dlogits.data());
    benchmark::DoNotOptimize(dlogits.data());
  }
  // The least a fused forward+backward must move: read the logits, write their gradient.
  set_bytes(state, 2.0 * kRows * classes * sizeof(float));
}
BENCHMARK(BM_CrossEntropy)->Arg(256)->Arg(50257);

void BM_AdamW(benchmark::State& state) {
  const std::size_t n = 3257856;
  std::vector<float> p = random_vector(n, 10), g = random_vector(n, 11, 0.01f),
                     m = random_vector(n, 12, 0.001f), v(n, 1e-6f);
  AdamWArgs args;
  args.weight_decay = 0.1f;
  for (auto _ : state) {
    cpu::adamw(p.data(), g.data(), m.data(), v.data(), n, args);
    ++args.step;
  }
  set_bytes(state, 7.0 * n * sizeof(float));  // read p, g, m, v; write p, m, v
}
BENCHMARK(BM_AdamW);

void BM_GradientStatistics(benchmark::State& state) {
  const std::size_t n = 3257856;
  const std::vector<float> g = random_vector(n, 13, 0.01f);
  for (auto _ : state) {
    GradientStatistics statistics;
    cpu::add_gradient_statistics(g.data(), DType::kFloat32, n, &statistics);
    benchmark::DoNotOptimize(statistics);
  }
  set_bytes(state, 1.0 * n * sizeof(float));
}
BENCHMARK(BM_GradientStatistics);

}  // namespace
}  // namespace zest

BENCHMARK_MAIN();
