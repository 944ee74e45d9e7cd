// The NVMe tier: bytes written come back identical on both I/O engines, O_DIRECT-aligned or not;
// folders are made, locked, removed, and a dead run's are found and removed; free space is
// checked before anything is written; injected EIO, short reads and ENOSPC are one error naming
// the file and the offset.
#include "memory/swap_store.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/capture_error.h"
#include "tests/support/scratch_directory.h"

namespace zest {
namespace {

namespace fs = std::filesystem;
using testing::error_message;

// A host buffer aligned for O_DIRECT.
struct AlignedBytes {
  explicit AlignedBytes(std::size_t bytes)
      : data(static_cast<unsigned char*>(std::aligned_alloc(kSwapAlignment, bytes))), size(bytes) {}
  ~AlignedBytes() { std::free(data); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  unsigned char* data;
  std::size_t size;
};

void fill_random(unsigned char* data, std::size_t bytes, unsigned seed) {
  std::mt19937 draw(seed);
  for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(draw());
}

class SwapStoreTest : public testing::ScratchDirectoryTest,
                      public ::testing::WithParamInterface<SwapBackend> {
 protected:
  SwapOptions options(SwapFault fault = {}) const {
    SwapOptions result;
    result.path = dir_.string();
    result.block_size = 64 * 1024;  // several requests per transfer: queue_depth is used
    result.file_bytes = 1 << 20;
    result.io.backend = GetParam();
    result.io.queue_depth = 4;
    result.io.thread_count = 3;
    result.io.fault = fault;
    return result;
  }
  // Pre-existing folders under zest-swap (the run's own excluded): their names.
  std::vector<std::string> folders() const {
    std::vector<std::string> names;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(dir_ / "zest-swap", error)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }
};

TEST_P(SwapStoreTest, ReadReturnsTheBytesWrittenAlignedOrNot) {
  SwapStore store(options(), 0);
  const SwapRegion first = store.reserve(300 * 1024);      // rounded up to blocks
  const SwapRegion second = store.reserve(900 * 1024);     // does not fit the first file
  store.open();
  EXPECT_EQ(store.backend(), std::string(swap_backend_name(GetParam() == SwapBackend::kThreads
                                                                ? SwapBackend::kThreads
                                                                : SwapBackend::kIoUring)));
  EXPECT_EQ(first.bytes % kSwapAlignment, 0u);
  EXPECT_EQ(second.file, 1u);
  EXPECT_EQ(store.reserved_bytes(), first.bytes + second.bytes);
  AlignedBytes out(first.bytes), in(first.bytes);
  fill_random(out.data, out.size, 1);
  store.write(first, 0, out.data, out.size);
  std::memset(in.data, 0, in.size);
  store.read(first, 0, in.data, in.size);
  EXPECT_EQ(std::memcmp(in.data, out.data, out.size), 0);
  // Unaligned: an odd offset, an odd length, an odd host address.
  std::vector<unsigned char> odd(12345), back(12345);
  fill_random(odd.data(), odd.size(), 2);
  store.write(second, 777, odd.data(), odd.size());
  store.read(second, 777, back.data() + 0, back.size());
  EXPECT_EQ(odd, back);
  // The bytes are in the file where the region says: read with plain pread.
  std::vector<unsigned char> raw(odd.size());
  const int fd = ::open(store.files().at(1).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pread(fd, raw.data(), raw.size(), static_cast<off_t>(second.offset + 777)),
            static_cast<ssize_t>(raw.size()));
  ::close(fd);
  EXPECT_EQ(raw, odd);
  EXPECT_EQ(store.bytes_written(), out.size + odd.size());
}

TEST_P(SwapStoreTest, FilesArePreallocatedAndTheFolderRemovedWhenTheStoreGoes) {
  std::string folder;
  {
    SwapStore store(options(), 3);
    store.reserve(200 * 1024);
    store.open();
    folder = store.folder();
    ASSERT_TRUE(fs::is_directory(folder));
    EXPECT_NE(folder.find("rank3"), std::string::npos);
    EXPECT_EQ(fs::file_size(store.files().at(0)), 200u * 1024u);
    std::ifstream lock(folder + "/lock");
    long pid = 0;
    lock >> pid;
    EXPECT_EQ(pid, static_cast<long>(::getpid()));
  }
  EXPECT_FALSE(fs::exists(folder));
  EXPECT_FALSE(fs::exists(dir_ / "zest-swap"));  // it was the last folder
}

TEST_P(SwapStoreTest, ShapeOnlyStoreReservesTheSameBytesAndTouchesNoDisk) {
  SwapStore backed(options(), 0, true), shape(options(), 0, false);
  for (std::size_t bytes : {std::size_t{5000}, std::size_t{1 << 20}, std::size_t{4096}}) {
    backed.reserve(bytes);
    shape.reserve(bytes);
  }
  shape.open();
  EXPECT_EQ(shape.reserved_bytes(), backed.reserved_bytes());
  EXPECT_TRUE(shape.folder().empty());
  EXPECT_FALSE(fs::exists(dir_ / "zest-swap"));
}

TEST_P(SwapStoreTest, FolderOfAKilledRunIsRemovedAndALiveRunsIsKept) {
  // A dead pid: a child that has exited and been reaped.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  const fs::path root = dir_ / "zest-swap";
  fs::create_directories(root / "pid1-rank0");                     // pid 1 is alive: kept
  std::ofstream(root / "pid1-rank0" / "lock") << 1 << '\n';
  const std::string dead = "pid" + std::to_string(child) + "-rank0";
  fs::create_directories(root / dead);
  std::ofstream(root / dead / "lock") << child << '\n';
  std::ofstream(root / dead / "swap.0") << "old state";
  // This process's pid in a lock no live store holds: a killed run whose pid was reused.
  const std::string reused = "pid" + std::to_string(::getpid()) + "-rank0";
  fs::create_directories(root / reused);
  std::ofstream(root / reused / "lock") << ::getpid() << '\n';
  std::ofstream(root / reused / "swap.0") << "old state";
  {
    SwapStore store(options(), 0);
    store.reserve(4096);
    store.open();
    EXPECT_FALSE(fs::exists(root / dead));
    EXPECT_TRUE(fs::exists(root / "pid1-rank0"));
    // The reused name is this run's own again, made new (its old file gone).
    EXPECT_EQ(store.folder(), (root / reused).string());
    EXPECT_EQ(fs::file_size(store.files().at(0)), 4096u);
    // A second store of the same rank in the same process never shares the folder.
    SwapStore twin(options(), 0);
    twin.reserve(4096);
    twin.open();
    EXPECT_NE(twin.folder(), store.folder());
  }
  EXPECT_EQ(folders(), std::vector<std::string>{"pid1-rank0"});
}

TEST_P(SwapStoreTest, NotEnoughFreeSpaceIsOneLineWithPathNeededAndFree) {
  SwapStore store(options(), 1);
  store.reserve(std::size_t{1} << 50);  // a pebibyte
  const std::string message = error_message([&] { store.open(); }, ErrorKind::kIo);
  EXPECT_NE(message.find(dir_.string()), std::string::npos) << message;
  EXPECT_NE(message.find("needs 1125899906842624 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("free"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "zest-swap"));  // checked before anything was made
}

void expect_failure_names_file_and_offset(SwapStore& store, const std::string& message,
                                          const std::string& what, std::uint64_t offset) {
  EXPECT_NE(message.find(store.files().at(0)), std::string::npos) << message;
  EXPECT_NE(message.find("offset " + std::to_string(offset)), std::string::npos) << message;
  EXPECT_NE(message.find(what), std::string::npos) << message;
}

TEST_P(SwapStoreTest, InjectedIoErrorNamesTheFileAndOffset) {
  SwapStore store(options({SwapFaultKind::kIoError, 2}), 0);
  const SwapRegion region = store.reserve(256 * 1024);
  store.open();
  AlignedBytes bytes(region.bytes);
  fill_random(bytes.data, bytes.size, 3);
  // Writes are requests 0-3 of the write engine; the third fails.
  const std::string message =
      error_message([&] { store.write(region, 0, bytes.data, bytes.size); }, ErrorKind::kIo);
  expect_failure_names_file_and_offset(store, message, "Input/output error", 2 * 64 * 1024);
}

TEST_P(SwapStoreTest, InjectedShortReadNamesTheFileAndOffset) {
  SwapStore store(options({SwapFaultKind::kShortRead, 1}), 0);
  const SwapRegion region = store.reserve(128 * 1024);
  store.open();
  AlignedBytes bytes(region.bytes);
  store.write(region, 0, bytes.data, bytes.size);  // writes are not counted by a read fault
  const std::string message =
      error_message([&] { store.read(region, 0, bytes.data, bytes.size); }, ErrorKind::kIo);
  expect_failure_names_file_and_offset(store, message, "short read", 64 * 1024);
}

TEST_P(SwapStoreTest, InjectedNoSpaceNamesTheFileAndOffset) {
  SwapStore store(options({SwapFaultKind::kNoSpace, 0}), 0);
  const SwapRegion region = store.reserve(64 * 1024);
  store.open();
  AlignedBytes bytes(region.bytes);
  const std::string message =
      error_message([&] { store.write(region, 0, bytes.data, bytes.size); }, ErrorKind::kIo);
  expect_failure_names_file_and_offset(store, message, "No space left on device", 0);
}

// A real full file system where one can be mounted (root, a kernel that allows tmpfs here): the
// check before step 1 stops the run with the mount's own numbers, and leaves nothing behind.
TEST_P(SwapStoreTest, SmallTmpfsIsRefusedBeforeAnythingIsWritten) {
  const fs::path mount_point = dir_ / "tiny";
  fs::create_directories(mount_point);
  if (::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  SwapOptions small = options();
  small.path = mount_point.string();
  std::string message;
  {
    SwapStore store(small, 0);
    store.reserve(1 << 20);
    message = error_message([&] { store.open(); }, ErrorKind::kIo);
  }
  const bool empty = fs::is_empty(mount_point);
  ::umount(mount_point.c_str());
  EXPECT_NE(message.find(mount_point.string()), std::string::npos) << message;
  EXPECT_NE(message.find("needs 1048576 bytes"), std::string::npos) << message;
  EXPECT_TRUE(empty);
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapStoreTest,
                         ::testing::Values(SwapBackend::kIoUring, SwapBackend::kThreads),
                         [](const auto& info) { return std::string(swap_backend_name(info.param)); });

}  // namespace
}  // namespace zest
