// The trainer's configuration: one JSON file with DeepSpeed's key names where the concept is the
// same (train_batch_size, optimizer, zero_optimization.stage, ...) plus zest's own `model`,
// `data` and `world` blocks, and `--set dotted.key=value` overrides applied before validation.
// Invariant: a TrainConfig is validated — every key known, every value of its type and in range,
// the batch sizes consistent — and `json` is the config that produced it (overrides applied,
// defaults filled in). It is plain options: what needs the model's shapes or the planner (the
// pipeline's partition, the recomputed units, the out-of-memory advice) is decided by the
// resolution step, resolve/resolved_config.h, through which every program loads a config.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/registry.h"
#include "engine/engine.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "runtime/world.h"

namespace zest {

// `model`: which built-in model and its options (models/registry.h), and where its parameters
// start from.
struct ModelConfig : ModelSpec {
  // A safetensors file of the model's full parameters to start from ("" = the seeded
  // initializer); a resumed checkpoint takes precedence.
  std::string init_from;
};

// `data`: where batches come from (data/batch_source.h).
//   "synthetic": the classification task for the MLP (features / classes from model.sizes);
//   "tokens":    llm.c `.bin` token shards, `path` a file or a glob;
//   "text":      a plain text file, byte-level tokens (needs model.vocab_size >= 256).
// Held-out sequences: `val_path` (same type as `path`) or the last `val_fraction` of the data.
struct DataConfig {
  std::string type = "synthetic";
  std::int64_t features = 0;  // synthetic: == model.sizes[0]
  std::int64_t classes = 0;   // synthetic: == model.sizes[last]
  std::string path;           // tokens / text
  std::string val_path;       // tokens / text; "" = split val_fraction off `path`
  double val_fraction = 0.0;  // tokens / text, without val_path
  std::int64_t val_batches = 4;  // global batches (of micro-batch x ranks rows) per evaluation
};

// DeepSpeed's zero_optimization keys about overlap and buckets, as given (defaults filled in),
// all of which the engine acts on (EngineOptions). Two are accepted in the one form zest
// implements and refused otherwise: contiguous_gradients (gradients are always contiguous,
// true) and allgather_bucket_size (refused: stages 1-2 gather each unit in place, with no bucket).
struct ZeroOverlapConfig {
  std::int64_t reduce_bucket_size = 0;           // elements
  bool overlap_comm = true;
  std::int64_t stage3_prefetch_bucket_size = 0;  // elements
  std::int64_t stage3_max_live_parameters = 0;   // elements; 0 = as many as the prefetch needs
  bool contiguous_gradients = true;
};

// `checkpoint` (zest's own): where and when the trainer saves, and what it resumes from.
struct CheckpointConfig {
  std::string dir;                // the checkpoint root (step-<N>/, latest); empty: no saves
  std::int64_t every_steps = 0;   // save after every this many steps; 0: only on exit
  std::int64_t keep_last = 0;     // step directories kept after a save; 0: all
  bool save_on_exit = true;       // save at the end and on SIGINT / SIGTERM (needs dir)
  bool async = false;             // write in the background while training goes on
  std::string resume;             // "": start fresh; "auto": dir's latest if any; else a path
};

// DeepSpeed's `csv_monitor`: one CSV file per quantity, DeepSpeed's layout
// (<output_path>/<job_name>/Train_Samples_train_loss.csv, ...; tools/train/csv_monitor.h).
struct CsvMonitorConfig {
  bool enabled = false;
  std::string output_path;  // "": the working directory, as DeepSpeed's os.path.join("", job)
  std::string job_name = "DeepSpeedJobName";
};

// `pipeline`: the model split into pipeline stages, each a run of units on world.ranks /
// pipeline.stages data-parallel ranks (DeepSpeed's block names `stages` and `partition`; the rest
// are zest's). The micro-batches of a step are gradient_accumulation_steps, as in DeepSpeed's
// pipeline engine, and train_batch_size counts the data-parallel ranks only. Without the block: one
// pipeline stage holding every unit, and nothing else changes.
struct PipelineConfig {
  int stages = 1;
  int micro_batches = 1;   // per step: == gradient_accumulation_steps
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int virtual_chunks = 1;  // model chunks per pipeline stage (interleaved_1f1b: >= 2)
  PartitionMethod partition = PartitionMethod::kParameters;  // kExplicit for a written list
  std::vector<std::size_t> written_partition;  // kExplicit: the list as written, unchecked
  // Resolved (resolve/pipeline_partition.h; without the block, the parser's one entry): the
  // units of each virtual stage (chunk c of pipeline stage s is virtual stage c·pipeline.stages +
  // s), in model order; one entry per virtual stage, none zero, summing to the model's units.
  std::vector<std::size_t> units_per_virtual_stage;
  // Stage 3 only: false keeps a pipeline stage's parameters gathered across the micro-batches
  // of a step (FSDP2's reshard_after_forward=False), true gathers them per micro-batch.
  bool reshard_after_forward = true;
  // world.ranks / (pipeline.stages x tensor_parallel.size): the data-parallel ranks of each
  // pipeline stage
  int data_parallel = 1;
  bool enabled() const { return stages > 1; }
  int virtual_stages() const { return stages * virtual_chunks; }
};

// `tensor_parallel`: each GPT layer's matrix products split across `size` ranks (Megatron's
// tensor parallelism, models/tensor_parallel_gpt.h); world.ranks = pipeline stages x data-parallel
// ranks x size, the tensor-parallel index fastest (runtime/device_mesh.h). DeepSpeed's
// `autotp_size` is read as `size`. Without the block, or with size 1: nothing changes.
struct TensorParallelConfig {
  int size = 1;
  // LayerNorms and the residual stream split along the tokens (models/tensor_slice.h); no
  // effect at size 1.
  bool sequence_parallel = false;
  bool enabled() const { return size > 1; }
};

struct PipelineOptions;  // pipeline/pipeline_options.h
// The block as the PipelineTrainer's options (pipeline/pipeline_trainer.h).
PipelineOptions pipeline_options(const PipelineConfig& config);

struct TrainConfig {
  nlohmann::json json;  // resolved: overrides applied, defaults filled in

  WorldOptions world;
  // stage, seed, gradient_clipping, gradient_accumulation_steps, the overlap keys it implements,
  // zero_optimization.offload_optimizer, and the dtypes and loss scaling of the bf16 / fp16 /
  // communication_data_type keys
  EngineOptions engine;
  OptimizerOptions optimizer;
  LrScheduleOptions scheduler;  // `scheduler`: DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR
  ModelConfig model;
  DataConfig data;
  ZeroOverlapConfig zero_overlap;
  CheckpointConfig checkpoint;
  CsvMonitorConfig csv_monitor;
  PipelineConfig pipeline;
  TensorParallelConfig tensor_parallel;

  std::int64_t steps = 0;
  std::int64_t micro_batch = 0;                  // train_micro_batch_size_per_gpu
  std::int64_t gradient_accumulation_steps = 1;
  // micro_batch × accumulation × data-parallel ranks (world.ranks / pipeline.stages /
  // tensor_parallel.size)
  std::int64_t train_batch_size = 0;
  // A plain progress line every this many steps (DeepSpeed's steps_per_print); on a terminal
  // one live line is redrawn every step instead.
  std::int64_t steps_per_print = 10;
  std::int64_t eval_every = 0;  // held-out loss every this many steps (and at the end); 0: never
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
