// What a user watches while zest-train runs: after every step one line with the step, loss,
// learning rate, gradient norm, throughput and the time left. On a terminal it is one live line
// redrawn in place every step; elsewhere (a log file, CI) a plain line every steps_per_print
// steps, and always for the first and the last step.
#pragma once

#include <cstdint>
#include <string>

#include "engine/engine.h"

namespace zest {

class Progress {
 public:
  // Steps first_step .. last_step will run; each carries tokens_per_step tokens (rows × tokens
  // per row of the whole global batch).
  Progress(std::int64_t first_step, std::int64_t last_step, std::int64_t steps_per_print,
           std::int64_t tokens_per_step);

  // Records a finished step that took `step_ms` (tokens_per_s() then counts it).
  void count(double step_ms);
  // Shows the step count() recorded. `stopping`: the run stops after it (a signal), so it is
  // shown whatever steps_per_print says.
  void show(const StepStats& stats, double step_ms, bool stopping);
  // Shows a held-out loss.
  void evaluated(std::int64_t step, float val_loss);

  // Throughput of the steps so far: the first step (warm-up: first touches of memory, thread
  // start-up) is left out once there are others.
  double tokens_per_s() const;
  double mean_step_ms() const;
  std::int64_t steps_run() const { return steps_run_; }

 private:
  std::string line(const StepStats& stats, double step_ms) const;
  double seconds_left(std::int64_t step) const;

  std::int64_t first_step_;
  std::int64_t last_step_;
  std::int64_t steps_per_print_;
  std::int64_t tokens_per_step_;
  std::int64_t steps_run_ = 0;
  double first_step_ms_ = 0.0;
  double later_steps_ms_ = 0.0;  // sum over steps after the first
};

// "1h02m", "3m07s", "42s"
std::string format_duration(double seconds);
// "950", "12.3k", "4.56M"
std::string format_rate(double per_second);

}  // namespace zest
