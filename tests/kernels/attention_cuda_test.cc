// ctest-labels: gpu
// The CUDA causal attention against the CPU body on the same inputs and layouts: split Q | K | V
// (a copy: bit for bit), the probabilities, y, and backward's dqkv. Both compute in fp32 in
// different orders (cuBLASLt's products against OpenBLAS's, a warp's softmax sums against a loop),
// so elements are compared norm-wise, since cancellation makes single elements' relative errors
// meaningless: a product of length k (at most seq = 40 here) is within k * 2^-24 = 2.4e-6 of its
// terms' scale, the softmax adds a few ulps; forward is held to 1e-5 of the largest value.
// Backward chains three products and the softmax gradient (which cancels within each row):
// 3e-5. The probabilities above the diagonal are exactly 0 on both.
#include "kernels/attention_cuda.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "kernels/attention.h"
#include "kernels/matmul_cuda.h"
#include "runtime/cpu_device.h"
#include "runtime/cuda_device.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

const AttentionShape kShape{2, 40, 3, 16};  // batch, seq, heads, head_dim

std::size_t qkv_elements(const AttentionShape& s) {
  return static_cast<std::size_t>(s.batch * s.seq * 3 * s.channels());
}
std::size_t y_elements(const AttentionShape& s) {
  return static_cast<std::size_t>(s.batch * s.seq * s.channels());
}

TEST(AttentionCuda, ForwardAndBackwardMatchTheCpuBody) {
  ZEST_SKIP_WITHOUT_CUDA();
  const AttentionShape& s = kShape;
  const auto qkv = testing::random_floats(qkv_elements(s), 1);
  const auto dy = testing::random_floats(y_elements(s), 2);
  std::vector<float> split(s.split_elements()), probs(s.probs_elements()), y(y_elements(s));
  std::vector<float> scratch(std::max(s.forward_scratch_elements(), s.backward_scratch_elements()));
  cpu::attention_forward(s, qkv.data(), split.data(), probs.data(), y.data(), scratch.data());
  std::vector<float> dqkv(qkv.size());
  cpu::attention_backward(s, dy.data(), split.data(), probs.data(), dqkv.data(), scratch.data());

  testing::LtHandle handle;
  DeviceArray<unsigned char> workspace(cuda::kMatmulWorkspaceBytes);
  const cuda::MatmulContext context{handle.get(), workspace.data(), cuda::kMatmulWorkspaceBytes};
  DeviceArray<float> d_qkv(qkv), d_dy(dy), d_split(split.size()), d_probs(probs.size()),
      d_y(y.size()), d_dqkv(dqkv.size());
  DeviceArray<float> d_scratch(
      std::max(s.forward_scratch_elements(), cuda::attention_backward_scratch_elements(s)));
  cuda::attention_forward(context, s, d_qkv.data(), d_split.data(), d_probs.data(), d_y.data(),
                          d_scratch.data(), nullptr);
  testing::expect_bit_identical(d_split.download(), split, "split");
  const auto got_probs = d_probs.download();
  testing::expect_close_normwise(got_probs, probs, 1e-5, "probs");
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] == 0.0f) {
      ASSERT_EQ(got_probs[i], 0.0f) << "masked probability " << i;
    }
  }
  testing::expect_close_normwise(d_y.download(), y, 1e-5, "y");

  // Backward from the CPU's own split and probabilities, so only backward's error counts.
  d_split.upload(split);
  d_probs.upload(probs);
  cuda::attention_backward(context, s, d_dy.data(), d_split.data(), d_probs.data(),
                           d_dqkv.data(), d_scratch.data(), nullptr);
  testing::expect_close_normwise(d_dqkv.download(), dqkv, 3e-5, "dqkv");
}

// The dispatch functions on a CudaStream (the stream's cuBLASLt handle and workspace, and
// backward's larger scratch carved from that workspace) against the same dispatch on the CPU
// device: they launch the body above, so the same tolerances hold. Backward starts from the CPU's
// split and probabilities, so only backward's error counts.
TEST(AttentionCuda, DispatchOnACudaStreamMatchesTheCpuDispatch) {
  ZEST_SKIP_WITHOUT_CUDA();
  const AttentionShape& s = kShape;
  const auto qkv = testing::random_floats(qkv_elements(s), 3);
  const auto dy = testing::random_floats(y_elements(s), 4);
  std::vector<float> split(s.split_elements()), probs(s.probs_elements()), y(y_elements(s));
  std::vector<float> dqkv(qkv.size());
  std::vector<float> scratch(std::max(s.forward_scratch_elements(), s.backward_scratch_elements()));
  cpu::CpuDevice host(0);
  auto host_stream = host.create_stream("compute");
  attention_forward(*host_stream, s, qkv.data(), split.data(), probs.data(), y.data(),
                    scratch.data());
  attention_backward(*host_stream, s, dy.data(), split.data(), probs.data(), dqkv.data(),
                     scratch.data());
  host_stream->synchronize();

  cuda::CudaDevice device(0);
  auto stream = device.create_stream("compute");
  // The caller's scratch is the CPU's size: the dispatch must not need more from it.
  DeviceArray<float> d_qkv(qkv), d_dy(dy), d_split(split.size()), d_probs(probs.size()),
      d_y(y.size()), d_dqkv(dqkv.size()), d_scratch(scratch.size());
  attention_forward(*stream, s, d_qkv.data(), d_split.data(), d_probs.data(), d_y.data(),
                    d_scratch.data());
  stream->synchronize();
  testing::expect_bit_identical(d_split.download(), split, "split");
  testing::expect_close_normwise(d_probs.download(), probs, 1e-5, "probs");
  testing::expect_close_normwise(d_y.download(), y, 1e-5, "y");
  d_split.upload(split);
  d_probs.upload(probs);
  attention_backward(*stream, s, d_dy.data(), d_split.data(), d_probs.data(), d_dqkv.data(),
                     d_scratch.data());
  stream->synchronize();
  testing::expect_close_normwise(d_dqkv.download(), dqkv, 3e-5, "dqkv");
}

TEST(AttentionCudaArguments, ShapesAreCheckedOnTheHost) {
  EXPECT_THROW(cuda::attention_forward(cuda::MatmulContext{}, AttentionShape{1, 0, 1, 1}, nullptr,
                                       nullptr, nullptr, nullptr, nullptr, nullptr),
               Error);
  EXPECT_THROW(cuda::attention_backward_scratch_elements(AttentionShape{1, 4, 0, 8}), Error);
  EXPECT_EQ(cuda::attention_backward_scratch_elements(kShape),
            4 * kShape.split_elements() / 3 + kShape.probs_elements());
}

}  // namespace
}  // namespace zest
