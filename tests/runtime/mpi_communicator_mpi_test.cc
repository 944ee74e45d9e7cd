// ctest-labels: mpi
// The `mpi` communicator, run by ctest under mpirun with 2 and 4 processes: every collective
// against a serial reference computed by every rank from every rank's (deterministic) inputs, in
// place and out of place, fp32 and bf16, odd counts; pairing by host order across streams; the
// agreement check and the timeout naming what failed. World with processes: mpi_world_mpi_test.
#include "runtime/mpi_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/cpu_stream.h"
#include "runtime/mpi_process.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kCounts[] = {1, 7, 1000, 65537};
constexpr milliseconds kTimeout(30000);

int world_rank() { return MpiProcess::get().rank(); }
int world_size() { return MpiProcess::get().size(); }

// Every test leaves MPI_COMM_WORLD in step, so that one rank's early failure cannot make the
// next test pair the wrong collectives.
class MpiCommunicatorTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

using testing::capture_error;

// ---- element types and inputs (as in the local backend's suite) -----------------------------

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

template <typename T>
std::vector<std::vector<T>> all_inputs(std::size_t count, std::size_t salt = 0) {
  std::vector<std::vector<T>> inputs(world_size());
  for (int r = 0; r < world_size(); ++r) inputs[r] = rank_input<T>(r, count, salt);
  return inputs;
}

// The reference: in rank order, accumulated in float32, rounded to T once — and the bound on how
// far an MPI result may be from it. MPI may add in another order (a tree, a ring), and float
// addition is not associative: each of the n − 1 additions of either order errs by at most half
// an ulp of a partial sum, itself at most Σ|x|, so the two orders differ by at most
// (n − 1)·2⁻²³·Σ|x| (×1/n for the means), plus one ulp of T for the final rounding, which can
// fall either side of a tie.
template <typename T>
struct Reference {
  T value;
  float tolerance;
};

template <typename T>
Reference<T> reference_reduce(const std::vector<std::vector<T>>& inputs, std::size_t index,
                              Reduction reduction) {
  const float world = static_cast<float>(inputs.size());
  float accumulator = 0.0f, magnitude = 0.0f;
  for (std::size_t r = 0; r < inputs.size(); ++r) {
    float value = to_float(inputs[r][index]);
    if (reduction == Reduction::kPreDividedMean) value /= world;
    accumulator = r == 0 ? value : accumulator + value;
    magnitude += std::fabs(value);
  }
  if (reduction == Reduction::kMean) {
    accumulator /= world;
    magnitude /= world;
  }
  const float order = (world - 1) * std::ldexp(magnitude, -23);
  const float ulp = std::is_same_v<T, float> ? 0.0f : std::ldexp(std::fabs(accumulator), -7);
  return {from_float<T>(accumulator), order + ulp + 1e-30f};
}

// Compares within the tolerances and reports the first difference (one failure, not a million).
template <typename T>
void expect_near(const std::vector<T>& actual, const std::vector<Reference<T>>& expected,
                 const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::size_t mismatches = 0, first = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const float difference = std::fabs(to_float(actual[i]) - to_float(expected[i].value));
    if (!(difference <= expected[i].tolerance)) {
      if (mismatches++ == 0) first = i;
    }
  }
  EXPECT_EQ(mismatches, 0u) << what << ": first at element " << first << ": got "
                            << to_float(actual[first]) << ", want "
                            << to_float(expected[first].value) << " ± "
                            << expected[first].tolerance;
}

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

