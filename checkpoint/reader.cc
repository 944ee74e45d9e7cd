#include "checkpoint/reader.h"

#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "base/error.h"
#include "base/printable.h"
#include "checkpoint/agreement.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/source.h"
#include "checkpoint/state_shard_copies.h"
#include "checkpoint/tensor_parallel_reads.h"

namespace zest {
namespace {

// The outer loop's state (engine/outer_loop.h) starts afresh from a checkpoint saved without
// it, as at a run's start: the anchor from the parameters, the momentum at zero. A run may turn
// the outer loop on at a resume.
bool starts_afresh(const std::string& name) { return name.rfind("outer.", 0) == 0; }

// The saved tensor that fills `shard`; -1: zeros.
int tensor_for(const CheckpointSource& source, const StateShard& shard) {
  const int tensor = source.source_for(shard.name, shard.dtype);
  if (tensor >= 0 || shard.name != "outer.anchor") return tensor;
  return source.source_for("master", DType::kFloat32);
}

namespace fs = std::filesystem;

// Where the checkpoint's model and this one differ; at their whole shapes when they were cut
// among different numbers of tensor-parallel ranks.
std::vector<std::string> differences(const CheckpointManifest& manifest,
                                     const CheckpointPlacement& placement) {
  if (!crosses_tensor_parallel(manifest, placement)) {
    return model_differences(manifest.units, placement.units);
  }
  return model_differences(whole_units(manifest), whole_layouts(placement));
}

std::string tensor_names(const std::vector<std::string>& names) {
  return names.empty() ? "none" : printable(fmt::format("{}", fmt::join(names, ", ")));
}

// The state tensors this trainer wants must all be available, and the saved optimizer's state
// must be this optimizer's (the same number of states).
// A GPT in vocabulary pieces (models/gpt_pieces.h) has units "wte_piece1".. beside "embedding".
template <typename Units, typename Name>
std::size_t vocab_pieces_of(const Units& units, Name name) {
  std::size_t pieces = 1;
  for (const auto& unit : units) pieces += name(unit).rfind("wte_piece", 0) == 0 ? 1 : 0;
  return pieces;
}

void check_fits(const CheckpointSource& source, Trainer& trainer,
                const CheckpointPlacement& placement) {
  const CheckpointManifest& manifest = source.manifest();
  const std::size_t saved_pieces =
      vocab_pieces_of(manifest.units, [](const CheckpointUnit& unit) { return unit.name; });
  // The whole model's units: a pipeline stage's layouts() hold only some of the pieces.
  const std::size_t pieces = vocab_pieces_of(
      placement.units, [](const ShardLayout& layout) { return layout.unit_name(); });
  if (saved_pieces != pieces) {
    // Note: pieces are units, so a checkpoint of another count has other units; what the user
    // must change is the config key, not the checkpoint (export and import cut it anew).
    throw Error(ErrorKind::kConfig,
                fmt::format("model.vocab_pieces: checkpoint {} was saved with {} vocab pieces, "
                            "this model has {}; set model.vocab_pieces to {} to load it",
                            source.dir(), saved_pieces, pieces, saved_pieces));
  }
  const std::vector<std::string> different = differences(manifest, placement);
  if (!different.empty()) {
    throw Error(ErrorKind::kCheckpoint,
                fmt::format("checkpoint {} was saved from another model: {}", source.dir(),
                            fmt::join(different, "; ")));
  }
  std::vector<std::string> saved_states, wanted_states;
  for (const CheckpointTensor& t : manifest.tensors) {
    if (t.name.rfind("optimizer.", 0) == 0) saved_states.push_back(t.name);
  }
  for (const StateShard& shard : trainer.state_shards(0)) {
    if (shard.name.rfind("optimizer.", 0) == 0) wanted_states.push_back(shard.name);
    if (source.source_for(shard.name, shard.dtype) < 0 && !starts_afresh(shard.name)) {
      throw Error(ErrorKind::kCheckpoint,
                  "checkpoint " + source.dir() + " has no state tensor for '" + shard.name + "'");
    }
  }
  if (saved_states != wanted_states) {
    throw Error(ErrorKind::kCheckpoint,
                fmt::format("checkpoint {} holds optimizer state {} but this optimizer keeps {}: "
                            "it was saved with another optimizer",
                            source.dir(), tensor_names(saved_states), tensor_names(wanted_states)));
  }
}

// The step directory <root>/latest names. Note: `latest` is held to exactly what the writer
// puts there, "step-<N>" and a newline (the newline may be missing), N without leading zeros: a
// changed byte then either breaks that form or names a step that is not there, or — a digit
// changed into another — a complete checkpoint of that other step, which loads whole (with its
// own counters and data position) and says which step it is.
std::string latest_step_directory(const std::string& root) {
  const fs::path latest = fs::path(root) / "latest";
  const std::string text = read_text_file(latest.string(), kMaxLatestBytes, "the latest pointer");
  const std::string name = text.ends_with('\n') ? text.substr(0, text.size() - 1) : text;
  const std::int64_t step = parse_step_directory_name(name);
  if (step < 0 || name != step_directory_name(step)) {
    throw Error(ErrorKind::kCheckpoint,
                fmt::format("{} holds {}, not the name of a step directory (\"step-<N>\" and a "
                            "newline, as zest writes it)",
                            latest.string(), quoted_text(text)));
  }
  const fs::path dir = fs::path(root) / name;
  std::error_code error;
  const fs::file_status status = fs::status(dir, error);
  if (!fs::exists(status)) {
    throw Error(ErrorKind::kCheckpoint,
                latest.string() + " names " + name + ", which does not exist in " + root);
  }
  if (!fs::is_directory(status)) {
    throw Error(ErrorKind::kCheckpoint,
                latest.string() + " names " + name + ", which is not a directory");
  }
  if (!fs::exists(dir / "manifest.json", error)) {
    throw Error(ErrorKind::kCheckpoint, latest.string() + " names " + name +
                                            ", which has no manifest.json (not a checkpoint)");
  }
  return dir.string();
}

// Opens the checkpoint, adding to a manifest that failed to read how it differs from this model
// when it still parses: a changed bit in a name then says which name.
std::unique_ptr<CheckpointSource> open_for(const std::string& dir,
                                           const CheckpointPlacement& placement) {
  try {
    return std::make_unique<CheckpointSource>(dir);
  } catch (const Error& error) {
    if (error.kind() != ErrorKind::kCheckpoint) throw;
    std::vector<std::string> different;
    try {
      different = differences(read_manifest(dir, ManifestChecksum::kIgnore), placement);
    } catch (const Error&) {
      throw error;
    }
    if (different.empty()) throw;
    throw Error(ErrorKind::kCheckpoint,
                fmt::format("{}; read regardless, it differs from this model: {}", error.what(),
                            fmt::join(different, "; ")));
  }
}

using ShardReader = std::function<void(std::size_t unit, std::size_t tensor, std::size_t begin,
                                       std::size_t end, void* host, DType type)>;

// Fills every state shard of this rank through `read` (the placement's unit, the saved tensor, a
// flat range of the unit, where to, as what).
void fill_shards(RankContext& context, const CheckpointSource& source,
                 const CheckpointPlacement& placement,
                 const std::vector<std::vector<StateShard>>& shards, const ShardReader& read) {
  for (std::size_t u = 0; u < shards.size(); ++u) {
    for (const StateShard& shard : shards[u]) {
      const int tensor = tensor_for(source, shard);
      write_state_elements(context, shard, 0, shard.end - shard.begin,
                           [&](void* host, std::size_t first, std::size_t count) {
                             if (tensor < 0) {  // starts afresh: zero in every float type
                               std::memset(host, 0, count * dtype_size(shard.dtype));
                               return;
                             }
                             read(placement.local_units[u], static_cast<std::size_t>(tensor),
                                  shard.begin + first, shard.begin + first + count, host,
                                  shard.dtype);
                           });
    }
  }
}

// The same tensor-parallel size: flat ranges of the same units (this tensor rank's parts), from
// the old ranks' files that hold them (verified first, all at once).
void read_flat_ranges(RankContext& context, const CheckpointSource& source,
                      const CheckpointPlacement& placement,
                      const std::vector<std::vector<StateShard>>& shards) {
  std::set<int> needed;
  for (std::size_t u = 0; u < shards.size(); ++u) {
    if (shards[u].empty()) continue;
    const StateShard& first = shards[u].front();
    for (int rank : source.ranks_holding(placement.local_units[u], first.begin, first.end,
                                         placement.tensor_rank)) {
      needed.insert(rank);
    }
  }
  for (int rank : needed) source.verify(rank);
  fill_shards(context, source, placement, shards,
              [&](std::size_t unit, std::size_t tensor, std::size_t begin, std::size_t end,
                  void* host, DType type) {
                source.read(unit, tensor, begin, end, host, type, placement.tensor_rank);
              });
}

// Another tensor-parallel size: through the whole parameters.
void read_across_tensor_parallel(RankContext& context, const CheckpointSource& source,
                                 const CheckpointPlacement& placement,
                                 const std::vector<std::vector<StateShard>>& shards) {
  TensorParallelReader reader(source, placement);
  fill_shards(context, source, placement, shards,
              [&](std::size_t unit, std::size_t tensor, std::size_t begin, std::size_t end,
                  void* host, DType type) { reader.read(unit, tensor, begin, end, host, type); });
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
  std::error_code error;
  if (fs::exists(fs::path(path) / "manifest.json", error)) return path;
  if (fs::exists(fs::path(path) / "latest", error)) {
    return latest_step_directory(path);
  }
  if (!fs::exists(path, error)) {
    throw Error(ErrorKind::kCheckpoint, "no checkpoint at " + path + ": it does not exist");
  }
  throw Error(ErrorKind::kCheckpoint,
              "no checkpoint at " + path + ": it holds neither manifest.json nor a latest file");
}

LoadedCheckpoint load_checkpoint(RankContext& context, Trainer& trainer, const std::string& path) {
  LoadedCheckpoint loaded;
  TrainerCounters counters;
  PhaseRecord record;
  const std::optional<Error> failure = capture(record, [&] {
    // Units are matched by their place in the whole model, which check_fits holds equal to the
    // checkpoint's: a pipeline stage reads its units wherever the saved mesh put them.
    const CheckpointPlacement placement = placement_of(trainer, context.rank, context.world_size);
    loaded.path = resolve_checkpoint(path);
    const std::unique_ptr<CheckpointSource> opened = open_for(loaded.path, placement);
    const CheckpointSource& source = *opened;
    const CheckpointManifest& manifest = source.manifest();
    check_fits(source, trainer, placement);

    // Which saved tensor fills each wanted one, and which old ranks' files this rank reads.
    const std::vector<ShardLayout>& layouts = trainer.layouts();
    std::vector<std::vector<StateShard>> shards;
    for (std::size_t u = 0; u < layouts.size(); ++u) shards.push_back(trainer.state_shards(u));
    if (crosses_tensor_parallel(manifest, placement)) {
      read_across_tensor_parallel(context, source, placement, shards);
    } else {
      read_flat_ranges(context, source, placement, shards);
    }
    loaded.step = manifest.step;
    loaded.saved_world_size = manifest.world_size;
    loaded.saved_stage = manifest.stage;
    loaded.saved_pipeline_stages = manifest.pipeline_stages;
    loaded.saved_replicas = manifest.hybrid_replicas;
    loaded.saved_tensor_parallel_size = manifest.tensor_parallel_size;
    loaded.resharded = manifest.world_size != placement.shards ||
                       manifest.tensor_parallel_size != placement.tensor_ranks;
    loaded.config = manifest.config;
    loaded.extra = manifest.extra;
    loaded.manifest_checksum = manifest.manifest_xxh3.has_value();
    counters = manifest.counters;
  });
  raise_if_failed(exchange_records(context, record, failure), failure,
                  "loading checkpoint " + path);
  trainer.state_loaded();
  trainer.set_counters(counters);
  return loaded;
}

void verify_checkpoint(const std::string& path) {
  CheckpointSource(resolve_checkpoint(path)).verify_all();
}

}  // namespace zest
