// The NVMe tier: a rank's regions of preallocated swap files (memory/swap_folder.h), made of
// 4096-byte-aligned blocks and read and written with O_DIRECT through io_uring or pread/pwrite
// threads (memory/swap_io.h). Regions are reserved first, then open() checks the free space
// (statvfs) and makes the files at their full size, so a run that cannot hold its swap stops
// before step 1. A store that is not backed (the shape-only device's) reserves and counts the
// same regions and never touches a disk. Invariant: read() and write() block the calling thread
// until their bytes have moved (streams order them: runtime/swap_copies.h); reads and writes may
// run at once from two threads, each direction from one thread at a time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory/allocator.h"
#include "memory/category.h"
#include "memory/swap_folder.h"
#include "memory/swap_io.h"

namespace zest {

inline constexpr std::size_t kSwapAlignment = 4096;  // O_DIRECT's unit: offsets, sizes, buffers

// `bytes` rounded up to a multiple of `unit`.
inline std::size_t round_up(std::size_t bytes, std::size_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

// Host memory that O_DIRECT transfers of up to `bytes` go through: the allocator aligns to 64
// bytes and O_DIRECT wants kSwapAlignment, so one page more is allocated and `data` is its first
// aligned byte.
struct AlignedHostBuffer {
  Buffer buffer;
  char* data = nullptr;
};
AlignedHostBuffer allocate_aligned(Allocator& host, std::size_t bytes, Category category);

struct SwapOptions {
  std::string path;                     // nvme_path: the folder swap folders are made under
  std::size_t block_size = 1u << 20;    // aio.block_size: the largest single request
  std::size_t file_bytes = 4ull << 30;  // a swap file's largest size; a larger region has its own
  SwapIoOptions io;
};

// A run of aligned blocks in one swap file: where a tensor (or a group of them) lives.
struct SwapRegion {
  std::size_t file = 0;        // index in the store's files
  std::uint64_t offset = 0;    // in that file, a multiple of kSwapAlignment
  std::size_t bytes = 0;       // as reserved, a multiple of kSwapAlignment
};

class SwapStore {
 public:
  // `backed` false: a shape-only store (reserves and counts; makes no folder or file).
  SwapStore(SwapOptions options, int rank, bool backed = true);
  ~SwapStore();  // closes and removes the files and the folder
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // Before open(): a region of at least `bytes`, rounded up to kSwapAlignment.
  SwapRegion reserve(std::size_t bytes);
  // Checks the file system's free space for reserved_bytes() (one kIo Error naming the path, the
  // bytes needed and the bytes free), then makes the folder and preallocates the files.
  void open();
  bool is_open() const { return opened_; }
  bool backed() const { return backed_; }

  // `bytes` at `offset` within `region`. Aligned pieces (host address, offset and length, all
  // multiples of kSwapAlignment) go straight to the disk; others through the page cache.
  void read(const SwapRegion& region, std::size_t offset, void* destination, std::size_t bytes);
  void write(const SwapRegion& region, std::size_t offset, const void* source, std::size_t bytes);

  std::size_t reserved_bytes() const { return reserved_; }  // the files' total size once open
  std::uint64_t bytes_read() const { return bytes_read_.load(); }
  std::uint64_t bytes_written() const { return bytes_written_.load(); }
  const char* backend() const { return reads_ ? reads_->name() : "none"; }
  bool direct() const { return direct_; }  // false where the file system refuses O_DIRECT
  const std::string& folder() const;        // empty until open()
  const std::vector<std::string>& files() const { return paths_; }
  const SwapOptions& options() const { return options_; }

 private:
  struct File {
    int direct_fd = -1;    // O_DIRECT, or the buffered descriptor again where refused
    int buffered_fd = -1;  // for pieces that are not aligned
    std::size_t bytes = 0;
  };
  void transfer(bool write, const SwapRegion& region, std::size_t offset, void* data,
                std::size_t bytes);
  void check_free_space() const;
  void make_file(std::size_t index);

  SwapOptions options_;
  int rank_;
  bool backed_;
  bool opened_ = false;
  bool direct_ = true;
  std::size_t reserved_ = 0;
  std::vector<std::size_t> file_sizes_;  // as reserved
  std::unique_ptr<SwapFolder> folder_;
  std::vector<File> files_;
  std::vector<std::string> paths_;
  std::unique_ptr<SwapIo> reads_;   // Note: one engine per direction, so that a read stream and
  std::unique_ptr<SwapIo> writes_;  // a write stream overlap (an engine runs one batch at a time)
  std::atomic<std::uint64_t> bytes_read_{0};
  std::atomic<std::uint64_t> bytes_written_{0};
};

}  // namespace zest
