#include "tools/common/offload_fit.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "base/error.h"

namespace zest {
namespace {

// Where a rung puts a state (OffloadDevice has no NVMe member until the storage tier lands).
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
  return tier == Tier::kCpu ? OffloadDevice::kCpu : OffloadDevice::kNone;
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
  engine.offload_optimizer.device = engine_device(setting.optimizer);
  engine.offload_param.device = engine_device(setting.parameters);
  rung.keys.push_back(fmt::format("zero_optimization.offload_optimizer.device \"{}\"",
                                  device_text(setting.optimizer)));
  rung.keys.push_back(fmt::format("zero_optimization.offload_param.device \"{}\"",
                                  device_text(setting.parameters)));
  if (setting.optimizer == Tier::kNvme || setting.parameters == Tier::kNvme) {
    rung.unavailable = "--fit does not plan the NVMe rungs yet (zest-estimate plans a config "
                       "whose offload_optimizer or offload_param device is \"nvme\")";
    return rung;
  }
  try {
    rung.prediction = predict_peak(changed);
  } catch (const Error& error) {
    if (error.kind() != ErrorKind::kConfig) throw;
    rung.unavailable = error.what();
    return rung;
  }
  const PeakPrediction& p = rung.prediction;
  rung.fits = p.device_total <= capacities.device && p.host_total() <= capacities.host &&
              (p.nvme_total() == 0 || p.nvme_total() <= capacities.nvme);
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
                        format_bytes(capacities.nvme));
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
  // None fits: the most offloaded rung this build ran is the closest.
  const OffloadRung* closest = nullptr;
  std::string skipped;
  for (const OffloadRung& rung : ladder) {
    if (rung.unavailable.empty()) {
      closest = &rung;
    } else if (skipped.empty()) {
      skipped = fmt::format("; {} and beyond: {}", rung.name, rung.unavailable);
    }
  }
  if (!closest) return "offload: no rung of the ladder can run this job" + skipped;
  return fmt::format("offload: nothing fits; the closest, {}, needs {}{}", closest->name,
                     tiers_text(*closest, capacities), skipped);
}

std::size_t free_bytes(const std::string& path, const std::string& option) {
  struct statvfs fs {};
  if (::statvfs(path.c_str(), &fs) != 0) {
    throw Error(ErrorKind::kUsage, fmt::format("{}: cannot read the free space of '{}': {}; give "
                                               "an existing directory on the NVMe file system",
                                               option, path, std::strerror(errno)));
  }
  return static_cast<std::size_t>(fs.f_bavail) * static_cast<std::size_t>(fs.f_frsize);
}

}  // namespace zest
