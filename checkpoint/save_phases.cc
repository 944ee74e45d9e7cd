#include "checkpoint/save_phases.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "base/durable_file.h"
#include "base/error.h"
#include "checkpoint/state_shard_copies.h"
#include "engine/state_bytes.h"

namespace zest {
namespace {

namespace fs = std::filesystem;

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// The state tensors every unit must expose alike: unit 0's names and dtypes.
std::vector<CheckpointTensor> state_tensors(Trainer& trainer) {
  std::vector<CheckpointTensor> tensors;
  for (const StateShard& shard : trainer.state_shards(0))
    tensors.push_back({shard.name, shard.dtype});
  return tensors;
}

// The world rank that holds shard `shard` of tensor rank `tensor_rank`'s part of part `part` in
// shard group `replica`.
int world_rank_of(const CheckpointPlacement& p, int part, int replica, int shard,
                  int tensor_rank = 0) {
  return ((part * p.replicas + replica) * p.shards + shard) * p.tensor_ranks + tensor_rank;
}

// The file number of a rank's shard: part-major, then tensor rank.
int file_number(const CheckpointPlacement& p, int part, int tensor_rank, int shard) {
  return (part * p.tensor_ranks + tensor_rank) * p.shards + shard;
}

// The saved units as the manifest lists them, each parameter with the rule its tensor ranks cut
// it by (rank 0's slices: the rule is the same for every rank).
std::vector<CheckpointUnit> saved_unit_descriptions(const CheckpointPlacement& p) {
  std::vector<CheckpointUnit> units = describe_units(p.units, p.unit_parts);
  if (p.tensor_ranks == 1) return units;
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (std::size_t i = 0; i < units[u].params.size(); ++i) {
      CheckpointParam& param = units[u].params[i];
      param.split = split_of(p.slices.at(u).at(i), param.shape, p.tensor_rank, p.tensor_ranks,
                             units[u].name + "." + param.name);
    }
  }
  return units;
}

// The files of one tensor rank's part of pipeline stage `part`, each shard's, from shard group 0;
// every other group's twin must have hashed the same bytes (below).
void add_part_files(const CheckpointPlacement& p, int part, int tensor_rank,
                    const std::vector<PhaseRecord>& written, std::vector<CheckpointFile>& files) {
  for (int shard = 0; shard < p.shards; ++shard) {
    const int first = world_rank_of(p, part, 0, shard, tensor_rank);
    const PhaseRecord& saved = written.at(static_cast<std::size_t>(first));
    files.push_back(
        {rank_file_name(file_number(p, part, tensor_rank, shard)), saved.bytes, saved.xxh3});
    for (int replica = 1; p.replicas_agree && replica < p.replicas; ++replica) {
      const int rank = world_rank_of(p, part, replica, shard, tensor_rank);
      const PhaseRecord& twin = written.at(static_cast<std::size_t>(rank));
      if (twin.bytes == saved.bytes && twin.xxh3 == saved.xxh3) continue;
      throw Error(ErrorKind::kInternal,
                  fmt::format("hybrid sharding's replicas disagree: rank {} holds another state "
                              "than rank {} for the same shard (xxh3 {} and {}); nothing was "
                              "saved",
                              rank, first, hex_digest(twin.xxh3), hex_digest(saved.xxh3)));
    }
  }
}

// The manifest's files: shard group 0's, in file order (part-major). Every other group's rank
// hashed the same state; a digest that differs from its group-0 twin's means the replicas
// drifted apart (their gradients stopped being all-reduced alike), and saving one of them would
// silently drop the others: a kInternal Error naming both ranks, and nothing is saved.
std::vector<CheckpointFile> saved_files(const CheckpointPlacement& p,
                                        const std::vector<PhaseRecord>& written) {
  std::vector<CheckpointFile> files;
  for (int part = 0; part < p.parts; ++part) {
    for (int tensor_rank = 0; tensor_rank < p.tensor_ranks; ++tensor_rank) {
      add_part_files(p, part, tensor_rank, written, files);
    }
  }
  return files;
}

// Removes what earlier saves left when they crashed: temporary and half-removed directories, a
// temporary `latest`.
void remove_leftovers(const std::string& root) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-step-", 0) == 0 || name.rfind(".trash-", 0) == 0) {
      remove_directory_quietly(entry.path().string());
    } else if (name.rfind(".latest.tmp-", 0) == 0) {
      fs::remove(entry.path(), error);
    }
  }
}

