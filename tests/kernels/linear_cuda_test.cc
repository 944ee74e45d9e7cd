// ctest-labels: gpu
// The fused linear forward on a CudaStream (one cuBLASLt product with a bias / GELU epilogue and
// the residual as C) against the CPU dispatch (the separate kernels). The product sums in
// another order: held, as the matmul tests, to 1e-5 of each output's term magnitudes, bounded
// here by (|x|·|w| summed over `in`) + |residual| + |bias| for every output.
#include "kernels/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

constexpr std::int64_t kRows = 24, kIn = 40;

std::vector<float> term_scale(const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>& bias, const std::vector<float>* residual,
                              std::int64_t out) {
  std::vector<float> scale(static_cast<std::size_t>(kRows * out));
  for (std::int64_t r = 0; r < kRows; ++r) {
    for (std::int64_t o = 0; o < out; ++o) {
      double sum = std::fabs(bias[o]);
      for (std::int64_t i = 0; i < kIn; ++i) sum += std::fabs(x[r * kIn + i] * w[o * kIn + i]);
      if (residual) sum += std::fabs((*residual)[r * out + o]);
      scale[r * out + o] = static_cast<float>(sum);
    }
  }
  return scale;
}

TEST(LinearCuda, ResidualAndBiasMatchTheCpuDispatch) {
  ZEST_SKIP_WITHOUT_CUDA();
  for (std::int64_t out : {32, 20}) {
    const auto x = testing::random_floats(kRows * kIn, 1);
    const auto w = testing::random_floats(out * kIn, 2);
    const auto bias = testing::random_floats(out, 3);
    const auto residual = testing::random_floats(kRows * out, 4);
    cpu::CpuDevice host(0);
    auto host_stream = host.create_stream("compute");
    std::vector<float> plain(kRows * out), with_residual(kRows * out);
    linear_forward(*host_stream, x.data(), w.data(), bias.data(), kRows, kIn, out, nullptr,
                   plain.data());
    linear_forward(*host_stream, x.data(), w.data(), bias.data(), kRows, kIn, out,
                   residual.data(), with_residual.data());
    host_stream->synchronize();

    cuda::CudaDevice device(0);
    auto stream = device.create_stream("compute");
    DeviceArray<float> d_x(x), d_w(w), d_b(bias), d_r(residual), d_plain(plain.size()),
        d_with(with_residual.size());
    linear_forward(*stream, d_x.data(), d_w.data(), d_b.data(), kRows, kIn, out, nullptr,
                   d_plain.data());
    linear_forward(*stream, d_x.data(), d_w.data(), d_b.data(), kRows, kIn, out, d_r.data(),
                   d_with.data());
    stream->synchronize();
    const auto plain_scale = term_scale(x, w, bias, nullptr, out);
    const auto with_scale = term_scale(x, w, bias, &residual, out);
    testing::expect_within(
        d_plain.download(), plain, [&](std::size_t i) { return 1e-5 * plain_scale[i]; },
        "no residual");
    testing::expect_within(
        d_with.download(), with_residual, [&](std::size_t i) { return 1e-5 * with_scale[i]; },
        "residual");
  }
}

