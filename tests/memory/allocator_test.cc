// The allocator's accounting (current and peak per category and in total), its capacity and the
// out-of-memory message, alignment, and Buffer ownership.
#include "memory/allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "memory/host_allocator.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * 1024;

TEST(Allocator, FreshAllocatorUsesNothing) {
  HostAllocator allocator("cpu:0");
  MemoryUsage usage = allocator.usage();
  for (Category c : all_categories()) {
    EXPECT_EQ(usage.current_of(c), 0u);
    EXPECT_EQ(usage.peak_of(c), 0u);
  }
  EXPECT_EQ(usage.total_current, 0u);
  EXPECT_EQ(usage.total_peak, 0u);
  EXPECT_EQ(usage.capacity, kUnlimitedCapacity);
  EXPECT_EQ(allocator.device_name(), "cpu:0");
}

TEST(Allocator, ChargesEachAllocationToItsCategory) {
  HostAllocator allocator("cpu:0");
  Buffer params = allocator.allocate(1000, Category::kParams);
  Buffer grads = allocator.allocate(300, Category::kGrads);
  Buffer more_params = allocator.allocate(24, Category::kParams);
  MemoryUsage usage = allocator.usage();
  EXPECT_EQ(usage.current_of(Category::kParams), 1024u);
  EXPECT_EQ(usage.current_of(Category::kGrads), 300u);
  EXPECT_EQ(usage.current_of(Category::kOptimizer), 0u);
  EXPECT_EQ(usage.total_current, 1324u);
  EXPECT_EQ(params.category(), Category::kParams);
  EXPECT_EQ(grads.category(), Category::kGrads);
  EXPECT_EQ(params.bytes(), 1000u);

  grads.reset();
  usage = allocator.usage();
  EXPECT_EQ(usage.current_of(Category::kGrads), 0u);
  EXPECT_EQ(usage.peak_of(Category::kGrads), 300u);
  EXPECT_EQ(usage.total_current, 1024u);
  EXPECT_TRUE(grads.empty());
}

TEST(Allocator, EveryCategoryIsAccountedSeparately) {
  HostAllocator allocator("cpu:0");
  std::vector<Buffer> buffers;
  std::size_t bytes = 100;
  for (Category c : all_categories()) {
    buffers.push_back(allocator.allocate(bytes, c));
    bytes += 100;
  }
  MemoryUsage usage = allocator.usage();
  bytes = 100;
  std::size_t total = 0;
  for (Category c : all_categories()) {
    EXPECT_EQ(usage.current_of(c), bytes) << category_name(c);
    EXPECT_EQ(usage.peak_of(c), bytes) << category_name(c);
    total += bytes;
    bytes += 100;
  }
  EXPECT_EQ(usage.total_current, total);
  buffers.clear();
  EXPECT_EQ(allocator.usage().total_current, 0u);
}

TEST(Allocator, TotalPeakIsPeakOfSumNotSumOfPeaks) {
  HostAllocator allocator("cpu:0");
  {
    Buffer activations = allocator.allocate(4 * kMiB, Category::kActivations);
  }
  {
    Buffer workspace = allocator.allocate(3 * kMiB, Category::kWorkspace);
  }
  MemoryUsage usage = allocator.usage();
  EXPECT_EQ(usage.peak_of(Category::kActivations), 4 * kMiB);
  EXPECT_EQ(usage.peak_of(Category::kWorkspace), 3 * kMiB);
  // The two were never alive together.
  EXPECT_EQ(usage.total_peak, 4 * kMiB);
  EXPECT_EQ(usage.total_current, 0u);

  Buffer a = allocator.allocate(2 * kMiB, Category::kActivations);
  Buffer w = allocator.allocate(3 * kMiB, Category::kWorkspace);
  usage = allocator.usage();
  EXPECT_EQ(usage.total_peak, 5 * kMiB);
  EXPECT_EQ(usage.peak_of(Category::kActivations), 4 * kMiB);
}

TEST(Allocator, PeakTracksTheHighWaterMarkWithinACategory) {
  HostAllocator allocator("cpu:0");
  Buffer first = allocator.allocate(100, Category::kBuckets);
  Buffer second = allocator.allocate(200, Category::kBuckets);
  first.reset();
  Buffer third = allocator.allocate(50, Category::kBuckets);
  MemoryUsage usage = allocator.usage();
  EXPECT_EQ(usage.current_of(Category::kBuckets), 250u);
  EXPECT_EQ(usage.peak_of(Category::kBuckets), 300u);
}

