// The `local` communicator, driven through a World the way the engine drives it: every
// collective against a serial reference computed here, in place and out of place, fp32 and bf16,
// odd counts; matching by host order across streams. The failure paths live in
// local_communicator_failures_test.cc.
#include "runtime/local_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/world.h"
#include "tests/runtime/local_world_support.h"

namespace zest {
namespace {

using std::chrono::milliseconds;
using testing::capture_error;
using testing::run_world;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

constexpr int kWorldSizes[] = {1, 2, 3, 4, 8};
constexpr std::size_t kCounts[] = {1, 7, 1000, 65537};


// ---- element types ---------------------------------------------------------------------------

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::kFloat32;
  } else {
    return DType::kBFloat16;
  }
}

float to_float(float value) { return value; }
float to_float(BFloat16 value) { return static_cast<float>(value); }
template <typename T>
T from_float(float value) {
  return T(value);
}
std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }
std::uint32_t bits_of(BFloat16 value) { return value.bits; }

// A value for element `i` of rank `rank`'s input: fractions that are not exactly representable
// and magnitudes that differ by rank, so that the order and precision of a sum show in its bits.
float input_value(int rank, std::size_t i) {
  std::uint64_t h = (static_cast<std::uint64_t>(rank) + 1) * 0x9e3779b97f4a7c15ull ^
                    (static_cast<std::uint64_t>(i) + 7) * 0xc2b2ae3d27d4eb4full;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  const float unit = static_cast<float>(static_cast<std::int64_t>(h % 2000003) - 1000001) / 9973.0f;
  return unit * static_cast<float>(1 + rank % 3);
}

template <typename T>
std::vector<T> rank_input(int rank, std::size_t count, std::size_t salt = 0) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = from_float<T>(input_value(rank, i + salt));
  return values;
}

// The reduction of element `index` of every rank's input, as the contract states it: in rank
// order, accumulated in float32, rounded to T once.
template <typename T>
T reference_reduce(const std::vector<std::vector<T>>& inputs, std::size_t index,
                   Reduction reduction) {
  const float world = static_cast<float>(inputs.size());
  float accumulator = 0.0f;
  for (std::size_t r = 0; r < inputs.size(); ++r) {
    float value = to_float(inputs[r][index]);
    if (reduction == Reduction::kPreDividedMean) value /= world;
    accumulator = r == 0 ? value : accumulator + value;
  }
  if (reduction == Reduction::kMean) accumulator /= world;
  return from_float<T>(accumulator);
}

// Compares bit for bit and reports the first difference (one failure, not a million).
template <typename T>
void expect_bits_equal(const std::vector<T>& actual, const std::vector<T>& expected,
                       const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::size_t mismatches = 0, first = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (bits_of(actual[i]) != bits_of(expected[i])) {
      if (mismatches++ == 0) first = i;
    }
  }
  EXPECT_EQ(mismatches, 0u) << what << ": first at element " << first << ": got "
                            << to_float(actual[first]) << ", want " << to_float(expected[first]);
}

const char* reduction_label(Reduction reduction) {
  switch (reduction) {
    case Reduction::kSum: return "sum";
    case Reduction::kMean: return "mean";
    case Reduction::kPreDividedMean: return "pre-divided mean";
  }
  return "?";
}

std::string trace(int ranks, std::size_t count, const char* dtype, const std::string& extra = "") {
  return std::to_string(ranks) + " ranks, count " + std::to_string(count) + ", " + dtype +
         (extra.empty() ? "" : ", " + extra);
}

// ---- all_gather ------------------------------------------------------------------------------

template <typename T>
void check_all_gather(int ranks, std::size_t count, bool in_place) {
  SCOPED_TRACE(trace(ranks, count, dtype_name(dtype_of<T>()), in_place ? "in place" : ""));
  std::vector<std::vector<T>> inputs(ranks), outputs(ranks);
  std::vector<T> expected;
  for (int r = 0; r < ranks; ++r) {
    inputs[r] = rank_input<T>(r, count);
    expected.insert(expected.end(), inputs[r].begin(), inputs[r].end());
    outputs[r].assign(ranks * count, from_float<T>(-12345.0f));  // stale contents
    if (in_place) std::copy(inputs[r].begin(), inputs[r].end(), outputs[r].begin() + r * count);
  }
  run_world(ranks, [&](RankContext& context) {
    const int r = context.rank;
    const T* send = in_place ? outputs[r].data() + r * count : inputs[r].data();
    context.communicator.all_gather(context.comm, send, outputs[r].data(), count, dtype_of<T>());
  });
  for (int r = 0; r < ranks; ++r) expect_bits_equal(outputs[r], expected, "rank " + std::to_string(r));
}

