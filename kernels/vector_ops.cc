#include "kernels/vector_ops.h"

#include "kernels/dispatch.h"

#if ZEST_HAVE_CUDA
#include "base/dtype.h"
#include "kernels/accumulate_cuda.h"
#include "kernels/gradient_statistics_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {

namespace cpu {

void accumulate(float* __restrict destination, const float* __restrict source, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) destination[i] += source[i];
}

double sum_of_squares(const float* data, std::size_t count) {
  double sum = 0.0;
  for (std::size_t i = 0; i < count; ++i) sum += static_cast<double>(data[i]) * data[i];
  return sum;
}

}  // namespace cpu

void accumulate(Stream& stream, float* destination, const float* source, std::size_t count) {
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    const cudaStream_t handle = cuda::stream_handle(stream, "accumulate");
    cuda::accumulate_into(destination, DType::kFloat32, source, DType::kFloat32, count, handle);
    return;
  }
#endif
  dispatch_kernel(stream, "accumulate", [=] { cpu::accumulate(destination, source, count); });
}

void add_sum_of_squares(Stream& stream, const float* data, std::size_t count, double* result) {
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    // The stream first: the workspace size asks the device, which a stream that is not a
    // CudaStream may not have.
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "add_sum_of_squares");
    if (count == 0) return;
    const std::size_t bytes = cuda::gradient_statistics_workspace_bytes(DType::kFloat32, count);
    cuda::add_sum_of_squares(data, count, result, cuda.workspace(bytes, "add_sum_of_squares"),
                             bytes, cuda.handle());
    return;
  }
#endif
  dispatch_kernel(stream, "add_sum_of_squares",
                  [=] { *result += cpu::sum_of_squares(data, count); });
}

}  // namespace zest
