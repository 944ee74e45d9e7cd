// Softmax cross-entropy by pieces of the classes (kernels/cross_entropy_pieces.h) against the
// whole-row kernel: the loss and d(logits) within fp32 rounding for pieces of every width
// (one class, uneven, the whole row, GPT-2's 50257 in 11), every CPU body the same bits, the
// log-sum-exp exact enough that exp(x - lse) is the softmax, and the errors.
#include "kernels/cross_entropy_pieces.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cpu_body.h"
#include "kernels/cross_entropy.h"

namespace zest {
namespace {

struct Problem {
  std::int64_t rows, classes;
  std::vector<float> logits;
  std::vector<std::int32_t> targets;

  Problem(std::int64_t r, std::int64_t c, std::uint32_t seed) : rows(r), classes(c) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    logits.resize(static_cast<std::size_t>(r * c));
    for (float& x : logits) x = normal(rng);
    for (std::int64_t i = 0; i < r; ++i) {
      targets.push_back(static_cast<std::int32_t>((i * 7919 + seed) % c));
    }
  }
};

struct ByPieces {
  float loss = 0;
  std::vector<float> lse;
  std::vector<float> dlogits;
};

// The pieces copied out of the whole logits into a buffer of their own width (as the GPT head
// makes them), the forward in order, then the backward of each piece.
ByPieces by_pieces(CpuBody body, const Problem& p, int pieces, float scale) {
  ByPieces out;
  std::vector<char> running(cross_entropy_running_bytes(p.rows));
  out.lse.resize(static_cast<std::size_t>(p.rows));
  out.dlogits.resize(p.logits.size());
  std::vector<float> piece;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < pieces; ++i) {
      const std::int64_t begin = p.classes * i / pieces;
      const std::int64_t cols = p.classes * (i + 1) / pieces - begin;
      piece.assign(static_cast<std::size_t>(p.rows * cols), 0.0f);
      for (std::int64_t r = 0; r < p.rows; ++r) {
        for (std::int64_t j = 0; j < cols; ++j) {
          piece[r * cols + j] = p.logits[r * p.classes + begin + j];
        }
      }
      if (pass == 0) {
        cpu::cross_entropy_piece_forward(body, piece.data(), cols, p.targets.data(), p.rows, begin,
                                         cols, p.classes, running.data());
        continue;
      }
      // In place, written into the whole d(logits) by its leading dimension afterwards.
      cpu::cross_entropy_piece_backward(body, piece.data(), cols, p.targets.data(), p.rows, begin,
                                        cols, out.lse.data(), scale, piece.data(), cols);
      for (std::int64_t r = 0; r < p.rows; ++r) {
        for (std::int64_t j = 0; j < cols; ++j) {
          out.dlogits[r * p.classes + begin + j] = piece[r * cols + j];
        }
      }
    }
    if (pass == 0) {
      cpu::cross_entropy_pieces_finish(running.data(), p.rows, out.lse.data(), &out.loss);
    }
  }
  return out;
}

TEST(CrossEntropyPieces, MatchTheWholeRowWithinRounding) {
  struct Case {
    std::int64_t rows, classes;
    int pieces;
  };
  for (const Case& c : {Case{3, 1, 1}, Case{4, 7, 7}, Case{5, 100, 3}, Case{6, 100, 1},
                        Case{2, 50257, 11}, Case{7, 33, 4}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.classes) + " in " +
                 std::to_string(c.pieces));
    const Problem p(c.rows, c.classes, 17);
    float whole_loss = 0;
    std::vector<float> whole(p.logits.size());
    cpu::cross_entropy_forward(CpuBody::kPortable, p.logits.data(), p.targets.data(), p.rows,
                               p.classes, &whole_loss);
    cpu::cross_entropy_backward(CpuBody::kPortable, p.logits.data(), p.targets.data(), p.rows,
                                p.classes, 1024.0f, whole.data());
    const ByPieces cut = by_pieces(CpuBody::kPortable, p, c.pieces, 1024.0f);
    EXPECT_NEAR(cut.loss, whole_loss, 2e-6 * std::abs(whole_loss) + 1e-7);
    const float step = 1024.0f / static_cast<float>(p.rows);
    for (std::size_t i = 0; i < whole.size(); ++i) {
      ASSERT_NEAR(cut.dlogits[i], whole[i], 2e-6 * step) << i;
    }
    for (CpuBody body : {CpuBody::kAvx2, CpuBody::kAvx512}) {
      if (!cpu_body_supported(body)) continue;
      const ByPieces other = by_pieces(body, p, c.pieces, 1024.0f);
      EXPECT_EQ(other.loss, cut.loss) << cpu_body_name(body);
      EXPECT_EQ(other.lse, cut.lse) << cpu_body_name(body);
      EXPECT_EQ(other.dlogits, cut.dlogits) << cpu_body_name(body);
    }
  }
}

TEST(CrossEntropyPieces, LargeLogitsStayFinite) {
  Problem p(3, 40, 5);
  for (float& x : p.logits) x *= 40.0f;  // spreads of thousands: exp overflows without the max
  const ByPieces cut = by_pieces(CpuBody::kPortable, p, 4, 1.0f);
  EXPECT_TRUE(std::isfinite(cut.loss));
  for (float g : cut.dlogits) ASSERT_TRUE(std::isfinite(g));
}

TEST(CrossEntropyPieces, ATargetOutsideTheClassesIsADataErrorAndBadPiecesUsageErrors) {
  Problem p(3, 10, 1);
  p.targets[2] = 10;
  std::vector<char> running(cross_entropy_running_bytes(p.rows));
  try {
    cpu::cross_entropy_piece_forward(CpuBody::kPortable, p.logits.data(), 10, p.targets.data(), 3,
                                     0, 5, 10, running.data());
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kData);
    EXPECT_NE(std::string(error.what()).find("row 2 is 10"), std::string::npos) << error.what();
  }
  std::vector<float> lse(3, 0.0f);
  for (auto bad : {std::vector<std::int64_t>{0, 0, 5, 10, 5}, {3, -1, 5, 10, 5},
                   {3, 6, 5, 10, 5}, {3, 0, 5, 10, 4}, {3, 0, 0, 10, 5}}) {
    EXPECT_THROW(cpu::cross_entropy_piece_forward(CpuBody::kPortable, p.logits.data(), bad[4],
                                                  p.targets.data(), bad[0], bad[1], bad[2], bad[3],
                                                  running.data()),
                 Error);
  }
  EXPECT_THROW(cpu::cross_entropy_piece_backward(CpuBody::kPortable, p.logits.data(), 5,
                                                 p.targets.data(), 3, 0, 5, lse.data(), 1.0f,
                                                 p.logits.data(), 4),
               Error);
}

}  // namespace
}  // namespace zest
