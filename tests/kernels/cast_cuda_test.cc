// ctest-labels: gpu
// The CUDA casts against the CPU references BFloat16::round_to_bits and Float16::round_to_bits,
// bit for bit: every 2-byte pattern back to fp32, and every upper half with the lower halves
// where round-to-nearest-even decides.
#include "kernels/cast_cuda.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "kernels/convert.h"
#include "runtime/cuda_device.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t count) {
    EXPECT_EQ(cudaMalloc(&data, count * sizeof(T)), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data); }
  T* data = nullptr;
};

// Every element's bits equal, naming the first ten that differ by their input's bits.
template <typename Input>
void expect_same_bits(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& want,
                      const std::vector<Input>& input) {
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && ++mismatches <= 10) {
      std::uint32_t input_bits = 0;
      if constexpr (std::is_same_v<Input, float>) {
        input_bits = std::bit_cast<std::uint32_t>(input[i]);
      } else {
        input_bits = input[i];
      }
      ADD_FAILURE() << "input bits 0x" << std::hex << input_bits << ": got 0x" << got[i]
                    << ", expected 0x" << want[i];
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(CastCuda, FloatToBFloat16MatchesCpuRoundingBitForBit) {
  ZEST_SKIP_WITHOUT_CUDA();
  // The lower halves that matter to rounding (ties, just below and above), plus some others.
  // Note: 20 lower halves x 65536 upper halves exceeds the kernel's capped grid, so the
  // grid-stride loop is exercised too.
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x4000, 0x7ffe, 0x7fff, 0x8000,
                                0x8001, 0x8002, 0xbfff, 0xc000, 0xfffe, 0xffff, 0x1234,
                                0x5678, 0x9abc, 0xdef0, 0x00ff, 0xff00, 0x7f80};
  std::vector<float> host_in;
  for (std::uint32_t high = 0; high < 0x10000; ++high) {
    for (std::uint32_t low : lows) host_in.push_back(std::bit_cast<float>((high << 16) | low));
  }
  const std::size_t n = host_in.size();
  DeviceBuffer<float> in(n);
  DeviceBuffer<std::uint16_t> out(n);
  ASSERT_EQ(cudaMemcpy(in.data, host_in.data(), n * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  cuda::cast_float_to_bfloat16(in.data, out.data, n, nullptr);
  std::vector<std::uint16_t> host_out(n);
  ASSERT_EQ(cudaMemcpy(host_out.data(), out.data, n * sizeof(std::uint16_t),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  std::vector<std::uint16_t> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = BFloat16::round_to_bits(host_in[i]);
  expect_same_bits(host_out, want, host_in);
}

TEST(CastCuda, BFloat16ToFloatIsExactForEveryPattern) {
  ZEST_SKIP_WITHOUT_CUDA();
  const std::size_t n = 0x10000;
  std::vector<std::uint16_t> host_in(n);
  for (std::size_t i = 0; i < n; ++i) host_in[i] = static_cast<std::uint16_t>(i);
  DeviceBuffer<std::uint16_t> in(n);
  DeviceBuffer<float> out(n);
  ASSERT_EQ(cudaMemcpy(in.data, host_in.data(), n * sizeof(std::uint16_t),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  cuda::cast_bfloat16_to_float(in.data, out.data, n, nullptr);
  std::vector<float> host_out(n);
  ASSERT_EQ(cudaMemcpy(host_out.data(), out.data, n * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (std::size_t i = 0; i < n; ++i) {
    BFloat16 value;
    value.bits = host_in[i];
    ASSERT_EQ(std::bit_cast<std::uint32_t>(host_out[i]),
              std::bit_cast<std::uint32_t>(static_cast<float>(value)))
        << "bf16 bits 0x" << std::hex << host_in[i];
  }
}

TEST(CastCuda, FloatToFloat16MatchesCpuRoundingBitForBit) {
  ZEST_SKIP_WITHOUT_CUDA();
  // fp16 keeps 10 of fp32's 23 mantissa bits: the lower 13 decide rounding, and subnormal
  // results shift more. Every upper half with lower halves around those points.
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
                                0x3000, 0x7fff, 0x8000, 0xffff, 0x5555};
  std::vector<float> host_in;
  for (std::uint32_t high = 0; high < 0x10000; ++high) {
    for (std::uint32_t low : lows) host_in.push_back(std::bit_cast<float>((high << 16) | low));
  }
  const std::size_t n = host_in.size();
  DeviceBuffer<float> in(n);
  DeviceBuffer<std::uint16_t> out(n);
  ASSERT_EQ(cudaMemcpy(in.data, host_in.data(), n * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  cuda::cast_float_to_float16(in.data, out.data, n, nullptr);
  std::vector<std::uint16_t> host_out(n);
  ASSERT_EQ(cudaMemcpy(host_out.data(), out.data, n * sizeof(std::uint16_t),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  std::vector<std::uint16_t> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = Float16::round_to_bits(host_in[i]);
  expect_same_bits(host_out, want, host_in);
}

TEST(CastCuda, Float16ToFloatIsExactForEveryPattern) {
  ZEST_SKIP_WITHOUT_CUDA();
  const std::size_t n = 0x10000;
  std::vector<std::uint16_t> host_in(n);
  for (std::size_t i = 0; i < n; ++i) host_in[i] = static_cast<std::uint16_t>(i);
  DeviceBuffer<std::uint16_t> in(n);
  DeviceBuffer<float> out(n);
  ASSERT_EQ(cudaMemcpy(in.data, host_in.data(), n * sizeof(std::uint16_t),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  cuda::cast_float16_to_float(in.data, out.data, n, nullptr);
  std::vector<float> host_out(n);
  ASSERT_EQ(cudaMemcpy(host_out.data(), out.data, n * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(host_out[i]),
              std::bit_cast<std::uint32_t>(Float16::to_float(host_in[i])))
        << "fp16 bits 0x" << std::hex << host_in[i];
  }
}

// bf16 <-> fp16 through the dispatch (communication_data_type of the other 2-byte type) against
// the CPU body, bit for bit, for every source pattern.
TEST(CastCuda, BetweenTheTwoByteTypesMatchesTheCpuBodyForEveryPattern) {
  ZEST_SKIP_WITHOUT_CUDA();
  const std::size_t n = 0x10000;
  std::vector<std::uint16_t> host_in(n);
  for (std::size_t i = 0; i < n; ++i) host_in[i] = static_cast<std::uint16_t>(i);
  cuda::CudaDevice device(0);
  auto stream = device.create_stream("compute");
  DeviceBuffer<std::uint16_t> in(n), out(n);
  ASSERT_EQ(cudaMemcpy(in.data, host_in.data(), n * sizeof(std::uint16_t),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  for (const auto& [from, to] : {std::pair{DType::kBFloat16, DType::kFloat16},
                                 std::pair{DType::kFloat16, DType::kBFloat16}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(from) << " -> " << dtype_name(to));
    std::vector<std::uint16_t> want(n);
    cpu::convert(host_in.data(), from, want.data(), to, n);
    convert(*stream, in.data, from, out.data, to, n);
    stream->synchronize();
    std::vector<std::uint16_t> got(n);
    ASSERT_EQ(cudaMemcpy(got.data(), out.data, n * sizeof(std::uint16_t),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    expect_same_bits(got, want, host_in);
  }
}

TEST(CastCuda, ZeroCountLaunchesNothing) {
  EXPECT_NO_THROW(cuda::cast_float_to_bfloat16(nullptr, nullptr, 0, nullptr));
  EXPECT_NO_THROW(cuda::cast_bfloat16_to_float(nullptr, nullptr, 0, nullptr));
  EXPECT_NO_THROW(cuda::cast_float_to_float16(nullptr, nullptr, 0, nullptr));
  EXPECT_NO_THROW(cuda::cast_float16_to_float(nullptr, nullptr, 0, nullptr));
  EXPECT_NO_THROW(cuda::cast_bfloat16_to_float16(nullptr, nullptr, 0, nullptr));
  EXPECT_NO_THROW(cuda::cast_float16_to_bfloat16(nullptr, nullptr, 0, nullptr));
}

}  // namespace
}  // namespace zest
