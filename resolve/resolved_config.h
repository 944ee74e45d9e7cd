// The resolution step: what a parsed config (config/train_config.h) leaves to be decided by
// declaring the model's shapes and planning with them — the pipeline's partition into virtual
// stages, the units the recompute policy picks, the planner's out-of-memory advice. config/
// parses and validates and builds nothing; every program that runs a config (zest-train,
// zest-estimate, zest-report, the examples, a library user) loads it through here.
// Invariant: a resolved TrainConfig is ready to train, and its `json` shows what was decided
// (pipeline.units, activation_checkpointing.recomputed), fit for printing and for manifests.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/train_config.h"

namespace zest {

// Decides, in place, what `config` (as parse_train_config returns it) leaves open. Throws a
// kConfig Error naming the JSON path of what cannot be resolved (a partition with an empty
// virtual stage, fewer units than virtual stages, ...).
void resolve_train_config(TrainConfig& config);

// load_train_config, then resolve_train_config; an error of either names the file as
// load_train_config's do.
TrainConfig load_resolved_config(const std::string& path,
                                 const std::vector<std::string>& overrides = {});

// parse_train_config, then resolve_train_config.
TrainConfig parse_resolved_config(const nlohmann::json& config,
                                  const std::vector<std::string>& overrides = {});

}  // namespace zest
