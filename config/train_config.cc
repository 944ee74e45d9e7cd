// The trainer config's root: the top-level keys and the order the blocks are read in, plus the
// blocks about the run itself — world, batch sizes, evaluation, log and checkpoint. The model,
// data and optimization blocks live in model_data_blocks.cc and optimization_blocks.cc.
#include "config/train_config.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/byte_size.h"
#include "base/error.h"
#include "config/blocks.h"

namespace zest {

using nlohmann::json;

namespace config_blocks {

using namespace config_reading;

// world.link: the modelled inter-node network (runtime/link_model.h). "model": "auto" models it
// for ranks as threads, whose nodes exist only in world.ranks_per_node; "on" / "off" force it.
static void parse_link(Block& world, LinkOptions& out) {
  Block block(world.object_or_empty("link"), world.path("link"),
              {"model", "bandwidth_gbit_s", "latency_us"});
  const std::string model = read_string(block.get_or("model", "auto"), block.path("model"));
  if (model == "on" || model == "off") {
    out.modelled = model == "on";
  } else if (model != "auto") {
    config_error(block.path("model"), "must be \"auto\", \"on\" or \"off\", got \"" + model + "\"");
  }
  out.bandwidth_gbit_s =
      read_number(block.get_or("bandwidth_gbit_s", out.bandwidth_gbit_s), block.path("bandwidth_gbit_s"));
  // Note: a floor of 1 Mbit/s, since a link slower still only makes collectives time out (or,
  // at 1e-300, overflowed the modelled delay); the runtime fails any wait past the timeout.
  if (!(out.bandwidth_gbit_s >= 1e-3 && out.bandwidth_gbit_s <= 1e6)) {
    config_error(block.path("bandwidth_gbit_s"),
                 "must be a number of gigabits per second from 0.001 to 1e6, got " +
                     block.find("bandwidth_gbit_s")->dump());
  }
  out.latency_us = read_number(block.get_or("latency_us", out.latency_us), block.path("latency_us"));
  if (out.latency_us < 0.0 || out.latency_us > 1e6) {
    config_error(block.path("latency_us"), "must be a number of microseconds from 0 to 1e6, got " +
                                               block.find("latency_us")->dump());
  }
}

void parse_world(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("world"), "world",
              {"backend", "ranks", "ranks_per_node", "link", "device", "device_memory",
               "host_memory", "timeout_s", "pin_ranks"});

  // The default backend is the device's: local (threads) for cpu, nccl for cuda.
  const bool cuda = block.find("device") != nullptr && block.find("device")->is_string() &&
                    block.find("device")->get<std::string>() == "cuda";
  out.world.backend =
      read_string(block.get_or("backend", cuda ? "nccl" : "local"), block.path("backend"));
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

  // "auto": the launcher's count where it says (Open MPI, Slurm), else every rank on one node.
  const json& per_node = block.get_or("ranks_per_node", "auto");
  if (!(per_node.is_string() && per_node == "auto")) {
    const bool integral = per_node.is_number() && !per_node.is_boolean();
    const std::int64_t value = integral ? read_integer(per_node, block.path("ranks_per_node")) : 0;
    if (value < 1 || value > 65536) {
      config_error(block.path("ranks_per_node"),
                   "must be \"auto\" or an integer from 1 to 65536, got " + per_node.dump());
    }
    // With processes world.ranks may be left at 1: the World checks against the launcher's count.
    if (ranks > 1 && ranks % value != 0) {
      config_error(block.path("ranks_per_node"),
                   std::to_string(value) + " does not divide world.ranks " +
                       std::to_string(ranks) + "; every node runs the same number of ranks");
    }
    out.world.ranks_per_node = static_cast<int>(value);
  }

  const std::string device = read_string(block.get_or("device", "cpu"), block.path("device"));
  if (device == "cpu") {
    out.world.device = DeviceKind::kCpu;
  } else if (device == "cuda") {
    out.world.device = DeviceKind::kCuda;
  } else {
    config_error(block.path("device"), "must be cpu or cuda, got \"" + device + "\"");
  }

