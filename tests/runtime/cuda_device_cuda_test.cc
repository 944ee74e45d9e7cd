// ctest-labels: gpu
// The CUDA device against the contract the CPU device keeps (runtime/device.h, stream.h): work in
// stream order, events ordering streams, sticky failures re-raised by synchronize and passed on
// through events, allocator accounting, capacity and out-of-memory, and CUDA errors that name the
// call, file and line. Without a GPU the device cases skip, naming what CUDA said; the error
// cases that need no GPU run everywhere CUDA is built.
#include "runtime/cuda_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/cuda_check.h"
#include "base/error.h"
#include "runtime/cuda_stream.h"
#include "tests/support/capture_error.h"
#include "tests/support/cuda_test_support.h"

namespace zest::cuda {
namespace {

using ::testing::HasSubstr;

using testing::capture_error;

cudaError_t returns(cudaError_t status) { return status; }

TEST(CudaCheck, FailureNamesTheCallFileAndLine) {
  const int line = __LINE__ + 1;
  const Error error = capture_error([] { ZEST_CUDA_CHECK(returns(cudaErrorInvalidValue)); });
  EXPECT_EQ(error.kind(), ErrorKind::kDevice);
  EXPECT_THAT(error.what(), HasSubstr("returns(cudaErrorInvalidValue)"));
  EXPECT_THAT(error.what(), HasSubstr("cudaErrorInvalidValue"));
  EXPECT_THAT(error.what(), HasSubstr("cuda_device_cuda_test.cc:" + std::to_string(line)));
}

TEST(CudaCheck, MemoryAllocationFailureIsOutOfMemory) {
  EXPECT_THROW(ZEST_CUDA_CHECK(returns(cudaErrorMemoryAllocation)), OutOfMemory);
  EXPECT_NO_THROW(ZEST_CUDA_CHECK(returns(cudaSuccess)));
}

TEST(CudaDeviceSelection, NoDeviceOrTooFewIsAConfigErrorThatSaysWhy) {
  const DeviceCount devices = visible_devices();
  const Error error = capture_error([&] { select_device(devices.count); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("world.device"));
  if (devices.count == 0) {
    EXPECT_THAT(error.what(), HasSubstr("cudaGetDeviceCount"));
  } else {
    EXPECT_EQ(select_device(devices.count - 1), devices.count - 1);
  }
}

TEST(CudaDevice, CopiesAndFillsInStreamOrder) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  EXPECT_EQ(device.name(), "cuda:0");
  auto stream = device.create_stream("compute");
  const std::size_t n = 1 << 20;
  Buffer buffer = device.allocator().allocate(n * sizeof(float), Category::kParams);
  std::vector<float> in(n), out(n, -1.0f);
  for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i);
  device.copy(*stream, buffer.data(), in.data(), n * sizeof(float));
  device.fill_zero(*stream, buffer.as<float>() + n / 2, n / 2 * sizeof(float));
  device.copy(*stream, out.data(), buffer.data(), n * sizeof(float));
  stream->synchronize();
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], i < n / 2 ? static_cast<float>(i) : 0.0f) << "at " << i;
  }
}

TEST(CudaDevice, HostWorkRunsInEnqueueOrder) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  auto stream = device.create_stream("s");
  std::vector<int> seen;
  for (int i = 0; i < 1000; ++i) stream->enqueue([&seen, i] { seen.push_back(i); });
  stream->synchronize();
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(seen[i], i);
}

TEST(CudaDevice, AnEventOrdersAnotherStreamsCopy) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  auto producer = device.create_stream("producer");
  auto consumer = device.create_stream("consumer");
  auto ready = device.create_event();
  const std::size_t n = 1 << 16;
  Buffer buffer = device.allocator().allocate(n * sizeof(std::uint32_t), Category::kWorkspace);
  device.fill_zero(*producer, buffer.data(), n * sizeof(std::uint32_t));
  producer->synchronize();
  std::vector<std::uint32_t> pattern(n, 0xabcdef01u), out(n, 0);
  // The host work holds the producer back: without the event the consumer's copy would read
  // the zeros.
  producer->enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); });
  device.copy(*producer, buffer.data(), pattern.data(), n * sizeof(std::uint32_t));
  producer->record(*ready);
  consumer->wait(*ready);
  device.copy(*consumer, out.data(), buffer.data(), n * sizeof(std::uint32_t));
  consumer->synchronize();
  EXPECT_EQ(out, pattern);
  ready->synchronize();
}

