#include "tools/common/train_config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <utility>

#include "base/byte_size.h"
#include "base/error.h"
#include "tools/common/config_reading.h"

namespace zest {

using nlohmann::json;

namespace {
using namespace config_reading;

// ---- blocks --------------------------------------------------------------------------------

void parse_world(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("world"), "world",
              {"backend", "ranks", "device", "device_memory", "timeout_s"});

  out.world.backend = read_string(block.get_or("backend", "local"), block.path("backend"));
  const std::vector<std::string> backends = {"local", "nccl", "mpi", "auto"};
  if (std::find(backends.begin(), backends.end(), out.world.backend) == backends.end()) {
    config_error(block.path("backend"),
                 "must be " + one_of(backends) + ", got \"" + out.world.backend + "\"");
  }

  const std::int64_t ranks = read_integer(block.get_or("ranks", 1), block.path("ranks"));
  if (ranks < 1 || ranks > 65536) {
    config_error(block.path("ranks"), "must be an integer from 1 to 65536, got " +
                                          std::to_string(ranks));
  }
  out.world.ranks = static_cast<int>(ranks);

  const std::string device = read_string(block.get_or("device", "cpu"), block.path("device"));
  if (device == "cpu") {
    out.world.device = DeviceKind::kCpu;
  } else if (device == "cuda") {
    out.world.device = DeviceKind::kCuda;
  } else {
    config_error(block.path("device"), "must be cpu or cuda, got \"" + device + "\"");
  }

  const json& memory = block.get_or("device_memory", "unlimited");
  const std::string memory_path = block.path("device_memory");
  const std::string memory_forms =
      std::string("must be \"unlimited\" or ") + kByteSizeForms + ", got ";
  if (memory.is_string()) {
    const std::string text = memory.get<std::string>();
    if (text == "unlimited") {
      out.world.device_memory = kUnlimitedCapacity;
    } else if (auto bytes = parse_byte_size(text); bytes && *bytes > 0) {
      out.world.device_memory = *bytes;
    } else {
      config_error(memory_path, memory_forms + "\"" + text + "\"");
    }
  } else if (memory.is_number()) {
    const std::int64_t bytes = read_integer(memory, memory_path);
    if (bytes < 1) config_error(memory_path, memory_forms + std::to_string(bytes));
    out.world.device_memory = static_cast<std::size_t>(bytes);
  } else {
    config_error(memory_path, memory_forms + describe(memory));
  }

  const double timeout = read_number(block.get_or("timeout_s", 300), block.path("timeout_s"));
  if (timeout <= 0 || timeout > 1e9) {
    config_error(block.path("timeout_s"),
                 "must be a number of seconds > 0, got " + block.find("timeout_s")->dump());
  }
  out.world.timeout = std::chrono::milliseconds(
      std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(timeout * 1000.0))));
}

void parse_model(Block& root, TrainConfig& out) {
  json& model = root.require("model", "e.g. {\"type\": \"mlp\", \"sizes\": [64, 256, 10]}");
  if (!model.is_object()) config_error("model", "must be an object, got " + describe(model));
  const std::vector<std::string> types = {"mlp"};
  auto type_it = model.find("type");
  if (type_it == model.end()) config_error("model.type", "missing; allowed: " + one_of(types));
  out.model.type = read_string(*type_it, "model.type");

  if (out.model.type == "mlp") {
    Block block(model, "model", {"type", "sizes"});
    json& sizes = block.require("sizes", "the layer widths, input first, e.g. [64, 256, 10]");
    if (!sizes.is_array() || sizes.size() < 2) {
      config_error("model.sizes",
                   "must be an array of at least 2 widths (input, ..., classes), got " +
                       describe(sizes));
    }
    out.model.mlp.sizes.clear();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::string path = "model.sizes[" + std::to_string(i) + "]";
      out.model.mlp.sizes.push_back(read_integer_at_least(sizes[i], path, 1));
    }
    return;
  }
  config_error("model.type", "must be " + one_of(types) + ", got \"" + out.model.type + "\"");
}

