// fp16's loss scaling, with DeepSpeed's keys, defaults and rules (DynamicLossScaler): the loss
// is multiplied by `scale` so small gradients survive fp16; a step whose gradients overflowed is
// skipped on every rank; the scale halves after `hysteresis` overflows and doubles after
// `loss_scale_window` clean steps. Invariant: it never loops on skips forever — an overflow at
// min_loss_scale with no hysteresis left is an error.
#pragma once

#include <cstdint>

namespace zest {

struct LossScaleOptions {
  bool enabled = false;         // fp16.enabled
  float loss_scale = 0.0f;      // 0: dynamic; > 0: this fixed scale
  int initial_scale_power = 16; // the dynamic scale starts at 2^this
  int loss_scale_window = 1000; // clean steps before the scale grows
  int hysteresis = 2;           // overflows tolerated before the scale shrinks
  float min_loss_scale = 1.0f;
};

// What a checkpoint keeps of the scaler.
struct LossScalerState {
  float scale = 1.0f;
  int hysteresis_left = 0;
  std::int64_t iteration = 0;
  std::int64_t last_overflow = -1;
  std::int64_t skipped = 0;
};

class LossScaler {
 public:
  // Throws a kConfig Error naming fp16.<key> for a value out of range.
  explicit LossScaler(const LossScaleOptions& options);

  float scale() const { return scale_; }
  // Records one step's outcome. Throws a kInternal Error when an overflow happens at the minimum
  // scale with no hysteresis left.
  void update(bool overflow);
  std::int64_t skipped_steps() const { return skipped_; }

  LossScalerState state() const;
  void restore(const LossScalerState& state);

 private:
  LossScaleOptions options_;
  bool dynamic_;
  float scale_ = 1.0f;
  int hysteresis_left_;
  std::int64_t iteration_ = 0;
  std::int64_t last_overflow_ = -1;
  std::int64_t skipped_ = 0;
};

}  // namespace zest
