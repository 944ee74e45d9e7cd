// The CPU stream and event: in-order work on one stream, ordering across streams through events,
// and errors that are never lost (sticky, re-raised by synchronize, passed on through events).
#include "runtime/cpu_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/support/capture_error.h"

namespace zest::cpu {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;

using Clock = std::chrono::steady_clock;

using testing::capture_error;

TEST(CpuStream, RunsWorkInEnqueueOrder) {
  CpuStream stream("s");
  std::vector<int> seen;
  constexpr int kTasks = 10000;
  for (int i = 0; i < kTasks; ++i) {
    stream.enqueue([&seen, i] { seen.push_back(i); });
  }
  stream.synchronize();
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(kTasks));
  for (int i = 0; i < kTasks; ++i) ASSERT_EQ(seen[i], i) << "at position " << i;
}

TEST(CpuStream, RunsWorkOnItsOwnThreadAsynchronously) {
  CpuStream stream("s");
  std::atomic<bool> release{false};
  std::atomic<bool> ran{false};
  std::thread::id worker_id;
  stream.enqueue([&] {
    worker_id = std::this_thread::get_id();
    while (!release.load()) std::this_thread::yield();
    ran = true;
  });
  // enqueue returned while the work is still blocked: it did not run on this thread.
  EXPECT_FALSE(ran.load());
  release = true;
  stream.synchronize();
  EXPECT_TRUE(ran.load());
  EXPECT_NE(worker_id, std::this_thread::get_id());
}

TEST(CpuStream, SynchronizeWaitsForAllEnqueuedWork) {
  CpuStream stream("s");
  std::atomic<int> done{0};
  for (int i = 0; i < 5; ++i) {
    stream.enqueue([&done] {
      std::this_thread::sleep_for(milliseconds(5));
      ++done;
    });
  }
  stream.synchronize();
  EXPECT_EQ(done.load(), 5);
}

TEST(CpuStream, SynchronizeOnAnIdleStreamReturns) {
  CpuStream stream("s");
  stream.synchronize();
  stream.synchronize();
}

TEST(CpuEvent, CrossStreamWaitOrdersReaderAfterWriter) {
  CpuStream writer("writer");
  CpuStream reader("reader");
  CpuEvent written;
  int value = 0;  // only touched by the streams' workers, ordered by the event
  int seen = -1;
  writer.enqueue([&value] {
    std::this_thread::sleep_for(milliseconds(50));
    value = 42;
  });
  writer.record(written);
  reader.wait(written);
  reader.enqueue([&] { seen = value; });
  reader.synchronize();
  EXPECT_EQ(seen, 42) << "the reader ran before the writer's work that preceded the event";
  writer.synchronize();
}

TEST(CpuEvent, WaitDoesNotBlockTheHost) {
  CpuStream writer("writer");
  CpuStream reader("reader");
  CpuEvent event;
  std::atomic<bool> release{false};
  writer.enqueue([&] {
    while (!release.load()) std::this_thread::yield();
  });
  writer.record(event);
  const auto start = Clock::now();
  reader.wait(event);  // must return at once; the reader's worker does the waiting
  EXPECT_LT(Clock::now() - start, milliseconds(100));
  release = true;
  reader.synchronize();
  writer.synchronize();
}

TEST(CpuEvent, WaitCoversOnlyWorkBeforeTheRecord) {
  // Work enqueued on the writer after record() does not hold the reader back.
  CpuStream writer("writer");
  CpuStream reader("reader");
  CpuEvent event;
  std::atomic<bool> release{false};
  std::atomic<bool> reader_ran{false};
  writer.record(event);
  writer.enqueue([&] {
    while (!release.load()) std::this_thread::yield();
  });
  reader.wait(event);
  reader.enqueue([&] { reader_ran = true; });
  reader.synchronize();
  EXPECT_TRUE(reader_ran.load());
  release = true;
  writer.synchronize();
}

