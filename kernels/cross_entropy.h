// Softmax and cross-entropy fused over logits [rows, classes] with int32 class targets [rows]:
// forward writes the mean loss over rows; backward writes dlogits = (softmax - onehot(target))
// * (scale / rows), where scale is the loss scale. Both subtract each row's max before exp, so
// any finite logits are safe. Invariant: a target outside [0, classes) is a kData Error naming
// its row and value (raised by the body, so on the stream); dlogits may alias logits. Every CPU
// body (kernels/cpu_body.h) gives the same bits.
#pragma once

#include <cstdint>

#include "kernels/cpu_body.h"
#include "runtime/stream.h"

namespace zest {

namespace cpu {

// With the process's body (selected_cpu_body()).
void cross_entropy_forward(const float* logits, const std::int32_t* targets, std::int64_t rows,
                           std::int64_t classes, float* loss);
void cross_entropy_backward(const float* logits, const std::int32_t* targets, std::int64_t rows,
                            std::int64_t classes, float scale, float* dlogits);
// With a given body, which the caller has checked with cpu_body_supported().
void cross_entropy_forward(CpuBody body, const float* logits, const std::int32_t* targets,
                           std::int64_t rows, std::int64_t classes, float* loss);
void cross_entropy_backward(CpuBody body, const float* logits, const std::int32_t* targets,
                            std::int64_t rows, std::int64_t classes, float scale, float* dlogits);

}  // namespace cpu

// Throw a kUsage Error, on the host, unless rows >= 1 and classes >= 1.
void cross_entropy_forward(Stream& stream, const float* logits, const std::int32_t* targets,
                           std::int64_t rows, std::int64_t classes, float* loss);
void cross_entropy_backward(Stream& stream, const float* logits, const std::int32_t* targets,
                            std::int64_t rows, std::int64_t classes, float scale, float* dlogits);

}  // namespace zest
