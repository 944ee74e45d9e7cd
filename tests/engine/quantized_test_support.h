// Shared by the quantized-collective suites (qwZ's gather, qgZ's reduce-scatter at 8 and 4 bits,
// the replicas' mean at 8 and 4 bits): each rank's values with a spread that differs per block,
// the block scales of a float64 reference, and qgZ's reduce-scatter and the replicas' mean run on
// every rank beside the error bounds their quantization steps add up to. The bound is computed apart from the kernels, in float64: a test
// holds each rank's mean to it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "engine/quantized_collectives.h"
#include "engine/quantized_replicas.h"
#include "runtime/hybrid_communicator.h"
#include "runtime/link_model.h"
#include "runtime/world.h"
#include "tests/support/nodes_world.h"

namespace zest::quantized_support {

// A (nodes, ranks a node) test parameter's name: "2x3".
inline std::string nodes_by_ranks_name(const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
  return std::to_string(std::get<0>(info.param)) + "x" + std::to_string(std::get<1>(info.param));
}

// Normal values from `seed`, the spread 1 + (block index mod `spreads`) in blocks of `block`, so
// the blocks' scales differ.
inline std::vector<float> block_values(std::uint32_t seed, std::size_t count, std::size_t block,
                                       int spreads) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    values[i] = normal(generator) * static_cast<float>(1 + (i / block) % spreads);
  }
  return values;
}

// max|x| / levels of x[first, first + count) cut into blocks of `block`: the scale of each
// element (levels 127 for int8, 7 for int4).
inline std::vector<double> scales_of(const std::vector<double>& x, std::size_t first,
                                     std::size_t count, std::size_t block, double levels) {
  std::vector<double> scales(count);
  for (std::size_t begin = 0; begin < count; begin += block) {
    const std::size_t end = std::min(count, begin + block);
    double largest = 0.0;
    for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(x[first + i]));
    for (std::size_t i = begin; i < end; ++i) scales[i] = largest / levels;
  }
  return scales;
}

struct ReduceScatterJob {
  int nodes = 1;
  int per_node = 1;
  std::size_t shard = 0;
  std::size_t block = 0;
  int bits = 8;
  int calls = 2;  // calls after the first reuse the buffers
  // A rank's full gradient of `count` = ranks x shard values.
  std::function<std::vector<float>(int rank, std::size_t count)> values;
};

struct ReduceScatterRun {
  std::vector<std::vector<double>> inputs;  // per rank, its full gradient in float64
  std::vector<std::vector<float>> results;  // per rank, its mean after the last call
  std::vector<WireBytes> wire;              // per rank, over all calls
  std::vector<int> grouped;                 // per rank, ranks_per_node() of its reduce-scatter
};

// Every rank's gradient through `job.calls` calls of qgZ's reduce-scatter over the world.
inline ReduceScatterRun run_reduce_scatter(const ReduceScatterJob& job) {
  const int n = job.nodes * job.per_node;
  ReduceScatterRun run{std::vector<std::vector<double>>(n), std::vector<std::vector<float>>(n),
                       std::vector<WireBytes>(n), std::vector<int>(n)};
  std::mutex mutex;
  World(testing::nodes_world(job.nodes, job.per_node)).run([&](RankContext& context) {
    const std::vector<float> full = job.values(context.rank, job.shard * n);
    QuantizedReduceScatter reduce(context.device, context.communicator, context.topology,
                                  job.shard, job.block, job.bits);
    std::vector<float> result(job.shard);
    const WireBytes before = context.wire->snapshot();
    for (int call = 0; call < job.calls; ++call) {
      reduce.reduce_scatter(context.comm, full.data(), DType::kFloat32, job.shard, "test");
      context.device.copy(context.comm, result.data(), reduce.result(),
                          job.shard * sizeof(float));
    }
    context.synchronize();
    std::lock_guard lock(mutex);
    run.inputs[context.rank].assign(full.begin(), full.end());
    run.results[context.rank] = result;
    run.wire[context.rank] = context.wire->snapshot() - before;
    run.grouped[context.rank] = reduce.ranks_per_node();
  });
  return run;
}

// Rank r's slice of the exact sum, the error bound of that sum, and the sum of |x| (for fp32
// rounding), element by element, from how qgZ makes the sum: every slice that crossed to r inside
// its node carries half its block's scale; every other node's partial sum carries half the scale
// of its own blocks (whose max grows by at most the errors in it) plus the errors of its node's
// slices. Each half scale is widened by 1e-5 of a scale for the fp32 products feeding and leaving
// the rounding (tests/kernels/quantize_test.cc, quantize_int4_test.cc).
struct MeanBound {
  std::vector<double> exact;
  std::vector<double> bound;
  std::vector<double> magnitude;
};

