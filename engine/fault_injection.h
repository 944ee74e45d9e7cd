// Faults injected on purpose (zest-train's `debug.fault` block), so that what zest does when a
// rank fails, stalls, produces a NaN or runs out of memory is exercised by tests instead of
// hoped for. One fault per run, on one rank, at one step. The defined outcomes:
//   throw            the rank fails at the start of the step: the run ends with an error naming
//                    the rank and the step, on every rank, within the collective timeout;
//   stall            the rank sleeps `stall_seconds` before the step: its peers' collectives time
//                    out naming the missing rank (when the stall outlasts world.timeout_s);
//   nan_gradient     a NaN is written into `unit`'s gradient after its backward: fp16 skips the
//                    step (loss scaling's overflow path); fp32 / bf16 stop with a kDivergence
//                    Error "non-finite gradient at step k on rank r, unit u";
//   fail_allocation  the rank's first activation allocation of the step fails: the out-of-memory
//                    message;
//   stall_nvme_write with offload_optimizer "nvme", the rank's NVMe write stream sleeps
//                    `stall_seconds` in the middle of the step's optimizer writes (before the
//                    middle unit's), after one stderr line saying so: the swap files are half
//                    updated, so that a kill -9 then is a crash mid-write (tests of resume).
#pragma once

#include <cstdint>
#include <string>

namespace zest {

struct FaultInjection {
  enum class Kind { kNone, kThrow, kStall, kNanGradient, kFailAllocation, kStallNvmeWrite };
  Kind kind = Kind::kNone;
  int rank = 0;
  std::int64_t step = 1;      // counted as StepStats::step: the first step is 1
  std::string unit;           // nan_gradient: the unit's name; empty: the last unit
  double stall_seconds = 0.0;  // stall

  bool hits(int this_rank, std::int64_t this_step) const {
    return kind != Kind::kNone && rank == this_rank && step == this_step;
  }
};

// "throw", "stall", "nan_gradient", "fail_allocation"; kNone for anything else.
FaultInjection::Kind fault_kind_from_name(const std::string& name);

}  // namespace zest
