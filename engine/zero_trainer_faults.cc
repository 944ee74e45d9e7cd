// The ZeRO engine's answers to faults: injected ones (debug.fault, engine/fault_injection.h) and
// the real one they stand for, a gradient that is not finite in fp32 / bf16 training, which has
// no loss scale to lower and must stop with a message instead of training on NaNs.
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "kernels/convert.h"
#include "engine/zero_trainer.h"
#include "runtime/host_collectives.h"
#include "runtime/host_copies.h"

namespace zest {

void ZeroTrainer::inject_step_fault() {
  const FaultInjection& fault = options_.fault;
  const std::int64_t step = steps_taken_ + 1;
  if (!fault.hits(context_.rank, step)) return;
  switch (fault.kind) {
    case FaultInjection::Kind::kThrow:
      throw Error(ErrorKind::kInternal,
                  fmt::format("injected failure (debug.fault \"throw\") at step {}", step));
    case FaultInjection::Kind::kStall:
      std::this_thread::sleep_for(std::chrono::duration<double>(fault.stall_seconds));
      return;
    case FaultInjection::Kind::kFailAllocation:
      context_.allocator().fail_next_allocation(Category::kActivations);
      return;
    default:
      return;
  }
}

void ZeroTrainer::inject_gradient_fault(FlatUnit& unit) {
  const FaultInjection& fault = options_.fault;
  if (fault.kind != FaultInjection::Kind::kNanGradient ||
      !fault.hits(context_.rank, steps_taken_ + 1)) {
    return;
  }
  const bool named = fault.unit.empty() ? unit.index + 1 == static_cast<int>(units_.size())
                                        : fault.unit == unit.layout.unit_name();
  if (!named) return;
  // After the unit's backward has written its gradient, in compute-stream order.
  void* gradient = gradient_target(unit);
  // The NaN in the gradient's type is made on the host now; the device writes it in order.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  unsigned char bits[sizeof(float)] = {};
  cpu::convert(&nan, DType::kFloat32, bits, options_.compute_dtype, 1);
  write_from_host(context_.device, context_.compute, gradient, bits,
                  dtype_size(options_.compute_dtype));
}

void ZeroTrainer::raise_divergence(std::int64_t step) {
  // Every rank says which of its units saw a non-finite gradient first (-1: none).
  std::int32_t mine = -1;
  for (std::size_t u = 0; u < units_.size() && mine < 0; ++u) {
    if (local_checks_[u].non_finite != 0) mine = static_cast<std::int32_t>(u);
  }
  std::vector<std::int32_t> all(static_cast<std::size_t>(context_.world_size));
  context_.communicator.label_next("divergence report");
  all_gather_host(context_, &mine, all.data(), 1, DType::kInt32);
  std::vector<std::string> where;
  for (std::size_t rank = 0; rank < all.size(); ++rank) {
    if (all[rank] < 0) continue;
    where.push_back(fmt::format("rank {}, unit {}", rank,
                                units_[static_cast<std::size_t>(all[rank])].layout.unit_name()));
  }
  // Note: no rank's own gradient may be non-finite while the reduced one is (an overflow in the
  // reduction itself); then the message says so instead of naming a rank.
  const std::string origin = where.empty() ? "in the reduced gradients"
                                           : "on " + fmt::format("{}", fmt::join(where, "; "));
  throw Error(ErrorKind::kDivergence,
              fmt::format("non-finite gradient at step {} {} ({} training has no loss scale to "
                          "lower and skip the step; lower the learning rate, clip gradients, or "
                          "check the data of that step)",
                          step, origin, dtype_name(options_.compute_dtype)));
}

}  // namespace zest
