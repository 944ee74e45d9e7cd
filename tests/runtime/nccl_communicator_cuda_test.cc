// ctest-labels: gpu
// The `nccl` communicator against a host reference computed here: every collective, in place and
// out of place, fp32, bf16 and fp16, each reduction, for world sizes 1 to 8 as threads of this
// process (one GPU each: a size needing more GPUs than are visible skips, saying so), and the
// watchdog: a rank that never calls makes its peer fail within the timeout, naming the
// collective. ZEST_NCCL_CHECK's message and the one-GPU-per-rank check run without a GPU.
#include "runtime/nccl_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/cuda_stream.h"
#include "runtime/nccl_check.h"
#include "tests/support/capture_error.h"
#include "tests/support/cuda_test_support.h"
#include "tests/support/fake_cuda_stream.h"

namespace zest {
namespace {

using namespace std::chrono_literals;
using ::testing::AnyOf;
using testing::DeviceArray;
using ::testing::HasSubstr;

using testing::capture_error;

ncclResult_t returns(ncclResult_t status) { return status; }

TEST(NcclCheck, FailureNamesTheCallFileAndLine) {
  const int line = __LINE__ + 1;
  const Error error = capture_error([] { ZEST_NCCL_CHECK(returns(ncclInvalidArgument)); });
  EXPECT_EQ(error.kind(), ErrorKind::kDevice);
  EXPECT_THAT(error.what(), HasSubstr("NCCL call returns(ncclInvalidArgument) failed"));
  EXPECT_THAT(error.what(), HasSubstr(ncclGetErrorString(ncclInvalidArgument)));
  EXPECT_THAT(error.what(), HasSubstr("(ncclResult_t 4)"));
  EXPECT_THAT(error.what(), HasSubstr("nccl_communicator_cuda_test.cc:" + std::to_string(line)));
}

TEST(NcclCheck, RemoteErrorIsAPeerFailureAndInProgressIsNoFailure) {
  EXPECT_EQ(capture_error([] { ZEST_NCCL_CHECK(returns(ncclRemoteError)); }).kind(),
            ErrorKind::kPeerFailure);
  EXPECT_EQ(ZEST_NCCL_CHECK(returns(ncclInProgress)), ncclInProgress);
  EXPECT_EQ(ZEST_NCCL_CHECK(returns(ncclSuccess)), ncclSuccess);
}

TEST(NcclCommunicatorGroup, NeedsOneGpuPerRank) {
  const int visible = cuda::visible_devices().count;
  const Error error = capture_error([&] { NcclCommunicator::create_group(visible + 1, 1s); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("one rank per GPU"));
  EXPECT_THAT(error.what(), HasSubstr(std::to_string(visible + 1) + " GPUs"));
}

// Skips the calling test unless `ranks` GPUs are visible.
#define ZEST_SKIP_WITHOUT_GPUS(ranks)                                                          \
  do {                                                                                         \
    const cuda::DeviceCount zest_devices_ = cuda::visible_devices();                           \
    if (zest_devices_.count < (ranks)) {                                                       \
      GTEST_SKIP() << "needs " << (ranks) << " GPUs, found " << zest_devices_.count            \
                   << (zest_devices_.reason.empty() ? "" : " (" + zest_devices_.reason + ")"); \
    }                                                                                          \
  } while (0)

using RankBody = std::function<void(int rank, NcclCommunicator&, Stream&)>;

// Runs `body` on one thread per rank, rank r on GPU r with a CUDA stream of its own; an
// exception on a rank fails the test, naming the rank.
void run_ranks(int ranks, std::chrono::milliseconds timeout, const RankBody& body) {
  auto group = NcclCommunicator::create_group(ranks, timeout);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        cuda::CudaStream stream("comm", rank);
        body(rank, *group[rank], stream);
      } catch (const std::exception& error) {
        ADD_FAILURE() << "rank " << rank << ": " << error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  NcclCommunicator::destroy_group(group);
}

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kFloat32;
  if constexpr (std::is_same_v<T, BFloat16>) return DType::kBFloat16;
  return DType::kFloat16;
}
template <typename T>
float to_float(T value) {
  return static_cast<float>(value);
}

// Small integers: every sum of up to 8 ranks is exact in bf16 (at most 252 < 256), so sums are
// checked exactly and only means carry rounding.
float value_of(int rank, std::size_t i) { return static_cast<float>((rank + 1) * (i % 7 + 1)); }

template <typename T>
std::vector<T> values(int rank, std::size_t count, std::size_t offset = 0) {
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = T(value_of(rank, offset + i));
  return out;
}

// Element i of the reduction of every rank's value_of(·, i).
float reduced(int ranks, std::size_t i, Reduction reduction) {
  float sum = 0.0f;
  for (int r = 0; r < ranks; ++r) sum += value_of(r, i);
  return reduction == Reduction::kSum ? sum : sum / static_cast<float>(ranks);
}

// Means go through ncclAvg: each input times a 1/N rounded to the element type, then N - 1
// additions along the ring, each rounded to the element type: N + 1 roundings of at most the
// type's unit roundoff u, relative, so (N + 2) u. Sums of these small integers are exact.
template <typename T>
float tolerance(int ranks, float expected, Reduction reduction) {
  if (reduction == Reduction::kSum) return 0.0f;
  const float u = std::is_same_v<T, float>      ? 0x1p-24f
                  : std::is_same_v<T, BFloat16> ? 0x1p-8f
                                                : 0x1p-11f;
  return static_cast<float>(ranks + 2) * u * std::fabs(expected);
}

constexpr std::size_t kCount = 1031;  // odd: no NCCL fast path for aligned sizes alone
constexpr Reduction kReductions[] = {Reduction::kSum, Reduction::kMean, Reduction::kPreDividedMean};

class NcclCollectives : public ::testing::TestWithParam<int> {
 protected:
  template <typename T>
  void all_gather(bool in_place) {
    const int n = GetParam();
    run_ranks(n, 60s, [&](int rank, NcclCommunicator& comm, Stream& stream) {
      DeviceArray<T> recv(n * kCount);
      DeviceArray<T> send(values<T>(rank, kCount));
      if (in_place) recv.upload(std::vector<T>(n * kCount, T(-1.0f)));
      T* source = in_place ? recv.data() + rank * kCount : send.data();
      if (in_place) {
        ASSERT_EQ(cudaMemcpy(source, send.data(), kCount * sizeof(T), cudaMemcpyDefault),
                  cudaSuccess);
      }
      comm.all_gather(stream, source, recv.data(), kCount, dtype_of<T>());
      stream.synchronize();
      const std::vector<T> out = recv.download();
      for (int q = 0; q < n; ++q) {
        for (std::size_t i = 0; i < kCount; ++i) {
          ASSERT_EQ(to_float(out[q * kCount + i]), value_of(q, i)) << "rank " << q << " i " << i;
        }
      }
    });
  }

