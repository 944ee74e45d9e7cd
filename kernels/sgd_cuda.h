// CUDA body of the SGD update (kernels/sgd.h has the formulas): one launch per flat shard,
// 16-byte loads and stores where the arrays are aligned. Every fp32 operation is the CPU body's,
// in its order and rounded once (no FMA), so results are bit-identical to cpu::sgd.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/sgd_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/sgd.h"

namespace zest::cuda {

// Enqueues the update of `count` elements on `stream`; the pointers are device pointers with
// sgd.h's invariants. Arguments are checked here, on the host (a kUsage Error, as the CPU body);
// a failed launch throws kDevice.
void sgd(float* params, const float* grads, float* momentum_buffer, std::size_t count,
         const SgdArgs& args, cudaStream_t stream);

}  // namespace zest::cuda
