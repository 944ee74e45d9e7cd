#include "memory/swap_store.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/byte_size.h"
#include "base/error.h"

namespace zest {

namespace {

bool aligned(std::uint64_t value) { return value % kSwapAlignment == 0; }

}  // namespace

AlignedHostBuffer allocate_aligned(Allocator& host, std::size_t bytes, Category category) {
  AlignedHostBuffer aligned;
  aligned.buffer = host.allocate(bytes + kSwapAlignment, category);
  const auto address = reinterpret_cast<std::uintptr_t>(aligned.buffer.data());
  aligned.data = aligned.buffer.as<char>() + (round_up(address, kSwapAlignment) - address);
  return aligned;
}

SwapStore::SwapStore(SwapOptions options, int rank, bool backed)
    : options_(std::move(options)), rank_(rank), backed_(backed) {
  options_.block_size = std::max(kSwapAlignment, round_up(options_.block_size, kSwapAlignment));
  options_.file_bytes = std::max(kSwapAlignment, round_up(options_.file_bytes, kSwapAlignment));
}

SwapStore::~SwapStore() {
  for (File& file : files_) {
    if (file.direct_fd >= 0 && file.direct_fd != file.buffered_fd) ::close(file.direct_fd);
    if (file.buffered_fd >= 0) ::close(file.buffered_fd);
  }
  // folder_ goes next, removing the files with it.
}

const std::string& SwapStore::folder() const {
  static const std::string none;
  return folder_ ? folder_->path() : none;
}

SwapRegion SwapStore::reserve(std::size_t bytes) {
  if (opened_) throw Error(ErrorKind::kInternal, "SwapStore::reserve after open()");
  const std::size_t size = round_up(std::max<std::size_t>(bytes, 1), kSwapAlignment);
  // A region never straddles two files: it starts a new one when the current one is full.
  if (file_sizes_.empty() || file_sizes_.back() + size > options_.file_bytes) {
    file_sizes_.push_back(0);
  }
  SwapRegion region{file_sizes_.size() - 1, file_sizes_.back(), size};
  file_sizes_.back() += size;
  reserved_ += size;
  return region;
}

void SwapStore::check_free_space() const {
  // A folder still to be made is checked on the file system it will be made on: its nearest
  // existing ancestor's.
  std::filesystem::path existing = std::filesystem::absolute(options_.path);
  std::error_code missing;
  while (!std::filesystem::exists(existing, missing) && existing.has_relative_path()) {
    existing = existing.parent_path();
  }
  struct statvfs info {};
  if (::statvfs(existing.c_str(), &info) != 0) {
    throw Error(ErrorKind::kIo, "nvme_path '" + options_.path + "': " + std::strerror(errno) +
                                    "; point nvme_path at an existing, writable folder");
  }
  const std::size_t free_bytes = static_cast<std::size_t>(info.f_bavail) * info.f_frsize;
  if (reserved_ > free_bytes) {
    throw Error(ErrorKind::kIo,
                "nvme_path '" + options_.path + "': rank " + std::to_string(rank_) + " needs " +
                    std::to_string(reserved_) + " bytes of swap (" + format_bytes(reserved_) +
                    "), the file system has " + std::to_string(free_bytes) + " bytes free (" +
                    format_bytes(free_bytes) + "); free space or point nvme_path elsewhere");
  }
}

void SwapStore::make_file(std::size_t index) {
  const std::string path = folder_->path() + "/swap." + std::to_string(index);
  File file;
  file.bytes = file_sizes_[index];
  file.buffered_fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (file.buffered_fd < 0) {
    throw Error(ErrorKind::kIo, "cannot make swap file '" + path + "': " + std::strerror(errno));
  }
  paths_.push_back(path);
  files_.push_back(file);
  // Note: fallocate, not ftruncate: the blocks are the disk's now, so a full disk is found here,
  // before step 1, not as ENOSPC in the middle of a step.
  const int status = ::posix_fallocate(file.buffered_fd, 0, static_cast<off_t>(file.bytes));
  if (status != 0) {
    throw Error(ErrorKind::kIo, "preallocating " + std::to_string(file.bytes) +
                                    " bytes for swap file '" + path + "' at offset 0 failed: " +
                                    std::strerror(status));
  }
  const int direct = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (direct < 0) {
    direct_ = false;  // tmpfs and some others refuse O_DIRECT: the page cache then
    files_.back().direct_fd = file.buffered_fd;
  } else {
    files_.back().direct_fd = direct;
  }
}

void SwapStore::open() {
  if (opened_) return;
  opened_ = true;
  if (!backed_ || reserved_ == 0) return;
  check_free_space();
  folder_ = std::make_unique<SwapFolder>(options_.path, rank_);
  for (std::size_t i = 0; i < file_sizes_.size(); ++i) make_file(i);
  reads_ = make_swap_io(options_.io);
  writes_ = make_swap_io(options_.io);
}

void SwapStore::read(const SwapRegion& region, std::size_t offset, void* destination,
                     std::size_t bytes) {
  transfer(false, region, offset, destination, bytes);
}

void SwapStore::write(const SwapRegion& region, std::size_t offset, const void* source,
                      std::size_t bytes) {
  // The engines take a non-const pointer for both directions; a write only reads it.
  transfer(true, region, offset, const_cast<void*>(source), bytes);
}

void SwapStore::transfer(bool write, const SwapRegion& region, std::size_t offset, void* data,
                         std::size_t bytes) {
  if (!backed_ || bytes == 0) return;
  if (!opened_ || files_.empty()) throw Error(ErrorKind::kInternal, "SwapStore used before open()");
  if (offset + bytes > region.bytes) {
    throw Error(ErrorKind::kInternal, "swap access of " + std::to_string(bytes) + " bytes at " +
                                          std::to_string(offset) + " outside a region of " +
                                          std::to_string(region.bytes));
  }
  const File& file = files_.at(region.file);
  const std::string& path = paths_.at(region.file);
  std::vector<SwapRequest> requests;
  for (std::size_t done = 0; done < bytes; done += options_.block_size) {
    SwapRequest request;
    request.write = write;
    request.offset = region.offset + offset + done;
    request.data = static_cast<char*>(data) + done;
    request.bytes = std::min(options_.block_size, bytes - done);
    const bool straight = aligned(request.offset) && aligned(request.bytes) &&
                          aligned(reinterpret_cast<std::uintptr_t>(request.data));
    request.fd = straight ? file.direct_fd : file.buffered_fd;
    request.file = &path;
    requests.push_back(request);
  }
  (write ? writes_ : reads_)->run(requests);
  (write ? bytes_written_ : bytes_read_) += bytes;
}

}  // namespace zest
