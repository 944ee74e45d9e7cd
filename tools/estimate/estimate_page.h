// zest-estimate --html: the plan as a picture, one self-contained HTML page
// (tools/common/html_page.h). The per-rank stack of peak bytes by category at the job's stage
// beside the device's capacity, and with --fit the same job planned at every ZeRO stage side by
// side against that capacity, with the largest model that fits each.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "tools/common/html_page.h"
#include "tools/common/memory_estimate.h"

namespace zest {

// The job planned at one ZeRO stage, or why the engine refuses that stage for it.
struct StageEstimate {
  int stage = 0;
  std::optional<PeakPrediction> prediction;
  std::string refused;
};

// `job` at stages 0-3 (the job's own options otherwise).
std::vector<StageEstimate> plan_every_stage(const EstimateJob& job);

// `stages` and `fits` empty without --fit.
HtmlPage estimate_page(const EstimateJob& job, const PeakPrediction& prediction,
                       std::size_t capacity, const std::vector<StageEstimate>& stages,
                       const std::vector<StageFit>& fits, bool parameter_mode);

}  // namespace zest
