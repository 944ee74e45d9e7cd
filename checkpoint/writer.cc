#include "checkpoint/writer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>

#include <fmt/format.h>
#include <xxhash.h>

#include "base/durable_file.h"
#include "base/error.h"
#include "checkpoint/agreement.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/state_shard_copies.h"

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

// The layouts() entries this rank writes, in the whole model's order: its part's units, each
// once (a lent copy belongs to its lender's part).
std::vector<std::size_t> saved_units(const CheckpointPlacement& placement) {
  std::vector<std::size_t> saved;
  for (std::size_t i = 0; i < placement.local_units.size(); ++i) {
    if (placement.unit_parts[placement.local_units[i]] == placement.part) saved.push_back(i);
  }
  std::sort(saved.begin(), saved.end(), [&](std::size_t a, std::size_t b) {
    return placement.local_units[a] < placement.local_units[b];
  });
  const auto part_units = static_cast<std::size_t>(
      std::count(placement.unit_parts.begin(), placement.unit_parts.end(), placement.part));
  if (saved.size() != part_units) {
    throw Error(ErrorKind::kInternal,
                fmt::format("pipeline stage {} holds {} of its {} units", placement.part,
                            saved.size(), part_units));
  }
  return saved;
}

// Hands `out` this rank's shard of its units' state tensors, unit by unit, tensor by tensor: the
// bytes of its rank file.
void stream_rank_state(const RankContext& context, Trainer& trainer,
                       const CheckpointPlacement& placement,
                       const std::vector<CheckpointTensor>& tensors,
                       const std::function<void(const void*, std::size_t)>& out) {
  const std::vector<ShardLayout>& layouts = trainer.layouts();
  for (std::size_t u : saved_units(placement)) {
    if (layouts[u].shard_length() != placement.units[placement.local_units[u]].shard_length()) {
      throw Error(ErrorKind::kInternal,
                  "unit '" + layouts[u].unit_name() + "' is sharded over other ranks than its part");
    }
    const std::vector<StateShard> shards = trainer.state_shards(u);
    const bool same = shards.size() == tensors.size() &&
                      std::equal(shards.begin(), shards.end(), tensors.begin(),
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
      const std::size_t size = dtype_size(shard.dtype);
      read_state_elements(context, shard, 0, shard.end - shard.begin,
                          [&](const void* host, std::size_t, std::size_t count) {
                            out(host, count * size);
                          });
    }
  }
}

FileDigest write_rank_file(const RankContext& context, Trainer& trainer,
                           const CheckpointPlacement& placement,
                           const std::vector<CheckpointTensor>& tensors, const std::string& path,
                           std::optional<std::uint64_t>* budget) {
  HashingFileWriter writer(path, budget);
  stream_rank_state(context, trainer, placement, tensors,
                    [&](const void* bytes, std::size_t size) { writer.write(bytes, size); });
  return writer.finish();
}

// What write_rank_file would write, hashed and not written: a hybrid run's other shard groups
// hold the same shards as the first, which writes them.
FileDigest hash_rank_state(const RankContext& context, Trainer& trainer,
                           const CheckpointPlacement& placement,
                           const std::vector<CheckpointTensor>& tensors) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                  &XXH3_freeState);
  if (!state) throw Error(ErrorKind::kInternal, "XXH3_createState failed");
  XXH3_64bits_reset(state.get());
  FileDigest digest;
  stream_rank_state(context, trainer, placement, tensors,
                    [&](const void* bytes, std::size_t size) {
                      XXH3_64bits_update(state.get(), bytes, size);
                      digest.bytes += size;
                    });
  digest.xxh3 = XXH3_64bits_digest(state.get());
  return digest;
}

// The world rank that holds shard `shard` of part `part` in shard group `replica`.
int world_rank_of(const CheckpointPlacement& p, int part, int replica, int shard) {
  return (part * p.replicas + replica) * p.shards + shard;
}

