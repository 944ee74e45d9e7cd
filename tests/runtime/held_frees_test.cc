// Frees held until a wait proves them (FreeTiming::kWhenWaited, WorldOptions::hold_frees): a
// stream-ordered free runs when the host proves its stream passed it, directly or through a
// stream that waited for it, and never earlier however far the worker has got.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "memory/category.h"
#include "runtime/cpu_device.h"
#include "runtime/cpu_stream.h"
#include "runtime/release_after.h"

namespace zest::cpu {
namespace {

// Lets the workers reach everything enqueued so far without anyone waiting: a held free must
// still not have run afterwards.
void let_the_workers_run() { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }

TEST(HeldFrees, AFreeWaitsForTheHostToProveItsStreamPassedIt) {
  CpuStream stream("s", FreeTiming::kWhenWaited);
  CpuEvent before;
  CpuEvent after;
  std::atomic<int> freed{0};
  stream.record(before);
  stream.enqueue_free([&] { ++freed; });
  stream.record(after);
  let_the_workers_run();
  EXPECT_EQ(freed, 0);  // the worker passed it; nobody has waited
  before.synchronize();
  EXPECT_EQ(freed, 0);  // a record before the free proves nothing about it
  after.synchronize();
  EXPECT_EQ(freed, 1);
  stream.synchronize();
  EXPECT_EQ(freed, 1);  // once
}

TEST(HeldFrees, WithoutHoldingAFreeRunsWhenTheWorkerReachesIt) {
  CpuStream stream("s");
  std::atomic<int> freed{0};
  stream.enqueue_free([&] { ++freed; });
  for (int tries = 0; tries < 1000 && freed == 0; ++tries) let_the_workers_run();
  EXPECT_EQ(freed, 1);
}

TEST(HeldFrees, AStreamThatWaitedPassesTheProofOnToTheHost) {
  CpuStream producer("producer", FreeTiming::kWhenWaited);
  CpuStream consumer("consumer", FreeTiming::kWhenWaited);
  CpuEvent produced;
  CpuEvent consumed;
  std::atomic<int> freed{0};
  producer.enqueue_free([&] { ++freed; });
  producer.record(produced);
  consumer.wait(produced);
  consumer.record(consumed);
  let_the_workers_run();
  EXPECT_EQ(freed, 0);  // the consumer's wait proves it to the consumer only
  consumed.synchronize();
  EXPECT_EQ(freed, 1);
}

TEST(HeldFrees, TheRecordingStreamsOwnProofStillCountsAfterAnotherStreamAdoptedIt) {
  CpuStream producer("producer", FreeTiming::kWhenWaited);
  CpuStream consumer("consumer", FreeTiming::kWhenWaited);
  CpuEvent produced;
  std::atomic<int> freed{0};
  producer.enqueue_free([&] { ++freed; });
  producer.record(produced);
  consumer.wait(produced);
  let_the_workers_run();  // the consumer has adopted the free
  produced.synchronize();
  EXPECT_EQ(freed, 1);
  consumer.synchronize();
  EXPECT_EQ(freed, 1);
}

TEST(HeldFrees, StreamsWaitingOnEachOtherHoldEachFreeOnce) {
  CpuStream compute("compute", FreeTiming::kWhenWaited);
  CpuStream comm("comm", FreeTiming::kWhenWaited);
  CpuEvent on_compute;
  CpuEvent on_comm;
  std::atomic<int> freed{0};
  for (int round = 0; round < 200; ++round) {  // a gather ring's back-and-forth
    compute.enqueue_free([&] { ++freed; });
    compute.record(on_compute);
    comm.wait(on_compute);
    comm.enqueue_free([&] { ++freed; });
    comm.record(on_comm);
    compute.wait(on_comm);
  }
  compute.synchronize();
  EXPECT_EQ(freed, 400);
  comm.synchronize();
  EXPECT_EQ(freed, 400);
}

TEST(HeldFrees, DestroyingTheStreamRunsWhatNobodyProved) {
  std::atomic<int> freed{0};
  {
    CpuStream stream("s", FreeTiming::kWhenWaited);
    stream.enqueue_free([&] { ++freed; });
    let_the_workers_run();
    EXPECT_EQ(freed, 0);
  }
  EXPECT_EQ(freed, 1);
}

TEST(HeldFrees, ReleaseAfterOnAHoldingDeviceFreesAtTheProof) {
  CpuDevice device(0, kUnlimitedCapacity, kUnlimitedCapacity, FreeTiming::kWhenWaited);
  auto stream = device.create_stream("s");
  auto event = device.create_event();
  release_after(device, *stream, device.allocator().allocate(4096, Category::kWorkspace));
  stream->record(*event);
  let_the_workers_run();
  EXPECT_EQ(device.allocator().usage().current_of(Category::kWorkspace), 4096u);
  event->synchronize();
  EXPECT_EQ(device.allocator().usage().current_of(Category::kWorkspace), 0u);
}

}  // namespace
}  // namespace zest::cpu
