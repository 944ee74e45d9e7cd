#include "checkpoint/manifest_mesh.h"

#include <fmt/format.h>

namespace zest {

namespace {

constexpr int kMostRanks = 1 << 24;

}  // namespace

void write_mesh_keys(nlohmann::ordered_json& out, const CheckpointManifest& m) {
  // Only a pipeline's and a hybrid run's: a plain checkpoint's manifest is what format version 1
  // wrote.
  if (m.pipeline_stages > 1) out["pipeline_stages"] = m.pipeline_stages;
  if (m.hybrid_replicas > 1) {
    out["hybrid_shard_size"] = m.world_size;
    out["hybrid_replicas"] = m.hybrid_replicas;
  }
}

void write_unit_mesh_keys(nlohmann::ordered_json& out, const CheckpointManifest& m,
                          const CheckpointUnit& unit) {
  if (m.pipeline_stages > 1) out["pipeline_stage"] = unit.pipeline_stage;
}

void read_mesh_keys(const ManifestFields& top, CheckpointManifest& m) {
  if (top.has("pipeline_stages")) {
    m.pipeline_stages =
        static_cast<int>(top.integer("pipeline_stages", 1, kMostRanks / m.world_size));
  }
  if (!top.has("hybrid_shard_size") && !top.has("hybrid_replicas")) return;
  // Note: both or neither, and the shard size is world_size: the files are one shard group's, so
  // a manifest that says otherwise describes files this checkpoint does not have.
  const std::int64_t shard_size = top.integer("hybrid_shard_size", 1, kMostRanks);
  if (shard_size != m.world_size) {
    top.fail_key("hybrid_shard_size",
                 fmt::format("is {} but world_size is {}: a hybrid run's checkpoint holds one "
                             "shard group's files, so the two must be equal; the manifest is "
                             "damaged or was edited: resume from another checkpoint",
                             shard_size, m.world_size));
  }
  m.hybrid_replicas = static_cast<int>(
      top.integer("hybrid_replicas", 2, kMostRanks / (m.world_size * m.pipeline_stages)));
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
  if (m.hybrid_replicas > 1) {
    top.fail_key("files", fmt::format("lists {} files, but a hybrid run's checkpoint holds one "
                                      "shard group's: world_size {} × pipeline_stages {} = {} "
                                      "(of {} replicas); the manifest is damaged or was edited: "
                                      "resume from another checkpoint",
                                      listed, m.world_size, m.pipeline_stages, file_count,
                                      m.hybrid_replicas));
  }
  top.fail_key("files", m.pipeline_stages == 1
                            ? fmt::format("lists {} files for world_size {}", listed, m.world_size)
                            : fmt::format("lists {} files for world_size {} × pipeline_stages {}",
                                          listed, m.world_size, m.pipeline_stages));
}

}  // namespace zest
