// Asynchronous checkpoints (`checkpoint.async`): a save copies this rank's state into a host
// snapshot between steps, on a stream of its own (the trainer's next update waits for it:
// Trainer::hold_state_for), and a background thread writes, checksums and fsyncs the rank file
// while training goes on. The snapshot is double-buffered: the next save fills the other buffer
// before it waits for the writer of the previous one, so only the disk's excess over the steps
// between saves is waited for (AsyncSaveStats::wait_s). The buffers are host memory of the
// device's host allocator, category `snapshot`, each rank_state_bytes long (the plan's size).
// Invariant: `latest` moves only when every rank's file is durable, and the ranks agree on that
// only in collectives of the calling thread — save(), poll() and finish() are collectives every
// rank calls at the same points (between steps); the writer thread never touches a communicator.
// A file names the bytes the synchronous save_checkpoint would write, to the bit.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/writer.h"
#include "engine/engine.h"
#include "memory/allocator.h"
#include "runtime/world.h"

namespace zest {

struct SaveDescription;
class TemporaryDirectory;

struct AsyncSaveStats {
  std::int64_t saves_started = 0;
  std::int64_t saves_published = 0;
  double snapshot_s = 0.0;  // the last save's snapshot as the step loop waited for it: the
                            // copies enqueued (and NVMe-resident state read)
  double copy_s = 0.0;      // the last published save's copies, from its start until they ran
  double wait_s = 0.0;      // the last save's wait for the previous save's writer
  double write_s = 0.0;     // the last finished background write (file and fsync)
  double total_wait_s = 0.0;
  std::uint64_t snapshot_bytes = 0;  // one buffer; two are held once a second save started
};

// The snapshot buffers an asynchronous checkpoint holds at its peak over a run that saves
// `saves` times: one per save, two at most (the double buffer). For the memory plan.
int snapshot_buffers(std::int64_t saves);

class AsyncCheckpointWriter {
 public:
  explicit AsyncCheckpointWriter(CheckpointOptions options);
  // Waits for a write in flight (the thread must not outlive the buffers); a save not yet
  // published is abandoned: its temporary directory is removed and `latest` keeps naming the
  // previous checkpoint. pending_step() says which, for the caller to name.
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // A collective between steps: snapshots this rank's state, then waits for the previous save's
  // writer and publishes that save (returned, when there was one), then starts the background
  // write of this one. Errors as save_checkpoint's, raised on every rank — those of a background
  // write at the first collective after it (this, poll or finish).
  std::optional<SavedCheckpoint> save(RankContext& context, Trainer& trainer,
                                      const nlohmann::json& config,
                                      const nlohmann::json& extra = nlohmann::json::object());
  // A collective between steps: publishes the save in flight once every rank's writer is done
  // (one all-reduce of a flag while one is in flight; nothing when none is).
  std::optional<SavedCheckpoint> poll(RankContext& context);
  // A collective: waits for the writer and publishes the save in flight, if any.
  std::optional<SavedCheckpoint> finish(RankContext& context);

  // The step of the save started and not yet published, or -1.
  std::int64_t pending_step() const;
  const AsyncSaveStats& stats() const { return stats_; }

 private:
  struct Pending;
  void start_writer(RankContext& context, std::size_t buffer);
  void wait_for_writer();
  SavedCheckpoint publish(RankContext& context);

  void take_snapshot(RankContext& context, Trainer& trainer, Pending& next);

  CheckpointOptions options_;
  // Note: from the device's host allocator, charged to `snapshot`, so the run measures them as
  // the plan predicts them; on the CUDA device that memory is pinned, which device-to-host
  // copies need to run at full speed.
  Buffer buffers_[2];
  std::size_t next_buffer_ = 0;
  std::unique_ptr<Stream> snapshot_stream_;  // device-to-host copies into the buffers
  std::unique_ptr<Pending> pending_;
  std::thread writer_;
  AsyncSaveStats stats_;
};

}  // namespace zest
