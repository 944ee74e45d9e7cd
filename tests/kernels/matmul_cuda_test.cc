// ctest-labels: gpu
// The cuBLASLt matmul against the CPU body (cblas_sgemm) on the same inputs, every transpose
// pair, accumulating and not, at a misaligned offset, with the bias / residual / GELU epilogues,
// with bf16 inputs, and as a strided batch. Tolerance: both sides compute in fp32 in different
// orders; any order's error is at most k * 2^-24 of the sum of the terms' magnitudes
// |alpha| sum|a b| + |beta c|, and k <= 96 here, so each element is held to 1e-5 of that sum
// (6e-6 is the worst case). bf16 inputs are rounded on the host first, so both sides multiply the
// same values (a product of two bf16 is exact in fp32) and the same bound holds; a bf16 output
// adds its own rounding, 2^-9 of the value. The argument checks need no GPU and run everywhere.
#include "kernels/matmul_cuda.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/bias.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"
#include "runtime/cuda_device.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

struct Problem {
  bool trans_a, trans_b;
  std::int64_t m, n, k;
  float alpha, beta;
};

// |alpha| sum_p |op(A)[i, p] op(B)[p, j]| + |beta C[i, j]|: the scale of C[i, j]'s error.
std::vector<double> term_magnitudes(const Problem& p, const std::vector<float>& a,
                                    const std::vector<float>& b, const std::vector<float>& c) {
  std::vector<double> scale(static_cast<std::size_t>(p.m * p.n));
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t j = 0; j < p.n; ++j) {
      double sum = 0.0;
      for (std::int64_t q = 0; q < p.k; ++q) {
        const float x = p.trans_a ? a[q * p.m + i] : a[i * p.k + q];
        const float y = p.trans_b ? b[j * p.k + q] : b[q * p.n + j];
        sum += std::fabs(static_cast<double>(x) * y);
      }
      scale[i * p.n + j] = std::fabs(p.alpha) * sum + std::fabs(p.beta * c[i * p.n + j]);
    }
  }
  return scale;
}

std::vector<float> rounded_to_bfloat16(std::vector<float> values) {
  for (float& v : values) v = static_cast<float>(BFloat16(v));
  return values;
}

std::vector<std::uint16_t> bfloat16_bits(const std::vector<float>& values) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = BFloat16(values[i]).bits;
  return bits;
}

class MatmulCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    ZEST_SKIP_WITHOUT_CUDA();
    handle_ = std::make_unique<testing::LtHandle>();
    workspace_ = std::make_unique<DeviceArray<unsigned char>>(cuda::kMatmulWorkspaceBytes);
  }
  cuda::MatmulContext context() const {
    return {handle_->get(), workspace_->data(), cuda::kMatmulWorkspaceBytes};
  }

  // Runs `p` in fp32 on both sides (operands `offset` floats off their allocation) and compares.
  void check_fp32(const Problem& p, std::size_t offset) {
    const auto a = testing::random_floats(static_cast<std::size_t>(p.m * p.k), 1);
    const auto b = testing::random_floats(static_cast<std::size_t>(p.k * p.n), 2);
    const auto c = testing::random_floats(static_cast<std::size_t>(p.m * p.n), 3);
    std::vector<float> want = c;
    cpu::matmul(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a.data(), b.data(), p.beta,
                want.data());
    DeviceArray<float> da(a, offset), db(b, offset), dc(c, offset);
    cuda::MatmulArgs args;
    args.trans_a = p.trans_a;
    args.trans_b = p.trans_b;
    args.m = p.m;
    args.n = p.n;
    args.k = p.k;
    args.alpha = p.alpha;
    args.a = da.data();
    args.b = db.data();
    args.beta = p.beta;
    args.d = dc.data();
    cuda::matmul(args, context(), nullptr);
    const auto scale = term_magnitudes(p, a, b, c);
    testing::expect_within(
        dc.download(), want, [&](std::size_t i) { return 1e-5 * scale[i]; }, "C");
  }

  std::unique_ptr<testing::LtHandle> handle_;
  std::unique_ptr<DeviceArray<unsigned char>> workspace_;
};

TEST_F(MatmulCuda, Fp32MatchesTheCpuBodyForEveryTransposePair) {
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a " << trans_a << ", trans_b " << trans_b);
      check_fp32({trans_a, trans_b, 37, 48, 96, 0.75f, 0.0f}, 0);
      check_fp32({trans_a, trans_b, 37, 48, 96, 1.0f, 1.0f}, 0);  // accumulate, as weight grads
    }
  }
}