void parse_data(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("data"), "data", {"type", "features", "classes"});
  out.data.type = read_string(block.get_or("type", "synthetic"), block.path("type"));
  if (out.data.type != "synthetic") {
    config_error(block.path("type"), "must be synthetic, got \"" + out.data.type + "\"");
  }
  if (out.model.type != "mlp") {
    config_error("data.type", "synthetic classification needs model.type mlp, got \"" +
                                  out.model.type + "\"");
  }
  const auto& sizes = out.model.mlp.sizes;
  const std::string input_path = "model.sizes[0]";
  const std::string output_path = "model.sizes[" + std::to_string(sizes.size() - 1) + "]";

  out.data.features = read_integer_at_least(block.get_or("features", sizes.front()),
                                            block.path("features"), 1);
  if (out.data.features != sizes.front()) {
    config_error(block.path("features"),
                 "must equal " + input_path + " (" + std::to_string(sizes.front()) +
                     "), the model's input width, got " + std::to_string(out.data.features));
  }
  out.data.classes = read_integer_at_least(block.get_or("classes", sizes.back()),
                                           block.path("classes"), 2);
  if (out.data.classes != sizes.back()) {
    config_error(block.path("classes"),
                 "must equal " + output_path + " (" + std::to_string(sizes.back()) +
                     "), the model's output width, got " + std::to_string(out.data.classes));
  }
}

// DeepSpeed's rule: train_batch_size = train_micro_batch_size_per_gpu ×
// gradient_accumulation_steps × world size; any two determine the third.
void parse_batch(Block& root, TrainConfig& out) {
  const char* kTotal = "train_batch_size";
  const char* kMicro = "train_micro_batch_size_per_gpu";
  const char* kAccumulation = "gradient_accumulation_steps";
  auto read = [&](const char* key) -> std::optional<std::int64_t> {
    const json* value = root.find(key);
    if (value == nullptr) return std::nullopt;
    return read_integer_at_least(*value, key, 1);
  };
  const std::optional<std::int64_t> total = read(kTotal);
  const std::optional<std::int64_t> micro = read(kMicro);
  const std::optional<std::int64_t> accumulation = read(kAccumulation);
  const std::int64_t ranks = out.world.ranks;
  const std::string rule = std::string("; need ") + kTotal + " = " + kMicro + " x " +
                           kAccumulation + " x world.ranks";
  auto value_of = [](const char* key, std::optional<std::int64_t> value) {
    return std::string(key) + " " + (value ? std::to_string(*value) : "unset");
  };
  auto inconsistent = [&](const std::string& what) {
    throw Error(ErrorKind::kConfig, "batch sizes are inconsistent: " + value_of(kTotal, total) +
                                        ", " + value_of(kMicro, micro) + ", " +
                                        value_of(kAccumulation, accumulation) +
                                        ", world.ranks " + std::to_string(ranks) + " (" + what +
                                        ")" + rule);
  };

  if (total && micro && accumulation) {
    if (*total != *micro * *accumulation * ranks) {
      inconsistent(std::to_string(*micro) + " x " + std::to_string(*accumulation) + " x " +
                   std::to_string(ranks) + " = " +
                   std::to_string(*micro * *accumulation * ranks) + ", not " +
                   std::to_string(*total));
    }
    out.micro_batch = *micro;
    out.gradient_accumulation_steps = *accumulation;
  } else if (total && micro) {
    if (*total % (*micro * ranks) != 0) {
      inconsistent(std::to_string(*total) + " is not a multiple of " + std::to_string(*micro) +
                   " x " + std::to_string(ranks));
    }
    out.micro_batch = *micro;
    out.gradient_accumulation_steps = *total / (*micro * ranks);
  } else if (total && accumulation) {
    if (*total % (*accumulation * ranks) != 0) {
      inconsistent(std::to_string(*total) + " is not a multiple of " +
                   std::to_string(*accumulation) + " x " + std::to_string(ranks));
    }
    out.micro_batch = *total / (*accumulation * ranks);
    out.gradient_accumulation_steps = *accumulation;
  } else if (micro) {
    out.micro_batch = *micro;
    out.gradient_accumulation_steps = accumulation.value_or(1);
  } else if (total) {
    if (*total % ranks != 0) {
      inconsistent(std::to_string(*total) + " is not a multiple of world.ranks " +
                   std::to_string(ranks));
    }
    out.micro_batch = *total / ranks;
    out.gradient_accumulation_steps = 1;
  } else {
    throw Error(ErrorKind::kConfig, std::string(kTotal) + ": missing; set " + kTotal +
                                        " or " + kMicro + " (or both)");
  }
  out.train_batch_size = out.micro_batch * out.gradient_accumulation_steps * ranks;
  if (out.gradient_accumulation_steps > std::numeric_limits<int>::max()) {
    config_error(kAccumulation, "must be below 2^31, got " +
                                    std::to_string(out.gradient_accumulation_steps));
  }
  out.engine.gradient_accumulation_steps = static_cast<int>(out.gradient_accumulation_steps);
  root.get_or(kTotal, out.train_batch_size) = out.train_batch_size;
  root.get_or(kMicro, out.micro_batch) = out.micro_batch;
  root.get_or(kAccumulation, out.gradient_accumulation_steps) = out.gradient_accumulation_steps;
}

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

  const double lr = read_number(params.get_or("lr", shortest(defaults.lr)), params.path("lr"));
  if (lr <= 0) config_error(params.path("lr"), "must be a number > 0, got " + json(lr).dump());
  out.optimizer.lr = static_cast<float>(lr);

  const double decay = read_number(params.get_or("weight_decay", shortest(defaults.weight_decay)),
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
    const double beta = read_number(betas[i], path);
    if (beta < 0 || beta >= 1) {
      config_error(path, "must be a number in [0, 1), got " + betas[i].dump());
    }
    *targets[i] = static_cast<float>(beta);
  }
  const double eps = read_number(params.get_or("eps", shortest(defaults.eps)), params.path("eps"));
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
    return static_cast<float>(read_number(params.get_or(key, fallback), params.path(key)));
  };
  options.warmup_min_lr = number("warmup_min_lr", options.warmup_min_lr);
  options.warmup_max_lr = number("warmup_max_lr", options.warmup_max_lr);
  options.warmup_min_ratio = number("warmup_min_ratio", options.warmup_min_ratio);
  options.cos_min_ratio = number("cos_min_ratio", options.cos_min_ratio);
  options.warmup_num_steps = read_integer_at_least(
      params.get_or("warmup_num_steps", options.warmup_num_steps), params.path("warmup_num_steps"), 0);
  options.total_num_steps = read_integer_at_least(
      params.get_or("total_num_steps", out.steps), params.path("total_num_steps"), 1);
  options.warmup_type =
      read_string(params.get_or("warmup_type", options.warmup_type), params.path("warmup_type"));
  if (read_integer_at_least(params.get_or("last_batch_iteration", -1),
                            params.path("last_batch_iteration"), -1) != -1) {
    config_error("scheduler.params.last_batch_iteration",
                 "is not supported yet (a resumed run restores its step from the checkpoint)");
  }
  LrSchedule check(options, out.optimizer.lr);  // validates, naming scheduler.params.<key>
}

