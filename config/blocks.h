// The trainer config's blocks, one parser each, shared by the files that implement them:
// train_config.cc (the root, world, batch sizes, log, checkpoint), config_model_data.cc (model,
// data), config_optimization.cc (optimizer, scheduler, zero_optimization, bf16 / fp16),
// debug_block.cc and monitor_block.cc (csv_monitor, tensorboard, wandb, comet), pipeline_block.cc.
// Each reads its keys from `root` (filling defaults into the resolved JSON) into `out`, and
// throws a kConfig Error naming the JSON path of the first bad value. Order matters: data reads
// the model, the batch sizes read the world, the scheduler reads steps and the optimizer.
#pragma once

#include "config/reading.h"
#include "config/train_config.h"

namespace zest::config_blocks {

using config_reading::Block;

void parse_world(Block& root, TrainConfig& out);
void parse_model(Block& root, TrainConfig& out);
void parse_data(Block& root, TrainConfig& out);
void parse_batch(Block& root, TrainConfig& out);
void parse_optimizer(Block& root, TrainConfig& out);
void parse_scheduler(Block& root, TrainConfig& out);
void parse_zero(Block& root, TrainConfig& out);
// offload_param_block.cc: zero_optimization.offload_param (read by parse_zero, after the stage,
// qwZ and hpZ), and its refusal inside pipeline stages (after parse_pipeline).
void parse_offload_param(Block& zero, TrainConfig& out);
void refuse_offload_param_pipeline(const TrainConfig& out);
void parse_precision(Block& root, TrainConfig& out);
void parse_log(Block& root, TrainConfig& out);
void parse_checkpoint(Block& root, TrainConfig& out);
void parse_debug(Block& root, TrainConfig& out);
void parse_monitor(Block& root, TrainConfig& out);
void parse_activation_checkpointing(Block& root, TrainConfig& out);  // checkpointing_block.cc
// nvme_blocks.cc: the NVMe tier's keys (offload_optimizer's, sub_group_size, the aio block).
void parse_offload_optimizer_nvme(Block& offload, TrainConfig& out);
void parse_sub_group_size(Block& zero, TrainConfig& out);
void parse_aio(Block& root, TrainConfig& out);
// pipeline_block.cc: the pipeline's shape (stages, micro_batches) before the batch sizes, which
// count its data-parallel ranks; the rest (schedule, partition) last, once the model, batch and
// engine options it plans with are known.
void parse_pipeline_shape(Block& root, TrainConfig& out);
void parse_pipeline(Block& root, TrainConfig& out);
// tensor_parallel_block.cc: the size, after the pipeline's shape (it divides the data-parallel
// ranks) and before the batch sizes; the refusals of what tensor parallelism does not compose
// with yet, last.
void parse_tensor_parallel_shape(Block& root, TrainConfig& out);
void refuse_tensor_parallel_compositions(const TrainConfig& out);
void parse_outer_loop(Block& root, TrainConfig& out);  // outer_loop_block.cc; after zero, pipeline

}  // namespace zest::config_blocks
