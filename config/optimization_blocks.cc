// The optimization blocks: DeepSpeed's `optimizer` (AdamW, Adam, SGD), `scheduler` (WarmupLR,
// WarmupDecayLR, WarmupCosineLR), `zero_optimization` and the precision blocks `bf16`, `fp16`
// and `communication_data_type`, with DeepSpeed's key names and defaults.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/secondary_shard.h"
#include "engine/stage_plan.h"
#include "optim/lr_schedule.h"
#include "config/blocks.h"

namespace zest::config_blocks {

using namespace config_reading;

void parse_optimizer(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("optimizer"), "optimizer", {"type", "params"});
  const OptimizerOptions defaults;
  const std::vector<std::string> types = {"AdamW", "Adam", "SGD"};
  const std::string given = read_string(block.get_or("type", defaults.type), "optimizer.type");
  // Note: DeepSpeed matches optimizer names case-insensitively ("adamw"); the resolved config
  // keeps the canonical spelling.
  auto type_it = std::find_if(types.begin(), types.end(),
                              [&](const std::string& type) { return lower(type) == lower(given); });
  if (type_it == types.end()) {
    config_error("optimizer.type", "must be " + one_of(types) + ", got \"" + given + "\"");
  }
  out.optimizer = OptimizerOptions{};
  out.optimizer.type = *type_it;
  *block.find("type") = out.optimizer.type;
  const bool sgd = out.optimizer.type == "SGD";

  std::vector<std::string> known = {"lr", "weight_decay"};
  if (sgd) {
    known.insert(known.end(), {"momentum", "nesterov"});
  } else {
    known.insert(known.end(), {"betas", "eps"});
  }
  json& params_json = block.object_or_empty("params");
  if (params_json.is_object()) {
    // A parameter of another optimizer type gets a message that says so, before the generic
    // unknown-key check.
    for (const auto& item : params_json.items()) {
      const std::vector<std::string> all = {"lr", "betas", "eps", "weight_decay", "momentum",
                                            "nesterov"};
      if (std::find(known.begin(), known.end(), item.key()) == known.end() &&
          std::find(all.begin(), all.end(), item.key()) != all.end()) {
        config_error("optimizer.params." + item.key(), "is not a parameter of " +
                                                           out.optimizer.type + " (allowed: " +
                                                           one_of(known) + ")");
      }
    }
  }
  Block params(params_json, "optimizer.params", known);

  const double lr = read_float(params.get_or("lr", shortest(defaults.lr)), params.path("lr"));
  if (lr <= 0) config_error(params.path("lr"), "must be a number > 0, got " + json(lr).dump());
  out.optimizer.lr = static_cast<float>(lr);

  const double decay = read_float(params.get_or("weight_decay", shortest(defaults.weight_decay)),
                                   params.path("weight_decay"));
  if (decay < 0) {
    config_error(params.path("weight_decay"), "must be a number >= 0, got " + json(decay).dump());
  }
  out.optimizer.weight_decay = static_cast<float>(decay);

  if (sgd) {
    const double momentum = read_number(params.get_or("momentum", shortest(defaults.momentum)),
                                        params.path("momentum"));
    if (momentum < 0 || momentum >= 1) {
      config_error(params.path("momentum"),
                   "must be a number in [0, 1), got " + json(momentum).dump());
    }
    out.optimizer.momentum = static_cast<float>(momentum);
    out.optimizer.nesterov =
        read_bool(params.get_or("nesterov", defaults.nesterov), params.path("nesterov"));
    if (out.optimizer.nesterov && out.optimizer.momentum <= 0) {
      config_error(params.path("nesterov"), "true needs optimizer.params.momentum > 0");
    }
    return;
  }
  const json& betas =
      params.get_or("betas", json::array({shortest(defaults.beta1), shortest(defaults.beta2)}));
  if (!betas.is_array() || betas.size() != 2) {
    config_error(params.path("betas"), "must be an array of two numbers [beta1, beta2], got " +
                                           describe(betas));
  }
  float* targets[2] = {&out.optimizer.beta1, &out.optimizer.beta2};
  for (std::size_t i = 0; i < 2; ++i) {
    const std::string path = params.path("betas") + "[" + std::to_string(i) + "]";
    const double beta = read_float(betas[i], path);
    if (beta < 0 || beta >= 1) {
      config_error(path, "must be a number in [0, 1), got " + betas[i].dump());
    }
    *targets[i] = static_cast<float>(beta);
  }
  const double eps = read_float(params.get_or("eps", shortest(defaults.eps)), params.path("eps"));
  if (eps <= 0) config_error(params.path("eps"), "must be a number > 0, got " + json(eps).dump());
  out.optimizer.eps = static_cast<float>(eps);
}

