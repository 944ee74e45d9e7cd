// The pipeline bubble, measured: for each schedule (GPipe, 1F1B, interleaved 1F1B with 2 chunks
// per stage, ZB-H1), p = 2 and 4 pipeline stages and m = 4, 8 and 16 micro-batches, trains an MLP
// of equal layers on the `local` backend (one data-parallel rank per pipeline stage) with a
// trace, and prints one markdown row: the idle fraction of the last step measured from the
// trace (pipeline/measured_bubble.h) by wall time and by the compute threads' CPU time, beside
// simulate_schedule's prediction from the same trace's mean forward / backward / weight CPU
// times, its prediction with unit costs, and the closed formula. No Google Benchmark: a table
// for benchmarks/RESULTS.md.
//
// Note: ranks are threads. With more pipeline stages than the process has cores, a rank's
// action also holds the wall clock while the rank waits for a core (or at the matrix product
// gate, kernels/matmul.h), so wall time counts that as busy and CPU time counts it as idle; the
// simulation from CPU times is what the schedule does on p cores. The header says the cores.
//
//   pipeline_bubble_bench [--stages 2,4] [--micro-batches 4,8,16]
//                         [--schedules gpipe,1f1b,interleaved_1f1b,zb_h1] [--width 512]
//                         [--layers 8] [--rows 128] [--steps 3]
#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "models/mlp.h"
#include "pipeline/measured_bubble.h"
#include "pipeline/pipeline_trainer.h"
#include "pipeline/schedule_generators.h"
#include "pipeline/schedule_simulator.h"
#include "runtime/world.h"

namespace zest {
namespace {

struct Options {
  std::vector<int> stages = {2, 4};
  std::vector<int> micro_batches = {4, 8, 16};
  std::vector<ScheduleKind> schedules = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                                         ScheduleKind::kInterleavedOneFOneB,
                                         ScheduleKind::kZeroBubbleH1};
  int width = 512;  // every layer width x width: equal stages at p = 2 and 4, v = 1 and 2
  int layers = 8;
  int rows = 128;   // per micro-batch: an action costs the same at every m, a few ms
  int steps = 3;    // the last one is measured
};

[[noreturn]] void usage(const std::string& message) {
  throw Error(ErrorKind::kUsage, message);
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma - start));
    if (comma == std::string::npos) return parts;
    start = comma + 1;
  }
}

int positive(const std::string& text, const std::string& flag) {
  std::size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < 1) {
    usage(flag + ": needs integers >= 1, got \"" + text + "\"");
  }
  return value;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + ": needs a value (see the comment on top of the source)");
    const std::string value = argv[++i];
    std::vector<int> numbers;
    if (flag != "--schedules") {
      for (const std::string& part : split(value)) numbers.push_back(positive(part, flag));
    }
    if (flag == "--stages") {
      options.stages = numbers;
    } else if (flag == "--micro-batches") {
      options.micro_batches = numbers;
    } else if (flag == "--schedules") {
      options.schedules.clear();
      for (const std::string& name : split(value)) {
        options.schedules.push_back(parse_schedule_kind(name));
      }
    } else if (flag == "--width" || flag == "--layers" || flag == "--rows" || flag == "--steps") {
      if (numbers.size() != 1) usage(flag + ": takes one integer, got \"" + value + "\"");
      int& field = flag == "--width"    ? options.width
                   : flag == "--layers" ? options.layers
                   : flag == "--rows"   ? options.rows
                                        : options.steps;
      field = numbers.front();
    } else {
      usage("unknown flag " + flag + " (see the comment on top of the source)");
    }
  }
  return options;
}

int process_cores() {
  cpu_set_t cores;
  if (sched_getaffinity(0, sizeof(cores), &cores) == 0) return CPU_COUNT(&cores);
  return static_cast<int>(std::thread::hardware_concurrency());
}

std::string processor() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown";
}

struct Row {
  MeasuredBubble measured;
  double step_ms = 0.0;  // the last step, on rank 0
};

// One run: `steps` steps of `kind` on p ranks, traced.
Row run(const Options& options, ScheduleKind kind, int p, int m) {
  const std::int64_t width = options.width;
  const std::int64_t rows = std::int64_t{options.rows} * m;
  std::vector<float> features(static_cast<std::size_t>(rows * width));
  std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : features) x = normal(rng);
  for (auto& y : targets) y = static_cast<std::int32_t>(rng() % static_cast<unsigned>(width));
  const Batch batch{Tensor{features.data(), {rows, width}, DType::kFloat32},
                    Tensor{targets.data(), {rows}, DType::kInt32}};
  const std::vector<std::int64_t> sizes(static_cast<std::size_t>(options.layers) + 1, width);

  auto trace = std::make_shared<TraceRecorder>();
  WorldOptions world;
  world.ranks = p;
  world.trace = trace;
  Row row;
  World(world).run([&](RankContext& context) {
    EngineOptions engine;
    engine.stage = 0;
    PipelineOptions pipeline;
    pipeline.stages = p;
    pipeline.micro_batches = m;
    pipeline.schedule = kind;
    pipeline.virtual_chunks = kind == ScheduleKind::kInterleavedOneFOneB ? 2 : 1;
    OptimizerOptions optimizer;
    optimizer.type = "SGD";
    optimizer.lr = 1e-3f;
    PipelineTrainer trainer(context, engine, pipeline,
                            [&] { return std::make_unique<Mlp>(MlpConfig{sizes}); }, optimizer);
    for (int s = 0; s < options.steps; ++s) {
      const auto begin = std::chrono::steady_clock::now();
      trainer.forward_backward(batch);
      trainer.step();
      const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - begin;
      if (context.rank == 0) row.step_ms = took.count();
    }
  });
  row.measured = measure_last_step_bubble(trace->slices(), options.steps);
  return row;
}

