// ctest-labels: gpu
// The CUDA embedding against the CPU body, bit for bit: forward is one fp32 add per element on
// both sides, and backward adds each row's gradient in the CPU body's order (positions in
// increasing order per token, the batch in order per position), so the sums are the same values.
// Backward is also deterministic: two runs give the same bits. Tokens repeat often (a vocabulary
// of 50 for 512 positions), the case float atomics would make order-dependent.
#include "kernels/embedding_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "kernels/embedding.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

constexpr std::int64_t kBatch = 4;
constexpr std::int64_t kSeq = 128;
constexpr std::int64_t kVocab = 50;
constexpr std::int64_t kChannels = 96;

std::vector<std::int32_t> tokens() {
  std::vector<std::int32_t> t(kBatch * kSeq);
  for (std::size_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<std::int32_t>((i * i * 7 + i * 3) % kVocab);
  }
  t[17] = 0;
  t[18] = kVocab - 1;  // both ends of the table
  return t;
}

TEST(EmbeddingCuda, ForwardIsTheCpuBodyBitForBit) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto t = tokens();
  const auto wte = testing::random_floats(kVocab * kChannels, 1);
  const auto wpe = testing::random_floats(kSeq * kChannels, 2);
  std::vector<float> want(t.size() * kChannels);
  cpu::embedding_forward(t.data(), kBatch, kSeq, wte.data(), wpe.data(), kVocab, kChannels,
                         want.data());
  DeviceArray<std::int32_t> d_t(t);
  DeviceArray<float> d_wte(wte), d_wpe(wpe), d_out(want.size());
  cuda::embedding_forward(d_t.data(), kBatch, kSeq, d_wte.data(), d_wpe.data(), kVocab, kChannels,
                          d_out.data(), nullptr);
  testing::expect_bit_identical(d_out.download(), want, "out");
}

TEST(EmbeddingCuda, BackwardIsTheCpuBodyBitForBitAndDeterministic) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto t = tokens();
  const auto dout = testing::random_floats(t.size() * kChannels, 3);
  const auto dwte0 = testing::random_floats(kVocab * kChannels, 4);  // accumulated into
  const auto dwpe0 = testing::random_floats(kSeq * kChannels, 5);
  std::vector<float> dwte = dwte0, dwpe = dwpe0;
  cpu::embedding_backward(t.data(), kBatch, kSeq, dout.data(), kVocab, kChannels, dwte.data(),
                          dwpe.data());
  DeviceArray<std::int32_t> d_t(t);
  DeviceArray<float> d_dout(dout);
  const std::size_t bytes = cuda::embedding_backward_workspace_bytes(kBatch, kSeq);
  DeviceArray<unsigned char> workspace(bytes);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(::testing::Message() << "run " << run);
    DeviceArray<float> d_dwte(dwte0), d_dwpe(dwpe0);
    cuda::embedding_backward(d_t.data(), kBatch, kSeq, d_dout.data(), kVocab, kChannels,
                             d_dwte.data(), d_dwpe.data(), workspace.data(), bytes, nullptr);
    testing::expect_bit_identical(d_dwte.download(), dwte, "dwte");
    testing::expect_bit_identical(d_dwpe.download(), dwpe, "dwpe");
  }
}

TEST(EmbeddingCuda, TokenOutsideTheVocabularyGivesANaNRow) {
  ZEST_SKIP_WITHOUT_CUDA();
  auto t = tokens();
  t[3] = static_cast<std::int32_t>(kVocab);
  DeviceArray<std::int32_t> d_t(t);
  DeviceArray<float> d_wte(testing::random_floats(kVocab * kChannels, 1)),
      d_wpe(testing::random_floats(kSeq * kChannels, 2)), d_out(t.size() * kChannels);
  cuda::embedding_forward(d_t.data(), kBatch, kSeq, d_wte.data(), d_wpe.data(), kVocab, kChannels,
                          d_out.data(), nullptr);
  const auto out = d_out.download();
  EXPECT_TRUE(std::isnan(out[3 * kChannels]));
  EXPECT_FALSE(std::isnan(out[4 * kChannels]));
}

// The dispatch functions on a CudaStream (the stream's workspace for backward's sort) against
// the same dispatch on the CPU device: bit for bit, as the bodies above.
TEST(EmbeddingCuda, DispatchOnACudaStreamIsTheCpuDispatchBitForBit) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto t = tokens();
  const auto wte = testing::random_floats(kVocab * kChannels, 1);
  const auto wpe = testing::random_floats(kSeq * kChannels, 2);
  const auto dout = testing::random_floats(t.size() * kChannels, 3);
  std::vector<float> out(t.size() * kChannels);
  std::vector<float> dwte = testing::random_floats(kVocab * kChannels, 4);  // accumulated into
  std::vector<float> dwpe = testing::random_floats(kSeq * kChannels, 5);
  DeviceArray<float> d_dwte(dwte), d_dwpe(dwpe);
  cpu::CpuDevice host(0);
  auto host_stream = host.create_stream("compute");
  embedding_forward(*host_stream, t.data(), kBatch, kSeq, wte.data(), wpe.data(), kVocab,
                    kChannels, out.data());
  embedding_backward(*host_stream, t.data(), kBatch, kSeq, dout.data(), kVocab, kChannels,
                     dwte.data(), dwpe.data());
  host_stream->synchronize();

  cuda::CudaDevice device(0);
  auto stream = device.create_stream("compute");
  DeviceArray<std::int32_t> d_t(t);
  DeviceArray<float> d_wte(wte), d_wpe(wpe), d_dout(dout), d_out(out.size());
  embedding_forward(*stream, d_t.data(), kBatch, kSeq, d_wte.data(), d_wpe.data(), kVocab,
                    kChannels, d_out.data());
  embedding_backward(*stream, d_t.data(), kBatch, kSeq, d_dout.data(), kVocab, kChannels,
                     d_dwte.data(), d_dwpe.data());
  stream->synchronize();
  testing::expect_bit_identical(d_out.download(), out, "out");
  testing::expect_bit_identical(d_dwte.download(), dwte, "dwte");
  testing::expect_bit_identical(d_dwpe.download(), dwpe, "dwpe");
}

TEST(EmbeddingCudaArguments, ShapesAreCheckedOnTheHost) {
  EXPECT_THROW(cuda::embedding_forward(nullptr, 0, 4, nullptr, nullptr, 10, 8, nullptr, nullptr),
               Error);
  EXPECT_THROW(cuda::embedding_forward(nullptr, std::int64_t{1} << 16, std::int64_t{1} << 16,
                                       nullptr, nullptr, 10, 8, nullptr, nullptr),
               Error);  // 2^32 positions
}

}  // namespace
}  // namespace zest