// DeepSpeed's `scheduler` block: {"type": ..., "params": {...}} with its parameter names.
void parse_scheduler(Block& root, TrainConfig& out) {
  if (!root.object_or_empty("scheduler").is_object() ||
      root.object_or_empty("scheduler").empty()) {
    return;
  }
  Block block(root.object_or_empty("scheduler"), "scheduler", {"type", "params"});
  LrScheduleOptions& options = out.scheduler;
  options.type = read_string(block.require("type", "WarmupLR, WarmupDecayLR or WarmupCosineLR"),
                             "scheduler.type");
  Block params(block.object_or_empty("params"), "scheduler.params",
               {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                "total_num_steps", "warmup_min_ratio", "cos_min_ratio", "last_batch_iteration"});
  auto number = [&](const char* key, float fallback) {
    return static_cast<float>(read_float(params.get_or(key, fallback), params.path(key)));
  };
  options.warmup_min_lr = number("warmup_min_lr", options.warmup_min_lr);
  options.warmup_max_lr = number("warmup_max_lr", options.warmup_max_lr);
  options.warmup_min_ratio = number("warmup_min_ratio", options.warmup_min_ratio);
  options.cos_min_ratio = number("cos_min_ratio", options.cos_min_ratio);
  options.warmup_num_steps = read_integer_at_least(
      params.get_or("warmup_num_steps", options.warmup_num_steps), params.path("warmup_num_steps"), 0);
  const bool total_from_steps = params.find("total_num_steps") == nullptr;
  options.total_num_steps = read_integer_at_least(
      params.get_or("total_num_steps", out.steps), params.path("total_num_steps"), 1);
  const bool decays = options.type == "WarmupDecayLR" || options.type == "WarmupCosineLR";
  // As DeepSpeed, the schedule warms up for at least 2 steps (optim/lr_schedule.cc).
  const std::int64_t warmup = std::max<std::int64_t>(2, options.warmup_num_steps);
  if (total_from_steps && decays && out.steps <= warmup) {
    // The schedule's length defaults to the run's, so a shorter run (--set steps=5) needs a
    // message about steps, not about a key the user never wrote.
    const std::string counted =
        warmup == options.warmup_num_steps
            ? std::to_string(warmup)
            : std::to_string(options.warmup_num_steps) + ", counted as 2: a warmup is at least 2 "
                                                         "steps, as in DeepSpeed";
    config_error("steps", std::to_string(out.steps) + " is not more than " +
                              params.path("warmup_num_steps") + " (" + counted + "), and " +
                              options.type +
                              " decays after the warmup until step `steps`; run longer, warm up "
                              "for fewer steps, or set scheduler.params.total_num_steps");
  }
  options.warmup_type =
      read_string(params.get_or("warmup_type", options.warmup_type), params.path("warmup_type"));
  if (read_integer_at_least(params.get_or("last_batch_iteration", -1),
                            params.path("last_batch_iteration"), -1) != -1) {
    config_error("scheduler.params.last_batch_iteration",
                 "is not supported yet (a resumed run restores its step from the checkpoint)");
  }
  LrSchedule check(options, out.optimizer.lr);  // validates, naming scheduler.params.<key>
}

