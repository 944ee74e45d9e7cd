// Writing a manifest: the JSON of a CheckpointManifest, its text with the checksum line, the file.
#include <filesystem>

#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/manifest_checksum.h"
#include "checkpoint/manifest_mesh.h"

namespace zest {

nlohmann::ordered_json manifest_to_json(const CheckpointManifest& m) {
  nlohmann::ordered_json out;
  out["format"] = "zest-checkpoint";
  out["format_version"] = m.format_version;
  out[kChecksumKey] = kChecksumRule;
  out["zest_version"] = m.zest_version;
  out["step"] = m.step;
  out["world_size"] = m.world_size;
  write_mesh_keys(out, m);
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
      nlohmann::ordered_json param = {{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}};
      write_param_mesh_keys(param, p);
      params.push_back(std::move(param));
    }
    nlohmann::ordered_json unit = {{"name", u.name},
                                   {"numel", u.numel},
                                   {"flat_length", u.flat_length},
                                   {"shard_length", u.shard_length}};
    write_unit_mesh_keys(unit, m, u);
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

std::string manifest_text(const CheckpointManifest& manifest) {
  return append_checksum_line(manifest_to_json(manifest).dump(2));
}

std::uint64_t write_manifest(const std::string& dir, const CheckpointManifest& manifest,
                             std::optional<std::uint64_t>* budget) {
  const std::string text = manifest_text(manifest);
  HashingFileWriter writer((std::filesystem::path(dir) / "manifest.json").string(), budget);
  writer.write(text.data(), text.size());
  return writer.finish().bytes;
}

}  // namespace zest
