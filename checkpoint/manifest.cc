#include "checkpoint/manifest.h"

#include <filesystem>
#include <limits>
#include <optional>
#include <string_view>
#include <variant>

#include <fmt/format.h>
#include <xxhash.h>

#include "base/error.h"
#include "base/json_depth.h"
#include "base/printable.h"
#include "base/strict_json.h"
#include "checkpoint/files.h"

// Note: the build does not yet pass the project version to the sources; until it does
// (target_compile_definitions(zest PRIVATE ZEST_VERSION="${PROJECT_VERSION}")), this copy of
// CMakeLists.txt's project(VERSION) stands in.
#ifndef ZEST_VERSION
#define ZEST_VERSION "0.1.0"
#endif

namespace zest {
namespace {

using json = nlohmann::json;

// The checksum's declaration near the top of a manifest and its line at the end (manifest_text).
constexpr const char* kChecksumKey = "checksum";
constexpr const char* kChecksumRule =
    "xxh3-64 of the bytes before the last line, which holds it as manifest_xxh3";
constexpr std::string_view kChecksumLineHead = "  \"manifest_xxh3\": \"";
constexpr std::string_view kChecksumLineTail = "\"\n}\n";
constexpr std::size_t kChecksumLineBytes = kChecksumLineHead.size() + 16 + kChecksumLineTail.size();

struct ChecksumLine {
  std::uint64_t recorded = 0;  // what the line says
  std::uint64_t actual = 0;    // what the bytes before it hash to
};

// The checksum line `text` ends with, exactly as manifest_text writes it; nothing otherwise.
std::optional<ChecksumLine> checksum_line(std::string_view text) {
  if (text.size() < kChecksumLineBytes) return std::nullopt;
  const std::size_t body = text.size() - kChecksumLineBytes;
  const std::string_view line = text.substr(body);
  if (!line.starts_with(kChecksumLineHead) || !line.ends_with(kChecksumLineTail)) {
    return std::nullopt;
  }
  const auto recorded = parse_hex_digest(std::string(line.substr(kChecksumLineHead.size(), 16)));
  if (!recorded) return std::nullopt;
  return ChecksumLine{*recorded, XXH3_64bits(text.data(), body)};
}

// Strict access to a manifest: every failure names the file and the JSON path.
class Fields {
 public:
  Fields(const json& value, std::string source, std::string path)
      : value_(value), source_(std::move(source)), path_(std::move(path)) {
    if (!value_.is_object()) fail("is not an object");
  }

  const json& at(const std::string& key) const {
    auto found = value_.find(key);
    if (found == value_.end()) fail_key(key, "is missing");
    return *found;
  }
  std::string path(const std::string& key) const { return join_json_path(path_, key); }

  std::string string(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_string()) fail_key(key, "must be a string");
    return v.get<std::string>();
  }
  std::int64_t integer(const std::string& key, std::int64_t min = 0,
                       std::int64_t max = std::numeric_limits<std::int64_t>::max()) const {
    const json& v = at(key);
    if (!v.is_number_integer()) fail_key(key, "must be an integer");
    // An unsigned above int64's range would wrap to a negative number in get<std::int64_t>().
    constexpr auto kLargest = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > kLargest) {
      fail_key(key, fmt::format("is {}, outside [{}, {}]", v.get<std::uint64_t>(), min, max));
    }
    const auto n = v.get<std::int64_t>();
    if (n < min || n > max) fail_key(key, fmt::format("is {}, outside [{}, {}]", n, min, max));
    return n;
  }
  double number(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_number()) fail_key(key, "must be a number");
    return v.get<double>();
  }
  const json& array(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_array()) fail_key(key, "must be an array");
    return v;
  }
  const json& object(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_object()) fail_key(key, "must be an object");
    return v;
  }
  DType dtype(const std::string& key) const {
    const std::string name = string(key);
    for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      if (name == dtype_name(d)) return d;
    }
    fail_key(key, "is '" + printable(name) + "', not one of fp32, bf16, fp16");
  }

  [[noreturn]] void fail_key(const std::string& key, const std::string& what) const {
    throw Error(ErrorKind::kCheckpoint, source_ + ": " + path(key) + " " + what);
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(
        ErrorKind::kCheckpoint,
        source_ + ": " + (path_.empty() ? std::string("the manifest") : path_) + " " + what);
  }

 private:
  const json& value_;
  std::string source_;
  std::string path_;
};

