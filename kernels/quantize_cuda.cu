#include "kernels/quantize_cuda.h"

#include <cfloat>
#include <cstdint>
#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/launch_cuda.cuh"
#include "kernels/element_types_cuda.cuh"

namespace zest::cuda {
namespace {

void check_arguments(std::size_t block, int bits, const char* kernel) {
  if (block == 0) throw Error(ErrorKind::kUsage, std::string(kernel) + ": block size 0");
  if (bits != 8 && bits != 4) {
    throw Error(ErrorKind::kUsage,
                std::string(kernel) + ": bits must be 8 or 4, got " + std::to_string(bits));
  }
}

// Bytes of the values, padded to 4 (kernels/quantize.h's layout).
std::size_t scales_offset(std::size_t count, int bits) {
  return ((bits == 8 ? count : (count + 1) / 2) + 3) / 4 * 4;
}

// One level from a value and its block's scale, as the CPU body computes it: one IEEE multiply by
// the inverse scale, round to nearest even, clamp. Scale 0 (a zero block) and NaN (a non-finite
// block) give level 0.
__device__ __forceinline__ int level_of(float x, float scale, float levels) {
  if (!(scale > 0.0f)) return 0;
  const float level = rintf(__fmul_rn(x, __fdiv_rn(1.0f, scale)));
  return static_cast<int>(fminf(fmaxf(level, -levels), levels));
}

template <int Bits>
__device__ __forceinline__ float value_at(const std::uint8_t* values, std::size_t i) {
  if constexpr (Bits == 8) {
    return static_cast<float>(static_cast<std::int8_t>(values[i]));
  } else {
    const int nibble = (values[i / 2] >> (4 * (i % 2))) & 0xF;
    return static_cast<float>((nibble ^ 8) - 8);
  }
}

// One thread block per quantization block (grid-stride over blocks): the block's max|x| and
// whether it is finite, reduced in shared memory, then (8 bits) its values. At 4 bits a byte may
// hold the last value of one block and the first of the next, so the values are packed by
// pack_int4_kernel once every scale is known.
template <typename T, int Bits>
__global__ void quantize_kernel(const typename T::Storage* __restrict__ in, std::size_t count,
                                std::size_t block, std::uint8_t* __restrict__ values,
                                float* __restrict__ scales) {
  constexpr float kLevels = Bits == 8 ? 127.0f : 7.0f;
  __shared__ float largest[kThreadsPerBlock];
  __shared__ int finite[kThreadsPerBlock];
  const std::size_t blocks = (count + block - 1) / block;
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::size_t first = b * block;
    const std::size_t last = first + block < count ? first + block : count;
    float mine = 0.0f;
    int ok = 1;
    for (std::size_t i = first + threadIdx.x; i < last; i += blockDim.x) {
      const float x = T::load(in[i]);
      ok &= isfinite(x) ? 1 : 0;
      mine = fmaxf(mine, fabsf(x));
    }
    largest[threadIdx.x] = mine;
    finite[threadIdx.x] = ok;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) {
        largest[threadIdx.x] = fmaxf(largest[threadIdx.x], largest[threadIdx.x + half]);
        finite[threadIdx.x] &= finite[threadIdx.x + half];
      }
      __syncthreads();
    }
    const float top = largest[0];
    const bool zero = !finite[0] || top == 0.0f;
    const float scale = zero ? 0.0f : fmaxf(__fdiv_rn(top, kLevels), FLT_MIN);
    if (threadIdx.x == 0) scales[b] = finite[0] ? scale : __int_as_float(0x7fc00000);
    if constexpr (Bits == 8) {
      for (std::size_t i = first + threadIdx.x; i < last; i += blockDim.x) {
        values[i] = static_cast<std::uint8_t>(
            static_cast<std::int8_t>(level_of(T::load(in[i]), scale, kLevels)));
      }
    }
    __syncthreads();  // the shared arrays are reused by the next block
  }
}

// One thread per byte of the padded values: two levels, each with its own block's scale; the
// padding (and an odd count's last high nibble) 0.
template <typename T>
__global__ void pack_int4_kernel(const typename T::Storage* __restrict__ in, std::size_t count,
                                 std::size_t block, const float* __restrict__ scales,
                                 std::size_t bytes, std::uint8_t* __restrict__ values) {
  for (std::size_t j = first_index(); j < bytes; j += grid_stride()) {
    int byte = 0;
    for (std::size_t half = 0; half < 2; ++half) {
      const std::size_t i = 2 * j + half;
      if (i < count) {
        byte |= (level_of(T::load(in[i]), scales[i / block], 7.0f) & 0xF) << (4 * half);
      }
    }
    values[j] = static_cast<std::uint8_t>(byte);
  }
}

