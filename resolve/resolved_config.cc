#include "resolve/resolved_config.h"

#include "base/error.h"
#include "planner/memory_advice.h"
#include "resolve/pipeline_partition.h"
#include "resolve/recomputed_units.h"

namespace zest {

void resolve_train_config(TrainConfig& config) {
  resolve_recomputed_units(config);
  resolve_pipeline_partition(config);
  // The engine takes the planner's out-of-memory advice as a hook (it never includes the planner).
  config.engine.out_of_memory_advice = training_memory_advice;
}

TrainConfig load_resolved_config(const std::string& path,
                                 const std::vector<std::string>& overrides) {
  TrainConfig config = load_train_config(path, overrides);
  try {
    resolve_train_config(config);
  } catch (const Error& error) {
    if (error.kind() != ErrorKind::kConfig) throw;
    throw Error(ErrorKind::kConfig, path + ": " + error.what());
  }
  return config;
}

TrainConfig parse_resolved_config(const nlohmann::json& json,
                                  const std::vector<std::string>& overrides) {
  TrainConfig config = parse_train_config(json, overrides);
  resolve_train_config(config);
  return config;
}

}  // namespace zest
