// End-to-end step time of the engine at 4 local ranks, stages 0-3, with communication overlapped
// and serialized, measured side by side in one run. The model is a small GPT (the default job's
// shape class). Report: step time per configuration; the ratios that matter are stage 3 over
// stage 0 (the price of sharding parameters) and overlap on over off (what overlap buys).
//
// Note: ranks are threads on a 2-core machine, so compute and "communication" (memory copies)
// compete for the same cores; the ratios say how much the schedule hides, not what a GPU would.
#include <benchmark/benchmark.h>

#include <chrono>
#include <random>
#include <vector>

#include "models/gpt.h"
#include "engine/engine.h"
#include "runtime/world.h"

namespace zest {
namespace {

constexpr int kRanks = 4;
constexpr int kRowsPerRank = 4;
constexpr int kSteps = 3;  // timed steps per iteration, after one warm-up step

GptConfig bench_model() {
  GptConfig config;
  config.n_layer = 4;
  config.n_head = 4;
  config.n_embd = 128;
  config.vocab_size = 256;
  config.seq_len = 64;
  return config;
}

void run_steps(benchmark::State& state) {
  const int stage = static_cast<int>(state.range(0));
  const bool overlap = state.range(1) != 0;
  const GptConfig model_config = bench_model();
  std::vector<std::int32_t> tokens(kRanks * kRowsPerRank * model_config.seq_len);
  std::mt19937 rng(3);
  for (auto& token : tokens) token = static_cast<std::int32_t>(rng() % model_config.vocab_size);
  WorldOptions world_options;
  world_options.ranks = kRanks;
  World world(world_options);
  for (auto _ : state) {
    double seconds = 0.0;
    world.run([&](RankContext& context) {
      Gpt model(model_config);
      EngineOptions options;
      options.stage = stage;
      options.overlap_comm = overlap;
      options.reduce_bucket_size = 200000;
      Engine engine(context, options);
      OptimizerOptions optimizer;
      auto trainer = engine.shard(model, make_optimizer(optimizer));
      const std::int64_t row_tokens = model_config.seq_len;
      std::int32_t* mine = tokens.data() + context.rank * kRowsPerRank * row_tokens;
      Batch batch{Tensor{mine, {kRowsPerRank, row_tokens}, DType::kInt32},
                  Tensor{mine, {kRowsPerRank, row_tokens}, DType::kInt32}};
      trainer->forward_backward(batch);
      trainer->step();
      const auto begin = std::chrono::steady_clock::now();
      for (int step = 0; step < kSteps; ++step) {
        trainer->forward_backward(batch);
        trainer->step();
      }
      context.synchronize();
      if (context.rank == 0) {
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      }
    });
    state.SetIterationTime(seconds / kSteps);
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(kRanks * kRowsPerRank * model_config.seq_len),
      benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(run_steps)
    ->ArgNames({"stage", "overlap"})
    ->ArgsProduct({{0, 1, 2, 3}, {1, 0}})
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zest

BENCHMARK_MAIN();
