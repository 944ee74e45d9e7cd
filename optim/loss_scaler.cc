#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"

namespace zest {

namespace {
void require(bool condition, const std::string& key, const std::string& rule) {
  if (!condition) throw Error(ErrorKind::kConfig, "fp16." + key + ": " + rule);
}
}  // namespace

LossScaler::LossScaler(const LossScaleOptions& options)
    : options_(options), dynamic_(options.enabled && options.loss_scale == 0.0f),
      hysteresis_left_(options.hysteresis) {
  require(options.loss_scale >= 0.0f, "loss_scale", "must be >= 0 (0 = dynamic)");
  require(options.initial_scale_power >= 0 && options.initial_scale_power <= 64,
          "initial_scale_power", "must be in [0, 64]");
  require(options.loss_scale_window >= 1, "loss_scale_window", "must be >= 1");
  require(options.hysteresis >= 1, "hysteresis", "must be >= 1");
  require(options.min_loss_scale > 0.0f, "min_loss_scale", "must be > 0");
  if (!options.enabled) {
    scale_ = 1.0f;
  } else if (dynamic_) {
    scale_ = std::ldexp(1.0f, options.initial_scale_power);
  } else {
    scale_ = options.loss_scale;
  }
}

void LossScaler::update(bool overflow) {
  if (overflow) {
    ++skipped_;
    if (dynamic_) {
      if (hysteresis_left_ <= 1) {
        if (scale_ <= options_.min_loss_scale) {
          throw Error(ErrorKind::kInternal,
                      "fp16: gradients overflow at the minimum loss scale (" +
                          std::to_string(options_.min_loss_scale) +
                          "); the model diverged or fp16 cannot hold it — lower the learning "
                          "rate, lower fp16.min_loss_scale, or train in bf16");
        }
        scale_ = std::max(scale_ / 2.0f, options_.min_loss_scale);
      } else {
        --hysteresis_left_;
      }
    }
    last_overflow_ = iteration_;
  } else if (dynamic_ && (iteration_ - last_overflow_) % options_.loss_scale_window == 0) {
    hysteresis_left_ = options_.hysteresis;
    scale_ *= 2.0f;
  }
  ++iteration_;
}

LossScalerState LossScaler::state() const {
  return {scale_, hysteresis_left_, iteration_, last_overflow_, skipped_};
}

void LossScaler::restore(const LossScalerState& state) {
  scale_ = state.scale;
  hysteresis_left_ = state.hysteresis_left;
  iteration_ = state.iteration;
  last_overflow_ = state.last_overflow;
  skipped_ = state.skipped;
}

}  // namespace zest
