// qgZ at 4 bits (QuantizedReduceScatter with bits 4, engine/quantized_collectives.h) on the local
// backend against a float64 reference: the mean is within the bound its int4 quantization steps
// add up to (hierarchical on 2 x 2, 3 x 2, 2 x 3; one hop on 1 x 4 and 4 x 1; an odd shard and an
// odd block, so blocks share bytes), the bytes on the wire inside and across nodes are exactly
// the int4 packed sizes, a NaN still reaches its owner's mean, and gradient bits other than 8 or 4
// are refused naming the key.
#include "engine/quantized_collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "kernels/quantize.h"
#include "runtime/link_model.h"
#include "runtime/world.h"
#include "tests/engine/quantized_test_support.h"

namespace zest {
namespace {

constexpr int kBits = 4;
constexpr double kLevels = 7.0;
constexpr std::size_t kBlock = 63;
constexpr std::size_t kShard = 701;

// Rank r's values: normal, with a spread that differs per block so the scales differ.
std::vector<float> values_of(int rank, std::size_t count) {
  return quantized_support::block_values(200 + rank, count, kBlock, 5);
}

class QuantizedInt4ReduceScatterOn : public ::testing::TestWithParam<std::tuple<int, int>> {};

// Each rank's mean within the bound of quantized_support::reduce_scatter_bound (half a block
// scale, max|x| / 7, per int4 step the sum took), plus fp32 rounding of the sums: 1e-6 of the
// sum of |x|.
TEST_P(QuantizedInt4ReduceScatterOn, MeanIsWithinTheBoundOfItsInt4QuantizationSteps) {
  const auto [nodes, per_node] = GetParam();
  const int n = nodes * per_node;
  const quantized_support::ReduceScatterJob job{nodes, per_node, kShard, kBlock, kBits, 2,
                                                values_of};
  const quantized_support::ReduceScatterRun run = quantized_support::run_reduce_scatter(job);
  const int g = per_node;
  const int k = nodes;
  double worst = 0.0;  // the largest error as a share of its bound: the bound is not loose
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(run.grouped[r], g);
    const quantized_support::MeanBound sum =
        quantized_support::reduce_scatter_bound(job, run.inputs, r, kLevels);
    for (std::size_t i = 0; i < kShard; ++i) {
      const double mean = sum.exact[i] / n;
      const double allowed = (sum.bound[i] + 1e-6 * sum.magnitude[i]) / n;
      const double error = std::fabs(run.results[r][i] - mean);
      ASSERT_LE(error, allowed) << "element " << i;
      if (sum.bound[i] > 0.0) worst = std::max(worst, error / allowed);
    }
    // Bytes: step 1 sends k packed slices to each of g-1 ranks of the node, step 2 one packed
    // partial to each of k-1 nodes; twice. An int4 slice of 701 values in blocks of 63: 351
    // bytes of values padded to 352, then 12 scales.
    const double packed = static_cast<double>(quantized_bytes(kShard, kBlock, kBits));
    ASSERT_EQ(packed, 352.0 + 12 * 4);
    const int send = static_cast<int>(WireKind::kSend);
    EXPECT_DOUBLE_EQ(run.wire[r].intra_node[send], 2.0 * (g - 1) * k * packed);
    EXPECT_DOUBLE_EQ(run.wire[r].inter_node[send], 2.0 * (k - 1) * packed);
  }
  if (n > 1) {
    EXPECT_GT(worst, 0.2) << "int4 errors should reach a fair share of their bound";
  }
}

INSTANTIATE_TEST_SUITE_P(NodesByRanks, QuantizedInt4ReduceScatterOn,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(1, 4),
                                           std::make_tuple(2, 2), std::make_tuple(4, 1),
                                           std::make_tuple(3, 2), std::make_tuple(2, 3)),
                         quantized_support::nodes_by_ranks_name);

// The same reduction at 8 and 4 bits on 2 x 2: int4 sends a little more than half of int8's
// bytes (the same scales, half the values), inside the node and across it.
TEST(QuantizedInt4ReduceScatter, SendsAboutHalfOfInt8sBytes) {
  std::vector<double> inter(2), intra(2);
  for (int bits : {8, 4}) {
    const WireBytes sent =
        quantized_support::run_reduce_scatter({2, 2, 1024, 256, bits, 1, values_of}).wire[0];
    const int send = static_cast<int>(WireKind::kSend);
    inter[bits == 8 ? 0 : 1] = sent.inter_node[send];
    intra[bits == 8 ? 0 : 1] = sent.intra_node[send];
  }
  // Per 1024 values: int8 1024 + 4 scales of 4 bytes, int4 512 + 16.
  EXPECT_DOUBLE_EQ(inter[0], 1040.0);
  EXPECT_DOUBLE_EQ(inter[1], 528.0);
  EXPECT_DOUBLE_EQ(intra[0], 2 * 1040.0);
  EXPECT_DOUBLE_EQ(intra[1], 2 * 528.0);
}

TEST(QuantizedInt4ReduceScatter, ANanInOneRanksGradientReachesItsOwnersMean) {
  const auto values = [](int rank, std::size_t count) {
    std::vector<float> full = values_of(rank, count);
    if (rank == 3) full[1 * 101 + 5] = std::nanf("");  // in rank 1's slice
    return full;
  };
  const std::vector<std::vector<float>> results =
      quantized_support::run_reduce_scatter({2, 2, 101, kBlock, kBits, 1, values}).results;
  // Rank 1's block [0, 63) holds the NaN: NaN throughout; its other block and the other ranks'
  // shards stay finite.
  for (std::size_t i = 0; i < 63; ++i) EXPECT_TRUE(std::isnan(results[1][i])) << i;
  for (std::size_t i = 63; i < 101; ++i) EXPECT_TRUE(std::isfinite(results[1][i])) << i;
  for (int r : {0, 2, 3}) {
    for (float v : results[r]) ASSERT_TRUE(std::isfinite(v)) << r;
  }
}

TEST(QuantizedInt4ReduceScatter, GradientBitsOtherThanEightOrFourAreRefusedNamingTheKey) {
  EngineOptions options;
  options.stage = 2;
  options.quantized_gradients = true;
  for (int bits : {8, 4}) {
    options.quantized_gradient_bits = bits;
    EXPECT_NO_THROW(check_quantized_collectives(options)) << bits;
  }
  for (int bits : {0, 2, 16}) {
    options.quantized_gradient_bits = bits;
    try {
      check_quantized_collectives(options);
      ADD_FAILURE() << bits << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kConfig);
      EXPECT_EQ(std::string(error.what()),
                "zero_optimization.zero_quantized_gradients_bits must be 8 or 4, got " +
                    std::to_string(bits));
    }
  }
  options.quantized_gradients = false;  // unused without qgZ
  EXPECT_NO_THROW(check_quantized_collectives(options));
}

}  // namespace
}  // namespace zest
