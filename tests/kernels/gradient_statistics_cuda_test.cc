// ctest-labels: gpu
// The gradient statistics and vector_ops' add_sum_of_squares, run through their dispatch on a
// CudaStream, against the CPU dispatch on the same inputs. Bit for bit where the math allows:
// values k / 16 with |k| < 256 are exact in fp32, bf16 and fp16 and their squares are multiples of
// 2^-8 below 2^8, so every partial sum of 2^20 of them is a multiple of 2^-8 below 2^28 (36
// significant bits): exact in double in any order, so the GPU's tree and the CPU's loop agree to
// 0 ulps; inf / NaN counts are integers. Random data of mixed magnitudes is held to the ordering
// bound: n positive terms, each square exact, any two orders within 2 * n * 2^-53 of the sum.
// Element counts are not multiples of any vector width; results accumulate into device memory.
#include "kernels/gradient_statistics_cuda.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/gradient_statistics.h"
#include "kernels/vector_ops.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

const DType kTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

std::vector<unsigned char> encode(DType type, const std::vector<float>& values) {
  std::vector<unsigned char> bytes(values.size() * dtype_size(type));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (type == DType::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
    } else {
      const std::uint16_t bits =
          type == DType::kBFloat16 ? BFloat16(values[i]).bits : Float16(values[i]).bits;
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  }
  return bytes;
}

std::vector<float> sixteenths(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> k(-255, 255);
  std::vector<float> values(count);
  for (float& value : values) value = static_cast<float>(k(rng)) / 16.0f;
  return values;
}

std::vector<float> mixed_magnitudes(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float scales[] = {1e-6f, 1e-3f, 1.0f, 1e3f};
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = normal(rng) * scales[i % 4];
  return values;
}

class GradientStatisticsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    ZEST_SKIP_WITHOUT_CUDA();
    device_ = std::make_unique<cuda::CudaDevice>(0);
    stream_ = device_->create_stream("compute");
  }

  // The statistics of `bytes` (of `type`), added to `start`, by the CPU dispatch and by the CUDA
  // dispatch, each called once per piece of `pieces` elements.
  struct Both {
    GradientStatistics cpu, cuda;
  };
  Both run(DType type, const std::vector<unsigned char>& bytes, std::size_t pieces,
           GradientStatistics start = {}) {
    const std::size_t count = bytes.size() / dtype_size(type);
    Both result{start, start};
    cpu::CpuDevice host(0);
    auto host_stream = host.create_stream("compute");
    DeviceArray<unsigned char> data(bytes);
    DeviceArray<GradientStatistics> statistics(std::vector<GradientStatistics>{start});
    for (std::size_t from = 0; from < count; from += pieces) {
      const std::size_t n = std::min(pieces, count - from);
      const std::size_t offset = from * dtype_size(type);
      add_gradient_statistics(*host_stream, bytes.data() + offset, type, n, &result.cpu);
      add_gradient_statistics(*stream_, data.data() + offset, type, n, statistics.data());
    }
    host_stream->synchronize();
    stream_->synchronize();
    result.cuda = statistics.download()[0];
    return result;
  }

  std::unique_ptr<cuda::CudaDevice> device_;
  std::unique_ptr<Stream> stream_;
};

void expect_bit_identical(const GradientStatistics& got, const GradientStatistics& want) {
  EXPECT_EQ(std::bit_cast<std::uint64_t>(got.sum_of_squares),
            std::bit_cast<std::uint64_t>(want.sum_of_squares))
      << got.sum_of_squares << " against " << want.sum_of_squares;
  EXPECT_EQ(got.non_finite, want.non_finite);
}

TEST_F(GradientStatisticsCuda, ExactSumsAreTheCpuDispatchBitForBit) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  for (DType type : kTypes) {
    SCOPED_TRACE(dtype_name(type));
    const Both both = run(type, encode(type, sixteenths(n, 1)), n);
    expect_bit_identical(both.cuda, both.cpu);
  }
}

