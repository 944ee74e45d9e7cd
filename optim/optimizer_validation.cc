#include "optim/optimizer_validation.h"

#include <cmath>
#include <sstream>

#include "base/error.h"
#include "optim/optimizer.h"

namespace zest {

void require_option(bool ok, const std::string& key, const std::string& rule, double value) {
  if (ok) return;
  std::ostringstream message;
  message << "optimizer.params." << key << ": must be " << rule << ", got " << value;
  throw Error(ErrorKind::kConfig, message.str());
}

void validate_common_options(const OptimizerOptions& options) {
  require_option(std::isfinite(options.lr) && options.lr > 0, "lr", "> 0", options.lr);
  require_option(std::isfinite(options.weight_decay) && options.weight_decay >= 0, "weight_decay",
                 ">= 0", options.weight_decay);
}

void check_state(const std::string& optimizer, const std::vector<float*>& state,
                 std::size_t expected) {
  bool ok = state.size() == expected;
  for (const float* array : state) ok = ok && array != nullptr;
  if (!ok) {
    throw Error(ErrorKind::kUsage, optimizer + ": update needs " + std::to_string(expected) +
                                       " non-null state arrays, got " +
                                       std::to_string(state.size()));
  }
}

}  // namespace zest
