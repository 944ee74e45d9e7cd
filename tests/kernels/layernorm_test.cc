// LayerNorm forward against float64, and backward against central differences of a float64
// forward; the accumulate contract of backward, the dispatch, and the shape checks.
#include "kernels/layernorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/kernels/cuda_refusal.h"
#include "tests/support/fake_cuda_stream.h"

namespace zest {
namespace {

constexpr std::int64_t kRows = 6, kCols = 13;

struct Data {
  std::vector<float> x, weight, bias, upstream;  // upstream: d(loss)/dy of loss = sum(y * G)
};

// Rows with offsets up to 1000 and spreads from 0.01 to 3: the two-pass variance must not lose
// the small spread under the large mean.
Data make_data() {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Data d;
  for (std::int64_t r = 0; r < kRows; ++r) {
    const float offset = r == 2 ? 1000.0f : normal(rng), spread = r == 4 ? 0.01f : 1.0f + r * 0.4f;
    for (std::int64_t c = 0; c < kCols; ++c) d.x.push_back(offset + spread * normal(rng));
  }
  for (std::int64_t c = 0; c < kCols; ++c) {
    d.weight.push_back(1.0f + 0.3f * normal(rng));
    d.bias.push_back(0.2f * normal(rng));
  }
  for (std::int64_t i = 0; i < kRows * kCols; ++i) d.upstream.push_back(normal(rng));
  return d;
}

// sum(layernorm(x) * G) in float64.
double loss64(const std::vector<double>& x, const std::vector<double>& w,
              const std::vector<double>& b, const std::vector<float>& upstream) {
  double total = 0.0;
  for (std::int64_t r = 0; r < kRows; ++r) {
    double mean = 0.0, var = 0.0;
    for (std::int64_t c = 0; c < kCols; ++c) mean += x[r * kCols + c] / kCols;
    for (std::int64_t c = 0; c < kCols; ++c) var += std::pow(x[r * kCols + c] - mean, 2) / kCols;
    for (std::int64_t c = 0; c < kCols; ++c) {
      const double y = (x[r * kCols + c] - mean) / std::sqrt(var + 1e-5) * w[c] + b[c];
      total += y * upstream[r * kCols + c];
    }
  }
  return total;
}

TEST(LayerNorm, ForwardMatchesFloat64) {
  const Data d = make_data();
  std::vector<float> y(d.x.size()), mean(kRows), rstd(kRows);
  cpu::layernorm_forward(d.x.data(), d.weight.data(), d.bias.data(), kRows, kCols, kLayerNormEps,
                         y.data(), mean.data(), rstd.data());
  for (std::int64_t r = 0; r < kRows; ++r) {
    double m = 0.0, v = 0.0;
    for (std::int64_t c = 0; c < kCols; ++c) m += static_cast<double>(d.x[r * kCols + c]) / kCols;
    for (std::int64_t c = 0; c < kCols; ++c) v += std::pow(d.x[r * kCols + c] - m, 2) / kCols;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    EXPECT_NEAR(mean[r], m, 1e-7 * std::max(1.0, std::abs(m)));
    EXPECT_NEAR(rstd[r], s, 1e-6 * s);
    for (std::int64_t c = 0; c < kCols; ++c) {
      const double want = (d.x[r * kCols + c] - m) * s * d.weight[c] + d.bias[c];
      // Normalized in double, so only the last fp32 multiply-add rounds: a few 1e-7 of |y| <= 4,
      // even in the row at mean 1000 and the row of rstd 100.
      EXPECT_NEAR(y[r * kCols + c], want, 2e-6) << r << ", " << c;
    }
  }
}

// Rows as wide as the GPT's (and one past a multiple of the reductions' lanes), one far from zero
// mean: the forward against float64, and the backward the same bits on every call.
TEST(LayerNorm, WideRowsMatchFloat64AndBackwardRepeatsBitForBit) {
  constexpr std::int64_t rows = 3, cols = 257;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x, weight, bias, dy;
  for (std::int64_t i = 0; i < rows * cols; ++i) x.push_back((i < cols ? 1000.0f : 0.0f) + normal(rng));
  for (std::int64_t c = 0; c < cols; ++c) {
    weight.push_back(1.0f + 0.3f * normal(rng));
    bias.push_back(0.2f * normal(rng));
  }
  for (std::int64_t i = 0; i < rows * cols; ++i) dy.push_back(normal(rng));
  std::vector<float> y(x.size()), mean(rows), rstd(rows);
  cpu::layernorm_forward(x.data(), weight.data(), bias.data(), rows, cols, kLayerNormEps, y.data(),
                         mean.data(), rstd.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = 0.0, v = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) m += static_cast<double>(x[r * cols + c]) / cols;
    for (std::int64_t c = 0; c < cols; ++c) v += std::pow(x[r * cols + c] - m, 2) / cols;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    for (std::int64_t c = 0; c < cols; ++c) {
      const double want = (x[r * cols + c] - m) * s * weight[c] + bias[c];
      // As ForwardMatchesFloat64: only the last fp32 multiply-add rounds.
      ASSERT_NEAR(y[r * cols + c], want, 2e-6) << r << ", " << c;
    }
  }
  std::vector<float> dx1(x.size()), dw1(cols), db1(cols), dx2(x.size()), dw2(cols), db2(cols);
  cpu::layernorm_backward(dy.data(), x.data(), weight.data(), mean.data(), rstd.data(), rows, cols,
                          dx1.data(), dw1.data(), db1.data());
  cpu::layernorm_backward(dy.data(), x.data(), weight.data(), mean.data(), rstd.data(), rows, cols,
                          dx2.data(), dw2.data(), db2.data());
  EXPECT_EQ(dx1, dx2);
  EXPECT_EQ(dw1, dw2);
  EXPECT_EQ(db1, db2);
}

TEST(LayerNorm, BackwardMatchesCentralDifferencesAndAccumulates) {
  const Data d = make_data();
  std::vector<float> y(d.x.size()), mean(kRows), rstd(kRows);
  cpu::layernorm_forward(d.x.data(), d.weight.data(), d.bias.data(), kRows, kCols, kLayerNormEps,
                         y.data(), mean.data(), rstd.data());
  // Start from non-zero gradients: backward must add to them.
  std::vector<float> dx(d.x.size(), 0.5f), dw(kCols, -0.25f), db(kCols, 2.0f);
  cpu::layernorm_backward(d.upstream.data(), d.x.data(), d.weight.data(), mean.data(),
                          rstd.data(), kRows, kCols, dx.data(), dw.data(), db.data());
  std::vector<double> x(d.x.begin(), d.x.end()), w(d.weight.begin(), d.weight.end()),
      b(d.bias.begin(), d.bias.end());
  auto numeric = [&](double& value) {
    const double h = 1e-6, saved = value;
    value = saved + h;
    const double plus = loss64(x, w, b, d.upstream);
    value = saved - h;
    const double minus = loss64(x, w, b, d.upstream);
    value = saved;
    return (plus - minus) / (2 * h);
  };
  // fp32 gradients of O(1..100) (rstd of the 0.01-spread row is 100): 1e-5 relative plus
  // 1e-4 absolute covers their rounding; the float64 differences err by < 1e-6 (h = 1e-6,
  // except the row at mean 1000, where h is below x's resolution: skipped for dx).
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (i / kCols == 2) continue;
    const double want = numeric(x[i]) + 0.5;
    EXPECT_NEAR(dx[i], want, 1e-5 * std::abs(want) + 1e-4) << "dx[" << i << "]";
  }
  for (std::int64_t c = 0; c < kCols; ++c) {
    const double want_w = numeric(w[c]) - 0.25, want_b = numeric(b[c]) + 2.0;
    EXPECT_NEAR(dw[c], want_w, 1e-5 * std::abs(want_w) + 1e-4) << "dweight[" << c << "]";
    EXPECT_NEAR(db[c], want_b, 1e-5 * std::abs(want_b) + 1e-4) << "dbias[" << c << "]";
  }
}