// keep_last: the new checkpoint and the keep_last - 1 newest others stay.
std::vector<std::string> prune(const std::string& root, const std::string& kept, int keep_last) {
  std::vector<std::string> warnings;
  if (keep_last <= 0) return warnings;
  std::vector<std::pair<std::int64_t, std::string>> steps;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    const std::int64_t step = parse_step_directory_name(name);
    if (step >= 0 && name != kept && entry.is_directory(error)) steps.emplace_back(step, name);
  }
  std::sort(steps.rbegin(), steps.rend());
  for (std::size_t i = static_cast<std::size_t>(keep_last - 1); i < steps.size(); ++i) {
    if (!remove_directory_quietly(join(root, steps[i].second))) {
      warnings.push_back("could not remove the old checkpoint " + join(root, steps[i].second));
    }
  }
  return warnings;
}

// Whether <root>/latest names `step` (it may, when only the fsync after its rename failed).
bool names(const std::string& root, const std::string& step) {
  try {
    return read_text_file(join(root, "latest"), kMaxLatestBytes, "the latest pointer") == step + "\n";
  } catch (const Error&) {
    return false;
  }
}

void make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0) {
    throw Error(ErrorKind::kIo, "cannot create directory " + path + ": " + std::strerror(errno));
  }
}

}  // namespace

TemporaryDirectory::~TemporaryDirectory() {
  if (!path_.empty()) remove_directory_quietly(path_);
}

SaveDescription describe_save(const RankContext& context, Trainer& trainer,
                              const CheckpointOptions& options, const nlohmann::json& config,
                              const nlohmann::json& extra) {
  SaveDescription save;
  save.root = options.dir;
  save.counters = trainer.counters();
  save.final_name = step_directory_name(save.counters.steps_taken);
  save.what = "saving checkpoint " + join(save.root, save.final_name);
  save.stage = trainer.stage();
  save.compute_dtype = trainer.options().compute_dtype;
  save.shard_alignment = trainer.options().shard_alignment;
  save.config = config;
  save.extra = extra;
  save.tensors = state_tensors(trainer);
  save.placement = placement_of(trainer, context.rank, context.world_size);
  return save;
}

std::optional<std::uint64_t> save_budget(const RankContext& context,
                                         const CheckpointOptions& options) {
  if (options.fail_rank >= 0 && options.fail_rank != context.rank) return std::nullopt;
  return options.fail_after_bytes ? options.fail_after_bytes : checkpoint_fault_from_environment();
}

std::string prepare_save(RankContext& context, const SaveDescription& save,
                         TemporaryDirectory& guard) {
  PhaseRecord record;
  std::optional<Error> failure;
  if (context.rank == 0) {
    failure = capture(record, [&] {
      if (save.root.empty()) throw Error(ErrorKind::kUsage, "no checkpoint directory given");
      std::error_code error;
      fs::create_directories(save.root, error);
      if (error) {
        throw Error(ErrorKind::kIo,
                    "cannot create directory " + save.root + ": " + error.message());
      }
      remove_leftovers(save.root);
      const std::string temporary = ".tmp-" + save.final_name + "-" + random_tag();
      make_directory(join(save.root, temporary));
      guard.hold(join(save.root, temporary));
      record.set_text(temporary);
    });
  }
  const PhaseRecord prepared = share_record(context, record, 0, failure);
  raise_if_failed({prepared}, failure, save.what);
  return join(save.root, prepared.get_text());
}

std::size_t rank_state_bytes(Trainer& trainer, const SaveDescription& save) {
  return state_bytes(trainer, saved_units(save.placement));
}