TEST(Allocator, ResetPeaksStartsANewWindowAtTheCurrentUse) {
  HostAllocator allocator("cpu:0");
  Buffer kept = allocator.allocate(1000, Category::kParams);
  {
    Buffer transient = allocator.allocate(5000, Category::kParams);
    Buffer scratch = allocator.allocate(700, Category::kWorkspace);
  }
  EXPECT_EQ(allocator.usage().peak_of(Category::kParams), 6000u);
  EXPECT_EQ(allocator.usage().total_peak, 6700u);

  allocator.reset_peaks();
  MemoryUsage usage = allocator.usage();
  EXPECT_EQ(usage.peak_of(Category::kParams), 1000u);
  EXPECT_EQ(usage.peak_of(Category::kWorkspace), 0u);
  EXPECT_EQ(usage.total_peak, 1000u);
  EXPECT_EQ(usage.current_of(Category::kParams), 1000u);

  Buffer scratch = allocator.allocate(200, Category::kWorkspace);
  usage = allocator.usage();
  EXPECT_EQ(usage.peak_of(Category::kWorkspace), 200u);
  EXPECT_EQ(usage.total_peak, 1200u);
}

TEST(Allocator, AllocationWithinCapacitySucceedsUpToTheLastByte) {
  HostAllocator allocator("cpu:0", 10 * kKiB);
  Buffer a = allocator.allocate(6 * kKiB, Category::kParams);
  Buffer b = allocator.allocate(4 * kKiB, Category::kGrads);
  EXPECT_EQ(allocator.usage().total_current, 10 * kKiB);
  EXPECT_THROW(allocator.allocate(1, Category::kWorkspace), OutOfMemory);
  b.reset();
  Buffer c = allocator.allocate(4 * kKiB, Category::kWorkspace);  // freed bytes are usable again
  EXPECT_EQ(allocator.usage().total_current, 10 * kKiB);
}

TEST(Allocator, PassingCapacityThrowsOutOfMemoryWithTheWholePicture) {
  HostAllocator allocator("cpu:5", 2 * kMiB);
  Buffer params = allocator.allocate(kMiB, Category::kParams);
  Buffer optimizer = allocator.allocate(512 * kKiB, Category::kOptimizer);
  try {
    allocator.allocate(768 * kKiB + 1, Category::kActivations);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory);
    EXPECT_THAT(message, HasSubstr("cpu:5"));
    EXPECT_THAT(message, HasSubstr("786433"));          // the bytes asked, exactly
    EXPECT_THAT(message, HasSubstr("activations"));     // the category asked for
    EXPECT_THAT(message, HasSubstr("params 1.00 MiB"));  // each category's use
    EXPECT_THAT(message, HasSubstr("optimizer 512.00 KiB"));
    EXPECT_THAT(message, HasSubstr("grads 0 B"));
    for (Category c : all_categories()) EXPECT_THAT(message, HasSubstr(category_name(c)));
    EXPECT_THAT(message, HasSubstr("2.00 MiB"));  // the capacity
    EXPECT_THAT(message, HasSubstr("capacity"));
  }
  // A refused allocation charges nothing.
  MemoryUsage usage = allocator.usage();
  EXPECT_EQ(usage.current_of(Category::kActivations), 0u);
  EXPECT_EQ(usage.peak_of(Category::kActivations), 0u);
  EXPECT_EQ(usage.total_current, kMiB + 512 * kKiB);
  EXPECT_EQ(usage.total_peak, kMiB + 512 * kKiB);
}

TEST(Allocator, OutOfMemoryIsCatchableAsError) {
  HostAllocator allocator("cpu:0", 100);
  try {
    allocator.allocate(101, Category::kGather);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory);
    EXPECT_THAT(error.what(), HasSubstr("gather"));
  }
}

TEST(Allocator, AbsurdRequestIsOutOfMemoryNotAnOverflow) {
  // With no capacity set the device itself must refuse; the size must not wrap around when it
  // is rounded up to the alignment.
  HostAllocator allocator("cpu:0");
  // Note: only sizes refused before the device is asked; a sanitizer's aligned_alloc aborts on
  // a merely huge size instead of returning null.
  for (std::size_t bytes : {kUnlimitedCapacity, kUnlimitedCapacity - 1,
                            kUnlimitedCapacity - kAllocationAlignment + 2}) {
    EXPECT_THROW(allocator.allocate(bytes, Category::kParams), OutOfMemory) << bytes;
    EXPECT_EQ(allocator.usage().total_current, 0u);
  }
}

TEST(Allocator, AllocationsAreAlignedTo64Bytes) {
  static_assert(kAllocationAlignment == 64);
  HostAllocator allocator("cpu:0");
  std::mt19937 random(1234);
  std::uniform_int_distribution<std::size_t> size(1, 4097);
  std::vector<Buffer> buffers;
  std::size_t total = 0;
  for (int i = 0; i < 500; ++i) {
    const std::size_t bytes = size(random) | 1;  // odd sizes
    buffers.push_back(allocator.allocate(bytes, Category::kWorkspace));
    total += bytes;
    const auto address = reinterpret_cast<std::uintptr_t>(buffers.back().data());
    ASSERT_EQ(address % 64, 0u) << "allocation " << i << " of " << bytes << " bytes";
    // The whole requested range is writable.
    std::memset(buffers.back().data(), 0xab, bytes);
  }
  EXPECT_EQ(allocator.usage().current_of(Category::kWorkspace), total);
  // No two live buffers overlap.
  std::set<std::uintptr_t> starts;
  for (const Buffer& b : buffers) starts.insert(reinterpret_cast<std::uintptr_t>(b.data()));
  EXPECT_EQ(starts.size(), buffers.size());
  buffers.clear();
  EXPECT_EQ(allocator.usage().total_current, 0u);
}

