// Causal multi-head attention forward against a float64 re-implementation, backward against
// central differences of it, the probabilities' shape (rows sum to 1, nothing from the future),
// the write-not-add contract of backward, the dispatch and the shape checks.
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/kernels/cuda_refusal.h"
#include "tests/support/fake_cuda_stream.h"

namespace zest {
namespace {

const AttentionShape kShape{/*batch=*/2, /*seq=*/5, /*heads=*/3, /*head_dim=*/4};
constexpr std::int64_t kC = 12;

std::vector<float> random_values(std::size_t count, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

// y [B, T, C] from qkv [B, T, 3C] in float64, straight from the definition.
std::vector<double> attention64(const std::vector<double>& qkv) {
  const std::int64_t B = kShape.batch, T = kShape.seq, H = kShape.heads, d = kShape.head_dim;
  std::vector<double> y(B * T * kC, 0.0);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> w(i + 1);
        double sum = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (std::int64_t e = 0; e < d; ++e) {
            dot +=
                qkv[(b * T + i) * 3 * kC + h * d + e] * qkv[(b * T + j) * 3 * kC + kC + h * d + e];
          }
          sum += (w[j] = std::exp(dot / std::sqrt(static_cast<double>(d))));
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          for (std::int64_t e = 0; e < d; ++e) {
            y[(b * T + i) * kC + h * d + e] +=
                w[j] / sum * qkv[(b * T + j) * 3 * kC + 2 * kC + h * d + e];
          }
        }
      }
    }
  }
  return y;
}

struct Forward {
  std::vector<float> split, probs, y;
};

Forward run_forward(const std::vector<float>& qkv) {
  Forward f{std::vector<float>(kShape.split_elements()),
            std::vector<float>(kShape.probs_elements()),
            std::vector<float>(kShape.batch * kShape.seq * kC)};
  std::vector<float> scratch(kShape.forward_scratch_elements());
  cpu::attention_forward(kShape, qkv.data(), f.split.data(), f.probs.data(), f.y.data(),
                         scratch.data());
  return f;
}

TEST(Attention, ForwardMatchesFloat64AndIsCausal) {
  const std::vector<float> qkv = random_values(kShape.batch * kShape.seq * 3 * kC, 1, 1.0f);
  const Forward f = run_forward(qkv);
  const std::vector<double> want = attention64(std::vector<double>(qkv.begin(), qkv.end()));
  for (std::size_t i = 0; i < want.size(); ++i) {
    // Outputs are convex combinations of values of O(1): a few fp32 roundings (1.5e-7 measured).
    EXPECT_NEAR(f.y[i], want[i], 1e-6) << "y[" << i << "]";
  }
  const std::int64_t T = kShape.seq;
  for (std::int64_t bh = 0; bh < kShape.batch * kShape.heads; ++bh) {
    for (std::int64_t i = 0; i < T; ++i) {
      double sum = 0.0;
      for (std::int64_t j = 0; j < T; ++j) {
        const float p = f.probs[(bh * T + i) * T + j];
        if (j > i) {
          EXPECT_EQ(p, 0.0f) << "a position attends to the future";
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  }
}

TEST(Attention, BackwardMatchesCentralDifferencesAndWrites) {
  const std::size_t n = kShape.batch * kShape.seq * 3 * kC;
  const std::vector<float> qkv = random_values(n, 2, 1.0f);
  const std::vector<float> upstream = random_values(kShape.batch * kShape.seq * kC, 3, 1.0f);
  const Forward f = run_forward(qkv);
  std::vector<float> dqkv(n, 123.0f);  // old contents must not matter
  std::vector<float> scratch(kShape.backward_scratch_elements());
  cpu::attention_backward(kShape, upstream.data(), f.split.data(), f.probs.data(), dqkv.data(),
                          scratch.data());
  std::vector<double> x(qkv.begin(), qkv.end());
  auto loss = [&] {
    const std::vector<double> y = attention64(x);
    double total = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) total += y[i] * upstream[i];
    return total;
  };
  for (std::size_t i = 0; i < n; ++i) {
    const double h = 1e-6, saved = x[i];
    x[i] = saved + h;
    const double plus = loss();
    x[i] = saved - h;
    const double minus = loss();
    x[i] = saved;
    const double want = (plus - minus) / (2 * h);
    // Gradients up to ~4, each a few fp32 sums over <= 5 positions and 4 dims: 5.6e-7 absolute
    // measured; the float64 differences err by ~1e-9. 1e-4 relative + 1e-5 absolute leaves a
    // wide margin and still fails any wrong term (errors of O(0.1) or more).
    EXPECT_NEAR(dqkv[i], want, 1e-4 * std::abs(want) + 1e-5) << "dqkv[" << i << "]";
  }
}

TEST(Attention, DispatchRunsTheCpuBodiesOnTheStream) {
  const std::vector<float> qkv = random_values(kShape.batch * kShape.seq * 3 * kC, 4, 1.0f);
  const std::vector<float> dy = random_values(kShape.batch * kShape.seq * kC, 5, 1.0f);
  Forward f{std::vector<float>(kShape.split_elements()),
            std::vector<float>(kShape.probs_elements()), std::vector<float>(dy.size())};
  std::vector<float> dqkv(qkv.size()), direct_dqkv(qkv.size());
  std::vector<float> scratch(kShape.backward_scratch_elements());
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  attention_forward(*stream, kShape, qkv.data(), f.split.data(), f.probs.data(), f.y.data(),
                    scratch.data());
  attention_backward(*stream, kShape, dy.data(), f.split.data(), f.probs.data(), dqkv.data(),
                     scratch.data());
  stream->synchronize();
  const Forward direct = run_forward(qkv);
  cpu::attention_backward(kShape, dy.data(), direct.split.data(), direct.probs.data(),
                          direct_dqkv.data(), scratch.data());
  EXPECT_EQ(f.y, direct.y);
  EXPECT_EQ(dqkv, direct_dqkv);
}

TEST(Attention, BadShapesAndCudaStreamsAreRefusedOnTheHost) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  float v = 0.0f;
  AttentionShape empty = kShape;
  empty.heads = 0;
  EXPECT_THROW(attention_forward(*stream, empty, &v, &v, &v, &v, &v), Error);
  EXPECT_THROW(attention_backward(*stream, empty, &v, &v, &v, &v, &v), Error);
  testing::FakeCudaStream cuda;
  EXPECT_THROW(attention_forward(cuda, kShape, &v, &v, &v, &v, &v), Error);
  EXPECT_EQ(cuda.enqueued, 0);
}

// With CUDA built a CudaStream launches the CUDA bodies (tests/kernels/attention_cuda_test.cc);
// a stream that only claims CUDA is refused by name, before anything runs.
TEST(Attention, AStreamThatIsNotARealCudaStreamIsRefusedByName) {
  float v = 0.0f;
  testing::expect_cuda_stream_refused("attention_forward", [&](Stream& stream) {
    attention_forward(stream, kShape, &v, &v, &v, &v, &v);
  });
  testing::expect_cuda_stream_refused("attention_backward", [&](Stream& stream) {
    attention_backward(stream, kShape, &v, &v, &v, &v, &v);
  });
}

}  // namespace
}  // namespace zest