// Every rank must end with the same bits: the engine's replicas would drift apart otherwise.
template <typename T>
void expect_same_on_every_rank(const std::vector<T>& mine, const std::string& what) {
  const int bytes = static_cast<int>(mine.size() * sizeof(T));
  std::vector<T> all(mine.size() * world_size());
  MPI_Allgather(mine.data(), bytes, MPI_BYTE, all.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
  for (int r = 0; r < world_size(); ++r) {
    expect_bits_equal(std::vector<T>(all.begin() + r * mine.size(),
                                     all.begin() + (r + 1) * mine.size()),
                      mine, what + ": rank " + std::to_string(r) + " against this rank");
  }
}

const char* reduction_label(Reduction reduction) {
  switch (reduction) {
    case Reduction::kSum: return "sum";
    case Reduction::kMean: return "mean";
    case Reduction::kPreDividedMean: return "pre-divided mean";
  }
  return "?";
}

std::string trace(std::size_t count, const char* dtype, const std::string& extra = "") {
  return "rank " + std::to_string(world_rank()) + " of " + std::to_string(world_size()) +
         ", count " + std::to_string(count) + ", " + dtype + (extra.empty() ? "" : ", " + extra);
}

// ---- all_gather ------------------------------------------------------------------------------

template <typename T>
void check_all_gather(std::size_t count, bool in_place) {
  SCOPED_TRACE(trace(count, dtype_name(dtype_of<T>()), in_place ? "in place" : ""));
  const int rank = world_rank(), ranks = world_size();
  const auto inputs = all_inputs<T>(count);
  std::vector<T> expected;
  for (const auto& input : inputs) expected.insert(expected.end(), input.begin(), input.end());
  std::vector<T> output(ranks * count, from_float<T>(-12345.0f));
  if (in_place) std::copy(inputs[rank].begin(), inputs[rank].end(), output.begin() + rank * count);
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  const T* send = in_place ? output.data() + rank * count : inputs[rank].data();
  communicator.all_gather(stream, send, output.data(), count, dtype_of<T>());
  stream.synchronize();
  expect_bits_equal(output, expected, "all_gather");
}

TEST_F(MpiCommunicatorTest, AllGatherConcatenatesEveryRanksShardInRankOrder) {
  for (std::size_t count : kCounts) check_all_gather<float>(count, false);
}

TEST_F(MpiCommunicatorTest, AllGatherInPlaceRebuildsTheFullBuffer) {
  for (std::size_t count : kCounts) check_all_gather<float>(count, true);
}

TEST_F(MpiCommunicatorTest, AllGatherMovesBf16Unchanged) {
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
    check_all_gather<BFloat16>(count, false);
    check_all_gather<BFloat16>(count, true);
  }
}

// ---- reduce_scatter --------------------------------------------------------------------------

template <typename T>
void check_reduce_scatter(std::size_t count, Reduction reduction, bool in_place) {
  SCOPED_TRACE(trace(count, dtype_name(dtype_of<T>()),
                     std::string(reduction_label(reduction)) + (in_place ? ", in place" : "")));
  const int rank = world_rank(), ranks = world_size();
  const auto inputs = all_inputs<T>(ranks * count);
  std::vector<T> send = inputs[rank];
  std::vector<T> output(count, from_float<T>(-12345.0f));
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  T* recv = in_place ? send.data() + rank * count : output.data();
  communicator.reduce_scatter(stream, send.data(), recv, count, dtype_of<T>(), reduction);
  stream.synchronize();

  std::vector<Reference<T>> expected;
  for (std::size_t i = 0; i < count; ++i) {
    expected.push_back(reference_reduce(inputs, rank * count + i, reduction));
  }
  const std::vector<T> actual =
      in_place ? std::vector<T>(send.begin() + rank * count, send.begin() + (rank + 1) * count)
               : output;
  expect_near(actual, expected, "reduce_scatter");
  // Only the rank's own slice of its input changes (out of place: nothing does).
  std::vector<T> rest(send.begin(), send.begin() + rank * count);
  rest.insert(rest.end(), send.begin() + (rank + 1) * count, send.end());
  std::vector<T> rest_before(inputs[rank].begin(), inputs[rank].begin() + rank * count);
  rest_before.insert(rest_before.end(), inputs[rank].begin() + (rank + 1) * count,
                     inputs[rank].end());
  expect_bits_equal(rest, rest_before, "outside the own slice");
}

TEST_F(MpiCommunicatorTest, ReduceScatterLeavesEachRankItsReducedSlice) {
  for (std::size_t count : kCounts) {
    for (Reduction reduction : {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean}) {
      check_reduce_scatter<float>(count, reduction, false);
    }
  }
}

TEST_F(MpiCommunicatorTest, ReduceScatterInPlaceWritesOnlyTheOwnSlice) {
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{65537}}) {
    for (Reduction reduction : {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean}) {
      check_reduce_scatter<float>(count, reduction, true);
    }
  }
}

TEST_F(MpiCommunicatorTest, ReduceScatterBf16AccumulatesInFloatAndRoundsOnce) {
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
    for (Reduction reduction : {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean}) {
      check_reduce_scatter<BFloat16>(count, reduction, false);
    }
    check_reduce_scatter<BFloat16>(count, Reduction::kSum, true);
  }
}

