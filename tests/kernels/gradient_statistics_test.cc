// The gradient statistics of fp32, bf16 and fp16 data against a float64 reference that decodes
// the stored bits itself (sign, exponent and mantissa through ldexp, not base/dtype.h): the sum of
// squares and the inf / NaN count, accumulated over calls, on a stream and refused where they
// must be. Each square of a value with at most 24 significant bits is exact in double, so only
// the additions round: for n positive terms any summation order is within (n - 1) * 2^-53 of the
// exact sum, and two orders within twice that; the tests allow 2 * n * 2^-53 relative.
#include "kernels/gradient_statistics.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/kernels/cuda_refusal.h"

namespace zest {
namespace {

// A stored float of `exponent_bits` and `mantissa_bits` (IEEE layout) as a double.
double decode(std::uint32_t bits, int exponent_bits, int mantissa_bits) {
  const bool negative = (bits >> (exponent_bits + mantissa_bits)) & 1u;
  const std::uint32_t exponent = (bits >> mantissa_bits) & ((1u << exponent_bits) - 1);
  const std::uint32_t mantissa = bits & ((1u << mantissa_bits) - 1);
  const int bias = (1 << (exponent_bits - 1)) - 1;
  double value;
  if (exponent == (1u << exponent_bits) - 1) {
    value = mantissa == 0 ? std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(static_cast<double>(mantissa), 1 - bias - mantissa_bits);
  } else {
    value = std::ldexp(static_cast<double>(mantissa | (1u << mantissa_bits)),
                       static_cast<int>(exponent) - bias - mantissa_bits);
  }
  return negative ? -value : value;
}

// Data of one type, its stored bytes and its values as the reference reads them.
struct Data {
  DType type;
  std::vector<unsigned char> bytes;
  std::vector<double> values;
  const void* data() const { return bytes.data(); }
  std::size_t count() const { return values.size(); }
};

Data encode(DType type, const std::vector<float>& floats) {
  Data d{type, std::vector<unsigned char>(floats.size() * dtype_size(type)), {}};
  for (std::size_t i = 0; i < floats.size(); ++i) {
    std::uint32_t bits;
    if (type == DType::kFloat32) {
      bits = std::bit_cast<std::uint32_t>(floats[i]);
      reinterpret_cast<std::uint32_t*>(d.bytes.data())[i] = bits;
      d.values.push_back(decode(bits, 8, 23));
    } else {
      bits = type == DType::kBFloat16 ? BFloat16(floats[i]).bits : Float16(floats[i]).bits;
      reinterpret_cast<std::uint16_t*>(d.bytes.data())[i] = static_cast<std::uint16_t>(bits);
      d.values.push_back(type == DType::kBFloat16 ? decode(bits, 8, 7) : decode(bits, 5, 10));
    }
  }
  return d;
}

// Magnitudes from 1e-6 (fp16 subnormals) to 1e3: the small terms vanish from an fp32 sum.
std::vector<float> mixed_magnitudes(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float scales[] = {1e-6f, 1e-3f, 1.0f, 1e3f};
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = normal(rng) * scales[i % 4];
  return values;
}

GradientStatistics reference(const std::vector<double>& values, std::size_t from,
                             std::size_t to) {
  GradientStatistics r;
  for (std::size_t i = from; i < to; ++i) {
    r.sum_of_squares += values[i] * values[i];
    r.non_finite += std::isfinite(values[i]) ? 0 : 1;
  }
  return r;
}

double tolerance(std::size_t count, double sum) { return 2.0 * count * std::ldexp(sum, -53); }

const DType kTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

TEST(GradientStatistics, SumOfSquaresMatchesFloat64ForEveryType) {
  for (DType type : kTypes) {
    SCOPED_TRACE(dtype_name(type));
    const Data d = encode(type, mixed_magnitudes(10007, 1));
    const GradientStatistics want = reference(d.values, 0, d.count());
    GradientStatistics got;
    cpu::add_gradient_statistics(d.data(), type, d.count(), &got);
    EXPECT_NEAR(got.sum_of_squares, want.sum_of_squares,
                tolerance(d.count(), want.sum_of_squares));
    EXPECT_EQ(got.non_finite, 0u);
  }
}

TEST(GradientStatistics, CountsInfAndNaNForEveryType) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType type : kTypes) {
    SCOPED_TRACE(dtype_name(type));
    std::vector<float> floats(1000, 0.25f);
    floats[0] = inf;
    floats[17] = -inf;
    floats[500] = nan;
    floats[999] = -nan;
    // 1e5 overflows fp16 to inf; bf16 and fp32 hold it.
    floats[600] = 1e5f;
    const Data d = encode(type, floats);
    GradientStatistics got;
    cpu::add_gradient_statistics(d.data(), type, d.count(), &got);
    EXPECT_EQ(got.non_finite, reference(d.values, 0, d.count()).non_finite);
    EXPECT_EQ(got.non_finite, type == DType::kFloat16 ? 5u : 4u);
    EXPECT_FALSE(std::isfinite(got.sum_of_squares));
  }
}

