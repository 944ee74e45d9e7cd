// zest-train: trains a built-in model from one JSON config.
//
//   zest-train --config FILE [--set dotted.key=value ...] [--metrics FILE] [--resume PATH]
//              [--print-config]
//
// Every rank builds the model, shards it with the ZeRO engine and runs the configured steps on
// its slice of each global batch; rank 0 prints a line per step and, at the end, the peak memory
// per category and rank beside the engine's prediction. Ranks are threads of this process, or
// processes under mpirun / srun with world.backend "mpi" or "auto" (docs/multi_process.md); then
// only rank 0's process prints and writes files. With a `checkpoint` block it saves every
// checkpoint.every_steps steps and at the end, resumes from checkpoint.resume ("auto": the
// directory's latest) or --resume PATH, and on SIGINT / SIGTERM saves after the step in progress
// and exits with status 128 + the signal. Errors print one line,
// "zest-train: error: <message>", and exit 2 for bad input, 1 for failures at run time.
#include <cblas.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "data/synthetic_classification.h"
#include "memory/allocator.h"
#include "memory/category.h"
#include "optim/engine.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "runtime/trace.h"
#include "runtime/world.h"
#include "runtime/world_detection.h"
#include "tools/common/atomic_output_file.h"
#include "tools/common/model_factory.h"
#include "tools/common/train_config.h"
#include "tools/train/checkpointing.h"

