// A checkpoint's manifest (manifest.json) and the layout of its shard files. A checkpoint is a
// directory `step-<N>/` holding manifest.json and one file per rank, `rank-<r>.bin`. A rank file
// is raw little-endian bytes with no header: for each unit in order, for each state tensor in
// the manifest's `tensors` order, the rank's shard of that tensor — shard_length elements of the
// tensor's dtype, flat elements [r·shard_length, (r+1)·shard_length) of the unit (padding past
// numel included, as zeros). So block (u, t) starts at the sum of the sizes of the blocks before
// it, and flat element e of unit u lives in rank e / shard_length at e % shard_length.
// manifest.json carries its own checksum on its last line (manifest_text), so a changed bit in
// the manifest is found as surely as one in a rank file.
// A pipeline's checkpoint splits the units into `pipeline_stages` parts, each
// unit naming its part, and has world_size files per part: file part × world_size + r holds rank
// r's shard of that part's units only, in the order above; world_size is then the data-parallel
// size, the ranks each unit is sharded over. A unit is listed once, so a reader finds it by name
// whatever mesh wrote it.
// A tensor-parallel run's checkpoint has tensor_parallel_size × world_size files per part, file
// (part × tensor_parallel_size + t) × world_size + r holding data-parallel rank r's shard of tensor
// rank t's part of each unit; a unit is listed once, with one part's shapes (every rank's are
// alike) and how each parameter was cut.
// A hybrid-sharded run's checkpoint (zero_optimization.hybrid_shard_size) holds each shard once:
// every shard group holds the same model state, so the first group's ranks write the files and
// the manifest is that of a run of the shard group's size (world_size), adding
// `hybrid_shard_size` (= world_size) and `hybrid_replicas` (how many groups held the shards). A
// reader that does not know the two keys reads it rightly as that smaller run's checkpoint.
// Invariant: the manifest is written last, after every rank file is complete and fsynced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "memory/shard_layout.h"
#include "checkpoint/tensor_split.h"
#include "engine/engine.h"

namespace zest {

// Bumped when a reader of the old version could not read the new one correctly.
// Note: a pipeline's checkpoint is version 1 too. Its keys (pipeline_stages, a unit's
// pipeline_stage) are written only when there are several pipeline stages, and a reader that does
// not know them still refuses it, never misreads it: it counts pipeline_stages × world_size files
// where it expects world_size. A hybrid run's is version 1 for a better reason: read without its
// keys it is a correct checkpoint of the shard group's size. A tensor-parallel one
// (tensor_parallel_size, a parameter's tensor_split; checkpoint/tensor_split.h) is version 1 for
// the pipeline's reason: its files number tensor_parallel_size times those a reader without the
// key expects.
inline constexpr int kCheckpointFormatVersion = 1;

struct CheckpointParam {
  std::string name;  // within its unit; the full name is "<unit>.<name>"
  std::vector<std::int64_t> shape;
  std::size_t offset = 0;  // first element in the unit's flat buffer
  std::size_t numel = 0;
  TensorSplit split;  // how the tensor ranks cut it (kWhole without tensor parallelism)
};

struct CheckpointUnit {
  std::string name;
  std::size_t numel = 0;
  std::size_t flat_length = 0;   // numel plus padding: world_size × shard_length
  std::size_t shard_length = 0;  // elements per rank
  std::vector<CheckpointParam> params;
  int pipeline_stage = 0;  // the part whose files hold it
};

struct CheckpointTensor {
  std::string name;  // a StateShard name: "params", "master", "optimizer.<k>"
  DType dtype = DType::kFloat32;
};

struct CheckpointFile {
  std::string name;  // "rank-<r>.bin"
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;
};

struct CheckpointManifest {
  int format_version = kCheckpointFormatVersion;
  std::string zest_version;
  std::int64_t step = 0;  // optimizer steps taken (TrainerCounters::steps_taken)
  int world_size = 1;       // ranks each unit is sharded over
  int pipeline_stages = 1;  // parts; files = pipeline_stages × tensor_parallel_size × world_size
  int hybrid_replicas = 1;  // shard groups that held these shards; only the first saved them
  int tensor_parallel_size = 1;  // ranks that each held a part of every unit, with files of its own
  int stage = 0;
  DType compute_dtype = DType::kFloat32;
  std::size_t shard_alignment = kDefaultShardAlignment;
  nlohmann::json config = nlohmann::json::object();  // the run's resolved config
  TrainerCounters counters;
  nlohmann::json extra = nlohmann::json::object();  // the caller's: the data position, ...
  std::vector<CheckpointUnit> units;
  std::vector<CheckpointTensor> tensors;
  std::vector<CheckpointFile> files;  // one per saving rank: part-major, then tensor rank
  // Set by read_manifest: manifest.json's own checksum, when it had one (then it matched); none
  // for a manifest written before zest checksummed manifests. Ignored when writing.
  std::optional<std::uint64_t> manifest_xxh3;