TEST(LayerNorm, DispatchRunsTheCpuBodiesOnTheStream) {
  const Data d = make_data();
  std::vector<float> y(d.x.size()), mean(kRows), rstd(kRows), y2 = y, mean2 = mean, rstd2 = rstd;
  std::vector<float> dx(d.x.size()), dw(kCols), db(kCols), dx2 = dx, dw2 = dw, db2 = db;
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  layernorm_forward(*stream, d.x.data(), d.weight.data(), d.bias.data(), kRows, kCols,
                    kLayerNormEps, y.data(), mean.data(), rstd.data());
  layernorm_backward(*stream, d.upstream.data(), d.x.data(), d.weight.data(), mean.data(),
                     rstd.data(), kRows, kCols, dx.data(), dw.data(), db.data());
  stream->synchronize();
  cpu::layernorm_forward(d.x.data(), d.weight.data(), d.bias.data(), kRows, kCols, kLayerNormEps,
                         y2.data(), mean2.data(), rstd2.data());
  cpu::layernorm_backward(d.upstream.data(), d.x.data(), d.weight.data(), mean2.data(),
                          rstd2.data(), kRows, kCols, dx2.data(), dw2.data(), db2.data());
  EXPECT_EQ(y, y2);
  EXPECT_EQ(dx, dx2);
  EXPECT_EQ(dw, dw2);
  EXPECT_EQ(db, db2);
}

TEST(LayerNorm, BadShapesAndCudaStreamsAreRefusedOnTheHost) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  float v = 0.0f;
  EXPECT_THROW(layernorm_forward(*stream, &v, &v, &v, 1, 0, kLayerNormEps, &v, &v, &v), Error);
  EXPECT_THROW(layernorm_backward(*stream, &v, &v, &v, &v, &v, -1, 4, &v, &v, &v), Error);
  testing::FakeCudaStream cuda;
  EXPECT_THROW(layernorm_forward(cuda, &v, &v, &v, 1, 1, kLayerNormEps, &v, &v, &v), Error);
  EXPECT_EQ(cuda.enqueued, 0);
}

// With CUDA built a CudaStream launches the CUDA bodies (tests/kernels/layernorm_cuda_test.cc);
// a stream that only claims CUDA is refused by name, before anything runs.
TEST(LayerNorm, AStreamThatIsNotARealCudaStreamIsRefusedByName) {
  float v = 0.0f;
  testing::expect_cuda_stream_refused("layernorm_forward", [&](Stream& stream) {
    layernorm_forward(stream, &v, &v, &v, 1, 1, kLayerNormEps, &v, &v, &v);
  });
  testing::expect_cuda_stream_refused("layernorm_backward", [&](Stream& stream) {
    layernorm_backward(stream, &v, &v, &v, &v, &v, 1, 1, &v, &v, &v);
  });
}

}  // namespace
}  // namespace zest