TEST(LocalCommunicator, AllGatherConcatenatesEveryRanksShardInRankOrder) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : kCounts) check_all_gather<float>(ranks, count, false);
  }
}

TEST(LocalCommunicator, AllGatherInPlaceRebuildsTheFullBuffer) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : kCounts) check_all_gather<float>(ranks, count, true);
  }
}

TEST(LocalCommunicator, AllGatherMovesBf16Unchanged) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
      check_all_gather<BFloat16>(ranks, count, false);
      check_all_gather<BFloat16>(ranks, count, true);
    }
  }
}

// ---- reduce_scatter --------------------------------------------------------------------------

template <typename T>
void check_reduce_scatter(int ranks, std::size_t count, Reduction reduction, bool in_place) {
  SCOPED_TRACE(trace(ranks, count, dtype_name(dtype_of<T>()),
                     std::string(reduction_label(reduction)) + (in_place ? ", in place" : "")));
  std::vector<std::vector<T>> inputs(ranks), outputs(ranks);
  for (int r = 0; r < ranks; ++r) {
    inputs[r] = rank_input<T>(r, ranks * count);
    outputs[r].assign(count, from_float<T>(-12345.0f));
  }
  const std::vector<std::vector<T>> original = inputs;  // in place overwrites the inputs
  run_world(ranks, [&](RankContext& context) {
    const int r = context.rank;
    T* recv = in_place ? inputs[r].data() + r * count : outputs[r].data();
    context.communicator.reduce_scatter(context.comm, inputs[r].data(), recv, count,
                                        dtype_of<T>(), reduction);
  });
  for (int r = 0; r < ranks; ++r) {
    std::vector<T> expected(count);
    for (std::size_t i = 0; i < count; ++i) {
      expected[i] = reference_reduce(original, r * count + i, reduction);
    }
    std::vector<T> actual = in_place ? std::vector<T>(inputs[r].begin() + r * count,
                                                      inputs[r].begin() + (r + 1) * count)
                                     : outputs[r];
    expect_bits_equal(actual, expected, "rank " + std::to_string(r));
    if (in_place) {
      // Only the rank's own slice of its input changes.
      std::vector<T> rest(inputs[r].begin(), inputs[r].begin() + r * count);
      rest.insert(rest.end(), inputs[r].begin() + (r + 1) * count, inputs[r].end());
      std::vector<T> rest_before(original[r].begin(), original[r].begin() + r * count);
      rest_before.insert(rest_before.end(), original[r].begin() + (r + 1) * count,
                         original[r].end());
      expect_bits_equal(rest, rest_before, "rank " + std::to_string(r) + " outside its slice");
    }
  }
}

TEST(LocalCommunicator, ReduceScatterSumLeavesEachRankItsReducedSlice) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : kCounts) {
      check_reduce_scatter<float>(ranks, count, Reduction::kSum, false);
    }
  }
}

TEST(LocalCommunicator, ReduceScatterMeanDividesTheSumByTheWorldSize) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : kCounts) {
      check_reduce_scatter<float>(ranks, count, Reduction::kMean, false);
    }
  }
}

TEST(LocalCommunicator, ReduceScatterPreDividedMeanDividesEachInputFirst) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : kCounts) {
      check_reduce_scatter<float>(ranks, count, Reduction::kPreDividedMean, false);
    }
  }
}

TEST(LocalCommunicator, ReduceScatterInPlaceWritesOnlyTheOwnSlice) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{65537}}) {
      for (Reduction reduction : {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean}) {
        check_reduce_scatter<float>(ranks, count, reduction, true);
      }
    }
  }
}

TEST(LocalCommunicator, ReduceScatterBf16AccumulatesInFloatAndRoundsOnce) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
      for (Reduction reduction : {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean}) {
        check_reduce_scatter<BFloat16>(ranks, count, reduction, false);
      }
      check_reduce_scatter<BFloat16>(ranks, count, Reduction::kSum, true);
    }
  }
}

