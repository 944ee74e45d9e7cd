#include "tools/train/progress.h"

#include <cmath>

#include <fmt/format.h>

#include "tools/train/console.h"

namespace zest {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto whole = static_cast<std::int64_t>(std::llround(seconds));
  if (whole >= 3600) return fmt::format("{}h{:02}m", whole / 3600, whole % 3600 / 60);
  if (whole >= 60) return fmt::format("{}m{:02}s", whole / 60, whole % 60);
  return fmt::format("{}s", whole);
}

std::string format_rate(double per_second) {
  if (per_second >= 1e6) return fmt::format("{:.2f}M", per_second / 1e6);
  if (per_second >= 1e4) return fmt::format("{:.1f}k", per_second / 1e3);
  return fmt::format("{:.0f}", per_second);
}

Progress::Progress(std::int64_t first_step, std::int64_t last_step, std::int64_t steps_per_print,
                   std::int64_t tokens_per_step)
    : first_step_(first_step), last_step_(last_step), steps_per_print_(steps_per_print),
      tokens_per_step_(tokens_per_step) {}

double Progress::mean_step_ms() const {
  if (steps_run_ == 0) return 0.0;
  if (steps_run_ == 1) return first_step_ms_;
  return later_steps_ms_ / static_cast<double>(steps_run_ - 1);
}

double Progress::tokens_per_s() const {
  const double ms = mean_step_ms();
  return ms > 0 ? static_cast<double>(tokens_per_step_) * 1000.0 / ms : 0.0;
}

double Progress::seconds_left(std::int64_t step) const {
  return static_cast<double>(last_step_ - step) * mean_step_ms() / 1000.0;
}

std::string Progress::line(const StepStats& stats, double step_ms) const {
  const int width = static_cast<int>(std::to_string(last_step_).size());
  std::string text = fmt::format(
      "step {:>{}}/{}  loss {:.4f}  lr {:.2e}  grad_norm {:.3f}  {} tok/s  {:.1f} ms", stats.step,
      width, last_step_, stats.loss, stats.lr, stats.grad_norm, format_rate(tokens_per_s()),
      step_ms);
  if (stats.step < last_step_) text += "  ETA " + format_duration(seconds_left(stats.step));
  if (stats.skipped) text += fmt::format("  skipped (fp16 overflow at scale {})", stats.loss_scale);
  return text;
}

void Progress::count(double step_ms) {
  if (steps_run_++ == 0) {
    first_step_ms_ = step_ms;
  } else {
    later_steps_ms_ += step_ms;
  }
}

void Progress::show(const StepStats& stats, double step_ms, bool stopping) {
  const std::string text = line(stats, step_ms);
  if (Console::is_terminal()) {
    Console::live(text);
    if (stats.step == last_step_ || stopping) Console::end_live();
    return;
  }
  if (stats.step == first_step_ || stats.step == last_step_ || stopping ||
      stats.step % steps_per_print_ == 0) {
    Console::say(text);
  }
}

void Progress::evaluated(std::int64_t step, float val_loss) {
  const int width = static_cast<int>(std::to_string(last_step_).size());
  Console::say(fmt::format("step {:>{}}/{}  val_loss {:.4f}", step, width, last_step_, val_loss));
}

}  // namespace zest
