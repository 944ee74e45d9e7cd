// Bandwidth of the `local` backend's all_gather and reduce_scatter (fp32), with the bandwidth
// figures nccl-tests reports, beside the ceiling measured in the same run: one thread's memcpy.
//
//   size     all_gather: total output bytes (n × shard); reduce_scatter: total input bytes
//   algbw    size / time
//   busbw    algbw × (n − 1) / n, the rate each rank's link would need (nccl-tests' definition)
//
// Note: starting a World (threads, streams) is not what is measured. Each benchmark iteration
// runs the World once; every rank issues K collectives on its comm stream and synchronizes, and
// rank 0 times the K collectives from just after a barrier (manual time). K grows as the size
// shrinks so that every iteration is long enough to time; iterations are fixed so the whole
// program stays within about two minutes on two cores.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "runtime/world.h"

namespace zest {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t kMinBytes = std::int64_t{1} << 10;   // 1 KiB
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 28;   // 256 MiB
constexpr std::int64_t kIterations = 4;

// Collectives per timed iteration: about 256 MiB moved, at least 2, at most 400.
int inner_repeats(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{1} << 28) / bytes, 2, 400));
}

enum class Op { kAllGather, kReduceScatter };

void run_collective(benchmark::State& state, Op op) {
  const int ranks = static_cast<int>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  // The per-rank count of the collective: the shard.
  const std::size_t count = bytes / sizeof(float) / static_cast<std::size_t>(ranks);
  const std::size_t total = count * static_cast<std::size_t>(ranks);  // elements in `size`
  if (count == 0) {
    state.SkipWithError("size smaller than one element per rank");
    return;
  }
  const int repeats = inner_repeats(bytes);

  // Buffers are made and touched once, outside the timed region, and reused every iteration.
  std::vector<std::vector<float>> send(ranks), recv(ranks);
  for (int r = 0; r < ranks; ++r) {
    send[r].assign(op == Op::kAllGather ? count : total, 1.0f + static_cast<float>(r));
    recv[r].assign(op == Op::kAllGather ? total : count, 0.0f);
  }

  WorldOptions options;
  options.ranks = ranks;
  options.timeout = std::chrono::seconds(600);
  World world(options);

  double timed_seconds = 0.0;
  std::int64_t collectives = 0;
  for (auto _ : state) {
    double seconds = 0.0;
    world.run([&](RankContext& context) {
      const int r = context.rank;
      Communicator& comm = context.communicator;
      auto issue = [&] {
        if (op == Op::kAllGather) {
          comm.all_gather(context.comm, send[r].data(), recv[r].data(), count, DType::kFloat32);
        } else {
          comm.reduce_scatter(context.comm, send[r].data(), recv[r].data(), count,
                              DType::kFloat32, Reduction::kSum);
        }
      };
      issue();  // warm-up: threads running, caches and TLBs in their steady state
      comm.barrier(context.comm);
      context.comm.synchronize();
      const auto start = Clock::now();
      for (int k = 0; k < repeats; ++k) issue();
      context.comm.synchronize();
      // Note: a collective completes on a rank only once every rank has finished its share
      // (the second meeting), so rank 0's clock covers all ranks' work.
      if (r == 0) seconds = std::chrono::duration<double>(Clock::now() - start).count();
    });
    state.SetIterationTime(seconds / repeats);
    timed_seconds += seconds;
    collectives += repeats;
  }

  const double size = static_cast<double>(total * sizeof(float));
  const double algbw = size * static_cast<double>(collectives) / timed_seconds / 1e9;
  state.counters["bytes"] = size;
  state.counters["K"] = repeats;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * (ranks - 1) / ranks;
  state.SetLabel(op == Op::kAllGather ? "all_gather fp32" : "reduce_scatter fp32");
}

void BM_AllGather(benchmark::State& state) { run_collective(state, Op::kAllGather); }
void BM_ReduceScatter(benchmark::State& state) { run_collective(state, Op::kReduceScatter); }

// The ceiling: one thread copying `bytes` from one buffer to another.
void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> source(bytes, 1), destination(bytes, 0);
  const int repeats = inner_repeats(bytes);
  double timed_seconds = 0.0;
  std::int64_t copies = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    for (int k = 0; k < repeats; ++k) {
      std::memcpy(destination.data(), source.data(), bytes);
      benchmark::ClobberMemory();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    state.SetIterationTime(seconds / repeats);
    timed_seconds += seconds;
    copies += repeats;
  }
  benchmark::DoNotOptimize(destination.data());
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["GBps"] = static_cast<double>(bytes) * static_cast<double>(copies) /
                           timed_seconds / 1e9;
}

void collective_args(benchmark::internal::Benchmark* benchmark) {
  benchmark->ArgNames({"ranks", "bytes"});
  for (int ranks : {2, 4}) {
    for (std::int64_t bytes = kMinBytes; bytes <= kMaxBytes; bytes *= 4) {
      benchmark->Args({ranks, bytes});
    }
  }
  benchmark->UseManualTime()->Iterations(kIterations)->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Memcpy)
    ->ArgName("bytes")
    ->RangeMultiplier(4)
    ->Range(kMinBytes, kMaxBytes)
    ->UseManualTime()
    ->Iterations(kIterations)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AllGather)->Apply(collective_args);
BENCHMARK(BM_ReduceScatter)->Apply(collective_args);

}  // namespace
}  // namespace zest

BENCHMARK_MAIN();
