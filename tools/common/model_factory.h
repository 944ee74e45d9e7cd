// Builds the built-in model a config names. The one place that maps a model type to its class,
// so that adding a model touches the config parser and this file only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "optim/module.h"
#include "tools/common/train_config.h"

namespace zest {

std::unique_ptr<Module> make_model(const ModelConfig& config);

// The shape of one rank's micro-batch inputs for the model of `config`: [micro, sizes[0]]
// features for the MLP, [micro, seq_len] tokens for the GPT (Module::unit_memory's argument).
std::vector<std::int64_t> micro_batch_shape(const TrainConfig& config, std::int64_t micro_batch);

// The bytes of one rank's micro-batch as the data sources make it: int32 tokens and next tokens
// [micro, seq_len] for the GPT; fp32 features [micro, sizes[0]] and int32 classes [micro] for
// the MLP. What a CUDA device copies in per micro-batch (optim/device_batch.h).
std::size_t micro_batch_bytes(const TrainConfig& config, std::int64_t micro_batch);

// The number of parameter elements `module` declares (unpadded), for reports.
std::size_t count_parameters(Module& module);

}  // namespace zest
