#include "tools/common/offload_fit.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "base/error.h"

namespace zest {
namespace {

// Where a rung puts a state.
enum class Tier { kDevice, kCpu, kNvme };

struct RungSetting {
  const char* name;
  Tier optimizer;
  Tier parameters;
};

// Note: DeepSpeed's ZeRO-Infinity order: each rung moves the next largest state one tier down,
// the optimizer's (12-16 bytes a parameter) before the parameters' (2-4).
constexpr RungSetting kLadder[] = {
    {"none", Tier::kDevice, Tier::kDevice},
    {"optimizer cpu", Tier::kCpu, Tier::kDevice},
    {"optimizer cpu, parameters cpu", Tier::kCpu, Tier::kCpu},
    {"optimizer nvme, parameters cpu", Tier::kNvme, Tier::kCpu},
    {"optimizer nvme, parameters nvme", Tier::kNvme, Tier::kNvme},
};

const char* device_text(Tier tier) {
  switch (tier) {
    case Tier::kDevice: return "none";
    case Tier::kCpu: return "cpu";
    case Tier::kNvme: return "nvme";
  }
  return "none";
}

OffloadDevice engine_device(Tier tier) {
  switch (tier) {
    case Tier::kDevice: return OffloadDevice::kNone;
    case Tier::kCpu: return OffloadDevice::kCpu;
    case Tier::kNvme: return OffloadDevice::kNvme;
  }
  return OffloadDevice::kNone;
}

// The folder an NVMe rung's swap files go under: --nvme's; without it the config's own, else a
// stand-in (the shape-only device reserves the files without making them, so any path plans).
std::string rung_nvme_path(const EngineOptions& engine, const TierCapacities& capacities) {
  if (!capacities.nvme_path.empty()) return capacities.nvme_path;
  if (!engine.offload_optimizer.nvme_path.empty()) return engine.offload_optimizer.nvme_path;
  if (!engine.offload_param.nvme_path.empty()) return engine.offload_param.nvme_path;
  return "NVME_PATH";
}

bool uses_nvme(const EngineOptions& engine) {
  return engine.offload_optimizer.on_nvme() || engine.offload_param.device == OffloadDevice::kNvme;
}

// A rung's plan. Note: with the model state only (--params), the memory table counts an
// offloaded optimizer's state as host memory wherever it lives, and knows nothing of the NVMe
// tier's host buffers; so an NVMe rung takes its device bytes from the table, as the other rungs
// do, and its host and NVMe tiers from the engine trained on the shape-only device (which
// reserves the swap files and the buffers exactly as a run would).
PeakPrediction plan_tiers(const PeakPlanInput& input) {
  if (!input.model_state_only || !uses_nvme(input.engine)) return predict_peak(input);
  PeakPlanInput trained = input;
  trained.model_state_only = false;
  const PeakPrediction engine = predict_peak(trained);
  PeakPrediction prediction = predict_peak(input);
  const auto offload = static_cast<std::size_t>(Category::kOffload);
  prediction.peak[offload] = engine.peak[offload];
  prediction.host_peak = engine.host_peak;
  prediction.host_peak_total = engine.host_peak_total;
  prediction.nvme = engine.nvme;
  prediction.model_state.offload = engine.model_state.offload;
  prediction.model_state.host_params = engine.model_state.host_params;
  prediction.model_state.nvme = engine.model_state.nvme;
  prediction.model_state.nvme_params = engine.model_state.nvme_params;
  return prediction;
}

bool fits(const PeakPrediction& p, const TierCapacities& capacities) {
  return p.device_total <= capacities.device && p.host_total() <= capacities.host &&
         (p.nvme_total() == 0 || p.nvme_total() <= capacities.nvme);
}

// The elements of the rank's largest unit shard: the most one sub-group can hold.
std::size_t largest_shard(const PeakPlanInput& input) {
  std::size_t largest = 0;
  for (const UnitShapes& unit : input.model.units) {
    std::size_t elements = 0;
    for (const ParamShape& param : unit.params) {
      std::size_t count = 1;
      for (std::int64_t extent : param.shape) count *= static_cast<std::size_t>(extent);
      elements += count;
    }
    largest = std::max(largest, elements / static_cast<std::size_t>(std::max(input.world_size, 1)));
  }
  return largest;
}

// Note: the NVMe optimizer holds buffer_count sub-groups in host memory, and sub_group_size's
// default (1e9 elements) makes a sub-group a whole unit's shard; where that overflows the host,
// the rung is planned again with sub-groups of 1/16 of the largest shard (DeepSpeed's lever for
// the same), and proposes that sub_group_size when it needs less host memory.
void smaller_sub_groups(PeakPlanInput& changed, const TierCapacities& capacities,
                        OffloadRung& rung) {
  constexpr std::size_t kPieces = 16;
  const std::size_t size = std::max<std::size_t>(1, largest_shard(changed) / kPieces);
  if (size >= changed.engine.offload_optimizer.sub_group_size) return;
  changed.engine.offload_optimizer.sub_group_size = size;
  const PeakPrediction smaller = plan_tiers(changed);
  if (smaller.host_total() >= rung.prediction.host_total()) return;
  rung.prediction = smaller;
  rung.fits = fits(smaller, capacities);
  rung.keys.push_back(fmt::format("zero_optimization.sub_group_size {}", size));
}

OffloadRung plan_rung(const PeakPlanInput& input, const RungSetting& setting,
                      const TierCapacities& capacities) {
  OffloadRung rung;
  rung.name = setting.name;
  PeakPlanInput changed = input;
  EngineOptions& engine = changed.engine;
  int stage = engine.stage;
  if (setting.optimizer != Tier::kDevice) stage = std::max(stage, 1);
  if (setting.parameters != Tier::kDevice) stage = 3;
  if (stage != input.engine.stage) {
    rung.keys.push_back(fmt::format("zero_optimization.stage {}", stage));
  }
  engine.stage = stage;
  const std::string nvme_path = rung_nvme_path(input.engine, capacities);
  engine.offload_optimizer.device = engine_device(setting.optimizer);
  engine.offload_param.device = engine_device(setting.parameters);
  rung.keys.push_back(fmt::format("zero_optimization.offload_optimizer.device \"{}\"",
                                  device_text(setting.optimizer)));
  if (setting.optimizer == Tier::kNvme) {
    engine.offload_optimizer.nvme_path = nvme_path;
    rung.keys.push_back(
        fmt::format("zero_optimization.offload_optimizer.nvme_path \"{}\"", nvme_path));
  }
  rung.keys.push_back(fmt::format("zero_optimization.offload_param.device \"{}\"",
                                  device_text(setting.parameters)));
  if (setting.parameters == Tier::kNvme) {
    // Note: max_in_cpu's default (1e9 elements) keeps the shards of any smaller model in host
    // memory, which the rung before this one already proposes; this rung puts them on NVMe.
    engine.offload_param.nvme_path = nvme_path;
    engine.offload_param.max_in_cpu = 0;
    rung.keys.push_back(
        fmt::format("zero_optimization.offload_param.nvme_path \"{}\"", nvme_path));
    rung.keys.push_back("zero_optimization.offload_param.max_in_cpu 0");
  }
  const bool offloads = setting.optimizer != Tier::kDevice || setting.parameters != Tier::kDevice;
  if (offloads && input.tensor_parallel_size > 1) {
    // As config/tensor_parallel_block.cc refuses it: no plan of what a run cannot do.
    rung.unavailable = fmt::format("offload is not supported with tensor parallelism yet "
                                   "(tensor_parallel.size {})",
                                   input.tensor_parallel_size);
    return rung;
  }
  try {
    rung.prediction = plan_tiers(changed);
    rung.fits = fits(rung.prediction, capacities);
    if (!rung.fits && setting.optimizer == Tier::kNvme) smaller_sub_groups(changed, capacities, rung);
  } catch (const Error& error) {
    if (error.kind() != ErrorKind::kConfig) throw;
    rung.unavailable = error.what();
  }
  return rung;
}

std::string capacity_text(std::size_t bytes) {
  return bytes == kUnlimitedCapacity ? std::string("no limit") : format_bytes(bytes);
}

std::string tiers_text(const OffloadRung& rung, const TierCapacities& capacities) {
  const PeakPrediction& p = rung.prediction;
  std::string text = fmt::format("device {} of {}, host {} of {}", format_bytes(p.device_total),
                                 capacity_text(capacities.device), format_bytes(p.host_total()),
                                 capacity_text(capacities.host));
  if (p.nvme_total() > 0) {
    text += fmt::format(", nvme {} of {}", format_bytes(p.nvme_total()),
                        !capacities.nvme_given ? std::string("none given")
                                                     : format_bytes(capacities.nvme));
  }
  return text;
}

// The bytes over capacity, summed over the tiers.
std::size_t bytes_short(const PeakPrediction& p, const TierCapacities& capacities) {
  const auto over = [](std::size_t needed, std::size_t capacity) {
    return needed > capacity ? needed - capacity : 0;
  };
  return over(p.device_total, capacities.device) + over(p.host_total(), capacities.host) +
         over(p.nvme_total(), capacities.nvme);
}

// "host short by 3.00 MiB, nvme short by 1.20 GiB (no --nvme given)": each tier the rung
// overflows, by how much.
std::string shortfall_text(const OffloadRung& rung, const TierCapacities& capacities) {
  const PeakPrediction& p = rung.prediction;
  const std::pair<const char*, std::pair<std::size_t, std::size_t>> tiers[] = {
      {"device", {p.device_total, capacities.device}},
      {"host", {p.host_total(), capacities.host}},
      {"nvme", {p.nvme_total(), capacities.nvme}},
  };
  std::string text;
  for (const auto& [tier, bytes] : tiers) {
    const auto [needed, capacity] = bytes;
    if (needed <= capacity) continue;
    text += fmt::format("{}{} short by {}", text.empty() ? "" : ", ", tier,
                        format_bytes(needed - capacity));
    if (std::string(tier) == "nvme" && !capacities.nvme_given) {
      text += " (no --nvme given: name a directory on the NVMe file system)";
    }
  }
  return text;
}

std::string keys_text(const std::vector<std::string>& keys) {
  std::string text;
  for (const std::string& key : keys) text += (text.empty() ? "" : ", ") + key;
  return text;
}

}  // namespace

std::vector<OffloadRung> offload_ladder(const PeakPlanInput& input,
                                        const TierCapacities& capacities) {
  std::vector<OffloadRung> ladder;
  for (const RungSetting& setting : kLadder) {
    ladder.push_back(plan_rung(input, setting, capacities));
    if (ladder.back().fits) break;  // the first that fits is the proposal
  }
  return ladder;
}

std::string offload_proposal(const std::vector<OffloadRung>& ladder,
                             const TierCapacities& capacities) {
  for (const OffloadRung& rung : ladder) {
    if (!rung.fits) continue;
    return fmt::format("offload: fits with {} ({}): set {}", rung.name, tiers_text(rung, capacities),
                       keys_text(rung.keys));
  }
  // None fits: the closest is the rung short by the fewest bytes over its tiers (the more
  // offloaded of two alike).
  const OffloadRung* closest = nullptr;
  std::size_t closest_short = 0;
  std::string skipped;
  for (const OffloadRung& rung : ladder) {
    if (!rung.unavailable.empty()) {
      if (skipped.empty()) skipped = fmt::format("; {}: {}", rung.name, rung.unavailable);
      continue;
    }
    const std::size_t short_bytes = bytes_short(rung.prediction, capacities);
    if (!closest || short_bytes <= closest_short) {
      closest = &rung;
      closest_short = short_bytes;
    }
  }
  if (!closest) return "offload: no rung of the ladder can run this job" + skipped;
  // The last rung that ran (the most offloaded) too, so that a short NVMe tier is named.
  const OffloadRung* last = nullptr;
  for (const OffloadRung& rung : ladder) {
    if (rung.unavailable.empty()) last = &rung;
  }
  const std::string most_offloaded =
      last == closest ? std::string()
                      : fmt::format("; with {}: {}", last->name, shortfall_text(*last, capacities));
  return fmt::format("offload: nothing fits; the closest, {}, needs {}: {}{}{}", closest->name,
                     tiers_text(*closest, capacities), shortfall_text(*closest, capacities),
                     most_offloaded, skipped);
}

std::size_t free_bytes(const std::string& path, const std::string& option) {
  struct statvfs fs {};
  if (::statvfs(path.c_str(), &fs) != 0) {
    throw Error(ErrorKind::kUsage, fmt::format("{}: cannot read the free space of '{}': {}; give "
                                               "an existing directory on the NVMe file system, "
                                               "or its free bytes (\"200GiB\")",
                                               option, path, std::strerror(errno)));
  }
  return static_cast<std::size_t>(fs.f_bavail) * static_cast<std::size_t>(fs.f_frsize);
}

void set_nvme_capacity(TierCapacities& capacities, const std::string& value,
                       const std::string& option) {
  struct stat info {};
  if (::stat(value.c_str(), &info) != 0) {
    if (const std::optional<std::size_t> bytes = parse_byte_size(value)) {
      capacities.nvme = *bytes;
      capacities.nvme_given = true;
      return;
    }
  }
  capacities.nvme = free_bytes(value, option);
  capacities.nvme_given = true;
  capacities.nvme_path = value;
}

}  // namespace zest
