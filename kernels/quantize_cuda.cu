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




std::size_t scales_offset(std::size_t count) { return (count + 3) / 4 * 4; }

// One thread block per quantization block (grid-stride over blocks): the block's max|x| and
// whether it is finite, reduced in shared memory, then its values.
template <typename T>
__global__ void quantize_kernel(const typename T::Storage* __restrict__ in, std::size_t count,
                                std::size_t block, std::int8_t* __restrict__ values,
                                float* __restrict__ scales) {
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
    const float scale = zero ? 0.0f : fmaxf(__fdiv_rn(top, 127.0f), FLT_MIN);
    const float inverse = zero ? 0.0f : __fdiv_rn(1.0f, scale);
    if (threadIdx.x == 0) scales[b] = finite[0] ? scale : __int_as_float(0x7fc00000);
    for (std::size_t i = first + threadIdx.x; i < last; i += blockDim.x) {
      const float q = zero ? 0.0f : fminf(fmaxf(rintf(__fmul_rn(T::load(in[i]), inverse)), -127.0f), 127.0f);
      values[i] = static_cast<std::int8_t>(q);
    }
    __syncthreads();  // the shared arrays are reused by the next block
  }
}

__global__ void zero_padding_kernel(std::int8_t* values, std::size_t from, std::size_t to) {
  for (std::size_t i = from + first_index(); i < to; i += grid_stride()) values[i] = 0;
}

template <typename T>
__global__ void dequantize_kernel(const std::int8_t* __restrict__ values,
                                  const float* __restrict__ scales, std::size_t count,
                                  std::size_t block, typename T::Storage* __restrict__ out) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    out[i] = T::store(__fmul_rn(static_cast<float>(values[i]), scales[i / block]));
  }
}

__global__ void dequantize_accumulate_kernel(const std::int8_t* __restrict__ values,
                                             const float* __restrict__ scales, std::size_t count,
                                             std::size_t block, float* __restrict__ out) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    out[i] = __fadd_rn(out[i], __fmul_rn(static_cast<float>(values[i]), scales[i / block]));
  }
}

template <typename T>
void launch_quantize(const void* source, std::size_t count, std::size_t block, void* packed,
                     cudaStream_t stream) {
  auto* values = static_cast<std::int8_t*>(packed);
  auto* scales = reinterpret_cast<float*>(values + scales_offset(count));
  const std::size_t blocks = (count + block - 1) / block;
  const auto grid = static_cast<unsigned>(std::min<std::size_t>(blocks, kMaxBlocks));
  quantize_kernel<T><<<grid, kThreadsPerBlock, 0, stream>>>(
      static_cast<const typename T::Storage*>(source), count, block, values, scales);
  ZEST_CUDA_CHECK(cudaGetLastError());
  if (scales_offset(count) > count) {
    zero_padding_kernel<<<1, 32, 0, stream>>>(values, count, scales_offset(count));
    ZEST_CUDA_CHECK(cudaGetLastError());
  }
}

template <typename T>
void launch_dequantize(const void* packed, std::size_t count, std::size_t block,
                       void* destination, cudaStream_t stream) {
  const auto* values = static_cast<const std::int8_t*>(packed);
  const auto* scales = reinterpret_cast<const float*>(values + scales_offset(count));
  dequantize_kernel<T><<<block_count(count), kThreadsPerBlock, 0, stream>>>(
      values, scales, count, block, static_cast<typename T::Storage*>(destination));
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void quantize_blocks(const void* source, DType type, std::size_t count, std::size_t block,
                     void* packed, cudaStream_t stream) {
  with_element_type(type, "quantize_blocks", [&](auto tag) {
    if (count > 0) launch_quantize<decltype(tag)>(source, count, block, packed, stream);
  });
}

void dequantize_blocks(const void* packed, std::size_t count, std::size_t block,
                       void* destination, DType type, cudaStream_t stream) {
  with_element_type(type, "dequantize_blocks", [&](auto tag) {
    if (count > 0) launch_dequantize<decltype(tag)>(packed, count, block, destination, stream);
  });
}

void dequantize_accumulate(const void* packed, std::size_t count, std::size_t block,
                           float* destination, cudaStream_t stream) {
  if (count == 0) return;
  const auto* values = static_cast<const std::int8_t*>(packed);
  const auto* scales = reinterpret_cast<const float*>(values + scales_offset(count));
  dequantize_accumulate_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(
      values, scales, count, block, destination);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