// The manifest's files: shard group 0's, in file order (part-major). Every other group's rank
// hashed the same state; a digest that differs from its group-0 twin's means the replicas
// drifted apart (their gradients stopped being all-reduced alike), and saving one of them would
// silently drop the others: a kInternal Error naming both ranks, and nothing is saved.
std::vector<CheckpointFile> saved_files(const CheckpointPlacement& p,
                                        const std::vector<PhaseRecord>& written) {
  std::vector<CheckpointFile> files;
  for (int part = 0; part < p.parts; ++part) {
    for (int shard = 0; shard < p.shards; ++shard) {
      const auto first = static_cast<std::size_t>(world_rank_of(p, part, 0, shard));
      const PhaseRecord& saved = written.at(first);
      files.push_back({rank_file_name(part * p.shards + shard), saved.bytes, saved.xxh3});
      for (int replica = 1; p.replicas_agree && replica < p.replicas; ++replica) {
        const int rank = world_rank_of(p, part, replica, shard);
        const PhaseRecord& twin = written.at(static_cast<std::size_t>(rank));
        if (twin.bytes == saved.bytes && twin.xxh3 == saved.xxh3) continue;
        throw Error(ErrorKind::kInternal,
                    fmt::format("hybrid sharding's replicas disagree: rank {} holds another state "
                                "than rank {} for the same shard (xxh3 {} and {}); nothing was "
                                "saved",
                                rank, world_rank_of(p, part, 0, shard), hex_digest(twin.xxh3),
                                hex_digest(saved.xxh3)));
      }
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

// Removes a directory when destroyed, unless kept (or given no path).
class TemporaryDirectory {
 public:
  TemporaryDirectory() = default;
  ~TemporaryDirectory() {
    if (!path_.empty()) remove_directory_quietly(path_);
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  void hold(std::string path) { path_ = std::move(path); }
  void keep() { path_.clear(); }

 private:
  std::string path_;
};

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

SavedCheckpoint save_checkpoint(RankContext& context, Trainer& trainer,
                                const CheckpointOptions& options, const nlohmann::json& config,
                                const nlohmann::json& extra) {
  const TrainerCounters counters = trainer.counters();
  const std::string root = options.dir;
  const std::string final_name = step_directory_name(counters.steps_taken);
  const std::string what = "saving checkpoint " + join(root, final_name);
  const bool leader = context.rank == 0;

  std::optional<std::uint64_t> budget;
  if (options.fail_rank < 0 || options.fail_rank == context.rank) {
    budget =
        options.fail_after_bytes ? options.fail_after_bytes : checkpoint_fault_from_environment();
  }

  // Phase 1: rank 0 makes the temporary directory; its name reaches every rank.
  // Note: rank 0 removes it on any way out but publishing it — also when a collective throws
  // because a peer failed or timed out.
  TemporaryDirectory guard;
  PhaseRecord record;
  std::optional<Error> failure;
  if (leader) {
    failure = capture(record, [&] {
      if (root.empty()) throw Error(ErrorKind::kUsage, "no checkpoint directory given");
      std::error_code error;
      fs::create_directories(root, error);
      if (error) {
        throw Error(ErrorKind::kIo, "cannot create directory " + root + ": " + error.message());
      }
      remove_leftovers(root);
      const std::string temporary = ".tmp-" + final_name + "-" + random_tag();
      make_directory(join(root, temporary));
      guard.hold(join(root, temporary));
      record.set_text(temporary);
    });
  }
  const PhaseRecord prepared = share_record(context, record, 0, failure);
  raise_if_failed({prepared}, failure, what);
  const std::string temporary = join(root, prepared.get_text());

  // Phase 2: every rank writes and fsyncs its own file; with hybrid sharding, the first shard
  // group's ranks, while the others hash the same state for rank 0 to hold against it.
  const std::vector<CheckpointTensor> tensors = state_tensors(trainer);
  CheckpointPlacement placement;
  record = PhaseRecord{};
  failure = capture(record, [&] {
    placement = placement_of(trainer, context.rank, context.world_size);
    const int file = placement.part * placement.shards + placement.shard;
    const FileDigest digest =
        placement.replica == 0
            ? write_rank_file(context, trainer, placement, tensors,
                              join(temporary, rank_file_name(file)), &budget)
        : placement.replicas_agree ? hash_rank_state(context, trainer, placement, tensors)
                                   : FileDigest{};
    record.bytes = digest.bytes;
    record.xxh3 = digest.xxh3;
  });
  const std::vector<PhaseRecord> written = exchange_records(context, record, failure);
  raise_if_failed(written, failure, what);

  // Phase 3: rank 0 writes the manifest, publishes the directory, then moves `latest`.
  SavedCheckpoint saved{join(root, final_name), counters.steps_taken, 0, {}};
  record = PhaseRecord{};
  if (leader) {
    bool published = false;
    bool replaced = false;
    failure = capture(record, [&] {
      CheckpointManifest manifest;
      manifest.zest_version = zest_version();
      manifest.step = counters.steps_taken;
      manifest.world_size = placement.shards;
      manifest.pipeline_stages = placement.parts;
      manifest.hybrid_replicas = placement.replicas;
      manifest.stage = trainer.stage();
      manifest.compute_dtype = trainer.options().compute_dtype;
      manifest.shard_alignment = trainer.options().shard_alignment;
      manifest.config = config;
      manifest.counters = counters;
      manifest.extra = extra;
      manifest.units = describe_units(placement.units, placement.unit_parts);
      manifest.tensors = tensors;
      manifest.files = saved_files(placement, written);
      std::uint64_t total = 0;
      for (const CheckpointFile& file : manifest.files) total += file.bytes;
      total += write_manifest(temporary, manifest, &budget);
      fsync_directory(temporary);
      replaced = publish_directory(temporary, saved.path);
      published = true;
      guard.keep();
      fsync_directory(root);
      replace_file_atomically(root, "latest", final_name + "\n", &budget);
      record.bytes = total;
    });
    // Not yet named by `latest`: a step directory that is not the last good checkpoint goes too
    // (unless it replaced one of the same step, which `latest` may already name).
    if (failure && published && !replaced && !names(root, final_name)) {
      remove_directory_quietly(saved.path);
    }
  }
  const PhaseRecord finished = share_record(context, record, 0, failure);
  raise_if_failed({finished}, failure, what);
  saved.bytes = finished.bytes;
  // After the others have returned: removing old checkpoints may take a while and they need not
  // wait for it.
  if (leader) saved.warnings = prune(root, final_name, options.keep_last);
  return saved;
}

}  // namespace zest
