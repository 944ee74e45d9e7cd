// ctest-labels: gpu
// The CUDA softmax cross-entropy by pieces against the CPU body on the same pieces: the running
// max, exp-sum and target logit, the log-sum-exp and mean loss (double sums in another order,
// CUDA's expf against the CPU's: 1e-6 relative), and each piece's d(logits) in place (1e-6 of
// row_scale). Written without a GPU in its session: compiled and run where one exists.
#include "kernels/cross_entropy_pieces_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu_body.h"
#include "kernels/cross_entropy_pieces.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

constexpr std::int64_t kRows = 37;
constexpr std::int64_t kClasses = 1003;
constexpr int kPieces = 3;  // 334, 334 and 335 classes: not multiples of the block's threads

std::int64_t begin_of(int i) { return kClasses * i / kPieces; }
std::int64_t cols_of(int i) { return begin_of(i + 1) - begin_of(i); }

// The piece's columns of the whole logits, [kRows, cols] row-major.
std::vector<float> piece_of(const std::vector<float>& logits, int i) {
  std::vector<float> piece;
  for (std::int64_t r = 0; r < kRows; ++r) {
    for (std::int64_t j = 0; j < cols_of(i); ++j) {
      piece.push_back(logits[r * kClasses + begin_of(i) + j]);
    }
  }
  return piece;
}

TEST(CrossEntropyPiecesCuda, LossLogSumExpAndGradientsMatchTheCpuBody) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto logits = testing::random_floats(kRows * kClasses, 4, 3.0f, 20.0f);
  std::vector<std::int32_t> targets(kRows);
  for (std::int64_t r = 0; r < kRows; ++r) {
    targets[r] = static_cast<std::int32_t>(r * 389 % kClasses);
  }
  const float scale = 1024.0f;

  std::vector<unsigned char> running(cross_entropy_running_bytes(kRows));
  std::vector<float> lse(kRows);
  float loss = 0.0f;
  for (int i = 0; i < kPieces; ++i) {
    const std::vector<float> piece = piece_of(logits, i);
    cpu::cross_entropy_piece_forward(CpuBody::kPortable, piece.data(), cols_of(i), targets.data(),
                                     kRows, begin_of(i), cols_of(i), kClasses, running.data());
  }
  cpu::cross_entropy_pieces_finish(running.data(), kRows, lse.data(), &loss);

  DeviceArray<std::int32_t> d_targets(targets);
  DeviceArray<unsigned char> d_running(running.size());
  DeviceArray<float> d_lse(kRows), d_loss(1);
  for (int i = 0; i < kPieces; ++i) {
    DeviceArray<float> d_piece(piece_of(logits, i));
    cuda::cross_entropy_piece_forward(d_piece.data(), cols_of(i), d_targets.data(), kRows,
                                      begin_of(i), cols_of(i), kClasses, d_running.data(), nullptr);
  }
  cuda::cross_entropy_pieces_finish(d_running.data(), kRows, d_lse.data(), d_loss.data(), nullptr);
  EXPECT_NEAR(d_loss.download()[0], loss, 1e-6 * std::fabs(loss));
  const std::vector<float> got_lse = d_lse.download();
  for (std::int64_t r = 0; r < kRows; ++r) {
    EXPECT_NEAR(got_lse[r], lse[r], 1e-6 * std::fabs(lse[r]));
  }

  const float row_scale = scale / static_cast<float>(kRows);
  for (int i = 0; i < kPieces; ++i) {
    std::vector<float> want = piece_of(logits, i);
    cpu::cross_entropy_piece_backward(CpuBody::kPortable, want.data(), cols_of(i), targets.data(),
                                      kRows, begin_of(i), cols_of(i), lse.data(), scale,
                                      want.data(), cols_of(i));
    DeviceArray<float> d_piece(piece_of(logits, i));
    DeviceArray<float> d_cpu_lse(lse);  // the same lse, so that only the kernel differs
    cuda::cross_entropy_piece_backward(d_piece.data(), cols_of(i), d_targets.data(), kRows,
                                       begin_of(i), cols_of(i), d_cpu_lse.data(), scale,
                                       d_piece.data(), cols_of(i), nullptr);
    const std::vector<float> got = d_piece.download();
    for (std::size_t e = 0; e < want.size(); ++e) {
      ASSERT_NEAR(got[e], want[e], 1e-6 * std::fabs(want[e]) + 1e-6 * row_scale) << i << " " << e;
    }
  }
}

}  // namespace
}  // namespace zest
