// zest-train's checkpoints (the `checkpoint` config block, --resume): resume before the first
// step, save every `every_steps` steps and at the end, and on SIGINT / SIGTERM stop after the
// step in progress, save, and exit. Invariant: every rank stops after the same step — the
// signal may reach ranks (threads or processes) at different moments, so the ranks agree on it
// with a one-float all-reduce after each step.
#pragma once

#include <cstdint>

#include "engine/engine.h"
#include "runtime/world.h"
#include "config/train_config.h"

namespace zest {

// For the process: while it lives, SIGINT and SIGTERM only raise a flag (a second one ends the
// process at once, as usual); when `enabled` is false it changes nothing.
class StopSignals {
 public:
  explicit StopSignals(bool enabled);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  bool enabled() const { return enabled_; }
  // The first signal caught, or 0.
  static int caught();

 private:
  bool enabled_;
};

// For one rank.
class TrainCheckpoints {
 public:
  // `config` is the resolved config (stored in every manifest); both must outlive this.
  TrainCheckpoints(const TrainConfig& config, const StopSignals& signals);

  // A collective, before the first step: loads the checkpoint checkpoint.resume names, if any,
  // and returns the first step to run (1 for a fresh run). Rank 0 prints what it resumed.
  std::int64_t resume(RankContext& context, Trainer& trainer);
  // A collective, after step `step`: saves when due (every_steps, the last step, a stop) and
  // returns true when training must stop now (a signal reached some rank).
  bool after_step(RankContext& context, Trainer& trainer, std::int64_t step);

 private:
  void save(RankContext& context, Trainer& trainer, std::int64_t step);

  const TrainConfig& config_;
  const StopSignals& signals_;
  std::int64_t last_saved_ = -1;
};

}  // namespace zest
