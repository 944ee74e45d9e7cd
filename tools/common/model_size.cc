#include "tools/common/model_size.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "base/byte_size.h"
#include "base/dtype.h"
#include "base/error.h"
#include "engine/stage_plan.h"
#include "memory/allocator.h"
#include "optim/optimizer.h"

namespace zest {
namespace {

constexpr std::uint64_t kSaturated = std::numeric_limits<std::uint64_t>::max();

// Note: as far as memory advice looks for a world size that fits (planner/memory_advice.cc), so
// that a model refused here is one whose out-of-memory advice would have found nothing.
constexpr std::uint64_t kMostRanksFactor = 64;

std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? kSaturated : sum;
}

std::uint64_t multiply(std::uint64_t a, std::uint64_t b) {
  std::uint64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? kSaturated : product;
}

std::uint64_t positive(std::int64_t value) {
  return value > 0 ? static_cast<std::uint64_t>(value) : 0;
}

std::string bytes_text(std::uint64_t bytes) {
  return bytes == kSaturated ? std::string("more than 2^64 bytes")
                             : format_bytes(static_cast<std::size_t>(bytes));
}

std::string count_text(std::uint64_t count) {
  return count == kSaturated ? std::string("more than 2^64") : std::to_string(count);
}

// "gpt, n_layer 1000000, n_embd 192, vocab_size 256, seq_len 64"
std::string describe_sizes(const ModelSpec& model) {
  if (model.type == "gpt") {
    const GptConfig& g = model.gpt;
    return fmt::format("gpt, n_layer {}, n_embd {}, vocab_size {}, seq_len {}", g.n_layer, g.n_embd,
                       g.vocab_size, g.seq_len);
  }
  return fmt::format("mlp, {} layers", model.mlp.sizes.empty() ? 0 : model.mlp.sizes.size() - 1);
}

void check_host_memory(const TrainConfig& config, const ModelSize& size, const std::string& model) {
  const std::uint64_t element = dtype_size(config.engine.compute_dtype);
  const std::size_t host = host_memory_bytes();
  if (host == 0) return;
  // A CPU device's memory is the host's. Ranks that are threads of one process share it, so all
  // of them together hold the parameters and gradients once however they are sharded; ranks that
  // are processes may each have a host, and need at least their shards.
  const bool threads = config.world.backend == "local";
  const std::uint64_t held =
      threads ? size.parameters
              : size.parameters / (kMostRanksFactor *
                                   static_cast<std::uint64_t>(std::max(1, config.world.ranks)));
  const std::uint64_t needed = multiply(2 * element, held);
  if (needed > host) {
    throw Error(ErrorKind::kConfig,
                fmt::format("{} need {} for their parameters and gradients alone ({}), more than "
                            "this host's {} of memory, which is a cpu device's memory{}; make the "
                            "model smaller",
                            model, bytes_text(needed), dtype_name(config.engine.compute_dtype),
                            format_bytes(host),
                            threads ? " (and the ranks, threads of one process, share it)" : ""));
  }
}

}  // namespace

ModelSize model_size(const ModelSpec& model) {
  ModelSize size;
  auto unit = [&](std::uint64_t parameters, const std::string& name) {
    size.parameters = add(size.parameters, parameters);
    ++size.units;
    if (parameters > size.largest_unit || size.largest_unit_name.empty()) {
      size.largest_unit = parameters;
      size.largest_unit_name = name;
    }
  };
  if (model.type == "gpt") {
    // The units' ParamSpecs (models/gpt.cc, models/gpt_block.cc) as sums: wte and wpe; per block
    // ln_1, c_attn, c_proj, ln_2, c_fc and the MLP's c_proj, weights and biases; ln_f.
    const GptConfig& g = model.gpt;
    const std::uint64_t C = positive(g.n_embd);
    const std::uint64_t block =
        add(multiply(12, multiply(C, C)), multiply(13, C));  // 12 C^2 + 13 C
    const std::uint64_t layers = positive(g.n_layer);
    unit(multiply(add(positive(g.vocab_size), positive(g.seq_len)), C), "embedding");
    if (layers > 0) {
      size.parameters = add(size.parameters, multiply(layers - 1, block));
      size.units += layers - 1;
      unit(block, "block0");
    }
    unit(multiply(2, C), "head");
    return size;
  }
  // Note: a model type added to models/registry.h without a sum here measures 0 parameters and
  // units, so it is never refused by these checks (the planner and the engine still hold it).
  if (model.type != "mlp") return size;
  const std::vector<std::int64_t>& widths = model.mlp.sizes;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    const std::uint64_t out = positive(widths[i + 1]);
    unit(add(multiply(out, positive(widths[i])), out), "layer" + std::to_string(i));
  }
  return size;
}

