#include "tools/train/training_run.h"

#include <cblas.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "base/file_checks.h"
#include "data/batch_source.h"
#include "kernels/kernel_threads.h"
#include "engine/engine.h"
#include "optim/lr_schedule.h"
#include "checkpoint/parameter_import.h"
#include "runtime/host_collectives.h"
#include "runtime/world.h"
#include "tools/common/batch_source_factory.h"
#include "tools/common/memory_estimate.h"
#include "models/registry.h"
#include "tools/common/host_limits.h"
#include "tools/common/html_page.h"
#include "tools/common/metrics_file.h"
#include "tools/common/model_size.h"
#include "tools/common/run_report_page.h"
#include "tools/train/checkpointing.h"
#include "tools/train/console.h"
#include "tools/train/csv_monitor.h"
#include "tools/train/metrics_log.h"
#include "tools/train/parameter_export.h"
#include "tools/train/progress.h"
#include "tools/train/rank_trainer.h"
#include "tools/train/run_report.h"

namespace zest {

namespace {

// The planner's prediction for this run (what zest-estimate prints), or nothing for a run it
// cannot plan: a report must never fail a run that has finished.
std::optional<PeakPrediction> plan_peaks(const TrainConfig& config,
                                        std::shared_ptr<Module> declared) {
  try {
    return predict_peak(job_from_config(config, std::move(declared)).input);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

using Clock = std::chrono::steady_clock;
using ordered_json = nlohmann::ordered_json;

double milliseconds(Clock::duration duration) {
  return std::chrono::duration<double, std::milli>(duration).count();
}

// What the ranks share, and what rank 0 hands back to the process when they are done.
struct RunState {
  const TrainConfig& config;
  const BatchSource& batches;
  std::optional<MetricsLog>& metrics;  // rank 0 of the leader process only
  std::optional<CsvMonitor>& csv;      // the same, with csv_monitor.enabled
  const RunOptions& options;
  RunSummary summary;
  std::vector<MemoryUsage> usage;
  std::vector<MemoryPrediction> predicted;
  std::vector<std::size_t> host_params;  // per rank: offload_param's shards in the host arena
  std::atomic<bool> stopped{false};
  // What the metrics log gets, kept for --report when the log cannot be read back (no --metrics,
  // or a pipe); rank 0 only.
  RunRecords records;
  std::int64_t first_step = 1;
  std::int64_t last_step = 0;  // 0 until a step has run
};

// The held-out loss: the mean over data.val_batches batches of micro-batch × ranks rows each;
// nothing when a signal stopped it (the ranks agree on that before each batch, as after a step).
std::optional<float> evaluate(RankContext& context, Trainer& trainer, const RunState& run,
                              const TrainCheckpoints& checkpoints) {
  const TrainConfig& config = run.config;
  // A batch is micro-batch × (world.ranks / tensor_parallel.size) rows at every pipeline mesh;
  // with pipeline stages each data-parallel index runs its share as one micro-batch through them.
  BatchSlice slice;
  slice.global_rows = config.micro_batch * config.world.ranks / config.tensor_parallel.size;
  slice.rank = data_parallel_index(context, config);
  slice.world_size = data_parallel_size(config);
  double sum = 0.0;
  for (std::int64_t index = 0; index < config.data.val_batches; ++index) {
    if (checkpoints.stop_requested(context)) return std::nullopt;
    const HostBatch batch = run.batches.validation(index, slice);
    sum += trainer.evaluate(batch.batch());
  }
  return static_cast<float>(sum / static_cast<double>(config.data.val_batches));
}

// Starts from model.init_from unless a checkpoint was resumed; returns the first step to run.
std::int64_t start(RankContext& context, Trainer& trainer, TrainCheckpoints& checkpoints,
                   const TrainConfig& config) {
  const std::int64_t first_step = checkpoints.resume(context, trainer);
  if (config.model.init_from.empty()) return first_step;
  if (first_step > 1) {
    if (context.rank == 0) {
      Console::say("zest-train: model.init_from is not used: the run resumed from a checkpoint");
    }
    return first_step;
  }
  const ImportResult imported = import_parameters(context, trainer, config.model.init_from);
  if (context.rank == 0) {
    Console::say(fmt::format("zest-train: initialized {} parameters ({} tensors) from {}",
                             imported.parameters, imported.tensors, config.model.init_from));
  }
  return first_step;
}

ordered_json step_record(const TrainConfig& config, const StepStats& stats, double step_ms,
                         double tokens_per_s, std::int64_t tokens_per_step) {
  ordered_json line = {{"step", stats.step},
                       {"loss", shortest_json(stats.loss)},
                       {"lr", shortest_json(stats.lr)},
                       {"grad_norm", shortest_json(stats.grad_norm)},
                       {"step_ms", std::round(step_ms * 1000.0) / 1000.0},
                       {"tokens_per_s", std::round(tokens_per_s * 10.0) / 10.0},
                       {"tokens", stats.step * tokens_per_step}};
  if (config.engine.loss_scale.enabled) {
    line["loss_scale"] = stats.loss_scale;
    line["skipped"] = stats.skipped;
  }
  return line;
}

// What rank 0 put on the wire in a step, in bytes: the totals inside its node and across nodes,
// each collective kind's [inside, across], and each mesh axis's (runtime/link_model.h); kinds and
// axes that sent nothing are left out.
void add_wire_bytes(ordered_json& line, const WireBytes& step) {
  const auto whole = [](double bytes) { return static_cast<std::int64_t>(std::llround(bytes)); };
  line["intra_node_bytes"] = whole(step.intra_total());
  line["inter_node_bytes"] = whole(step.inter_total());
  ordered_json kinds = ordered_json::object();
  for (int k = 0; k < kWireKinds; ++k) {
    if (step.intra_node[k] == 0.0 && step.inter_node[k] == 0.0) continue;
    kinds[wire_kind_name(static_cast<WireKind>(k))] = {whole(step.intra_node[k]),
                                                       whole(step.inter_node[k])};
  }
  line["wire_bytes"] = std::move(kinds);
  ordered_json axes = ordered_json::object();
  for (int a = 0; a < kWireAxes; ++a) {
    if (step.by_axis[a] == 0.0) continue;
    axes[wire_axis_name(static_cast<WireAxis>(a))] = whole(step.by_axis[a]);
  }
  line["axis_bytes"] = std::move(axes);
}

// A record of the run (rank 0): to the metrics log, and to the records a report is drawn from.
void record(RunState& run, MetricsLog* metrics, const ordered_json& line) {
  if (metrics != nullptr) metrics->append(line);
  if (!run.options.report_path.empty()) {
    run.records.add(nlohmann::json::parse(line.dump()), "zest-train");
  }
}

// One rank's whole run.
void train_rank(RankContext& context, RunState& run) {
  const TrainConfig& config = run.config;
  const bool leader = context.rank == 0;
  // This step's micro-batches, kept until step() has synchronized: the engine's streams may
  // still read them after forward_backward() returns. Declared before the trainer so that on
  // an error the trainer's destructor (which waits for the streams) runs before they are freed.
  std::vector<HostBatch> held;
  RankTrainer built = make_rank_trainer(context, config);
  Trainer* trainer = built.trainer.get();
  const bool pipelined = config.pipeline.enabled();

  TrainCheckpoints checkpoints(config);
  const std::int64_t first_step = start(context, *trainer, checkpoints, config);
  if (!run.options.export_initial.empty()) {
    export_parameters(context, *trainer, run.options.export_initial,
                      built.tensor_groups.tensor.get());
    return;
  }
  if (leader) run.first_step = first_step;
  // A signal while the job started up (resuming can take minutes) stops it here: nothing has
  // been trained, so nothing is saved or written.
  if (checkpoints.stop_requested(context)) {
    run.stopped = true;
    return;
  }
  MetricsLog* metrics = leader && run.metrics ? &*run.metrics : nullptr;
  CsvMonitor* csv = leader && run.csv ? &*run.csv : nullptr;
  if (metrics != nullptr) metrics->open(first_step);
  if (csv != nullptr) csv->open(first_step);
  // A checkpoint is only as far on as the logs: after a power loss the logs on disk must still
  // hold every step the newest checkpoint holds.
  checkpoints.before_save([metrics, csv] {
    if (metrics != nullptr) metrics->sync();
    if (csv != nullptr) csv->sync();
  });
  const LrSchedule schedule(config.scheduler, config.optimizer.lr);
  const std::int64_t tokens_per_step = config.train_batch_size * run.batches.tokens_per_row();
  Progress progress(first_step, config.steps, config.steps_per_print, tokens_per_step);
  BatchSlice slice;
  slice.global_rows = config.train_batch_size;
  slice.accumulation = config.gradient_accumulation_steps;
  slice.rank = data_parallel_index(context, config);
  slice.world_size = data_parallel_size(config);
  SwapTraffic swap_recorded = trainer->swap_traffic();  // the start-up's (a resume's) left out
  for (std::int64_t step = first_step; step <= config.steps; ++step) {
    const Clock::time_point step_start = Clock::now();
    const WireBytes wire_before = context.wire ? context.wire->snapshot() : WireBytes{};
    if (pipelined) {
      // The whole step's rows of this data-parallel index at once: the pipeline splits them
      // into its micro-batches (the same rows of the global batch, in another order, as the
      // accumulation of a run without pipeline stages; the step's mean loss is over all rows).
      held.push_back(run.batches.training(step, pipeline_slice(context, config)));
      trainer->forward_backward(held.back().batch());
    }
    for (slice.micro_batch = 0; !pipelined && slice.micro_batch < slice.accumulation;
         ++slice.micro_batch) {
      held.push_back(run.batches.training(step, slice));
      trainer->forward_backward(held.back().batch());
    }
    const StepStats stats = trainer->step(schedule.lr_at(step));
    held.clear();
    const double step_ms = milliseconds(Clock::now() - step_start);
    if (leader) {
      if (step == first_step) run.summary.first_loss = stats.loss;
      run.summary.final_loss = stats.loss;
      run.last_step = step;
      progress.count(step_ms);
      // Written before the step is shown: a step the user has seen is on disk.
      ordered_json line =
          step_record(config, stats, step_ms, progress.tokens_per_s(), tokens_per_step);
      if (context.wire != nullptr) add_wire_bytes(line, context.wire->snapshot() - wire_before);
      if (trainer->swap_bytes() > 0) {
        // Rank 0's NVMe tier since the previous record: this step's reads and writes, and a
        // save's reads between the two (checkpoints read the swapped state a sub-group at a time).
        const SwapTraffic traffic = trainer->swap_traffic();
        line["nvme_read_bytes"] = traffic.read - swap_recorded.read;
        line["nvme_written_bytes"] = traffic.written - swap_recorded.written;
        swap_recorded = traffic;
      }
      // Note: the save after the previous step (it comes after that step's record, which must
      // be on disk before the checkpoint that holds the step).
      if (!config.checkpoint.dir.empty()) {
        line["checkpoint_wait_s"] = std::round(checkpoints.take_save_wait_s() * 1e6) / 1e6;
      }
      record(run, metrics, line);
      if (csv != nullptr) {
        csv->record_step(step, stats.loss, stats.lr, stats.grad_norm,
                         config.engine.loss_scale.enabled ? std::optional<float>(stats.loss_scale)
                                                          : std::nullopt);
      }
      progress.show(stats, step_ms, StopSignals::caught() != 0);
    }
    // Every rank: save when due, and stop together when a signal reached any of them.
    bool stop = checkpoints.after_step(context, *trainer, step);
    const bool last = stop || step == config.steps;
    if (config.eval_every > 0 && (step % config.eval_every == 0 || last)) {
      // Note: a signal skips the evaluation, or cuts it short (evaluate); a signal that came
      // during it stops the run after this step, which is saved first as after any stop.
      const std::optional<float> evaluated = evaluate(context, *trainer, run, checkpoints);
      if (!evaluated && !stop) stop = checkpoints.after_step(context, *trainer, step);
      const float val_loss = evaluated.value_or(0.0f);
      if (leader && evaluated) {
        progress.evaluated(step, val_loss);
        run.summary.evaluated = true;
        run.summary.final_val_loss = val_loss;
        record(run, metrics, ordered_json{{"step", step}, {"val_loss", shortest_json(val_loss)}});
        if (csv != nullptr) csv->record_eval(step, val_loss);
      }
    }
    if (stop) {
      run.stopped = true;
      break;
    }
  }
  checkpoints.finish(context);
  if (leader) {
    run.summary.steps = progress.steps_run();
    run.summary.tokens_per_s = progress.tokens_per_s();
    run.summary.mean_step_ms = progress.mean_step_ms();
    if (!config.checkpoint.dir.empty()) {
      run.summary.checkpoint_wait_s = checkpoints.total_save_wait_s();
    }
  }
  context.synchronize();
  // Every rank's peaks reach rank 0 through the communicator. all_gather moves bits, whatever
  // the dtype says.
  const auto mine = pack_memory(rank_memory_usage(context.device), trainer->predicted_memory(),
                                rank_host_params(context.device));
  const auto ranks = static_cast<std::size_t>(context.world_size);
  std::vector<std::uint64_t> all(kMemoryWords * ranks);
  all_gather_host(context, mine.data(), all.data(), 2 * kMemoryWords, DType::kInt32);
  if (!leader) return;
  run.usage.resize(ranks);
  run.predicted.resize(ranks);
  run.host_params.resize(ranks);
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    unpack_memory(all.data() + rank * kMemoryWords, run.usage[rank], run.predicted[rank],
                  run.host_params[rank]);
  }
}

// Every path the run reads once or writes at its end, checked before the first step, so that a
// directory given as --metrics or a file given as checkpoint.dir fails now, not after the
// training it would have recorded. Data files are refused as they are loaded, also before it.
void check_paths(const TrainConfig& config, const RunOptions& options, bool leader_process) {
  if (!config.model.init_from.empty()) {
    refuse_non_regular_file(config.model.init_from, ErrorKind::kConfig, "model.init_from");
  }
  const CheckpointConfig& checkpoint = config.checkpoint;
  if (!checkpoint.dir.empty() && (checkpoint.every_steps > 0 || checkpoint.save_on_exit) &&
      options.export_initial.empty()) {
    check_output_directory(checkpoint.dir, ErrorKind::kConfig, "checkpoint.dir");
  }
  if (!leader_process) return;  // only its process writes the files below
  if (!options.metrics_path.empty()) {
    check_output_file(options.metrics_path, ErrorKind::kUsage, "--metrics");
  }
  if (!options.export_initial.empty()) {
    check_output_file(options.export_initial, ErrorKind::kUsage, "--export-initial");
  }
  if (config.csv_monitor.enabled) {
    check_output_directory(CsvMonitor::folder(config.csv_monitor), ErrorKind::kConfig,
                           "csv_monitor (output_path/job_name)");
  }
  if (!options.report_path.empty()) {
    require_html_support("--report");
    check_output_file(options.report_path, ErrorKind::kUsage, "--report");
  }
  if (!config.trace_path.empty()) {
    check_output_file(config.trace_path, ErrorKind::kConfig, "log.trace");
  }
}

// The run report (--report): from the metrics file read back when there is one (it holds a
// resumed run's earlier steps too), else from the records this run kept.
void write_report(const RunState& run, const RunOptions& options, const std::string& description,
                  const TraceRecorder* trace, int ranks) {
  RunReportInput input;
  input.records = run.records;
  struct stat info {};
  if (!options.metrics_path.empty() && ::stat(options.metrics_path.c_str(), &info) == 0 &&
      S_ISREG(info.st_mode)) {
    try {
      input.records = read_metrics_file(options.metrics_path);
    } catch (const Error& error) {
      // Changed under the run by someone else: this run's own records still make a report.
      Console::say("zest-train: the report shows this run's steps only: " +
                   std::string(error.what()));
    }
  }
  input.description = description;
  input.config = run.config.json;
  if (trace != nullptr) {
    input.overlap = trace->overlap(ranks);
  } else {
    input.timeline_note =
        "No timeline recorded: set log.trace (a file) or wall_clock_breakdown to see it.";
  }
  if (run.stopped) {
    input.ending = fmt::format("stopped by signal {} after step {}", StopSignals::caught(),
                               run.last_step);
  }
  write_html_page(options.report_path, run_report_page(input));
  Console::say("zest-train: report written to " + options.report_path);
}

int train_in(const World& world, const TrainConfig& config, const RunOptions& options,
             const TraceRecorder* trace) {
  const bool leader_process = world.is_leader_process();
  check_paths(config, options, leader_process);
  if (world.size() > 1) {
    // Note: the ranks are threads of this process, or processes that share this machine's
    // cores, each already running its own GEMMs; OpenBLAS's thread pool on top of that would
    // oversubscribe the cores (ranks × OpenBLAS threads) and make every step slower, so each
    // GEMM stays on its rank's thread. It also makes threads and processes compute alike.
    openblas_set_num_threads(1);
  } else {
    // One rank has the machine: its optimizer kernels may use every core (OpenBLAS already does).
    set_kernel_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }
  // Opened by rank 0 once it knows the first step (a fresh run's or a resumed one's).
  std::optional<MetricsLog> metrics;
  if (leader_process && !options.metrics_path.empty()) metrics.emplace(options.metrics_path);
  std::optional<CsvMonitor> csv;
  if (leader_process && config.csv_monitor.enabled) csv.emplace(config, config.train_batch_size);
  const std::unique_ptr<BatchSource> batches = make_batch_source(config);
  // The leader's one declaration of the model (allocating nothing: the engine owns parameter
  // memory) gives the parameter count now and the planner's prediction after the run; each rank
  // declares its own to train, since units keep that rank's activations.
  std::shared_ptr<Module> declared;
  std::string description;
  if (leader_process) {
    declared = make_model(config.model);
    const std::size_t parameters = count_parameters(*declared);
    description = describe_run(config, parameters);
    Console::say(description);
    Console::say("zest-train: world: " + world.detected().describe());
  }
  // Every rank stops after the same step when SIGINT or SIGTERM arrives (and saves first when
  // a checkpoint directory is set); a second signal ends the process at once (StopSignals, set
  // up before main).
  RunState run{config, *batches, metrics, csv, options, {}, {}, {}, {}, {}, {}};
  world.run([&](RankContext& context) { train_rank(context, run); });
  // A stop by SIGINT / SIGTERM ends with 128 + the signal, as the signal itself would have.
  const int stop_status = run.stopped ? 128 + StopSignals::caught() : 0;
  if (!leader_process || !options.export_initial.empty()) return stop_status;
  if (run.stopped && run.last_step == 0) {
    Console::say(fmt::format("zest-train: stopped by signal {} before step {}",
                             StopSignals::caught(), run.first_step));
    return stop_status;
  }

  // Note: a pipeline's ranks differ in plan (planner/pipeline_plan.h, zest-estimate); the
  // table's one plan row is the single-pipeline-stage plan, so a pipeline shows none. A
  // tensor-parallel run plans its largest rank's slices, not the whole model declared here.
  const std::optional<PeakPrediction> planned =
      config.pipeline.enabled()
          ? std::nullopt
          : plan_peaks(config, config.tensor_parallel.enabled() ? nullptr : std::move(declared));
  print_memory_table(run.usage, run.predicted, planned);
  print_host_params(run.host_params, run.predicted);
  if (run.last_step == 0 && !run.stopped) {
    // Resumed at or past `steps`: "0 steps, loss 0 -> 0" would read as a run that trained.
    Console::say(fmt::format("zest-train: nothing trained: the checkpoint resumed is at step {} "
                             "and steps is {}; set steps above {} to train on",
                             run.first_step - 1, config.steps, run.first_step - 1));
  } else {
    print_summary(run.summary);
  }
  if (metrics && metrics->is_open()) {
    metrics->append(summary_record(run.summary, run.usage, run.predicted, planned));
    metrics->close();
  }
  if (csv) csv->close();
  if (!options.report_path.empty()) {
    run.records.add(nlohmann::json::parse(
                        summary_record(run.summary, run.usage, run.predicted, planned).dump()),
                    "zest-train");
    write_report(run, options, description, trace, world.size());
  }
  if (run.stopped) {
    Console::say(fmt::format("zest-train: stopped by signal {} after step {}", StopSignals::caught(),
                             run.last_step));
  }
  return stop_status;
}

}  // namespace

int run_training(const TrainConfig& config, const RunOptions& options) {
  // Arithmetic on the config, before any rank, unit, file or byte of data exists: a model that
  // cannot fit costs no more than a typo.
  check_model_fits_at_all(config, {config.world.device_memory, "world.device_memory"});
  check_ranks_fit_host(config, host_limits());
  WorldOptions world_options = config.world;
  world_options.program = "zest-train";
  // When the runtime ends the process itself (a rank stalled past the grace period, a failed
  // process of a multi-process job), nothing unwinds: the live progress line is ended and the
  // metrics log takes this run's records back (as for any error) here, before the error line.
  world_options.before_exit = [] {
    Console::end_live_before_exit();
    MetricsLog::discard_open_logs();
    CsvMonitor::discard_open_monitors();
  };
  // A signal while the ranks wait for a stalled one ends the wait at once; ranks that do not
  // stop within the grace period after a signal (asleep, stalled, evaluating) end the process,
  // except while a checkpoint is being saved.
  world_options.interrupted = [] { return StopSignals::caught() != 0 && !StopSignals::saving(); };
  world_options.interrupted_status = [] { return 128 + StopSignals::caught(); };
  if (!config.trace_path.empty() || config.wall_clock_breakdown) {
    world_options.trace = std::make_shared<TraceRecorder>();
  }
  const World world(world_options);
  try {
    // Every process must train the same job; checked before anything is trained or written.
    world.verify_same_config(config.json.dump());
    const int status = train_in(world, config, options, world_options.trace.get());
    if (world_options.trace && world.is_leader_process()) {
      report_timeline(*world_options.trace, config, world.size());
    }
    return status;
  } catch (const std::exception& error) {
    // The error line must not land in the middle of the live progress line.
    Console::end_live();
    // With several processes the others may be waiting for this one: end the job.
    world.end_job_on_failure(error);
    throw;
  }
}

}  // namespace zest