namespace {

// DeepSpeed's zero_optimization.offload_optimizer: {"device": "cpu" | "nvme" | "none",
// "pin_memory": bool, and nvme's keys (nvme_blocks.cc)}.
void parse_offload_optimizer(Block& zero, TrainConfig& out) {
  Block block(zero.object_or_empty("offload_optimizer"), zero.path("offload_optimizer"),
              {"device", "pin_memory", "nvme_path", "buffer_count", "fast_init"});
  OffloadOptions& offload = out.engine.offload_optimizer;
  const std::string device = read_string(block.get_or("device", "none"), block.path("device"));
  if (device == "none") {
    offload.device = OffloadDevice::kNone;
  } else if (device == "cpu") {
    offload.device = OffloadDevice::kCpu;
  } else if (device == "nvme") {
    offload.device = OffloadDevice::kNvme;
  } else {
    config_error(block.path("device"), "must be cpu, nvme or none, got \"" + device + "\"");
  }
  // Note: pin_memory asks for page-locked host buffers, which only a CUDA device can use (for
  // asynchronous copies), and the CUDA device's host arena is page-locked always. On the CPU
  // device the host arena is ordinary memory and its copies are memcpys in stream order. So the
  // key is accepted and recorded, and changes nothing on either.
  offload.pin_memory =
      read_bool(block.get_or("pin_memory", false), block.path("pin_memory"));
  const StagePlan plan = StagePlan::of(out.engine.stage);
  if (offload.enabled() && !plan.serves(StageFeature::kOffloadOptimizer)) {
    // As DeepSpeed: only sharded optimizer state is offloaded (ZeRO-Offload builds on stage 1+).
    config_error(block.path("device"), "\"" + device + "\" " +
                                           plan.refusal(StageFeature::kOffloadOptimizer) +
                                           "; raise the stage or set \"none\"");
  }
  parse_offload_optimizer_nvme(block, out);
}

}  // namespace

// zero_optimization.hybrid_shard_size (zest's key; FSDP's HYBRID_SHARD, MiCS): "off" (plain
// ZeRO over every rank), "node" (shard within each node of world.ranks_per_node) or a number of
// consecutive ranks that divides world.ranks. Note: DeepSpeed has no key for it —
// zero_hpz_partition_size is ZeRO++'s secondary copy of the parameters, a different thing — so
// the name is zest's own, after what it sets: the size of the group the model state is sharded
// over.
static void parse_hybrid_shard_size(Block& block, TrainConfig& out) {
  const json& value = block.get_or("hybrid_shard_size", "off");
  const std::string path = block.path("hybrid_shard_size");
  const std::string allowed = "must be \"off\", \"node\" or a number of ranks that divides "
                              "world.ranks";
  if (value.is_string() && (value == "off" || value == "node")) {
    out.engine.hybrid_shard_size = value == "off" ? 0 : kHybridShardNode;
    return;
  }
  if (!value.is_number() || value.is_boolean()) config_error(path, allowed + ", got " + describe(value));
  const std::int64_t size = read_integer(value, path);
  const int ranks = out.world.ranks;
  if (size < 1 || size > 65536 || (ranks > 1 && ranks % size != 0)) {
    config_error(path, allowed + " (" + std::to_string(ranks) + "), got " + value.dump());
  }
  out.engine.hybrid_shard_size = static_cast<int>(size);
}

// zero_optimization.zero_quantized_gradients_bits: the number 8 or 4 (8.0 too, as JSON writes
// it), nothing else. Read whether or not qgZ is on, so the resolved config always shows it.
static void parse_quantized_gradient_bits(Block& block, EngineOptions& engine) {
  const std::string path = block.path("zero_quantized_gradients_bits");
  const json& value = block.get_or("zero_quantized_gradients_bits", engine.quantized_gradient_bits);
  const double bits = value.is_number() ? value.get<double>() : 0.0;
  if (bits != 8.0 && bits != 4.0) config_error(path, "must be 8 or 4, got " + describe(value));
  engine.quantized_gradient_bits = static_cast<int>(bits);
}

// ZeRO++'s quantized collectives (engine/quantized_collectives.h): DeepSpeed's booleans
// zero_quantized_weights (qwZ, stage 3) and zero_quantized_gradients (qgZ, stages 1-3), and
// zest's zero_quantized_block_size, the elements that share one scale in both, and
// zero_quantized_gradients_bits, qgZ's 8 (int8, the default) or 4 (int4, as ZeRO++ sends). Note:
// DeepSpeed sizes its quantization groups itself; zest names the one number the wire format has.
static void parse_quantized(Block& block, TrainConfig& out) {
  EngineOptions& engine = out.engine;
  engine.quantized_weights = read_bool(block.get_or("zero_quantized_weights", false),
                                       block.path("zero_quantized_weights"));
  engine.quantized_gradients = read_bool(block.get_or("zero_quantized_gradients", false),
                                         block.path("zero_quantized_gradients"));
  const std::string size_path = block.path("zero_quantized_block_size");
  engine.quantization_block = static_cast<std::size_t>(read_integer_at_least(
      block.get_or("zero_quantized_block_size", engine.quantization_block), size_path, 1));
  if (engine.quantization_block > (std::size_t{1} << 24)) {
    config_error(size_path, "must be at most 16777216 elements, got " +
                                std::to_string(engine.quantization_block));
  }
  parse_quantized_gradient_bits(block, engine);
  const StagePlan plan = StagePlan::of(engine.stage);
  if (engine.quantized_weights && !plan.serves(StageFeature::kQuantizedWeights)) {
    config_error(block.path("zero_quantized_weights"),
                 "true " + plan.refusal(StageFeature::kQuantizedWeights));
  }
  if (engine.quantized_gradients && !plan.serves(StageFeature::kQuantizedGradients)) {
    config_error(block.path("zero_quantized_gradients"),
                 "true " + plan.refusal(StageFeature::kQuantizedGradients));
  }
}

