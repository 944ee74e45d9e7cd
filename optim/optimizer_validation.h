// Checks of OptimizerOptions shared by the optimizers, so that every bad value is reported the
// same way: a kConfig Error naming the JSON path under "optimizer.params" (DeepSpeed's layout),
// the rule and the value given, e.g. "optimizer.params.lr: must be > 0, got -1".
#pragma once

#include <string>
#include <vector>

namespace zest {

struct OptimizerOptions;

// Throws unless `ok`; `key` is relative to "optimizer.params" ("lr", "betas[0]").
void require_option(bool ok, const std::string& key, const std::string& rule, double value);

// lr finite and > 0, weight_decay finite and >= 0: the keys every optimizer has.
void validate_common_options(const OptimizerOptions& options);

// Throws a kUsage Error unless `state` holds `expected` non-null arrays.
void check_state(const std::string& optimizer, const std::vector<float*>& state,
                 std::size_t expected);

}  // namespace zest
