#include "engine/parameter_offload.h"

#include <utility>

#include "base/error.h"
#include "engine/stage_plan.h"
#include "runtime/release_after.h"

namespace zest {

void check_parameter_offload(const EngineOptions& options) {
  const OffloadParamOptions& offload = options.offload_param;
  if (!offload.enabled()) return;
  const std::string key = "zero_optimization.offload_param.device";
  const StagePlan plan = StagePlan::of(options.stage);
  if (!plan.can_offload_parameters()) {
    throw Error(ErrorKind::kConfig,
                key + ": offloading parameters " + plan.refusal(StageFeature::kOffloadParameters) +
                    "; set the stage to 3 or the device to \"none\"");
  }
  if (offload.device == OffloadDevice::kNvme && offload.nvme_path.empty()) {
    throw Error(ErrorKind::kConfig,
                "zero_optimization.offload_param.nvme_path: \"nvme\" needs the folder its swap "
                "files go under; set nvme_path or the device to \"cpu\"");
  }
  if (offload.device == OffloadDevice::kNvme && options.outer_loop.enabled()) {
    throw Error(ErrorKind::kConfig,
                key + ": \"nvme\" is not supported with outer_loop, which reads the parameter "
                      "shards in place; set the device to \"cpu\" or \"none\"");
  }
  if (options.quantized_weights || options.hpz_group_size > 1) {
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

ShardFetch shard_fetch(RankContext& context, const EngineOptions& options,
                       SwappedParameters* swapped) {
  if (!options.offload_param.enabled()) return {};
  const std::size_t element = dtype_size(options.compute_dtype);
  return [&context, swapped, element](const FlatUnit& unit, Stream& stream, void* device) {
    if (swapped != nullptr && swapped->holds(unit)) {
      swapped->fetch(unit, stream, device);
    } else {
      context.device.copy(stream, device, unit.params.data(), unit.layout.shard_length() * element);
    }
  };
}

StagedShard::StagedShard(RankContext& context, const EngineOptions& options, FlatUnit& unit,
                         Stream& stream, SwappedParameters* swapped, bool read_values)
    : context_(context), unit_(unit), stream_(stream) {
  if (!options.offload_param.enabled()) return;
  if (swapped != nullptr && swapped->holds(unit)) swapped_ = swapped;
  const std::size_t bytes = unit.layout.shard_length() * dtype_size(options.compute_dtype);
  staged_ = context.allocator().allocate(bytes, Category::kWorkspace);
  if (!read_values) {
    context.device.fill_zero(stream, staged_.data(), bytes);  // the padding stays zero
  } else if (swapped_) {
    swapped_->fetch(unit, stream, staged_.data());
  } else {
    context.device.copy(stream, staged_.data(), unit.params.data(), bytes);
  }
}

void StagedShard::write_back() {
  if (staged_.empty()) return;
  if (swapped_) {
    swapped_->store(unit_, stream_, staged_.data());
  } else {
    context_.device.copy(stream_, unit_.params.data(), staged_.data(), staged_.bytes());
  }
  release_after(context_.device, stream_, std::move(staged_));
}

}  // namespace zest
