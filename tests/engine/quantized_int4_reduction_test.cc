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
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "kernels/quantize.h"
#include "runtime/link_model.h"
#include "runtime/world.h"

namespace zest {
namespace {

constexpr int kBits = 4;
constexpr double kLevels = 7.0;
constexpr std::size_t kBlock = 63;
constexpr std::size_t kShard = 701;

// Rank r's values: normal, with a spread that differs per block so the scales differ.
std::vector<float> values_of(int rank, std::size_t count) {
  std::mt19937 generator(200 + rank);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    values[i] = normal(generator) * static_cast<float>(1 + (i / kBlock) % 5);
  }
  return values;
}

// max|x| / 7 of x[first, first + count) cut into blocks of kBlock: the scale of each element.
std::vector<double> scales_of(const std::vector<double>& x, std::size_t first, std::size_t count) {
  std::vector<double> scales(count);
  for (std::size_t begin = 0; begin < count; begin += kBlock) {
    const std::size_t end = std::min(count, begin + kBlock);
    double largest = 0.0;
    for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(x[first + i]));
    for (std::size_t i = begin; i < end; ++i) scales[i] = largest / kLevels;
  }
  return scales;
}

WorldOptions world_of(int nodes, int per_node) {
  WorldOptions options;
  options.ranks = nodes * per_node;
  options.ranks_per_node = per_node;
  options.link.modelled = false;
  return options;
}

class QuantizedInt4ReduceScatterOn : public ::testing::TestWithParam<std::tuple<int, int>> {};

// The error bound of rank r's mean, element by element, from how the sum was made: every slice
// that crossed to r inside its node carries half its block's scale (max|x| / 7); every other
// node's partial sum carries half the scale of its own blocks (whose max grows by at most the
// errors in it) plus the errors of its node's slices. Plus fp32 rounding of the sums: 1e-6 of the
// sum of |x|. The 1e-5 of a scale covers the fp32 products feeding and leaving the rounding
// (tests/kernels/quantize_int4_test.cc).
TEST_P(QuantizedInt4ReduceScatterOn, MeanIsWithinTheBoundOfItsInt4QuantizationSteps) {
  const auto [nodes, per_node] = GetParam();
  const int n = nodes * per_node;
  std::mutex mutex;
  std::vector<std::vector<float>> results(n);
  std::vector<WireBytes> wire(n);
  std::vector<int> grouped(n);
  World(world_of(nodes, per_node)).run([&](RankContext& context) {
    const std::vector<float> full = values_of(context.rank, kShard * n);
    QuantizedReduceScatter reduce(context.device, context.communicator, context.topology, kShard,
                                  kBlock, kBits);
    std::vector<float> result(kShard);
    const WireBytes before = context.wire->snapshot();
    for (int call = 0; call < 2; ++call) {  // the second reuses the buffers
      reduce.reduce_scatter(context.comm, full.data(), DType::kFloat32, kShard, "test");
      context.device.copy(context.comm, result.data(), reduce.result(), kShard * sizeof(float));
    }
    context.synchronize();
    std::lock_guard lock(mutex);
    results[context.rank] = result;
    wire[context.rank] = context.wire->snapshot() - before;
    grouped[context.rank] = reduce.ranks_per_node();
  });
  const int g = per_node;
  const int k = nodes;
  std::vector<std::vector<double>> x(n);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> v = values_of(r, kShard * n);
    x[r].assign(v.begin(), v.end());
  }
  double worst = 0.0;  // the largest error as a share of its bound: the bound is not loose
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(grouped[r], g);
    const int a = r / g;
    const int l = r % g;
    const std::size_t first = static_cast<std::size_t>(r) * kShard;
    std::vector<double> exact(kShard, 0.0), bound(kShard, 0.0), magnitude(kShard, 0.0);
    for (int b = 0; b < k; ++b) {
      std::vector<double> partial(kShard, 0.0), carried(kShard, 0.0);
      for (int peer = 0; peer < g; ++peer) {
        const int source = b * g + peer;
        const std::vector<double> scale = scales_of(x[source], first, kShard);
        for (std::size_t i = 0; i < kShard; ++i) {
          partial[i] += x[source][first + i];
          magnitude[i] += std::fabs(x[source][first + i]);
          if (peer != l) carried[i] += scale[i] * (0.5 + 1e-5);
        }
      }
      std::vector<double> crossing(kShard, 0.0);
      if (b != a) {  // the partial was quantized again: its block max may have grown by carried
        for (std::size_t begin = 0; begin < kShard; begin += kBlock) {
          double largest = 0.0;
          for (std::size_t i = begin; i < std::min(kShard, begin + kBlock); ++i) {
            largest = std::max(largest, std::fabs(partial[i]) + carried[i]);
          }
          for (std::size_t i = begin; i < std::min(kShard, begin + kBlock); ++i) {
            crossing[i] = largest / kLevels * (0.5 + 1e-5);
          }
        }
      }
      for (std::size_t i = 0; i < kShard; ++i) {
        exact[i] += partial[i];
        bound[i] += carried[i] + crossing[i];
      }
    }
    for (std::size_t i = 0; i < kShard; ++i) {
      const double mean = exact[i] / n;
      const double allowed = (bound[i] + 1e-6 * magnitude[i]) / n;
      const double error = std::fabs(results[r][i] - mean);
      ASSERT_LE(error, allowed) << "element " << i;
      if (bound[i] > 0.0) worst = std::max(worst, error / allowed);
    }
    // Bytes: step 1 sends k packed slices to each of g-1 ranks of the node, step 2 one packed
    // partial to each of k-1 nodes; twice. An int4 slice of 701 values in blocks of 63: 351
    // bytes of values padded to 352, then 12 scales.
    const double packed = static_cast<double>(quantized_bytes(kShard, kBlock, kBits));
    ASSERT_EQ(packed, 352.0 + 12 * 4);
    const int send = static_cast<int>(WireKind::kSend);
    EXPECT_DOUBLE_EQ(wire[r].intra_node[send], 2.0 * (g - 1) * k * packed);
    EXPECT_DOUBLE_EQ(wire[r].inter_node[send], 2.0 * (k - 1) * packed);
  }
  if (n > 1) {
    EXPECT_GT(worst, 0.2) << "int4 errors should reach a fair share of their bound";
  }
}

