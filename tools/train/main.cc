// zest-train: trains a built-in model (the MLP, or a GPT on token shards or text) from one JSON
// config.
//
//   zest-train --config FILE [--set dotted.key=value ...] [--metrics FILE] [--report FILE]
//              [--resume PATH] [--export-initial FILE] [--print-config]
//
// Every rank builds the model, shards it with the ZeRO engine and runs the configured steps on
// its slice of each global batch (tools/train/training_run.h); rank 0 shows progress, the
// held-out loss every eval_every steps and, at the end, the peak memory per category and rank
// beside the engine's prediction; with --report, the run report (one self-contained HTML page of
// plots, tools/common/run_report_page.h) at the end or when a signal stops it. Ranks are threads of this process, or processes under mpirun /
// srun with world.backend "mpi" or "auto" (docs/operating.md, "Many processes and machines"); then only rank 0's process
// prints and writes files. SIGINT / SIGTERM stop every rank after the step in progress (saving
// a checkpoint first when a `checkpoint` block names a directory; one that arrives while the job
// starts up stops it before its first step) and exit with status 128 + the signal; a second one
// ends the process at once. Errors print one line, "zest-train: error: <message>", and exit 2
// for bad input, 1 for failures at run time.
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/printable.h"
#include "kernels/blas_core.h"
#include "runtime/world_detection.h"
#include "tools/common/tool_main.h"
#include "resolve/resolved_config.h"
#include "tools/train/checkpointing.h"
#include "tools/train/training_run.h"

namespace {

constexpr const char* kProgram = "zest-train";

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

int run(int argc, char** argv) {
  CLI::App app{"Trains a built-in model with the ZeRO engine from one JSON config.", kProgram};
  std::string config_path;
  std::vector<std::string> overrides;
  std::string resume_path;
  bool print_config = false;
  zest::RunOptions options;
  app.add_option("--config", config_path, "JSON config file (see configs/default.json)")
      ->required();
  app.add_option("--set", overrides,
                 "override a config key before validation: dotted.key=value (repeatable)");
  app.add_option("--metrics", options.metrics_path,
                 "write one JSON line per step and per evaluation, then a summary line, to FILE");
  app.add_option("--report", options.report_path,
                 "write the run report, one self-contained HTML page of plots, to FILE at the "
                 "end of the run (or when a signal stops it)");
  app.add_option("--export-initial", options.export_initial,
                 "write the initial parameters (after model.init_from or --resume) to FILE as "
                 "safetensors, then exit without training");
  app.add_option("--resume", resume_path,
                 "resume from this checkpoint (a step directory, or a root with `latest`); the "
                 "same as --set checkpoint.resume=PATH");
  app.add_flag("--print-config", print_config,
               "print the resolved config (overrides and defaults applied) and exit");
  if (!zest::parse_command_line(app, argc, argv)) return 0;

  if (!resume_path.empty()) {
    if (zest::first_invalid_utf8(resume_path)) {
      throw zest::Error(zest::ErrorKind::kUsage,
                        "--resume: the path is not valid UTF-8; a checkpoint path must be");
    }
    // Quoted, so that the override reads it as a string whatever it looks like.
    overrides.push_back("checkpoint.resume=" + nlohmann::json(resume_path).dump());
  }
  const zest::TrainConfig config =
      zest::load_resolved_config(config_path, with_launcher_world_size(config_path, overrides));
  if (print_config) {
    std::cout << config.json.dump(2) << std::endl;
    return 0;
  }
  return zest::run_training(config, options);
}

// Note: the stop handlers go in before anything else runs. In main they would come only after
// the dynamic loader and every library's initializers (OpenBLAS starts its threads there):
// milliseconds in which Ctrl-C or a scheduler's SIGTERM would kill the process outright. An
// ELF executable's .preinit_array runs before the libraries' initializers, with one thread.
void install_stop_signals(int, char**, char**) { zest::StopSignals::install(); }
#if defined(__ELF__)
[[gnu::used, gnu::section(".preinit_array")]] void (*preinit_stop_signals)(
    int, char**, char**) = &install_stop_signals;
#endif

}  // namespace

int main(int argc, char** argv) {
  zest::StopSignals::install();  // done already where .preinit_array exists; then a no-op
  // Before any matrix product or thread: OpenBLAS's AVX-512 kernels on a processor newer than
  // the library (kernels/blas_core.h); an OPENBLAS_CORETYPE the user set is kept.
  zest::select_openblas_core();
  return zest::run_tool(kProgram, [&] { return run(argc, argv); });
}
