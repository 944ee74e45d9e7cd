// GPT training throughput on one GPU through the engine (world.device cuda, one rank), bf16
// (fp32 master weights, AdamW), ZeRO stage 0 and 3, beside the ceiling measured in the same run:
// a bf16 cuBLASLt GEMM (kernels/matmul_cuda.h) on a large square problem.
//
//   step_ms          median wall time of forward_backward + step, all streams synchronized
//   forward_backward_ms  median time until forward_backward returns (its loss read waits for
//                    the compute stream): the step less its last reductions and the optimizer
//   tokens_per_s     B·T / step_ms
//   model_TFLOPs     (6·N·B·T + 12·L·C·T·B·T) / step time: N the parameters less wpe (no product
//                    uses it; the tied head's product is counted through wte), the second term
//                    the attention's QKᵀ and PV over the full T×T, as executed, forward and
//                    backward (PaLM's accounting)
//   mfu              model_TFLOPs / gemm_TFLOPs, the bf16 GEMM rate measured in this run
//   peak_*_MiB       the allocator's peak per category (memory/category.h) and in total;
//                    device_used_MiB is what cudaMemGetInfo says the process holds (the CUDA
//                    context, cuBLASLt workspaces and the pool's kept memory included)
//
// Models: GPT-2 small (12L 12H 768C, vocab 50257, seq 1024), batch 8; and a smaller one (6L 6H
// 384C, seq 512, batch 8) for when time or memory demand it. One micro-batch a step, no
// gradient clipping, lr 1e-4, weight decay 0.1; random tokens (the loss stays near ln 50257).
// 3 untimed steps first (allocation, cuBLASLt's heuristics), then 10 timed.
//
// BM_GptOffload/<model>/stage:3 (issue 13's offload row): the same step with the optimizer
// offloaded (zero_optimization.offload_optimizer "cpu": fp32 master and moments in page-locked
// host memory, AdamW on the host) on a GPU capped (world.device_memory) halfway between the
// stage-3 row's measured peak and that peak less its optimizer state: the state does not fit
// there without offload. It reports the cap, the device and host peaks, and the step time
// against the stage-3 row's (offload_slowdown).
//
// A World that refuses world.device cuda (no GPU visible) is one line and exit status 2.
// --zest_backend=NAME picks world.backend (default nccl).
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/cublas_check.h"
#include "base/cuda_check.h"
#include "base/dtype.h"
#include "benchmarks/cuda_bench_timing.h"
#include "kernels/matmul_cuda.h"
#include "memory/category.h"
#include "memory/cuda_pool_allocator.h"
#include "models/gpt.h"
#include "engine/engine.h"
#include "engine/stage_plan.h"
#include "runtime/world.h"

