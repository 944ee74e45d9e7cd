#include "kernels/adamw_cuda.h"

#include <cstdint>

#include "base/cuda_check.h"
#include "kernels/adamw_body.h"
#include "kernels/launch_cuda.cuh"
#include "kernels/round_cuda.cuh"

namespace zest::cuda {
namespace {

using cpu::AdamCoefficients;

enum class Copy { kNone, kBFloat16, kFloat16 };

// Note: each operation is its own __f*_rn intrinsic, so nvcc cannot fuse a multiply and an add
// into an FMA (it would by default) and every value is rounded exactly where the CPU body rounds
// it (built with -ffp-contract=off); the same order makes the results bit-identical.
__device__ __forceinline__ void update(float& p, float g, float& m, float& v,
                                       const AdamCoefficients& c) {
  const float grad = __fadd_rn(__fmul_rn(g, c.grad_scale), __fmul_rn(c.l2, p));
  const float mi = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, grad));
  const float vi =
      __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(c.one_minus_beta2, grad), grad));
  m = mi;
  v = vi;
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_sqrt_bias_correction2), c.eps);
  p = __fsub_rn(__fmul_rn(p, c.decay), __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
}

template <Copy kCopy>
__device__ __forceinline__ std::uint16_t rounded(float value) {
  if constexpr (kCopy == Copy::kBFloat16) {
    return round_to_bfloat16_bits(value);
  } else {
    return round_to_float16_bits(value);
  }
}

// `groups` runs of 4 with float4 access (0 when any array is unaligned), then the rest singly.
template <Copy kCopy>
__global__ void adamw_kernel(float* __restrict__ params, const float* __restrict__ grads,
                             float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                             std::uint16_t* __restrict__ copy, std::size_t count,
                             std::size_t groups, AdamCoefficients c) {
  for (std::size_t group = first_index(); group < groups; group += grid_stride()) {
    const std::size_t i = group * 4;
    float4 p = *reinterpret_cast<const float4*>(params + i);
    const float4 g = *reinterpret_cast<const float4*>(grads + i);
    float4 m = *reinterpret_cast<const float4*>(exp_avg + i);
    float4 v = *reinterpret_cast<const float4*>(exp_avg_sq + i);
    update(p.x, g.x, m.x, v.x, c);
    update(p.y, g.y, m.y, v.y, c);
    update(p.z, g.z, m.z, v.z, c);
    update(p.w, g.w, m.w, v.w, c);
    *reinterpret_cast<float4*>(params + i) = p;
    *reinterpret_cast<float4*>(exp_avg + i) = m;
    *reinterpret_cast<float4*>(exp_avg_sq + i) = v;
    if constexpr (kCopy != Copy::kNone) {
      *reinterpret_cast<ushort4*>(copy + i) = make_ushort4(
          rounded<kCopy>(p.x), rounded<kCopy>(p.y), rounded<kCopy>(p.z), rounded<kCopy>(p.w));
    }
  }
  for (std::size_t i = groups * 4 + first_index(); i < count; i += grid_stride()) {
    float p = params[i];
    float m = exp_avg[i];
    float v = exp_avg_sq[i];
    update(p, grads[i], m, v, c);
    params[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if constexpr (kCopy != Copy::kNone) copy[i] = rounded<kCopy>(p);
  }
}

template <Copy kCopy>
void launch(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
            std::uint16_t* copy, std::size_t count, const AdamCoefficients& c,
            cudaStream_t stream) {
  // Note: the copy is 4 two-byte values per group, an 8-byte store.
  const bool aligned = aligned_to(params, 16) && aligned_to(grads, 16) &&
                       aligned_to(exp_avg, 16) && aligned_to(exp_avg_sq, 16) &&
                       (kCopy == Copy::kNone || aligned_to(copy, 8));
  const std::size_t groups = vector_groups(count, aligned);
  const std::size_t work = groups + (count - groups * 4);
  adamw_kernel<kCopy><<<block_count(work), kThreadsPerBlock, 0, stream>>>(
      params, grads, exp_avg, exp_avg_sq, copy, count, groups, c);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
           std::size_t count, const AdamWArgs& args, RoundedCopy copy, cudaStream_t stream) {
  cpu::check_adamw_args(args, copy);
  if (count == 0) return;
  const AdamCoefficients c = cpu::adam_coefficients(args);
  auto* rounded_copy = static_cast<std::uint16_t*>(copy.data);
  if (rounded_copy == nullptr) {
    launch<Copy::kNone>(params, grads, exp_avg, exp_avg_sq, nullptr, count, c, stream);
  } else if (copy.dtype == DType::kBFloat16) {
    launch<Copy::kBFloat16>(params, grads, exp_avg, exp_avg_sq, rounded_copy, count, c, stream);
  } else {
    launch<Copy::kFloat16>(params, grads, exp_avg, exp_avg_sq, rounded_copy, count, c, stream);
  }
}

}  // namespace zest::cuda