TEST_F(MatmulCuda, OperandsOffTheAllocationsAlignmentStillMatch) {
  check_fp32({false, true, 33, 40, 64, 1.0f, 0.5f}, 1);  // 4-byte aligned only
  check_fp32({true, false, 33, 40, 64, 1.0f, 0.5f}, 3);
}

// The GPT's x1 = x + c_proj(y) + bias (CPU: copy, add_bias, matmul with beta 1) in one product
// whose C is the residual x and D another buffer.
TEST_F(MatmulCuda, BiasAndResidualEpilogueMatchesTheCpuSequence) {
  const Problem p{false, true, 29, 64, 80, 1.0f, 1.0f};
  const auto a = testing::random_floats(static_cast<std::size_t>(p.m * p.k), 4);
  const auto b = testing::random_floats(static_cast<std::size_t>(p.n * p.k), 5);
  const auto residual = testing::random_floats(static_cast<std::size_t>(p.m * p.n), 6);
  const auto bias = testing::random_floats(static_cast<std::size_t>(p.n), 7);
  std::vector<float> want = residual;
  cpu::add_bias(want.data(), bias.data(), p.m, p.n);
  cpu::matmul(false, true, p.m, p.n, p.k, 1.0f, a.data(), b.data(), 1.0f, want.data());
  DeviceArray<float> da(a), db(b), dresidual(residual), dbias(bias), dd(want.size());
  cuda::MatmulArgs args;
  args.trans_b = true;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.a = da.data();
  args.b = db.data();
  args.beta = 1.0f;
  args.c = dresidual.data();
  args.d = dd.data();
  args.epilogue = cuda::MatmulEpilogue::kBias;
  args.bias = dbias.data();
  cuda::matmul(args, context(), nullptr);
  auto scale = term_magnitudes(p, a, b, residual);
  for (std::size_t i = 0; i < scale.size(); ++i) scale[i] += std::fabs(bias[i % p.n]);
  testing::expect_within(
      dd.download(), want, [&](std::size_t i) { return 1e-5 * scale[i]; }, "x1");
}

// The MLP's h = c_fc(x) + bias, g = gelu(h) in one product. h is held as above; g is held to
// 1e-4 of max(1, |g|): cuBLASLt's GELU is the same tanh form but not the same tanh as glibc's.
TEST_F(MatmulCuda, GeluBiasEpilogueMatchesMatmulBiasThenGelu) {
  const Problem p{false, true, 31, 128, 64, 1.0f, 0.0f};
  const auto a = testing::random_floats(static_cast<std::size_t>(p.m * p.k), 8);
  const auto b = testing::random_floats(static_cast<std::size_t>(p.n * p.k), 9, 0.2f);
  const auto bias = testing::random_floats(static_cast<std::size_t>(p.n), 10);
  std::vector<float> h(static_cast<std::size_t>(p.m * p.n));
  cpu::matmul(false, true, p.m, p.n, p.k, 1.0f, a.data(), b.data(), 0.0f, h.data());
  cpu::add_bias(h.data(), bias.data(), p.m, p.n);
  std::vector<float> g(h.size());
  cpu::gelu_forward(h.data(), g.data(), g.size());
  DeviceArray<float> da(a), db(b), dbias(bias), dh(h.size()), dg(g.size());
  cuda::MatmulArgs args;
  args.trans_b = true;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.a = da.data();
  args.b = db.data();
  args.d = dg.data();
  args.epilogue = cuda::MatmulEpilogue::kGeluBias;
  args.bias = dbias.data();
  args.gelu_input = dh.data();
  cuda::matmul(args, context(), nullptr);
  auto scale = term_magnitudes(p, a, b, std::vector<float>(h.size()));
  for (std::size_t i = 0; i < scale.size(); ++i) scale[i] += std::fabs(bias[i % p.n]);
  testing::expect_within(
      dh.download(), h, [&](std::size_t i) { return 1e-5 * scale[i]; }, "h");
  testing::expect_close(dg.download(), g, 1e-4, 1.0, "g");
}

