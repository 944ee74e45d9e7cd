// The built-in models by name: the one place that maps a model type ("mlp", "gpt") to its class
// and to the shape of its micro-batch, so that adding a model touches its own files, this
// registry and the config's `model` block only. Declaring a model allocates nothing: the engine
// owns parameter memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/module.h"
#include "engine/recompute.h"
#include "models/gpt.h"
#include "models/mlp.h"

namespace zest {

// Which built-in model, and its own options. One member per model type.
struct ModelSpec {
  std::string type = "mlp";  // "mlp" or "gpt"
  MlpConfig mlp;             // type == "mlp"
  GptConfig gpt;             // type == "gpt"
};

// Throws a kConfig Error naming model.type for an unknown type.
std::unique_ptr<Module> make_model(const ModelSpec& spec);

// The number of units make_model(spec) declares (a GPT's vocabulary pieces counted), in
// constant time: what a config checks before it names a model's units. The same errors as
// make_model.
std::size_t unit_count(const ModelSpec& spec);

// The names of the units make_model(spec) declares, in order, computed from `spec` without
// declaring the model (a GPT of many layers costs time per unit); the same errors as make_model.
// Note: the one place outside the models that knows their units' names and count; the pipeline
// partition, the recompute plan's names, debug.fault.unit and zest-estimate all read it.
std::vector<std::string> unit_names(const ModelSpec& spec);

// Per unit of unit_names(spec): what recomputation it allows (engine/recompute.h: the uncut
// GPT's embedding none, a vocabulary piece full only, the blocks selective too), without
// declaring the model.
std::vector<Recomputable> recomputable_units(const ModelSpec& spec);

// The shape of one rank's micro-batch inputs for `spec`: [micro, sizes[0]] features for the MLP,
// [micro, seq_len] tokens for the GPT (Module::unit_memory's argument).
std::vector<std::int64_t> micro_batch_shape(const ModelSpec& spec, std::int64_t micro_batch);

// The bytes of one rank's micro-batch as the data sources make it: int32 tokens and next tokens
// [micro, seq_len] for the GPT; fp32 features [micro, sizes[0]] and int32 classes [micro] for
// the MLP. What a CUDA device copies in per micro-batch (engine/device_batch.h).
std::size_t micro_batch_bytes(const ModelSpec& spec, std::int64_t micro_batch);

// The number of parameter elements `module` declares (unpadded), for reports.
std::size_t count_parameters(Module& module);

}  // namespace zest
