// The Adam / AdamW kernel against an independent float64 re-implementation of
// torch.optim.Adam/AdamW (bias correction, decoupled vs L2 decay, grad_scale), over several steps.
#include "kernels/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/support/fake_cuda_stream.h"

namespace zest {
namespace {

struct State {
  std::vector<float> p, m, v;
};

struct Reference {
  std::vector<double> p, m, v;
};

// torch.optim.AdamW / Adam, single-tensor path, in float64.
void reference_step(Reference& r, const std::vector<float>& grads, const AdamWArgs& a) {
  const double bc1 = 1.0 - std::pow(double{a.beta1}, double(a.step));
  const double bc2 = 1.0 - std::pow(double{a.beta2}, double(a.step));
  for (std::size_t i = 0; i < r.p.size(); ++i) {
    double g = double{grads[i]} * a.grad_scale;
    if (a.decoupled) {
      r.p[i] *= 1.0 - double{a.lr} * a.weight_decay;
    } else {
      g += double{a.weight_decay} * r.p[i];
    }
    r.m[i] = a.beta1 * r.m[i] + (1.0 - a.beta1) * g;
    r.v[i] = a.beta2 * r.v[i] + (1.0 - a.beta2) * g * g;
    const double denom = std::sqrt(r.v[i]) / std::sqrt(bc2) + a.eps;
    r.p[i] -= double{a.lr} / bc1 * r.m[i] / denom;
  }
}

std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

// Runs `steps` updates of the fp32 kernel and of the float64 reference from the same start and
// the same fresh gradients each step, then compares.
void expect_matches_reference(std::size_t n, AdamWArgs args, int steps) {
  State s{random_vector(n, 1, 1.0f), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  Reference r{{s.p.begin(), s.p.end()}, std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  for (int step = 1; step <= steps; ++step) {
    args.step = step;
    const std::vector<float> grads = random_vector(n, 100 + step, 0.1f);
    cpu::adamw(s.p.data(), grads.data(), s.m.data(), s.v.data(), n, args);
    reference_step(r, grads, args);
  }
  for (std::size_t i = 0; i < n; ++i) {
    // fp32 rounds each of ~10 operations per step to 6e-8 relative; over 10 steps the
    // parameters (|p| ~ 1, moved by ~lr per step) stay within 1e-6 relative. The moments can
    // cancel towards 0, so they get an absolute floor of 1e-6 of the gradient scale (0.1).
    ASSERT_NEAR(s.p[i], r.p[i], 1e-6 * std::max(1.0, std::abs(r.p[i]))) << "p at " << i;
    ASSERT_NEAR(s.m[i], r.m[i], 1e-6 * std::abs(r.m[i]) + 1e-7) << "m at " << i;
    ASSERT_NEAR(s.v[i], r.v[i], 1e-6 * std::abs(r.v[i]) + 1e-9) << "v at " << i;
  }
}

AdamWArgs default_args() {
  AdamWArgs args;
  args.lr = 1e-2f;
  args.beta1 = 0.9f;
  args.beta2 = 0.999f;
  args.eps = 1e-8f;
  return args;
}

TEST(AdamWKernel, AdamWMatchesFloat64ReferenceOverTenSteps) {
  AdamWArgs args = default_args();
  args.weight_decay = 0.1f;
  args.decoupled = true;
  expect_matches_reference(1000, args, 10);
}

TEST(AdamWKernel, AdamWithL2DecayMatchesFloat64ReferenceOverTenSteps) {
  AdamWArgs args = default_args();
  args.weight_decay = 0.1f;
  args.decoupled = false;
  expect_matches_reference(1000, args, 10);
}

TEST(AdamWKernel, WithoutWeightDecayMatchesFloat64Reference) {
  AdamWArgs args = default_args();
  args.weight_decay = 0.0f;
  expect_matches_reference(1000, args, 10);
}

TEST(AdamWKernel, GradScaleMatchesFloat64Reference) {
  AdamWArgs args = default_args();
  args.weight_decay = 0.05f;
  args.grad_scale = 0.25f;
  expect_matches_reference(1000, args, 10);
  args.decoupled = false;
  expect_matches_reference(1000, args, 10);
}

TEST(AdamWKernel, EveryLengthAroundTheVectorBlockMatchesReference) {
  // Lengths below, at and past the kernel's internal block, so that both the blocked loop and
  // the tail are checked.
  for (std::size_t n : {1u, 15u, 16u, 17u, 63u, 64u, 65u, 129u, 200u}) {
    SCOPED_TRACE(n);
    AdamWArgs args = default_args();
    args.weight_decay = 0.1f;
    expect_matches_reference(n, args, 3);
  }
}

TEST(AdamWKernel, GradScaleIsTheSameAsScaledGradients) {
  const std::size_t n = 257;
  const std::vector<float> grads = random_vector(n, 7, 1.0f);
  std::vector<float> scaled(grads);
  for (float& g : scaled) g *= 0.5f;
  AdamWArgs args = default_args();
  State a{random_vector(n, 3, 1.0f), std::vector<float>(n), std::vector<float>(n)};
  State b = a;
  args.grad_scale = 0.5f;
  cpu::adamw(a.p.data(), grads.data(), a.m.data(), a.v.data(), n, args);
  args.grad_scale = 1.0f;
  cpu::adamw(b.p.data(), scaled.data(), b.m.data(), b.v.data(), n, args);
  // The kernel's first operation is g * grad_scale, the very product computed here: bitwise.
  EXPECT_EQ(a.p, b.p);
  EXPECT_EQ(a.m, b.m);
  EXPECT_EQ(a.v, b.v);
}

TEST(AdamWKernel, BiasCorrectionMakesTheFirstStepMoveEachParameterByLr) {
  // Step 1: m_hat = g and v_hat = g^2, so the update is lr * g / (|g| + eps) ~ lr * sign(g).
  // Without bias correction it would be lr * 0.1 / sqrt(0.001) ~ 3.16 lr.
  const std::size_t n = 100;
  const std::vector<float> grads = random_vector(n, 11, 1.0f);
  std::vector<float> p(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
  AdamWArgs args = default_args();
  cpu::adamw(p.data(), grads.data(), m.data(), v.data(), n, args);
  for (std::size_t i = 0; i < n; ++i) {
    if (std::abs(grads[i]) < 1e-3f) continue;  // eps would matter
    const float moved = 0.5f - p[i];
    // 1e-4: eps / |g| <= 1e-5, plus fp32 rounding of p near 0.5 (3e-8 / lr = 3e-6).
    EXPECT_NEAR(moved, std::copysign(args.lr, grads[i]), args.lr * 1e-4) << "at " << i;
  }
}

TEST(AdamWKernel, DecoupledDecayShrinksWeightsEvenWithZeroGradient) {
  std::vector<float> p(10, 2.0f), g(10, 0.0f), m(10, 0.0f), v(10, 0.0f);
  AdamWArgs args = default_args();
  args.weight_decay = 0.5f;
  cpu::adamw(p.data(), g.data(), m.data(), v.data(), p.size(), args);
  // p *= 1 - lr * wd, and m = v = 0 adds nothing.
  for (float x : p) EXPECT_FLOAT_EQ(x, 2.0f * (1.0f - 1e-2f * 0.5f));
  // With L2 the same decay goes through the moments instead: the first step moves by ~lr.
  std::fill(p.begin(), p.end(), 2.0f);
  args.decoupled = false;
  cpu::adamw(p.data(), g.data(), m.data(), v.data(), p.size(), args);
  for (float x : p) EXPECT_NEAR(x, 2.0f - 1e-2f, 1e-6f);
}

TEST(AdamWKernel, StepBelowOneIsAUsageError) {
  std::vector<float> p(4), g(4), m(4), v(4);
  AdamWArgs args = default_args();
  args.step = 0;
  try {
    cpu::adamw(p.data(), g.data(), m.data(), v.data(), 4, args);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(error.what()).find("step must be >= 1, got 0"), std::string::npos)
        << error.what();
  }
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  // The dispatcher refuses on the host, before anything is enqueued.
  EXPECT_THROW(adamw(*stream, p.data(), g.data(), m.data(), v.data(), 4, args), Error);
}

TEST(AdamWKernel, DispatchRunsTheCpuBodyOnTheStream) {
  const std::size_t n = 333;
  const std::vector<float> grads = random_vector(n, 5, 1.0f);
  State direct{random_vector(n, 6, 1.0f), std::vector<float>(n), std::vector<float>(n)};
  State queued = direct;
  AdamWArgs args = default_args();
  args.weight_decay = 0.1f;
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  for (int step = 1; step <= 3; ++step) {
    args.step = step;
    cpu::adamw(direct.p.data(), grads.data(), direct.m.data(), direct.v.data(), n, args);
    adamw(*stream, queued.p.data(), grads.data(), queued.m.data(), queued.v.data(), n, args);
  }
  stream->synchronize();
  EXPECT_EQ(direct.p, queued.p);
  EXPECT_EQ(direct.m, queued.m);
  EXPECT_EQ(direct.v, queued.v);
}

// With CUDA built, a CUDA stream launches the CUDA body (tests/kernels/adamw_cuda_test.cc); a stream
// that only claims to be CUDA (or any CUDA stream in a CPU-only build) is refused on the host,
// naming the kernel, before anything is enqueued: the message depends on the build.
TEST(AdamWKernel, CudaStreamWithoutACudaBodyIsRefused) {
  testing::FakeCudaStream stream;
  std::vector<float> p(4), g(4), m(4), v(4);
  try {
    adamw(stream, p.data(), g.data(), m.data(), v.data(), 4, default_args());
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
#if ZEST_HAVE_CUDA
    EXPECT_STREQ(error.what(), "adamw: stream 'fake-cuda' is not a CUDA stream");
#else
    EXPECT_STREQ(error.what(), "adamw: no CUDA body yet");
#endif
  }
  EXPECT_EQ(stream.enqueued, 0);
}

}  // namespace
}  // namespace zest
