// The SGD kernel against an independent float64 re-implementation of torch.optim.SGD
// (dampening 0): weight decay, momentum started from the gradient, Nesterov, grad_scale.
#include "kernels/sgd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/support/fake_cuda_stream.h"

namespace zest {
namespace {

struct Reference {
  std::vector<double> p, buf;
};

// torch.optim.SGD's single-tensor step in float64; the buffer is "None" before step 1.
void reference_step(Reference& r, const std::vector<float>& grads, const SgdArgs& a) {
  for (std::size_t i = 0; i < r.p.size(); ++i) {
    double g = double{grads[i]} * a.grad_scale + double{a.weight_decay} * r.p[i];
    if (a.momentum != 0.0f) {
      r.buf[i] = a.step == 1 ? g : a.momentum * r.buf[i] + g;
      g = a.nesterov ? g + a.momentum * r.buf[i] : r.buf[i];
    }
    r.p[i] -= double{a.lr} * g;
  }
}

std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

void expect_matches_reference(std::size_t n, SgdArgs args, int steps) {
  std::vector<float> p = random_vector(n, 1, 1.0f);
  // NaN: step 1 must not read the buffer's old contents.
  std::vector<float> buf(n, std::numeric_limits<float>::quiet_NaN());
  Reference r{{p.begin(), p.end()}, std::vector<double>(n, 0.0)};
  for (int step = 1; step <= steps; ++step) {
    args.step = step;
    const std::vector<float> grads = random_vector(n, 100 + step, 1.0f);
    cpu::sgd(p.data(), grads.data(), args.momentum != 0.0f ? buf.data() : nullptr, n, args);
    reference_step(r, grads, args);
  }
  for (std::size_t i = 0; i < n; ++i) {
    // ~4 fp32 roundings (6e-8 each) per step on values of order 1, over 10 steps with the
    // momentum buffer growing to ~1/(1-0.9) = 10 gradients: 1e-6 relative with a floor of
    // 1e-6 absolute covers it with margin while a wrong formula is off by >= 1e-3.
    ASSERT_NEAR(p[i], r.p[i], 1e-6 * std::max(1.0, std::abs(r.p[i]))) << "p at " << i;
    if (args.momentum != 0.0f) {
      ASSERT_NEAR(buf[i], r.buf[i], 1e-6 * std::max(1.0, std::abs(r.buf[i]))) << "buf at " << i;
    }
  }
}

SgdArgs make_args(float momentum, bool nesterov, float weight_decay, float grad_scale) {
  SgdArgs args;
  args.lr = 0.05f;
  args.momentum = momentum;
  args.nesterov = nesterov;
  args.weight_decay = weight_decay;
  args.grad_scale = grad_scale;
  return args;
}

TEST(SgdKernel, PlainSgdMatchesFloat64Reference) {
  expect_matches_reference(1000, make_args(0.0f, false, 0.0f, 1.0f), 10);
}

TEST(SgdKernel, WeightDecayMatchesFloat64Reference) {
  expect_matches_reference(1000, make_args(0.0f, false, 0.1f, 1.0f), 10);
}

TEST(SgdKernel, MomentumMatchesFloat64ReferenceOverTenSteps) {
  expect_matches_reference(1000, make_args(0.9f, false, 0.1f, 1.0f), 10);
}

TEST(SgdKernel, NesterovMatchesFloat64ReferenceOverTenSteps) {
  expect_matches_reference(1000, make_args(0.9f, true, 0.1f, 1.0f), 10);
}

TEST(SgdKernel, GradScaleMatchesFloat64ReferenceInEveryMode) {
  expect_matches_reference(1000, make_args(0.0f, false, 0.1f, 0.125f), 10);
  expect_matches_reference(1000, make_args(0.9f, false, 0.1f, 0.125f), 10);
  expect_matches_reference(1000, make_args(0.9f, true, 0.1f, 0.125f), 10);
}

TEST(SgdKernel, EveryLengthAroundTheVectorBlockMatchesReference) {
  for (std::size_t n : {1u, 15u, 16u, 17u, 63u, 64u, 65u, 129u, 200u}) {
    SCOPED_TRACE(n);
    expect_matches_reference(n, make_args(0.9f, true, 0.1f, 1.0f), 3);
    expect_matches_reference(n, make_args(0.0f, false, 0.1f, 1.0f), 3);
  }
}

TEST(SgdKernel, NesterovDiffersFromPlainMomentum) {
  // Guards the reference itself: if both modes computed the same thing, the two tests above
  // could pass with the nesterov flag ignored.
  std::vector<float> a(8, 1.0f), b(8, 1.0f), buf_a(8), buf_b(8);
  std::vector<float> g(8, 0.5f);
  SgdArgs args = make_args(0.9f, false, 0.0f, 1.0f);
  cpu::sgd(a.data(), g.data(), buf_a.data(), 8, args);
  args.nesterov = true;
  cpu::sgd(b.data(), g.data(), buf_b.data(), 8, args);
  EXPECT_FLOAT_EQ(a[0], 1.0f - 0.05f * 0.5f);                  // buf = g
  EXPECT_FLOAT_EQ(b[0], 1.0f - 0.05f * (0.5f + 0.9f * 0.5f));  // g + momentum * buf
}

TEST(SgdKernel, MomentumWithoutABufferIsAUsageError) {
  std::vector<float> p(4), g(4);
  SgdArgs args = make_args(0.9f, false, 0.0f, 1.0f);
  try {
    cpu::sgd(p.data(), g.data(), nullptr, 4, args);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  }
  args.momentum = 0.0f;  // no momentum: no buffer needed
  EXPECT_NO_THROW(cpu::sgd(p.data(), g.data(), nullptr, 4, args));
}

TEST(SgdKernel, StepBelowOneIsAUsageError) {
  std::vector<float> p(4), g(4);
  SgdArgs args = make_args(0.0f, false, 0.0f, 1.0f);
  args.step = 0;
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  try {
    sgd(*stream, p.data(), g.data(), nullptr, 4, args);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(error.what()).find("step must be >= 1"), std::string::npos);
  }
}

TEST(SgdKernel, DispatchRunsTheCpuBodyOnTheStream) {
  const std::size_t n = 300;
  const std::vector<float> grads = random_vector(n, 9, 1.0f);
  std::vector<float> direct = random_vector(n, 8, 1.0f), queued = direct;
  std::vector<float> buf_direct(n), buf_queued(n);
  SgdArgs args = make_args(0.9f, true, 0.1f, 1.0f);
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  for (int step = 1; step <= 3; ++step) {
    args.step = step;
    cpu::sgd(direct.data(), grads.data(), buf_direct.data(), n, args);
    sgd(*stream, queued.data(), grads.data(), buf_queued.data(), n, args);
  }
  stream->synchronize();
  EXPECT_EQ(direct, queued);
  EXPECT_EQ(buf_direct, buf_queued);
}

// With CUDA built, a CUDA stream launches the CUDA body (tests/kernels/sgd_cuda_test.cc); a stream
// that only claims to be CUDA (or any CUDA stream in a CPU-only build) is refused on the host,
// naming the kernel, before anything is enqueued: the message depends on the build.
TEST(SgdKernel, CudaStreamWithoutACudaBodyIsRefused) {
  testing::FakeCudaStream stream;
  std::vector<float> p(4), g(4);
  try {
    sgd(stream, p.data(), g.data(), nullptr, 4, make_args(0.0f, false, 0.0f, 1.0f));
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
#if ZEST_HAVE_CUDA
    EXPECT_STREQ(error.what(), "sgd: stream 'fake-cuda' is not a CUDA stream");
#else
    EXPECT_STREQ(error.what(), "sgd: no CUDA body yet");
#endif
  }
  EXPECT_EQ(stream.enqueued, 0);
}

}  // namespace
}  // namespace zest