std::vector<StateShard> rank_state_shards(Trainer& trainer, const SaveDescription& save) {
  const CheckpointPlacement& placement = save.placement;
  const std::vector<ShardLayout>& layouts = trainer.layouts();
  std::vector<StateShard> in_file_order;
  for (std::size_t u : saved_units(placement)) {
    if (layouts[u].shard_length() != placement.units[placement.local_units[u]].shard_length()) {
      throw Error(ErrorKind::kInternal,
                  "unit '" + layouts[u].unit_name() + "' is sharded over other ranks than its part");
    }
    const std::vector<StateShard> shards = trainer.state_shards(u);
    const bool same = shards.size() == save.tensors.size() &&
                      std::equal(shards.begin(), shards.end(), save.tensors.begin(),
                                 [](const StateShard& s, const CheckpointTensor& t) {
                                   return s.name == t.name && s.dtype == t.dtype;
                                 });
    if (!same) {
      throw Error(ErrorKind::kInternal,
                  "unit '" + layouts[u].unit_name() + "' exposes other state tensors than unit 0");
    }
    for (const StateShard& shard : shards) {
      if (shard.end - shard.begin != layouts[u].shard_length()) {
        throw Error(ErrorKind::kInternal, "state tensor '" + shard.name + "' of unit '" +
                                              layouts[u].unit_name() + "' is not one shard long");
      }
      in_file_order.push_back(shard);
    }
  }
  return in_file_order;
}

void stream_rank_state(const RankContext& context, Trainer& trainer, const SaveDescription& save,
                       const std::function<void(const void*, std::size_t)>& out) {
  for (const StateShard& shard : rank_state_shards(trainer, save)) {
    const std::size_t size = dtype_size(shard.dtype);
    read_state_elements(
        context, shard, 0, shard.end - shard.begin,
        [&](const void* host, std::size_t, std::size_t count) { out(host, count * size); });
  }
}

RankFileRole rank_file_role(const CheckpointPlacement& placement) {
  if (placement.replica == 0) return RankFileRole::kWrite;
  return placement.replicas_agree ? RankFileRole::kHash : RankFileRole::kNone;
}

std::string rank_file_path(const std::string& temporary, const CheckpointPlacement& placement) {
  return join(temporary, rank_file_name(file_number(placement, placement.part,
                                                    placement.tensor_rank, placement.shard)));
}

SavedCheckpoint publish_save(RankContext& context, const SaveDescription& save,
                             const std::string& temporary,
                             const std::vector<PhaseRecord>& written, TemporaryDirectory& guard,
                             std::optional<std::uint64_t>* budget, int keep_last) {
  const bool leader = context.rank == 0;
  SavedCheckpoint saved{join(save.root, save.final_name), save.counters.steps_taken, 0, {}};
  PhaseRecord record;
  std::optional<Error> failure;
  if (leader) {
    bool published = false;
    bool replaced = false;
    failure = capture(record, [&] {
      const CheckpointPlacement& placement = save.placement;
      CheckpointManifest manifest;
      manifest.zest_version = zest_version();
      manifest.step = save.counters.steps_taken;
      manifest.world_size = placement.shards;
      manifest.pipeline_stages = placement.parts;
      manifest.hybrid_replicas = placement.replicas;
      manifest.tensor_parallel_size = placement.tensor_ranks;
      manifest.stage = save.stage;
      manifest.compute_dtype = save.compute_dtype;
      manifest.shard_alignment = save.shard_alignment;
      manifest.config = save.config;
      manifest.counters = save.counters;
      manifest.extra = save.extra;
      manifest.units = saved_unit_descriptions(placement);
      manifest.tensors = save.tensors;
      manifest.files = saved_files(placement, written);
      std::uint64_t total = 0;
      for (const CheckpointFile& file : manifest.files) total += file.bytes;
      total += write_manifest(temporary, manifest, budget);
      fsync_directory(temporary);
      replaced = publish_directory(temporary, saved.path);
      published = true;
      guard.keep();
      fsync_directory(save.root);
      replace_file_atomically(save.root, "latest", save.final_name + "\n", budget);
      record.bytes = total;
    });
    // Not yet named by `latest`: a step directory that is not the last good checkpoint goes too
    // (unless it replaced one of the same step, which `latest` may already name).
    if (failure && published && !replaced && !names(save.root, save.final_name)) {
      remove_directory_quietly(saved.path);
    }
  }
  const PhaseRecord finished = share_record(context, record, 0, failure);
  raise_if_failed({finished}, failure, save.what);
  saved.bytes = finished.bytes;
  // After the others have returned: removing old checkpoints may take a while and they need not
  // wait for it.
  if (leader) saved.warnings = prune(save.root, save.final_name, keep_last);
  return saved;
}

}  // namespace zest
