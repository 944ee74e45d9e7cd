// CUDA body of the Adam / AdamW update (kernels/adamw.h has the formulas): one launch per flat
// shard, 16-byte loads and stores where the arrays are aligned, and the 2-byte compute copy
// written in the same pass. Every fp32 operation is the portable CPU body's, in its order and
// rounded once (no FMA), from the same host-computed constants, and sqrt and division are IEEE
// (no fast math): results, the rounded copy included, are bit-identical to cpu::adamw.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/adamw_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/adamw.h"

namespace zest::cuda {

// Enqueues the update of `count` elements on `stream`. The pointers (and copy.data) are device
// pointers, views into buffers an allocator owns, with adamw.h's invariants. Arguments are
// checked here, on the host (a kUsage Error, as the CPU body); a failed launch throws kDevice.
void adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
           std::size_t count, const AdamWArgs& args, RoundedCopy copy, cudaStream_t stream);

}  // namespace zest::cuda
