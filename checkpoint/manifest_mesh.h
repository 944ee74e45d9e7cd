// The manifest's keys that say how the saving run's ranks were arranged (internal to
// checkpoint/): a pipeline's `pipeline_stages` and each unit's `pipeline_stage`, a hybrid run's
// `hybrid_shard_size` and `hybrid_replicas`, a tensor-parallel run's `tensor_parallel_size` and
// each cut parameter's `tensor_split` (checkpoint/tensor_split.h). Written only when they differ
// from a plain run's, so a plain checkpoint's manifest is what format version 1 always wrote; read
// strictly, and held against world_size and the number of files the manifest lists.
#pragma once

#include <cstddef>

#include <nlohmann/json.hpp>

#include "checkpoint/manifest.h"
#include "checkpoint/manifest_fields.h"

namespace zest {

// Writing: the top level's keys (they follow world_size), a unit's (they follow shard_length).
void write_mesh_keys(nlohmann::ordered_json& out, const CheckpointManifest& manifest);
void write_unit_mesh_keys(nlohmann::ordered_json& out, const CheckpointManifest& manifest,
                          const CheckpointUnit& unit);
void write_param_mesh_keys(nlohmann::ordered_json& out, const CheckpointParam& param);

// Reading, once world_size is read: the top level's keys into `manifest`, a unit's into `unit`.
void read_mesh_keys(const ManifestFields& top, CheckpointManifest& manifest);
void read_unit_mesh_keys(const ManifestFields& fields, const CheckpointManifest& manifest,
                         CheckpointUnit& unit);
// A parameter's, once its shape is read.
void read_param_mesh_keys(const ManifestFields& fields, const CheckpointManifest& manifest,
                          CheckpointParam& param);

// A kCheckpoint Error naming `files` when the manifest lists `listed` files where its mesh makes
// another number.
void check_file_count(const ManifestFields& top, std::size_t listed,
                      const CheckpointManifest& manifest);

}  // namespace zest
