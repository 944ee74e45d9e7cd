#include "checkpoint/writer.h"

#include <memory>

#include <xxhash.h>

#include "base/error.h"
#include "checkpoint/agreement.h"
#include "checkpoint/files.h"
#include "checkpoint/save_phases.h"

namespace zest {
namespace {

// This rank's file: written (shard group 0), or what it would hold, hashed and not written (a
// hybrid run's other shard groups hold the same shards as the first, which writes them).
FileDigest save_rank_file(const RankContext& context, Trainer& trainer,
                          const SaveDescription& save, const std::string& temporary,
                          std::optional<std::uint64_t>* budget) {
  switch (rank_file_role(save.placement)) {
    case RankFileRole::kWrite: {
      HashingFileWriter writer(rank_file_path(temporary, save.placement), budget);
      stream_rank_state(context, trainer, save,
                        [&](const void* bytes, std::size_t size) { writer.write(bytes, size); });
      return writer.finish();
    }
    case RankFileRole::kHash: {
      std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                      &XXH3_freeState);
      if (!state) throw Error(ErrorKind::kInternal, "XXH3_createState failed");
      XXH3_64bits_reset(state.get());
      FileDigest digest;
      stream_rank_state(context, trainer, save, [&](const void* bytes, std::size_t size) {
        XXH3_64bits_update(state.get(), bytes, size);
        digest.bytes += size;
      });
      digest.xxh3 = XXH3_64bits_digest(state.get());
      return digest;
    }
    case RankFileRole::kNone:
      break;
  }
  return FileDigest{};
}

}  // namespace

SavedCheckpoint save_checkpoint(RankContext& context, Trainer& trainer,
                                const CheckpointOptions& options, const nlohmann::json& config,
                                const nlohmann::json& extra) {
  std::optional<std::uint64_t> budget = save_budget(context, options);
  const SaveDescription save = describe_save(context, trainer, options, config, extra);

  // Phase 1: rank 0 makes the temporary directory; its name reaches every rank.
  // Note: rank 0 removes it on any way out but publishing it — also when a collective throws
  // because a peer failed or timed out.
  TemporaryDirectory guard;
  const std::string temporary = prepare_save(context, save, guard);

  // Phase 2: every rank writes and fsyncs its own file; with hybrid sharding, the first shard
  // group's ranks, while the others hash the same state for rank 0 to hold against it.
  PhaseRecord record;
  const std::optional<Error> failure = capture(record, [&] {
    const FileDigest digest = save_rank_file(context, trainer, save, temporary, &budget);
    record.bytes = digest.bytes;
    record.xxh3 = digest.xxh3;
  });
  const std::vector<PhaseRecord> written = exchange_records(context, record, failure);
  raise_if_failed(written, failure, save.what);

  // Phase 3: rank 0 writes the manifest, publishes the directory, then moves `latest`.
  return publish_save(context, save, temporary, written, guard, &budget, options.keep_last);
}

}  // namespace zest
