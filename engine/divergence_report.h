// A step's non-finite gradient traced to the rank and unit where it arose, and agreed by every
// rank that summed the step's overflow flag. The flag is summed over more than one group when a
// step spans several (a pipeline's stages, a tensor-parallel group), so a rank whose own units
// were finite still stops: it must name the rank that was not, or the World's first failure
// would be its guess instead of the cause. So each rank's finding is gathered over each of those
// groups in turn (together they hold every rank that summed the flag) and every rank raises the
// same message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "runtime/communicator.h"
#include "runtime/world.h"

namespace zest {

// What one rank's gradient checks saw in the step.
struct NonFiniteFinding {
  enum class Where : std::int32_t {
    // In the order of what a rank reports first.
    kNowhere,    // every unit's local gradient and the reduced ones were finite
    kReduction,  // only the reduced gradients: an overflow in the reduction itself
    kUnit,       // `unit`'s local gradient was the first not finite
  };
  Where where = Where::kNowhere;
  std::string unit;
};

// Throws the kDivergence Error naming `step` and each rank's finding. `groups` (null entries
// skipped) are the groups the step's flag was summed over, the first holding this rank's
// context; a collective over each, in order: every rank of them calls it.
[[noreturn]] void raise_divergence(const RankContext& context,
                                   const std::vector<Communicator*>& groups, std::int64_t step,
                                   DType dtype, const NonFiniteFinding& mine);

}  // namespace zest
