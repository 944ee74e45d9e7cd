// zest-train's run: builds the world, and on every rank the model, the engine and the batch
// source; resumes or initializes; runs the steps with evaluation, checkpoints and a stop on
// SIGINT / SIGTERM; reports. Errors leave as zest::Error (the caller maps them to exit codes).
#pragma once

#include <string>

#include "config/train_config.h"

namespace zest {

struct RunOptions {
  std::string metrics_path;    // one JSON line per step and evaluation, then a summary
  std::string export_initial;  // write the initial parameters here as safetensors and stop
  std::string report_path;     // the run report (HTML) at the end, or when a signal stops it
};

// Returns the process's exit status: 0, or 128 + the signal that stopped the run.
int run_training(const TrainConfig& config, const RunOptions& options);

}  // namespace zest
