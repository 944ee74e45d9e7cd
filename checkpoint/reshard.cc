#include "checkpoint/reshard.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "base/durable_file.h"
#include "base/error.h"
#include "memory/shard_layout.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "checkpoint/source.h"
#include "engine/stage_plan.h"

namespace zest {
namespace {

namespace fs = std::filesystem;

// Elements copied per read when rewriting a shard.
constexpr std::size_t kChunkElements = std::size_t{1} << 20;

std::vector<ShardLayout> layouts_for(const CheckpointManifest& manifest, int world_size) {
  std::vector<ShardLayout> layouts;
  for (const CheckpointUnit& unit : manifest.units) {
    std::vector<ParamShape> params;
    for (const CheckpointParam& p : unit.params) params.push_back({p.name, p.shape});
    layouts.push_back(ShardLayout::build(unit.name, params, world_size, manifest.shard_alignment));
  }
  return layouts;
}

}  // namespace

ReshardResult reshard_checkpoint(const std::string& source_path, const std::string& out,
                                 int world_size, std::optional<int> stage) {
  if (world_size < 1) {
    throw Error(ErrorKind::kUsage,
                "the new world size must be at least 1, not " + std::to_string(world_size));
  }
  if (stage && !StagePlan::valid(*stage)) {
    throw Error(ErrorKind::kUsage, "the stage must be 0, 1, 2 or 3, not " + std::to_string(*stage));
  }
  std::error_code error;
  if (fs::exists(out, error)) throw Error(ErrorKind::kUsage, out + " already exists");

  const CheckpointSource source(resolve_checkpoint(source_path));
  source.verify_all();
  const CheckpointManifest& old = source.manifest();
  CheckpointManifest manifest = old;
  // The output is plain (one part, one replica): it loads into a trainer of any mesh all the same.
  manifest.world_size = world_size;
  manifest.pipeline_stages = 1;
  manifest.hybrid_replicas = 1;  // one copy of each shard was read: the output is its only one
  manifest.stage = stage.value_or(old.stage);
  manifest.units = describe_units(layouts_for(old, world_size));
  for (std::size_t u = 0; u < manifest.units.size(); ++u) {
    // Each tensor rank's part is resharded on its own: the cut stays the saved one.
    for (std::size_t p = 0; p < manifest.units[u].params.size(); ++p) {
      manifest.units[u].params[p].split = old.units[u].params[p].split;
    }
  }
  manifest.files.clear();

  const fs::path target = fs::absolute(out);
  const fs::path parent = target.parent_path();
  fs::create_directories(parent, error);
  const std::string temporary =
      (parent / (".tmp-" + target.filename().string() + "-" + random_tag())).string();
  fs::create_directory(temporary, error);
  if (error) {
    throw Error(ErrorKind::kIo, "cannot create directory " + temporary + ": " + error.message());
  }
  ReshardResult result{target.string(), world_size, manifest.stage, 0};
  try {
    std::vector<char> buffer;
    for (int file = 0; file < manifest.tensor_parallel_size * world_size; ++file) {
      const int tensor_rank = file / world_size;
      const int rank = file % world_size;
      HashingFileWriter writer((fs::path(temporary) / rank_file_name(file)).string(), nullptr);
      for (std::size_t u = 0; u < manifest.units.size(); ++u) {
        const std::size_t length = manifest.units[u].shard_length;
        const std::size_t first = static_cast<std::size_t>(rank) * length;
        for (std::size_t t = 0; t < manifest.tensors.size(); ++t) {
          const DType dtype = manifest.tensors[t].dtype;
          for (std::size_t done = 0; done < length; done += kChunkElements) {
            const std::size_t now = std::min(kChunkElements, length - done);
            buffer.resize(now * dtype_size(dtype));
            source.read(u, t, first + done, first + done + now, buffer.data(), dtype, tensor_rank);
            writer.write(buffer.data(), buffer.size());
          }
        }
      }
      const FileDigest digest = writer.finish();
      manifest.files.push_back({rank_file_name(file), digest.bytes, digest.xxh3});
      result.bytes += digest.bytes;
    }
    result.bytes += write_manifest(temporary, manifest);
    fsync_directory(temporary);
    if (publish_directory(temporary, target.string())) {
      throw Error(ErrorKind::kUsage, out + " appeared while resharding; it was replaced");
    }
    fsync_directory(parent.string());
  } catch (...) {
    remove_directory_quietly(temporary);
    throw;
  }
  return result;
}

}  // namespace zest