TEST(CudaDevice, WaitingOnANeverRecordedEventIsANoOp) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  auto stream = device.create_stream("s");
  auto event = device.create_event();
  stream->wait(*event);
  event->synchronize();
  stream->synchronize();
}

TEST(CudaDevice, FailedHostWorkIsStickyAndNamesTheStream) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  auto stream = device.create_stream("rank 0 compute");
  bool ran_after = false;
  stream->enqueue([] { throw Error(ErrorKind::kData, "bad batch"); });
  stream->enqueue([&] { ran_after = true; });
  const Error error = capture_error([&] { stream->synchronize(); });
  EXPECT_EQ(error.kind(), ErrorKind::kData);
  EXPECT_THAT(error.what(), HasSubstr("stream 'rank 0 compute'"));
  EXPECT_THAT(error.what(), HasSubstr("bad batch"));
  EXPECT_FALSE(ran_after);
  EXPECT_THROW(stream->synchronize(), Error);  // sticky
}

TEST(CudaDevice, AFailureReachesTheStreamsThatWaitOnItsEvents) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  auto comm = device.create_stream("comm");
  auto compute = device.create_stream("compute");
  auto event = device.create_event();
  comm->enqueue([] { throw std::runtime_error("collective broke"); });
  comm->record(*event);
  compute->wait(*event);
  bool ran_after = false;
  compute->enqueue([&] { ran_after = true; });
  const Error error = capture_error([&] { compute->synchronize(); });
  EXPECT_EQ(error.kind(), ErrorKind::kPeerFailure);
  EXPECT_THAT(error.what(), HasSubstr("stream 'compute'"));
  EXPECT_THAT(error.what(), HasSubstr("stream 'comm'"));
  EXPECT_THAT(error.what(), HasSubstr("collective broke"));
  EXPECT_FALSE(ran_after);
  EXPECT_EQ(capture_error([&] { event->synchronize(); }).kind(), ErrorKind::kPeerFailure);
  EXPECT_EQ(capture_error([&] { comm->synchronize(); }).kind(), ErrorKind::kInternal);
}

TEST(CudaDevice, AnEventRecordedBeforeTheFailureCarriesNoFailure) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  auto first = device.create_stream("first");
  auto event = device.create_event();
  first->record(*event);
  first->enqueue([] { throw std::runtime_error("later"); });
  EXPECT_NO_THROW(event->synchronize());
  EXPECT_THROW(first->synchronize(), Error);
}

TEST(CudaAllocator, ChargesCategoriesAndKeepsPeaks) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  Allocator& allocator = device.allocator();
  {
    Buffer params = allocator.allocate(1000, Category::kParams);
    Buffer grads = allocator.allocate(3000, Category::kGrads);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(params.data()) % kAllocationAlignment, 0u);
    const MemoryUsage usage = allocator.usage();
    EXPECT_EQ(usage.current_of(Category::kParams), 1000u);
    EXPECT_EQ(usage.current_of(Category::kGrads), 3000u);
    EXPECT_EQ(usage.total_current, 4000u);
  }
  const MemoryUsage usage = allocator.usage();
  EXPECT_EQ(usage.total_current, 0u);
  EXPECT_EQ(usage.total_peak, 4000u);
  EXPECT_EQ(usage.peak_of(Category::kGrads), 3000u);
}

TEST(CudaAllocator, CapacityEmulatesASmallerGpu) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0, 1 << 20);
  Buffer kept = device.allocator().allocate(768 << 10, Category::kOptimizer);
  try {
    (void)device.allocator().allocate(512 << 10, Category::kActivations);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_THAT(error.what(), HasSubstr("cuda:0"));
    EXPECT_THAT(error.what(), HasSubstr("'activations'"));
    EXPECT_THAT(error.what(), HasSubstr("1.00 MiB capacity"));
    EXPECT_THAT(error.what(), HasSubstr("optimizer 768.00 KiB"));
  }
  EXPECT_EQ(device.allocator().usage().total_current, std::size_t{768} << 10);
}