// zero_optimization.zero_hpz_partition_size (DeepSpeed's ZeRO++ key): 1 is off; a larger group
// of consecutive ranks inside a node keeps the secondary shard (engine/secondary_shard.h).
// Stage 3 only, and not with hybrid sharding, whose gathers stay in the node already. With
// zero_quantized_weights the gathers across nodes are the int8 ones (ZeRO++'s qwZ + hpZ).
static void parse_hpz_partition_size(Block& block, TrainConfig& out) {
  const std::string path = block.path("zero_hpz_partition_size");
  const json& value = block.get_or("zero_hpz_partition_size", 1);
  if (!value.is_number() || value.is_boolean()) {
    config_error(path, "must be 1 (off) or a number of ranks inside a node, got " + describe(value));
  }
  const std::int64_t size = read_integer(value, path);
  if (size < 1 || size > 65536) {
    config_error(path, "must be 1 (off) or a number of ranks inside a node, got " + value.dump());
  }
  out.engine.hpz_group_size = static_cast<int>(size);
  if (size == 1) return;
  // world.ranks_per_node "auto" (0) is taken as one node here; the engine checks the nodes the
  // launcher reports.
  hpz_group_size(static_cast<int>(size), out.engine.stage, out.world.ranks,
                     out.world.ranks_per_node);
  if (out.engine.hybrid_shard_size != 0) {
    config_error(path, value.dump() + " with zero_optimization.hybrid_shard_size: a hybrid shard "
                       "group's gathers stay inside its node already; set one of them off");
  }
}

void parse_zero(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("zero_optimization"), "zero_optimization",
              {"stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
               "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
               "contiguous_gradients", "offload_optimizer", "offload_param", "hybrid_shard_size",
               "zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_block_size",
               "zero_quantized_gradients_bits", "zero_hpz_partition_size", "sub_group_size"});
  const json& stage = block.get_or("stage", 0);
  const std::int64_t value = read_integer(stage, block.path("stage"));
  if (!StagePlan::valid(value)) {
    config_error(block.path("stage"), "must be 0, 1, 2 or 3, got " + std::to_string(value));
  }
  out.engine.stage = static_cast<int>(value);

  parse_hybrid_shard_size(block, out);
  parse_quantized(block, out);
  parse_hpz_partition_size(block, out);

  ZeroOverlapConfig& overlap = out.zero_overlap;
  EngineOptions& engine = out.engine;
  overlap.overlap_comm = read_bool(block.get_or("overlap_comm", engine.overlap_comm),
                                   block.path("overlap_comm"));
  overlap.reduce_bucket_size = read_integer_at_least(
      block.get_or("reduce_bucket_size", engine.reduce_bucket_size),
      block.path("reduce_bucket_size"), 1);
  overlap.stage3_prefetch_bucket_size = read_integer_at_least(
      block.get_or("stage3_prefetch_bucket_size", engine.stage3_prefetch_bucket_size),
      block.path("stage3_prefetch_bucket_size"), 0);
  overlap.stage3_max_live_parameters = read_integer_at_least(
      block.get_or("stage3_max_live_parameters", engine.stage3_max_live_parameters),
      block.path("stage3_max_live_parameters"), 0);
  engine.overlap_comm = overlap.overlap_comm;
  engine.reduce_bucket_size = static_cast<std::size_t>(overlap.reduce_bucket_size);
  engine.stage3_prefetch_bucket_size =
      static_cast<std::size_t>(overlap.stage3_prefetch_bucket_size);
  engine.stage3_max_live_parameters = static_cast<std::size_t>(overlap.stage3_max_live_parameters);

  overlap.contiguous_gradients =
      read_bool(block.get_or("contiguous_gradients", true), block.path("contiguous_gradients"));
  if (!overlap.contiguous_gradients) {
    config_error(block.path("contiguous_gradients"),
                 "false is not supported yet: zest's gradients always live in one contiguous "
                 "buffer per unit; remove the key or set it to true");
  }
  if (const json* size = block.find("allgather_bucket_size")) {
    config_error(block.path("allgather_bucket_size"),
                 "is not supported yet (got " + size->dump() +
                     "): stages 1-2 all-gather each unit's updated parameters in place, with no "
                     "bucket to size; remove the key");
  }
  parse_sub_group_size(block, out);
  parse_offload_optimizer(block, out);
  parse_offload_param(block, out);
}

