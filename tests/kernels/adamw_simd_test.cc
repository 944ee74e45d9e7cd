// Every AdamW body (portable, AVX2, AVX-512) against the portable body, the reference: random
// data over a wide range of magnitudes, lengths that are not multiples of the vector width,
// arrays at unaligned and different offsets, weight decay on and off, Adam (L2) and AdamW,
// grad_scale != 1, several threads; and the fused 2-byte copy against convert() of the update.
// A body this CPU or build cannot run is skipped, saying so.
#include "kernels/adamw.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/convert.h"
#include "kernels/kernel_threads.h"

namespace zest {
namespace {

// Note: the tolerance is 0 ulps. Every body performs the same IEEE fp32 operations in the same
// order, each rounded once: no body fuses a multiply-add (all AdamW files are built with
// -ffp-contract=off and the SIMD bodies use no FMA intrinsic), and sqrt and division are
// correctly rounded in SSE, AVX2 and AVX-512 alike. A body that fused multiply-adds would round
// fewer times and differ by a few ulps per step; it would need its own bound here.
constexpr std::uint32_t kMaxUlps = 0;

// Distance in units in the last place between two floats of the same sign; NaNs agree with NaNs.
std::uint32_t ulps_apart(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : UINT32_MAX;
  if (a == b) return 0;  // also +0 and -0
  if (std::signbit(a) != std::signbit(b)) return UINT32_MAX;
  const auto x = std::bit_cast<std::uint32_t>(a);
  const auto y = std::bit_cast<std::uint32_t>(b);
  return x > y ? x - y : y - x;
}

void expect_same(const float* body, const float* reference, std::size_t n, const char* what) {
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_LE(ulps_apart(body[i], reference[i]), kMaxUlps)
        << what << "[" << i << "]: " << body[i] << " vs portable " << reference[i];
  }
}

// Values spread over many binades (|x| from 1e-6 to 1e3 times `scale`), with some exact zeros.
std::vector<float> spread_vector(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_real_distribution<float> exponent(-6.0f, 3.0f);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = i % 97 == 5 ? 0.0f : normal(rng) * std::pow(10.0f, exponent(rng));
  }
  return out;
}

// The four arrays, each placed at its own offset into a larger vector so that their starts are
// unaligned and differently so.
struct Arrays {
  std::vector<float> p, g, m, v;
  static constexpr std::size_t kOffsets[4] = {1, 3, 0, 2};

  Arrays(std::size_t n, std::uint32_t seed)
      : p(spread_vector(n + 4, seed, 1.0f)),
        g(spread_vector(n + 4, seed + 1, 0.1f)),
        m(spread_vector(n + 4, seed + 2, 0.01f)),
        v(spread_vector(n + 4, seed + 3, 1e-4f)) {
    for (float& x : v) x = std::abs(x);
  }
  float* params() { return p.data() + kOffsets[0]; }
  float* grads() { return g.data() + kOffsets[1]; }
  float* exp_avg() { return m.data() + kOffsets[2]; }
  float* exp_avg_sq() { return v.data() + kOffsets[3]; }
};

AdamWArgs args_for(bool decoupled, float weight_decay, float grad_scale) {
  AdamWArgs args;
  args.lr = 1e-2f;
  args.weight_decay = weight_decay;
  args.decoupled = decoupled;
  args.grad_scale = grad_scale;
  return args;
}

class AdamWBody : public ::testing::TestWithParam<CpuBody> {
 protected:
  void SetUp() override {
    if (!cpu_body_supported(GetParam())) {
      GTEST_SKIP() << "this CPU or build cannot run the " << cpu_body_name(GetParam()) << " body";
    }
  }
};