namespace {

using Clock = std::chrono::steady_clock;
using ordered_json = nlohmann::ordered_json;

constexpr const char* kProgram = "zest-train";

// A float as the shortest decimal that reads back as the same float (2.3025851, not
// 2.3025851249694824), for the metrics file.
double shortest(float value) {
  if (!std::isfinite(value)) return static_cast<double>(value);  // dumped as null
  return std::stod(fmt::format("{}", value));
}

double milliseconds(Clock::duration duration) {
  return std::chrono::duration<double, std::milli>(duration).count();
}

std::string join_sizes(const std::vector<std::int64_t>& sizes) {
  std::string text = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return text + "]";
}

std::string describe_world(const zest::TrainConfig& config, std::size_t parameter_count) {
  const zest::WorldOptions& world = config.world;
  std::string ranks = fmt::format("{} rank{}", world.ranks, world.ranks == 1 ? "" : "s");
  if (world.backend == "local") ranks += " (local threads)";
  else ranks += " (" + world.backend + ")";
  const std::string device = world.device == zest::DeviceKind::kCpu ? "cpu" : "cuda";
  const std::string memory = world.device_memory == zest::kUnlimitedCapacity
                                 ? "unlimited"
                                 : zest::format_bytes(world.device_memory);
  std::string line = fmt::format(
      "{}: {}, {} ({} per rank), stage {}, {}, {} {} ({} params), {} lr {:.2e}, batch {} = {} "
      "x {} micro-batch{} x {} rank{}, {} steps",
      kProgram, ranks, device, memory, config.engine.stage,
      zest::dtype_name(config.engine.compute_dtype), config.model.type,
      join_sizes(config.model.mlp.sizes), parameter_count, config.optimizer.type,
      config.optimizer.lr, config.train_batch_size, config.micro_batch,
      config.gradient_accumulation_steps, config.gradient_accumulation_steps == 1 ? "" : "es",
      world.ranks, world.ranks == 1 ? "" : "s", config.steps);
  if (config.engine.gradient_clipping > 0) {
    line += fmt::format(", clip {}", config.engine.gradient_clipping);
  }
  return line;
}

void print_memory_table(const std::vector<zest::MemoryUsage>& usage,
                        const std::vector<zest::MemoryPrediction>& predicted) {
  std::string header = fmt::format("{:>4}", "rank");
  for (zest::Category category : zest::all_categories()) {
    header += fmt::format(" {:>11}", zest::category_name(category));
  }
  header += fmt::format(" {:>11} | {:>11} {:>11} {:>11} {:>11}", "total", "params", "grads",
                        "optimizer", "total");
  std::cout << "peak bytes per rank (measured by the allocator | predicted model state)\n"
            << header << '\n';
  for (std::size_t rank = 0; rank < usage.size(); ++rank) {
    std::string line = fmt::format("{:>4}", rank);
    for (zest::Category category : zest::all_categories()) {
      line += fmt::format(" {:>11}", zest::format_bytes(usage[rank].peak_of(category)));
    }
    const zest::MemoryPrediction& p = predicted[rank];
    line += fmt::format(" {:>11} | {:>11} {:>11} {:>11} {:>11}",
                        zest::format_bytes(usage[rank].total_peak), zest::format_bytes(p.params),
                        zest::format_bytes(p.grads), zest::format_bytes(p.optimizer),
                        zest::format_bytes(p.total()));
    std::cout << line << '\n';
  }
  std::cout << std::flush;
}

ordered_json summary_line(const zest::TrainConfig& config, float first_loss, float final_loss,
                          double samples_per_s, const std::vector<zest::MemoryUsage>& usage,
                          const std::vector<zest::MemoryPrediction>& predicted) {
  ordered_json line;
  line["summary"] = {{"steps", config.steps},
                     {"final_loss", shortest(final_loss)},
                     {"first_loss", shortest(first_loss)},
                     {"tokens_or_samples_per_s", samples_per_s}};
  ordered_json peaks = ordered_json::array();
  ordered_json predictions = ordered_json::array();
  for (std::size_t rank = 0; rank < usage.size(); ++rank) {
    ordered_json peak = {{"rank", rank}};
    for (zest::Category category : zest::all_categories()) {
      peak[zest::category_name(category)] = usage[rank].peak_of(category);
    }
    peak["total"] = usage[rank].total_peak;
    peaks.push_back(std::move(peak));
    const zest::MemoryPrediction& p = predicted[rank];
    predictions.push_back({{"rank", rank},
                           {"params", p.params},
                           {"grads", p.grads},
                           {"optimizer", p.optimizer},
                           {"total", p.total()}});
  }
  line["peak_bytes"] = std::move(peaks);
  line["predicted_model_state_bytes"] = std::move(predictions);
  return line;
}

int train_in(const zest::World& world, const zest::TrainConfig& config,
             const std::string& metrics_path);

// One rank's peak bytes and predicted model state, as words an all-gather can move.
constexpr std::size_t kMemoryWords = zest::kCategoryCount + 4;

std::array<std::uint64_t, kMemoryWords> pack_memory(const zest::MemoryUsage& usage,
                                                    const zest::MemoryPrediction& predicted) {
  std::array<std::uint64_t, kMemoryWords> words{};
  for (std::size_t c = 0; c < zest::kCategoryCount; ++c) words[c] = usage.peak[c];
  words[zest::kCategoryCount] = usage.total_peak;
  words[zest::kCategoryCount + 1] = predicted.params;
  words[zest::kCategoryCount + 2] = predicted.grads;
  words[zest::kCategoryCount + 3] = predicted.optimizer;
  return words;
}

void unpack_memory(const std::uint64_t* words, zest::MemoryUsage& usage,
                   zest::MemoryPrediction& predicted) {
  for (std::size_t c = 0; c < zest::kCategoryCount; ++c) usage.peak[c] = words[c];
  usage.total_peak = words[zest::kCategoryCount];
  predicted.params = words[zest::kCategoryCount + 1];
  predicted.grads = words[zest::kCategoryCount + 2];
  predicted.optimizer = words[zest::kCategoryCount + 3];
}

// The timeline of the run: the trace file (log.trace) and, per rank, how much of the
// communication time compute hid (wall_clock_breakdown). With processes, this process's ranks.
void report_timeline(const zest::TraceRecorder& trace, const zest::TrainConfig& config, int ranks) {
  if (!config.trace_path.empty()) {
    trace.write(config.trace_path);
    std::cout << kProgram << ": trace written to " << config.trace_path
              << " (open it in Perfetto or chrome://tracing)" << std::endl;
  }
  const auto overlap = trace.overlap(ranks);
  for (std::size_t rank = 0; rank < overlap.size(); ++rank) {
    if (overlap[rank].compute_ms == 0.0 && overlap[rank].comm_ms == 0.0) continue;
    std::cout << fmt::format("rank {}: compute {:.1f} ms, comm {:.1f} ms, {:.0f}% of comm hidden under compute",
                             rank, overlap[rank].compute_ms, overlap[rank].comm_ms,
                             100.0 * overlap[rank].hidden_fraction)
              << std::endl;
  }
}

int train(const zest::TrainConfig& config, const std::string& metrics_path) {
  zest::WorldOptions world_options = config.world;
  world_options.program = kProgram;
  if (!config.trace_path.empty() || config.wall_clock_breakdown) {
    world_options.trace = std::make_shared<zest::TraceRecorder>();
  }
  const zest::World world(world_options);
  try {
    // Every process must train the same job; checked before anything is trained or written.
    world.verify_same_config(config.json.dump());
    const int status = train_in(world, config, metrics_path);
    if (world_options.trace && world.is_leader_process()) report_timeline(*world_options.trace, config, world.size());
    return status;
  } catch (const std::exception& error) {
    // With several processes the others may be waiting for this one: end the job.
    world.end_job_on_failure(error);
    throw;
  }
}

int train_in(const zest::World& world, const zest::TrainConfig& config,
             const std::string& metrics_path) {
  const bool leader_process = world.is_leader_process();
  if (world.size() > 1) {
    // Note: the ranks are threads of this process, or processes that share this machine's
    // cores, each already running its own GEMMs; OpenBLAS's thread pool on top of that would
    // oversubscribe the cores (ranks × OpenBLAS threads) and make every step slower, so each
    // GEMM stays on its rank's thread. It also makes threads and processes compute alike.
    openblas_set_num_threads(1);
  }
  // Fails on a bad path before any training is done.
  std::optional<zest::AtomicOutputFile> metrics;
  if (leader_process && !metrics_path.empty()) metrics.emplace(metrics_path);

  std::size_t parameter_count = 0;
  {
    // Declaring parameters allocates nothing: the engine owns parameter memory.
    std::unique_ptr<zest::Module> model = zest::make_model(config.model);
    parameter_count = zest::count_parameters(*model);
  }
  if (leader_process) {
    std::cout << describe_world(config, parameter_count) << '\n'
              << kProgram << ": world: " << world.detected().describe() << std::endl;
  }

  const auto ranks = static_cast<std::size_t>(world.size());
  std::vector<zest::MemoryUsage> usage(ranks);
  std::vector<zest::MemoryPrediction> predicted(ranks);
  float first_loss = 0.0f;
  float final_loss = 0.0f;
  double train_seconds = 0.0;
  std::int64_t steps_run = 0;
  std::int64_t last_step = 0;
  std::atomic<bool> stopped{false};  // by a signal, on every rank alike
  const zest::StopSignals signals(!config.checkpoint.dir.empty() &&
                                  config.checkpoint.save_on_exit);

  world.run([&](zest::RankContext& context) {
    const bool leader = context.rank == 0;
    const zest::SyntheticClassification data(
        {config.data.features, config.data.classes, config.engine.seed});
    // This step's micro-batches, kept until step() has synchronized: the engine's streams may
    // still read them after forward_backward() returns. Declared before the trainer so that on
    // an error the trainer's destructor (which waits for the streams) runs before they are freed.
    std::vector<zest::HostBatch> held;
    held.reserve(static_cast<std::size_t>(config.gradient_accumulation_steps));
    std::unique_ptr<zest::Module> model = zest::make_model(config.model);
    zest::Engine engine(context, config.engine);
    std::unique_ptr<zest::Trainer> trainer =
        engine.shard(*model, zest::make_optimizer(config.optimizer));

    zest::TrainCheckpoints checkpoints(config, signals);
    const std::int64_t first_step = checkpoints.resume(context, *trainer);
    const zest::LrSchedule schedule(config.scheduler, config.optimizer.lr);
    const int width = static_cast<int>(std::to_string(config.steps).size());
    const Clock::time_point train_start = Clock::now();
    for (std::int64_t step = first_step; step <= config.steps; ++step) {
      const Clock::time_point step_start = Clock::now();
      for (std::int64_t micro = 0; micro < config.gradient_accumulation_steps; ++micro) {
        held.push_back(data.micro_batch(step, micro, config.gradient_accumulation_steps,
                                        config.train_batch_size, context.rank,
                                        context.world_size));
        trainer->forward_backward(held.back().batch());
      }
      const zest::StepStats stats = trainer->step(schedule.lr_at(step));
      held.clear();
      const double step_ms = milliseconds(Clock::now() - step_start);
      if (leader) {
        if (step == first_step) first_loss = stats.loss;
        final_loss = stats.loss;
        ++steps_run;
        last_step = step;
        if (step == first_step || step == config.steps || step % config.log_interval == 0 ||
            zest::StopSignals::caught() != 0) {
          std::string line =
              fmt::format("step {:>{}}/{}  loss {:.4f}  lr {:.2e}  grad_norm {:.3f}  {:.1f} ms",
                          step, width, config.steps, stats.loss, stats.lr, stats.grad_norm,
                          step_ms);
          if (stats.skipped) {
            line += fmt::format("  skipped (fp16 overflow at scale {})", stats.loss_scale);
          }
          std::cout << line << std::endl;
        }
        if (metrics) {
          ordered_json line = {{"step", step},
                               {"loss", shortest(stats.loss)},
                               {"lr", shortest(stats.lr)},
                               {"grad_norm", shortest(stats.grad_norm)},
                               {"step_ms", std::round(step_ms * 1000.0) / 1000.0}};
          if (config.engine.loss_scale.enabled) {
            line["loss_scale"] = stats.loss_scale;
            line["skipped"] = stats.skipped;
          }
          metrics->stream() << line.dump() << '\n';
        }
      }
      // Every rank: save when due, and stop together when a signal reached any of them.
      if (checkpoints.after_step(context, *trainer, step)) {
        stopped = true;
        break;
      }
    }
    if (leader) train_seconds = std::chrono::duration<double>(Clock::now() - train_start).count();
    context.synchronize();
    // Every rank's peaks reach rank 0 through the communicator: with processes they live in
    // other address spaces. all_gather moves bits, whatever the dtype says.
    const auto mine = pack_memory(context.allocator().usage(), trainer->predicted_memory());
    std::vector<std::uint64_t> all(kMemoryWords * ranks);
    context.communicator.all_gather(context.comm, mine.data(), all.data(), 2 * kMemoryWords,
                                    zest::DType::kInt32);
    context.comm.synchronize();
    if (!leader) return;
    for (std::size_t rank = 0; rank < ranks; ++rank) {
      unpack_memory(all.data() + rank * kMemoryWords, usage[rank], predicted[rank]);
    }
  });
  // A stop by SIGINT / SIGTERM (after the checkpoint was saved) ends with 128 + the signal, as
  // the signal itself would have.
  const int stop_status = stopped ? 128 + zest::StopSignals::caught() : 0;
  if (!leader_process) return stop_status;

  print_memory_table(usage, predicted);
  const double samples = static_cast<double>(steps_run * config.train_batch_size);
  const double samples_per_s = train_seconds > 0 ? samples / train_seconds : 0.0;
  std::cout << fmt::format("{}: {} steps, loss {:.4f} -> {:.4f}, {:.0f} samples/s", kProgram,
                           steps_run, first_loss, final_loss, samples_per_s)
            << std::endl;
  if (metrics) {
    metrics->stream() << summary_line(config, first_loss, final_loss, samples_per_s, usage,
                                      predicted)
                             .dump()
                      << '\n';
    metrics->commit();
  }
  if (stopped) {
    std::cout << fmt::format("{}: stopped by signal {} after step {}", kProgram,
                             zest::StopSignals::caught(), last_step)
              << std::endl;
  }
  return stop_status;
}

// With ranks that are processes the launcher decides the world size: it becomes world.ranks
// before validation, so that the batch sizes are derived from it. A world.ranks that disagrees
// with the launcher is a config error here.
std::vector<std::string> with_launcher_world_size(const std::string& config_path,
                                                  std::vector<std::string> overrides) {
  nlohmann::json raw = zest::read_json_file(config_path);
  for (const std::string& assignment : overrides) zest::apply_override(raw, assignment);
  std::string backend = "local";
  std::int64_t ranks = 1;
  if (const auto world = raw.find("world"); world != raw.end() && world->is_object()) {
    if (const auto it = world->find("backend"); it != world->end() && it->is_string()) {
      backend = it->get<std::string>();
    }
    if (const auto it = world->find("ranks"); it != world->end() && it->is_number_integer()) {
      ranks = it->get<std::int64_t>();
    }
  }
  // Anything else, or a value out of range, is left to the validation, which names it.
  if ((backend != "mpi" && backend != "auto") || ranks < 1 || ranks > 65536) return overrides;
  const zest::DetectedWorld detected = zest::detect_world(backend, static_cast<int>(ranks));
  if (detected.processes && detected.size != ranks) {
    overrides.push_back("world.ranks=" + std::to_string(detected.size));
  }
  return overrides;
}

// One line, whatever the message holds.
int fail(std::string message, int status) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::cerr << kProgram << ": error: " << message << std::endl;
  return status;
}