// DeepSpeed's `bf16` and `fp16` blocks (and `communication_data_type`): the dtype parameters and
// gradients are stored and reduced in, and fp16's loss scaling.
void parse_precision(Block& root, TrainConfig& out) {
  Block bf16(root.object_or_empty("bf16"), "bf16", {"enabled"});
  const bool bf16_enabled = read_bool(bf16.get_or("enabled", false), "bf16.enabled");

  Block fp16(root.object_or_empty("fp16"), "fp16",
             {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
              "min_loss_scale"});
  LossScaleOptions& scaling = out.engine.loss_scale;
  const LossScaleOptions defaults;
  scaling.enabled = read_bool(fp16.get_or("enabled", false), "fp16.enabled");
  if (scaling.enabled && bf16_enabled) {
    config_error("fp16.enabled", "true needs bf16.enabled false (choose one of fp16 and bf16)");
  }
  const double scale = read_float(fp16.get_or("loss_scale", shortest(defaults.loss_scale)),
                                   "fp16.loss_scale");
  if (scale < 0) {
    config_error("fp16.loss_scale", "must be a number >= 0 (0 = dynamic), got " +
                                        json(scale).dump());
  }
  scaling.loss_scale = static_cast<float>(scale);
  const std::int64_t power = read_integer(
      fp16.get_or("initial_scale_power", defaults.initial_scale_power), "fp16.initial_scale_power");
  if (power < 0 || power > 64) {
    config_error("fp16.initial_scale_power",
                 "must be an integer from 0 to 64, got " + std::to_string(power));
  }
  scaling.initial_scale_power = static_cast<int>(power);
  const std::int64_t window = read_integer_at_least(
      fp16.get_or("loss_scale_window", defaults.loss_scale_window), "fp16.loss_scale_window", 1);
  const std::int64_t hysteresis = read_integer_at_least(
      fp16.get_or("hysteresis", defaults.hysteresis), "fp16.hysteresis", 1);
  if (window > std::numeric_limits<int>::max() || hysteresis > std::numeric_limits<int>::max()) {
    config_error(window > std::numeric_limits<int>::max() ? "fp16.loss_scale_window"
                                                          : "fp16.hysteresis",
                 "must be below 2^31");
  }
  scaling.loss_scale_window = static_cast<int>(window);
  scaling.hysteresis = static_cast<int>(hysteresis);
  const double min_scale = read_float(
      fp16.get_or("min_loss_scale", shortest(defaults.min_loss_scale)), "fp16.min_loss_scale");
  if (min_scale <= 0) {
    config_error("fp16.min_loss_scale", "must be a number > 0, got " + json(min_scale).dump());
  }
  scaling.min_loss_scale = static_cast<float>(min_scale);

  out.engine.compute_dtype = scaling.enabled ? DType::kFloat16
                             : bf16_enabled  ? DType::kBFloat16
                                             : DType::kFloat32;

  const std::vector<std::pair<std::string, DType>> wire_types = {
      {"fp32", DType::kFloat32}, {"bf16", DType::kBFloat16}, {"fp16", DType::kFloat16}};
  const std::string wire = read_string(
      root.get_or("communication_data_type", "fp32"), "communication_data_type");
  auto wire_it = std::find_if(wire_types.begin(), wire_types.end(),
                              [&](const auto& entry) { return entry.first == wire; });
  if (wire_it == wire_types.end()) {
    config_error("communication_data_type", "must be fp32, bf16 or fp16, got \"" + wire + "\"");
  }
  out.engine.communication_dtype = wire_it->second;
}

}  // namespace zest::config_blocks