TEST(LocalCommunicator, Bf16SumIsNotARunningBf16Sum) {
  // Guards the "round once" rule with a case where rounding after every addition differs:
  // 1 + 2^-8 + 2^-8 is 1 + 2^-7 in float, which bf16 (7 stored mantissa bits) holds exactly;
  // rounding to bf16 after each step makes each 1 + 2^-8 a tie that rounds back to 1.
  constexpr int kRanks = 3;
  std::vector<std::vector<BFloat16>> inputs = {
      {BFloat16(1.0f)}, {BFloat16(1.0f / 256)}, {BFloat16(1.0f / 256)}};
  std::vector<std::vector<BFloat16>> outputs(kRanks, std::vector<BFloat16>(1));
  std::vector<std::vector<BFloat16>> sends(kRanks);
  for (int r = 0; r < kRanks; ++r) sends[r].assign(kRanks, inputs[r][0]);
  run_world(kRanks, [&](RankContext& context) {
    context.communicator.reduce_scatter(context.comm, sends[context.rank].data(),
                                        outputs[context.rank].data(), 1, DType::kBFloat16,
                                        Reduction::kSum);
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(static_cast<float>(outputs[r][0]), 1.0f + 1.0f / 128) << "rank " << r;
  }
}

TEST(LocalCommunicator, ReduceScatterOfAMillionOddElements) {
  constexpr std::size_t kCount = 1000003;
  check_reduce_scatter<float>(3, kCount, Reduction::kSum, false);
  check_reduce_scatter<BFloat16>(2, kCount, Reduction::kPreDividedMean, true);
  check_all_gather<float>(3, kCount, true);
}

// ---- all_reduce ------------------------------------------------------------------------------

template <typename T>
void check_all_reduce(int ranks, std::size_t count, Reduction reduction, bool in_place) {
  SCOPED_TRACE(trace(ranks, count, dtype_name(dtype_of<T>()),
                     std::string(reduction_label(reduction)) + (in_place ? ", in place" : "")));
  std::vector<std::vector<T>> inputs(ranks), outputs(ranks);
  for (int r = 0; r < ranks; ++r) {
    inputs[r] = rank_input<T>(r, count);
    outputs[r].assign(count, from_float<T>(-12345.0f));
  }
  const std::vector<std::vector<T>> original = inputs;
  run_world(ranks, [&](RankContext& context) {
    const int r = context.rank;
    T* recv = in_place ? inputs[r].data() : outputs[r].data();
    context.communicator.all_reduce(context.comm, inputs[r].data(), recv, count, dtype_of<T>(),
                                    reduction);
  });
  std::vector<T> expected(count);
  for (std::size_t i = 0; i < count; ++i) expected[i] = reference_reduce(original, i, reduction);
  for (int r = 0; r < ranks; ++r) {
    expect_bits_equal(in_place ? inputs[r] : outputs[r], expected, "rank " + std::to_string(r));
    if (!in_place) expect_bits_equal(inputs[r], original[r], "rank " + std::to_string(r) + " input");
  }
}

TEST(LocalCommunicator, AllReduceGivesEveryRankTheSameReduction) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : kCounts) {
      for (Reduction reduction : {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean}) {
        check_all_reduce<float>(ranks, count, reduction, false);
      }
    }
  }
}

TEST(LocalCommunicator, AllReduceInPlace) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : kCounts) check_all_reduce<float>(ranks, count, Reduction::kSum, true);
  }
}

TEST(LocalCommunicator, AllReduceBf16AccumulatesInFloatAndRoundsOnce) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
      for (Reduction reduction : {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean}) {
        check_all_reduce<BFloat16>(ranks, count, reduction, false);
      }
      check_all_reduce<BFloat16>(ranks, count, Reduction::kMean, true);
    }
  }
}

TEST(LocalCommunicator, AllReduceOfAScalarLikeTheGradientNorm) {
  // The engine's global-norm clip: one float per rank, summed.
  for (int ranks : kWorldSizes) check_all_reduce<float>(ranks, 1, Reduction::kSum, true);
}

// ---- broadcast, barrier ----------------------------------------------------------------------

TEST(LocalCommunicator, BroadcastCopiesTheRootsBufferToEveryRank) {
  for (int ranks : kWorldSizes) {
    for (std::size_t count : kCounts) {
      const int root = ranks - 1;  // not rank 0, where the world has more than one rank
      SCOPED_TRACE(trace(ranks, count, "fp32", "root " + std::to_string(root)));
      std::vector<std::vector<float>> buffers(ranks);
      for (int r = 0; r < ranks; ++r) buffers[r] = rank_input<float>(r, count);
      const std::vector<float> expected = buffers[root];
      run_world(ranks, [&](RankContext& context) {
        context.communicator.broadcast(context.comm, buffers[context.rank].data(), count,
                                       DType::kFloat32, root);
      });
      for (int r = 0; r < ranks; ++r) {
        expect_bits_equal(buffers[r], expected, "rank " + std::to_string(r));
      }
    }
  }
}