// a × b, or nothing when the product does not fit 64 bits.
std::optional<std::uint64_t> product(std::uint64_t a, std::uint64_t b) {
  std::uint64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) return std::nullopt;
  return result;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

std::uint64_t CheckpointManifest::block_offset(std::size_t unit, std::size_t tensor) const {
  const int part = unit < units.size() ? units[unit].pipeline_stage : 0;
  std::uint64_t offset = 0;
  for (std::size_t u = 0; u < units.size() && u <= unit; ++u) {
    if (units[u].pipeline_stage != part) continue;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      if (u == unit && t == tensor) return offset;
      offset += std::uint64_t{units[u].shard_length} * dtype_size(tensors[t].dtype);
    }
  }
  return offset;
}

std::uint64_t CheckpointManifest::rank_file_bytes(int part) const {
  std::uint64_t bytes = 0;
  for (const CheckpointUnit& unit : units) {
    if (unit.pipeline_stage != part) continue;
    for (const CheckpointTensor& tensor : tensors) {
      bytes += std::uint64_t{unit.shard_length} * dtype_size(tensor.dtype);
    }
  }
  return bytes;
}

int CheckpointManifest::find_tensor(const std::string& name) const {
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].name == name) return static_cast<int>(t);
  }
  return -1;
}

const char* zest_version() { return ZEST_VERSION; }

std::string rank_file_name(int rank) { return "rank-" + std::to_string(rank) + ".bin"; }

std::string step_directory_name(std::int64_t step) { return "step-" + std::to_string(step); }

std::int64_t parse_step_directory_name(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  if (name.size() - prefix.size() > 18) return -1;
  std::int64_t step = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

nlohmann::ordered_json manifest_to_json(const CheckpointManifest& m) {
  nlohmann::ordered_json out;
  out["format"] = "zest-checkpoint";
  out["format_version"] = m.format_version;
  out[kChecksumKey] = kChecksumRule;
  out["zest_version"] = m.zest_version;
  out["step"] = m.step;
  out["world_size"] = m.world_size;
  // Only a pipeline's: a plain checkpoint's manifest is what format version 1 wrote.
  if (m.pipeline_stages > 1) out["pipeline_stages"] = m.pipeline_stages;
  out["stage"] = m.stage;
  out["compute_dtype"] = dtype_name(m.compute_dtype);
  out["shard_alignment"] = m.shard_alignment;
  const LossScalerState& s = m.counters.loss_scaler;
  out["counters"] = {{"steps_taken", m.counters.steps_taken},
                     {"optimizer_steps", m.counters.optimizer_steps},
                     {"loss_scaler",
                      {{"scale", s.scale},
                       {"hysteresis_left", s.hysteresis_left},
                       {"iteration", s.iteration},
                       {"last_overflow", s.last_overflow},
                       {"skipped", s.skipped}}}};
  out["extra"] = m.extra;
  out["tensors"] = nlohmann::ordered_json::array();
  for (const CheckpointTensor& t : m.tensors) {
    out["tensors"].push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}});
  }
  out["units"] = nlohmann::ordered_json::array();
  for (const CheckpointUnit& u : m.units) {
    nlohmann::ordered_json params = nlohmann::ordered_json::array();
    for (const CheckpointParam& p : u.params) {
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
    }
    nlohmann::ordered_json unit = {{"name", u.name},
                                   {"numel", u.numel},
                                   {"flat_length", u.flat_length},
                                   {"shard_length", u.shard_length}};
    if (m.pipeline_stages > 1) unit["pipeline_stage"] = u.pipeline_stage;
    unit["params"] = std::move(params);
    out["units"].push_back(std::move(unit));
  }
  out["files"] = nlohmann::ordered_json::array();
  for (const CheckpointFile& f : m.files) {
    out["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3", hex_digest(f.xxh3)}});
  }
  out["config"] = m.config;
  return out;
}

