// What the gradient-statistics bodies share: kernels/gradient_statistics.cc (portable, and the
// dispatch), gradient_statistics_avx2.cc and gradient_statistics_avx512.cc. Not an interface; use
// kernels/gradient_statistics.h.
// Invariant: every body sums the squares of fp32 values in double, element i in lane i % 8, and
// folds the lanes pairwise (4, 2, 1), as the portable body does: the squares are exact in double,
// the additions happen in the same order, so all bodies return the same bits.
// Note: plain declarations only, for the reason kernels/adamw_body.h gives.
#pragma once

#include <cstddef>

namespace zest::cpu {

inline constexpr std::size_t kStatisticsLanes = 8;

double sum_of_squares_portable(const float* values, std::size_t count);
double sum_of_squares_avx2(const float* values, std::size_t count);
double sum_of_squares_avx512(const float* values, std::size_t count);

}  // namespace zest::cpu
