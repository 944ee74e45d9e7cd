// The phases of a checkpoint save (checkpoint/writer.h), shared by the synchronous save and the
// asynchronous one (checkpoint/async_writer.h): make the temporary directory (a collective),
// the bytes of a rank's file, and publishing what every rank wrote (a collective: manifest,
// rename, `latest`). Invariant: the collectives here run on the caller's thread, in the same
// order on every rank; the file writing in between touches no communicator, so it may run on a
// thread of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/agreement.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/writer.h"
#include "engine/engine.h"
#include "runtime/world.h"

namespace zest {

// Removes a directory when destroyed, unless kept (or given no path).
class TemporaryDirectory {
 public:
  TemporaryDirectory() = default;
  ~TemporaryDirectory();
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  void hold(std::string path) { path_ = std::move(path); }
  void keep() { path_.clear(); }

 private:
  std::string path_;
};

// What a save's manifest says, taken from the trainer when the save begins (an asynchronous
// save publishes it steps later, when the trainer has moved on).
struct SaveDescription {
  std::string root;
  std::string final_name;  // step-<N>
  std::string what;        // "saving checkpoint <root>/step-<N>", for errors
  TrainerCounters counters;
  int stage = 0;
  DType compute_dtype = DType::kFloat32;
  std::size_t shard_alignment = 1;
  nlohmann::json config;
  nlohmann::json extra;
  CheckpointPlacement placement;
  std::vector<CheckpointTensor> tensors;
};

SaveDescription describe_save(const RankContext& context, Trainer& trainer,
                              const CheckpointOptions& options, const nlohmann::json& config,
                              const nlohmann::json& extra);

// The simulated disk of one rank in one save (CheckpointOptions::fail_after_bytes).
std::optional<std::uint64_t> save_budget(const RankContext& context,
                                         const CheckpointOptions& options);

// Phase 1, a collective: rank 0 makes the root and a temporary directory in it (held by `guard`
// on rank 0), after removing what crashed saves left; returns its path on every rank.
std::string prepare_save(RankContext& context, const SaveDescription& save,
                         TemporaryDirectory& guard);

// The bytes stream_rank_state hands out (engine/state_bytes.h over the units this rank saves).
std::size_t rank_state_bytes(Trainer& trainer, const SaveDescription& save);

// This rank's state shards of the units it saves, in file order (views: Trainer::state_shards).
std::vector<StateShard> rank_state_shards(Trainer& trainer, const SaveDescription& save);

// Hands `out` this rank's shard of its units' state, the bytes of its rank file, in file order.
void stream_rank_state(const RankContext& context, Trainer& trainer, const SaveDescription& save,
                       const std::function<void(const void*, std::size_t)>& out);

// What this rank does with its file's bytes: write them (shard group 0), hash them (a hybrid
// run's other groups, for rank 0 to hold against group 0's), or nothing.
enum class RankFileRole { kWrite, kHash, kNone };
RankFileRole rank_file_role(const CheckpointPlacement& placement);
std::string rank_file_path(const std::string& temporary, const CheckpointPlacement& placement);

// Phase 3, a collective after every rank's phase-2 record was exchanged (and none failed):
// rank 0 writes the manifest, publishes the directory, moves `latest`; every rank returns the
// checkpoint. Rank 0 then removes old checkpoints (keep_last), after the others have returned.
SavedCheckpoint publish_save(RankContext& context, const SaveDescription& save,
                             const std::string& temporary,
                             const std::vector<PhaseRecord>& written, TemporaryDirectory& guard,
                             std::optional<std::uint64_t>* budget, int keep_last);

}  // namespace zest