std::string fraction(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", value);
  return value < 0 ? "n/a" : text;
}

void print_table(const Options& options) {
  const int cores = process_cores();
  std::printf("Processor: %s; this process may use %d core(s) (sched_getaffinity).\n",
              processor().c_str(), cores);
  std::printf("Model: MLP of %d layers %d x %d, %d rows per micro-batch, fp32, ZeRO stage 0, one "
              "data-parallel rank per pipeline stage (ranks are threads of the `local` backend; "
              "each rank runs a host thread and compute, comm, prefetch and two send streams). "
              "Step %d of %d measured.\n",
              options.layers, options.width, options.width, options.rows, options.steps,
              options.steps);
  std::printf("Idle fraction = idle / (p x the step's span). measured: from the trace's action "
              "slices, busy by wall time and by the compute thread's CPU time; simulated: "
              "simulate_schedule with the trace's mean F / B / W CPU times, and with F = B = W "
              "= 1; closed: the formula's bubble b as b / (1 + b).\n\n");
  std::printf("| schedule | p | m | measured (wall) | measured (CPU) | simulated (trace's F/B/W) "
              "| simulated (unit) | closed formula | F / B / W ms (CPU) | step ms |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n");
  for (ScheduleKind kind : options.schedules) {
    const int chunks = kind == ScheduleKind::kInterleavedOneFOneB ? 2 : 1;
    for (int p : options.stages) {
      for (int m : options.micro_batches) {
        if (options.layers < p * chunks ||
            (kind == ScheduleKind::kInterleavedOneFOneB && m % p != 0)) {
          // A shape the pipeline refuses (pipeline_options.h): said in the table, not run.
          std::printf("| %s | %d | %d | not run: %s |\n", std::string(schedule_kind_name(kind)).c_str(),
                      p, m, options.layers < p * chunks ? "fewer layers than virtual stages"
                                                        : "m is not a multiple of p");
          continue;
        }
        const Row row = run(options, kind, p, m);
        const MeasuredBubble& bubble = row.measured;
        const Schedule schedule = make_schedule(kind, p, m, chunks);
        const bool cpu = bubble.cpu_idle_fraction >= 0;
        const ScheduleCosts& costs = cpu ? bubble.mean_cpu_us : bubble.mean_wall_us;
        const double from_trace = simulate_schedule(schedule, costs).idle_fraction;
        const double unit = simulate_schedule(schedule).idle_fraction;
        const double closed_ratio = closed_form_bubble_ratio(kind, p, m, chunks);
        std::printf("| %s%s | %d | %d | %s | %s | %s | %s | %s | %.2f / %.2f / %.2f | %.1f |\n",
                    std::string(schedule_kind_name(kind)).c_str(), chunks > 1 ? " (v = 2)" : "",
                    p, m, fraction(bubble.idle_fraction).c_str(),
                    fraction(bubble.cpu_idle_fraction).c_str(), fraction(from_trace).c_str(),
                    fraction(unit).c_str(), fraction(closed_ratio / (1 + closed_ratio)).c_str(),
                    costs.forward / 1000, costs.backward_input / 1000,
                    costs.backward_weight / 1000, row.step_ms);
        std::fflush(stdout);
      }
    }
  }
  if (*std::max_element(options.stages.begin(), options.stages.end()) > cores) {
    std::printf("\np > %d cores: those rows' wall-time measurement counts waiting for a core as "
                "busy; their CPU-time measurement counts it as idle.\n", cores);
  }
}

}  // namespace
}  // namespace zest

int main(int argc, char** argv) {
  try {
    const zest::Options options = zest::parse(argc, argv);
    // Note: as zest-train with several ranks: each rank's products on its own thread, not
    // OpenBLAS's pool on top of the rank threads.
    openblas_set_num_threads(1);
    zest::print_table(options);
  } catch (const zest::Error& error) {
    std::fprintf(stderr, "pipeline_bubble_bench: error: %s\n", error.what());
    return zest::is_input_error(error.kind()) ? 2 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pipeline_bubble_bench: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
