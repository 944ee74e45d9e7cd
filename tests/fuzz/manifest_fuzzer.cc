// Fuzzes the checkpoint manifest reader (checkpoint/manifest.h): read_manifest on a
// directory whose manifest.json holds the input, with its checksum checked and ignored (most
// changed inputs fail the checksum, and the parser behind it must hold up too). An accepted
// manifest must describe a layout the rest of zest can use without overflow: every unit's layout
// rebuilt at other world sizes (what zest-ckpt reshard does), its sizes consistent when
// recomputed without overflow, and the manifest written back (manifest_text) must read back,
// checksum checked, to the same rank file size.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "memory/shard_layout.h"
#include "checkpoint/manifest.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using Exact = unsigned __int128;  // sizes recomputed without wrapping around

// What an accepted manifest promises, recomputed exactly: every unit's flat length is world_size
// shard lengths and holds its numel, its parameters tile [0, numel), a cut parameter's rows are
// whole blocks, and every rank file's size is the sum of the blocks of its pipeline stage's units
// (each tensor rank's files alike).
void check_sizes(const zest::CheckpointManifest& manifest) {
  std::vector<Exact> file_bytes(static_cast<std::size_t>(manifest.pipeline_stages), 0);
  for (const zest::CheckpointUnit& unit : manifest.units) {
    zest::fuzz::check(Exact{unit.shard_length} * Exact(manifest.world_size) == unit.flat_length,
                      "flat_length is not world_size x shard_length");
    zest::fuzz::check(unit.numel <= unit.flat_length, "numel exceeds flat_length");
    Exact next = 0;
    for (const zest::CheckpointParam& param : unit.params) {
      Exact numel = 1;
      for (std::int64_t d : param.shape) numel *= Exact(static_cast<std::uint64_t>(d));
      zest::fuzz::check(numel == param.numel, "a parameter's numel is not its shape's product");
      zest::fuzz::check(param.offset == next, "parameters do not tile the unit");
      if (param.split.axis == zest::TensorSplit::Axis::kRows) {
        const zest::SplitParameter part{param.shape, param.split, manifest.tensor_parallel_size};
        zest::fuzz::check(part.rows() % param.split.block == 0,
                          "a cut's rows are not whole blocks");
      }
      next += numel;
    }
    zest::fuzz::check(next == unit.numel, "parameters do not add up to numel");
    for (const zest::CheckpointTensor& tensor : manifest.tensors) {
      file_bytes.at(static_cast<std::size_t>(unit.pipeline_stage)) +=
          Exact{unit.shard_length} * zest::dtype_size(tensor.dtype);
    }
  }
  const auto part_files = static_cast<std::size_t>(manifest.world_size) *
                          static_cast<std::size_t>(manifest.tensor_parallel_size);
  zest::fuzz::check(manifest.files.size() == file_bytes.size() * part_files,
                    "the files are not world_size x pipeline_stages x tensor_parallel_size");
  for (std::size_t f = 0; f < manifest.files.size(); ++f) {
    zest::fuzz::check(manifest.files[f].bytes == file_bytes[f / part_files],
                      "a file's size differs from the layout's");
  }
}

void rebuild_layouts(const zest::CheckpointManifest& manifest) {
  for (const zest::CheckpointUnit& unit : manifest.units) {
    std::vector<zest::ParamShape> params;
    for (const zest::CheckpointParam& p : unit.params) params.push_back({p.name, p.shape});
    for (int world : {1, 3, 4, manifest.world_size}) {
      try {
        const zest::ShardLayout layout =
            zest::ShardLayout::build(unit.name, params, world, manifest.shard_alignment);
        zest::fuzz::check(layout.numel() == unit.numel, "the layout's numel differs");
        zest::fuzz::check(layout.flat_length() >= layout.numel(), "flat_length < numel");
      } catch (const zest::Error&) {
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static zest::fuzz::ScratchFile file("manifest.json");
  file.write(zest::fuzz::bytes_of(data, size));
  try {
    const zest::CheckpointManifest checked = zest::read_manifest(file.dir());
    check_sizes(checked);
  } catch (const zest::Error&) {
  }
  zest::CheckpointManifest manifest;
  try {
    manifest = zest::read_manifest(file.dir(), zest::ManifestChecksum::kIgnore);
  } catch (const zest::Error&) {
    return 0;
  }
  check_sizes(manifest);
  const std::uint64_t bytes = manifest.rank_file_bytes();
  rebuild_layouts(manifest);
  try {
    const zest::CheckpointManifest again =
        zest::parse_manifest(zest::manifest_text(manifest), "written");
    zest::fuzz::check(again.manifest_xxh3.has_value(), "the written manifest has no checksum");
    zest::fuzz::check(again.rank_file_bytes() == bytes, "the written manifest differs");
  } catch (const zest::Error& error) {
    std::fprintf(stderr, "an accepted manifest, written back, is refused: %s\n", error.what());
    std::abort();
  }
  return 0;
}