TEST_F(GradientStatisticsCuda, CallsAccumulateIntoTheDeviceStatistics) {
  const std::size_t n = 100003;
  for (DType type : kTypes) {
    SCOPED_TRACE(dtype_name(type));
    std::vector<float> values = sixteenths(n, 2);
    values[7] = std::numeric_limits<float>::infinity();
    values[50001] = -std::numeric_limits<float>::quiet_NaN();
    auto finite = values;
    finite[7] = finite[50001] = 1.0f;
    // Pieces of 4099 elements, so that most start off the allocation's alignment.
    const GradientStatistics start{0.5, 3};
    const Both exact = run(type, encode(type, finite), 4099, start);
    expect_bit_identical(exact.cuda, exact.cpu);
    const Both counted = run(type, encode(type, values), 4099, start);
    EXPECT_EQ(counted.cuda.non_finite, 5u);
    EXPECT_EQ(counted.cpu.non_finite, 5u);
    EXPECT_TRUE(std::isnan(counted.cuda.sum_of_squares));
  }
}

TEST_F(GradientStatisticsCuda, MixedMagnitudesMatchWithinTheOrderingBound) {
  const std::size_t n = (std::size_t{1} << 20) + 5;
  for (DType type : kTypes) {
    SCOPED_TRACE(dtype_name(type));
    const auto bytes = encode(type, mixed_magnitudes(n, 3));
    const Both both = run(type, bytes, n);
    EXPECT_NEAR(both.cuda.sum_of_squares, both.cpu.sum_of_squares,
                2.0 * n * std::ldexp(both.cpu.sum_of_squares, -53));
    EXPECT_EQ(both.cuda.non_finite, 0u);
    // Deterministic: a second run gives the same bits.
    expect_bit_identical(run(type, bytes, n).cuda, both.cuda);
  }
}

TEST_F(GradientStatisticsCuda, NothingToCountChangesNothing) {
  const GradientStatistics start{2.25, 7};
  DeviceArray<GradientStatistics> statistics(std::vector<GradientStatistics>{start});
  add_gradient_statistics(*stream_, nullptr, DType::kFloat16, 0, statistics.data());
  stream_->synchronize();
  expect_bit_identical(statistics.download()[0], start);
}

TEST_F(GradientStatisticsCuda, VectorOpsSumOfSquaresIsTheCpuDispatchBitForBit) {
  const std::size_t n = 300007;
  const auto values = sixteenths(n, 4);
  DeviceArray<float> data(values);
  DeviceArray<double> sum(std::vector<double>{0.75});
  add_sum_of_squares(*stream_, data.data(), n, sum.data());
  add_sum_of_squares(*stream_, data.data() + 1, n - 1, sum.data());  // off its alignment
  stream_->synchronize();
  double want = 0.75;
  want += cpu::sum_of_squares(values.data(), n);
  want += cpu::sum_of_squares(values.data() + 1, n - 1);
  EXPECT_EQ(std::bit_cast<std::uint64_t>(sum.download()[0]), std::bit_cast<std::uint64_t>(want));
}

TEST_F(GradientStatisticsCuda, TooSmallAWorkspaceIsRefused) {
  DeviceArray<float> data(std::vector<float>(1000, 1.0f));
  DeviceArray<GradientStatistics> statistics(1);
  const std::size_t bytes = cuda::gradient_statistics_workspace_bytes(DType::kFloat32, 1000);
  DeviceArray<unsigned char> workspace(bytes);
  EXPECT_THROW(cuda::add_gradient_statistics(data.data(), DType::kFloat32, 1000,
                                             statistics.data(), workspace.data(), bytes - 1,
                                             nullptr),
               Error);
}

TEST(GradientStatisticsCudaArguments, OtherTypesAreRefusedBeforeAnyCudaCall) {
  for (DType type : {DType::kFloat64, DType::kInt32}) {
    try {
      cuda::add_gradient_statistics(nullptr, type, 0, nullptr, nullptr, 0, nullptr);
      ADD_FAILURE() << "expected an Error for " << dtype_name(type);
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    }
    EXPECT_THROW(cuda::gradient_statistics_workspace_bytes(type, 16), Error);
  }
}

}  // namespace
}  // namespace zest