TEST_F(MpiCommunicatorTest, Bf16SumIsNotARunningBf16Sum) {
  // 1 + 2^-8 + 2^-8 is 1 + 2^-7 in float, which bf16 holds exactly; rounding to bf16 after each
  // addition makes each 1 + 2^-8 a tie that rounds back to 1. Needs three addends.
  if (world_size() < 3) GTEST_SKIP() << "needs at least 3 ranks";
  const int rank = world_rank();
  const float mine = rank == 0 ? 1.0f : rank <= 2 ? 1.0f / 256 : 0.0f;
  std::vector<BFloat16> send(world_size(), BFloat16(mine));
  BFloat16 out;
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  communicator.reduce_scatter(stream, send.data(), &out, 1, DType::kBFloat16, Reduction::kSum);
  stream.synchronize();
  EXPECT_EQ(static_cast<float>(out), 1.0f + 1.0f / 128);
}

TEST_F(MpiCommunicatorTest, ReduceScatterOfAMillionOddElements) {
  constexpr std::size_t kCount = 250007;
  check_reduce_scatter<float>(kCount, Reduction::kSum, false);
  check_reduce_scatter<BFloat16>(kCount, Reduction::kPreDividedMean, true);
  check_all_gather<float>(kCount, true);
}

// ---- all_reduce ------------------------------------------------------------------------------

template <typename T>
void check_all_reduce(std::size_t count, Reduction reduction, bool in_place) {
  SCOPED_TRACE(trace(count, dtype_name(dtype_of<T>()),
                     std::string(reduction_label(reduction)) + (in_place ? ", in place" : "")));
  const int rank = world_rank();
  const auto inputs = all_inputs<T>(count);
  std::vector<T> send = inputs[rank];
  std::vector<T> output(count, from_float<T>(-12345.0f));
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  T* recv = in_place ? send.data() : output.data();
  communicator.all_reduce(stream, send.data(), recv, count, dtype_of<T>(), reduction);
  stream.synchronize();
  std::vector<Reference<T>> expected;
  for (std::size_t i = 0; i < count; ++i) {
    expected.push_back(reference_reduce(inputs, i, reduction));
  }
  const std::vector<T>& actual = in_place ? send : output;
  expect_near(actual, expected, "all_reduce");
  expect_same_on_every_rank(actual, "all_reduce");
  if (!in_place) expect_bits_equal(send, inputs[rank], "the input");
}

TEST_F(MpiCommunicatorTest, AllReduceGivesEveryRankTheSameReduction) {
  for (std::size_t count : kCounts) {
    for (Reduction reduction : {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean}) {
      check_all_reduce<float>(count, reduction, false);
    }
  }
}

TEST_F(MpiCommunicatorTest, AllReduceInPlace) {
  for (std::size_t count : kCounts) {
    check_all_reduce<float>(count, Reduction::kSum, true);
    check_all_reduce<float>(count, Reduction::kMean, true);
  }
}

TEST_F(MpiCommunicatorTest, AllReduceBf16AccumulatesInFloatAndRoundsOnce) {
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
    for (Reduction reduction : {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean}) {
      check_all_reduce<BFloat16>(count, reduction, false);
    }
    check_all_reduce<BFloat16>(count, Reduction::kMean, true);
  }
}

TEST_F(MpiCommunicatorTest, ReductionsOfTypesWithoutFloatAccumulationAreUsageErrors) {
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  std::vector<std::int32_t> data(world_size(), 1);
  const Error error = capture_error([&] {
    communicator.all_reduce(stream, data.data(), data.data(), 1, DType::kInt32, Reduction::kSum);
  });
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_THAT(error.what(), HasSubstr("int32"));
}

// ---- broadcast, barrier ----------------------------------------------------------------------

