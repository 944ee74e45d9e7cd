#include "resolve/recomputed_units.h"

#include <string>
#include <vector>

#include "engine/recompute.h"
#include "models/registry.h"

namespace zest {
namespace {

// The tools refuse a model of more units (tools/common/model_size.h: kMaxModelUnits).
constexpr std::size_t kMaxUnitsNamed = std::size_t{1} << 16;

}  // namespace

void resolve_recomputed_units(TrainConfig& config) {
  const ActivationCheckpointing& options = config.engine.activation_checkpointing;
  nlohmann::json recomputed = nlohmann::json::array();
  if (options.enabled() && unit_count(config.model) <= kMaxUnitsNamed) {
    const std::vector<std::string> names = unit_names(config.model);
    const std::vector<RecomputePolicy> plan =
        plan_recompute(options, recomputable_units(config.model));
    for (std::size_t u = 0; u < names.size(); ++u) {
      if (plan[u] != RecomputePolicy::kNone) recomputed.push_back(names[u]);
    }
  }
  config.json["activation_checkpointing"]["recomputed"] = std::move(recomputed);
}

}  // namespace zest