  template <typename T>
  void reduce_scatter(bool in_place) {
    const int n = GetParam();
    for (Reduction reduction : kReductions) {
      run_ranks(n, 60s, [&](int rank, NcclCommunicator& comm, Stream& stream) {
        DeviceArray<T> send(values<T>(rank, n * kCount));
        DeviceArray<T> recv(kCount);
        T* destination = in_place ? send.data() + rank * kCount : recv.data();
        comm.reduce_scatter(stream, send.data(), destination, kCount, dtype_of<T>(), reduction);
        stream.synchronize();
        const std::vector<T> out = in_place ? send.download() : recv.download();
        const std::size_t base = in_place ? rank * kCount : 0;
        for (std::size_t i = 0; i < kCount; ++i) {
          const float expected = reduced(n, rank * kCount + i, reduction);
          ASSERT_NEAR(to_float(out[base + i]), expected, tolerance<T>(n, expected, reduction))
              << "i " << i << " reduction " << static_cast<int>(reduction);
        }
      });
    }
  }

  template <typename T>
  void all_reduce(bool in_place) {
    const int n = GetParam();
    for (Reduction reduction : kReductions) {
      run_ranks(n, 60s, [&](int rank, NcclCommunicator& comm, Stream& stream) {
        DeviceArray<T> send(values<T>(rank, kCount));
        DeviceArray<T> recv(kCount);
        T* destination = in_place ? send.data() : recv.data();
        comm.all_reduce(stream, send.data(), destination, kCount, dtype_of<T>(), reduction);
        stream.synchronize();
        const std::vector<T> out = in_place ? send.download() : recv.download();
        for (std::size_t i = 0; i < kCount; ++i) {
          const float expected = reduced(n, i, reduction);
          ASSERT_NEAR(to_float(out[i]), expected, tolerance<T>(n, expected, reduction))
              << "i " << i << " reduction " << static_cast<int>(reduction);
        }
      });
    }
  }
};

TEST_P(NcclCollectives, AllGatherEveryTypeInAndOutOfPlace) {
  ZEST_SKIP_WITHOUT_GPUS(GetParam());
  for (bool in_place : {false, true}) {
    all_gather<float>(in_place);
    all_gather<BFloat16>(in_place);
    all_gather<Float16>(in_place);
  }
}

TEST_P(NcclCollectives, ReduceScatterEveryTypeAndReductionInAndOutOfPlace) {
  ZEST_SKIP_WITHOUT_GPUS(GetParam());
  for (bool in_place : {false, true}) {
    reduce_scatter<float>(in_place);
    reduce_scatter<BFloat16>(in_place);
    reduce_scatter<Float16>(in_place);
  }
}

TEST_P(NcclCollectives, AllReduceEveryTypeAndReductionInAndOutOfPlace) {
  ZEST_SKIP_WITHOUT_GPUS(GetParam());
  for (bool in_place : {false, true}) {
    all_reduce<float>(in_place);
    all_reduce<BFloat16>(in_place);
    all_reduce<Float16>(in_place);
  }
}

TEST_P(NcclCollectives, BroadcastFromFirstAndLastRootBarrierAndEmptyCollectives) {
  const int n = GetParam();
  ZEST_SKIP_WITHOUT_GPUS(n);
  for (int root : {0, n - 1}) {
    run_ranks(n, 60s, [&](int rank, NcclCommunicator& comm, Stream& stream) {
      DeviceArray<float> buffer(values<float>(rank, kCount));
      comm.broadcast(stream, buffer.data(), kCount, DType::kFloat32, root);
      comm.barrier(stream);
      comm.all_gather(stream, nullptr, nullptr, 0, DType::kFloat32);  // nothing moves
      stream.synchronize();
      EXPECT_EQ(buffer.download(), values<float>(root, kCount)) << "root " << root;
    });
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, NcclCollectives, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(NcclCommunicatorUsage, StreamsOfAnotherKindOrGpuAndBadRootsAreRefused) {
  ZEST_SKIP_WITHOUT_GPUS(1);
  run_ranks(1, 10s, [&](int, NcclCommunicator& comm, Stream&) {
    testing::FakeCudaStream fake;
    EXPECT_EQ(capture_error([&] { comm.barrier(fake); }).kind(), ErrorKind::kUsage);
    EXPECT_EQ(fake.enqueued, 0);
    if (cuda::visible_devices().count > 1) {
      cuda::CudaStream other("other", 1);
      const Error error = capture_error([&] { comm.barrier(other); });
      EXPECT_THAT(error.what(), HasSubstr("is on cuda:1"));
    }
    cuda::CudaStream stream("comm", 0);
    EXPECT_EQ(capture_error([&] { comm.broadcast(stream, nullptr, 1, DType::kFloat32, 1); }).kind(),
              ErrorKind::kUsage);
  });
}

TEST(NcclCommunicatorFailures, APeerThatNeverCallsFailsWithinTheTimeoutNamingTheCollective) {
  ZEST_SKIP_WITHOUT_GPUS(2);
  const auto timeout = 2s;
  run_ranks(2, timeout, [&](int rank, NcclCommunicator& comm, Stream& stream) {
    comm.barrier(stream);  // both ranks: the communicator works before one goes missing
    stream.synchronize();
    if (rank == 1) return;  // never issues the all_gather
    DeviceArray<BFloat16> recv(2 * 4096);
    comm.label_next("gather block3");
    const auto start = std::chrono::steady_clock::now();
    const Error error = capture_error([&] {
      comm.all_gather(stream, recv.data(), recv.data(), 4096, DType::kBFloat16);
      stream.synchronize();
    });
    // The watchdog polls every twentieth of the timeout; abort and the stream's drain take some
    // seconds at most.
    EXPECT_LT(std::chrono::steady_clock::now() - start, timeout + 15s);
    EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
    EXPECT_THAT(error.what(), HasSubstr("all_gather of 4096 bf16 elements ('gather block3')"));
    EXPECT_THAT(error.what(), HasSubstr("within 2 s"));
    EXPECT_THAT(error.what(), HasSubstr("aborted the NCCL communicator"));
    // The communicator stays failed: the next call raises the same cause at once.
    const Error again = capture_error([&] { comm.barrier(stream); });
    EXPECT_THAT(again.what(), AnyOf(HasSubstr("gather block3"), HasSubstr("closing")));
  });
}

}  // namespace
}  // namespace zest
