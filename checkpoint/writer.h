// Saving a checkpoint: a collective that writes the trainer's state, sharded as it lives, to
// <dir>/step-<N>/ (format: checkpoint/manifest.h) and points <dir>/latest at it. Every
// rank writes its own rank-<r>.bin into a temporary directory .tmp-step-<N>-<tag>/ and fsyncs
// it; rank 0 collects the files' sizes and checksums, writes manifest.json, fsyncs, renames the
// directory into place, fsyncs <dir>, and only then replaces `latest` (temp file, fsync,
// rename). A hybrid-sharded run's shard groups hold the same state: the first group's ranks write
// it, the others only hash theirs, and rank 0 refuses to save when a hash differs from its twin's.
// Invariant: at every moment `latest` names a complete checkpoint (or does not exist); a crash or
// an error mid-save leaves the previous checkpoint and `latest` as they were.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "runtime/world.h"

namespace zest {

struct CheckpointOptions {
  std::string dir;    // the checkpoint root: step-<N>/ directories and `latest` live here
  int keep_last = 0;  // after a save, keep this many step directories (0: keep all)
  // Testing: fail with ENOSPC once rank `fail_rank` (-1: every rank) has written this many bytes
  // in this save. Unset, the environment variable ZEST_CHECKPOINT_FAIL_AFTER_BYTES does the same
  // for every rank.
  std::optional<std::uint64_t> fail_after_bytes;
  int fail_rank = -1;
};

struct SavedCheckpoint {
  std::string path;  // <dir>/step-<N>
  std::int64_t step = 0;
  std::uint64_t bytes = 0;  // every file of the checkpoint
  // Rank 0: older step directories keep_last could not remove (the save itself succeeded).
  std::vector<std::string> warnings;
};

// A collective: every rank calls it between steps, with the same arguments. `config` is the
// run's resolved config and `extra` anything else a resume needs (the data position); both are
// stored in the manifest and `extra` comes back from load_checkpoint. The step is the trainer's
// steps_taken. Throws on every rank when any rank failed: the failing rank its own Error (kIo
// naming the file and the OS error for a failed write), the others a kPeerFailure echo of it;
// since all ranks throw, a caller may catch it on every rank and train on. Ranks wait for each
// other between phases within the communicator's timeout, which must therefore exceed how much
// longer the slowest rank takes to write its file than the fastest.
SavedCheckpoint save_checkpoint(RankContext& context, Trainer& trainer,
                                const CheckpointOptions& options, const nlohmann::json& config,
                                const nlohmann::json& extra = nlohmann::json::object());

}  // namespace zest