  // Byte offset of block (unit, tensor) in its part's rank files, and the length of a rank file
  // of part `part`.
  std::uint64_t block_offset(std::size_t unit, std::size_t tensor) const;
  std::uint64_t rank_file_bytes(int part = 0) const;
  // The file that holds shard `shard` of tensor rank `tensor_rank`'s part of `unit`.
  int file_of(std::size_t unit, int shard, int tensor_rank = 0) const {
    return (units.at(unit).pipeline_stage * tensor_parallel_size + tensor_rank) * world_size +
           shard;
  }
  // Index into `tensors`, or -1.
  int find_tensor(const std::string& name) const;
};

const char* zest_version();
std::string rank_file_name(int rank);
std::string step_directory_name(std::int64_t step);
// The step of a directory named "step-<N>"; -1 for any other name.
std::int64_t parse_step_directory_name(const std::string& name);

nlohmann::ordered_json manifest_to_json(const CheckpointManifest& manifest);
// Strict: a missing key or a wrong type is a kCheckpoint Error naming `source` and the key; a
// format version newer than this build reads is a kCheckpoint Error that says so.
CheckpointManifest manifest_from_json(const nlohmann::json& json, const std::string& source);

// The bytes of manifest.json: manifest_to_json indented, its last line
//   "manifest_xxh3": "<16 hex digits>"
// the XXH3-64 of every byte before that line, then "}" and a newline. The manifest also declares
// near its top that it carries the line ("checksum"), so a damaged last line cannot pass for a
// manifest written before checksums.
std::string manifest_text(const CheckpointManifest& manifest);

enum class ManifestChecksum {
  kRequire,  // a manifest that declares a checksum must end with one that matches its bytes
  kIgnore,   // parse regardless (a diagnosis of a manifest that failed, the fuzzer)
};
// Parses the text of a manifest file named `source`. With kRequire a checksum line that does not
// match is found before anything is parsed (one message for any changed bit); a manifest
// without the line and without the declaration (an older zest wrote it) is read as before.
CheckpointManifest parse_manifest(const std::string& text, const std::string& source,
                                  ManifestChecksum checksum = ManifestChecksum::kRequire);
// Reads and parses <dir>/manifest.json.
CheckpointManifest read_manifest(const std::string& dir,
                                 ManifestChecksum checksum = ManifestChecksum::kRequire);
// Writes manifest_text as <dir>/manifest.json, a new file, and fsyncs it; returns its size in
// bytes. `budget` as for HashingFileWriter.
std::uint64_t write_manifest(const std::string& dir, const CheckpointManifest& manifest,
                             std::optional<std::uint64_t>* budget = nullptr);

// The units and parameters of `layouts` in manifest form (world-size dependent lengths
// included); unit i in part parts[i] when `parts` is given.
std::vector<CheckpointUnit> describe_units(const std::vector<ShardLayout>& layouts,
                                           const std::vector<int>& parts = {});
// The trainer's placement (Trainer::checkpoint_placement), or a plain trainer's: one part, the
// whole model (layouts() in order) sharded over the world, the rank's shard its own. A kInternal
// Error when the placement does not fit the rank (its file would not be its world rank).
CheckpointPlacement placement_of(const Trainer& trainer, int rank, int world_size);
// Where the checkpoint's model and this one differ (unit names and order, parameter names and
// shapes), the first `limit` of them as readable lines; empty when they match.
std::vector<std::string> model_differences(const std::vector<CheckpointUnit>& checkpoint,
                                           const std::vector<ShardLayout>& model,
                                           std::size_t limit = 8);

}  // namespace zest