// Attention's products: a strided batch, each product the CPU body's on its slices. The strides
// leave gaps and are odd multiples of 4 bytes, so cuBLASLt is told 4-byte alignment for every
// operand after the first; the tolerance is check_fp32's, per product.
TEST_F(MatmulCuda, StridedBatchIsEachProductOfTheCpuBody) {
  const Problem p{false, true, 7, 12, 9, 0.5f, 0.0f};
  const std::int64_t batch = 5;
  const std::int64_t stride_a = p.m * p.k + 2, stride_b = p.n * p.k + 1, stride_d = p.m * p.n + 5;
  const auto a = testing::random_floats(static_cast<std::size_t>(batch * stride_a), 13);
  const auto b = testing::random_floats(static_cast<std::size_t>(batch * stride_b), 14);
  std::vector<float> want(static_cast<std::size_t>(batch * stride_d), 0.0f);
  DeviceArray<float> da(a), db(b), dd(want);
  std::vector<double> scale(want.size(), 0.0);
  for (std::int64_t i = 0; i < batch; ++i) {
    const std::vector<float> ai(a.begin() + i * stride_a, a.begin() + i * stride_a + p.m * p.k);
    const std::vector<float> bi(b.begin() + i * stride_b, b.begin() + i * stride_b + p.n * p.k);
    cpu::matmul(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, ai.data(), bi.data(), 0.0f,
                want.data() + i * stride_d);
    const auto scale_i = term_magnitudes(p, ai, bi, std::vector<float>(p.m * p.n, 0.0f));
    std::copy(scale_i.begin(), scale_i.end(), scale.begin() + i * stride_d);
  }
  cuda::MatmulArgs args;
  args.trans_b = p.trans_b;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.alpha = p.alpha;
  args.a = da.data();
  args.b = db.data();
  args.d = dd.data();
  args.batch = batch;
  args.stride_a = stride_a;
  args.stride_b = stride_b;
  args.stride_d = stride_d;
  cuda::matmul(args, context(), nullptr);
  // The gaps between products stay 0: their scale is 0, so they are held to exactly 0.
  testing::expect_within(
      dd.download(), want, [&](std::size_t i) { return 1e-5 * scale[i]; }, "D");
}

TEST_F(MatmulCuda, Bfloat16InputsAccumulateInFp32) {
  const Problem p{false, true, 40, 56, 96, 1.0f, 0.0f};
  const auto a =
      rounded_to_bfloat16(testing::random_floats(static_cast<std::size_t>(p.m * p.k), 11));
  const auto b =
      rounded_to_bfloat16(testing::random_floats(static_cast<std::size_t>(p.n * p.k), 12));
  std::vector<float> want(static_cast<std::size_t>(p.m * p.n));
  cpu::matmul(false, true, p.m, p.n, p.k, 1.0f, a.data(), b.data(), 0.0f, want.data());
  const auto scale = term_magnitudes(p, a, b, want);
  DeviceArray<std::uint16_t> da(bfloat16_bits(a)), db(bfloat16_bits(b));
  DeviceArray<float> d32(want.size());
  DeviceArray<std::uint16_t> d16(want.size());
  cuda::MatmulArgs args;
  args.trans_b = true;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.a = da.data();
  args.b = db.data();
  args.input_type = DType::kBFloat16;
  args.d = d32.data();
  cuda::matmul(args, context(), nullptr);
  testing::expect_within(
      d32.download(), want, [&](std::size_t i) { return 1e-5 * scale[i]; }, "fp32 out");
  args.d = d16.data();
  args.output_type = DType::kBFloat16;
  cuda::matmul(args, context(), nullptr);
  std::vector<float> got;
  for (std::uint16_t bits : d16.download()) {
    BFloat16 value;
    value.bits = bits;
    got.push_back(static_cast<float>(value));
  }
  testing::expect_within(
      got, want,
      [&](std::size_t i) { return std::ldexp(std::fabs(want[i]), -8) + 1e-5 * scale[i]; },
      "bf16 out");
}