// Another device's event, as a host stream sees a CUDA stream's: done when released.
class ForeignEvent final : public Event {
 public:
  void synchronize() override {
    std::unique_lock lock(mutex_);
    released_cv_.wait(lock, [&] { return released_; });
    if (!failure_.empty()) throw Error(ErrorKind::kDevice, failure_);
  }
  void release(std::string failure = "") {
    std::lock_guard lock(mutex_);
    released_ = true;
    failure_ = std::move(failure);
    released_cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_cv_;
  bool released_ = false;
  std::string failure_;
};

TEST(CpuEvent, WaitOnAnotherDevicesEventBlocksTheWorkAfterIt) {
  CpuStream stream("host");
  ForeignEvent event;
  std::atomic<bool> ran{false};
  stream.wait(event);  // returns at once: the host is not blocked
  stream.enqueue([&] { ran = true; });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(ran) << "work after the wait ran before the other device's event completed";
  event.release();
  stream.synchronize();
  EXPECT_TRUE(ran);
}

TEST(CpuEvent, AFailedForeignEventFailsTheWaitingStream) {
  CpuStream stream("host");
  ForeignEvent event;
  stream.wait(event);
  event.release("the GPU copy failed");
  const Error error = capture_error([&] { stream.synchronize(); });
  EXPECT_THAT(error.what(), HasSubstr("the GPU copy failed"));
}

TEST(CpuEvent, RecordingAnotherDevicesEventIsAUsageError) {
  CpuStream stream("host");
  ForeignEvent event;
  const Error error = capture_error([&] { stream.record(event); });
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_THAT(error.what(), HasSubstr("another device's event"));
}

TEST(CpuEvent, WaitingOnANeverRecordedEventIsANoOp) {
  CpuStream stream("s");
  CpuEvent never_recorded;
  bool ran = false;
  stream.wait(never_recorded);
  stream.enqueue([&ran] { ran = true; });
  const auto start = Clock::now();
  stream.synchronize();
  EXPECT_TRUE(ran);
  EXPECT_LT(Clock::now() - start, milliseconds(500));
}

TEST(CpuEvent, SynchronizeOnANeverRecordedEventReturnsAtOnce) {
  CpuEvent never_recorded;
  never_recorded.synchronize();
}

TEST(CpuEvent, HostSynchronizeWaitsForWorkBeforeTheRecord) {
  CpuStream stream("s");
  CpuEvent event;
  std::atomic<bool> done{false};
  stream.enqueue([&done] {
    std::this_thread::sleep_for(milliseconds(50));
    done = true;
  });
  stream.record(event);
  event.synchronize();
  EXPECT_TRUE(done.load());
  stream.synchronize();
}

TEST(CpuEvent, EventCanBeDestroyedRightAfterHostSynchronize) {
  // As with cudaEventDestroy after cudaEventSynchronize: once synchronize() returns, the stream
  // no longer touches the event. (A sanitizer build catches a late access.)
  CpuStream stream("s");
  for (int i = 0; i < 2000; ++i) {
    auto event = std::make_unique<CpuEvent>();
    stream.record(*event);
    event->synchronize();
  }
  stream.synchronize();
}

TEST(CpuEvent, RerecordedEventWaitsForTheLatestRecord) {
  CpuStream stream("s");
  CpuEvent event;
  std::atomic<int> stage{0};
  stream.enqueue([&stage] { stage = 1; });
  stream.record(event);
  event.synchronize();
  EXPECT_EQ(stage.load(), 1);
  stream.enqueue([&stage] {
    std::this_thread::sleep_for(milliseconds(30));
    stage = 2;
  });
  stream.record(event);
  event.synchronize();
  EXPECT_EQ(stage.load(), 2);
  stream.synchronize();
}

TEST(CpuStream, ErrorInWorkIsRaisedBySynchronizeNamingTheStream) {
  CpuStream stream("rank 3 compute");
  stream.enqueue([] { throw std::runtime_error("matmul exploded"); });
  Error error = capture_error([&] { stream.synchronize(); });
  EXPECT_THAT(error.what(), HasSubstr("rank 3 compute"));
  EXPECT_THAT(error.what(), HasSubstr("matmul exploded"));
}

TEST(CpuStream, ZestErrorKeepsItsKindThroughSynchronize) {
  CpuStream stream("s");
  stream.enqueue([] { throw Error(ErrorKind::kData, "shard 7 is truncated"); });
  Error error = capture_error([&] { stream.synchronize(); });
  EXPECT_EQ(error.kind(), ErrorKind::kData);
  EXPECT_THAT(error.what(), HasSubstr("shard 7 is truncated"));
}

TEST(CpuStream, FailureIsStickyAndLaterWorkIsSkipped) {
  CpuStream stream("s");
  std::atomic<int> ran_after{0};
  stream.enqueue([] { throw std::runtime_error("first failure"); });
  stream.enqueue([&ran_after] { ++ran_after; });
  EXPECT_THROW(stream.synchronize(), Error);
  // Still failed, with the same cause, and new work does not run either.
  stream.enqueue([&ran_after] { ++ran_after; });
  Error again = capture_error([&] { stream.synchronize(); });
  EXPECT_THAT(again.what(), HasSubstr("first failure"));
  EXPECT_EQ(ran_after.load(), 0);
}

TEST(CpuStream, FirstErrorWinsOverLaterOnes) {
  CpuStream stream("s");
  stream.enqueue([] { throw std::runtime_error("the cause"); });
  stream.enqueue([] { throw std::runtime_error("an echo"); });
  Error error = capture_error([&] { stream.synchronize(); });
  EXPECT_THAT(error.what(), HasSubstr("the cause"));
  EXPECT_THAT(error.what(), Not(HasSubstr("an echo")));
}

TEST(CpuStream, NonStandardExceptionStillFailsTheStream) {
  CpuStream stream("odd");
  stream.enqueue([] { throw 17; });
  Error error = capture_error([&] { stream.synchronize(); });
  EXPECT_EQ(error.kind(), ErrorKind::kInternal);
  EXPECT_THAT(error.what(), HasSubstr("odd"));
}

TEST(CpuStream, WaitingOnEventOfFailedStreamFailsWithoutHanging) {
  CpuStream producer("producer");
  CpuStream consumer("consumer");
  CpuEvent event;
  bool consumer_ran = false;
  producer.enqueue([] { throw std::runtime_error("producer broke"); });
  producer.record(event);
  consumer.wait(event);
  consumer.enqueue([&consumer_ran] { consumer_ran = true; });
  const auto start = Clock::now();
  Error error = capture_error([&] { consumer.synchronize(); });
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  EXPECT_EQ(error.kind(), ErrorKind::kPeerFailure);
  EXPECT_THAT(error.what(), HasSubstr("consumer"));
  EXPECT_THAT(error.what(), HasSubstr("producer"));
  EXPECT_THAT(error.what(), HasSubstr("producer broke"));
  EXPECT_FALSE(consumer_ran);
  EXPECT_THROW(producer.synchronize(), Error);
}

// Destroying a skipped task may free memory (the engine's stream-ordered frees capture their
// buffer), so a failed stream still honours its waits: the free comes after the other stream's
// use, as it would have without the failure.
TEST(CpuStream, AFailedStreamStillWaitsBeforeDroppingLaterWork) {
  struct OnDestroy {
    std::function<void()> call;
    ~OnDestroy() { call(); }
  };
  CpuStream user("user");
  CpuStream freer("freer");
  CpuEvent used;
  std::atomic<bool> use_finished{false};
  std::atomic<bool> dropped_after_use{false};
  user.enqueue([&use_finished] {
    std::this_thread::sleep_for(milliseconds(200));
    use_finished = true;
  });
  user.record(used);
  freer.enqueue([] { throw std::runtime_error("freer broke"); });
  freer.wait(used);
  auto guard = std::make_shared<OnDestroy>();
  guard->call = [&] { dropped_after_use = use_finished.load(); };
  freer.enqueue([guard] {});
  guard.reset();
  Error error = capture_error([&] { freer.synchronize(); });
  EXPECT_THAT(error.what(), HasSubstr("freer broke"));
  EXPECT_TRUE(dropped_after_use.load());
  user.synchronize();
}

TEST(CpuStream, RecordOnAFailedStreamStillCompletesTheEvent) {
  // The stream failed before the record: host waiters must not hang, and they see the failure.
  CpuStream stream("s");
  CpuEvent event;
  stream.enqueue([] { throw std::runtime_error("early failure"); });
  EXPECT_THROW(stream.synchronize(), Error);
  stream.record(event);
  Error error = capture_error([&] { event.synchronize(); });
  EXPECT_THAT(error.what(), HasSubstr("early failure"));
}

TEST(CpuEvent, HostSynchronizeOnEventOfFailedStreamThrows) {
  CpuStream stream("s");
  CpuEvent event;
  stream.enqueue([] { throw std::runtime_error("kernel fault"); });
  stream.record(event);
  Error error = capture_error([&] { event.synchronize(); });
  EXPECT_THAT(error.what(), HasSubstr("kernel fault"));
  EXPECT_THROW(stream.synchronize(), Error);
}

TEST(CpuStream, OutOfMemoryKeepsItsTypeThroughSynchronize) {
  CpuStream stream("rank 0 compute");
  stream.enqueue([] { throw OutOfMemory("out of memory on cpu:0: asked 4096 bytes"); });
  try {
    stream.synchronize();
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory);
    EXPECT_THAT(error.what(), HasSubstr("asked 4096 bytes"));
    EXPECT_THAT(error.what(), HasSubstr("rank 0 compute"));
  }
}

