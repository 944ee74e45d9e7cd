// CUDA bodies of kernels/quantize.h: block-wise int8 / int4 quantization for the quantized
// collectives.
// Same arithmetic as the CPU bodies (max|x| is order-free, one IEEE multiply by the inverse
// scale, round to nearest even, one multiply and one unfused add to dequantize), so a GPU packs
// the same bytes as a CPU for the same input. CUDA-side only: include it from .cu files and
// *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/quantize_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "base/dtype.h"

namespace zest::cuda {

// Device pointers; `packed` 4-byte aligned. Throw kUsage on the host for a type other than fp32,
// bf16 or fp16, for `bits` other than 8 or 4 and for block 0, and kDevice if a launch fails.
// count 0 launches nothing.
void quantize_blocks(const void* source, DType type, std::size_t count, std::size_t block,
                     void* packed, cudaStream_t stream, int bits = 8);
void dequantize_blocks(const void* packed, std::size_t count, std::size_t block,
                       void* destination, DType type, cudaStream_t stream, int bits = 8);
void dequantize_accumulate(const void* packed, std::size_t count, std::size_t block,
                           float* destination, cudaStream_t stream, int bits = 8);

}  // namespace zest::cuda
