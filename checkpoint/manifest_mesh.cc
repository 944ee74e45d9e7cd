#include "checkpoint/manifest_mesh.h"

#include <fmt/format.h>

namespace zest {

void write_mesh_keys(nlohmann::ordered_json& out, const CheckpointManifest& m) {
  // Only a pipeline's: a plain checkpoint's manifest is what format version 1 wrote.
  if (m.pipeline_stages > 1) out["pipeline_stages"] = m.pipeline_stages;
}

void write_unit_mesh_keys(nlohmann::ordered_json& out, const CheckpointManifest& m,
                          const CheckpointUnit& unit) {
  if (m.pipeline_stages > 1) out["pipeline_stage"] = unit.pipeline_stage;
}

void read_mesh_keys(const ManifestFields& top, CheckpointManifest& m) {
  if (top.has("pipeline_stages")) {
    m.pipeline_stages =
        static_cast<int>(top.integer("pipeline_stages", 1, (1 << 24) / m.world_size));
  }
}

void read_unit_mesh_keys(const ManifestFields& fields, const CheckpointManifest& m,
                         CheckpointUnit& unit) {
  if (m.pipeline_stages > 1 || fields.has("pipeline_stage")) {
    unit.pipeline_stage =
        static_cast<int>(fields.integer("pipeline_stage", 0, m.pipeline_stages - 1));
  }
}

void check_file_count(const ManifestFields& top, std::size_t listed, const CheckpointManifest& m) {
  const auto file_count = static_cast<std::size_t>(m.world_size) * m.pipeline_stages;
  if (listed == file_count) return;
  top.fail_key("files", m.pipeline_stages == 1
                            ? fmt::format("lists {} files for world_size {}", listed, m.world_size)
                            : fmt::format("lists {} files for world_size {} × pipeline_stages {}",
                                          listed, m.world_size, m.pipeline_stages));
}

}  // namespace zest
