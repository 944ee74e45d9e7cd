#include "checkpoint/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fmt/format.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "base/error.h"

namespace zest {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(ErrorKind kind, const std::string& what, const std::string& path,
                       int error) {
  throw Error(kind, what + " " + path + ": " + std::strerror(error));
}

constexpr std::size_t kChunk = std::size_t{1} << 20;

}  // namespace

std::optional<std::uint64_t> checkpoint_fault_from_environment() {
  const char* text = std::getenv(kCheckpointFaultVariable);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0') {
    throw Error(ErrorKind::kUsage,
                std::string(kCheckpointFaultVariable) + "='" + text + "' is not a byte count");
  }
  return value;
}

std::string hex_digest(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::optional<std::uint64_t> parse_hex_digest(const std::string& text) {
  if (text.size() != 16) return std::nullopt;
  std::uint64_t value = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9')
      digit = c - '0';
    else if (c >= 'a' && c <= 'f')
      digit = c - 'a' + 10;
    else
      return std::nullopt;
    value = value << 4 | static_cast<std::uint64_t>(digit);
  }
  return value;
}

HashingFileWriter::HashingFileWriter(std::string path, std::optional<std::uint64_t>* budget)
    : path_(std::move(path)), budget_(budget) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(ErrorKind::kIo, "cannot create", path_, errno);
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw Error(ErrorKind::kInternal, "XXH3_createState failed");
  XXH3_64bits_reset(state);
  state_ = state;
}

HashingFileWriter::~HashingFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void HashingFileWriter::write(const void* data, std::size_t bytes) {
  if (fd_ < 0) throw Error(ErrorKind::kInternal, "write after finish: " + path_);
  const char* next = static_cast<const char*>(data);
  std::size_t allowed = bytes;
  bool simulate_full = false;
  if (budget_ != nullptr && budget_->has_value()) {
    std::uint64_t& left = **budget_;
    if (bytes > left) {
      allowed = static_cast<std::size_t>(left);
      simulate_full = true;
    }
    left -= allowed;
  }
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), next, allowed);
  std::size_t remaining = allowed;
  while (remaining > 0) {
    const ssize_t written = ::write(fd_, next, remaining);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail(ErrorKind::kIo, "cannot write", path_, errno);
    }
    next += written;
    remaining -= static_cast<std::size_t>(written);
  }
  bytes_ += allowed;
  if (simulate_full) {
    throw Error(ErrorKind::kIo, "cannot write " + path_ + ": " + std::strerror(ENOSPC) +
                                    " (simulated by " + kCheckpointFaultVariable + ")");
  }
}

void HashingFileWriter::write_zeros(std::size_t bytes) {
  const std::vector<char> zeros(std::min(bytes, kChunk), 0);
  while (bytes > 0) {
    const std::size_t now = std::min(bytes, zeros.size());
    write(zeros.data(), now);
    bytes -= now;
  }
}

FileDigest HashingFileWriter::finish() {
  if (::fsync(fd_) != 0) fail(ErrorKind::kIo, "cannot fsync", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  // Note: close can report a deferred write error (NFS); a checkpoint must not ignore it.
  if (::close(fd) != 0) fail(ErrorKind::kIo, "cannot close", path_, errno);
  return {bytes_, XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_))};
}

ReadOnlyFile::ReadOnlyFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    fail(errno == ENOENT ? ErrorKind::kCheckpoint : ErrorKind::kIo, "cannot open", path_, errno);
  }
  struct stat info {};
  if (::fstat(fd_, &info) != 0) fail(ErrorKind::kIo, "cannot stat", path_, errno);
  size_ = static_cast<std::uint64_t>(info.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read(std::uint64_t offset, void* data, std::size_t bytes) const {
  char* next = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd_, next, bytes, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(ErrorKind::kIo, "cannot read", path_, errno);
    }
    if (got == 0) {
      throw Error(ErrorKind::kCheckpoint, path_ + ": ends at byte " + std::to_string(offset) +
                                              ", " + std::to_string(bytes) +
                                              " more bytes expected (truncated)");
    }
    next += got;
    offset += static_cast<std::uint64_t>(got);
    bytes -= static_cast<std::size_t>(got);
  }
}

