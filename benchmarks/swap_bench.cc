// The NVMe tier against the physical limit, in one run. Ceiling: the file system under
// ZEST_SWAP_BENCH_PATH (default /tmp) read and written with O_DIRECT by plain pwrite/pread of
// large blocks from one thread, the benchmark's own measurement. Then the tier (SwapStore) moving
// the same bytes on io_uring and on the pread/pwrite threads: GB/s and the ratio to the ceiling
// (goal ≥ 0.8). Then the optimizer step (AdamW, fp32, stage 1, one rank) with the state on NVMe
// against the same step with it in host memory, at a size that fits both, reporting
// bytes_moved / disk_GBps as the step's disk bound (goal: NVMe ≤ 1.2 × max(host, disk bound)).
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "memory/swap_store.h"
#include "models/mlp.h"
#include "runtime/world.h"

namespace zest {
namespace {

constexpr std::size_t kBytes = std::size_t{256} << 20;  // moved per iteration
constexpr std::size_t kBlock = std::size_t{1} << 20;    // aio.block_size's default

std::string bench_path() {
  const char* path = std::getenv("ZEST_SWAP_BENCH_PATH");
  return path ? path : "/tmp";
}

struct Aligned {
  explicit Aligned(std::size_t bytes)
      : data(static_cast<char*>(std::aligned_alloc(kSwapAlignment, bytes))) {
    std::memset(data, 1, bytes);  // every page faulted in before timing
  }
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  char* data;
};

// The measured ceilings, kept for the ratios of the rows after them (same process, same run).
double g_write_ceiling = 0.0;
double g_read_ceiling = 0.0;

void report(benchmark::State& state, double ceiling) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBytes));
  if (ceiling > 0.0) {
    state.counters["of_ceiling"] = benchmark::Counter(
        static_cast<double>(kBytes) / ceiling, benchmark::Counter::kIsIterationInvariantRate);
  }
}

// The ceiling: O_DIRECT pwrite / pread of kBlock pieces, one thread, synchronous.
void disk_ceiling(benchmark::State& state) {
  const bool write = state.range(0) != 0;
  const std::string file = bench_path() + "/zest_swap_bench_ceiling";
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd < 0) {
    state.SkipWithError(("O_DIRECT open of " + file + " failed").c_str());
    return;
  }
  ::posix_fallocate(fd, 0, static_cast<off_t>(kBytes));
  Aligned buffer(kBlock * 8);
  const std::size_t piece = kBlock * 8;
  auto pass = [&](bool writing) {
    for (std::size_t offset = 0; offset < kBytes; offset += piece) {
      const ssize_t moved = writing ? ::pwrite(fd, buffer.data, piece, static_cast<off_t>(offset))
                                    : ::pread(fd, buffer.data, piece, static_cast<off_t>(offset));
      if (moved != static_cast<ssize_t>(piece)) std::abort();
    }
    if (writing) ::fdatasync(fd);
  };
  pass(true);  // the blocks written once, so reads read real data
  double seconds = 0.0;
  for (auto _ : state) {
    const auto begin = std::chrono::steady_clock::now();
    pass(write);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    seconds += elapsed;
    state.SetIterationTime(elapsed);
  }
  (write ? g_write_ceiling : g_read_ceiling) = static_cast<double>(kBytes) * state.iterations() / seconds;
  report(state, 0.0);
  ::close(fd);
  std::filesystem::remove(file);
}

// The tier: the same bytes as regions of 8 MiB (a sub-group's size), in block_size requests.
void swap_tier(benchmark::State& state) {
  const bool write = state.range(0) != 0;
  SwapOptions options;
  options.path = bench_path();
  options.block_size = kBlock;
  options.io.backend = state.range(1) != 0 ? SwapBackend::kIoUring : SwapBackend::kThreads;
  options.io.queue_depth = 8;
  options.io.thread_count = 2;
  SwapStore store(options, 0);
  constexpr std::size_t kRegion = kBlock * 8;
  std::vector<SwapRegion> regions;
  for (std::size_t done = 0; done < kBytes; done += kRegion) regions.push_back(store.reserve(kRegion));
  store.open();
  Aligned buffer(kRegion);
  for (const SwapRegion& region : regions) store.write(region, 0, buffer.data, kRegion);
  for (auto _ : state) {
    const auto begin = std::chrono::steady_clock::now();
    for (const SwapRegion& region : regions) {
      if (write) {
        store.write(region, 0, buffer.data, kRegion);
      } else {
        store.read(region, 0, buffer.data, kRegion);
      }
    }
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
  }
  state.SetLabel(store.direct() ? store.backend() : std::string(store.backend()) + " (no O_DIRECT)");
  report(state, write ? g_write_ceiling : g_read_ceiling);
}

// The optimizer step: stage 1, fp32, one rank; an MLP of about 8.4M parameters (101 MiB of state).
void optimizer_step(benchmark::State& state) {
  const bool nvme = state.range(0) != 0;
  const std::vector<std::int64_t> sizes = {2048, 2048, 2048, 16};
  WorldOptions world_options;
  world_options.ranks = 1;
  World world(world_options);
  const std::string path = bench_path();
  double step_seconds = 0.0;
  std::size_t swap_bytes = 0;
  const int steps = 3;
  world.run([&](RankContext& context) {
    Mlp model(MlpConfig{sizes});
    EngineOptions options;
    options.stage = 1;
    options.offload_optimizer.device = nvme ? OffloadDevice::kNvme : OffloadDevice::kCpu;
    options.offload_optimizer.nvme_path = path;
    options.offload_optimizer.sub_group_size = 1 << 20;  // 12 MiB of state per sub-group
    options.offload_optimizer.buffer_count = 4;
    options.aio.io.queue_depth = 8;
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    std::vector<float> inputs(16 * sizes.front(), 0.5f);
    std::vector<std::int32_t> targets(16, 1);
    const Batch batch{Tensor{inputs.data(), {16, sizes.front()}, DType::kFloat32},
                      Tensor{targets.data(), {16}, DType::kInt32}};
    for (int step = -1; step < steps; ++step) {  // step -1 warms up
      trainer->forward_backward(batch);
      context.synchronize();
      const auto begin = std::chrono::steady_clock::now();
      trainer->step();
      context.synchronize();
      if (step >= 0) {
        step_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      }
    }
    swap_bytes = trainer->swap_bytes();
  });
  for (auto _ : state) state.SetIterationTime(step_seconds / steps);
  if (nvme) {
    // Every byte of the state is read and written once per step.
    const double moved = 2.0 * static_cast<double>(swap_bytes);
    state.counters["bytes_moved_MiB"] = moved / (1 << 20);
    const double disk = std::min(g_read_ceiling, g_write_ceiling);
    if (disk > 0.0) state.counters["disk_bound_ms"] = 1e3 * moved / disk;
  }
}

BENCHMARK(disk_ceiling)->ArgName("write")->Arg(1)->Arg(0)->UseManualTime()->Iterations(3)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(swap_tier)->ArgNames({"write", "io_uring"})->ArgsProduct({{1, 0}, {1, 0}})
    ->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK(optimizer_step)->ArgName("nvme")->Arg(0)->Arg(1)->UseManualTime()->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zest

BENCHMARK_MAIN();