// Runs `steps` updates with `body` and with the portable body from the same start, then compares.
void expect_matches_portable(CpuBody body, std::size_t n, const AdamWArgs& base, int steps) {
  Arrays a(n, static_cast<std::uint32_t>(n));
  Arrays reference = a;
  for (int step = 1; step <= steps; ++step) {
    AdamWArgs args = base;
    args.step = step;
    cpu::adamw(body, a.params(), a.grads(), a.exp_avg(), a.exp_avg_sq(), n, args);
    cpu::adamw(CpuBody::kPortable, reference.params(), reference.grads(), reference.exp_avg(),
               reference.exp_avg_sq(), n, args);
  }
  expect_same(a.params(), reference.params(), n, "p");
  expect_same(a.exp_avg(), reference.exp_avg(), n, "m");
  expect_same(a.exp_avg_sq(), reference.exp_avg_sq(), n, "v");
}

// Lengths below, at and past the AVX2 (8) and AVX-512 (16) widths and the 64-element block.
constexpr std::size_t kLengths[] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1000, 4099};

TEST_P(AdamWBody, AdamWMatchesPortableForEveryLength) {
  for (std::size_t n : kLengths) {
    SCOPED_TRACE(n);
    expect_matches_portable(GetParam(), n, args_for(true, 0.1f, 1.0f), 5);
  }
}

TEST_P(AdamWBody, AdamWithL2DecayMatchesPortable) {
  for (std::size_t n : kLengths) {
    SCOPED_TRACE(n);
    expect_matches_portable(GetParam(), n, args_for(false, 0.1f, 1.0f), 5);
  }
}

TEST_P(AdamWBody, WithoutWeightDecayAndWithGradScaleMatchesPortable) {
  for (bool decoupled : {true, false}) {
    SCOPED_TRACE(decoupled);
    expect_matches_portable(GetParam(), 1021, args_for(decoupled, 0.0f, 1.0f), 5);
    expect_matches_portable(GetParam(), 1021, args_for(decoupled, 0.05f, 0.37f), 5);
  }
}

TEST_P(AdamWBody, LateStepsAndOtherBetasMatchPortable) {
  AdamWArgs args = args_for(true, 0.01f, 2.0f);
  args.beta1 = 0.8f;
  args.beta2 = 0.95f;
  args.eps = 1e-6f;
  for (std::int64_t step : {1, 2, 1000, 100000}) {
    SCOPED_TRACE(step);
    Arrays a(517, 9);
    Arrays reference = a;
    args.step = step;
    cpu::adamw(GetParam(), a.params(), a.grads(), a.exp_avg(), a.exp_avg_sq(), 517, args);
    cpu::adamw(CpuBody::kPortable, reference.params(), reference.grads(), reference.exp_avg(),
               reference.exp_avg_sq(), 517, args);
    expect_same(a.params(), reference.params(), 517, "p");
  }
}

TEST_P(AdamWBody, SeveralThreadsGiveTheSameResultAsOne) {
  // Long enough for kernel_threads() == 3 to split it (at least 2^19 elements a piece).
  const std::size_t n = 3 * (std::size_t{1} << 19) + 13;
  Arrays one(n, 21);
  Arrays several = one;
  const AdamWArgs args = args_for(true, 0.1f, 0.5f);
  std::vector<std::uint16_t> copy_one(n), copy_several(n);
  cpu::adamw(GetParam(), one.params(), one.grads(), one.exp_avg(), one.exp_avg_sq(), n, args,
             {copy_one.data(), DType::kBFloat16});
  set_kernel_threads(3);
  cpu::adamw(GetParam(), several.params(), several.grads(), several.exp_avg(),
             several.exp_avg_sq(), n, args, {copy_several.data(), DType::kBFloat16});
  set_kernel_threads(1);
  expect_same(several.params(), one.params(), n, "p");
  expect_same(several.exp_avg(), one.exp_avg(), n, "m");
  expect_same(several.exp_avg_sq(), one.exp_avg_sq(), n, "v");
  EXPECT_EQ(copy_several, copy_one);
}