int run(int argc, char** argv) {
  CLI::App app{"Trains a built-in model with the ZeRO engine from one JSON config.", kProgram};
  std::string config_path;
  std::vector<std::string> overrides;
  std::string metrics_path;
  std::string resume_path;
  bool print_config = false;
  app.add_option("--config", config_path, "JSON config file (see configs/default.json)")
      ->required();
  app.add_option("--set", overrides,
                 "override a config key before validation: dotted.key=value (repeatable)");
  app.add_option("--metrics", metrics_path,
                 "write one JSON line per step and a summary line to FILE");
  app.add_option("--resume", resume_path,
                 "resume from this checkpoint (a step directory, or a root with `latest`); the "
                 "same as --set checkpoint.resume=PATH");
  app.add_flag("--print-config", print_config,
               "print the resolved config (overrides and defaults applied) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(error);
    return fail(std::string(error.what()) + " (see --help)", 2);
  }

  if (!resume_path.empty()) {
    // Quoted, so that the override reads it as a string whatever it looks like.
    overrides.push_back("checkpoint.resume=" + nlohmann::json(resume_path).dump());
  }
  const zest::TrainConfig config =
      zest::load_train_config(config_path, with_launcher_world_size(config_path, overrides));
  if (print_config) {
    std::cout << config.json.dump(2) << std::endl;
    return 0;
  }
  return train(config, metrics_path);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const zest::Error& error) {
    return fail(error.what(), zest::is_input_error(error.kind()) ? 2 : 1);
  } catch (const std::exception& error) {
    return fail(error.what(), 1);
  } catch (...) {
    return fail("unknown failure", 1);
  }
}
