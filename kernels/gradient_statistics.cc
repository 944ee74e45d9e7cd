#include "kernels/gradient_statistics.h"

#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/cpu_body.h"
#include "kernels/dispatch.h"
#include "kernels/gradient_statistics_body.h"

#if ZEST_HAVE_CUDA
#include "kernels/gradient_statistics_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace {

void check_type(DType type) {
  if (type != DType::kFloat32 && type != DType::kBFloat16 && type != DType::kFloat16) {
    throw Error(ErrorKind::kUsage, std::string("add_gradient_statistics: ") + dtype_name(type) +
                                       " is not supported (fp32, bf16, fp16)");
  }
}

inline float to_float(float value) { return value; }
inline float to_float(BFloat16 value) { return static_cast<float>(value); }
inline float to_float(Float16 value) { return static_cast<float>(value); }

// Note: element i goes to lane i % kLanes, and the lanes are folded pairwise at the end: the
// additions are independent across lanes, so the loop runs as vector code, and their order is
// still fixed (squares of floats are exact in double; only the additions round). The count of
// non-finite elements needs a second pass only when the sum is not finite: the square of a
// finite float never overflows a double, nor does any sum of them.
template <typename T>
double sum_of_squares(const T* values, std::size_t count) {
  constexpr std::size_t kLanes = cpu::kStatisticsLanes;
  double lanes[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (std::size_t l = 0; l < kLanes; ++l) {
      const double value = to_float(values[i + l]);
      lanes[l] += value * value;
    }
  }
  for (; i < count; ++i) {
    const double value = to_float(values[i]);
    lanes[i % kLanes] += value * value;
  }
  for (std::size_t width = kLanes / 2; width >= 1; width /= 2) {
    for (std::size_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

double sum_of_squares(CpuBody body, const float* values, std::size_t count) {
  switch (body) {
#if defined(ZEST_HAVE_X86_BODIES)
    case CpuBody::kAvx512: return cpu::sum_of_squares_avx512(values, count);
    case CpuBody::kAvx2: return cpu::sum_of_squares_avx2(values, count);
#else
    case CpuBody::kAvx512:
    case CpuBody::kAvx2:
#endif
    case CpuBody::kPortable: break;
  }
  return cpu::sum_of_squares_portable(values, count);
}

double sum_of_squares(CpuBody /*body*/, const BFloat16* values, std::size_t count) {
  return sum_of_squares(values, count);
}
double sum_of_squares(CpuBody /*body*/, const Float16* values, std::size_t count) {
  return sum_of_squares(values, count);
}

template <typename T>
void add_statistics(CpuBody body, const T* values, std::size_t count,
                    GradientStatistics* statistics) {
  const double sum = sum_of_squares(body, values, count);
  std::uint64_t non_finite = 0;
  if (!std::isfinite(sum)) {
    for (std::size_t k = 0; k < count; ++k) non_finite += std::isfinite(to_float(values[k])) ? 0 : 1;
  }
  // Summed apart and added once, as the CUDA body adds its reduction's result.
  statistics->sum_of_squares += sum;
  statistics->non_finite += non_finite;
}

}  // namespace

namespace cpu {

double sum_of_squares_portable(const float* values, std::size_t count) {
  return sum_of_squares(values, count);
}

void add_gradient_statistics(CpuBody body, const void* data, DType type, std::size_t count,
                             GradientStatistics* statistics) {
  check_type(type);
  switch (type) {
    case DType::kFloat32:
      return add_statistics(body, static_cast<const float*>(data), count, statistics);
    case DType::kBFloat16:
      return add_statistics(body, static_cast<const BFloat16*>(data), count, statistics);
    default:
      return add_statistics(body, static_cast<const Float16*>(data), count, statistics);
  }
}

void add_gradient_statistics(const void* data, DType type, std::size_t count,
                             GradientStatistics* statistics) {
  add_gradient_statistics(selected_cpu_body(), data, type, count, statistics);
}

}  // namespace cpu

void add_gradient_statistics(Stream& stream, const void* data, DType type, std::size_t count,
                             GradientStatistics* statistics) {
  check_type(type);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    // The stream first: the workspace size asks the device, which a stream that is not a
    // CudaStream may not have.
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "add_gradient_statistics");
    if (count == 0) return;
    const std::size_t bytes = cuda::gradient_statistics_workspace_bytes(type, count);
    cuda::add_gradient_statistics(data, type, count, statistics,
                                  cuda.workspace(bytes, "add_gradient_statistics"), bytes,
                                  cuda.handle());
    return;
  }
#endif
  const CpuBody body = selected_cpu_body();
  dispatch_kernel(stream, "add_gradient_statistics",
                  [=] { cpu::add_gradient_statistics(body, data, type, count, statistics); });
}

}  // namespace zest
