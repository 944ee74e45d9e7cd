// CUDA bodies of the fp32 <-> bf16 and fp32 <-> fp16 casts: the mixed-precision step casts the
// updated fp32 master shard to the compute dtype with these (where the optimizer does not write
// the rounded copy itself). Rounding is bit-identical to BFloat16::round_to_bits and
// Float16::round_to_bits in base/dtype.h (round to nearest even, NaN stays a quiet NaN with its
// sign), so a CPU run and a GPU run of the same step produce the same 2-byte parameters.
// CUDA-side only: include this from .cu files and *_cuda.cc sources, never from CPU-only code.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/cast_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace zest::cuda {

// Enqueue the cast of `count` elements on `stream`; `in` and `out` are device pointers (views
// into buffers an allocator owns) and must not overlap. Returns once the kernel is launched;
// throws zest::Error (kDevice) if the launch fails.
void cast_float_to_bfloat16(const float* in, std::uint16_t* out, std::size_t count,
                            cudaStream_t stream);
void cast_bfloat16_to_float(const std::uint16_t* in, float* out, std::size_t count,
                            cudaStream_t stream);
void cast_float_to_float16(const float* in, std::uint16_t* out, std::size_t count,
                           cudaStream_t stream);
void cast_float16_to_float(const std::uint16_t* in, float* out, std::size_t count,
                           cudaStream_t stream);
// bf16 <-> fp16 (gradients in one type reduced in the other: communication_data_type).
void cast_bfloat16_to_float16(const std::uint16_t* in, std::uint16_t* out, std::size_t count,
                              cudaStream_t stream);
void cast_float16_to_bfloat16(const std::uint16_t* in, std::uint16_t* out, std::size_t count,
                              cudaStream_t stream);

}  // namespace zest::cuda
