// Tokens/s of one GPT forward+backward on one rank through the engine (stage 0, CPU device),
// beside the ceiling measured in the same run: cblas_sgemm (through zest's matmul) running
// exactly the step's matrix products, same shapes and transposes, back to back.
//
//   tokens_per_s     B·T / (time of trainer->forward_backward)
//   model_GFLOPs     the step's GEMM FLOPs / that time (what the model achieves)
//   gemm_GFLOPs      the same FLOPs / the time of the GEMMs alone (the ceiling)
//   of_ceiling       model_GFLOPs / gemm_GFLOPs: what the rest (norms, softmax, GELU, copies,
//                    the stream's hand-offs) costs
//
// FLOPs are the ones the GEMMs execute (2·m·n·k each), the full T×T attention products
// included (the causal mask is applied after them). Backward runs two GEMMs per forward GEMM,
// so a step is 3× the forward's FLOPs. The optimizer step runs between iterations, untimed.
// Small GPT: 4 layers, 4 heads, 128 channels, seq 64, batch 8; vocab 4096 (blocks dominate)
// and GPT-2's 50257 (the tied LM head dominates).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "models/gpt.h"
#include "engine/engine.h"
#include "runtime/world.h"

namespace zest {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t kBatch = 8;

GptConfig bench_config(std::int64_t vocab) {
  return GptConfig{/*n_layer=*/4, /*n_head=*/4, /*n_embd=*/128, static_cast<int>(vocab),
                   /*seq_len=*/64};
}

struct Gemm {
  bool trans_a, trans_b;
  std::int64_t m, n, k;
  std::int64_t repeat;  // calls of this shape per step
  float beta;           // 1 where the model accumulates (parameter gradients)
};

// The matrix products of one forward+backward of the model, as models/gpt*.cc issue them.
std::vector<Gemm> step_gemms(const GptConfig& c, std::int64_t batch) {
  const std::int64_t T = c.seq_len, C = c.n_embd, N = batch * T, V = c.vocab_size;
  const std::int64_t d = C / c.n_head, heads = batch * c.n_head, L = c.n_layer;
  return {
      // Block forward: c_attn, QKᵀ and PV per (batch, head), c_proj, c_fc, mlp.c_proj.
      {false, true, N, 3 * C, C, L, 0}, {false, true, T, T, d, L * heads, 0},
      {false, false, T, d, T, L * heads, 0}, {false, true, N, C, C, L, 0},
      {false, true, N, 4 * C, C, L, 0}, {false, true, N, C, 4 * C, L, 0},
      // Block backward: weight gradient and input gradient of each, dP, dV, dQ, dK.
      {true, false, C, 4 * C, N, L, 1}, {false, false, N, 4 * C, C, L, 0},
      {true, false, 4 * C, C, N, L, 1}, {false, false, N, C, 4 * C, L, 0},
      {true, false, C, C, N, L, 1}, {false, false, N, C, C, L, 0},
      {false, true, T, T, d, L * heads, 0}, {true, false, T, d, T, L * heads, 0},
      {false, false, T, d, T, L * heads, 0}, {true, false, T, d, T, L * heads, 0},
      {true, false, 3 * C, C, N, L, 1}, {false, false, N, C, 3 * C, L, 0},
      // Head: logits = ln_f(x) · wteᵀ; d(wte) and d(ln_f(x)).
      {false, true, N, V, C, 1, 0}, {true, false, V, C, N, 1, 1}, {false, false, N, C, V, 1, 0},
  };
}

double step_flops(const std::vector<Gemm>& gemms) {
  double flops = 0.0;
  for (const Gemm& g : gemms) flops += 2.0 * g.m * g.n * g.k * g.repeat;
  return flops;
}

std::map<std::int64_t, double>& ceilings() {  // vocab -> GEMM GFLOP/s measured in this run
  static std::map<std::int64_t, double> measured;
  return measured;
}

// The ceiling: the step's GEMMs alone, on this thread, over buffers reused by every call (so
// they stay in cache more than the model's do: a ceiling, not a prediction).
void BM_GemmCeiling(benchmark::State& state) {
  const std::int64_t vocab = state.range(0);
  const std::vector<Gemm> gemms = step_gemms(bench_config(vocab), kBatch);
  std::size_t a_size = 0, b_size = 0, c_size = 0;
  for (const Gemm& g : gemms) {
    a_size = std::max<std::size_t>(a_size, g.m * g.k);
    b_size = std::max<std::size_t>(b_size, g.k * g.n);
    c_size = std::max<std::size_t>(c_size, g.m * g.n);
  }
  std::vector<float> a(a_size, 0.01f), b(b_size, 0.02f), c(c_size, 0.0f);
  double seconds = 0.0;
  for (auto _ : state) {
    const auto start = Clock::now();
    for (const Gemm& g : gemms) {
      for (std::int64_t r = 0; r < g.repeat; ++r) {
        cpu::matmul(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, a.data(), b.data(), g.beta,
                    c.data());
      }
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    benchmark::ClobberMemory();
    state.SetIterationTime(elapsed);
    seconds += elapsed;
  }
  const double gflops = step_flops(gemms) * static_cast<double>(state.iterations()) / seconds / 1e9;
  // A ceiling is the best the GEMMs did: with --benchmark_repetitions the best repetition.
  ceilings()[vocab] = std::max(ceilings()[vocab], gflops);
  state.counters["gemm_GFLOPs"] = gflops;
  state.counters["step_GFLOP"] = step_flops(gemms) / 1e9;
  state.SetLabel("cblas_sgemm at the step's shapes");
}

void BM_GptForwardBackward(benchmark::State& state) {
  const std::int64_t vocab = state.range(0);
  const GptConfig config = bench_config(vocab);
  const std::int64_t T = config.seq_len;
  std::vector<std::int32_t> inputs(kBatch * T), targets(kBatch * T);
  std::mt19937 rng(1);
  std::uniform_int_distribution<std::int32_t> token(0, config.vocab_size - 1);
  for (auto& t : inputs) t = token(rng);
  for (auto& t : targets) t = token(rng);
  const Batch batch{Tensor{inputs.data(), {kBatch, T}, DType::kInt32},
                    Tensor{targets.data(), {kBatch, T}, DType::kInt32}};

  WorldOptions world_options;
  world_options.ranks = 1;
  World world(world_options);
  double seconds = 0.0;
  // Note: the benchmark loop runs on the rank's thread: the model, engine and trainer are
  // built once, outside the timed region, and live only inside World::run.
  world.run([&](RankContext& context) {
    Gpt model(config);
    Engine engine(context, EngineOptions{});
    OptimizerOptions optimizer;
    optimizer.lr = 1e-4f;
    auto trainer = engine.shard(model, make_optimizer(optimizer));
    trainer->forward_backward(batch);  // warm-up: pages touched, OpenBLAS threads started
    trainer->step();
    for (auto _ : state) {
      const auto start = Clock::now();
      // Returns once the compute stream has run the step (it reads the loss back).
      benchmark::DoNotOptimize(trainer->forward_backward(batch));
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      state.SetIterationTime(elapsed);
      seconds += elapsed;
      trainer->step();
    }
  });
  const double iterations = static_cast<double>(state.iterations());
  const double gflops = step_flops(step_gemms(config, kBatch)) * iterations / seconds / 1e9;
  state.counters["tokens_per_s"] = static_cast<double>(kBatch * T) * iterations / seconds;
  state.counters["model_GFLOPs"] = gflops;
  if (ceilings().count(vocab)) {
    state.counters["gemm_GFLOPs"] = ceilings()[vocab];
    state.counters["of_ceiling"] = gflops / ceilings()[vocab];
  }
  state.SetLabel(Gpt(config).describe() + ", batch 8");
}

// The ceiling runs first so that the model's line can report its share of it.
BENCHMARK(BM_GemmCeiling)->Arg(4096)->Arg(50257)->UseManualTime()->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);
BENCHMARK(BM_GptForwardBackward)->Arg(4096)->Arg(50257)->UseManualTime()
    ->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
}  // namespace zest

BENCHMARK_MAIN();