TEST(Allocator, ZeroByteAllocationIsEmptyAndFree) {
  HostAllocator allocator("cpu:0", 0);  // even with no capacity at all
  Buffer buffer = allocator.allocate(0, Category::kParams);
  EXPECT_TRUE(buffer.empty());
  EXPECT_EQ(buffer.bytes(), 0u);
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_EQ(allocator.usage().total_current, 0u);
  EXPECT_EQ(allocator.usage().total_peak, 0u);
  buffer.reset();
  EXPECT_EQ(allocator.usage().total_current, 0u);
}

TEST(Buffer, DefaultBufferIsEmpty) {
  Buffer buffer;
  EXPECT_TRUE(buffer.empty());
  EXPECT_EQ(buffer.data(), nullptr);
  buffer.reset();
}

TEST(Buffer, MoveConstructionTransfersOwnership) {
  HostAllocator allocator("cpu:0");
  Buffer source = allocator.allocate(256, Category::kGrads);
  void* data = source.data();
  Buffer destination(std::move(source));
  EXPECT_EQ(destination.data(), data);
  EXPECT_EQ(destination.bytes(), 256u);
  EXPECT_EQ(destination.category(), Category::kGrads);
  EXPECT_TRUE(source.empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(source.data(), nullptr);
  source.reset();  // returns nothing
  EXPECT_EQ(allocator.usage().current_of(Category::kGrads), 256u);
  destination.reset();
  EXPECT_EQ(allocator.usage().current_of(Category::kGrads), 0u);
}

TEST(Buffer, MoveAssignmentReturnsTheOverwrittenBytesOnce) {
  HostAllocator allocator("cpu:0");
  Buffer a = allocator.allocate(100, Category::kParams);
  Buffer b = allocator.allocate(40, Category::kGrads);
  a = std::move(b);  // a's 100 params bytes go back; b's 40 grads bytes move to a
  MemoryUsage usage = allocator.usage();
  EXPECT_EQ(usage.current_of(Category::kParams), 0u);
  EXPECT_EQ(usage.current_of(Category::kGrads), 40u);
  EXPECT_EQ(a.bytes(), 40u);
  EXPECT_EQ(a.category(), Category::kGrads);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move)
  {
    Buffer sink = std::move(a);
  }
  EXPECT_EQ(allocator.usage().total_current, 0u);
  a.reset();
  b.reset();
  EXPECT_EQ(allocator.usage().total_current, 0u);
}

TEST(Buffer, SelfMoveAssignmentKeepsTheBuffer) {
  HostAllocator allocator("cpu:0");
  Buffer a = allocator.allocate(64, Category::kParams);
  void* data = a.data();
  Buffer& alias = a;
  a = std::move(alias);
  EXPECT_EQ(a.data(), data);
  EXPECT_EQ(allocator.usage().total_current, 64u);
}

TEST(Buffer, ManyMovesReturnBytesExactlyOnce) {
  HostAllocator allocator("cpu:0");
  {
    std::vector<Buffer> buffers;
    for (int i = 0; i < 100; ++i) {
      buffers.push_back(allocator.allocate(10 + i, Category::kActivations));  // reallocations move
    }
    std::vector<Buffer> moved;
    for (auto& b : buffers) moved.push_back(std::move(b));
    buffers.clear();
    std::size_t expected = 0;
    for (int i = 0; i < 100; ++i) expected += 10 + i;
    EXPECT_EQ(allocator.usage().total_current, expected);
  }
  EXPECT_EQ(allocator.usage().total_current, 0u);
}

TEST(Buffer, TypedViewPointsAtTheData) {
  HostAllocator allocator("cpu:0");
  Buffer buffer = allocator.allocate(16 * sizeof(float), Category::kParams);
  float* values = buffer.as<float>();
  EXPECT_EQ(static_cast<void*>(values), buffer.data());
  for (int i = 0; i < 16; ++i) values[i] = static_cast<float>(i);
  EXPECT_EQ(buffer.as<float>()[15], 15.0f);
}

TEST(Allocator, AnOutOfMemoryEndsWithTheAllocatorsAdvice) {
  HostAllocator device("cpu:0", kKiB);
  HostAllocator host("cpu:0 host", kKiB, "give the host arena more memory (world.host_memory)");
  try {
    device.allocate(2 * kKiB, Category::kParams);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_THAT(error.what(), HasSubstr("]; lower the micro-batch size or raise the stage, or give "
                                        "the device more memory (world.device_memory)"));
  }
  try {
    host.allocate(2 * kKiB, Category::kOffload);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_THAT(error.what(), HasSubstr("out of memory on cpu:0 host: asked 2.00 KiB"));
    EXPECT_THAT(error.what(), HasSubstr("for 'offload'"));
    EXPECT_THAT(error.what(),
                HasSubstr("]; give the host arena more memory (world.host_memory)"));
  }
}

}  // namespace
}  // namespace zest
