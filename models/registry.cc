#include "models/registry.h"

#include "base/error.h"

namespace zest {

std::unique_ptr<Module> make_model(const ModelSpec& spec) {
  if (spec.type == "mlp") return std::make_unique<Mlp>(spec.mlp);
  if (spec.type == "gpt") return std::make_unique<Gpt>(spec.gpt);
  throw Error(ErrorKind::kConfig, "model.type: must be mlp or gpt, got \"" + spec.type + "\"");
}

std::vector<std::int64_t> micro_batch_shape(const ModelSpec& spec, std::int64_t micro_batch) {
  if (spec.type == "gpt") return {micro_batch, spec.gpt.seq_len};
  return {micro_batch, spec.mlp.sizes.empty() ? 0 : spec.mlp.sizes.front()};
}

std::size_t micro_batch_bytes(const ModelSpec& spec, std::int64_t micro_batch) {
  const std::vector<std::int64_t> shape = micro_batch_shape(spec, micro_batch);
  const auto elements = static_cast<std::size_t>(shape[0] * shape[1]);
  if (spec.type == "gpt") return 2 * elements * sizeof(std::int32_t);
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
