// Host access to the Trainer's state views (StateShard::data) for checkpoints and parameter
// import, wherever the views live. On the CPU device the host works on the view itself, in one
// piece; on a device whose memory is not host memory the elements pass through a host buffer of
// at most kStateCopyChunkBytes, copied on the rank's comm stream, so saving a multi-GiB shard
// never holds a second copy of it on the host. Invariant: call between steps, after
// Trainer::state_shards() (which drains the streams); each call returns with its copies done.
#pragma once

#include <cstddef>
#include <functional>

#include "base/dtype.h"
#include "engine/engine.h"
#include "runtime/world.h"

namespace zest {

inline constexpr std::size_t kStateCopyChunkBytes = std::size_t{16} << 20;

// Calls consume(host, first, count) for consecutive pieces [first, first + count) of the
// `count` elements at `view`, host pointing at those elements in host memory.
void read_state_elements(const RankContext& context, const void* view, DType dtype,
                         std::size_t count,
                         const std::function<void(const void* host, std::size_t first,
                                                  std::size_t count)>& consume);

// Calls produce(host, first, count) to fill elements [first, first + count) in host memory,
// then puts them at view + first, for consecutive pieces of the `count` elements at `view`.
void write_state_elements(const RankContext& context, void* view, DType dtype, std::size_t count,
                          const std::function<void(void* host, std::size_t first,
                                                   std::size_t count)>& produce);

// The same for elements [first, first + count) of a state shard, wherever it lives: through its
// view, or, for a shard in no memory (StateShard::swap, the NVMe tier), through a host buffer of
// at most kStateCopyChunkBytes, so the whole shard is never in host memory at once.
void read_state_elements(const RankContext& context, const StateShard& shard, std::size_t first,
                         std::size_t count,
                         const std::function<void(const void* host, std::size_t first,
                                                  std::size_t count)>& consume);
void write_state_elements(const RankContext& context, const StateShard& shard, std::size_t first,
                          std::size_t count,
                          const std::function<void(void* host, std::size_t first,
                                                   std::size_t count)>& produce);

}  // namespace zest
