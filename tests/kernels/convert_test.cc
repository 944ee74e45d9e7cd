// accumulate_into's rounding against hand-computed fp32 sums (round to nearest even into the
// destination's type), its dispatch on a stream, and the refusal of a stream that only claims
// CUDA for convert and accumulate_into.
#include "kernels/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "runtime/cpu_device.h"
#include "tests/kernels/cuda_refusal.h"

namespace zest {
namespace {

// bf16 keeps 7 mantissa bits, so near 1 its values are 2^-7 apart: 1 + 2^-8 is the tie between
// 1 and 1 + 2^-7 and goes to the even 1; 1 + 3 * 2^-8 is the tie between 1 + 2^-7 (odd) and
// 1 + 2^-6 (even). The sums are exact in fp32, so only the final rounding decides.
TEST(AccumulateInto, RoundsTheFp32SumToTheDestinationsTypeToNearestEven) {
  const std::vector<BFloat16> start = {BFloat16(1.0f), BFloat16(1.0f), BFloat16(-2.0f)};
  const std::vector<float> add = {std::ldexp(1.0f, -8), 3 * std::ldexp(1.0f, -8), 0.5f};
  std::vector<BFloat16> sum = start;
  cpu::accumulate_into(sum.data(), DType::kBFloat16, add.data(), DType::kFloat32, sum.size());
  EXPECT_EQ(static_cast<float>(sum[0]), 1.0f);
  EXPECT_EQ(static_cast<float>(sum[1]), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(static_cast<float>(sum[2]), -1.5f);

  // fp16 into fp32: the 2-byte source is exact in fp32, one fp32 add.
  std::vector<float> wide = {0.1f, 1e-8f};
  const std::vector<Float16> narrow = {Float16(0.25f), Float16(1.0f)};
  cpu::accumulate_into(wide.data(), DType::kFloat32, narrow.data(), DType::kFloat16, 2);
  EXPECT_EQ(wide[0], 0.1f + 0.25f);
  EXPECT_EQ(wide[1], 1e-8f + 1.0f);
}

TEST(AccumulateInto, OnAStreamIsTheBody) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  std::vector<Float16> source;
  std::vector<BFloat16> queued, direct;
  for (int i = 0; i < 37; ++i) {
    source.push_back(Float16(0.3f * static_cast<float>(i) - 5.0f));
    queued.push_back(BFloat16(1.7f * static_cast<float>(i)));
  }
  direct = queued;
  accumulate_into(*stream, queued.data(), DType::kBFloat16, source.data(), DType::kFloat16, 37);
  cpu::accumulate_into(direct.data(), DType::kBFloat16, source.data(), DType::kFloat16, 37);
  stream->synchronize();
  for (int i = 0; i < 37; ++i) EXPECT_EQ(queued[i].bits, direct[i].bits) << "at " << i;
}

// With CUDA built a CudaStream launches the CUDA bodies (cast_cuda_test.cc,
// accumulate_cuda_test.cc); a stream that only claims CUDA is refused by name.
TEST(Convert, AStreamThatIsNotARealCudaStreamIsRefusedByName) {
  float a = 1.0f, b = 2.0f;
  testing::expect_cuda_stream_refused("convert", [&](Stream& stream) {
    convert(stream, &a, DType::kFloat32, &b, DType::kFloat32, 1);
  });
  testing::expect_cuda_stream_refused("accumulate_into", [&](Stream& stream) {
    accumulate_into(stream, &a, DType::kFloat32, &b, DType::kFloat32, 1);
  });
}

}  // namespace
}  // namespace zest
