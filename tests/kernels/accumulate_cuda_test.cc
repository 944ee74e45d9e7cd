// ctest-labels: gpu
// accumulate_into and vector_ops' accumulate, run through their dispatch on a CudaStream, against
// the CPU bodies on the same inputs for every pair of fp32, bf16 and fp16: 0 ulps, since both
// make one IEEE fp32 add of the same exactly-converted operands and the same round to nearest
// even (kernels/accumulate_cuda.h). The one exception is NaN's bits: the GPU's add returns the
// canonical NaN where x86 keeps an operand's payload and sign, so a NaN is held to be a NaN. The
// inputs mix random bit patterns (inf, NaN, subnormals) with nearby values whose sums round (ties
// included); 1027 elements (not a multiple of the 4-element vector) at aligned and shifted
// starts cover the vector path and the scalar one.
#include "kernels/accumulate_cuda.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/convert.h"
#include "kernels/vector_ops.h"
#include "runtime/cuda_device.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

constexpr std::size_t kCount = 1027;
const DType kTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// `count` values of `type` as bytes: a third random bit patterns, the rest normal values around
// `scale` (sums of two such values round, often to a tie in the 2-byte types).
std::vector<unsigned char> values_of(DType type, std::size_t count, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<unsigned char> bytes(count * dtype_size(type));
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t random_bits = static_cast<std::uint32_t>(rng());
    const float value = normal(rng);
    if (type == DType::kFloat32) {
      const std::uint32_t bits = i % 3 == 0 ? random_bits : std::bit_cast<std::uint32_t>(value);
      std::memcpy(bytes.data() + 4 * i, &bits, 4);
    } else {
      const std::uint16_t bits = i % 3 == 0 ? static_cast<std::uint16_t>(random_bits)
                                 : type == DType::kBFloat16 ? BFloat16(value).bits
                                                            : Float16(value).bits;
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  }
  return bytes;
}

bool is_nan(DType type, const unsigned char* element) {
  if (type == DType::kFloat32) {
    float value;
    std::memcpy(&value, element, 4);
    return std::isnan(value);
  }
  std::uint16_t bits;
  std::memcpy(&bits, element, 2);
  return type == DType::kBFloat16 ? (bits & 0x7fffu) > 0x7f80u : (bits & 0x7fffu) > 0x7c00u;
}

void expect_same_elements(DType type, const std::vector<unsigned char>& got,
                          const std::vector<unsigned char>& want) {
  ASSERT_EQ(got.size(), want.size());
  const std::size_t size = dtype_size(type);
  int reported = 0;
  for (std::size_t i = 0; i < got.size() / size && reported < 5; ++i) {
    const unsigned char* g = got.data() + i * size;
    const unsigned char* w = want.data() + i * size;
    if (is_nan(type, w) ? !is_nan(type, g) : std::memcmp(g, w, size) != 0) {
      ADD_FAILURE() << "element " << i << " differs";
      ++reported;
    }
  }
}

class AccumulateCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    ZEST_SKIP_WITHOUT_CUDA();
    device_ = std::make_unique<cuda::CudaDevice>(0);
    stream_ = device_->create_stream("compute");
  }

  std::unique_ptr<cuda::CudaDevice> device_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(AccumulateCuda, EveryTypePairIsTheCpuBodyBitForBit) {
  for (DType destination_type : kTypes) {
    for (DType source_type : kTypes) {
      // Shifts of one element break the 16- / 8-byte alignment the vector path needs: both
      // arrays, or the source alone.
      using Shifts = std::vector<std::pair<std::size_t, std::size_t>>;
      for (const auto& [destination_shift, source_shift] : Shifts{{0, 0}, {1, 1}, {0, 1}}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(source_type) << " into " << dtype_name(destination_type)
                     << ", shifts " << destination_shift << " and " << source_shift);
        const auto destination = values_of(destination_type, kCount, 1, 1.0f);
        const auto source = values_of(source_type, kCount, 2, 0.5f);
        std::vector<unsigned char> want = destination;
        cpu::accumulate_into(want.data(), destination_type, source.data(), source_type, kCount);
        DeviceArray<unsigned char> d_destination(destination,
                                                 destination_shift * dtype_size(destination_type));
        DeviceArray<unsigned char> d_source(source, source_shift * dtype_size(source_type));
        accumulate_into(*stream_, d_destination.data(), destination_type, d_source.data(),
                        source_type, kCount);
        stream_->synchronize();
        expect_same_elements(destination_type, d_destination.download(), want);
      }
    }
  }
}

TEST_F(AccumulateCuda, VectorOpsAccumulateIsTheCpuBodyBitForBit) {
  const auto destination = testing::random_floats(kCount, 3);
  const auto source = testing::random_floats(kCount, 4, 1e-3f);
  std::vector<float> want = destination;
  cpu::accumulate(want.data(), source.data(), kCount);
  DeviceArray<float> d_destination(destination), d_source(source);
  accumulate(*stream_, d_destination.data(), d_source.data(), kCount);
  stream_->synchronize();
  testing::expect_bit_identical(d_destination.download(), want, "destination");
}

TEST_F(AccumulateCuda, NothingToAddLaunchesNothing) {
  EXPECT_NO_THROW(
      accumulate_into(*stream_, nullptr, DType::kBFloat16, nullptr, DType::kFloat32, 0));
  stream_->synchronize();
}

TEST(AccumulateCudaArguments, OtherTypesAreRefusedOnTheHost) {
  for (DType type : {DType::kFloat64, DType::kInt32}) {
    try {
      cuda::accumulate_into(nullptr, type, nullptr, DType::kFloat32, 0, nullptr);
      ADD_FAILURE() << "expected an Error for " << dtype_name(type);
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    }
    EXPECT_THROW(cuda::accumulate_into(nullptr, DType::kFloat32, nullptr, type, 0, nullptr), Error);
  }
}

}  // namespace
}  // namespace zest