CheckpointManifest manifest_from_json(const json& value, const std::string& source) {
  const Fields top(value, source, "");
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
  if (value.contains("pipeline_stages")) {
    m.pipeline_stages =
        static_cast<int>(top.integer("pipeline_stages", 1, (1 << 24) / m.world_size));
  }
  m.stage = static_cast<int>(top.integer("stage", 0, 3));
  m.compute_dtype = top.dtype("compute_dtype");
  m.shard_alignment = static_cast<std::size_t>(top.integer("shard_alignment", 1));
  m.config = top.at("config");
  m.extra = top.at("extra");

  const Fields counters(top.object("counters"), source, "counters");
  m.counters.steps_taken = counters.integer("steps_taken");
  m.counters.optimizer_steps = counters.integer("optimizer_steps");
  const Fields scaler(counters.object("loss_scaler"), source, "counters.loss_scaler");
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
    const Fields f(tensors[t], source, fmt::format("tensors[{}]", t));
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
      product(static_cast<std::uint64_t>(m.world_size), m.shard_alignment);
  if (!quantum) {
    top.fail_key("shard_alignment", fmt::format("is {}: times world_size {} it exceeds 64 bits",
                                                m.shard_alignment, m.world_size));
  }
  const json& units = top.array("units");
  std::uint64_t rank_bytes = 0;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::string path = fmt::format("units[{}]", u);
    const Fields f(units[u], source, path);
    CheckpointUnit unit;
    unit.name = f.string("name");
    unit.numel = static_cast<std::size_t>(f.integer("numel", 1));
    unit.flat_length = static_cast<std::size_t>(f.integer("flat_length", 1));
    unit.shard_length = static_cast<std::size_t>(f.integer("shard_length", 1));
    if (m.pipeline_stages > 1 || units[u].contains("pipeline_stage")) {
      unit.pipeline_stage = static_cast<int>(f.integer("pipeline_stage", 0, m.pipeline_stages - 1));
    }
    const std::optional<std::uint64_t> padded =
        product(unit.numel / *quantum + (unit.numel % *quantum != 0), *quantum);
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
      const std::optional<std::uint64_t> block = product(unit.shard_length,
                                                         dtype_size(tensor.dtype));
      if (!block || *block > std::numeric_limits<std::int64_t>::max() - rank_bytes) {
        f.fail("makes rank files larger than 2^63 bytes");
      }
      rank_bytes += *block;
    }
    const json& params = f.array("params");
    std::size_t next = 0;
    for (std::size_t p = 0; p < params.size(); ++p) {
      const Fields pf(params[p], source, fmt::format("{}.params[{}]", path, p));
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
            product(param.numel, static_cast<std::uint64_t>(param.shape.back()));
        if (!numel || *numel > unit.numel) {
          pf.fail_key("shape", fmt::format("has more elements than the unit's numel ({})",
                                           unit.numel));
        }
        param.numel = *numel;
      }
      param.offset = static_cast<std::size_t>(pf.integer("offset"));
      if (param.offset != next) pf.fail_key("offset", "does not follow the previous parameter");
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
  const auto file_count = static_cast<std::size_t>(m.world_size) * m.pipeline_stages;
  if (files.size() != file_count) {
    top.fail_key("files", m.pipeline_stages == 1
                              ? fmt::format("lists {} files for world_size {}", files.size(),
                                            m.world_size)
                              : fmt::format("lists {} files for world_size {} × pipeline_stages {}",
                                            files.size(), m.world_size, m.pipeline_stages));
  }
  for (std::size_t r = 0; r < files.size(); ++r) {
    const Fields f(files[r], source, fmt::format("files[{}]", r));
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
    const int part = static_cast<int>(r / static_cast<std::size_t>(m.world_size));
    if (file.bytes != m.rank_file_bytes(part)) {
      f.fail_key("bytes", fmt::format("is {}; the units and tensors make {}", file.bytes,
                                      m.rank_file_bytes(part)));
    }
    m.files.push_back(std::move(file));
  }
  return m;
}

