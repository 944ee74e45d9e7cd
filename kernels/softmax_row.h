// Softmax of one row, out[j] = exp(row[j] - max) / sum, on the CPU, by the bodies softmax
// cross-entropy uses (kernels/cross_entropy_body.h): the row's max and exp-sum in fixed lanes,
// the sum in double, the same exp. Every body gives the same bits.
// Invariant: out may alias row; n >= 1.
#pragma once

#include <cstdint>

#include "kernels/cpu_body.h"

namespace zest::cpu {

void softmax_row(CpuBody body, const float* row, std::int64_t n, float* out);

}  // namespace zest::cpu