__global__ void zero_padding_kernel(std::uint8_t* values, std::size_t from, std::size_t to) {
  for (std::size_t i = from + first_index(); i < to; i += grid_stride()) values[i] = 0;
}

template <typename T, int Bits>
__global__ void dequantize_kernel(const std::uint8_t* __restrict__ values,
                                  const float* __restrict__ scales, std::size_t count,
                                  std::size_t block, typename T::Storage* __restrict__ out) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    out[i] = T::store(__fmul_rn(value_at<Bits>(values, i), scales[i / block]));
  }
}

template <int Bits>
__global__ void dequantize_accumulate_kernel(const std::uint8_t* __restrict__ values,
                                             const float* __restrict__ scales, std::size_t count,
                                             std::size_t block, float* __restrict__ out) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    out[i] = __fadd_rn(out[i], __fmul_rn(value_at<Bits>(values, i), scales[i / block]));
  }
}

template <typename T, int Bits>
void launch_quantize(const void* source, std::size_t count, std::size_t block, void* packed,
                     cudaStream_t stream) {
  const auto* in = static_cast<const typename T::Storage*>(source);
  auto* values = static_cast<std::uint8_t*>(packed);
  const std::size_t bytes = scales_offset(count, Bits);
  auto* scales = reinterpret_cast<float*>(values + bytes);
  const std::size_t blocks = (count + block - 1) / block;
  const auto grid = static_cast<unsigned>(std::min<std::size_t>(blocks, kMaxBlocks));
  quantize_kernel<T, Bits><<<grid, kThreadsPerBlock, 0, stream>>>(in, count, block, values, scales);
  ZEST_CUDA_CHECK(cudaGetLastError());
  if constexpr (Bits == 4) {
    pack_int4_kernel<T><<<block_count(bytes), kThreadsPerBlock, 0, stream>>>(
        in, count, block, scales, bytes, values);
    ZEST_CUDA_CHECK(cudaGetLastError());
  } else if (bytes > count) {
    zero_padding_kernel<<<1, 32, 0, stream>>>(values, count, bytes);
    ZEST_CUDA_CHECK(cudaGetLastError());
  }
}

template <typename T, int Bits>
void launch_dequantize(const void* packed, std::size_t count, std::size_t block,
                       void* destination, cudaStream_t stream) {
  const auto* values = static_cast<const std::uint8_t*>(packed);
  const auto* scales = reinterpret_cast<const float*>(values + scales_offset(count, Bits));
  dequantize_kernel<T, Bits><<<block_count(count), kThreadsPerBlock, 0, stream>>>(
      values, scales, count, block, static_cast<typename T::Storage*>(destination));
  ZEST_CUDA_CHECK(cudaGetLastError());
}

template <int Bits>
void launch_dequantize_accumulate(const void* packed, std::size_t count, std::size_t block,
                                  float* destination, cudaStream_t stream) {
  const auto* values = static_cast<const std::uint8_t*>(packed);
  const auto* scales = reinterpret_cast<const float*>(values + scales_offset(count, Bits));
  dequantize_accumulate_kernel<Bits><<<block_count(count), kThreadsPerBlock, 0, stream>>>(
      values, scales, count, block, destination);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void quantize_blocks(const void* source, DType type, std::size_t count, std::size_t block,
                     void* packed, cudaStream_t stream, int bits) {
  check_arguments(block, bits, "quantize_blocks");
  with_element_type(type, "quantize_blocks", [&](auto tag) {
    using T = decltype(tag);
    if (count == 0) return;
    if (bits == 8) {
      launch_quantize<T, 8>(source, count, block, packed, stream);
    } else {
      launch_quantize<T, 4>(source, count, block, packed, stream);
    }
  });
}

void dequantize_blocks(const void* packed, std::size_t count, std::size_t block,
                       void* destination, DType type, cudaStream_t stream, int bits) {
  check_arguments(block, bits, "dequantize_blocks");
  with_element_type(type, "dequantize_blocks", [&](auto tag) {
    using T = decltype(tag);
    if (count == 0) return;
    if (bits == 8) {
      launch_dequantize<T, 8>(packed, count, block, destination, stream);
    } else {
      launch_dequantize<T, 4>(packed, count, block, destination, stream);
    }
  });
}

void dequantize_accumulate(const void* packed, std::size_t count, std::size_t block,
                           float* destination, cudaStream_t stream, int bits) {
  check_arguments(block, bits, "dequantize_accumulate");
  if (count == 0) return;
  if (bits == 8) {
    launch_dequantize_accumulate<8>(packed, count, block, destination, stream);
  } else {
    launch_dequantize_accumulate<4>(packed, count, block, destination, stream);
  }
}

}  // namespace zest::cuda
