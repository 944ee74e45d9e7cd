// The fused linear forward's CPU body is the separate kernels in the GPT block's old order, so it
// must equal them bit for bit; and shapes and CUDA-only streams are refused on the host.
#include "kernels/linear.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernels/bias.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"
#include "runtime/cpu_device.h"
#include "tests/kernels/cuda_refusal.h"

namespace zest {
namespace {

constexpr std::int64_t kRows = 7, kIn = 12, kOut = 10;

std::vector<float> random_vector(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(rng);
  return values;
}

struct Inputs {
  std::vector<float> x = random_vector(kRows * kIn, 1);
  std::vector<float> weight = random_vector(kOut * kIn, 2);
  std::vector<float> bias = random_vector(kOut, 3);
  std::vector<float> residual = random_vector(kRows * kOut, 4);
};

TEST(Linear, WithoutAResidualIsTheProductThenTheBias) {
  const Inputs in;
  std::vector<float> want(kRows * kOut);
  cpu::matmul(false, true, kRows, kOut, kIn, 1.0f, in.x.data(), in.weight.data(), 0.0f,
              want.data());
  cpu::add_bias(want.data(), in.bias.data(), kRows, kOut);
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  std::vector<float> got(kRows * kOut, 123.0f);  // not read: no residual
  linear_forward(*stream, in.x.data(), in.weight.data(), in.bias.data(), kRows, kIn, kOut,
                 nullptr, got.data());
  stream->synchronize();
  EXPECT_EQ(got, want);
}

TEST(Linear, AResidualIsCopiedBiasedThenTheProductAdded) {
  const Inputs in;
  std::vector<float> want = in.residual;
  cpu::add_bias(want.data(), in.bias.data(), kRows, kOut);
  cpu::matmul(false, true, kRows, kOut, kIn, 1.0f, in.x.data(), in.weight.data(), 1.0f,
              want.data());
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  std::vector<float> apart(kRows * kOut);
  linear_forward(*stream, in.x.data(), in.weight.data(), in.bias.data(), kRows, kIn, kOut,
                 in.residual.data(), apart.data());
  std::vector<float> in_place = in.residual;  // y is the residual
  linear_forward(*stream, in.x.data(), in.weight.data(), in.bias.data(), kRows, kIn, kOut,
                 in_place.data(), in_place.data());
  stream->synchronize();
  EXPECT_EQ(apart, want);
  EXPECT_EQ(in_place, want);
}

TEST(Linear, GeluKeepsThePreActivation) {
  const Inputs in;
  std::vector<float> pre_want(kRows * kOut), post_want(kRows * kOut);
  cpu::matmul(false, true, kRows, kOut, kIn, 1.0f, in.x.data(), in.weight.data(), 0.0f,
              pre_want.data());
  cpu::add_bias(pre_want.data(), in.bias.data(), kRows, kOut);
  cpu::gelu_forward(pre_want.data(), post_want.data(), pre_want.size());
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  std::vector<float> pre(kRows * kOut), post(kRows * kOut);
  linear_gelu_forward(*stream, in.x.data(), in.weight.data(), in.bias.data(), kRows, kIn, kOut,
                      pre.data(), post.data());
  stream->synchronize();
  EXPECT_EQ(pre, pre_want);
  EXPECT_EQ(post, post_want);
}

TEST(Linear, BadShapesAndCudaStreamsAreRefusedOnTheHost) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  float v = 0.0f;
  EXPECT_THROW(linear_forward(*stream, &v, &v, &v, 1, 0, 1, nullptr, &v), Error);
  EXPECT_THROW(linear_gelu_forward(*stream, &v, &v, &v, -1, 1, 1, &v, &v), Error);
  EXPECT_NO_THROW(linear_forward(*stream, &v, &v, &v, 0, 1, 1, nullptr, &v));  // no rows
  testing::expect_cuda_stream_refused("linear_forward", [&](Stream& cuda) {
    linear_forward(cuda, &v, &v, &v, 1, 1, 1, nullptr, &v);
  });
  for (std::int64_t out : {8, 3}) {  // the fused epilogue and the three kernels alike
    testing::expect_cuda_stream_refused("linear_gelu_forward", [&](Stream& cuda) {
      linear_gelu_forward(cuda, &v, &v, &v, 1, 1, out, &v, &v);
    });
  }
}

}  // namespace
}  // namespace zest