INSTANTIATE_TEST_SUITE_P(NodesByRanks, QuantizedInt4ReduceScatterOn,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(1, 4),
                                           std::make_tuple(2, 2), std::make_tuple(4, 1),
                                           std::make_tuple(3, 2), std::make_tuple(2, 3)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "x" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The same reduction at 8 and 4 bits on 2 x 2: int4 sends a little more than half of int8's
// bytes (the same scales, half the values), inside the node and across it.
TEST(QuantizedInt4ReduceScatter, SendsAboutHalfOfInt8sBytes) {
  std::vector<double> inter(2), intra(2);
  for (int bits : {8, 4}) {
    std::mutex mutex;
    World(world_of(2, 2)).run([&](RankContext& context) {
      const std::vector<float> full = values_of(context.rank, 4 * 1024);
      QuantizedReduceScatter reduce(context.device, context.communicator, context.topology, 1024,
                                    256, bits);
      const WireBytes before = context.wire->snapshot();
      reduce.reduce_scatter(context.comm, full.data(), DType::kFloat32, 1024, "test");
      context.synchronize();
      const WireBytes sent = context.wire->snapshot() - before;
      std::lock_guard lock(mutex);
      if (context.rank != 0) return;
      const int send = static_cast<int>(WireKind::kSend);
      inter[bits == 8 ? 0 : 1] = sent.inter_node[send];
      intra[bits == 8 ? 0 : 1] = sent.intra_node[send];
    });
  }
  // Per 1024 values: int8 1024 + 4 scales of 4 bytes, int4 512 + 16.
  EXPECT_DOUBLE_EQ(inter[0], 1040.0);
  EXPECT_DOUBLE_EQ(inter[1], 528.0);
  EXPECT_DOUBLE_EQ(intra[0], 2 * 1040.0);
  EXPECT_DOUBLE_EQ(intra[1], 2 * 528.0);
}

TEST(QuantizedInt4ReduceScatter, ANanInOneRanksGradientReachesItsOwnersMean) {
  std::mutex mutex;
  std::vector<std::vector<float>> results(4);
  World(world_of(2, 2)).run([&](RankContext& context) {
    std::vector<float> full = values_of(context.rank, 4 * 101);
    if (context.rank == 3) full[1 * 101 + 5] = std::nanf("");  // in rank 1's slice
    QuantizedReduceScatter reduce(context.device, context.communicator, context.topology, 101,
                                  kBlock, kBits);
    reduce.reduce_scatter(context.comm, full.data(), DType::kFloat32, 101, "test");
    std::vector<float> result(101);
    context.device.copy(context.comm, result.data(), reduce.result(), sizeof(float) * 101);
    context.synchronize();
    std::lock_guard lock(mutex);
    results[context.rank] = result;
  });
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
