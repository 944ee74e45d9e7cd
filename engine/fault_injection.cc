#include "engine/fault_injection.h"

namespace zest {

FaultInjection::Kind fault_kind_from_name(const std::string& name) {
  if (name == "throw") return FaultInjection::Kind::kThrow;
  if (name == "stall") return FaultInjection::Kind::kStall;
  if (name == "nan_gradient") return FaultInjection::Kind::kNanGradient;
  if (name == "fail_allocation") return FaultInjection::Kind::kFailAllocation;
  if (name == "stall_nvme_write") return FaultInjection::Kind::kStallNvmeWrite;
  return FaultInjection::Kind::kNone;
}

}  // namespace zest
