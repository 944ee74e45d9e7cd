// The fp32 vector operations on a stream against their bodies, and the refusal of a stream that
// only claims CUDA.
#include "kernels/vector_ops.h"

#include <gtest/gtest.h>

#include <vector>

#include "runtime/cpu_device.h"
#include "tests/kernels/cuda_refusal.h"

namespace zest {
namespace {

TEST(VectorOps, OnAStreamAccumulateAsTheirBodies) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  std::vector<float> destination(101), source(101);
  for (int i = 0; i < 101; ++i) {
    destination[i] = 0.1f * static_cast<float>(i);
    source[i] = 1.0f / static_cast<float>(i + 1);
  }
  std::vector<float> direct = destination;
  double sum = 0.25;  // accumulated into, as the norm of several units
  accumulate(*stream, destination.data(), source.data(), 101);
  add_sum_of_squares(*stream, source.data(), 101, &sum);
  stream->synchronize();
  cpu::accumulate(direct.data(), source.data(), 101);
  EXPECT_EQ(destination, direct);
  EXPECT_EQ(sum, 0.25 + cpu::sum_of_squares(source.data(), 101));
}

// With CUDA built a CudaStream launches the CUDA bodies (accumulate_cuda_test.cc,
// gradient_statistics_cuda_test.cc); a stream that only claims CUDA is refused by name.
TEST(VectorOps, AStreamThatIsNotARealCudaStreamIsRefusedByName) {
  float a = 1.0f, b = 2.0f;
  double sum = 0.0;
  testing::expect_cuda_stream_refused(
      "accumulate", [&](Stream& stream) { accumulate(stream, &a, &b, 1); });
  testing::expect_cuda_stream_refused(
      "add_sum_of_squares", [&](Stream& stream) { add_sum_of_squares(stream, &a, 1, &sum); });
}

}  // namespace
}  // namespace zest
