// The trainer's configuration: one JSON file with DeepSpeed's key names where the concept is the
// same (train_batch_size, optimizer, zero_optimization.stage, ...) plus zest's own `model`,
// `data` and `world` blocks, and `--set dotted.key=value` overrides applied before validation.
// Invariant: a TrainConfig is fully validated — every key known, every value of its type and in
// range, the batch sizes consistent — and `json` is the resolved config that produced it
// (overrides applied, defaults filled in), fit for printing and for manifests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/mlp.h"
#include "optim/engine.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "runtime/world.h"

namespace zest {

// `model`: which built-in model, and its own config. One member per model type; the next model
// ("gpt") adds its type name and config beside "mlp".
struct ModelConfig {
  std::string type = "mlp";
  MlpConfig mlp;  // type == "mlp"
};

// `data`: where batches come from. Only the synthetic classification task for now.
struct DataConfig {
  std::string type = "synthetic";
  std::int64_t features = 0;  // == model.sizes[0]
  std::int64_t classes = 0;   // == model.sizes[last]
};

// DeepSpeed's zero_optimization keys for overlapping communication with compute, as given
// (defaults filled in where the engine has one). overlap_comm, reduce_bucket_size and
// stage3_prefetch_bucket_size are also passed on in EngineOptions.
// Note: allgather_bucket_size, stage3_max_live_parameters and contiguous_gradients are accepted
// and recorded so that existing DeepSpeed configs load, but nothing reads them yet: the engine
// gathers whole units (stage 3 sizes its ring from stage3_prefetch_bucket_size) and its gradient
// buffers are always contiguous.
struct ZeroOverlapConfig {
  std::optional<std::int64_t> reduce_bucket_size;           // elements
  std::optional<std::int64_t> allgather_bucket_size;        // elements
  std::optional<bool> overlap_comm;
  std::optional<std::int64_t> stage3_prefetch_bucket_size;  // elements
  std::optional<std::int64_t> stage3_max_live_parameters;   // elements
  std::optional<bool> contiguous_gradients;
};

// `checkpoint` (zest's own): where and when the trainer saves, and what it resumes from.
struct CheckpointConfig {
  std::string dir;                // the checkpoint root (step-<N>/, latest); empty: no saves
  std::int64_t every_steps = 0;   // save after every this many steps; 0: only on exit
  std::int64_t keep_last = 0;     // step directories kept after a save; 0: all
  bool save_on_exit = true;       // save at the end and on SIGINT / SIGTERM (needs dir)
  std::string resume;             // "": start fresh; "auto": dir's latest if any; else a path
};

struct TrainConfig {
  nlohmann::json json;  // resolved: overrides applied, defaults filled in

  WorldOptions world;
  // stage, seed, gradient_clipping, gradient_accumulation_steps, the overlap keys it implements,
  // and the dtypes and loss scaling of the bf16 / fp16 / communication_data_type keys
  EngineOptions engine;
  OptimizerOptions optimizer;
  LrScheduleOptions scheduler;  // `scheduler`: DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR
  ModelConfig model;
  DataConfig data;
  ZeroOverlapConfig zero_overlap;
  CheckpointConfig checkpoint;

  std::int64_t steps = 0;
  std::int64_t micro_batch = 0;                  // train_micro_batch_size_per_gpu
  std::int64_t gradient_accumulation_steps = 1;
  std::int64_t train_batch_size = 0;             // micro_batch × accumulation × world.ranks
  std::int64_t log_interval = 1;                 // print every this many steps
  // `log.trace`: write a Chrome trace of every rank's streams here (empty: none).
  // `wall_clock_breakdown`: print per rank compute time, comm time and the share hidden.
  std::string trace_path;
  bool wall_clock_breakdown = false;
};

// Reads `path`, applies `overrides` ("dotted.key=value", in order) and validates. Throws a
// kConfig Error naming the file (missing, unreadable, or not JSON — then with line and column)
// or the JSON path of a bad key; a malformed override is a kUsage Error.
TrainConfig load_train_config(const std::string& path,
                              const std::vector<std::string>& overrides = {});

// The same for a config already in memory.
TrainConfig parse_train_config(const nlohmann::json& config,
                               const std::vector<std::string>& overrides = {});

// Applies one override "dotted.key=value" to `config` in place. The value is parsed as JSON when
// it parses (numbers, true/false, null, arrays, objects, "quoted strings") and is taken as a
// plain string otherwise. Missing objects on the path are created. Throws kUsage for a missing
// '=', an empty key segment, or a path through a value that is not an object.
void apply_override(nlohmann::json& config, const std::string& assignment);

// Reads a JSON file. Throws kConfig naming the file when it cannot be read, and "file:line:column"
// when it is not JSON.
nlohmann::json read_json_file(const std::string& path);

}  // namespace zest
