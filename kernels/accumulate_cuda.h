// CUDA body of kernels/convert.h's accumulate_into (and vector_ops.h's fp32 accumulate):
// destination[i] += source[i] for any pair of fp32, bf16 and fp16, the sum computed in fp32 and
// rounded to the destination's type. One fp32 add (__fadd_rn: never fused with anything) and the
// rounding of base/dtype.h (kernels/round_cuda.cuh), so the result is bit-identical to
// cpu::accumulate_into: a gradient folded on the GPU equals the same fold on the CPU. Only a NaN
// may differ in its bits (the GPU's add returns the canonical NaN; x86 keeps an operand's).
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/accumulate_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "base/dtype.h"

namespace zest::cuda {

// Enqueues destination[i] += source[i], i < count, on `stream`. Device pointers (views into
// buffers an allocator owns) that must not overlap. Throws, on the host, kUsage for a type other
// than fp32, bf16 or fp16, and kDevice if the launch fails. count 0 launches nothing.
void accumulate_into(void* destination, DType destination_type, const void* source,
                     DType source_type, std::size_t count, cudaStream_t stream);

}  // namespace zest::cuda
