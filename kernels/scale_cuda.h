// CUDA body of scaling an fp32 buffer in place, data[i] *= factor: the loss scaler's unscale of
// gradients (factor 1 / scale) and any scale of a shard. The optimizers usually fold the unscale
// into their grad_scale instead; this is for what is scaled on its own. One rounding per element,
// so results are bit-identical to the same multiply on the CPU, but for a NaN's bits (the GPU's
// multiply returns the canonical NaN; x86 keeps the operand's).
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/scale_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>

namespace zest::cuda {

// Enqueues data[i] *= factor for i < count on `stream`; `data` is a device pointer. A failed
// launch throws kDevice.
void scale(float* data, std::size_t count, float factor, cudaStream_t stream);

}  // namespace zest::cuda