// The fused copy must be exactly convert() of the fp32 parameters the same call produced.
void expect_copy_is_convert(CpuBody body, Arrays& a, std::size_t n, const AdamWArgs& args,
                            DType dtype) {
  std::vector<std::uint16_t> copy(n + 1, 0xdead);
  cpu::adamw(body, a.params(), a.grads(), a.exp_avg(), a.exp_avg_sq(), n, args,
             {copy.data() + 1, dtype});  // an odd start: unaligned for every vector width
  std::vector<std::uint16_t> converted(n);
  cpu::convert(a.params(), DType::kFloat32, converted.data(), dtype, n);
  EXPECT_EQ(copy[0], 0xdead) << "wrote before the copy";
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(copy[i + 1], converted[i]) << dtype_name(dtype) << " at " << i << " of " << n
                                         << ": updated fp32 " << a.params()[i];
  }
}

TEST_P(AdamWBody, FusedCopyIsConvertOfTheUpdatedParameters) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::size_t n : kLengths) {
      SCOPED_TRACE(n);
      Arrays a(n, 77);
      expect_copy_is_convert(GetParam(), a, n, args_for(true, 0.1f, 1.0f), dtype);
      expect_copy_is_convert(GetParam(), a, n, args_for(false, 0.0f, 0.5f), dtype);
    }
  }
}

TEST_P(AdamWBody, FusedCopyRoundsSpecialValuesAsConvert) {
  // lr = 0 and no decay leave every finite parameter as it was (p * 1 - 0), so the copy sees
  // these values exactly: rounding ties, overflow edges, subnormals, NaNs with payloads. (An
  // infinite parameter becomes NaN, through 0 * inf in the L2 term, as in the portable body.)
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> special = {
      0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f /* 1 + 2^-8: bf16 tie, to even */,
      1.01171875f /* 1 + 3*2^-8: tie, up */, 1.00048828125f /* 1 + 2^-11: fp16 tie */,
      65504.0f, 65519.996f, 65520.0f, -65520.0f, 1e10f, std::numeric_limits<float>::max(),
      6.1035156e-5f /* smallest normal fp16 */, 5.9604645e-8f /* smallest subnormal fp16 */,
      2.9802322e-8f /* half of it: a tie, to 0 */, 3.0e-8f, 1e-30f,
      std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
      std::numeric_limits<float>::min(), inf, -inf, nan, -nan,
      std::bit_cast<float>(0x7fa00001u) /* signalling NaN with a payload */,
      std::bit_cast<float>(0xffc12345u) /* quiet NaN with a payload, negative */,
      3.3895314e38f /* rounds to bf16 inf */};
  std::vector<float> values;
  for (int copies = 0; copies < 3; ++copies) {
    values.insert(values.end(), special.begin(), special.end());
  }
  const std::size_t n = values.size();  // 84: vector bodies and the tail both see them
  AdamWArgs args = args_for(true, 0.0f, 1.0f);
  args.lr = 0.0f;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> p = values, g(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
    std::vector<std::uint16_t> copy(n);
    cpu::adamw(GetParam(), p.data(), g.data(), m.data(), v.data(), n, args, {copy.data(), dtype});
    std::vector<std::uint16_t> converted(n);
    cpu::convert(p.data(), DType::kFloat32, converted.data(), dtype, n);
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(copy[i], converted[i]) << dtype_name(dtype) << " of " << values[i] << " (0x"
                                       << std::hex << std::bit_cast<std::uint32_t>(values[i])
                                       << ") at " << std::dec << i;
    }
  }
}

std::string body_test_name(const ::testing::TestParamInfo<CpuBody>& info) {
  return cpu_body_name(info.param);
}

// The portable instance checks the harness itself (a body against itself, the copy tests).
INSTANTIATE_TEST_SUITE_P(Bodies, AdamWBody,
                         ::testing::Values(CpuBody::kPortable, CpuBody::kAvx2, CpuBody::kAvx512),
                         body_test_name);

TEST(AdamWCopy, NonTwoByteCopyIsAUsageError) {
  std::vector<float> p(4), g(4), m(4), v(4), copy(4);
  EXPECT_THROW(cpu::adamw(p.data(), g.data(), m.data(), v.data(), 4, AdamWArgs{},
                          {copy.data(), DType::kFloat32}),
               Error);
}

}  // namespace
}  // namespace zest
