// The matmul wrapper against a float64 triple loop, for every transpose combination, alpha and
// beta, and the edge cases a layer meets (k = 0, beta = 0 over garbage).
#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
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

struct Case {
  bool trans_a, trans_b;
  std::int64_t m, n, k;
  float alpha, beta;
};

// Element (i, p) of op(A) where A is stored row-major untransposed.
double op_a(const std::vector<float>& a, const Case& c, std::int64_t i, std::int64_t p) {
  return c.trans_a ? a[p * c.m + i] : a[i * c.k + p];
}
double op_b(const std::vector<float>& b, const Case& c, std::int64_t p, std::int64_t j) {
  return c.trans_b ? b[j * c.k + p] : b[p * c.n + j];
}

void expect_matches_reference(const Case& c) {
  const std::vector<float> a = random_vector(c.m * c.k, 1), b = random_vector(c.k * c.n, 2);
  std::vector<float> out = random_vector(c.m * c.n, 3);
  const std::vector<float> before = out;
  cpu::matmul(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data(), b.data(), c.beta, out.data());
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (std::int64_t p = 0; p < c.k; ++p) {
        sum += op_a(a, c, i, p) * op_b(b, c, p, j);
        magnitude += std::abs(op_a(a, c, i, p) * op_b(b, c, p, j));
      }
      const double old = before[i * c.n + j];
      const double want = c.alpha * sum + c.beta * old;
      // fp32 summation of k products errs by at most ~k * 6e-8 of the sum of magnitudes;
      // 2e-6 * (magnitudes + |beta*C|) holds for k <= 33 with margin, and a transposed
      // operand read wrongly is off by O(1).
      const double tol = 2e-6 * (std::abs(c.alpha) * magnitude + std::abs(c.beta * old)) + 1e-7;
      ASSERT_NEAR(out[i * c.n + j], want, tol) << "C(" << i << ", " << j << ")";
    }
  }
}

TEST(Matmul, EveryTransposeCombinationMatchesFloat64Reference) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      expect_matches_reference({ta, tb, 5, 7, 3, 1.0f, 0.0f});
      expect_matches_reference({ta, tb, 13, 4, 33, 1.0f, 0.0f});
      expect_matches_reference({ta, tb, 1, 1, 1, 1.0f, 0.0f});
    }
  }
}

// Products of more than 2048 rows run in pieces of rows (kernels/matmul.cc): every piece must
// read its own rows of A (a column block when A is transposed) and write its own rows of C,
// with alpha and beta, the last piece short.
TEST(Matmul, ProductsOfManyRowsMatchFloat64Reference) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      expect_matches_reference({ta, tb, 2 * 2048 + 37, 5, 9, 0.5f, 0.25f});
    }
  }
}

// More threads multiplying at once than the process has cores (ranks as threads): the products
// past the limit wait their turn, none is lost or mixed up, and all return.
TEST(Matmul, MoreConcurrentProductsThanCoresAllFinishCorrectly) {
  constexpr int kThreads = 8, kProducts = 10, kSize = 192;  // past the gate's smallest product
  const std::vector<float> a = random_vector(kSize * kSize, 4), b = random_vector(kSize * kSize, 5);
  std::vector<float> want(kSize * kSize);
  cpu::matmul(false, false, kSize, kSize, kSize, 1.0f, a.data(), b.data(), 0.0f, want.data());
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> c(kSize * kSize);
      for (int i = 0; i < kProducts; ++i) {
        cpu::matmul(false, false, kSize, kSize, kSize, 1.0f, a.data(), b.data(), 0.0f, c.data());
        if (c != want) ++wrong[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
}

TEST(Matmul, AlphaScalesAndBetaAccumulates) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      expect_matches_reference({ta, tb, 6, 9, 11, 0.5f, 1.0f});
      expect_matches_reference({ta, tb, 6, 9, 11, -2.0f, 0.25f});
    }
  }
}

TEST(Matmul, BetaZeroNeverReadsC) {
  const std::vector<float> a = random_vector(4 * 3, 1), b = random_vector(3 * 5, 2);
  std::vector<float> c(4 * 5, std::numeric_limits<float>::quiet_NaN());
  cpu::matmul(false, false, 4, 5, 3, 1.0f, a.data(), b.data(), 0.0f, c.data());
  for (float x : c) EXPECT_TRUE(std::isfinite(x));
}

TEST(Matmul, EmptyInnerDimensionScalesCByBeta) {
  std::vector<float> c = {1.0f, 2.0f, 3.0f, 4.0f};
  const float unused = 0.0f;
  cpu::matmul(false, false, 2, 2, 0, 1.0f, &unused, &unused, 0.5f, c.data());
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f}));
}

TEST(Matmul, NegativeDimensionIsAUsageErrorOnTheHost) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  float x = 0.0f;
  try {
    matmul(*stream, false, false, 2, -1, 2, 1.0f, &x, &x, 0.0f, &x);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(error.what()).find("n must be"), std::string::npos) << error.what();
  }
}

TEST(Matmul, DispatchRunsTheCpuBodyOnTheStream) {
  const std::vector<float> a = random_vector(8 * 6, 1), b = random_vector(6 * 10, 2);
  std::vector<float> direct(8 * 10, 1.0f), queued(8 * 10, 1.0f);
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  cpu::matmul(false, false, 8, 10, 6, 1.0f, a.data(), b.data(), 1.0f, direct.data());
  matmul(*stream, false, false, 8, 10, 6, 1.0f, a.data(), b.data(), 1.0f, queued.data());
  stream->synchronize();
  EXPECT_EQ(direct, queued);
}

TEST(Matmul, Fp32RoundingIsANoOpOnTheCpuAndRefusesOtherTypes) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  EXPECT_NO_THROW(set_fp32_matmul_rounding(*stream, DType::kBFloat16));
  // Still exact: the CPU device has no rounding mode.
  const std::vector<float> a = random_vector(4 * 3, 5), b = random_vector(3 * 2, 6);
  std::vector<float> direct(4 * 2, 0.0f), queued(4 * 2, 0.0f);
  cpu::matmul(false, false, 4, 2, 3, 1.0f, a.data(), b.data(), 0.0f, direct.data());
  matmul(*stream, false, false, 4, 2, 3, 1.0f, a.data(), b.data(), 0.0f, queued.data());
  stream->synchronize();
  EXPECT_EQ(direct, queued);
  try {
    set_fp32_matmul_rounding(*stream, DType::kInt32);
    FAIL() << "int32 rounding was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(error.what()).find("set_fp32_matmul_rounding"), std::string::npos);
  }
}

// A stream that only says CUDA is refused before anything is enqueued: in a CUDA build it is not
// a CudaStream to launch on, and a CPU-only build has no CUDA body.
TEST(Matmul, AStreamThatIsNotARealCudaStreamIsRefused) {
  testing::FakeCudaStream stream;
  float x = 0.0f;
  EXPECT_THROW(matmul(stream, false, false, 1, 1, 1, 1.0f, &x, &x, 0.0f, &x), Error);
  EXPECT_EQ(stream.enqueued, 0);
}

}  // namespace
}  // namespace zest
