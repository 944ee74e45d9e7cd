// ZeRO++'s quantized collectives (engine/quantized_collectives.h) on the local backend against a
// float64 reference: qwZ's gather gives every rank the same parameters, each within half its
// block's scale of the exact shard; qgZ's reduce-scatter (hierarchical on 2 x 2, 3 x 2, 2 x 3;
// one hop on 1 x 4 and 4 x 1) is within the bound its quantization steps add up to; both count
// int8 bytes on the wire, and qgZ's cross nodes only once, as node partial sums.
#include "engine/quantized_collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "kernels/quantize.h"
#include "memory/shard_layout.h"
#include "runtime/link_model.h"
#include "runtime/world.h"
#include "tests/engine/quantized_test_support.h"
#include "tests/support/nodes_world.h"

namespace zest {
namespace {

constexpr std::size_t kBlock = 64;

// Rank r's values: normal, with a spread that differs per block so the scales differ.
std::vector<float> values_of(int rank, std::size_t count) {
  return quantized_support::block_values(100 + rank, count, kBlock, 5);
}

// max|x| / 127 of x[first, first + count) cut into blocks of kBlock: the scale of each element.
std::vector<double> scales_of(const std::vector<double>& x, std::size_t first, std::size_t count) {
  return quantized_support::scales_of(x, first, count, kBlock, 127.0);
}

// A unit of one parameter whose shards are `shard` elements each, no padding: its blocks are
// the shard's blocks of kBlock.
ShardLayout one_parameter(std::size_t shard, int ranks) {
  return ShardLayout::build("unit", {{"values", {static_cast<std::int64_t>(shard) * ranks}}}, ranks,
                            /*alignment=*/4);
}

TEST(QuantizedGather, EveryRankGetsTheSameParametersWithinHalfAScaleOfEachShard) {
  constexpr std::size_t kShard = 1000;  // not a multiple of the block
  constexpr int kRanks = 4;
  std::mutex mutex;
  std::vector<std::vector<float>> gathered(kRanks);
  std::vector<WireBytes> wire(kRanks);
  World(testing::nodes_world(2, 2)).run([&](RankContext& context) {
    const std::vector<float> shard = values_of(context.rank, kShard);
    std::vector<float> full(kShard * kRanks, -1.0f);
    const ShardLayout layout = one_parameter(kShard, kRanks);
    QuantizedGather gather(context.device, {layout}, kBlock);
    const WireBytes before = context.wire->snapshot();
    gather.all_gather(context.communicator, context.comm, layout, shard.data(), full.data(),
                      DType::kFloat32);
    context.synchronize();
    std::lock_guard lock(mutex);
    gathered[context.rank] = full;
    wire[context.rank] = context.wire->snapshot() - before;
  });
  for (int rank = 1; rank < kRanks; ++rank) EXPECT_EQ(gathered[rank], gathered[0]) << rank;
  for (int owner = 0; owner < kRanks; ++owner) {
    const std::vector<float> exact = values_of(owner, kShard);
    const std::vector<double> wide(exact.begin(), exact.end());
    const std::vector<double> scale = scales_of(wide, 0, kShard);
    for (std::size_t i = 0; i < kShard; ++i) {
      const double error = std::fabs(wide[i] - gathered[0][owner * kShard + i]);
      // Half a scale, and 1e-5 of one for the fp32 products (kernels/quantize.h's test).
      ASSERT_LE(error, scale[i] * (0.5 + 1e-5)) << "rank " << owner << " element " << i;
    }
  }
  // The ring moves int8 values and the scales: (n-1)/n of n packed shards per rank, half of it
  // across the 2 nodes.
  const double packed = static_cast<double>(quantized_bytes(kShard, kBlock));
  const int kind = static_cast<int>(WireKind::kAllGather);
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_DOUBLE_EQ(wire[rank].intra_node[kind] + wire[rank].inter_node[kind], 3 * packed);
    EXPECT_DOUBLE_EQ(wire[rank].inter_node[kind], 1.5 * packed);
  }
}

TEST(QuantizedGather, TwoByteParametersComeBackInTheirType) {
  constexpr std::size_t kShard = 300;
  std::mutex mutex;
  std::vector<BFloat16> gathered;
  World(testing::nodes_world(1, 2)).run([&](RankContext& context) {
    std::vector<BFloat16> shard;
    for (float v : values_of(context.rank, kShard)) shard.emplace_back(v);
    std::vector<BFloat16> full(2 * kShard);
    const ShardLayout layout = one_parameter(kShard, 2);
    QuantizedGather gather(context.device, {layout}, kBlock);
    gather.all_gather(context.communicator, context.comm, layout, shard.data(), full.data(),
                      DType::kBFloat16);
    context.synchronize();
    std::lock_guard lock(mutex);
    if (context.rank == 1) gathered = full;
  });
  for (int owner = 0; owner < 2; ++owner) {
    std::vector<double> wide;
    for (float v : values_of(owner, kShard)) wide.push_back(static_cast<float>(BFloat16(v)));
    const std::vector<double> scale = scales_of(wide, 0, kShard);
    for (std::size_t i = 0; i < kShard; ++i) {
      const double back = static_cast<float>(gathered[owner * kShard + i]);
      // Half a scale, and the bf16 rounding of the dequantized value (2^-8 relative).
      ASSERT_LE(std::fabs(wide[i] - back), scale[i] * 0.50001 + std::fabs(back) * 0x1p-8) << i;
    }
  }
}

// A unit like a transformer block's start: a LayerNorm gain of about 1, weights of about 0.01, a
// bias of about 0.1; 2 ranks, alignment 4: 285 elements, padded to 288, shards of 144. Rank 0
// holds the gain and weight[0, 96), rank 1 weight[96, 200), the bias and 3 elements of padding.
ShardLayout mixed_unit() {
  return ShardLayout::build("mixed", {{"gain", {48}}, {"weight", {20, 10}}, {"bias", {37}}}, 2,
                            /*alignment=*/4);
}

std::vector<float> mixed_values(const ShardLayout& layout) {
  std::mt19937 generator(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> flat(layout.flat_length(), 0.0f);
  const float spread[] = {0.05f, 0.01f, 0.1f};
  const float centre[] = {1.0f, 0.0f, 0.0f};
  for (std::size_t p = 0; p < layout.params().size(); ++p) {
    const ParamPlace& param = layout.params()[p];
    for (std::size_t i = 0; i < param.numel; ++i) {
      flat[param.offset + i] = centre[p] + spread[p] * normal(generator);
    }
  }
  return flat;
}

TEST(QuantizedGather, RunsOfBlocksRestartAtEachParameterInsideAShard) {
  const ShardLayout layout = mixed_unit();
  const auto runs_of = [&](int rank) {
    std::vector<std::pair<std::size_t, std::size_t>> runs;
    for (const QuantizedRun& run : quantized_runs(layout, rank, kBlock)) {
      runs.emplace_back(run.first, run.count);
    }
    return runs;
  };
  using Runs = std::vector<std::pair<std::size_t, std::size_t>>;
  EXPECT_EQ(runs_of(0), (Runs{{0, 48}, {48, 96}}));
  EXPECT_EQ(runs_of(1), (Runs{{0, 104}, {104, 40}}));  // the padding joins the bias's run
  // Packed end to end: 48 + 4 and 96 + 2 x 4 on rank 0; 104 + 2 x 4 and 40 + 4 on rank 1.
  EXPECT_EQ(quantized_runs(layout, 0, kBlock)[1].packed, 52u);
  EXPECT_EQ(quantized_shard_bytes(layout, kBlock), 156u);
  EXPECT_EQ(quantized_gather_bytes({layout, one_parameter(1000, 2)}, kBlock),
            2 * quantized_bytes(1000, kBlock));
}

TEST(QuantizedGather, EachParameterIsWithinHalfAScaleOfItsOwnBlocks) {
  const ShardLayout layout = mixed_unit();
  const std::vector<float> exact = mixed_values(layout);
  const std::size_t shard = layout.shard_length();
  std::mutex mutex;
  std::vector<float> gathered;
  World(testing::nodes_world(1, 2)).run([&](RankContext& context) {
    std::vector<float> full(layout.flat_length(), -1.0f);
    QuantizedGather gather(context.device, {layout}, kBlock);
    gather.all_gather(context.communicator, context.comm, layout,
                      exact.data() + static_cast<std::size_t>(context.rank) * shard, full.data(),
                      DType::kFloat32);
    context.synchronize();
    std::lock_guard lock(mutex);
    if (context.rank == 0) gathered = full;
  });
  const std::vector<double> wide(exact.begin(), exact.end());
  for (int rank = 0; rank < 2; ++rank) {
    // The reference cut: at the shard's start and at each parameter's start inside it.
    std::vector<std::size_t> cuts = {rank * shard, (rank + 1) * shard};
    for (const ParamPlace& param : layout.params()) {
      if (param.offset > cuts[0] && param.offset < cuts[1]) cuts.push_back(param.offset);
    }
    std::sort(cuts.begin(), cuts.end());
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
      const std::vector<double> scale = scales_of(wide, cuts[c], cuts[c + 1] - cuts[c]);
      for (std::size_t i = 0; i < scale.size(); ++i) {
        const std::size_t at = cuts[c] + i;
        // Half a scale of the element's own parameter's block: the weights' error stays near
        // 0.01 / 254, where a block shared with the gain would allow 1 / 254.
        ASSERT_LE(std::fabs(wide[at] - gathered[at]), scale[i] * (0.5 + 1e-5)) << "element " << at;
      }
    }
  }
}

class QuantizedReduceScatterOn : public ::testing::TestWithParam<std::tuple<int, int>> {};

// Each rank's mean within the bound of quantized_support::reduce_scatter_bound (half a block
// scale per int8 step the sum took), plus fp32 rounding of the sums: 1e-6 of the sum of |x|.
TEST_P(QuantizedReduceScatterOn, MeanIsWithinTheBoundOfItsQuantizationSteps) {
  const auto [nodes, per_node] = GetParam();
  const int n = nodes * per_node;
  constexpr std::size_t kShard = 700;
  const quantized_support::ReduceScatterJob job{nodes, per_node, kShard, kBlock, 8, 2, values_of};
  const quantized_support::ReduceScatterRun run = quantized_support::run_reduce_scatter(job);
  const int g = per_node;
  const int k = nodes;
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(run.grouped[r], g);
    const quantized_support::MeanBound sum =
        quantized_support::reduce_scatter_bound(job, run.inputs, r, 127.0);
    for (std::size_t i = 0; i < kShard; ++i) {
      const double mean = sum.exact[i] / n;
      const double allowed = (sum.bound[i] + 1e-6 * sum.magnitude[i]) / n;
      ASSERT_LE(std::fabs(run.results[r][i] - mean), allowed) << "element " << i;
    }
    // Bytes: step 1 sends k packed slices to each of g-1 ranks of the node, step 2 one packed
    // partial to each of k-1 nodes; twice.
    const double packed = static_cast<double>(quantized_bytes(kShard, kBlock));
    const int send = static_cast<int>(WireKind::kSend);
    EXPECT_DOUBLE_EQ(run.wire[r].intra_node[send], 2.0 * (g - 1) * k * packed);
    EXPECT_DOUBLE_EQ(run.wire[r].inter_node[send], 2.0 * (k - 1) * packed);
  }
}