TEST_F(MpiCommunicatorTest, BroadcastCopiesTheRootsBufferToEveryRank) {
  const int root = world_size() - 1;  // not rank 0
  for (std::size_t count : kCounts) {
    SCOPED_TRACE(trace(count, "fp32", "root " + std::to_string(root)));
    std::vector<float> buffer = rank_input<float>(world_rank(), count);
    MpiCommunicator communicator(kTimeout);
    cpu::CpuStream stream("comm");
    communicator.broadcast(stream, buffer.data(), count, DType::kFloat32, root);
    stream.synchronize();
    expect_bits_equal(buffer, rank_input<float>(root, count), "broadcast");
  }
  std::vector<BFloat16> buffer = rank_input<BFloat16>(world_rank(), 333);
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  communicator.broadcast(stream, buffer.data(), 333, DType::kBFloat16, 1);
  stream.synchronize();
  expect_bits_equal(buffer, rank_input<BFloat16>(1, 333), "bf16 broadcast from rank 1");
}

TEST_F(MpiCommunicatorTest, BroadcastRootOutsideTheWorldIsAUsageError) {
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  float value = 0;
  const Error error = capture_error(
      [&] { communicator.broadcast(stream, &value, 1, DType::kFloat32, world_size()); });
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_THAT(error.what(), HasSubstr("root " + std::to_string(world_size())));
}

TEST_F(MpiCommunicatorTest, BarrierHoldsEveryRankUntilAllHaveArrived) {
  // Rank r arrives r × 100 ms late; nobody leaves before the last has arrived.
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  stream.enqueue([] { std::this_thread::sleep_for(milliseconds(100 * world_rank())); });
  communicator.barrier(stream);
  stream.synchronize();
  // Less 20 ms: the ranks leave the MPI_Barrier above at slightly different times.
  EXPECT_GE(Clock::now() - start, milliseconds(100 * (world_size() - 1) - 20));
}

// ---- ordering --------------------------------------------------------------------------------

TEST_F(MpiCommunicatorTest, ManyCollectivesInARowStayPaired) {
  constexpr int kRounds = 100;
  constexpr std::size_t kCount = 33;
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  std::vector<std::vector<std::vector<float>>> inputs(kRounds);
  std::vector<std::vector<float>> outputs(kRounds, std::vector<float>(kCount));
  for (int round = 0; round < kRounds; ++round) {
    inputs[round] = all_inputs<float>(kCount, round * 1000);
    communicator.all_reduce(stream, inputs[round][world_rank()].data(), outputs[round].data(),
                            kCount, DType::kFloat32, Reduction::kSum);
  }
  stream.synchronize();
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Reference<float>> expected;
    for (std::size_t i = 0; i < kCount; ++i) {
      expected.push_back(reference_reduce(inputs[round], i, Reduction::kSum));
    }
    expect_near(outputs[round], expected, "round " + std::to_string(round));
  }
}

TEST_F(MpiCommunicatorTest, CollectivesOnTwoStreamsPairByHostOrder) {
  // Every rank issues an all_gather on `comm`, then a reduce_scatter on `prefetch`; even ranks
  // hold their comm stream back, odd ranks their prefetch stream, so neighbouring ranks reach the
  // two in opposite orders. Pairing by arrival would match an all_gather with a reduce_scatter.
  constexpr std::size_t kCount = 129;
  const int rank = world_rank(), ranks = world_size();
  const auto shards = all_inputs<float>(kCount);
  const auto grads = all_inputs<float>(ranks * kCount, 77);
  std::vector<float> gathered(ranks * kCount), reduced(kCount);
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream comm("comm"), prefetch("prefetch");
  (rank % 2 == 0 ? comm : prefetch).enqueue([] { std::this_thread::sleep_for(milliseconds(100)); });
  communicator.all_gather(comm, shards[rank].data(), gathered.data(), kCount, DType::kFloat32);
  communicator.reduce_scatter(prefetch, grads[rank].data(), reduced.data(), kCount,
                              DType::kFloat32, Reduction::kSum);
  comm.synchronize();
  prefetch.synchronize();
  std::vector<float> expected_gather;
  for (const auto& shard : shards) {
    expected_gather.insert(expected_gather.end(), shard.begin(), shard.end());
  }
  expect_bits_equal(gathered, expected_gather, "all_gather");
  std::vector<Reference<float>> expected;
  for (std::size_t i = 0; i < kCount; ++i) {
    expected.push_back(reference_reduce(grads, rank * kCount + i, Reduction::kSum));
  }
  expect_near(reduced, expected, "reduce_scatter");
}