void parse_zero(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("zero_optimization"), "zero_optimization",
              {"stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
               "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
               "contiguous_gradients"});
  const json& stage = block.get_or("stage", 0);
  const std::int64_t value = read_integer(stage, block.path("stage"));
  if (value < 0 || value > 3) {
    config_error(block.path("stage"), "must be 0, 1, 2 or 3, got " + std::to_string(value));
  }
  out.engine.stage = static_cast<int>(value);

  // The overlap keys: those the engine implements are passed on (and their defaults shown in
  // the resolved config); the rest are recorded (see ZeroOverlapConfig).
  auto size = [&](const char* key, std::int64_t minimum) -> std::optional<std::int64_t> {
    const json* v = block.find(key);
    if (v == nullptr) return std::nullopt;
    return read_integer_at_least(*v, block.path(key), minimum);
  };
  auto flag = [&](const char* key) -> std::optional<bool> {
    const json* v = block.find(key);
    if (v == nullptr) return std::nullopt;
    return read_bool(*v, block.path(key));
  };
  ZeroOverlapConfig& overlap = out.zero_overlap;
  overlap.overlap_comm = read_bool(block.get_or("overlap_comm", out.engine.overlap_comm),
                                   block.path("overlap_comm"));
  overlap.reduce_bucket_size = read_integer_at_least(
      block.get_or("reduce_bucket_size", out.engine.reduce_bucket_size),
      block.path("reduce_bucket_size"), 1);
  overlap.stage3_prefetch_bucket_size = read_integer_at_least(
      block.get_or("stage3_prefetch_bucket_size", out.engine.stage3_prefetch_bucket_size),
      block.path("stage3_prefetch_bucket_size"), 0);
  out.engine.overlap_comm = *overlap.overlap_comm;
  out.engine.reduce_bucket_size = static_cast<std::size_t>(*overlap.reduce_bucket_size);
  out.engine.stage3_prefetch_bucket_size =
      static_cast<std::size_t>(*overlap.stage3_prefetch_bucket_size);
  overlap.allgather_bucket_size = size("allgather_bucket_size", 1);
  overlap.stage3_max_live_parameters = size("stage3_max_live_parameters", 1);
  out.zero_overlap.contiguous_gradients = flag("contiguous_gradients");
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
  const double scale = read_number(fp16.get_or("loss_scale", shortest(defaults.loss_scale)),
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
  const double min_scale = read_number(
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


}  // namespace

// `log` (zest's own: where the timeline goes) and DeepSpeed's `wall_clock_breakdown`.
void parse_log(Block& root, TrainConfig& out) {
  Block log(root.object_or_empty("log"), "log", {"trace"});
  const json& trace = log.get_or("trace", "");
  if (!trace.is_string()) config_error("log.trace", "must be a file path (string), got " + trace.dump());
  out.trace_path = trace.get<std::string>();
  out.wall_clock_breakdown =
      read_bool(root.get_or("wall_clock_breakdown", false), "wall_clock_breakdown");
}

// `checkpoint`: see CheckpointConfig.
void parse_checkpoint(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("checkpoint"), "checkpoint",
              {"dir", "every_steps", "keep_last", "save_on_exit", "resume"});
  CheckpointConfig& checkpoint = out.checkpoint;
  checkpoint.dir = read_string(block.get_or("dir", ""), block.path("dir"));
  checkpoint.every_steps =
      read_integer_at_least(block.get_or("every_steps", 0), block.path("every_steps"), 0);
  checkpoint.keep_last =
      read_integer_at_least(block.get_or("keep_last", 0), block.path("keep_last"), 0);
  checkpoint.save_on_exit =
      read_bool(block.get_or("save_on_exit", true), block.path("save_on_exit"));
  checkpoint.resume = read_string(block.get_or("resume", ""), block.path("resume"));
  if (checkpoint.dir.empty() && checkpoint.every_steps > 0) {
    config_error(block.path("dir"), "missing; checkpoint.every_steps needs a directory to save in");
  }
  if (checkpoint.dir.empty() && checkpoint.resume == "auto") {
    config_error(block.path("resume"),
                 "\"auto\" resumes from checkpoint.dir's latest checkpoint, but checkpoint.dir is "
                 "not set");
  }
}

