#include "tools/estimate/estimate_report.h"

#include <array>
#include <iostream>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "memory/allocator.h"

namespace zest {
namespace {

std::string verdict(const EstimateJob& job, const PeakPrediction& prediction,
                    std::size_t capacity) {
  if (capacity == kUnlimitedCapacity) {
    return "no device capacity given (--device-memory or world.device_memory)";
  }
  const bool fits = prediction.device_total <= capacity;
  const std::string verdict =
      fmt::format("{} in {} per rank ({:.0f}% used)", fits ? "fits" : "does not fit",
                  format_bytes(capacity),
                  100.0 * static_cast<double>(prediction.device_total) /
                      static_cast<double>(capacity));
  if (fits) return verdict;
  return verdict + ": " +
         memory_advice(job.input, capacity, job.micro_batch, job.resize, job.variants);
}

// The host and NVMe tiers: their categories that hold bytes, then the tier's total.
void print_tier(const char* tier, const std::array<std::size_t, kCategoryCount>& bytes,
                std::size_t total) {
  for (Category category : all_categories()) {
    const std::size_t held = bytes[static_cast<std::size_t>(category)];
    if (held == 0) continue;
    std::cout << fmt::format("  {:<14}{:>16}  {:>11}\n",
                             fmt::format("{} {}", tier, category_name(category)), held,
                             format_bytes(held));
  }
  std::cout << fmt::format("  {:<14}{:>16}  {:>11}\n", fmt::format("{} total", tier), total,
                           format_bytes(total));
}

}  // namespace

nlohmann::ordered_json tier_json(const std::array<std::size_t, kCategoryCount>& bytes,
                                 std::size_t total) {
  nlohmann::ordered_json out;
  for (Category category : all_categories()) {
    out[category_name(category)] = bytes[static_cast<std::size_t>(category)];
  }
  out["total"] = total;
  return out;
}

void print_estimate(const EstimateJob& job, const PeakPrediction& prediction,
                    std::size_t capacity) {
  std::cout << "zest-estimate: " << job.description << "\n";
  std::cout << fmt::format("peak bytes per rank ({}):\n", planned_ranks(job));
  for (Category category : all_categories()) {
    if (in_host_memory(category)) continue;
    std::cout << fmt::format("  {:<14}{:>16}  {:>11}\n", category_name(category),
                             prediction.of(category), format_bytes(prediction.of(category)));
  }
  std::cout << fmt::format("  {:<14}{:>16}  {:>11}\n", "device total", prediction.device_total,
                           format_bytes(prediction.device_total));
  print_tier("host", prediction.host_peak, prediction.host_total());
  print_tier("nvme", prediction.nvme, prediction.nvme_total());
  std::cout << "verdict: " << verdict(job, prediction, capacity) << "\n";
}

void print_fit(const std::vector<StageFit>& fits, std::size_t capacity, int world,
               bool parameter_mode) {
  std::cout << fmt::format("largest model that fits {} per rank on {} rank{}:\n",
                           format_bytes(capacity), world, world == 1 ? "" : "s");
  auto shown = [](const auto& value) {
    return value ? std::to_string(*value) : std::string("none");
  };
  for (const StageFit& fit : fits) {
    if (parameter_mode) {
      std::cout << fmt::format("  stage {}: {} parameters\n", fit.stage, shown(fit.parameters));
    } else {
      std::cout << fmt::format("  stage {}: n_layer {} (at the config's n_embd), n_embd {} (at "
                               "its n_layer)\n",
                               fit.stage, shown(fit.n_layer), shown(fit.n_embd));
      if (fit.n_layer_by_policy.empty()) continue;
      std::string row;
      const std::pair<RecomputePolicy, std::optional<std::int64_t>>* best = nullptr;
      for (const auto& entry : fit.n_layer_by_policy) {
        row += fmt::format("{}{} {}", row.empty() ? "" : ", ", recompute_policy_name(entry.first),
                           shown(entry.second));
        if (entry.second && (!best || *entry.second > *best->second)) best = &entry;
      }
      std::cout << fmt::format("    n_layer by activation_checkpointing.policy: {}{}\n", row,
                               best ? fmt::format(" ({} fits the most)",
                                                  recompute_policy_name(best->first))
                                    : std::string());
      if (!fit.variant.empty()) {
        std::cout << fmt::format("    with {}: n_layer {}, n_embd {}\n", fit.variant,
                                 shown(fit.variant_n_layer), shown(fit.variant_n_embd));
      }
    }
  }
}

nlohmann::ordered_json estimate_json(const EstimateJob& job, const PeakPrediction& prediction,
                                     std::size_t capacity) {
  nlohmann::ordered_json per_rank;
  for (Category category : all_categories()) per_rank[category_name(category)] = prediction.of(category);
  per_rank["device_total"] = prediction.device_total;
  per_rank["host_total"] = prediction.host_total();
  per_rank["host"] = tier_json(prediction.host_peak, prediction.host_total());
  per_rank["nvme"] = tier_json(prediction.nvme, prediction.nvme_total());
  nlohmann::ordered_json out;
  out["description"] = job.description;
  out["parameters"] = job.parameters;
  out["ranks"] = job.input.world_size;
  if (job.input.tensor_parallel_size > 1) {
    // `ranks` above are the data-parallel ones; the plan is the group's largest rank.
    out["tensor_parallel"] = {{"size", job.input.tensor_parallel_size},
                              {"sequence_parallel", job.sequence_parallel},
                              {"rank_parameters", job.rank_parameters}};
  }
  out["stage"] = job.input.engine.stage;
  out["per_rank_bytes"] = per_rank;
  if (capacity == kUnlimitedCapacity) {
    out["device_memory"] = nullptr;
    out["fits"] = nullptr;
  } else {
    out["device_memory"] = capacity;
    out["fits"] = prediction.device_total <= capacity;
    out["advice"] =
        memory_advice(job.input, capacity, job.micro_batch, job.resize, job.variants);
  }
  return out;
}

void print_offload_fit(const std::vector<OffloadRung>& ladder, const TierCapacities& capacities) {
  if (!capacities.nvme_path.empty()) {
    std::cout << fmt::format("nvme: {} free at {}\n", format_bytes(capacities.nvme),
                             capacities.nvme_path);
  } else if (capacities.nvme_given) {
    std::cout << fmt::format("nvme: {} (--nvme)\n", format_bytes(capacities.nvme));
  }
  std::cout << offload_proposal(ladder, capacities) << "\n";
}

nlohmann::ordered_json offload_fit_json(const std::vector<OffloadRung>& ladder,
                                        const TierCapacities& capacities) {
  nlohmann::ordered_json rungs = nlohmann::ordered_json::array();
  for (const OffloadRung& rung : ladder) {
    nlohmann::ordered_json row = {{"rung", rung.name}, {"keys", rung.keys}};
    if (!rung.unavailable.empty()) {
      row["unavailable"] = rung.unavailable;
    } else {
      row["device_total"] = rung.prediction.device_total;
      row["host_total"] = rung.prediction.host_total();
      row["nvme_total"] = rung.prediction.nvme_total();
      row["fits"] = rung.fits;
    }
    rungs.push_back(std::move(row));
  }
  return {{"proposal", offload_proposal(ladder, capacities)}, {"rungs", std::move(rungs)}};
}

nlohmann::ordered_json fit_json(const std::vector<StageFit>& fits) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const StageFit& fit : fits) {
    nlohmann::ordered_json row = {{"stage", fit.stage}};
    row["parameters"] = fit.parameters ? nlohmann::ordered_json(*fit.parameters) : nullptr;
    row["n_layer"] = fit.n_layer ? nlohmann::ordered_json(*fit.n_layer) : nullptr;
    row["n_embd"] = fit.n_embd ? nlohmann::ordered_json(*fit.n_embd) : nullptr;
    if (!fit.n_layer_by_policy.empty()) {
      nlohmann::ordered_json by_policy;
      for (const auto& [policy, layers] : fit.n_layer_by_policy) {
        by_policy[recompute_policy_name(policy)] =
            layers ? nlohmann::ordered_json(*layers) : nlohmann::ordered_json(nullptr);
      }
      row["n_layer_by_policy"] = std::move(by_policy);
    }
    if (!fit.variant.empty()) {
      auto shown = [](const std::optional<std::int64_t>& value) {
        return value ? nlohmann::ordered_json(*value) : nlohmann::ordered_json(nullptr);
      };
      row["variant"] = {{"change", fit.variant},
                        {"n_layer", shown(fit.variant_n_layer)},
                        {"n_embd", shown(fit.variant_n_embd)}};
    }
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace zest
