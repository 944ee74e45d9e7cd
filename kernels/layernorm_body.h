// What the LayerNorm bodies share: kernels/layernorm.cc (portable, and the dispatch),
// layernorm_avx2.cc and layernorm_avx512.cc. Not an interface; use kernels/layernorm.h.
// Invariant: every body performs the portable body's operations (layernorm.cc) in the same order,
// each rounded once: the row sums in kLayerNormLanes lanes (element j in lane j % lanes, folded
// pairwise), the forward's statistics and normalization in double, the rest in fp32; so all
// bodies agree bit for bit.
// Note: plain declarations only, for the reason kernels/adamw_body.h gives.
#pragma once

#include <cstdint>

namespace zest::cpu {

inline constexpr std::int64_t kLayerNormLanes = 8;

void layernorm_forward_portable(const float* x, const float* weight, const float* bias,
                                std::int64_t rows, std::int64_t cols, float eps, float* y,
                                float* mean, float* rstd);
void layernorm_backward_portable(const float* dy, const float* x, const float* weight,
                                 const float* mean, const float* rstd, std::int64_t rows,
                                 std::int64_t cols, float* dx, float* dweight, float* dbias);
void layernorm_forward_avx2(const float* x, const float* weight, const float* bias,
                            std::int64_t rows, std::int64_t cols, float eps, float* y, float* mean,
                            float* rstd);
void layernorm_backward_avx2(const float* dy, const float* x, const float* weight,
                             const float* mean, const float* rstd, std::int64_t rows,
                             std::int64_t cols, float* dx, float* dweight, float* dbias);
void layernorm_forward_avx512(const float* x, const float* weight, const float* bias,
                              std::int64_t rows, std::int64_t cols, float eps, float* y,
                              float* mean, float* rstd);
void layernorm_backward_avx512(const float* dy, const float* x, const float* weight,
                               const float* mean, const float* rstd, std::int64_t rows,
                               std::int64_t cols, float* dx, float* dweight, float* dbias);

}  // namespace zest::cpu
