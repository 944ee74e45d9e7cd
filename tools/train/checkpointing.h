// zest-train's checkpoints (the `checkpoint` config block, --resume): resume before the first
// step, save every `every_steps` steps and at the end, and on SIGINT / SIGTERM stop after the
// step in progress, save, and exit. Invariant: every rank stops after the same step — the
// signal may reach ranks (threads or processes) at different moments, so the ranks agree on it
// with a one-float all-reduce after each step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "checkpoint/async_writer.h"

#include "engine/engine.h"
#include "runtime/world.h"
#include "config/train_config.h"

namespace zest {

// For the process: SIGINT and SIGTERM only raise a flag, which the ranks read after each step;
// the first one caught puts both back to their default action, so a second one ends the process
// at once, as usual. install() runs before anything else in zest-train (before main where the
// platform allows: tools/train/main.cc), so a signal sent while the process starts up is caught
// rather than fatal; it also unblocks the two signals, should the parent have left them blocked.
class StopSignals {
 public:
  // Once per process; later calls do nothing (they must not re-arm a handler a signal spent).
  static void install();
  // The first signal caught, or 0.
  static int caught();
  // True while a rank of this process saves a checkpoint: the World's grace period for ranks
  // that do not stop after a signal (WorldOptions::interrupted) starts when the saves end.
  static bool saving();
};

// For one rank.
class TrainCheckpoints {
 public:
  // `config` is the resolved config (stored in every manifest); it must outlive this.
  explicit TrainCheckpoints(const TrainConfig& config);
  // With checkpoint.async, a save still being written when the rank unwinds (an error) is
  // abandoned: rank 0 names it, and `latest` keeps naming the previous checkpoint.
  ~TrainCheckpoints();

  // A collective, before the first step: loads the checkpoint checkpoint.resume names, if any,
  // and returns the first step to run (1 for a fresh run). Rank 0 prints what it resumed.
  std::int64_t resume(RankContext& context, Trainer& trainer);
  // A collective: true when a signal reached some rank's process (every rank gets the same
  // answer, so every rank stops after the same step).
  bool stop_requested(RankContext& context) const;
  // A collective, after step `step`: saves when due (every_steps, the last step, a stop) and
  // returns true when training must stop now (stop_requested).
  bool after_step(RankContext& context, Trainer& trainer, std::int64_t step);
  // A collective after the last step: waits for a background write (checkpoint.async) and
  // publishes it.
  void finish(RankContext& context);
  // Seconds the step loop spent in the saves since the last call, and over the run: a
  // synchronous save's whole time; with checkpoint.async the snapshot and the wait for the
  // previous save's writer (the background write itself overlaps the next steps).
  double take_save_wait_s();
  double total_save_wait_s() const { return total_save_wait_s_; }
  // Runs on this rank just before each save (zest-train syncs its metrics log there).
  void before_save(std::function<void()> hook) { before_save_ = std::move(hook); }

 private:
  void save(RankContext& context, Trainer& trainer, std::int64_t step);
  void announce(const RankContext& context, const SavedCheckpoint& saved, double ms) const;
  void add_save_wait(double seconds);

  const TrainConfig& config_;
  std::function<void()> before_save_;
  std::int64_t last_saved_ = -1;
  std::unique_ptr<AsyncCheckpointWriter> async_;  // checkpoint.async
  int rank_ = 0;
  double save_wait_s_ = 0.0;  // since take_save_wait_s()
  double total_save_wait_s_ = 0.0;
};

}  // namespace zest
