#include "engine/gradient_checks.h"

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/host_collectives.h"
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

void GradientChecks::raise_divergence(std::int64_t step, const std::vector<FlatUnit>& units,
                                      bool flagged) {
  // Every rank says which of its units saw a non-finite gradient first (-1: none).
  // -2: none of its units, but its reduced statistics (an overflow in the reduction itself).
  std::int32_t mine = any_non_finite() ? -2 : -1;
  for (std::size_t u = 0; u < units.size() && mine < 0; ++u) {
    if (read_[u].non_finite != 0) mine = static_cast<std::int32_t>(u);
  }
  std::vector<std::int32_t> all(static_cast<std::size_t>(context_.world_size));
  context_.communicator.label_next("divergence report");
  all_gather_host(context_, &mine, all.data(), 1, DType::kInt32);
  std::vector<std::string> where;
  bool reduced = false;
  for (std::size_t rank = 0; rank < all.size(); ++rank) {
    reduced = reduced || all[rank] == -2;
    if (all[rank] < 0) continue;
    // Note: the world's rank: the group may be a shard group or a pipeline stage's.
    const int world_rank = context_.communicator.world_rank_of(static_cast<int>(rank));
    where.push_back(fmt::format("rank {}, unit {}", world_rank,
                                units[static_cast<std::size_t>(all[rank])].layout.unit_name()));
  }
  // Note: no rank's own gradient may be non-finite while the reduced one is (an overflow in the
  // reduction itself); then the message says so instead of naming a rank.
  if (flagged && where.empty() && !reduced) {
    // Note: nothing of this group's was non-finite, yet the step's totals were: they are summed
    // over more than this group (a pipeline's stages), and the pipeline stage that holds the NaN
    // names it. This is its echo, of the peer-failure kind, so that the World reports the cause.
    throw Error(ErrorKind::kPeerFailure,
                fmt::format("non-finite gradient at step {} on another pipeline stage", step));
  }
  const std::string origin = where.empty() ? "in the reduced gradients"
                                           : "on " + fmt::format("{}", fmt::join(where, "; "));
  throw Error(ErrorKind::kDivergence,
              fmt::format("non-finite gradient at step {} {} ({} training has no loss scale to "
                          "lower and skip the step; lower the learning rate, clip gradients, or "
                          "check the data of that step)",
                          step, origin, dtype_name(dtype_)));
}

}  // namespace zest
