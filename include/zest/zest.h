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
#include "runtime/stream.h"
#include "runtime/trace.h"
#include "runtime/world.h"

// optim/: the Module contract, optimizers, schedules, loss scaling, the ZeRO engine.
#include "optim/checkpoint_export.h"
#include "optim/checkpoint_reader.h"
#include "optim/checkpoint_reshard.h"
#include "optim/checkpoint_writer.h"
#include "optim/engine.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/module.h"
#include "optim/optimizer.h"
#include "optim/safetensors.h"

// models/ and data/: built-in models and token sources.
#include "data/token_batches.h"
#include "data/token_data.h"
#include "models/gpt.h"
#include "models/mlp.h"
