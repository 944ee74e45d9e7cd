// What the softmax cross-entropy bodies share: kernels/cross_entropy.cc (portable, the helpers
// below, and the dispatch), cross_entropy_avx2.cc and cross_entropy_avx512.cc. Not an interface;
// use kernels/cross_entropy.h.
// Invariant: a row's max and exp-sum are kept in kRowLanes lanes, element j in lane j % 16, each
// lane updated in element order, and the lanes combined in one fixed order (finish_* below), so
// every body gets the same bits whatever its vector width. Plain declarations only (see
// kernels/adamw_body.h for why).
#pragma once

#include <cstdint>

#include "kernels/cpu_body.h"

namespace zest::cpu {

inline constexpr std::int64_t kRowLanes = 16;

// max over row[0, classes), lanes[l] holding the max of lane l over [0, from); from is a
// multiple of kRowLanes.
float finish_row_max(float* lanes, const float* row, std::int64_t from, std::int64_t classes);
// sum of exp(row[j] - max) over [0, classes) in double, lanes as above.
double finish_row_exp_sum(double* lanes, const float* row, std::int64_t from,
                          std::int64_t classes, float max);
// out[j] = exp(row[j] - max) * inv_sum * scale for j in [from, classes).
void softmax_tail(const float* row, std::int64_t from, std::int64_t classes, float max,
                  float inv_sum, float scale, float* out);

struct RowBody {
  float (*max)(const float* row, std::int64_t classes);
  double (*exp_sum)(const float* row, std::int64_t classes, float max);
  void (*softmax)(const float* row, std::int64_t classes, float max, float inv_sum, float scale,
                  float* out);
};

// The three row functions of `body` (supported: the caller has checked cpu_body_supported()).
RowBody row_body(CpuBody body);

float row_max_avx2(const float* row, std::int64_t classes);
double row_exp_sum_avx2(const float* row, std::int64_t classes, float max);
void row_softmax_avx2(const float* row, std::int64_t classes, float max, float inv_sum,
                      float scale, float* out);
float row_max_avx512(const float* row, std::int64_t classes);
double row_exp_sum_avx512(const float* row, std::int64_t classes, float max);
void row_softmax_avx512(const float* row, std::int64_t classes, float max, float inv_sum,
                        float scale, float* out);

}  // namespace zest::cpu
