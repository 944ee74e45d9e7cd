// Builds the built-in model a config names. The one place that maps a model type to its class,
// so that adding a model touches the config parser and this file only.
#pragma once

#include <cstddef>
#include <memory>

#include "optim/module.h"
#include "tools/common/train_config.h"

namespace zest {

std::unique_ptr<Module> make_model(const ModelConfig& config);

// The number of parameter elements `module` declares (unpadded), for reports.
std::size_t count_parameters(Module& module);

}  // namespace zest
