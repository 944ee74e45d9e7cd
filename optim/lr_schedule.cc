#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "base/error.h"

namespace zest {

namespace {
void require(bool condition, const std::string& key, const std::string& rule) {
  if (!condition) throw Error(ErrorKind::kConfig, "scheduler.params." + key + ": " + rule);
}
}  // namespace

LrSchedule::LrSchedule(const LrScheduleOptions& options, float base_lr)
    : options_(options), base_lr_(base_lr) {
  const std::string& type = options_.type;
  if (type.empty()) return;
  if (type != "WarmupLR" && type != "WarmupDecayLR" && type != "WarmupCosineLR") {
    throw Error(ErrorKind::kConfig, "scheduler.type: unknown scheduler '" + type +
                                        "' (allowed: WarmupLR, WarmupDecayLR, WarmupCosineLR)");
  }
  require(options_.warmup_type == "log" || options_.warmup_type == "linear", "warmup_type",
          "must be \"log\" or \"linear\", got \"" + options_.warmup_type + "\"");
  require(options_.warmup_num_steps >= 0, "warmup_num_steps", "must be >= 0");
  // DeepSpeed raises warmup_num_steps to 2 so that log(warmup_num_steps) is not 0.
  const std::int64_t given_warmup = options_.warmup_num_steps;
  options_.warmup_num_steps = std::max<std::int64_t>(2, given_warmup);
  const std::string counted = given_warmup == options_.warmup_num_steps
                                  ? std::to_string(given_warmup)
                                  : std::to_string(given_warmup) + ", counted as 2";
  if (options_.warmup_max_lr < 0.0f) options_.warmup_max_lr = base_lr;
  if (type != "WarmupLR") {
    require(options_.total_num_steps > options_.warmup_num_steps, "total_num_steps",
            "must be greater than warmup_num_steps (" + counted + "), got " +
                std::to_string(options_.total_num_steps));
  }
  if (type == "WarmupCosineLR") {
    require(options_.warmup_min_ratio >= 0.0f && options_.warmup_min_ratio <= 1.0f,
            "warmup_min_ratio", "must be in [0, 1]");
    require(options_.cos_min_ratio >= 0.0f && options_.cos_min_ratio <= 1.0f, "cos_min_ratio",
            "must be in [0, 1]");
  }
}

float LrSchedule::warmup_gamma(std::int64_t iteration) const {
  const double steps = static_cast<double>(options_.warmup_num_steps);
  if (options_.warmup_type == "log") return static_cast<float>(std::log(iteration + 1.0) / std::log(steps));
  return static_cast<float>(iteration / steps);
}

float LrSchedule::lr_at(std::int64_t step) const {
  const std::string& type = options_.type;
  if (type.empty()) return base_lr_;
  const std::int64_t iteration = step - 1;
  const bool warming = iteration < options_.warmup_num_steps;
  if (type == "WarmupCosineLR") {
    double ratio;
    if (warming) {
      ratio = options_.warmup_min_ratio + warmup_gamma(iteration) * (1.0 - options_.warmup_min_ratio);
    } else {
      const double done = static_cast<double>(iteration - options_.warmup_num_steps + 1);
      const double total = static_cast<double>(options_.total_num_steps - options_.warmup_num_steps);
      const double cosine = (1.0 + std::cos(std::numbers::pi * done / total)) / 2.0;
      ratio = std::max(0.0, options_.cos_min_ratio + (1.0 - options_.cos_min_ratio) * cosine);
    }
    return static_cast<float>(base_lr_ * ratio);
  }
  double gamma = 1.0;
  if (warming) {
    gamma = warmup_gamma(iteration);
  } else if (type == "WarmupDecayLR") {
    gamma = std::max(0.0, static_cast<double>(options_.total_num_steps - iteration) /
                              static_cast<double>(options_.total_num_steps - options_.warmup_num_steps));
  }
  return static_cast<float>(options_.warmup_min_lr +
                            (options_.warmup_max_lr - options_.warmup_min_lr) * gamma);
}

}  // namespace zest