TEST_F(MatmulCuda, Fp32InputsRoundedToBfloat16MultiplyAsTheRoundedInputs) {
  // 2-byte training's products: fp32 operands that the tensor cores take as bf16. The want is
  // the exact product of the operands rounded to bf16 (round to nearest even, as the engine's
  // casts), accumulated in fp32. cuBLAS documents the conversion, not its rounding mode, so
  // the bound allows one bf16 ulp (2^-8 relative) per term; the exact fp32 product of the
  // unrounded operands differs by about that much too, so a mode that ignored the rounding
  // request would still pass: the second check catches that.
  const Problem p{false, false, 48, 40, 64, 1.0f, 0.0f};
  const auto a = testing::random_floats(static_cast<std::size_t>(p.m * p.k), 21);
  const auto b = testing::random_floats(static_cast<std::size_t>(p.k * p.n), 22);
  const auto ra = rounded_to_bfloat16(a);
  const auto rb = rounded_to_bfloat16(b);
  std::vector<float> want(static_cast<std::size_t>(p.m * p.n));
  cpu::matmul(false, false, p.m, p.n, p.k, 1.0f, ra.data(), rb.data(), 0.0f, want.data());
  std::vector<float> exact(want.size());
  cpu::matmul(false, false, p.m, p.n, p.k, 1.0f, a.data(), b.data(), 0.0f, exact.data());
  const auto scale = term_magnitudes(p, a, b, want);
  DeviceArray<float> da(a), db(b), dd(want.size());
  cuda::MatmulArgs args;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.a = da.data();
  args.b = db.data();
  args.d = dd.data();
  cuda::MatmulContext rounding = context();
  rounding.fp32_rounding = DType::kBFloat16;
  cuda::matmul(args, rounding, nullptr);
  const std::vector<float> got = dd.download();
  testing::expect_within(
      got, want, [&](std::size_t i) { return std::ldexp(scale[i], -8); }, "rounded product");
  double to_rounded = 0.0, to_exact = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    to_rounded += std::fabs(static_cast<double>(got[i]) - want[i]);
    to_exact += std::fabs(static_cast<double>(got[i]) - exact[i]);
  }
  EXPECT_LT(to_rounded, to_exact) << "the product is closer to the unrounded operands'";
}

// An empty sum (k = 0: an MLP's weight gradient over zero rows) through the dispatch, which
// cuBLASLt refuses: C = beta·C as the CPU body (BLAS) computes it, beta 0 clearing a NaN.
TEST(MatmulCudaDispatch, AnEmptyProductScalesCAsTheCpuBody) {
  ZEST_SKIP_WITHOUT_CUDA();
  const std::vector<float> c = {1.0f, -2.0f, std::nanf(""), 4.0f, 0.5f, 3.0f};
  cuda::CudaDevice device(0);
  auto stream = device.create_stream("compute");
  for (float beta : {0.0f, 0.5f, 1.0f}) {
    SCOPED_TRACE(::testing::Message() << "beta " << beta);
    std::vector<float> want = c;
    cpu::matmul(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, beta, want.data());
    DeviceArray<float> dc(c);
    matmul(*stream, false, false, 2, 3, 0, 1.0f, nullptr, nullptr, beta, dc.data());
    stream->synchronize();
    const std::vector<float> got = dc.download();
    for (std::size_t i = 0; i < c.size(); ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
      } else {
        EXPECT_EQ(got[i], want[i]) << "element " << i;
      }
    }
  }
}

TEST(MatmulCudaArguments, BadArgumentsAreUsageErrorsBeforeAnyCudaCall) {
  const cuda::MatmulContext none;
  auto refused = [&](cuda::MatmulArgs args) {
    try {
      cuda::matmul(args, none, nullptr);
    } catch (const Error& error) {
      return error.kind() == ErrorKind::kUsage;
    }
    return false;
  };
  cuda::MatmulArgs ok;
  ok.m = ok.n = ok.k = 8;
  cuda::MatmulArgs args = ok;
  args.k = 0;
  EXPECT_TRUE(refused(args));
  args = ok;
  args.m = std::int64_t{1} << 31;
  EXPECT_TRUE(refused(args));
  args = ok;
  args.output_type = DType::kBFloat16;  // fp32 inputs write fp32 only
  EXPECT_TRUE(refused(args));
  args = ok;
  args.input_type = DType::kInt32;
  EXPECT_TRUE(refused(args));
  args = ok;
  args.epilogue = cuda::MatmulEpilogue::kBias;  // no bias
  EXPECT_TRUE(refused(args));
  args.bias = &args;
  args.epilogue = cuda::MatmulEpilogue::kGeluBias;  // no gelu_input
  EXPECT_TRUE(refused(args));
  args.gelu_input = &args;
  args.n = 12;  // not a multiple of 8
  EXPECT_TRUE(refused(args));
  args = ok;
  args.batch = 0;
  EXPECT_TRUE(refused(args));
  args.batch = 2;
  args.stride_a = -1;
  EXPECT_TRUE(refused(args));
  args.stride_a = 64;
  args.epilogue = cuda::MatmulEpilogue::kBias;  // no epilogue in a batch
  args.bias = &args;
  EXPECT_TRUE(refused(args));
  args = ok;
  args.m = 0;  // nothing to do, and nothing touched
  EXPECT_NO_THROW(cuda::matmul(args, none, nullptr));
}

}  // namespace
}  // namespace zest