inline MeanBound reduce_scatter_bound(const ReduceScatterJob& job,
                                      const std::vector<std::vector<double>>& x, int r,
                                      double levels) {
  const int g = job.per_node;
  const int k = job.nodes;
  const std::size_t shard = job.shard;
  const std::size_t block = job.block;
  const int a = r / g;
  const int l = r % g;
  const std::size_t first = static_cast<std::size_t>(r) * shard;
  MeanBound mean{std::vector<double>(shard, 0.0), std::vector<double>(shard, 0.0),
                 std::vector<double>(shard, 0.0)};
  for (int b = 0; b < k; ++b) {
    std::vector<double> partial(shard, 0.0), carried(shard, 0.0);
    for (int peer = 0; peer < g; ++peer) {
      const int source = b * g + peer;
      const std::vector<double> scale = scales_of(x[source], first, shard, block, levels);
      for (std::size_t i = 0; i < shard; ++i) {
        partial[i] += x[source][first + i];
        mean.magnitude[i] += std::fabs(x[source][first + i]);
        if (peer != l) carried[i] += scale[i] * (0.5 + 1e-5);
      }
    }
    std::vector<double> crossing(shard, 0.0);
    if (b != a) {  // the partial was quantized again: its block max may have grown by carried
      for (std::size_t begin = 0; begin < shard; begin += block) {
        double largest = 0.0;
        for (std::size_t i = begin; i < std::min(shard, begin + block); ++i) {
          largest = std::max(largest, std::fabs(partial[i]) + carried[i]);
        }
        for (std::size_t i = begin; i < std::min(shard, begin + block); ++i) {
          crossing[i] = largest / levels * (0.5 + 1e-5);
        }
      }
    }
    for (std::size_t i = 0; i < shard; ++i) {
      mean.exact[i] += partial[i];
      mean.bound[i] += carried[i] + crossing[i];
    }
  }
  return mean;
}

struct ReplicaMeanJob {
  int nodes = 1;     // R: the replicas, one a node
  int per_node = 1;  // the shard group, a node
  std::size_t count = 0;
  std::size_t block = 0;
  int bits = 8;
  // Rank r's shard of `count` values.
  std::function<std::vector<float>(int rank, std::size_t count)> values;
};

struct ReplicaMeanRun {
  std::vector<std::vector<float>> results;  // per rank
  std::vector<WireBytes> wire;              // per rank, over both calls
};

// Every rank's shard through two calls (the second reuses the buffers) of the mean over its
// replica group, the shard groups being the nodes.
inline ReplicaMeanRun run_replica_mean(const ReplicaMeanJob& job) {
  const int n = job.nodes * job.per_node;
  ReplicaMeanRun run{std::vector<std::vector<float>>(n), std::vector<WireBytes>(n)};
  std::mutex mutex;
  World(testing::nodes_world(job.nodes, job.per_node)).run([&](RankContext& context) {
    HybridCommunicator hybrid(context.communicator, job.per_node);
    const std::vector<float> input = job.values(context.rank, job.count);
    QuantizedReplicaMean mean(context.device, hybrid.replica(), job.count, job.block, job.bits);
    std::vector<float> data(job.count);
    const WireBytes before = context.wire->snapshot();
    for (int call = 0; call < 2; ++call) {
      context.device.copy(context.comm, data.data(), input.data(), job.count * sizeof(float));
      mean.mean(context.comm, data.data(), job.count, "test");
    }
    context.synchronize();
    std::lock_guard lock(mutex);
    run.results[context.rank] = data;
    run.wire[context.rank] = context.wire->snapshot() - before;
  });
  return run;
}

// The exact mean of slice `owner` (slice = ceil(count / R) elements, owned by replica `owner`) of
// the replicas' shards `x`, and each element's error bound, from how the mean is made: every
// other replica's values crossed quantized, half a scale of their block each; the sum over R
// replicas is divided by R, then quantized once more, half a scale of the mean's block (whose max
// grows by at most the errors already in it). Plus fp32 rounding of the sum: 1e-6 of the sum of
// |x|, over R. Each half scale is widened by 1e-5 of a scale, as reduce_scatter_bound's.
inline MeanBound replica_mean_bound(const std::vector<std::vector<double>>& x, int owner,
                                    std::size_t slice, std::size_t count, std::size_t block,
                                    double levels) {
  const int replicas = static_cast<int>(x.size());
  const std::size_t first = std::min(count, static_cast<std::size_t>(owner) * slice);
  const std::size_t length = std::min(slice, count - first);
  MeanBound mean{std::vector<double>(length, 0.0), std::vector<double>(length, 0.0),
                 std::vector<double>(length, 0.0)};
  for (int p = 0; p < replicas; ++p) {
    const std::vector<double> scale = scales_of(x[p], first, length, block, levels);
    for (std::size_t i = 0; i < length; ++i) {
      mean.exact[i] += x[p][first + i] / replicas;
      mean.magnitude[i] += std::fabs(x[p][first + i]) / replicas;
      if (p != owner) mean.bound[i] += scale[i] * (0.5 + 1e-5) / replicas;
    }
  }
  std::vector<double> carried = mean.bound;
  for (std::size_t i = 0; i < length; ++i) carried[i] += 1e-6 * mean.magnitude[i];
  for (std::size_t begin = 0; begin < length; begin += block) {
    const std::size_t end = std::min(length, begin + block);
    double largest = 0.0;
    for (std::size_t i = begin; i < end; ++i) {
      largest = std::max(largest, std::fabs(mean.exact[i]) + carried[i]);
    }
    for (std::size_t i = begin; i < end; ++i) {
      mean.bound[i] = carried[i] + largest / levels * (0.5 + 1e-5);
    }
  }
  return mean;
}

}  // namespace zest::quantized_support