namespace zest {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWarmupSteps = 3;
constexpr int kTimedSteps = 10;
constexpr std::int64_t kGemmSize = 8192;  // m = n = k: 1.1 TFLOP a product
constexpr int kGemmLaunches = 30;

struct BenchModel {
  const char* name;
  GptConfig config;
  std::int64_t batch;  // rows of seq_len tokens a step
};

const BenchModel kModels[] = {
    {"gpt2-small", GptConfig{12, 12, 768, 50257, 1024}, 8},
    {"gpt2-6L", GptConfig{6, 6, 384, 50257, 512}, 8},
};

World* world = nullptr;             // main's, made before any benchmark is registered
std::optional<std::string> failure;  // the first row's error, for the exit status
double gemm_flops_per_second = 0.0;  // the best median of BM_Bf16GemmCeiling in this run

// The stage-3 row of each model, for its offload row: measured peak, optimizer peak, step time.
struct Stage3Row {
  std::size_t peak = 0;
  std::size_t optimizer = 0;
  double step_seconds = 0.0;
};
std::map<std::string, Stage3Row> stage3_rows;

// Random bf16 in [-1, 1): the GEMM rate on zeros is higher than on data.
std::vector<std::uint16_t> random_bfloat16(std::size_t count, std::uint32_t seed) {
  std::vector<std::uint16_t> bits(count);
  std::minstd_rand rng(seed);
  for (auto& b : bits) {
    const float value = static_cast<float>(rng()) / 1073741824.0f - 1.0f;  // rng() < 2^31
    b = BFloat16(value).bits;
  }
  return bits;
}

class LtHandle {
 public:
  LtHandle() { ZEST_CUBLAS_CHECK(cublasLtCreate(&handle_)); }
  ~LtHandle() { cublasLtDestroy(handle_); }
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

// The ceiling: D = A·Bᵀ, bf16 in and out with fp32 accumulation, n x n x n, through zest's
// cuBLASLt matmul. Runs on the main thread with GPU 0 selected.
void BM_Bf16GemmCeiling(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  try {
    cuda::CudaPoolAllocator pool("cuda:0", 0);
    const auto elements = static_cast<std::size_t>(n * n);
    const std::size_t bytes = elements * sizeof(std::uint16_t);
    Buffer a = pool.allocate(bytes, Category::kWorkspace);
    Buffer b = pool.allocate(bytes, Category::kWorkspace);
    Buffer d = pool.allocate(bytes, Category::kWorkspace);
    Buffer workspace = pool.allocate(cuda::kMatmulWorkspaceBytes, Category::kWorkspace);
    ZEST_CUDA_CHECK(cudaMemcpy(a.data(), random_bfloat16(elements, 1).data(), bytes,
                               cudaMemcpyHostToDevice));
    ZEST_CUDA_CHECK(cudaMemcpy(b.data(), random_bfloat16(elements, 2).data(), bytes,
                               cudaMemcpyHostToDevice));
    LtHandle handle;
    const cuda::MatmulContext context{handle.get(), workspace.data(), workspace.bytes()};
    cuda::MatmulArgs args;
    args.trans_b = true;
    args.m = n;
    args.n = n;
    args.k = n;
    args.a = a.data();
    args.b = b.data();
    args.input_type = DType::kBFloat16;
    args.d = d.data();
    args.output_type = DType::kBFloat16;
    bench::EventTimer timer;
    const auto launch = [&](cudaStream_t stream) { cuda::matmul(args, context, stream); };
    for (int i = 0; i < 3; ++i) launch(timer.stream());
    timer.synchronize();
    std::vector<double> seconds;
    for (auto _ : state) {
      const double elapsed = timer.seconds(launch);
      state.SetIterationTime(elapsed);
      seconds.push_back(elapsed);
    }
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * n;
    const double rate = flops / bench::median(std::move(seconds));
    gemm_flops_per_second = std::max(gemm_flops_per_second, rate);
    state.counters["gemm_TFLOPs"] = rate / 1e12;
    state.SetLabel("bf16 in/out, fp32 accumulate, random data");
  } catch (const std::exception& error) {
    if (!failure) failure = error.what();
    state.SkipWithError(error.what());
  }
}

// FLOPs of one training step (see the top of the file).
double step_flops(const Gpt& model, std::int64_t batch) {
  const GptConfig& c = model.config();
  const double tokens = static_cast<double>(batch) * c.seq_len;
  const double matrix_params =
      static_cast<double>(model.parameter_count()) - static_cast<double>(c.seq_len) * c.n_embd;
  const double attention =
      12.0 * c.n_layer * static_cast<double>(c.n_embd) * static_cast<double>(c.seq_len);
  return (6.0 * matrix_params + attention) * tokens;
}

struct StepResult {
  std::vector<double> seconds;
  // Up to the loss read (the compute stream done with forward and backward; reductions may still
  // run on comm): where the step's time goes, compute against the reductions and the optimizer.
  std::vector<double> forward_backward_seconds;
  float loss = 0.0f;
  MemoryUsage usage;
  MemoryUsage host_usage;
  std::size_t device_used = 0;
};

void run_gpt_step(benchmark::State& state, const BenchModel* bench_model, bool offload);

void BM_GptStep(benchmark::State& state, const BenchModel* bench_model) {
  run_gpt_step(state, bench_model, false);
}

void BM_GptOffload(benchmark::State& state, const BenchModel* bench_model) {
  run_gpt_step(state, bench_model, true);
}

void run_gpt_step(benchmark::State& state, const BenchModel* bench_model, bool offload) {
  const int stage = static_cast<int>(state.range(0));
  const GptConfig& config = bench_model->config;
  const std::int64_t batch_rows = bench_model->batch;
  const std::int64_t T = config.seq_len;
  // Random tokens, targets the next token of the same stream: host memory, which the engine
  // copies to the device, as zest-train's batches.
  std::vector<std::int32_t> stream(static_cast<std::size_t>(batch_rows * T + 1));
  std::mt19937 rng(1);
  std::uniform_int_distribution<std::int32_t> token(0, config.vocab_size - 1);
  for (auto& t : stream) t = token(rng);
  std::vector<std::int32_t> inputs(stream.begin(), stream.end() - 1);
  std::vector<std::int32_t> targets(stream.begin() + 1, stream.end());
  const Batch batch{Tensor{inputs.data(), {batch_rows, T}, DType::kInt32},
                    Tensor{targets.data(), {batch_rows, T}, DType::kInt32}};

  StepResult result;
  std::unique_ptr<World> capped;
  World* used = world;
  std::size_t capacity = 0;
  if (offload) {
    const auto row = stage3_rows.find(bench_model->name);
    if (row == stage3_rows.end() || row->second.optimizer == 0) {
      state.SkipWithError("needs the model's stage-3 row first (its peak sets the cap)");
      return;
    }
    capacity = row->second.peak - row->second.optimizer / 2;
    WorldOptions options = world->options();
    options.device_memory = capacity;
    capped = std::make_unique<World>(options);
    used = capped.get();
  }
  try {
    // Note: the benchmark loop runs on the rank's thread (its GPU selected there); the model,
    // engine and trainer are built once, outside the timed steps, and live inside World::run.
    used->run([&](RankContext& context) {
      Gpt model(config);
      EngineOptions options;
      options.stage = stage;
      options.compute_dtype = DType::kBFloat16;
      options.communication_dtype = DType::kBFloat16;
      if (offload) options.offload_optimizer.device = OffloadDevice::kCpu;
      Engine engine(context, options);
      OptimizerOptions optimizer;
      optimizer.lr = 1e-4f;
      optimizer.weight_decay = 0.1f;
      auto trainer = engine.shard(model, make_optimizer(optimizer));
      for (int i = 0; i < kWarmupSteps; ++i) {
        trainer->forward_backward(batch);
        trainer->step();
      }
      for (auto _ : state) {
        const auto start = Clock::now();
        result.loss = trainer->forward_backward(batch);
        result.forward_backward_seconds.push_back(
            std::chrono::duration<double>(Clock::now() - start).count());
        trainer->step();
        context.synchronize();  // step() synchronizes already; this makes sure of all streams
        const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        state.SetIterationTime(elapsed);
        result.seconds.push_back(elapsed);
      }
      context.synchronize();
      result.usage = context.allocator().usage();
      result.host_usage = context.device.host_allocator().usage();
      std::size_t free_bytes = 0;
      std::size_t total_bytes = 0;
      ZEST_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      result.device_used = total_bytes - free_bytes;
    });
  } catch (const std::exception& error) {
    if (!failure) failure = error.what();
    state.SkipWithError(error.what());
    return;
  }

  const Gpt model(config);
  const double step_seconds = bench::median(result.seconds);
  const double model_flops = step_flops(model, batch_rows) / step_seconds;
  constexpr double kMiB = 1 << 20;
  state.counters["step_ms"] = step_seconds * 1e3;
  state.counters["forward_backward_ms"] = bench::median(result.forward_backward_seconds) * 1e3;
  state.counters["tokens_per_s"] = static_cast<double>(batch_rows * T) / step_seconds;
  state.counters["model_TFLOPs"] = model_flops / 1e12;
  state.counters["step_TFLOP"] = step_flops(model, batch_rows) / 1e12;
  if (gemm_flops_per_second > 0.0) {
    state.counters["gemm_TFLOPs"] = gemm_flops_per_second / 1e12;
    state.counters["mfu"] = model_flops / gemm_flops_per_second;
  }
  state.counters["loss"] = result.loss;
  state.counters["parameters"] = static_cast<double>(model.parameter_count());
  for (Category category : all_categories()) {
    state.counters[std::string("peak_") + category_name(category) + "_MiB"] =
        static_cast<double>(result.usage.peak_of(category)) / kMiB;
  }
  state.counters["peak_total_MiB"] = static_cast<double>(result.usage.total_peak) / kMiB;
  state.counters["device_used_MiB"] = static_cast<double>(result.device_used) / kMiB;
  state.counters["host_offload_MiB"] =
      static_cast<double>(result.host_usage.peak_of(Category::kOffload)) / kMiB;
  if (!offload && stage == StagePlan::kFullySharded) {
    stage3_rows[bench_model->name] = {result.usage.total_peak,
                                      result.usage.peak_of(Category::kOptimizer), step_seconds};
  }
  std::string label = model.describe() + ", batch " + std::to_string(batch_rows) + ", bf16";
  if (offload) {
    const Stage3Row& row = stage3_rows.at(bench_model->name);
    state.counters["device_cap_MiB"] = static_cast<double>(capacity) / kMiB;
    state.counters["stage3_peak_MiB"] = static_cast<double>(row.peak) / kMiB;
    state.counters["offload_slowdown"] = step_seconds / row.step_seconds;
    label += ", optimizer offloaded, GPU capped below the stage-3 peak";
  }
  state.SetLabel(label);
}

// The ceiling runs first so that every model row can report its share of it.
void register_benchmarks() {
  benchmark::RegisterBenchmark("BM_Bf16GemmCeiling", BM_Bf16GemmCeiling)
      ->ArgName("n")
      ->Arg(kGemmSize)
      ->Iterations(kGemmLaunches)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  for (const BenchModel& model : kModels) {
    benchmark::RegisterBenchmark((std::string("BM_GptStep/") + model.name).c_str(), BM_GptStep,
                                 &model)
        ->ArgName("stage")
        ->Arg(0)
        ->Arg(3)
        ->Iterations(kTimedSteps)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  // After every model's stage-3 row: the offload rows take their cap from it.
  for (const BenchModel& model : kModels) {
    benchmark::RegisterBenchmark((std::string("BM_GptOffload/") + model.name).c_str(),
                                 BM_GptOffload, &model)
        ->ArgName("stage")
        ->Arg(3)
        ->Iterations(kTimedSteps)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// Takes --zest_backend=NAME out of argv (Google Benchmark has removed its own flags by then).
std::string take_backend_flag(int& argc, char** argv) {
  constexpr const char* kFlag = "--zest_backend=";
  std::string backend = "nccl";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], kFlag, std::strlen(kFlag)) == 0) {
      backend = argv[i] + std::strlen(kFlag);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return backend;
}

}  // namespace
}  // namespace zest

int main(int argc, char** argv) {
  const bool listing = zest::bench::listing_only(argc, argv);
  benchmark::Initialize(&argc, argv);
  const std::string backend = zest::take_backend_flag(argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::unique_ptr<zest::World> world;
  if (listing) {
    zest::register_benchmarks();
    benchmark::RunSpecifiedBenchmarks();
    return 0;
  }
  try {
    zest::WorldOptions options;
    options.ranks = 1;
    options.backend = backend;
    options.device = zest::DeviceKind::kCuda;
    options.program = "gpt_cuda_bench";
    world = std::make_unique<zest::World>(options);  // refuses cuda until the engine runs there
    zest::bench::select_gpu_and_describe();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gpt_cuda_bench: error: %s\n", error.what());
    return zest::bench::exit_status(error);
  }
  zest::world = world.get();
  zest::register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (zest::failure) {
    std::fprintf(stderr, "gpt_cuda_bench: error: %s\n", zest::failure->c_str());
    return 1;
  }
  return 0;
}
