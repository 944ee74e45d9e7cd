// DeepSpeed's zero_optimization.offload_param: {"device": "none" | "cpu" | "nvme", "nvme_path",
// "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"}; stage 3 only, as in DeepSpeed.
#include "config/blocks.h"
#include "engine/stage_plan.h"

namespace zest::config_blocks {

using namespace config_reading;

namespace {

OffloadDevice read_param_device(Block& block) {
  const std::string device = read_string(block.get_or("device", "none"), block.path("device"));
  if (device == "none") return OffloadDevice::kNone;
  if (device == "cpu") return OffloadDevice::kCpu;
  if (device == "nvme") return OffloadDevice::kNvme;
  config_error(block.path("device"), "must be none, cpu or nvme, got \"" + device + "\"");
}

// What the parameters may not be offloaded with, each named by its key.
void refuse_combinations(const Block& block, const TrainConfig& out) {
  const EngineOptions& engine = out.engine;
  const StagePlan plan = StagePlan::of(engine.stage);
  if (!plan.can_offload_parameters()) {
    config_error(block.path("device"),
                 "offloading parameters " + plan.refusal(StageFeature::kOffloadParameters) +
                     "; set the stage to 3 or the device to \"none\"");
  }
  if (engine.quantized_weights || engine.hpz_group_size > 1) {
    config_error(block.path("device"),
                 "not with zero_optimization.zero_quantized_weights or zero_hpz_partition_size, "
                 "whose gathers read the shard in device memory; turn those off or set the "
                 "device to \"none\"");
  }
}

}  // namespace

void parse_offload_param(Block& zero, TrainConfig& out) {
  Block block(zero.object_or_empty("offload_param"), zero.path("offload_param"),
              {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"});
  OffloadParamOptions& offload = out.engine.offload_param;
  offload.device = read_param_device(block);
  // Note: nvme_path, buffer_count, buffer_size and max_in_cpu size the NVMe tier's host buffers
  // (DeepSpeed's meanings); they are checked and kept at every device so a config moves between
  // "cpu" and "nvme" by its device alone. pin_memory: as offload_optimizer.pin_memory, recorded.
  offload.nvme_path = read_string(block.get_or("nvme_path", ""), block.path("nvme_path"));
  offload.buffer_count = static_cast<std::size_t>(read_integer_at_least(
      block.get_or("buffer_count", offload.buffer_count), block.path("buffer_count"), 1));
  offload.buffer_size = static_cast<std::size_t>(read_integer_at_least(
      block.get_or("buffer_size", offload.buffer_size), block.path("buffer_size"), 1));
  offload.max_in_cpu = static_cast<std::size_t>(read_integer_at_least(
      block.get_or("max_in_cpu", offload.max_in_cpu), block.path("max_in_cpu"), 0));
  offload.pin_memory = read_bool(block.get_or("pin_memory", false), block.path("pin_memory"));
  if (offload.enabled()) refuse_combinations(block, out);
  if (offload.device == OffloadDevice::kNvme && offload.nvme_path.empty()) {
    config_error(block.path("nvme_path"),
                 "device \"nvme\" needs a folder for the swap files (a fast disk), got \"\"");
  }
}

void refuse_offload_param_pipeline(const TrainConfig& out) {
  if (out.engine.offload_param.device == OffloadDevice::kNvme && out.engine.outer_loop.enabled()) {
    config_error("zero_optimization.offload_param.device",
                 "\"nvme\" is not supported with outer_loop, which reads the parameter shards "
                 "in place; set the device to \"cpu\" or \"none\", or leave outer_loop out");
  }
  if (!out.pipeline.enabled() || !out.engine.offload_param.enabled()) return;
  config_error("zero_optimization.offload_param.device",
               "offloaded parameters inside pipeline stages are not supported yet, and "
               "pipeline.stages is " + std::to_string(out.pipeline.stages) +
                   "; set the device to \"none\" or leave the pipeline block out");
}

}  // namespace zest::config_blocks