  // device_memory: each rank's device; host_memory: each rank's host arena, where an offloaded
  // optimizer lives (zero_optimization.offload_optimizer).
  for (const char* key : {"device_memory", "host_memory"}) {
    const json& memory = block.get_or(key, "unlimited");
    const std::string memory_path = block.path(key);
    const std::string memory_forms =
        std::string("must be \"unlimited\" or ") + kByteSizeForms + ", got ";
    std::size_t& capacity =
        std::string(key) == "device_memory" ? out.world.device_memory : out.world.host_memory;
    if (memory.is_string()) {
      const std::string text = memory.get<std::string>();
      if (text == "unlimited") {
        capacity = kUnlimitedCapacity;
      } else if (auto bytes = parse_byte_size(text); bytes && *bytes > 0) {
        capacity = *bytes;
      } else {
        config_error(memory_path, memory_forms + "\"" + text + "\"");
      }
    } else if (memory.is_number()) {
      const std::int64_t bytes = read_integer(memory, memory_path);
      if (bytes < 1) config_error(memory_path, memory_forms + std::to_string(bytes));
      capacity = static_cast<std::size_t>(bytes);
    } else {
      config_error(memory_path, memory_forms + describe(memory));
    }
  }

  parse_link(block, out.world.link);

  const double timeout = read_number(block.get_or("timeout_s", 300), block.path("timeout_s"));
  if (timeout <= 0 || timeout > 1e9) {
    config_error(block.path("timeout_s"),
                 "must be a number of seconds > 0, got " + block.find("timeout_s")->dump());
  }
  out.world.timeout = std::chrono::milliseconds(
      std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(timeout * 1000.0))));

  // Ranks as threads that outnumber the cores run pinned (runtime/core_pinning.h); "off" for a
  // machine shared with other work, "on" to pin even with a core for each rank.
  const std::string pinning =
      read_string(block.get_or("pin_ranks", "auto"), block.path("pin_ranks"));
  if (pinning == "on") {
    out.world.pin_ranks = RankPinning::kOn;
  } else if (pinning == "off") {
    out.world.pin_ranks = RankPinning::kOff;
  } else if (pinning != "auto") {
    config_error(block.path("pin_ranks"),
                 "must be \"auto\", \"on\" or \"off\", got \"" + pinning + "\"");
  }
}

