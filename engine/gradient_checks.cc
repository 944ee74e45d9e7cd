#include "engine/gradient_checks.h"

#include "runtime/host_copies.h"

namespace zest {

namespace {
const char* byte_offset(const void* base, std::size_t bytes) {
  return static_cast<const char*>(base) + bytes;
}
}  // namespace

GradientChecks::GradientChecks(RankContext& context, DType dtype, std::size_t unit_count)
    : context_(context), dtype_(dtype), read_(unit_count + 1, GradientStatistics{}) {
  results_ = context_.allocator().allocate(read_.size() * sizeof(GradientStatistics),
                                         Category::kWorkspace);
  context_.device.fill_zero(context_.compute, results_.data(), results_.bytes());
}

void GradientChecks::check_before_reduction(const FlatUnit& unit, const void* local,
                                            std::size_t count) {
  add_gradient_statistics(context_.compute, local, dtype_, count,
                          result(static_cast<std::size_t>(unit.index)));
}

void GradientChecks::inspect(const std::vector<FlatUnit>& units, const StagePlan& plan,
                             const std::vector<bool>& counted) {
  // The reduced gradients were last written on the comm stream; the per-unit checks ran on
  // compute before each reduction, which comm waited for. So, on comm: the norm's result is
  // zeroed and summed over this rank's update ranges, then every result is read back at once.
  Stream& comm = context_.comm;
  GradientStatistics* norm = result(units.size());
  const std::size_t element = dtype_size(dtype_);
  context_.device.fill_zero(comm, norm, sizeof(GradientStatistics));
  for (const FlatUnit& unit : units) {
    if (!counted.empty() && !counted[static_cast<std::size_t>(unit.index)]) continue;
    const std::size_t base = plan.grads_first(unit.layout.shard_range(context_.rank).begin);
    for (const FlatUnit::UpdateRange& range : unit.update_ranges) {
      if (!range.norm_counted) continue;
      const void* grads = byte_offset(unit.grads.data(), (range.flat_offset - base) * element);
      add_gradient_statistics(comm, grads, dtype_, range.count, norm);
    }
  }
  read_to_host(context_.device, comm, read_.data(), results_.data(), results_.bytes());
}

bool GradientChecks::any_non_finite() const {
  for (const GradientStatistics& check : read_) {
    if (check.non_finite != 0) return true;
  }
  return false;
}

void GradientChecks::reset() {
  context_.device.fill_zero(context_.compute, results_.data(), results_.bytes());
}

NonFiniteFinding GradientChecks::finding(const std::vector<FlatUnit>& units) const {
  NonFiniteFinding found;
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (read_[u].non_finite == 0) continue;
    found.where = NonFiniteFinding::Where::kUnit;
    found.unit = units[u].layout.unit_name();
    return found;
  }
  if (any_non_finite()) found.where = NonFiniteFinding::Where::kReduction;
  return found;
}

}  // namespace zest
