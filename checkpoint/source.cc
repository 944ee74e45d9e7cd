#include "checkpoint/source.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "kernels/convert.h"

namespace zest {
namespace {

// Elements converted per pass when the saved dtype differs from the wanted one.
constexpr std::size_t kConvertChunk = std::size_t{1} << 18;

}  // namespace

CheckpointSource::CheckpointSource(std::string dir)
    : dir_(std::move(dir)), manifest_(read_manifest(dir_)) {
  files_.resize(manifest_.files.size());
}

CheckpointSource::~CheckpointSource() = default;

const ReadOnlyFile& CheckpointSource::file(int rank) const {
  auto& slot = files_.at(static_cast<std::size_t>(rank));
  if (!slot) {
    const std::string path =
        (std::filesystem::path(dir_) / manifest_.files[static_cast<std::size_t>(rank)].name)
            .string();
    if (!std::filesystem::exists(path)) {
      throw Error(ErrorKind::kCheckpoint,
                  path + ": missing (the manifest lists it): the checkpoint is incomplete; "
                         "restore the file or resume from another checkpoint");
    }
    slot = std::make_unique<ReadOnlyFile>(path);
  }
  return *slot;
}

void CheckpointSource::verify(int rank) const {
  const CheckpointFile& expected = manifest_.files.at(static_cast<std::size_t>(rank));
  const ReadOnlyFile& shard = file(rank);
  if (shard.size() != expected.bytes) {
    throw Error(ErrorKind::kCheckpoint,
                fmt::format("{}: {} bytes, the manifest says {} (truncated or replaced)",
                            shard.path(), shard.size(), expected.bytes));
  }
  const FileDigest digest = shard.digest();
  if (digest.xxh3 != expected.xxh3) {
    throw Error(ErrorKind::kCheckpoint,
                fmt::format("{}: checksum mismatch (xxh3 {} in the file, {} in the manifest): the "
                            "file is corrupt",
                            shard.path(), hex_digest(digest.xxh3), hex_digest(expected.xxh3)));
  }
}

void CheckpointSource::verify_all() const {
  for (std::size_t file = 0; file < manifest_.files.size(); ++file) verify(static_cast<int>(file));
}

std::vector<int> CheckpointSource::ranks_holding(std::size_t unit, std::size_t begin,
                                                 std::size_t end, int tensor_rank) const {
  const CheckpointUnit& u = manifest_.units.at(unit);
  end = std::min(end, u.numel);
  std::vector<int> ranks;
  if (begin >= end) return ranks;
  for (std::size_t r = begin / u.shard_length; r <= (end - 1) / u.shard_length; ++r) {
    ranks.push_back(manifest_.file_of(unit, static_cast<int>(r), tensor_rank));
  }
  return ranks;
}

void CheckpointSource::read(std::size_t unit, std::size_t tensor, std::size_t begin,
                            std::size_t end, void* destination, DType type, int tensor_rank) const {
  const CheckpointUnit& u = manifest_.units.at(unit);
  const CheckpointTensor& saved = manifest_.tensors.at(tensor);
  const std::size_t saved_size = dtype_size(saved.dtype);
  const std::size_t wanted_size = dtype_size(type);
  char* out = static_cast<char*>(destination);
  const std::size_t stored_end = std::min(end, u.numel);
  std::vector<char> staging;
  std::size_t e = begin;
  while (e < stored_end) {
    const int rank = manifest_.file_of(unit, static_cast<int>(e / u.shard_length), tensor_rank);
    const std::size_t within = e % u.shard_length;
    const std::size_t count = std::min(stored_end - e, u.shard_length - within);
    const std::uint64_t offset =
        manifest_.block_offset(unit, tensor) + std::uint64_t{within} * saved_size;
    char* target = out + (e - begin) * wanted_size;
    if (saved.dtype == type) {
      file(rank).read(offset, target, count * saved_size);
    } else {
      for (std::size_t done = 0; done < count; done += kConvertChunk) {
        const std::size_t now = std::min(kConvertChunk, count - done);
        staging.resize(now * saved_size);
        file(rank).read(offset + std::uint64_t{done} * saved_size, staging.data(), staging.size());
        cpu::convert(staging.data(), saved.dtype, target + done * wanted_size, type, now);
      }
    }
    e += count;
  }
  // Padding: zero in every float type.
  if (end > std::max(begin, stored_end)) {
    const std::size_t first = std::max(begin, stored_end);
    std::memset(out + (first - begin) * wanted_size, 0, (end - first) * wanted_size);
  }
}

int CheckpointSource::source_for(const std::string& name, DType type) const {
  const int params = manifest_.find_tensor("params");
  const int master = manifest_.find_tensor("master");
  if (name == "params") {
    if (manifest_.tensors[static_cast<std::size_t>(params)].dtype == type || master < 0)
      return params;
    return master;
  }
  if (name == "master") return master >= 0 ? master : params;
  return manifest_.find_tensor(name);
}

}  // namespace zest