// DeepSpeed's rule: train_batch_size = train_micro_batch_size_per_gpu ×
// gradient_accumulation_steps × world size; any two determine the third.
void parse_batch(Block& root, TrainConfig& out) {
  const char* kTotal = "train_batch_size";
  const char* kMicro = "train_micro_batch_size_per_gpu";
  const char* kAccumulation = "gradient_accumulation_steps";
  // "auto" (as in DeepSpeed configs written for the Hugging Face integration) means: derive
  // it from the others by the rule below, as if it were absent.
  auto read = [&](const char* key) -> std::optional<std::int64_t> {
    const json* value = root.find(key);
    if (value == nullptr || (value->is_string() && *value == "auto")) return std::nullopt;
    if (value->is_string()) {
      config_error(key, "must be an integer >= 1 or \"auto\", got " + describe(*value));
    }
    return read_integer_at_least(*value, key, 1);
  };
  const std::optional<std::int64_t> total = read(kTotal);
  const std::optional<std::int64_t> micro = read(kMicro);
  std::optional<std::int64_t> accumulation = read(kAccumulation);
  // With pipeline stages, the batch counts the data-parallel ranks, and the pipeline's
  // micro-batches are the accumulation steps (DeepSpeed's pipeline engine).
  const bool pipelined = out.pipeline.stages > 1 || out.tensor_parallel.enabled();
  const std::int64_t ranks = out.pipeline.data_parallel;
  const std::string ranks_name =
      !pipelined ? "world.ranks"
      : out.tensor_parallel.enabled()
          ? "data-parallel ranks (world.ranks / pipeline.stages / tensor_parallel.size)"
          : "data-parallel ranks (world.ranks / pipeline.stages)";
  const int pipeline_micro_batches = out.pipeline.micro_batches;
  const bool accumulation_from_pipeline = !accumulation && pipeline_micro_batches > 0;
  if (accumulation && pipeline_micro_batches > 0 && *accumulation != pipeline_micro_batches) {
    config_error("pipeline.micro_batches",
                 std::to_string(pipeline_micro_batches) + " differs from " + kAccumulation + " " +
                     std::to_string(*accumulation) +
                     ": a pipeline's micro-batches are the step's accumulation steps; set one");
  }
  if (accumulation_from_pipeline) accumulation = pipeline_micro_batches;
  const std::string rule = std::string("; need ") + kTotal + " = " + kMicro + " x " +
                           kAccumulation + " x " + ranks_name;
  auto value_of = [](const char* key, std::optional<std::int64_t> value) {
    return std::string(key) + " " + (value ? std::to_string(*value) : "unset");
  };
  auto inconsistent = [&](const std::string& what) {
    throw Error(ErrorKind::kConfig,
                "batch sizes are inconsistent: " + value_of(kTotal, total) + ", " +
                    value_of(kMicro, micro) + ", " + value_of(kAccumulation, accumulation) +
                    (accumulation_from_pipeline ? " (pipeline.micro_batches)" : "") + ", " +
                    (pipelined ? "data-parallel ranks " : "world.ranks ") +
                    std::to_string(ranks) + " (" + what + ")" + rule);
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
      inconsistent(std::to_string(*total) + " is not a multiple of " +
                   (pipelined ? "the data-parallel ranks " : "world.ranks ") +
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
  out.pipeline.micro_batches = out.engine.gradient_accumulation_steps;
  root.get_or(kTotal, 0) = out.train_batch_size;
  root.get_or(kMicro, 0) = out.micro_batch;
  root.get_or(kAccumulation, 0) = out.gradient_accumulation_steps;
}

// `eval_every` (zest's own): the held-out loss every this many steps, over data.val_batches
// batches. Sequence data needs held-out sequences to evaluate on.
void parse_eval(Block& root, TrainConfig& out) {
  out.eval_every = read_integer_at_least(root.get_or("eval_every", 0), "eval_every", 0);
  if (out.eval_every == 0 || out.data.type == "synthetic") return;
  if (out.data.val_path.empty() && out.data.val_fraction <= 0) {
    config_error("eval_every", std::to_string(out.eval_every) +
                                   " needs held-out sequences: set data.val_fraction (e.g. 0.1) "
                                   "or data.val_path, or eval_every 0");
  }
}

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
// Under a pipeline, hybrid sharding splits each pipeline stage's data-parallel group
// (pipeline/pipeline_trainer.h): a size must divide that group, not only the world. At stage 0
// too, where it changes nothing but the pipeline still checks it against the group
// (engine/hybrid_shards.h).
// "node" is checked where the config knows the node: world.ranks_per_node given, or ranks as
// threads of the local backend, which are one node unless it is given; a launcher's nodes are
// checked when the pipeline starts.
static void check_hybrid_pipeline(const TrainConfig& out) {
  int asked = out.engine.hybrid_shard_size;
  const bool node = asked == kHybridShardNode;
  if (node && out.world.ranks_per_node > 0) asked = out.world.ranks_per_node;
  if (node && out.world.ranks_per_node == 0 && out.world.backend == "local") asked = out.world.ranks;
  if (!out.pipeline.enabled() || asked <= 0) return;
  const int data_parallel = out.pipeline.data_parallel;
  if (data_parallel % asked == 0) return;
  config_error("zero_optimization.hybrid_shard_size",
               "must divide the data-parallel ranks of each pipeline stage (world.ranks " +
                   std::to_string(out.world.ranks) + " / pipeline.stages " +
                   std::to_string(out.pipeline.stages) + " = " + std::to_string(data_parallel) +
                   "), got " +
                   (node ? "\"node\" (" + std::to_string(asked) + " ranks)"
                         : std::to_string(asked)));
}

// Note: qgZ's exchange is sends and receives inside the data-parallel group; inside pipeline
// stages they would share the ranks with the interpreter's own transfers, a schedule no test has
// run yet, so the combination is refused rather than risked.
static void refuse_quantized_gradients_pipeline(const TrainConfig& out) {
  if (!out.engine.quantized_gradients || !out.pipeline.enabled()) return;
  config_error("zero_optimization.zero_quantized_gradients",
               "true is not supported inside pipeline stages yet, and pipeline.stages is " +
                   std::to_string(out.pipeline.stages) +
                   "; set zero_quantized_gradients to false or leave the pipeline block out");
}

// Note: hpZ inside pipeline stages would need each pipeline stage's data-parallel groups to lie
// inside nodes in groups of zero_hpz_partition_size; untested, so refused as hybrid sharding is.
static void refuse_hpz_pipeline(const TrainConfig& out) {
  if (!out.pipeline.enabled() || out.engine.hpz_group_size == 1) return;
  config_error("zero_optimization.zero_hpz_partition_size",
               "the secondary shard inside pipeline stages is not supported yet, and "
               "pipeline.stages is " + std::to_string(out.pipeline.stages) +
                   "; set zero_hpz_partition_size to 1 or leave the pipeline block out");
}

void parse_checkpoint(Block& root, TrainConfig& out) {
  Block block(root.object_or_empty("checkpoint"), "checkpoint",
              {"dir", "every_steps", "keep_last", "save_on_exit", "async", "resume"});
  CheckpointConfig& checkpoint = out.checkpoint;
  checkpoint.dir = read_string(block.get_or("dir", ""), block.path("dir"));
  checkpoint.every_steps =
      read_integer_at_least(block.get_or("every_steps", 0), block.path("every_steps"), 0);
  checkpoint.keep_last =
      read_integer_at_least(block.get_or("keep_last", 0), block.path("keep_last"), 0);
  checkpoint.save_on_exit =
      read_bool(block.get_or("save_on_exit", true), block.path("save_on_exit"));
  checkpoint.async = read_bool(block.get_or("async", false), block.path("async"));
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

}  // namespace config_blocks

TrainConfig parse_train_config(const json& config, const std::vector<std::string>& overrides) {
  using namespace config_blocks;
  TrainConfig out;
  out.json = config;
  for (const std::string& assignment : overrides) apply_override(out.json, assignment);

  Block root(out.json, "",
             {"model", "world", "seed", "steps", "train_micro_batch_size_per_gpu",
              "train_batch_size", "gradient_accumulation_steps", "gradient_clipping",
              "optimizer", "zero_optimization", "data", "steps_per_print", "bf16", "fp16",
              "communication_data_type", "log", "wall_clock_breakdown", "scheduler",
              "checkpoint", "eval_every", "debug", "csv_monitor", "tensorboard", "wandb",
              "comet", "activation_checkpointing", "pipeline", "aio", "outer_loop",
              "tensor_parallel"},
             {{"stage", "zero_optimization.stage"},
              {"ranks", "world.ranks"},
              {"backend", "world.backend"},
              {"device", "world.device"},
              {"device_memory", "world.device_memory"},
              {"host_memory", "world.host_memory"},
              {"offload_optimizer", "zero_optimization.offload_optimizer"},
              {"offload_param", "zero_optimization.offload_param"},
              {"sizes", "model.sizes"},
              {"lr", "optimizer.params.lr"},
              {"betas", "optimizer.params.betas"},
              {"weight_decay", "optimizer.params.weight_decay"},
              {"log_interval", "steps_per_print"},
              {"n_layer", "model.n_layer"},
              {"seq_len", "model.seq_len"},
              {"init_from", "model.init_from"},
              {"every_steps", "checkpoint.every_steps"},
              {"cpu_checkpointing", "activation_checkpointing.cpu_checkpointing"},
              {"partition_activations", "activation_checkpointing.partition_activations"},
              {"micro_batches", "pipeline.micro_batches"},
              {"virtual_chunks", "pipeline.virtual_chunks"},
              {"reshard_after_forward", "pipeline.reshard_after_forward"},
              {"pipeline_stages", "pipeline.stages"}});

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
  parse_pipeline_shape(root, out);
  parse_tensor_parallel_shape(root, out);
  parse_batch(root, out);

  const double clipping =
      read_float(root.get_or("gradient_clipping", 0.0), "gradient_clipping");
  if (clipping < 0) {
    config_error("gradient_clipping",
                 "must be a number >= 0 (0 turns clipping off), got " + json(clipping).dump());
  }
  out.engine.gradient_clipping = static_cast<float>(clipping);

  parse_optimizer(root, out);
  parse_scheduler(root, out);
  parse_zero(root, out);
  parse_aio(root, out);
  parse_precision(root, out);
  parse_activation_checkpointing(root, out);
  out.steps_per_print =
      read_integer_at_least(root.get_or("steps_per_print", 10), "steps_per_print", 1);
  parse_eval(root, out);
  parse_log(root, out);
  parse_checkpoint(root, out);
  parse_debug(root, out);
  parse_monitor(root, out);
  parse_pipeline(root, out);
  parse_outer_loop(root, out);
  check_hybrid_pipeline(out);
  refuse_quantized_gradients_pipeline(out);
  refuse_hpz_pipeline(out);
  refuse_offload_param_pipeline(out);
  refuse_tensor_parallel_compositions(out);
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
