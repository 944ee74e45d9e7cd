// The World: one function per rank with that rank's own context, options checked up front, and
// a failure inside a rank reaching the caller of run() with its type and its rank.
#include "runtime/world.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

WorldOptions options_with_ranks(int ranks) {
  WorldOptions options;
  options.ranks = ranks;
  options.timeout = std::chrono::milliseconds(5000);
  return options;
}

TEST(World, EachRankGetsItsOwnRankAndDevice) {
  for (int ranks : {1, 2, 3, 8}) {
    World world(options_with_ranks(ranks));
    EXPECT_EQ(world.size(), ranks);
    std::mutex mutex;
    std::vector<int> seen_ranks;
    std::set<std::string> device_names;
    std::set<const void*> devices, streams;
    std::atomic<int> recorded{0};
    world.run([&](RankContext& context) {
      EXPECT_EQ(context.world_size, ranks);
      EXPECT_EQ(context.communicator.rank(), context.rank);
      EXPECT_EQ(context.communicator.world_size(), ranks);
      EXPECT_EQ(context.device.kind(), DeviceKind::kCpu);
      EXPECT_EQ(&context.allocator(), &context.device.allocator());
      {
        std::lock_guard lock(mutex);
        seen_ranks.push_back(context.rank);
        device_names.insert(context.device.name());
        devices.insert(&context.device);
        streams.insert(&context.compute);
        streams.insert(&context.comm);
        streams.insert(&context.prefetch);
      }
      // Stay alive until every rank has looked: a finished rank's device and streams are gone,
      // and a later rank's could reuse their addresses.
      ++recorded;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (recorded.load() < ranks && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
    });
    std::sort(seen_ranks.begin(), seen_ranks.end());
    std::vector<int> expected(ranks);
    for (int r = 0; r < ranks; ++r) expected[r] = r;
    EXPECT_EQ(seen_ranks, expected) << "ranks " << ranks;
    EXPECT_EQ(device_names.size(), static_cast<std::size_t>(ranks));
    EXPECT_EQ(devices.size(), static_cast<std::size_t>(ranks));
    EXPECT_EQ(streams.size(), static_cast<std::size_t>(3 * ranks));
  }
}

TEST(World, StreamAndDeviceNamesIdentifyTheRank) {
  World world(options_with_ranks(3));
  world.run([](RankContext& context) {
    const std::string rank = std::to_string(context.rank);
    EXPECT_EQ(context.device.name(), "cpu:" + rank);
    EXPECT_THAT(context.compute.name(), HasSubstr(rank));
    EXPECT_THAT(context.compute.name(), HasSubstr("compute"));
    EXPECT_THAT(context.comm.name(), HasSubstr("comm"));
    EXPECT_THAT(context.prefetch.name(), HasSubstr("prefetch"));
  });
}

TEST(World, RanksRunConcurrently) {
  // Every rank waits until all have started: only possible if they run at the same time.
  constexpr int kRanks = 4;
  World world(options_with_ranks(kRanks));
  std::atomic<int> started{0};
  world.run([&](RankContext&) {
    ++started;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (started.load() < kRanks && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    EXPECT_EQ(started.load(), kRanks);
  });
}

TEST(World, RunWaitsForWorkEnqueuedOnTheRanksStreams) {
  World world(options_with_ranks(2));
  std::atomic<int> done{0};
  world.run([&](RankContext& context) {
    for (Stream* stream : {&context.compute, &context.comm, &context.prefetch}) {
      stream->enqueue([&done] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ++done;
      });
    }
  });
  EXPECT_EQ(done.load(), 6);
}

TEST(World, RunCanBeCalledAgain) {
  World world(options_with_ranks(2));
  std::atomic<int> calls{0};
  world.run([&](RankContext&) { ++calls; });
  world.run([&](RankContext&) { ++calls; });
  EXPECT_EQ(calls.load(), 4);
}

TEST(World, DeviceMemoryIsEachRanksCapacity) {
  WorldOptions options = options_with_ranks(3);
  options.device_memory = std::size_t{1} << 20;
  World world(options);
  world.run([](RankContext& context) {
    EXPECT_EQ(context.allocator().capacity(), std::size_t{1} << 20);
    EXPECT_EQ(context.allocator().usage().capacity, std::size_t{1} << 20);
    // Each rank has its own budget: all can use most of it at once.
    Buffer buffer = context.allocator().allocate(900 * 1024, Category::kParams);
    EXPECT_EQ(context.allocator().usage().total_current, 900u * 1024);
  });
}

TEST(World, OutOfMemoryInsideARankSurfacesAsOutOfMemoryNamingTheRank) {
  WorldOptions options = options_with_ranks(3);
  options.device_memory = std::size_t{1} << 20;
  World world(options);
  try {
    world.run([](RankContext& context) {
      const std::size_t bytes = context.rank == 2 ? (std::size_t{2} << 20) : 1024;
      Buffer buffer = context.allocator().allocate(bytes, Category::kActivations);
    });
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory);
    EXPECT_THAT(error.what(), HasSubstr("rank 2"));
    EXPECT_THAT(error.what(), HasSubstr("cpu:2"));
    EXPECT_THAT(error.what(), HasSubstr("activations"));
  }
}

TEST(World, OutOfMemoryOnAStreamSurfacesAsOutOfMemory) {
  WorldOptions options = options_with_ranks(2);
  options.device_memory = 4096;
  World world(options);
  try {
    world.run([](RankContext& context) {
      if (context.rank != 1) return;
      Allocator& allocator = context.allocator();
      context.compute.enqueue([&allocator] {
        Buffer buffer = allocator.allocate(8192, Category::kWorkspace);
      });
    });
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_THAT(error.what(), HasSubstr("rank 1"));
    EXPECT_THAT(error.what(), HasSubstr("compute"));
  }
}