TEST(CpuStream, DestructionDrainsPendingWorkWithoutThrowing) {
  std::atomic<int> done{0};
  {
    CpuStream stream("s");
    for (int i = 0; i < 20; ++i) {
      stream.enqueue([&done] {
        std::this_thread::sleep_for(milliseconds(1));
        ++done;
      });
    }
  }
  EXPECT_EQ(done.load(), 20);
}

TEST(CpuStream, DestructionOfAFailedStreamDoesNotThrow) {
  std::atomic<int> ran_after{0};
  {
    CpuStream stream("s");
    stream.enqueue([] { throw std::runtime_error("never synchronized"); });
    stream.enqueue([&ran_after] { ++ran_after; });
  }
  EXPECT_EQ(ran_after.load(), 0);
}

TEST(CpuDevice, CopyAndFillAreStreamOrdered) {
  CpuDevice device(0);
  auto stream = device.create_stream("copy");
  EXPECT_EQ(stream->name(), "copy");
  EXPECT_EQ(stream->device_kind(), DeviceKind::kCpu);
  std::vector<int> source(1000), destination(1000, -1);
  stream->enqueue([&source] {
    std::this_thread::sleep_for(milliseconds(20));
    for (int i = 0; i < 1000; ++i) source[i] = i * 3;
  });
  device.copy(*stream, destination.data(), source.data(), 1000 * sizeof(int));
  device.fill_zero(*stream, destination.data(), 10 * sizeof(int));
  stream->synchronize();
  for (int i = 0; i < 10; ++i) ASSERT_EQ(destination[i], 0);
  for (int i = 10; i < 1000; ++i) ASSERT_EQ(destination[i], i * 3);
}

