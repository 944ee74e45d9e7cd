// Learning-rate schedules with DeepSpeed's names, parameters and formulas (WarmupLR,
// WarmupDecayLR, WarmupCosineLR; warmup_type "log" or "linear"). The rate of optimizer step k
// (k = 1, 2, ...) is DeepSpeed's get_lr() at last_batch_iteration = k - 1. (DeepSpeed's own
// engine uses the rate of iteration k - 2 for step k, which makes the first step's rate the
// warmup minimum twice; zest does not repeat that.)
#pragma once

#include <cstdint>
#include <string>

namespace zest {

struct LrScheduleOptions {
  std::string type;               // "" (constant), "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"
  float warmup_min_lr = 0.0f;     // WarmupLR, WarmupDecayLR
  float warmup_max_lr = -1.0f;    // WarmupLR, WarmupDecayLR; < 0 means the optimizer's lr
  std::int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";
  std::int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR
  float warmup_min_ratio = 0.0f;     // WarmupCosineLR
  float cos_min_ratio = 0.0001f;     // WarmupCosineLR
};

class LrSchedule {
 public:
  // `base_lr` is the optimizer's lr. Throws a kConfig Error naming scheduler.type or
  // scheduler.params.<key> for an unknown type or a value out of range.
  LrSchedule(const LrScheduleOptions& options, float base_lr);

  // The rate for optimizer step `step` (1-based).
  float lr_at(std::int64_t step) const;

 private:
  float warmup_gamma(std::int64_t iteration) const;

  LrScheduleOptions options_;
  float base_lr_;
};

}  // namespace zest
