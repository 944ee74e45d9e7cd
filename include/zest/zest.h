// The umbrella header for programs that use zest as a library: `#include <zest/zest.h>` and link
// `zest::zest`. It includes the public header of each concept; a layer's own sources include the
// specific headers they need instead.
#pragma once

// base/: errors and element types, used by every layer.
#include "base/dtype.h"
#include "base/error.h"

// memory/: accounting allocators, buffers, views, the flat shard layout.
#include "memory/allocator.h"
#include "memory/category.h"
#include "memory/shard_layout.h"
#include "memory/tensor.h"

// runtime/: devices, streams, events, communicators, the world of ranks, the timeline.
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/device_mesh.h"
#include "runtime/stream.h"
#include "runtime/tensor_parallel_groups.h"
#include "runtime/trace.h"
#include "runtime/world.h"

// optim/: optimizers, schedules, loss scaling.
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"

// engine/: the Module contract, the ZeRO engine, the stage plan, the model-state prediction.
#include "engine/engine.h"
#include "engine/job_shape.h"
#include "engine/model_state.h"
#include "engine/module.h"
#include "engine/stage_plan.h"

// pipeline/: schedules as data, the check before the first step and the predicted bubble, and
// the interpreter that trains pipeline stages over the ZeRO engine.
#include "pipeline/pipeline_options.h"
#include "pipeline/pipeline_trainer.h"
#include "pipeline/schedule.h"
#include "pipeline/schedule_generators.h"
#include "pipeline/schedule_simulator.h"

// planner/: the peak-memory plan and out-of-memory advice.
#include "planner/memory_advice.h"
#include "planner/peak_plan.h"

// checkpoint/: save, load, reshard, export and import.
#include "checkpoint/export.h"
#include "checkpoint/parameter_import.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"

// models/ and data/: built-in models, their registry, and token sources.
#include "data/token_batches.h"
#include "data/token_data.h"
#include "models/gpt.h"
#include "models/mlp.h"
#include "models/registry.h"
#include "models/tensor_parallel_gpt.h"
#include "models/tensor_slice.h"

// config/: the JSON config shared with zest-train and zest-estimate; resolve/: loading it for a
// run (the partition, the recomputed units, the out-of-memory advice decided).
#include "config/train_config.h"
#include "resolve/resolved_config.h"