std::string manifest_text(const CheckpointManifest& manifest) {
  std::string text = manifest_to_json(manifest).dump(2);
  // dump(2) ends an object with "\n}"; the checksum line becomes its last member.
  if (!text.ends_with("\n}")) throw Error(ErrorKind::kInternal, "a manifest is not a JSON object");
  text.resize(text.size() - 2);
  text += ",\n";
  const std::string digest = hex_digest(XXH3_64bits(text.data(), text.size()));
  text += kChecksumLineHead;
  text += digest;
  text += kChecksumLineTail;
  return text;
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

std::uint64_t write_manifest(const std::string& dir, const CheckpointManifest& manifest,
                             std::optional<std::uint64_t>* budget) {
  const std::string text = manifest_text(manifest);
  HashingFileWriter writer((std::filesystem::path(dir) / "manifest.json").string(), budget);
  writer.write(text.data(), text.size());
  return writer.finish().bytes;
}

std::vector<CheckpointUnit> describe_units(const std::vector<ShardLayout>& layouts,
                                           const std::vector<int>& parts) {
  std::vector<CheckpointUnit> units;
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    const ShardLayout& layout = layouts[u];
    CheckpointUnit unit{
        layout.unit_name(), layout.numel(), layout.flat_length(), layout.shard_length(), {}};
    for (const ParamSlot& slot : layout.params()) {
      unit.params.push_back({slot.name, slot.shape, slot.offset, slot.numel});
    }
    unit.pipeline_stage = u < parts.size() ? parts[u] : 0;
    units.push_back(std::move(unit));
  }
  return units;
}

CheckpointPlacement placement_of(const Trainer& trainer, int rank, int world_size) {
  std::optional<CheckpointPlacement> given = trainer.checkpoint_placement();
  if (!given) {
    CheckpointPlacement plain;
    plain.shards = world_size;
    plain.shard = rank;
    plain.units = trainer.layouts();
    plain.unit_parts.assign(plain.units.size(), 0);
    for (std::size_t u = 0; u < plain.units.size(); ++u) plain.local_units.push_back(u);
    return plain;
  }
  const CheckpointPlacement& p = *given;
  bool fits = p.parts >= 1 && p.shards >= 1 && p.parts * p.shards == world_size &&
              p.part * p.shards + p.shard == rank && p.unit_parts.size() == p.units.size() &&
              p.local_units.size() == trainer.layouts().size();
  for (std::size_t i = 0; fits && i < p.local_units.size(); ++i) {
    fits = p.local_units[i] < p.units.size() &&
           p.units[p.local_units[i]].unit_name() == trainer.layouts()[i].unit_name();
  }
  if (!fits) {
    throw Error(ErrorKind::kInternal,
                fmt::format("the trainer's checkpoint placement does not fit rank {} of {}", rank,
                            world_size));
  }
  return p;
}

std::vector<std::string> model_differences(const std::vector<CheckpointUnit>& checkpoint,
                                           const std::vector<ShardLayout>& model,
                                           std::size_t limit) {
  std::vector<std::string> lines;
  std::size_t total = 0;
  auto add = [&](std::string line) {
    if (total++ < limit) lines.push_back(std::move(line));
  };
  if (checkpoint.size() != model.size()) {
    add(fmt::format("the checkpoint has {} units, this model {}", checkpoint.size(), model.size()));
  }
  for (std::size_t u = 0; u < std::min(checkpoint.size(), model.size()); ++u) {
    const CheckpointUnit& saved = checkpoint[u];
    const ShardLayout& here = model[u];
    // Names from the checkpoint are the file's text: shown printable.
    const std::string unit = printable(saved.name);
    if (saved.name != here.unit_name()) {
      add(fmt::format("unit {}: '{}' in the checkpoint, '{}' here", u, unit, here.unit_name()));
      continue;
    }
    const auto& params = here.params();
    for (std::size_t p = 0; p < std::max(saved.params.size(), params.size()); ++p) {
      if (p >= params.size()) {
        add(fmt::format("{}.{}: in the checkpoint, not in this model", unit,
                        printable(saved.params[p].name)));
      } else if (p >= saved.params.size()) {
        add(fmt::format("{}.{}: in this model, not in the checkpoint", unit, params[p].name));
      } else if (saved.params[p].name != params[p].name) {
        add(fmt::format("{}: parameter {} is '{}' in the checkpoint, '{}' here", unit, p,
                        printable(saved.params[p].name), params[p].name));
      } else if (saved.params[p].shape != params[p].shape) {
        add(fmt::format("{}.{}: shape {} in the checkpoint, {} here", unit, params[p].name,
                        shape_text(saved.params[p].shape), shape_text(params[p].shape)));
      }
    }
  }
  if (total > limit) lines.push_back(fmt::format("and {} more", total - limit));
  return lines;
}

}  // namespace zest
