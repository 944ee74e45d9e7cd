// GELU (tanh form) forward and backward against float64: the forward formula, the backward as
// the float64 derivative (itself checked by central differences), and the write-not-add and
// in-place contracts of the header.
#include "kernels/gelu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/support/fake_cuda_stream.h"

namespace zest {
namespace {

double gelu64(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

double dgelu64(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  const double t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

// x in [-8, 8]: both tails (gelu -> 0 and gelu -> x) and the curved middle.
std::vector<float> sample_points() {
  std::vector<float> x;
  for (int i = -800; i <= 800; ++i) x.push_back(static_cast<float>(i) * 0.01f + 0.003f);
  return x;
}

TEST(Gelu, ForwardMatchesFloat64Formula) {
  const std::vector<float> x = sample_points();
  std::vector<float> y(x.size());
  cpu::gelu_forward(x.data(), y.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    // A few fp32 roundings of terms as large as |x|: 5e-7 * max(1, |x|) absolute.
    ASSERT_NEAR(y[i], gelu64(x[i]), 5e-7 * std::max(1.0f, std::abs(x[i]))) << "x = " << x[i];
  }
}

TEST(Gelu, ForwardIsTheTanhApproximationNotErf) {
  // At x = 1 the tanh form gives 0.841192, the erf form 0.841345: 1.5e-4 apart.
  float x = 1.0f, y = 0.0f;
  cpu::gelu_forward(&x, &y, 1);
  EXPECT_NEAR(y, 0.8411920f, 1e-6f);
}

TEST(Gelu, ReferenceDerivativeAgreesWithCentralDifferences) {
  // Guards the float64 derivative used below, so that the backward check is independent.
  for (double x = -6.0; x <= 6.0; x += 0.37) {
    const double h = 1e-5;
    const double numeric = (gelu64(x + h) - gelu64(x - h)) / (2 * h);
    // Central difference error h^2 * f''' / 6 < 1e-10 here; rounding ~1e-16 / h = 1e-11.
    EXPECT_NEAR(dgelu64(x), numeric, 1e-9) << "x = " << x;
  }
}

TEST(Gelu, BackwardWritesDerivativeTimesUpstreamGradient) {
  const std::vector<float> x = sample_points();
  std::vector<float> dy(x.size()), dx(x.size(), 12345.0f);  // old dx must not matter
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = 0.5f + 0.001f * static_cast<float>(i % 7);
  cpu::gelu_backward(x.data(), dy.data(), dx.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    // gelu' is in about [-0.13, 1.13]; its fp32 evaluation errs by ~1e-6 of |x| for large x.
    const double want = dgelu64(x[i]) * dy[i];
    ASSERT_NEAR(dx[i], want, 1e-6 * std::max(1.0f, std::abs(x[i]))) << "x = " << x[i];
  }
}

TEST(Gelu, InPlaceGivesTheSameResult) {
  const std::vector<float> x = sample_points();
  std::vector<float> dy(x.size(), 0.75f);
  std::vector<float> y(x.size()), y_in_place = x;
  cpu::gelu_forward(x.data(), y.data(), x.size());
  cpu::gelu_forward(y_in_place.data(), y_in_place.data(), x.size());
  EXPECT_EQ(y, y_in_place);

  std::vector<float> dx(x.size()), over_x = x, over_dy = dy;
  cpu::gelu_backward(x.data(), dy.data(), dx.data(), x.size());
  cpu::gelu_backward(over_x.data(), dy.data(), over_x.data(), x.size());
  cpu::gelu_backward(x.data(), over_dy.data(), over_dy.data(), x.size());
  EXPECT_EQ(dx, over_x);
  EXPECT_EQ(dx, over_dy);
}

TEST(Gelu, DispatchRunsTheCpuBodiesOnTheStream) {
  const std::vector<float> x = sample_points();
  std::vector<float> y(x.size()), dx(x.size()), y_direct(x.size()), dx_direct(x.size());
  const std::vector<float> dy(x.size(), 1.0f);
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  gelu_forward(*stream, x.data(), y.data(), x.size());
  gelu_backward(*stream, x.data(), dy.data(), dx.data(), x.size());
  stream->synchronize();
  cpu::gelu_forward(x.data(), y_direct.data(), x.size());
  cpu::gelu_backward(x.data(), dy.data(), dx_direct.data(), x.size());
  EXPECT_EQ(y, y_direct);
  EXPECT_EQ(dx, dx_direct);
}

// A stream that only says CUDA is refused before anything is enqueued: in a CUDA build it is not
// a CudaStream to launch on, and a CPU-only build has no CUDA body.
TEST(Gelu, AStreamThatIsNotARealCudaStreamIsRefused) {
  testing::FakeCudaStream stream;
  float x = 0.0f;
  EXPECT_THROW(gelu_forward(stream, &x, &x, 1), Error);
  EXPECT_THROW(gelu_backward(stream, &x, &x, &x, 1), Error);
  EXPECT_EQ(stream.enqueued, 0);
}

}  // namespace
}  // namespace zest