TEST(LinearCuda, GeluEpilogueAndItsFallbackMatchTheCpuDispatch) {
  ZEST_SKIP_WITHOUT_CUDA();
  // 32 and 20 in exact fp32: the three kernels (20 is not a multiple of 8 either); 32 with the
  // products rounded to bf16: cuBLASLt's GELU epilogue. The product is held as in
  // matmul_cuda_test.cc: 1e-5 of the terms in fp32, one bf16 ulp (2^-8) of them rounded. GELU
  // is checked on the GPU's own pre, so its error is GELU's alone: the kernel has the CPU's
  // formula; the epilogue is cuBLASLt's tanh, held to 1e-4 relative with a floor of 1.
  struct Case {
    std::int64_t out;
    DType rounding;
  };
  for (const Case c : {Case{32, DType::kFloat32}, Case{20, DType::kFloat32},
                       Case{32, DType::kBFloat16}}) {
    SCOPED_TRACE(::testing::Message() << "out " << c.out << ", " << dtype_name(c.rounding));
    const std::int64_t out = c.out;
    const auto x = testing::random_floats(kRows * kIn, 5);
    const auto w = testing::random_floats(out * kIn, 6);
    const auto bias = testing::random_floats(out, 7);
    cpu::CpuDevice host(0);
    auto host_stream = host.create_stream("compute");
    std::vector<float> pre(kRows * out), post(kRows * out);
    linear_gelu_forward(*host_stream, x.data(), w.data(), bias.data(), kRows, kIn, out,
                        pre.data(), post.data());
    host_stream->synchronize();

    cuda::CudaDevice device(0);
    auto stream = device.create_stream("compute");
    set_fp32_matmul_rounding(*stream, c.rounding);
    DeviceArray<float> d_x(x), d_w(w), d_b(bias), d_pre(pre.size()), d_post(post.size());
    linear_gelu_forward(*stream, d_x.data(), d_w.data(), d_b.data(), kRows, kIn, out,
                        d_pre.data(), d_post.data());
    stream->synchronize();
    const auto scale = term_scale(x, w, bias, nullptr, out);
    const double product_bound = c.rounding == DType::kFloat32 ? 1e-5 : std::ldexp(1.0, -8);
    const std::vector<float> gpu_pre = d_pre.download();
    testing::expect_within(
        gpu_pre, pre, [&](std::size_t i) { return product_bound * scale[i]; }, "pre");
    std::vector<float> gelu_of_gpu_pre(gpu_pre.size());
    cpu::gelu_forward(gpu_pre.data(), gelu_of_gpu_pre.data(), gpu_pre.size());
    testing::expect_close(d_post.download(), gelu_of_gpu_pre, 1e-4, 1.0, "post");
  }
}

TEST(LinearCuda, BiasAndPreOffTheEpiloguesAlignmentTakeTheSeparateKernels) {
  ZEST_SKIP_WITHOUT_CUDA();
  // A bias and a pre-GELU matrix one float past a 16-byte boundary (a parameter view can sit at
  // any 4-byte offset): the shape and the bf16 products that would take cuBLASLt's epilogue, held
  // to the CPU dispatch as above (one bf16 ulp of the terms), and GELU to the CPU's of the GPU's
  // own pre. An epilogue that read them as 16-byte vectors would fault ("misaligned address").
  const std::int64_t out = 32;
  const auto x = testing::random_floats(kRows * kIn, 8);
  const auto w = testing::random_floats(out * kIn, 9);
  const auto bias = testing::random_floats(out, 10);
  const auto residual = testing::random_floats(kRows * out, 11);
  cpu::CpuDevice host(0);
  auto host_stream = host.create_stream("compute");
  std::vector<float> y(kRows * out), pre(kRows * out), post(kRows * out);
  linear_forward(*host_stream, x.data(), w.data(), bias.data(), kRows, kIn, out, residual.data(),
                 y.data());
  linear_gelu_forward(*host_stream, x.data(), w.data(), bias.data(), kRows, kIn, out, pre.data(),
                      post.data());
  host_stream->synchronize();

  cuda::CudaDevice device(0);
  auto stream = device.create_stream("compute");
  set_fp32_matmul_rounding(*stream, DType::kBFloat16);
  constexpr std::size_t kOneFloatOff = 1;
  DeviceArray<float> d_x(x), d_w(w), d_b(bias, kOneFloatOff), d_r(residual), d_y(y.size()),
      d_pre(pre.size(), kOneFloatOff), d_post(post.size());
  linear_forward(*stream, d_x.data(), d_w.data(), d_b.data(), kRows, kIn, out, d_r.data(),
                 d_y.data());
  linear_gelu_forward(*stream, d_x.data(), d_w.data(), d_b.data(), kRows, kIn, out, d_pre.data(),
                      d_post.data());
  stream->synchronize();
  const double bf16_ulp = std::ldexp(1.0, -8);
  const auto y_scale = term_scale(x, w, bias, &residual, out);
  const auto pre_scale = term_scale(x, w, bias, nullptr, out);
  testing::expect_within(
      d_y.download(), y, [&](std::size_t i) { return bf16_ulp * y_scale[i]; }, "residual");
  const std::vector<float> gpu_pre = d_pre.download();
  testing::expect_within(
      gpu_pre, pre, [&](std::size_t i) { return bf16_ulp * pre_scale[i]; }, "pre");
  std::vector<float> gelu_of_gpu_pre(gpu_pre.size());
  cpu::gelu_forward(gpu_pre.data(), gelu_of_gpu_pre.data(), gpu_pre.size());
  testing::expect_close(d_post.download(), gelu_of_gpu_pre, 1e-4, 1.0, "post");
}

}  // namespace
}  // namespace zest
