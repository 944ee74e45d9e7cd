// Reading a manifest: the strict parse of manifest.json (checksum first, then every key and size
// checked against the others), so that nothing computed from an accepted manifest can overflow or
// claim bytes its files do not have.
#include <filesystem>
#include <limits>
#include <optional>
#include <variant>

#include <fmt/format.h>

#include "base/error.h"
#include "base/json_depth.h"
#include "base/printable.h"
#include "base/strict_json.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/manifest_checksum.h"
#include "checkpoint/manifest_fields.h"
#include "checkpoint/manifest_mesh.h"

namespace zest {

using json = nlohmann::json;

CheckpointManifest manifest_from_json(const nlohmann::json& value, const std::string& source) {
  const ManifestFields top(value, source, "");
  CheckpointManifest m;
  if (top.string("format") != "zest-checkpoint") top.fail_key("format", "is not 'zest-checkpoint'");
  m.format_version = static_cast<int>(top.integer("format_version", 1));
  if (m.format_version > kCheckpointFormatVersion) {
    throw Error(ErrorKind::kCheckpoint,
                fmt::format("{}: checkpoint format version {} is newer than this zest ({}) reads "
                            "(version {}); use a newer zest",
                            source, m.format_version, zest_version(), kCheckpointFormatVersion));
  }
  if (value.contains(kChecksumKey) && top.string(kChecksumKey) != kChecksumRule) {
    top.fail_key(kChecksumKey, "is not the rule this zest checks ('" + std::string(kChecksumRule) +
                                   "')");
  }
  m.zest_version = top.string("zest_version");
  m.step = top.integer("step");
  m.world_size = static_cast<int>(top.integer("world_size", 1, 1 << 24));
  read_mesh_keys(top, m);
  m.stage = static_cast<int>(top.integer("stage", 0, 3));
  m.compute_dtype = top.dtype("compute_dtype");
  m.shard_alignment = static_cast<std::size_t>(top.integer("shard_alignment", 1));
  m.config = top.at("config");
  m.extra = top.at("extra");

  const ManifestFields counters(top.object("counters"), source, "counters");
  m.counters.steps_taken = counters.integer("steps_taken");
  m.counters.optimizer_steps = counters.integer("optimizer_steps");
  const ManifestFields scaler(counters.object("loss_scaler"), source, "counters.loss_scaler");
  // Note: a double outside float's range would become inf here, and inf is written back as
  // JSON null, so a manifest rewritten from this one (zest-ckpt reshard) would not load.
  const double scale = scaler.number("scale");
  if (!(scale >= std::numeric_limits<float>::min() && scale <= std::numeric_limits<float>::max())) {
    scaler.fail_key("scale", fmt::format("is {}, not a positive float", scale));
  }
  m.counters.loss_scaler.scale = static_cast<float>(scale);
  m.counters.loss_scaler.hysteresis_left = static_cast<int>(scaler.integer(
      "hysteresis_left", std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  m.counters.loss_scaler.iteration = scaler.integer("iteration");
  m.counters.loss_scaler.last_overflow = scaler.integer("last_overflow", -1);
  m.counters.loss_scaler.skipped = scaler.integer("skipped");

  const json& tensors = top.array("tensors");
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const ManifestFields f(tensors[t], source, fmt::format("tensors[{}]", t));
    m.tensors.push_back({f.string("name"), f.dtype("dtype")});
    if (m.find_tensor(m.tensors.back().name) != static_cast<int>(t)) {
      f.fail_key("name", "'" + printable(m.tensors.back().name) + "' appears twice");
    }
  }
  if (m.find_tensor("params") != 0) top.fail_key("tensors", "must start with 'params'");

  // Note: every size is checked in arithmetic that cannot wrap, and each unit's layout must be
  // the one ShardLayout makes (numel padded to a multiple of world_size × shard_alignment), so
  // nothing computed from an accepted manifest later (block offsets, rank file sizes, a
  // reshard's layouts) can overflow, and a manifest cannot claim sizes its files do not have.
  const std::optional<std::uint64_t> quantum =
      checked_product(static_cast<std::uint64_t>(m.world_size), m.shard_alignment);
  if (!quantum) {
    top.fail_key("shard_alignment", fmt::format("is {}: times world_size {} it exceeds 64 bits",
                                                m.shard_alignment, m.world_size));
  }
  const json& units = top.array("units");
  std::uint64_t rank_bytes = 0;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::string path = fmt::format("units[{}]", u);
    const ManifestFields f(units[u], source, path);
    CheckpointUnit unit;
    unit.name = f.string("name");
    unit.numel = static_cast<std::size_t>(f.integer("numel", 1));
    unit.flat_length = static_cast<std::size_t>(f.integer("flat_length", 1));
    unit.shard_length = static_cast<std::size_t>(f.integer("shard_length", 1));
    read_unit_mesh_keys(f, m, unit);
    const std::optional<std::uint64_t> padded =
        checked_product(unit.numel / *quantum + (unit.numel % *quantum != 0), *quantum);
    if (!padded || unit.flat_length != *padded) {
      f.fail_key("flat_length",
                 fmt::format("is {}; numel {} padded to a multiple of world_size × "
                             "shard_alignment ({}) is {}",
                             unit.flat_length, unit.numel, *quantum,
                             padded ? std::to_string(*padded) : "past 64 bits"));
    }
    const std::size_t shard = unit.flat_length / static_cast<std::size_t>(m.world_size);
    if (unit.shard_length != shard) {
      f.fail_key("shard_length",
                 fmt::format("is {}, not flat_length / world_size ({})", unit.shard_length, shard));
    }
    for (const CheckpointTensor& tensor : m.tensors) {
      const std::optional<std::uint64_t> block =
          checked_product(unit.shard_length, dtype_size(tensor.dtype));
      if (!block || *block > std::numeric_limits<std::int64_t>::max() - rank_bytes) {
        f.fail("makes rank files larger than 2^63 bytes");
      }
      rank_bytes += *block;
    }
    const json& params = f.array("params");
    std::size_t next = 0;
    for (std::size_t p = 0; p < params.size(); ++p) {
      const ManifestFields pf(params[p], source, fmt::format("{}.params[{}]", path, p));
      CheckpointParam param;
      param.name = pf.string("name");
      const json& shape = pf.array("shape");
      param.numel = 1;
      for (const json& d : shape) {
        if (!d.is_number_integer() || d.get<std::int64_t>() < 1) {
          pf.fail_key("shape", "must hold positive integers");
        }
        param.shape.push_back(d.get<std::int64_t>());
        const std::optional<std::uint64_t> numel =
            checked_product(param.numel, static_cast<std::uint64_t>(param.shape.back()));
        if (!numel || *numel > unit.numel) {
          pf.fail_key("shape", fmt::format("has more elements than the unit's numel ({})",
                                           unit.numel));
        }
        param.numel = *numel;
      }
      param.offset = static_cast<std::size_t>(pf.integer("offset"));
      if (param.offset != next) pf.fail_key("offset", "does not follow the previous parameter");
      read_param_mesh_keys(pf, m, param);
      if (param.numel > unit.numel - next) {
        f.fail_key("numel", "is less than the sum of its parameters' sizes");
      }
      next = param.offset + param.numel;
      unit.params.push_back(std::move(param));
    }
    if (next != unit.numel) f.fail_key("numel", "is not the sum of its parameters' sizes");
    m.units.push_back(std::move(unit));
  }

  const json& files = top.array("files");
  check_file_count(top, files.size(), m);
  for (std::size_t r = 0; r < files.size(); ++r) {
    const ManifestFields f(files[r], source, fmt::format("files[{}]", r));
    CheckpointFile file;
    file.name = f.string("name");
    if (file.name != rank_file_name(static_cast<int>(r))) {
      f.fail_key("name", "is '" + printable(file.name) + "', expected '" +
                             rank_file_name(static_cast<int>(r)) + "'");
    }
    file.bytes = static_cast<std::uint64_t>(f.integer("bytes"));
    const auto hash = parse_hex_digest(f.string("xxh3"));
    if (!hash) f.fail_key("xxh3", "is not 16 hex digits");
    file.xxh3 = *hash;
    // Files are part-major, then tensor rank (CheckpointManifest::file_of).
    const int part =
        static_cast<int>(r / (static_cast<std::size_t>(m.world_size) * m.tensor_parallel_size));
    if (file.bytes != m.rank_file_bytes(part)) {
      f.fail_key("bytes", fmt::format("is {}; the units and tensors make {}", file.bytes,
                                      m.rank_file_bytes(part)));
    }
    m.files.push_back(std::move(file));
  }
  return m;
}

CheckpointManifest parse_manifest(const std::string& text, const std::string& source,
                                  ManifestChecksum checksum) {
  const bool require = checksum == ManifestChecksum::kRequire;
  // Note: the checksum comes first, so that a changed bit anywhere gets this one message, not
  // whatever the changed JSON happens to break.
  const std::optional<ChecksumLine> line = checksum_line(text);
  if (require && line && line->recorded != line->actual) {
    throw Error(ErrorKind::kCheckpoint,
                fmt::format("{}: checksum mismatch (xxh3 {} of its bytes, {} on its last line): "
                            "the manifest is corrupt or was edited",
                            source, hex_digest(line->actual), hex_digest(line->recorded)));
  }
  auto parsed = parse_strict_json(text);
  if (const auto* fault = std::get_if<JsonFault>(&parsed)) {
    switch (fault->kind) {
      case JsonFault::Kind::kTooDeep:
        throw Error(ErrorKind::kCheckpoint,
                    fmt::format("{}: nests deeper than {} levels (a manifest nests about 5): not "
                                "a zest manifest",
                                source, kMaxJsonDepth));
      case JsonFault::Kind::kDuplicateKey:
        // The key is the file's text: shown printable.
        throw Error(ErrorKind::kCheckpoint, printable(strict_json_message(*fault, source)));
      case JsonFault::Kind::kNumberOutOfRange:
      case JsonFault::Kind::kSyntax:
        // The parser's message quotes the bytes it stopped at.
        throw Error(ErrorKind::kCheckpoint,
                    source + ": not valid JSON (" + printable(fault->parser_message) + ")");
    }
  }
  const json& value = std::get<json>(parsed);
  CheckpointManifest manifest = manifest_from_json(value, source);
  if (line) {
    manifest.manifest_xxh3 = line->recorded;
  } else if (require && (value.contains(kChecksumKey) || value.contains("manifest_xxh3"))) {
    // Note: a manifest with neither key was written before checksums and is read unchecked; one
    // with either has lost its last line to corruption or an edit.
    throw Error(ErrorKind::kCheckpoint,
                fmt::format("{}: declares a checksum but does not end with its line "
                            "(\"manifest_xxh3\": \"<16 hex digits>\", then }}): the manifest is "
                            "corrupt or was edited",
                            source));
  }
  if (!require) manifest.manifest_xxh3.reset();
  return manifest;
}

CheckpointManifest read_manifest(const std::string& dir, ManifestChecksum checksum) {
  const std::string path = (std::filesystem::path(dir) / "manifest.json").string();
  return parse_manifest(read_text_file(path, kMaxManifestBytes, "a manifest"), path, checksum);
}

}  // namespace zest