TEST_F(MpiCommunicatorTest, ACollectiveStalledOnOneStreamDoesNotHoldBackTheNext) {
  // Rank 1 holds its comm stream for 2 s before a reduce_scatter; the all_gather issued after
  // it on prefetch still completes at once on every rank: the engine's prefetch overlaps a
  // reduction still waiting for compute.
  std::vector<float> grad(2 * world_size(), 2.0f), grad_shard(2);
  std::vector<float> shard(4, 1.0f), full(4 * world_size());
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream comm("comm"), prefetch("prefetch");
  if (world_rank() == 1) comm.enqueue([] { std::this_thread::sleep_for(milliseconds(2000)); });
  const auto start = Clock::now();
  communicator.reduce_scatter(comm, grad.data(), grad_shard.data(), 2, DType::kFloat32,
                              Reduction::kSum);
  communicator.all_gather(prefetch, shard.data(), full.data(), 4, DType::kFloat32);
  prefetch.synchronize();
  EXPECT_LT(Clock::now() - start, milliseconds(1500));
  comm.synchronize();
  EXPECT_EQ(full, std::vector<float>(full.size(), 1.0f));
  EXPECT_EQ(grad_shard, std::vector<float>(2, 2.0f * world_size()));
}

// ---- failures --------------------------------------------------------------------------------

TEST_F(MpiCommunicatorTest, DifferentCountsAreAMismatchNamingBoth) {
  const int last = world_size() - 1;
  const std::size_t count = world_rank() == last ? 5 : 4;
  std::vector<float> send(8, 1.0f), recv(8 * world_size());
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  const auto start = Clock::now();
  communicator.all_gather(stream, send.data(), recv.data(), count, DType::kFloat32);
  const Error error = capture_error([&] { stream.synchronize(); });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(error.kind(), ErrorKind::kCommMismatch) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("all_gather #0 (4 x fp32)"));
  EXPECT_THAT(error.what(),
              HasSubstr("rank " + std::to_string(last) + " called all_gather #0 (5 x fp32)"));
  // The communicator is broken now: what follows, even on another stream, fails at once instead
  // of pairing wrongly.
  cpu::CpuStream other("prefetch");
  communicator.barrier(other);
  const Error later = capture_error([&] { other.synchronize(); });
  EXPECT_EQ(later.kind(), ErrorKind::kPeerFailure) << later.what();
  EXPECT_THAT(later.what(), HasSubstr("barrier #1"));
  EXPECT_THAT(later.what(), HasSubstr("collective mismatch"));
}

TEST_F(MpiCommunicatorTest, DifferentCollectivesAreAMismatch) {
  std::vector<float> send(16, 1.0f), recv(16 * world_size());
  MpiCommunicator communicator(kTimeout);
  cpu::CpuStream stream("comm");
  if (world_rank() == 0) {
    communicator.all_reduce(stream, send.data(), recv.data(), 8, DType::kFloat32, Reduction::kSum);
  } else {
    communicator.reduce_scatter(stream, send.data(), recv.data(), 8 / world_size(),
                                DType::kFloat32, Reduction::kMean);
  }
  const Error error = capture_error([&] { stream.synchronize(); });
  EXPECT_EQ(error.kind(), ErrorKind::kCommMismatch) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("all_reduce"));
  EXPECT_THAT(error.what(), HasSubstr("reduce_scatter"));
}

TEST_F(MpiCommunicatorTest, AMissingRankIsATimeoutNamingTheCollective) {
  // Rank 0 calls an all_gather with a short timeout; the others never do. (Its request stays
  // pending: MPI cannot cancel a collective. The communicator is freed all the same.)
  MpiCommunicator communicator(milliseconds(500));
  cpu::CpuStream stream("comm");
  if (world_rank() != 0) return;
  std::vector<float> data(3 * world_size(), 1.0f);
  const auto start = Clock::now();
  communicator.all_gather(stream, data.data(), data.data(), 3, DType::kFloat32);
  const Error error = capture_error([&] { stream.synchronize(); });
  EXPECT_LT(Clock::now() - start, milliseconds(1400));
  EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("all_gather #0 (3 x fp32) on rank 0 of " +
                                      std::to_string(world_size())));
  EXPECT_THAT(error.what(), HasSubstr("timed out after 0.5"));
  EXPECT_THAT(error.what(), HasSubstr("world.timeout_s"));
}

}  // namespace
}  // namespace zest