// The sum runs in lanes with a tail, and counts non-finite elements only when the sum is not
// finite: every length and position must still be seen, and the largest finite floats must not
// pass for non-finite (their squares fit a double).
TEST(GradientStatistics, EveryLengthAndPositionIsCountedAndLargeFiniteValuesAreFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  for (std::size_t n = 1; n <= 35; ++n) {
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      std::vector<float> values(n, std::numeric_limits<float>::max());
      values[at] = inf;
      GradientStatistics got;
      cpu::add_gradient_statistics(values.data(), DType::kFloat32, n, &got);
      ASSERT_EQ(got.non_finite, 1u) << "n " << n << " at " << at;
      values[at] = -std::numeric_limits<float>::max();
      GradientStatistics finite;
      cpu::add_gradient_statistics(values.data(), DType::kFloat32, n, &finite);
      ASSERT_EQ(finite.non_finite, 0u) << "n " << n;
      const double square = static_cast<double>(values[0]) * static_cast<double>(values[0]);
      ASSERT_NEAR(finite.sum_of_squares, square * static_cast<double>(n),
                  tolerance(n, square * static_cast<double>(n)));
    }
  }
}

TEST(GradientStatistics, CallsAccumulateIntoWhatIsThere) {
  for (DType type : kTypes) {
    SCOPED_TRACE(dtype_name(type));
    const Data d = encode(type, mixed_magnitudes(4099, 2));
    const std::size_t half = 2048;  // the second call starts off the first's alignment too
    GradientStatistics got{1.5, 2};  // from an earlier unit
    cpu::add_gradient_statistics(d.data(), type, half, &got);
    cpu::add_gradient_statistics(d.bytes.data() + half * dtype_size(type), type,
                                 d.count() - half, &got);
    const double want = 1.5 + reference(d.values, 0, d.count()).sum_of_squares;
    EXPECT_NEAR(got.sum_of_squares, want, tolerance(d.count() + 1, want));
    EXPECT_EQ(got.non_finite, 2u);
    const Data overflowing = encode(type, {1.0f, std::numeric_limits<float>::infinity()});
    cpu::add_gradient_statistics(overflowing.data(), type, 2, &got);
    EXPECT_EQ(got.non_finite, 3u);
  }
}

TEST(GradientStatistics, NothingToCountChangesNothing) {
  const GradientStatistics before{2.25, 7};
  for (DType type : kTypes) {
    GradientStatistics statistics = before;
    cpu::add_gradient_statistics(nullptr, type, 0, &statistics);
    EXPECT_EQ(statistics.sum_of_squares, before.sum_of_squares);
    EXPECT_EQ(statistics.non_finite, before.non_finite);
  }
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  GradientStatistics statistics = before;
  add_gradient_statistics(*stream, nullptr, DType::kBFloat16, 0, &statistics);
  stream->synchronize();
  EXPECT_EQ(statistics.sum_of_squares, before.sum_of_squares);
  EXPECT_EQ(statistics.non_finite, before.non_finite);
}

TEST(GradientStatistics, OnAStreamIsTheBodyBitForBit) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  for (DType type : kTypes) {
    SCOPED_TRACE(dtype_name(type));
    const Data d = encode(type, mixed_magnitudes(3001, 3));
    GradientStatistics direct{0.5, 1}, queued{0.5, 1};
    cpu::add_gradient_statistics(d.data(), type, d.count(), &direct);
    add_gradient_statistics(*stream, d.data(), type, d.count(), &queued);
    stream->synchronize();
    EXPECT_EQ(std::bit_cast<std::uint64_t>(queued.sum_of_squares),
              std::bit_cast<std::uint64_t>(direct.sum_of_squares));
    EXPECT_EQ(queued.non_finite, direct.non_finite);
  }
}

TEST(GradientStatistics, OtherTypesAreRefusedOnTheHost) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  const double values[2] = {1.0, 2.0};
  for (DType type : {DType::kFloat64, DType::kInt32}) {
    SCOPED_TRACE(dtype_name(type));
    GradientStatistics statistics;
    try {
      add_gradient_statistics(*stream, values, type, 2, &statistics);
      ADD_FAILURE() << "expected an Error";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(error.what()).find("add_gradient_statistics"), std::string::npos);
    }
    EXPECT_THROW(cpu::add_gradient_statistics(values, type, 2, &statistics), Error);
  }
  stream->synchronize();  // nothing was enqueued that could fail
}

// With CUDA built a CudaStream launches the CUDA body (gradient_statistics_cuda_test.cc); a
// stream that only claims CUDA is refused by name, before anything runs.
TEST(GradientStatistics, AStreamThatIsNotARealCudaStreamIsRefusedByName) {
  const float value = 1.0f;
  GradientStatistics statistics;
  testing::expect_cuda_stream_refused("add_gradient_statistics", [&](Stream& stream) {
    add_gradient_statistics(stream, &value, DType::kFloat32, 1, &statistics);
  });
}

}  // namespace
}  // namespace zest