TrainConfig parse_train_config(const json& config, const std::vector<std::string>& overrides) {
  TrainConfig out;
  out.json = config;
  for (const std::string& assignment : overrides) apply_override(out.json, assignment);

  Block root(out.json, "",
             {"model", "world", "seed", "steps", "train_micro_batch_size_per_gpu",
              "train_batch_size", "gradient_accumulation_steps", "gradient_clipping",
              "optimizer", "zero_optimization", "data", "log_interval", "bf16", "fp16",
              "communication_data_type", "log", "wall_clock_breakdown", "scheduler",
              "checkpoint"},
             {{"stage", "zero_optimization.stage"},
              {"ranks", "world.ranks"},
              {"backend", "world.backend"},
              {"device", "world.device"},
              {"device_memory", "world.device_memory"},
              {"sizes", "model.sizes"},
              {"lr", "optimizer.params.lr"},
              {"betas", "optimizer.params.betas"},
              {"weight_decay", "optimizer.params.weight_decay"}});

  parse_world(root, out);
  parse_model(root, out);
  parse_data(root, out);

  const json& seed = root.get_or("seed", out.engine.seed);
  if (seed.is_number_unsigned()) {
    out.engine.seed = seed.get<std::uint64_t>();
  } else {
    out.engine.seed = static_cast<std::uint64_t>(read_integer_at_least(seed, "seed", 0));
  }
  out.steps = read_integer_at_least(root.require("steps", "the number of optimizer steps (>= 1)"),
                                    "steps", 1);
  parse_batch(root, out);

  const double clipping =
      read_number(root.get_or("gradient_clipping", 0.0), "gradient_clipping");
  if (clipping < 0) {
    config_error("gradient_clipping",
                 "must be a number >= 0 (0 turns clipping off), got " + json(clipping).dump());
  }
  out.engine.gradient_clipping = static_cast<float>(clipping);

  parse_optimizer(root, out);
  parse_scheduler(root, out);
  parse_zero(root, out);
  parse_precision(root, out);
  out.log_interval = read_integer_at_least(root.get_or("log_interval", 1), "log_interval", 1);
  parse_log(root, out);
  parse_checkpoint(root, out);
  return out;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  json config = read_json_file(path);
  try {
    return parse_train_config(config, overrides);
  } catch (const Error& error) {
    if (error.kind() != ErrorKind::kConfig) throw;
    throw Error(ErrorKind::kConfig, path + ": " + error.what());
  }
}

}  // namespace zest
