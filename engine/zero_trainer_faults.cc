// Faults injected into the ZeRO engine for tests (debug.fault, engine/fault_injection.h). The real
// fault a NaN gradient stands for, one that is not finite in fp32 / bf16 training, is caught by
// the gradient checks (engine/gradient_checks.h), which stop with a message.
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
  // Note: debug.fault.rank is a world rank; under hybrid sharding and in a pipeline's chunks
  // `context_.rank` is the rank inside a group, which several world ranks share.
  if (!fault.hits(context_.rank_in_world(), step)) return;
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
      !fault.hits(context_.rank_in_world(), steps_taken_ + 1)) {
    return;
  }
  const bool named = fault.unit.empty() ? unit.index + 1 == static_cast<int>(units_.size())
                                        : fault.unit == unit.layout.unit_name();
  if (!named) return;
  // After the unit's backward has written its gradient, in compute-stream order.
  void* gradient = reducer_->target(unit);
  // The NaN in the gradient's type is made on the host now; the device writes it in order.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  unsigned char bits[sizeof(float)] = {};
  cpu::convert(&nan, DType::kFloat32, bits, options_.compute_dtype, 1);
  write_from_host(context_.device, context_.compute, gradient, bits,
                  dtype_size(options_.compute_dtype));
}

}  // namespace zest
