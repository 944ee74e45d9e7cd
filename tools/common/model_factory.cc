#include "tools/common/model_factory.h"

#include "base/error.h"
#include "models/gpt.h"
#include "models/mlp.h"

namespace zest {

std::unique_ptr<Module> make_model(const ModelConfig& config) {
  if (config.type == "mlp") return std::make_unique<Mlp>(config.mlp);
  if (config.type == "gpt") return std::make_unique<Gpt>(config.gpt);
  throw Error(ErrorKind::kConfig, "model.type: must be mlp or gpt, got \"" + config.type + "\"");
}

std::vector<std::int64_t> micro_batch_shape(const TrainConfig& config, std::int64_t micro_batch) {
  if (config.model.type == "gpt") return {micro_batch, config.model.gpt.seq_len};
  return {micro_batch, config.model.mlp.sizes.empty() ? 0 : config.model.mlp.sizes.front()};
}

std::size_t micro_batch_bytes(const TrainConfig& config, std::int64_t micro_batch) {
  const std::vector<std::int64_t> shape = micro_batch_shape(config, micro_batch);
  const auto elements = static_cast<std::size_t>(shape[0] * shape[1]);
  if (config.model.type == "gpt") return 2 * elements * sizeof(std::int32_t);
  return elements * sizeof(float) + static_cast<std::size_t>(micro_batch) * sizeof(std::int32_t);
}

std::size_t count_parameters(Module& module) {
  std::size_t count = 0;
  for (Unit* unit : module.units()) {
    for (const ParamSpec& spec : unit->parameters()) {
      std::size_t numel = 1;
      for (std::int64_t d : spec.shape) numel *= static_cast<std::size_t>(d);
      count += numel;
    }
  }
  return count;
}

}  // namespace zest
