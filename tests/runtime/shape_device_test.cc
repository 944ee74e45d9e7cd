// The shape-only device: memory accounted by category but never backed, streams that run no
// work and free in the CPU device's held order (a free runs when a wait proves its stream
// passed it), a communicator of one rank standing in for a world, and host reads of zeros.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstdint>
#include <memory>

#include "base/error.h"
#include "memory/category.h"
#include "runtime/host_copies.h"
#include "runtime/release_after.h"
#include "runtime/shape_communicator.h"
#include "runtime/shape_device.h"
#include "runtime/shape_stream.h"

namespace zest::shape {
namespace {

constexpr std::size_t kTebibyte = std::size_t{1} << 40;

// Buffers of one alignment each, released on shape streams; freed() counts those freed so far.
class Blocks {
 public:
  Buffer take() {
    ++taken_;
    return memory_.allocate(kAllocationAlignment, Category::kWorkspace);
  }
  int freed() const {
    const std::size_t held = memory_.usage().current_of(Category::kWorkspace);
    return taken_ - static_cast<int>(held / kAllocationAlignment);
  }
  ShapeAllocator& memory() { return memory_; }

 private:
  ShapeAllocator memory_{"blocks"};
  int taken_ = 0;
};

long max_resident_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

TEST(ShapeDevice, AccountsATebibyteByCategoryWithoutBackingIt) {
  ShapeDevice device(0);
  const long before = max_resident_kib();
  Buffer params = device.allocator().allocate(kTebibyte, Category::kParams);
  Buffer gather = device.allocator().allocate(3 * kTebibyte, Category::kGather);
  Buffer offload = device.host_allocator().allocate(kTebibyte, Category::kOffload);
  EXPECT_NE(params.data(), nullptr);
  EXPECT_NE(params.data(), gather.data());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(gather.data()) % kAllocationAlignment, 0u);
  EXPECT_EQ(device.allocator().usage().peak_of(Category::kGather), 3 * kTebibyte);
  EXPECT_EQ(device.allocator().usage().total_peak, 4 * kTebibyte);
  EXPECT_EQ(device.host_allocator().usage().peak_of(Category::kOffload), kTebibyte);
  EXPECT_LT(max_resident_kib() - before, 1024);  // a MiB at most, of bookkeeping
  gather.reset();
  EXPECT_EQ(device.allocator().usage().total_current, kTebibyte);
}

TEST(ShapeDevice, KeepsItsCapacity) {
  ShapeDevice device(0, DeviceKind::kCpu, /*capacity=*/1 << 20);
  EXPECT_THROW(device.allocator().allocate((1 << 20) + 1, Category::kActivations), OutOfMemory);
}

TEST(ShapeDevice, RunsNoWorkAndReadsZeros) {
  ShapeDevice device(0);
  EXPECT_FALSE(runs_work(device));
  auto stream = device.create_stream("compute");
  bool ran = false;
  stream->enqueue([&] { ran = true; });
  Buffer loss = device.allocator().allocate(sizeof(float), Category::kWorkspace);
  device.fill_zero(*stream, loss.data(), loss.bytes());
  const float written = 2.5f;
  write_from_host(device, *stream, loss.data(), &written, sizeof written);
  float read = 7.0f;
  read_to_host(device, *stream, &read, loss.data(), sizeof read);
  EXPECT_FALSE(ran);
  EXPECT_EQ(read, 0.0f);
}

TEST(ShapeStream, AFreeWaitsForTheHostToProveItsStreamPassedIt) {
  Blocks blocks;  // before the streams, whose destructors free into it
  ShapeStream stream("s", DeviceKind::kCpu, blocks.memory());
  ShapeEvent before;
  ShapeEvent after;
  stream.record(before);
  stream.release_after(blocks.take());
  stream.record(after);
  before.synchronize();
  EXPECT_EQ(blocks.freed(), 0);  // a record before the free proves nothing about it
  after.synchronize();
  EXPECT_EQ(blocks.freed(), 1);
  stream.synchronize();
  EXPECT_EQ(blocks.freed(), 1);  // once
}

TEST(ShapeStream, AStreamThatWaitedPassesTheProofOnToTheHost) {
  Blocks blocks;  // before the streams, whose destructors free into it
  ShapeStream producer("producer", DeviceKind::kCpu, blocks.memory());
  ShapeStream consumer("consumer", DeviceKind::kCpu, blocks.memory());
  ShapeEvent produced;
  ShapeEvent consumed;
  producer.release_after(blocks.take());
  producer.record(produced);
  consumer.wait(produced);
  consumer.record(consumed);
  EXPECT_EQ(blocks.freed(), 0);  // the consumer's wait proves it to the consumer only
  consumed.synchronize();
  EXPECT_EQ(blocks.freed(), 1);
  producer.synchronize();
  EXPECT_EQ(blocks.freed(), 1);
}

TEST(ShapeStream, AWaitProvesNothingEnqueuedAfterTheRecord) {
  Blocks blocks;  // before the streams: the producer's destructor runs the free it still holds
  ShapeStream producer("producer", DeviceKind::kCpu, blocks.memory());
  ShapeStream consumer("consumer", DeviceKind::kCpu, blocks.memory());
  ShapeEvent produced;
  producer.record(produced);
  producer.release_after(blocks.take());
  consumer.wait(produced);
  consumer.synchronize();
  EXPECT_EQ(blocks.freed(), 0);
}

TEST(ShapeStream, StreamsWaitingOnEachOtherHoldEachFreeOnce) {
  Blocks blocks;  // before the streams, whose destructors free into it
  ShapeStream compute("compute", DeviceKind::kCpu, blocks.memory());
  ShapeStream comm("comm", DeviceKind::kCpu, blocks.memory());
  ShapeEvent on_compute;
  ShapeEvent on_comm;
  for (int round = 0; round < 200; ++round) {  // a gather ring's back-and-forth
    compute.release_after(blocks.take());
    compute.record(on_compute);
    comm.wait(on_compute);
    comm.release_after(blocks.take());
    comm.record(on_comm);
    compute.wait(on_comm);
  }
  compute.synchronize();
  EXPECT_EQ(blocks.freed(), 400);
  comm.synchronize();
  EXPECT_EQ(blocks.freed(), 400);
}

TEST(ShapeStream, DestroyingTheStreamRunsWhatNobodyProved) {
  Blocks blocks;
  {
    ShapeStream stream("s", DeviceKind::kCpu, blocks.memory());
    stream.release_after(blocks.take());
    EXPECT_EQ(blocks.freed(), 0);
  }
  EXPECT_EQ(blocks.freed(), 1);
}

TEST(ShapeStream, ReleaseAfterFreesAtTheProof) {
  ShapeDevice device(0);
  auto stream = device.create_stream("s");
  auto event = device.create_event();
  release_after(device, *stream, device.allocator().allocate(4096, Category::kWorkspace));
  stream->record(*event);
  EXPECT_EQ(device.allocator().usage().current_of(Category::kWorkspace), 4096u);
  event->synchronize();
  EXPECT_EQ(device.allocator().usage().current_of(Category::kWorkspace), 0u);
}

TEST(ShapeDevice, StandingInForCudaTakesCudaPathsWhileKernelsSeeTheCpu) {
  ShapeDevice device(0, DeviceKind::kCuda);
  EXPECT_EQ(device.kind(), DeviceKind::kCuda);  // the engine's paths: the batch copied in, ...
  auto stream = device.create_stream("compute");
  EXPECT_EQ(stream->device_kind(), DeviceKind::kCpu);  // ... a kernel's body: a dropped closure
  bool ran = false;
  stream->enqueue([&] { ran = true; });
  stream->synchronize();
  EXPECT_FALSE(ran);
}

TEST(ShapeStream, StandingInForCudaFreesDeviceMemoryAtTheReleaseAndHostMemoryAtTheProof) {
  ShapeDevice device(0, DeviceKind::kCuda);
  auto stream = device.create_stream("s");
  release_after(device, *stream, device.allocator().allocate(4096, Category::kWorkspace));
  EXPECT_EQ(device.allocator().usage().current_of(Category::kWorkspace), 0u);  // the pool's way
  EXPECT_EQ(device.allocator().usage().peak_of(Category::kWorkspace), 4096u);
  release_after(device, *stream, device.host_allocator().allocate(4096, Category::kOffload));
  EXPECT_EQ(device.host_allocator().usage().current_of(Category::kOffload), 4096u);
  stream->synchronize();
  EXPECT_EQ(device.host_allocator().usage().current_of(Category::kOffload), 0u);
}

TEST(ShapeStream, StandingInForCudaAKernelsScratchOnlyGrowsAndTheOldGoesFirst) {
  ShapeDevice device(0, DeviceKind::kCuda);
  auto stream = device.create_stream("compute");
  auto& shape_stream = dynamic_cast<ShapeStream&>(*stream);
  shape_stream.workspace(1 << 20);
  shape_stream.workspace(1 << 10);  // fits: nothing new
  EXPECT_EQ(device.allocator().usage().current_of(Category::kWorkspace), 1u << 20);
  shape_stream.workspace(3 << 20);
  EXPECT_EQ(device.allocator().usage().current_of(Category::kWorkspace), 3u << 20);
  EXPECT_EQ(device.allocator().usage().peak_of(Category::kWorkspace), 3u << 20);
}

TEST(ShapeStream, StandingInForTheCpuNoKernelTakesScratchFromTheStream) {
  ShapeDevice device(0);
  auto stream = device.create_stream("compute");
  dynamic_cast<ShapeStream&>(*stream).workspace(1 << 20);
  EXPECT_EQ(device.allocator().usage().peak_of(Category::kWorkspace), 0u);
}

TEST(ShapeCommunicator, IsOneRankOfTheWorldItStandsFor) {
  ShapeDevice device(0);
  auto stream = device.create_stream("comm");
  ShapeCommunicator shape_communicator(5, 64);
  Communicator& communicator = shape_communicator;
  EXPECT_EQ(communicator.rank(), 5);
  EXPECT_EQ(communicator.world_size(), 64);
  Buffer shard = device.allocator().allocate(1024, Category::kGrads);
  Buffer full = device.allocator().allocate(64 * 1024, Category::kBuckets);
  communicator.reduce_scatter(*stream, full.data(), shard.data(), 256, DType::kFloat32);
  communicator.all_gather(*stream, shard.data(), full.data(), 256, DType::kFloat32);
  stream->synchronize();  // nothing ran, nothing to wait for
  EXPECT_THROW(communicator.split(0, 5, "a group", {}), Error);
  EXPECT_THROW(ShapeCommunicator(/*rank=*/64, /*world_size=*/64), Error);
}

TEST(ShapeCommunicator, SplitsAnswerTheGroupsItWasToldInOrderThenRefuse) {
  ShapeCommunicator world(0, 8, {{0, 4}, {1, 2}});
  const auto first = world.split(0, 0, "first", {});
  EXPECT_EQ(first->rank(), 0);
  EXPECT_EQ(first->world_size(), 4);
  const auto second = world.split(1, 0, "second", {});
  EXPECT_EQ(second->rank(), 1);
  EXPECT_EQ(second->world_size(), 2);
  EXPECT_THROW(world.split(0, 0, "third", {}), Error);
}

TEST(ShapeCommunicator, AGroupSplitOffAnswersItsOwnSplitsThenRefuses) {
  // A pipeline stage's data-parallel group of 4, from which hpZ splits a group of 2.
  ShapeCommunicator world(4, 8, {{0, 4, {{1, 2}}}, {1, 2}});
  const auto data_parallel = world.split(1, 0, "data-parallel", {});
  EXPECT_EQ(data_parallel->world_size(), 4);
  const auto hpz = data_parallel->split(0, 0, "hpZ", {});
  EXPECT_EQ(hpz->rank(), 1);
  EXPECT_EQ(hpz->world_size(), 2);
  EXPECT_THROW(data_parallel->split(0, 0, "another", {}), Error);
  EXPECT_THROW(hpz->split(0, 0, "below hpZ", {}), Error);
  EXPECT_EQ(world.split(0, 0, "pipeline", {})->world_size(), 2);
}

}  // namespace
}  // namespace zest::shape
