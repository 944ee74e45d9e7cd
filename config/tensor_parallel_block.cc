// The `tensor_parallel` block (TensorParallelConfig): how many ranks split each layer of the GPT
// (Megatron's tensor parallelism, models/tensor_parallel_gpt.h). `size` (or DeepSpeed's
// `autotp_size`, the same number) must divide the ranks of each pipeline stage; the model's heads,
// vocabulary and width must divide by it. What the first slice does not compose with yet is
// refused here with the reason, one line from the config, never a wrong answer at run time.
#include <string>
#include <vector>

#include "config/blocks.h"
#include "models/tensor_parallel_gpt.h"

namespace zest {
namespace config_blocks {

using namespace config_reading;

namespace {

const std::vector<std::string> kKeys = {"size", "autotp_size", "sequence_parallel"};

std::string size_text(const TrainConfig& out) {
  return "tensor_parallel.size " + std::to_string(out.tensor_parallel.size);
}

void refuse(const std::string& path, const TrainConfig& out, const std::string& why) {
  config_error(path, why + " is not supported with tensor parallelism yet (" + size_text(out) +
                         "); leave it out or set tensor_parallel.size to 1");
}

void check_model(const TrainConfig& out) {
  if (out.model.type != "gpt") {
    config_error("model.type", "\"" + out.model.type + "\" has no tensor-parallel form (" +
                                   size_text(out) + "); tensor parallelism splits the GPT's "
                                   "layers: use model.type \"gpt\" or tensor_parallel.size 1");
  }
  validate_tensor_parallel(out.model.gpt, out.tensor_parallel.size);
  const int seq_len = out.model.gpt.seq_len;
  if (out.tensor_parallel.sequence_parallel && seq_len % out.tensor_parallel.size != 0) {
    config_error("tensor_parallel.sequence_parallel",
                 "true splits each sequence's tokens among the tensor_parallel.size " +
                     std::to_string(out.tensor_parallel.size) + " ranks, which do not divide "
                     "model.seq_len " + std::to_string(seq_len) +
                     "; choose a seq_len the size divides, or set sequence_parallel to false");
  }
}

}  // namespace

void parse_tensor_parallel_shape(Block& root, TrainConfig& out) {
  out.tensor_parallel = TensorParallelConfig{};
  json* value = root.find("tensor_parallel");
  if (value == nullptr) return;
  Block block(*value, "tensor_parallel", kKeys);
  const json* size = block.find("size");
  const json* autotp = block.find("autotp_size");
  std::int64_t asked = 1;
  if (size != nullptr) asked = read_integer_at_least(*size, block.path("size"), 1);
  if (autotp != nullptr) {
    const std::int64_t deepspeed = read_integer_at_least(*autotp, block.path("autotp_size"), 1);
    if (size != nullptr && deepspeed != asked) {
      config_error(block.path("autotp_size"),
                   std::to_string(deepspeed) + " differs from tensor_parallel.size " +
                       std::to_string(asked) + ": they name one number (DeepSpeed's and zest's); "
                       "set one");
    }
    asked = deepspeed;
    value->erase("autotp_size");  // the resolved config shows it as `size`
  }
  const int pipeline_stages = out.pipeline.stages;
  if (asked > out.world.ranks || out.world.ranks % (pipeline_stages * asked) != 0) {
    config_error(block.path("size"),
                 "pipeline.stages " + std::to_string(pipeline_stages) + " x tensor_parallel.size " +
                     std::to_string(asked) + " = " + std::to_string(pipeline_stages * asked) +
                     " does not divide world.ranks " + std::to_string(out.world.ranks) +
                     "; world.ranks = pipeline stages x data-parallel ranks x tensor-parallel "
                     "ranks");
  }
  out.tensor_parallel.size = static_cast<int>(asked);
  block.get_or("size", asked) = asked;
  out.tensor_parallel.sequence_parallel =
      read_bool(block.get_or("sequence_parallel", false), block.path("sequence_parallel"));
  out.pipeline.data_parallel = out.world.ranks / (pipeline_stages * out.tensor_parallel.size);
}

void refuse_tensor_parallel_compositions(const TrainConfig& out) {
  if (!out.tensor_parallel.enabled()) return;
  check_model(out);
  const EngineOptions& engine = out.engine;
  if (engine.hybrid_shard_size != 0 && engine.hybrid_shard_size != out.pipeline.data_parallel &&
      out.pipeline.enabled()) {
    refuse("zero_optimization.hybrid_shard_size", out, "hybrid sharding inside pipeline stages");
  }
  if (engine.activation_checkpointing.policy == RecomputePolicy::kSelective) {
    refuse("activation_checkpointing.policy", out,
           "\"selective\" recomputation (a block's slice keeps no selective part; \"full\" works)");
  }
}

}  // namespace config_blocks
}  // namespace zest
