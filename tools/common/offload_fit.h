// zest-estimate --fit's offload proposal: the ladder of offload settings from none to the most
// offloaded (none; the optimizer on the host; then its parameters too; then the optimizer and
// then the parameters on NVMe, under --nvme PATH), each planned by the real engine
// (planner/peak_plan.h), and the first rung whose device, host and NVMe bytes per rank fit the
// tiers' capacities, proposed in one line with the config keys that set it. When none fits, the
// closest says which tier is short by how much; rungs the engine refuses say why instead.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "planner/peak_plan.h"

namespace zest {

// Per rank. kUnlimitedCapacity where none was given; NVMe: --nvme's, the free bytes of a
// directory or a byte count, and 0 without it (no NVMe rung fits).
struct TierCapacities {
  std::size_t device = kUnlimitedCapacity;
  std::size_t host = kUnlimitedCapacity;
  std::size_t nvme = 0;
  bool nvme_given = false;
  std::string nvme_path;  // the directory --nvme named; empty for a byte count or no --nvme
};

struct OffloadRung {
  std::string name;               // "optimizer cpu, parameters cpu"
  std::vector<std::string> keys;  // the config keys that set it, with their values
  std::string unavailable;        // why this build or this job cannot run it; empty if it can
  PeakPrediction prediction;      // when available
  bool fits = false;
};

std::vector<OffloadRung> offload_ladder(const PeakPlanInput& input,
                                        const TierCapacities& capacities);
// "offload: fits with ...: set k1, k2", or what the closest rung needs when none fits.
std::string offload_proposal(const std::vector<OffloadRung>& ladder,
                             const TierCapacities& capacities);

// The bytes free to an unprivileged writer on the file system of `path` (statvfs); a kUsage
// Error naming `option` and the path when it cannot be read.
std::size_t free_bytes(const std::string& path, const std::string& option);
// --nvme's value: a byte count ("200GiB") or a directory, whose free bytes are the tier's; sets
// `capacities`' NVMe fields. A kUsage Error naming `option` when it is neither.
void set_nvme_capacity(TierCapacities& capacities, const std::string& value,
                       const std::string& option);

}  // namespace zest
