#include "tools/train/checkpointing.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/byte_size.h"
#include "memory/allocator.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "runtime/host_collectives.h"
#include "tools/train/console.h"

namespace zest {
namespace {

std::atomic<int> caught_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");
std::atomic<int> saves_in_progress{0};
// Written only by install(), which runs while the process has a single thread.
bool signals_installed = false;

void set_stop_action(void (*handler)(int)) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

extern "C" void on_stop_signal(int signal) {
  int none = 0;
  caught_signal.compare_exchange_strong(none, signal);
  // Note: both signals, not only the one caught (SA_RESETHAND's way): a user who sent SIGINT and
  // then SIGTERM (a scheduler's) does not want to wait for the save either. sigaction is
  // async-signal-safe.
  set_stop_action(SIG_DFL);
}

// A saved config value that differs from this run's, for a warning: the data of step k depends
// on the seed and the batch sizes, so a resumed run that changes them does not continue the same
// run.
bool same_value(const nlohmann::json& saved, const nlohmann::json& now, const char* key) {
  return saved.is_object() && saved.contains(key) && now.contains(key) && saved[key] == now[key];
}

void warn_if_changed(const nlohmann::json& saved, const nlohmann::json& now, const char* key) {
  if (!saved.is_object() || !saved.contains(key) || !now.contains(key)) return;
  if (saved[key] == now[key]) return;
  Console::say(fmt::format("zest-train: warning: {} is {} here but was {} in the checkpoint's run",
                           key, now[key].dump(), saved[key].dump()));
}

}  // namespace

void StopSignals::install() {
  if (signals_installed) return;
  signals_installed = true;
  set_stop_action(on_stop_signal);
  // A signal that arrived before the handler was in place and was held by an inherited mask is
  // delivered now, to the handler.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigprocmask(SIG_UNBLOCK, &stop, nullptr);
}

int StopSignals::caught() { return caught_signal.load(); }

bool StopSignals::saving() { return saves_in_progress.load() > 0; }

TrainCheckpoints::TrainCheckpoints(const TrainConfig& config) : config_(config) {
  if (config.checkpoint.async && !config.checkpoint.dir.empty()) {
    CheckpointOptions options;
    options.dir = config.checkpoint.dir;
    options.keep_last = static_cast<int>(config.checkpoint.keep_last);
    async_ = std::make_unique<AsyncCheckpointWriter>(options);
  }
}

TrainCheckpoints::~TrainCheckpoints() {
  if (!async_ || async_->pending_step() < 0 || rank_ != 0) return;
  Console::say(fmt::format("zest-train: warning: abandoned the checkpoint of step {} still being "
                           "written; {}/latest names the previous one",
                           async_->pending_step(), config_.checkpoint.dir));
}

void TrainCheckpoints::finish(RankContext& context) {
  if (!async_) return;
  const auto start = std::chrono::steady_clock::now();
  const std::optional<SavedCheckpoint> saved = async_->finish(context);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  add_save_wait(ms / 1e3);
  if (saved) announce(context, *saved, ms);
}

std::int64_t TrainCheckpoints::resume(RankContext& context, Trainer& trainer) {
  const bool leader = context.rank == 0;
  std::string path = config_.checkpoint.resume;
  if (path.empty()) return 1;
  if (path == "auto") {
    path = config_.checkpoint.dir;
    if (!std::filesystem::exists(std::filesystem::path(path) / "latest")) {
      if (leader) {
        Console::say("zest-train: no checkpoint in " + path + " yet: starting at step 1");
      }
      return 1;
    }
  }
  const LoadedCheckpoint loaded = load_checkpoint(context, trainer, path);
  last_saved_ = loaded.step;
  if (leader) {
    // Every rank that trained: a hybrid run's other shard groups held the saved shards too.
    const int saved_ranks = loaded.saved_world_size * loaded.saved_pipeline_stages *
                            loaded.saved_replicas * loaded.saved_tensor_parallel_size;
    std::string groups = loaded.saved_replicas > 1
                             ? fmt::format(" in {} shard groups of {}", loaded.saved_replicas,
                                           loaded.saved_world_size)
                             : std::string();
    if (loaded.saved_tensor_parallel_size > 1) {
      groups += fmt::format(", tensor-parallel size {}", loaded.saved_tensor_parallel_size);
    }
    Console::say(fmt::format(
        "zest-train: resumed from {} at step {} (saved by {} rank{}{} at stage {}{})", loaded.path,
        loaded.step, saved_ranks, saved_ranks == 1 ? "" : "s", groups, loaded.saved_stage,
        loaded.resharded ? "; resharded" : ""));
    if (!loaded.manifest_checksum) {
      Console::say("zest-train: warning: " + loaded.path +
                   "/manifest.json has no checksum (an older zest wrote it): its counters and "
                   "layout were read unchecked; checkpoints saved from now on carry one");
    }
    for (const char* key : {"seed", "train_batch_size"}) {
      warn_if_changed(loaded.config, config_.json, key);
    }
    // Note: at the same global and micro-batch the accumulation steps follow from the
    // data-parallel ranks (world.ranks / pipeline.stages), which a resume may change: only a
    // step cut into other micro-batches is worth the warning.
    const bool same_micro_batches =
        same_value(loaded.config, config_.json, "train_batch_size") &&
        same_value(loaded.config, config_.json, "train_micro_batch_size_per_gpu");
    if (!same_micro_batches) {
      warn_if_changed(loaded.config, config_.json, "gradient_accumulation_steps");
    }
  }
  return trainer.steps_taken() + 1;
}

bool TrainCheckpoints::stop_requested(RankContext& context) const {
  float mine = StopSignals::caught() != 0 ? 1.0f : 0.0f;
  float any = 0.0f;
  all_reduce_host(context, &mine, &any, 1, DType::kFloat32, Reduction::kSum);
  return any > 0.0f;
}

bool TrainCheckpoints::after_step(RankContext& context, Trainer& trainer, std::int64_t step) {
  rank_ = context.rank;
  const bool stop = stop_requested(context);
  const CheckpointConfig& checkpoint = config_.checkpoint;
  if (checkpoint.dir.empty()) return stop;
  if (async_) {
    if (const std::optional<SavedCheckpoint> published = async_->poll(context)) {
      announce(context, *published, 0.0);
    }
  }
  const bool periodic = checkpoint.every_steps > 0 && step % checkpoint.every_steps == 0;
  const bool at_exit = checkpoint.save_on_exit && (stop || step == config_.steps);
  if ((periodic || at_exit) && last_saved_ != step) save(context, trainer, step);
  return stop;
}

void TrainCheckpoints::save(RankContext& context, Trainer& trainer, std::int64_t step) {
  if (before_save_) before_save_();
  CheckpointOptions options;
  options.dir = config_.checkpoint.dir;
  options.keep_last = static_cast<int>(config_.checkpoint.keep_last);
  const auto start = std::chrono::steady_clock::now();
  // The data position: zest-train's batches are a function of the step alone.
  const nlohmann::json extra = {{"next_step", step + 1},
                                {"samples_seen", step * config_.train_batch_size}};
  struct Saving {  // counted while this rank saves, also when the save throws
    Saving() { ++saves_in_progress; }
    ~Saving() { --saves_in_progress; }
  };
  if (async_) {
    // Snapshot, wait for the previous save's writer and publish it, start this one's writer.
    const std::optional<SavedCheckpoint> published = [&] {
      const Saving saving;
      return async_->save(context, trainer, config_.json, extra);
    }();
    last_saved_ = step;
    if (published) announce(context, *published, 0.0);
    const AsyncSaveStats& stats = async_->stats();
    add_save_wait(stats.snapshot_s + stats.wait_s);
    if (context.rank == 0) {
      Console::say(fmt::format("zest-train: checkpoint of step {} snapshot ({}, {:.0f} ms; waited "
                               "{:.0f} ms for the previous writer), writing in the background",
                               step, format_bytes(stats.snapshot_bytes), stats.snapshot_s * 1e3,
                               stats.wait_s * 1e3));
    }
    return;
  }
  const SavedCheckpoint saved = [&] {
    const Saving saving;
    return save_checkpoint(context, trainer, options, config_.json, extra);
  }();
  last_saved_ = step;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  add_save_wait(ms / 1e3);
  announce(context, saved, ms);
}

void TrainCheckpoints::add_save_wait(double seconds) {
  save_wait_s_ += seconds;
  total_save_wait_s_ += seconds;
}

double TrainCheckpoints::take_save_wait_s() {
  const double seconds = save_wait_s_;
  save_wait_s_ = 0.0;
  return seconds;
}

void TrainCheckpoints::announce(const RankContext& context, const SavedCheckpoint& saved,
                                double ms) const {
  if (context.rank != 0) return;
  Console::say(fmt::format("zest-train: saved checkpoint {} ({}, {:.0f} ms)", saved.path,
                           format_bytes(saved.bytes), ms));
  for (const std::string& warning : saved.warnings) {
    Console::say("zest-train: warning: " + warning);
  }
}

}  // namespace zest
