// Loading a checkpoint into a trainer to resume: a collective. Every rank reads the manifest,
// checks that the checkpoint fits this model and run, verifies the size and checksum of each
// shard file it needs, and fills its own shard of every state tensor — straight from its own
// file when the world size is unchanged, otherwise by reading the element ranges of its new
// shard from the old ranks' files (resharding at load; any stage to any stage, since files have
// the same shape at every stage). Units are found by their place in the whole model, so a
// pipeline's checkpoint loads at any pipeline stages × data-parallel ranks, or into a plain
// trainer, and back (Trainer::checkpoint_placement); a hybrid run's holds its shards once, and
// every shard group's rank reads its shard from them. A tensor-parallel run's loads at any other
// tensor-parallel size (checkpoint/tensor_parallel_reads.h). Invariant: either every rank loads and
// the trainer continues exactly where the saved run stood, or every rank throws (a failed load
// leaves the trainer's state undefined: build a new one).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "runtime/world.h"

namespace zest {

// The checkpoint directory `path` means: `path` itself when it holds manifest.json, else the
// directory its `latest` file names. `latest` must hold exactly "step-<N>" and a newline, as the
// writer puts it. A kCheckpoint Error says which is missing, shows what a malformed `latest`
// holds (escaped: it may hold any bytes), or that it names a directory that does not exist.
std::string resolve_checkpoint(const std::string& path);

struct LoadedCheckpoint {
  std::string path;  // the step directory loaded
  std::int64_t step = 0;
  int saved_world_size = 1;       // ranks each unit was sharded over (per pipeline stage)
  int saved_pipeline_stages = 1;
  int saved_replicas = 1;  // hybrid sharding's shard groups (each held every shard)
  int saved_tensor_parallel_size = 1;
  int saved_stage = 0;
  bool resharded = false;  // the shard count or tensor-parallel size differed: cut anew
  nlohmann::json config;   // the saved run's resolved config
  nlohmann::json extra;    // what save_checkpoint was given (the data position)
  // manifest.json carried its checksum (and it matched); false: an older zest wrote it, so its
  // counters and layout were read unchecked.
  bool manifest_checksum = false;
};

// A collective: every rank calls it between steps (before the first, to resume). Errors: a
// newer format version, a different model (the first differences listed), another optimizer
// (its state tensors differ), a corrupt manifest (with how it differs from this model when it
// still parses), a missing, truncated or corrupt shard file (named), all kCheckpoint.
LoadedCheckpoint load_checkpoint(RankContext& context, Trainer& trainer, const std::string& path);

// Checks the manifest's own checksum and every shard file of the checkpoint at `path` (resolved
// as above) against the manifest's sizes and checksums; a kCheckpoint Error names the first bad
// file.
void verify_checkpoint(const std::string& path);

}  // namespace zest