std::uint64_t model_state_floor(const TrainConfig& config, int stage, int world_size,
                                bool offload_optimizer) {
  const std::uint64_t all = model_size(config.model).parameters;
  const std::uint64_t shard = all / static_cast<std::uint64_t>(std::max(1, world_size));
  const std::uint64_t element = dtype_size(config.engine.compute_dtype);
  // AdamW's two moments, SGD's momentum, and the fp32 master of a 2-byte compute dtype.
  const std::uint64_t states =
      make_optimizer(config.optimizer)->state_count() + (element == sizeof(float) ? 0 : 1);
  const StagePlan plan = StagePlan::of(stage);
  // offload_param (stage 3): the parameter shards are in the host tier.
  const bool params_offloaded = plan.params_sharded && config.engine.offload_param.enabled();
  std::uint64_t bytes = params_offloaded ? 0 : multiply(plan.params_length(all, shard), element);
  bytes = add(bytes, multiply(plan.grads_length(all, shard), element));
  if (!offload_optimizer) {
    bytes = add(bytes, multiply(plan.optimizer_length(all, shard), multiply(states, sizeof(float))));
  }
  return bytes;
}

std::size_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<std::size_t>(
      multiply(static_cast<std::uint64_t>(pages), static_cast<std::uint64_t>(page_size)));
}

void check_model_fits_at_all(const TrainConfig& config, const CapacityLimit& capacity) {
  const ModelSize size = model_size(config.model);
  const std::uint64_t element = dtype_size(config.engine.compute_dtype);
  const std::string model = "model: " + count_text(size.parameters) + " parameters (" +
                            describe_sizes(config.model) + ")";
  if (capacity.bytes != kUnlimitedCapacity) {
    const std::uint64_t ranks =
        kMostRanksFactor * static_cast<std::uint64_t>(std::max(1, config.world.ranks));
    // With offload_param the parameter shards are the host's: the gradient shard is the floor.
    const std::uint64_t per_parameter =
        (config.engine.offload_param.enabled() ? 1 : 2) * element;
    const std::uint64_t needed = multiply(per_parameter, size.parameters / ranks);
    if (needed > capacity.bytes) {
      const std::uint64_t most = multiply(capacity.bytes / per_parameter, ranks);
      throw Error(ErrorKind::kConfig,
                  fmt::format("{} cannot fit devices of {} ({}): even at "
                              "zero_optimization.stage 3 with the optimizer offloaded, on {} "
                              "ranks (64 times world.ranks), a rank's parameter and gradient "
                              "shards alone need {}; make the model smaller (at most about {} "
                              "parameters could fit so) or the devices larger",
                              model, format_bytes(capacity.bytes), capacity.source, ranks,
                              bytes_text(needed), count_text(most)));
    }
  }
  if (config.world.device == DeviceKind::kCpu) check_host_memory(config, size, model);
  if (size.units > kMaxModelUnits) {
    const std::string why =
        "; every unit costs host memory and time to plan, build and step, whatever its size";
    if (config.model.type == "gpt") {
      throw Error(ErrorKind::kConfig,
                  fmt::format("model.n_layer: must be at most {} (a model has at most {} units, "
                              "a gpt n_layer + 2), got {}{}",
                              kMaxModelUnits - 2, kMaxModelUnits, config.model.gpt.n_layer, why));
    }
    throw Error(ErrorKind::kConfig,
                fmt::format("model.sizes: must hold at most {} widths (a model has at most {} "
                            "units, an mlp one per layer), got {}{}",
                            kMaxModelUnits + 1, kMaxModelUnits, config.model.mlp.sizes.size(),
                            why));
  }
}

}  // namespace zest
