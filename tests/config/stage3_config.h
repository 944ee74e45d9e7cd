// The small valid config the config suites break one key at a time: an MLP on 4 ranks as
// threads at ZeRO stage 3.
#pragma once

#include <nlohmann/json.hpp>

namespace zest::testing {

inline nlohmann::json stage3_mlp_config() {
  return nlohmann::json::parse(R"({
    "model": {"type": "mlp", "sizes": [8, 16, 4]},
    "world": {"backend": "local", "ranks": 4},
    "steps": 10,
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 3}
  })");
}

}  // namespace zest::testing
