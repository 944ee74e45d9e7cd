// The token + position embedding: forward sums the two rows, backward scatters into both tables
// (repeated tokens add up, in a fixed order) and accumulates, a token outside the vocabulary is
// a data error naming its position before anything is written; the dispatch and shape checks.
#include "kernels/embedding.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/kernels/cuda_refusal.h"
#include "tests/support/fake_cuda_stream.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

constexpr std::int64_t kBatch = 2, kSeq = 4, kVocab = 7, kChannels = 5, kPositions = 6;

std::vector<float> random_values(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

// Token 3 appears three times, so its gradient row sums three output rows.
const std::vector<std::int32_t> kTokens = {3, 0, 3, 6, 1, 3, 2, 0};

TEST(Embedding, ForwardAddsTheTokenAndThePositionRow) {
  const std::vector<float> wte = random_values(kVocab * kChannels, 1);
  const std::vector<float> wpe = random_values(kPositions * kChannels, 2);
  std::vector<float> out(kBatch * kSeq * kChannels);
  cpu::embedding_forward(kTokens.data(), kBatch, kSeq, wte.data(), wpe.data(), kVocab, kChannels,
                         out.data());
  for (std::int64_t n = 0; n < kBatch * kSeq; ++n) {
    for (std::int64_t c = 0; c < kChannels; ++c) {
      EXPECT_EQ(out[n * kChannels + c],
                wte[kTokens[n] * kChannels + c] + wpe[(n % kSeq) * kChannels + c]);
    }
  }
}

TEST(Embedding, BackwardScattersIntoBothTablesAndAccumulates) {
  const std::vector<float> dout = random_values(kBatch * kSeq * kChannels, 3);
  std::vector<float> dwte(kVocab * kChannels, 1.0f), dwpe(kPositions * kChannels, -1.0f);
  std::vector<double> want_wte(dwte.begin(), dwte.end()), want_wpe(dwpe.begin(), dwpe.end());
  for (std::int64_t n = 0; n < kBatch * kSeq; ++n) {
    for (std::int64_t c = 0; c < kChannels; ++c) {
      want_wte[kTokens[n] * kChannels + c] += dout[n * kChannels + c];
      want_wpe[(n % kSeq) * kChannels + c] += dout[n * kChannels + c];
    }
  }
  cpu::embedding_backward(kTokens.data(), kBatch, kSeq, dout.data(), kVocab, kChannels, dwte.data(),
                          dwpe.data());
  for (std::size_t i = 0; i < dwte.size(); ++i) EXPECT_NEAR(dwte[i], want_wte[i], 1e-6) << i;
  // Positions past kSeq get nothing.
  for (std::size_t i = 0; i < dwpe.size(); ++i) EXPECT_NEAR(dwpe[i], want_wpe[i], 1e-6) << i;

  // The same sums in the same order: bit for bit the same result.
  std::vector<float> again_wte(kVocab * kChannels, 1.0f), again_wpe(kPositions * kChannels, -1.0f);
  cpu::embedding_backward(kTokens.data(), kBatch, kSeq, dout.data(), kVocab, kChannels,
                          again_wte.data(), again_wpe.data());
  EXPECT_EQ(dwte, again_wte);
  EXPECT_EQ(dwpe, again_wpe);
}

TEST(Embedding, TokenOutsideTheVocabularyIsADataErrorBeforeAnyWrite) {
  std::vector<std::int32_t> tokens = kTokens;
  tokens[6] = kVocab;  // [1, 2]
  const std::vector<float> wte(kVocab * kChannels, 1.0f), wpe(kPositions * kChannels, 1.0f);
  std::vector<float> out(kBatch * kSeq * kChannels, 9.0f);
  try {
    cpu::embedding_forward(tokens.data(), kBatch, kSeq, wte.data(), wpe.data(), kVocab, kChannels,
                           out.data());
    ADD_FAILURE() << "expected a data Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kData);
    EXPECT_THAT(error.what(),
                HasSubstr("token at position [1, 2] is 7, outside the vocabulary [0, 7)"));
  }
  EXPECT_EQ(out, std::vector<float>(out.size(), 9.0f));
  tokens[6] = -1;
  std::vector<float> dwte(kVocab * kChannels, 0.0f), dwpe(kPositions * kChannels, 0.0f);
  EXPECT_THROW(cpu::embedding_backward(tokens.data(), kBatch, kSeq, out.data(), kVocab, kChannels,
                                       dwte.data(), dwpe.data()),
               Error);
  EXPECT_EQ(dwte, std::vector<float>(dwte.size(), 0.0f));

  // Through a stream, the error fails the stream and reaches its synchronize().
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  embedding_forward(*stream, tokens.data(), kBatch, kSeq, wte.data(), wpe.data(), kVocab, kChannels,
                    out.data());
  try {
    stream->synchronize();
    ADD_FAILURE() << "expected a data Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kData);
    EXPECT_THAT(error.what(), HasSubstr("position [1, 2] is -1"));
  }
}

TEST(Embedding, DispatchRunsTheCpuBodiesOnTheStream) {
  const std::vector<float> wte = random_values(kVocab * kChannels, 4);
  const std::vector<float> wpe = random_values(kPositions * kChannels, 5);
  std::vector<float> out(kBatch * kSeq * kChannels), direct(out.size());
  std::vector<float> dwte(wte.size()), dwpe(wpe.size()), direct_dwte(wte.size()),
      direct_dwpe(wpe.size());
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  embedding_forward(*stream, kTokens.data(), kBatch, kSeq, wte.data(), wpe.data(), kVocab,
                    kChannels, out.data());
  embedding_backward(*stream, kTokens.data(), kBatch, kSeq, out.data(), kVocab, kChannels,
                     dwte.data(), dwpe.data());
  stream->synchronize();
  cpu::embedding_forward(kTokens.data(), kBatch, kSeq, wte.data(), wpe.data(), kVocab, kChannels,
                         direct.data());
  cpu::embedding_backward(kTokens.data(), kBatch, kSeq, direct.data(), kVocab, kChannels,
                          direct_dwte.data(), direct_dwpe.data());
  EXPECT_EQ(out, direct);
  EXPECT_EQ(dwte, direct_dwte);
  EXPECT_EQ(dwpe, direct_dwpe);
}

TEST(Embedding, BadShapesAndCudaStreamsAreRefusedOnTheHost) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  std::int32_t token = 0;
  float v = 0.0f;
  EXPECT_THROW(embedding_forward(*stream, &token, 0, 1, &v, &v, 1, 1, &v), Error);
  EXPECT_THROW(embedding_backward(*stream, &token, 1, 1, &v, 1, 0, &v, &v), Error);
  testing::FakeCudaStream cuda;
  EXPECT_THROW(embedding_forward(cuda, &token, 1, 1, &v, &v, 1, 1, &v), Error);
  EXPECT_EQ(cuda.enqueued, 0);
}

// With CUDA built a CudaStream launches the CUDA bodies (tests/kernels/embedding_cuda_test.cc);
// a stream that only claims CUDA is refused by name, before anything runs (backward before its
// workspace size, which would ask a device).
TEST(Embedding, AStreamThatIsNotARealCudaStreamIsRefusedByName) {
  std::int32_t token = 0;
  float v = 0.0f;
  testing::expect_cuda_stream_refused("embedding_forward", [&](Stream& stream) {
    embedding_forward(stream, &token, 1, 1, &v, &v, 1, 1, &v);
  });
  testing::expect_cuda_stream_refused("embedding_backward", [&](Stream& stream) {
    embedding_backward(stream, &token, 1, 1, &v, 1, 1, &v, &v);
  });
}

}  // namespace
}  // namespace zest
