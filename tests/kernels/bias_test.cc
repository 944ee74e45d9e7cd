// Bias rows and their gradient against float64 sums: add_bias adds to every row, bias_grad
// accumulates column sums into what dbias already holds.
#include "kernels/bias.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/support/fake_cuda_stream.h"

namespace zest {
namespace {

std::vector<float> random_vector(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (float& x : out) x = uniform(rng);
  return out;
}

TEST(Bias, AddBiasAddsTheRowToEveryRow) {
  const std::int64_t rows = 7, cols = 19;
  const std::vector<float> bias = random_vector(cols, 1), y0 = random_vector(rows * cols, 2);
  std::vector<float> y = y0;
  cpu::add_bias(y.data(), bias.data(), rows, cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      // One fp32 addition: exactly the rounded sum.
      EXPECT_EQ(y[r * cols + c], y0[r * cols + c] + bias[c]);
    }
  }
}

TEST(Bias, BiasGradAccumulatesColumnSums) {
  const std::int64_t rows = 33, cols = 11;
  const std::vector<float> dy = random_vector(rows * cols, 3);
  std::vector<float> dbias(cols, 0.5f);  // what earlier micro-batches left
  cpu::bias_grad(dy.data(), dbias.data(), rows, cols);
  for (std::int64_t c = 0; c < cols; ++c) {
    double want = 0.5;
    for (std::int64_t r = 0; r < rows; ++r) want += dy[r * cols + c];
    // 33 fp32 additions of terms <= 1: 33 * 6e-8 * 33 worst case ~ 7e-5; typical far less.
    EXPECT_NEAR(dbias[c], want, 1e-5) << "column " << c;
  }
}

TEST(Bias, DispatchRunsTheCpuBodiesOnTheStream) {
  const std::vector<float> bias = random_vector(5, 1), dy = random_vector(15, 2);
  std::vector<float> y(15, 1.0f), y_direct(15, 1.0f), db(5, 0.0f), db_direct(5, 0.0f);
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  add_bias(*stream, y.data(), bias.data(), 3, 5);
  bias_grad(*stream, dy.data(), db.data(), 3, 5);
  stream->synchronize();
  cpu::add_bias(y_direct.data(), bias.data(), 3, 5);
  cpu::bias_grad(dy.data(), db_direct.data(), 3, 5);
  EXPECT_EQ(y, y_direct);
  EXPECT_EQ(db, db_direct);
}

// A stream that only says CUDA is refused before anything is enqueued: in a CUDA build it is not
// a CudaStream to launch on, and a CPU-only build has no CUDA body.
TEST(Bias, AStreamThatIsNotARealCudaStreamIsRefused) {
  testing::FakeCudaStream stream;
  float x = 0.0f;
  EXPECT_THROW(add_bias(stream, &x, &x, 1, 1), Error);
  EXPECT_THROW(bias_grad(stream, &x, &x, 1, 1), Error);
  EXPECT_EQ(stream.enqueued, 0);
}

}  // namespace
}  // namespace zest