TEST(CpuDevice, EventsFromTheDeviceOrderItsStreams) {
  CpuDevice device(1);
  EXPECT_EQ(device.name(), "cpu:1");
  auto a = device.create_stream("a");
  auto b = device.create_stream("b");
  auto event = device.create_event();
  std::atomic<int> value{0};
  int seen = -1;
  a->enqueue([&value] {
    std::this_thread::sleep_for(milliseconds(30));
    value = 7;
  });
  a->record(*event);
  b->wait(*event);
  b->enqueue([&] { seen = value.load(); });
  b->synchronize();
  EXPECT_EQ(seen, 7);
  a->synchronize();
}

// The host arena (where an offloaded optimizer lives) has its own capacity and accounting, and
// copies between it and the device's memory are stream-ordered like any other.
TEST(CpuDevice, TheHostArenaIsASeparateAllocator) {
  CpuDevice device(2, 4096, 1024);
  EXPECT_EQ(device.allocator().capacity(), 4096u);
  EXPECT_EQ(device.host_allocator().capacity(), 1024u);
  EXPECT_EQ(device.host_allocator().device_name(), "cpu:2 host");
  Buffer on_device = device.allocator().allocate(1024, Category::kParams);
  Buffer on_host = device.host_allocator().allocate(1024, Category::kOffload);
  EXPECT_EQ(device.allocator().usage().total_current, 1024u);
  EXPECT_EQ(device.host_allocator().usage().current_of(Category::kOffload), 1024u);
  EXPECT_EQ(device.allocator().usage().current_of(Category::kOffload), 0u);
  auto stream = device.create_stream("copy");
  std::memset(on_device.data(), 0x5a, 1024);
  device.copy(*stream, on_host.data(), on_device.data(), 1024);
  stream->synchronize();
  EXPECT_EQ(std::memcmp(on_host.data(), on_device.data(), 1024), 0);
  EXPECT_THROW(device.host_allocator().allocate(1, Category::kOffload), OutOfMemory);
}

}  // namespace
}  // namespace zest::cpu
