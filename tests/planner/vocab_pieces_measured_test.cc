// ctest-labels: slow
// The vocabulary pieces at the narrow shape, trained: 6 layers x 384, vocabulary 50257,
// 4 sequences of 64 (and of 256, with the logits by pieces) per rank on 4 ranks, stage 3, fp32
// AdamW, "auto" pieces (11): every category's measured peak per rank equals the plan to the byte
// (the planner's bounds at this shape are in vocab_pieces_plan_test.cc).
#include <gtest/gtest.h>

#include "tests/planner/vocab_pieces_support.h"

namespace zest {
namespace {

TEST(VocabPiecesMeasured, SixLayersOf384AtStage3EqualThePlanToTheByte) {
  pieces_support::expect_measured_equals_planned(GptConfig{6, 6, 384, 50257, 64, kAutoVocabPieces},
                                                 4, 4, DType::kFloat32, 1);
}

// At seq 256 the [N, V] logits decide the peak: with the logits by pieces the head keeps a
// log-sum-exp per row and each piece's logits are scratch (the bounds: vocab_pieces_plan_test.cc).
TEST(VocabPiecesMeasured, SixLayersOf384WithLogitsByPiecesEqualThePlanToTheByte) {
  pieces_support::expect_measured_equals_planned(
      GptConfig{6, 6, 384, 50257, 64, kAutoVocabPieces, true}, 4, 4, DType::kFloat32, 1);
}

TEST(VocabPiecesMeasured, SixLayersOf384AtSeq256WithLogitsByPiecesEqualThePlanToTheByte) {
  pieces_support::expect_measured_equals_planned(
      GptConfig{6, 6, 384, 50257, 256, kAutoVocabPieces, true}, 4, 4, DType::kFloat32, 1);
}

}  // namespace
}  // namespace zest
