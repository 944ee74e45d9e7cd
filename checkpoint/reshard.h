// Offline resharding: rewrites a checkpoint for another world size (and records another stage),
// without a trainer, by flat-coordinate arithmetic on the saved shards (checkpoint_source.h).
// The result loads at the new world size straight from each rank's own file. A tensor-parallel
// checkpoint keeps its tensor-parallel size: each tensor rank's part is resharded on its own (a
// run at another tensor-parallel size loads it all the same, checkpoint/tensor_parallel_reads.h).
// Invariant: the output directory appears whole or not at all, and the source is verified before it
// is read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zest {

struct ReshardResult {
  std::string path;
  int world_size = 1;
  int stage = 0;
  std::uint64_t bytes = 0;
};

// `source`: a checkpoint directory or a root with `latest`. `out` must not exist; it becomes a
// checkpoint directory. The shard alignment is the source's. kUsage Error for a world size below
// 1, a stage outside 0-3, or an existing `out`.
ReshardResult reshard_checkpoint(const std::string& source, const std::string& out, int world_size,
                                 std::optional<int> stage = std::nullopt);

}  // namespace zest