FileDigest ReadOnlyFile::digest() const {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw Error(ErrorKind::kInternal, "XXH3_createState failed");
  XXH3_64bits_reset(state);
  std::vector<char> chunk(kChunk);
  std::uint64_t offset = 0;
  try {
    while (offset < size_) {
      const std::size_t now =
          static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size_ - offset));
      read(offset, chunk.data(), now);
      XXH3_64bits_update(state, chunk.data(), now);
      offset += now;
    }
  } catch (...) {
    XXH3_freeState(state);
    throw;
  }
  const std::uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return {size_, hash};
}

void replace_file_atomically(const std::string& dir, const std::string& name,
                             const std::string& text, std::optional<std::uint64_t>* budget) {
  const std::string temporary = (fs::path(dir) / ("." + name + ".tmp-" + random_tag())).string();
  const std::string target = (fs::path(dir) / name).string();
  try {
    HashingFileWriter writer(temporary, budget);
    writer.write(text.data(), text.size());
    writer.finish();
    if (std::rename(temporary.c_str(), target.c_str()) != 0) {
      fail(ErrorKind::kIo, "cannot rename " + temporary + " to", target, errno);
    }
  } catch (...) {
    std::remove(temporary.c_str());
    throw;
  }
  fsync_directory(dir);
}

std::string read_text_file(const std::string& path, std::uint64_t max_bytes, const char* what) {
  const ReadOnlyFile file(path);
  if (file.size() > max_bytes) {
    throw Error(ErrorKind::kCheckpoint,
                fmt::format("{}: {} bytes, more than {} can be ({} bytes): not a zest checkpoint "
                            "file; point at the checkpoint directory zest wrote",
                            path, file.size(), what, max_bytes));
  }
  std::string text(static_cast<std::size_t>(file.size()), '\0');
  file.read(0, text.data(), text.size());
  return text;
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "cannot open directory", path, errno);
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); their renames are then as durable as
  // they can be made.
  if (result != 0 && error != EINVAL) fail(ErrorKind::kIo, "cannot fsync directory", path, error);
}

bool publish_directory(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) == 0) return false;
  const int error = errno;
  if (error != ENOTEMPTY && error != EEXIST) {
    fail(ErrorKind::kIo, "cannot rename " + from + " to", to, error);
  }
  // `to` exists (this step was saved before): swap the two whole directories in one step, then
  // remove the old one, now under the temporary name.
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
    remove_directory_quietly(from);
    return true;
  }
  // Note: a file system without RENAME_EXCHANGE leaves a moment in which `to` is missing; the
  // `latest` pointer may name it then, and a crash there needs an older step loaded by path.
  const std::string aside = to + ".old-" + random_tag();
  if (std::rename(to.c_str(), aside.c_str()) != 0) {
    fail(ErrorKind::kIo, "cannot move aside", to, errno);
  }
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    const int rename_error = errno;
    std::rename(aside.c_str(), to.c_str());
    fail(ErrorKind::kIo, "cannot rename " + from + " to", to, rename_error);
  }
  remove_directory_quietly(aside);
  return true;
}

bool remove_directory_quietly(const std::string& path) {
  std::error_code error;
  if (!fs::exists(fs::symlink_status(path, error))) return true;
  const fs::path source(path);
  fs::path doomed =
      source.parent_path() / (".trash-" + source.filename().string() + "-" + random_tag());
  fs::rename(source, doomed, error);
  if (error) doomed = source;
  fs::remove_all(doomed, error);
  return !error;
}

std::string random_tag() {
  static thread_local std::mt19937_64 generator([] {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device() ^
           static_cast<std::uint64_t>(::getpid());
  }());
  return hex_digest(generator());
}

}  // namespace zest