INSTANTIATE_TEST_SUITE_P(NodesByRanks, QuantizedReduceScatterOn,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(1, 4),
                                           std::make_tuple(2, 2), std::make_tuple(4, 1),
                                           std::make_tuple(3, 2), std::make_tuple(2, 3)),
                         quantized_support::nodes_by_ranks_name);

TEST(QuantizedReduceScatter, ANanInOneRanksGradientReachesItsOwnersMean) {
  const auto values = [](int rank, std::size_t count) {
    std::vector<float> full = values_of(rank, count);
    if (rank == 3) full[1 * 100 + 5] = std::nanf("");  // in rank 1's slice
    return full;
  };
  const std::vector<std::vector<float>> results =
      quantized_support::run_reduce_scatter({2, 2, 100, kBlock, 8, 1, values}).results;
  EXPECT_TRUE(std::isnan(results[1][5]));
  for (int r : {0, 2, 3}) {
    for (float v : results[r]) ASSERT_TRUE(std::isfinite(v)) << r;
  }
}

TEST(QuantizedCollectives, RefusesWhatTheyDoNotServeInOneLineNamingTheKey) {
  EngineOptions options;
  options.quantized_weights = true;
  options.stage = 2;
  try {
    check_quantized_collectives(options);
    FAIL() << "qwZ at stage 2 accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_EQ(std::string(error.what()),
              "zero_optimization.zero_quantized_weights needs zero_optimization.stage 3 (got 2): "
              "only stage 3 gathers parameters before each use");
  }
  options = EngineOptions{};
  options.quantized_gradients = true;
  EXPECT_THROW(check_quantized_collectives(options), Error);  // stage 0
  options.stage = 3;
  EXPECT_NO_THROW(check_quantized_collectives(options));
  options.quantization_block = 0;
  EXPECT_THROW(check_quantized_collectives(options), Error);
}

}  // namespace
}  // namespace zest