TEST(LocalCommunicator, BroadcastBf16FromAMiddleRoot) {
  constexpr int kRanks = 4;
  constexpr int kRoot = 2;
  std::vector<std::vector<BFloat16>> buffers(kRanks);
  for (int r = 0; r < kRanks; ++r) buffers[r] = rank_input<BFloat16>(r, 333);
  const std::vector<BFloat16> expected = buffers[kRoot];
  run_world(kRanks, [&](RankContext& context) {
    context.communicator.broadcast(context.comm, buffers[context.rank].data(), 333,
                                   DType::kBFloat16, kRoot);
  });
  for (int r = 0; r < kRanks; ++r) expect_bits_equal(buffers[r], expected, "rank " + std::to_string(r));
}

TEST(LocalCommunicator, BroadcastRootOutsideTheWorldIsAnError) {
  run_world(2, [](RankContext& context) {
    float value = 0;
    const Error error = capture_error([&] {
      context.communicator.broadcast(context.comm, &value, 1, DType::kFloat32, 2);
    });
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_THAT(error.what(), HasSubstr("root 2"));
  });
}

TEST(LocalCommunicator, BarrierHoldsEveryRankUntilAllHaveArrived) {
  for (int ranks : kWorldSizes) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    std::vector<std::atomic<int>> arrived(ranks);
    std::vector<int> seen_after_barrier(ranks, -1);
    run_world(ranks, [&](RankContext& context) {
      const int r = context.rank;
      context.comm.enqueue([&arrived, r] {
        // Late ranks arrive late: without the barrier the early ones would see them missing.
        std::this_thread::sleep_for(milliseconds(10 * r));
        arrived[r] = 1;
      });
      context.communicator.barrier(context.comm);
      context.comm.enqueue([&, r] {
        int count = 0;
        for (auto& flag : arrived) count += flag.load();
        seen_after_barrier[r] = count;
      });
    });
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(seen_after_barrier[r], ranks) << "rank " << r;
  }
}

// ---- ordering --------------------------------------------------------------------------------

TEST(LocalCommunicator, ManyCollectivesInARowStayPaired) {
  constexpr int kRanks = 4;
  constexpr int kRounds = 200;
  constexpr std::size_t kCount = 33;
  std::vector<std::vector<std::vector<float>>> inputs(kRounds), outputs(kRounds);
  for (int round = 0; round < kRounds; ++round) {
    inputs[round].resize(kRanks);
    outputs[round].resize(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      inputs[round][r] = rank_input<float>(r, kCount, round * 1000);
      outputs[round][r].assign(kCount, 0.0f);
    }
  }
  run_world(kRanks, [&](RankContext& context) {
    const int r = context.rank;
    for (int round = 0; round < kRounds; ++round) {
      context.communicator.all_reduce(context.comm, inputs[round][r].data(),
                                      outputs[round][r].data(), kCount, DType::kFloat32,
                                      Reduction::kSum);
    }
  });
  for (int round = 0; round < kRounds; ++round) {
    std::vector<float> expected(kCount);
    for (std::size_t i = 0; i < kCount; ++i) {
      expected[i] = reference_reduce(inputs[round], i, Reduction::kSum);
    }
    for (int r = 0; r < kRanks; ++r) {
      expect_bits_equal(outputs[round][r], expected,
                        "round " + std::to_string(round) + ", rank " + std::to_string(r));
    }
  }
}

