#include "engine/recompute.h"

#include "base/error.h"
#include "engine/module.h"

namespace zest {

const char* recompute_policy_name(RecomputePolicy policy) {
  switch (policy) {
    case RecomputePolicy::kSelective: return "selective";
    case RecomputePolicy::kFull: return "full";
    case RecomputePolicy::kNone: break;
  }
  return "none";
}

namespace {

std::string ordinal(std::size_t n) {
  const std::size_t tens = n % 100;
  const char* suffix = tens >= 11 && tens <= 13 ? "th"
                       : n % 10 == 1            ? "st"
                       : n % 10 == 2            ? "nd"
                       : n % 10 == 3            ? "rd"
                                                : "th";
  return std::to_string(n) + suffix;
}

}  // namespace

std::vector<Recomputable> recomputable_of(const std::vector<Unit*>& units) {
  std::vector<Recomputable> recomputable;
  for (const Unit* unit : units) {
    recomputable.push_back({!unit->gradients_replace_parameters(),
                            unit->supports_selective_recompute()});
  }
  return recomputable;
}

std::vector<RecomputePolicy> plan_recompute(const ActivationCheckpointing& options,
                                            const std::vector<Recomputable>& units) {
  const std::size_t count = units.size();
  std::vector<RecomputePolicy> plan(count, RecomputePolicy::kNone);
  if (!options.enabled()) return plan;
  if (options.every < 1) {
    throw Error(ErrorKind::kConfig, "activation_checkpointing.units.every: must be >= 1, got 0");
  }
  std::size_t named = 0;
  std::size_t recomputed = 0;
  for (std::size_t u = 0; u + 1 < count; ++u) {
    if (!options.names(u) || !units[u].full) continue;
    ++named;
    if (options.policy == RecomputePolicy::kSelective && !units[u].selective) continue;
    plan[u] = options.policy;
    ++recomputed;
  }
  const std::string model = "among the model's " + std::to_string(count) + " unit" +
                            (count == 1 ? "" : "s") + " (the last and an embedding never are)";
  if (named == 0 && options.first == 0 && options.every == 1) {
    // Nothing narrowed the list: the model itself has no unit to recompute.
    throw Error(ErrorKind::kConfig, std::string("activation_checkpointing.policy: \"") +
                                        recompute_policy_name(options.policy) +
                                        "\" finds no unit to recompute " + model +
                                        "; set \"none\"");
  }
  if (named == 0) {
    const bool both = options.first > 0 && options.every > 1;
    const std::string list =
        both ? "every " + ordinal(options.every) + " unit of the first " +
                   std::to_string(options.first)
        : options.first > 0 ? "the first " + std::to_string(options.first)
                            : "every " + ordinal(options.every) + " unit";
    const std::string advice = both                ? "lower every or raise first"
                               : options.first > 0 ? "raise first"
                                                   : "lower every";
    throw Error(ErrorKind::kConfig, "activation_checkpointing.units: " + list +
                                        " names no unit that can be recomputed " + model + "; " +
                                        advice);
  }
  if (recomputed == 0) {
    throw Error(ErrorKind::kConfig,
                "activation_checkpointing.policy: \"selective\" needs a unit that can recompute "
                "selectively (a GPT block), and none of the " +
                    std::to_string(named) + " unit" + (named == 1 ? "" : "s") +
                    " named can; use \"full\"");
  }
  return plan;
}

std::vector<RecomputePolicy> given_or_planned(const ActivationCheckpointing& options,
                                              const std::vector<RecomputePolicy>& given,
                                              const std::vector<Unit*>& units) {
  if (given.empty()) return plan_recompute(options, recomputable_of(units));
  if (given.size() != units.size()) {
    throw Error(ErrorKind::kUsage, "recompute_plan: " + std::to_string(given.size()) +
                                       " entries for a module of " +
                                       std::to_string(units.size()) + " units");
  }
  return given;
}

}  // namespace zest
