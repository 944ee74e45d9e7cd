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
  if (m.tensor_parallel_size > 1) out["tensor_parallel_size"] = m.tensor_parallel_size;
  if (m.hybrid_replicas > 1) {
    out["hybrid_shard_size"] = m.world_size;
    out["hybrid_replicas"] = m.hybrid_replicas;
  }
}

void write_unit_mesh_keys(nlohmann::ordered_json& out, const CheckpointManifest& m,
                          const CheckpointUnit& unit) {
  if (m.pipeline_stages > 1) out["pipeline_stage"] = unit.pipeline_stage;
}

void write_param_mesh_keys(nlohmann::ordered_json& out, const CheckpointParam& param) {
  const TensorSplit& split = param.split;
  if (split.axis == TensorSplit::Axis::kWhole) return;
  nlohmann::ordered_json cut = {{"axis", axis_name(split.axis)}};
  if (split.axis == TensorSplit::Axis::kRows) {
    cut["block"] = split.block;
    cut["stride"] = split.stride;
  }
  out["tensor_split"] = std::move(cut);
}

void read_mesh_keys(const ManifestFields& top, CheckpointManifest& m) {
  if (top.has("pipeline_stages")) {
    m.pipeline_stages =
        static_cast<int>(top.integer("pipeline_stages", 1, kMostRanks / m.world_size));
  }
  if (top.has("tensor_parallel_size")) {
    m.tensor_parallel_size = static_cast<int>(
        top.integer("tensor_parallel_size", 1, kMostRanks / (m.world_size * m.pipeline_stages)));
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
      top.integer("hybrid_replicas", 2,
                  kMostRanks / (m.world_size * m.pipeline_stages * m.tensor_parallel_size)));
}

void read_unit_mesh_keys(const ManifestFields& fields, const CheckpointManifest& m,
                         CheckpointUnit& unit) {
  if (m.pipeline_stages > 1 || fields.has("pipeline_stage")) {
    unit.pipeline_stage =
        static_cast<int>(fields.integer("pipeline_stage", 0, m.pipeline_stages - 1));
  }
}

void read_param_mesh_keys(const ManifestFields& fields, const CheckpointManifest& m,
                          CheckpointParam& param) {
  if (!fields.has("tensor_split")) return;
  if (m.tensor_parallel_size == 1) {
    fields.fail_key("tensor_split",
                    "is given, but the checkpoint has no tensor_parallel_size: a "
                    "parameter is cut only among tensor-parallel ranks");
  }
  const ManifestFields cut(fields.object("tensor_split"), fields.source(),
                           fields.path("tensor_split"));
  const std::string axis = cut.string("axis");
  const SplitParameter part{param.shape, {}, m.tensor_parallel_size};
  if (axis == "columns") {
    if (param.shape.size() != 2) cut.fail_key("axis", "is 'columns' for a parameter not 2-D");
    param.split = {TensorSplit::Axis::kColumns, 0, 0};
    return;
  }
  if (axis != "rows") cut.fail_key("axis", "is '" + axis + "', not 'rows' or 'columns'");
  const std::int64_t rows = part.rows();
  const std::int64_t block = cut.integer("block", 1, rows);
  const std::int64_t stride = cut.integer("stride");
  // Note: stride = size × block, tested by division: the product of two read numbers may not fit.
  const bool one_block = stride == 0 && block == rows;
  const bool per_rank = stride != 0 && stride % m.tensor_parallel_size == 0 &&
                        stride / m.tensor_parallel_size == block;
  if (rows % block != 0 || !(one_block || per_rank) || param.shape.size() > 2) {
    cut.fail(
        fmt::format("cuts {} rows in blocks of {} at a stride of {}: a part is whole blocks, "
                    "one (stride 0) or one per tensor_parallel_size × block rows",
                    rows, block, stride));
  }
  param.split = {TensorSplit::Axis::kRows, block, stride};
}

void check_file_count(const ManifestFields& top, std::size_t listed, const CheckpointManifest& m) {
  const auto file_count =
      static_cast<std::size_t>(m.world_size) * m.pipeline_stages * m.tensor_parallel_size;
  if (listed == file_count) return;
  if (m.tensor_parallel_size > 1) {
    top.fail_key("files",
                 fmt::format("lists {} files for world_size {} × pipeline_stages {} × "
                             "tensor_parallel_size {}",
                             listed, m.world_size, m.pipeline_stages, m.tensor_parallel_size));
  }
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