TEST(LocalCommunicator, CollectivesOnTwoStreamsPairByHostOrder) {
  // Every rank issues an all_gather on `comm` and then a reduce_scatter on `prefetch`. Even ranks
  // hold their comm stream back, odd ranks their prefetch stream, so the streams reach the
  // collectives in opposite orders on neighbouring ranks; pairing by arrival would match an
  // all_gather with a reduce_scatter.
  for (int ranks : {2, 3, 4, 8}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    constexpr std::size_t kCount = 129;
    std::vector<std::vector<float>> shards(ranks), gathered(ranks), grads(ranks), reduced(ranks);
    for (int r = 0; r < ranks; ++r) {
      shards[r] = rank_input<float>(r, kCount);
      gathered[r].assign(ranks * kCount, 0.0f);
      grads[r] = rank_input<float>(r, ranks * kCount, 77);
      reduced[r].assign(kCount, 0.0f);
    }
    run_world(ranks, [&](RankContext& context) {
      const int r = context.rank;
      Stream& delayed = r % 2 == 0 ? context.comm : context.prefetch;
      delayed.enqueue([] { std::this_thread::sleep_for(milliseconds(40)); });
      context.communicator.all_gather(context.comm, shards[r].data(), gathered[r].data(), kCount,
                                      DType::kFloat32);
      context.communicator.reduce_scatter(context.prefetch, grads[r].data(), reduced[r].data(),
                                          kCount, DType::kFloat32, Reduction::kSum);
    });
    std::vector<float> expected_gather;
    for (int r = 0; r < ranks; ++r) {
      expected_gather.insert(expected_gather.end(), shards[r].begin(), shards[r].end());
    }
    for (int r = 0; r < ranks; ++r) {
      expect_bits_equal(gathered[r], expected_gather, "gather on rank " + std::to_string(r));
      std::vector<float> expected(kCount);
      for (std::size_t i = 0; i < kCount; ++i) {
        expected[i] = reference_reduce(grads, r * kCount + i, Reduction::kSum);
      }
      expect_bits_equal(reduced[r], expected, "reduce on rank " + std::to_string(r));
    }
  }
}

TEST(LocalCommunicator, PrefetchAndCommRunConcurrently) {
  // A collective on `comm` that waits for its peers does not hold back one on `prefetch`.
  // Rank 1 holds its comm stream until the prefetch all_gather (issued second) has completed on
  // rank 0: this only finishes if the two streams' collectives proceed independently.
  std::atomic<bool> prefetch_done_on_rank0{false};
  std::vector<std::vector<float>> shard(2, std::vector<float>(4, 1.0f));
  std::vector<std::vector<float>> full(2, std::vector<float>(8));
  std::vector<std::vector<float>> grad(2, std::vector<float>(8, 2.0f));
  std::vector<std::vector<float>> grad_shard(2, std::vector<float>(4));
  run_world(
      2,
      [&](RankContext& context) {
        const int r = context.rank;
        if (r == 1) {
          context.comm.enqueue([&] {
            const auto deadline = Clock::now() + std::chrono::seconds(3);
            while (!prefetch_done_on_rank0.load() && Clock::now() < deadline) {
              std::this_thread::sleep_for(milliseconds(1));
            }
          });
        }
        context.communicator.reduce_scatter(context.comm, grad[r].data(), grad_shard[r].data(), 4,
                                            DType::kFloat32, Reduction::kSum);
        context.communicator.all_gather(context.prefetch, shard[r].data(), full[r].data(), 4,
                                        DType::kFloat32);
        if (r == 0) context.prefetch.enqueue([&] { prefetch_done_on_rank0 = true; });
      },
      milliseconds(5000));
  EXPECT_TRUE(prefetch_done_on_rank0.load());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(full[r], std::vector<float>(8, 1.0f));
    EXPECT_EQ(grad_shard[r], std::vector<float>(4, 4.0f));
  }
}

TEST(LocalCommunicator, ZeroCountCollectivesAreNoOps) {
  // An empty bucket still takes part in the collective order; nothing is read or written.
  std::vector<float> untouched(4, 5.0f);
  run_world(3, [&](RankContext& context) {
    Communicator& comm = context.communicator;
    comm.all_gather(context.comm, nullptr, nullptr, 0, DType::kFloat32);
    comm.reduce_scatter(context.comm, nullptr, nullptr, 0, DType::kBFloat16, Reduction::kMean);
    comm.all_reduce(context.comm, nullptr, nullptr, 0, DType::kFloat32, Reduction::kSum);
    comm.broadcast(context.comm, nullptr, 0, DType::kFloat32, 1);
  });
  EXPECT_EQ(untouched, std::vector<float>(4, 5.0f));
}

TEST(LocalCommunicator, CreateGroupMakesOneCommunicatorPerRank) {
  auto communicators = LocalCommunicator::create_group(5, milliseconds(1000));
  ASSERT_EQ(communicators.size(), 5u);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(communicators[r]->rank(), r);
    EXPECT_EQ(communicators[r]->world_size(), 5);
    EXPECT_EQ(communicators[r]->timeout(), milliseconds(1000));
    EXPECT_EQ(&communicators[r]->group(), &communicators[0]->group());
  }
  EXPECT_THROW(LocalCommunicator::create_group(0, milliseconds(1000)), Error);
}


}  // namespace
}  // namespace zest