TEST(World, StreamFailureKeepsItsKindWhenAnotherStreamWaitedOnIt) {
  // The comm stream runs out of memory; compute waits on an event recorded after it and so
  // fails too, as an echo. What run() raises is the cause, with its type, not compute's echo.
  WorldOptions options = options_with_ranks(2);
  options.device_memory = 4096;
  World world(options);
  try {
    world.run([](RankContext& context) {
      if (context.rank != 1) return;
      Allocator& allocator = context.allocator();
      auto gathered = context.device.create_event();
      context.comm.enqueue([&allocator] {
        Buffer buffer = allocator.allocate(8192, Category::kGather);
      });
      context.comm.record(*gathered);
      context.compute.wait(*gathered);
      context.compute.enqueue([] {});
      context.synchronize();  // while the event is alive
    });
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_THAT(error.what(), HasSubstr("rank 1"));
    EXPECT_THAT(error.what(), HasSubstr("gather"));
  } catch (const Error& error) {
    FAIL() << "the cause lost its type: " << error_kind_name(error.kind()) << ": " << error.what();
  }
}

TEST(World, InputErrorOnOneStreamIsNotReportedAsAPeerFailure) {
  World world(options_with_ranks(2));
  try {
    world.run([](RankContext& context) {
      if (context.rank != 0) return;
      auto loaded = context.device.create_event();
      context.prefetch.enqueue([] { throw Error(ErrorKind::kData, "shard 2: bad magic"); });
      context.prefetch.record(*loaded);
      context.compute.wait(*loaded);
      context.comm.wait(*loaded);
      context.synchronize();
    });
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kData) << error.what();
    EXPECT_THAT(error.what(), HasSubstr("rank 0"));
    EXPECT_THAT(error.what(), HasSubstr("bad magic"));
  }
}

TEST(World, SynchronizeDrainsEveryStreamBeforeRaising) {
  // Compute fails; comm is still busy with a buffer. Once synchronize() throws, the caller frees
  // its buffers, so comm must have finished by then.
  World world(options_with_ranks(1));
  std::atomic<bool> comm_busy{false};
  std::atomic<bool> busy_when_raised{false};
  try {
    world.run([&](RankContext& context) {
      context.comm.enqueue([&comm_busy] {
        comm_busy = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        comm_busy = false;
      });
      context.compute.enqueue([&comm_busy] {
        while (!comm_busy) std::this_thread::yield();
        throw Error(ErrorKind::kData, "bad token");
      });
      try {
        context.synchronize();
      } catch (const Error&) {
        busy_when_raised = comm_busy.load();
        throw;
      }
    });
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kData) << error.what();
  }
  EXPECT_FALSE(busy_when_raised.load());
}

TEST(World, ExceptionInARankIsRaisedByRunNamingTheRank) {
  World world(options_with_ranks(4));
  try {
    world.run([](RankContext& context) {
      if (context.rank == 3) throw std::runtime_error("bad batch");
    });
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("rank 3"));
    EXPECT_THAT(error.what(), HasSubstr("bad batch"));
  }
}

TEST(World, ZestErrorKindSurvivesRun) {
  World world(options_with_ranks(2));
  try {
    world.run([](RankContext& context) {
      if (context.rank == 0) throw Error(ErrorKind::kData, "tokens.bin: truncated at 4096");
    });
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kData);
    EXPECT_THAT(error.what(), HasSubstr("rank 0"));
    EXPECT_THAT(error.what(), HasSubstr("tokens.bin"));
  }
}

Error construction_error(WorldOptions options) {
  try {
    World world(std::move(options));
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "expected World() to throw";
  return Error(ErrorKind::kInternal, "");
}

TEST(World, ZeroRanksIsAConfigError) {
  const Error error = construction_error(options_with_ranks(0));
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("world.ranks"));
  EXPECT_EQ(construction_error(options_with_ranks(-1)).kind(), ErrorKind::kConfig);
}

TEST(World, UnavailableBackendIsAConfigError) {
  WorldOptions options = options_with_ranks(2);
  options.backend = "nccl";
  const Error error = construction_error(options);
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("nccl"));
  EXPECT_THAT(error.what(), HasSubstr("local"));  // says what is allowed
}

TEST(World, CudaDeviceWithLocalBackendIsAConfigError) {
  WorldOptions options = options_with_ranks(2);
  options.device = DeviceKind::kCuda;
  const Error error = construction_error(options);
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("world.device: \"cuda\""));
#if ZEST_HAVE_CUDA
  // Built with CUDA, the backend is what is wrong, whether or not a GPU is visible.
  EXPECT_THAT(error.what(), HasSubstr("nccl"));
#endif
}

TEST(World, NcclBackendOnTheCpuDeviceIsAConfigErrorNamingCuda) {
  WorldOptions options = options_with_ranks(2);
  options.backend = "nccl";
  const Error error = construction_error(options);
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("world.device"));
  EXPECT_THAT(error.what(), HasSubstr("cuda"));
}

TEST(World, NonPositiveTimeoutIsAConfigError) {
  WorldOptions options = options_with_ranks(2);
  options.timeout = std::chrono::milliseconds(0);
  const Error error = construction_error(options);
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("timeout"));
}

}  // namespace
}  // namespace zest