TEST(CudaAllocator, WhatTheGpuRefusesIsOutOfMemoryAndUncharged) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  const std::size_t petabyte = std::size_t{1} << 50;
  EXPECT_THROW((void)device.allocator().allocate(petabyte, Category::kParams), OutOfMemory);
  EXPECT_EQ(device.allocator().usage().total_current, 0u);
  Buffer after = device.allocator().allocate(4096, Category::kParams);  // the pool still works
  EXPECT_FALSE(after.empty());
}

TEST(CudaAllocator, InjectedFailureHitsTheNextAllocationOfItsCategory) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  device.allocator().fail_next_allocation(Category::kActivations);
  Buffer other = device.allocator().allocate(64, Category::kParams);
  EXPECT_THROW((void)device.allocator().allocate(64, Category::kActivations), OutOfMemory);
  Buffer after = device.allocator().allocate(64, Category::kActivations);
}

TEST(CudaAllocator, APoolOpenedToAPeerGpuGrantsItReadAndWrite) {
  ZEST_SKIP_WITHOUT_CUDA();
  if (visible_devices().count < 2) {
    GTEST_SKIP() << "needs 2 GPUs, found " << visible_devices().count;
  }
  CudaDevice device(0);
  CudaPoolAllocator& pool = device.pool_allocator();
  EXPECT_TRUE(pool.grant_peer_access(0));  // its own GPU: nothing to grant
  int reachable = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&reachable, 1, 0), cudaSuccess);
  cudaMemLocation peer{};
  peer.type = cudaMemLocationTypeDevice;
  peer.id = 1;
  cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
  ASSERT_EQ(cudaMemPoolGetAccess(&flags, pool.pool(), &peer), cudaSuccess);
  EXPECT_EQ(flags, cudaMemAccessFlagsProtNone);  // a new pool is its own GPU's alone
  EXPECT_EQ(pool.grant_peer_access(1), reachable != 0);
  ASSERT_EQ(cudaMemPoolGetAccess(&flags, pool.pool(), &peer), cudaSuccess);
  EXPECT_EQ(flags, reachable != 0 ? cudaMemAccessFlagsProtReadWrite : cudaMemAccessFlagsProtNone);
}

TEST(CudaAllocator, ABufferFreedInHostWorkIsReturnedLater) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  auto& allocator = static_cast<CudaPoolAllocator&>(device.allocator());
  auto stream = device.create_stream("s");
  Buffer buffer = allocator.allocate(1 << 20, Category::kBuckets);
  device.fill_zero(*stream, buffer.data(), buffer.bytes());
  // The engine's stream-ordered free: the closure owns the buffer and drops it when it has run.
  auto owned = std::make_shared<Buffer>(std::move(buffer));
  stream->enqueue([owned = std::move(owned)]() mutable { owned.reset(); });
  stream->synchronize();
  EXPECT_EQ(allocator.usage().current_of(Category::kBuckets), 0u);
  EXPECT_EQ(allocator.deferred_count(), 1u);
  Buffer next = allocator.allocate(1 << 20, Category::kBuckets);  // returns the deferred first
  EXPECT_EQ(allocator.deferred_count(), 0u);
}

TEST(CudaAllocator, APinnedHostBufferFreedInHostWorkIsFreedLater) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  Allocator& host = device.host_allocator();
  auto stream = device.create_stream("s");
  // cudaFreeHost inside the host function would be a CUDA call there (forbidden: it may hang).
  auto owned = std::make_shared<Buffer>(host.allocate(1 << 20, Category::kOffload));
  stream->enqueue([owned = std::move(owned)]() mutable { owned.reset(); });
  stream->synchronize();
  EXPECT_EQ(host.usage().current_of(Category::kOffload), 0u);
  Buffer next = host.allocate(1 << 20, Category::kOffload);  // frees the deferred first
  EXPECT_FALSE(next.empty());
}

TEST(CudaAllocator, AllocatingInHostWorkIsRefusedAndUncharged) {
  ZEST_SKIP_WITHOUT_CUDA();
  CudaDevice device(0);
  auto stream = device.create_stream("s");
  Allocator& allocator = device.allocator();
  stream->enqueue([&allocator] { (void)allocator.allocate(64, Category::kWorkspace); });
  const Error error = capture_error([&] { stream->synchronize(); });
  EXPECT_EQ(error.kind(), ErrorKind::kInternal);
  EXPECT_THAT(error.what(), HasSubstr("host function"));
  EXPECT_EQ(allocator.usage().total_current, 0u);
}

}  // namespace
}  // namespace zest::cuda
