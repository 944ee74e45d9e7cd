#include "engine/state_bytes.h"

#include "base/dtype.h"

namespace zest {

std::size_t state_bytes(Trainer& trainer, const std::vector<std::size_t>& units) {
  std::size_t bytes = 0;
  for (std::size_t unit : units) {
    for (const StateShard& shard : trainer.state_shards(unit)) {
      bytes += (shard.end - shard.begin) * dtype_size(shard.dtype);
    }
  }
  return bytes;
}

}  // namespace zest
