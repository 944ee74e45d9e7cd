#include "engine/parameter_offload.h"

#include <utility>

#include "base/error.h"
#include "runtime/release_after.h"

namespace zest {

void check_parameter_offload(const EngineOptions& options) {
  const OffloadParamOptions& offload = options.offload_param;
  if (!offload.enabled()) return;
  const std::string key = "zero_optimization.offload_param.device";
  if (options.stage != 3) {
    throw Error(ErrorKind::kConfig,
                key + ": offloading parameters needs zero_optimization.stage 3 (got " +
                    std::to_string(options.stage) +
                    "): only stage 3 shards the parameters; set the stage to 3 or the device "
                    "to \"none\"");
  }
  if (offload.device != OffloadDevice::kCpu) {
    throw Error(ErrorKind::kConfig, key + ": only \"cpu\" (host memory) or \"none\" for now");
  }
  if (options.quantized_weights || options.hpz_partition_size > 1) {
    throw Error(ErrorKind::kConfig,
                key + ": not with zero_optimization.zero_quantized_weights or "
                      "zero_hpz_partition_size, whose gathers read the shard on the device; "
                      "turn those off or set the device to \"none\"");
  }
}

Allocator& parameter_allocator(RankContext& context, const EngineOptions& options) {
  return options.offload_param.enabled() ? context.device.host_allocator()
                                         : context.device.allocator();
}

StagedShard::StagedShard(RankContext& context, const EngineOptions& options, FlatUnit& unit,
                         Stream& stream)
    : context_(context), unit_(unit), stream_(stream) {
  if (!options.offload_param.enabled()) return;
  staged_ = context.allocator().allocate(unit.params.bytes(), Category::kWorkspace);
  context.device.copy(stream, staged_.data(), unit.params.data(), unit.params.bytes());
}

void StagedShard::write_back() {
  if (staged_.empty()) return;
  context_.device.copy(stream_, unit_.params.data(), staged_.data(), staged_.bytes());
  release_after(context_.device, stream_, std::move(staged_));
}

}  // namespace zest
