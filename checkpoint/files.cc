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

#include "base/durable_file.h"
#include "base/error.h"
#include "base/file_checks.h"

namespace zest {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(ErrorKind kind, const std::string& what, const std::string& path,
                       int error) {
  throw Error(kind, what + " " + path + ": " + std::strerror(error));
}

constexpr std::size_t kChunk = std::size_t{1} << 20;

// How many of `bytes` the save's simulated disk still takes: all of them without a budget.
std::size_t take_from_budget(std::optional<std::uint64_t>* budget, std::size_t bytes) {
  if (budget == nullptr || !budget->has_value()) return bytes;
  std::uint64_t& left = **budget;
  const std::size_t allowed = bytes > left ? static_cast<std::size_t>(left) : bytes;
  left -= allowed;
  return allowed;
}

[[noreturn]] void simulated_disk_full(const std::string& path) {
  throw Error(ErrorKind::kIo, "cannot write " + path + ": " + std::strerror(ENOSPC) +
                                  " (simulated by " + kCheckpointFaultVariable + ")");
}

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
    : file_(std::move(path)), budget_(budget) {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw Error(ErrorKind::kInternal, "XXH3_createState failed");
  XXH3_64bits_reset(state);
  state_ = state;
}

HashingFileWriter::~HashingFileWriter() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void HashingFileWriter::write(const void* data, std::size_t bytes) {
  const std::size_t allowed = take_from_budget(budget_, bytes);
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, allowed);
  file_.write(data, allowed);
  bytes_ += allowed;
  if (allowed < bytes) simulated_disk_full(file_.path());
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
  file_.finish();
  return {bytes_, XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_))};
}

ReadOnlyFile::ReadOnlyFile(std::string path) : path_(std::move(path)) {
  refuse_non_regular_file(path_, ErrorKind::kCheckpoint, "file");
  // Note: O_NONBLOCK, so that a FIFO put in place after the check above is found by fstat below
  // instead of blocking the open; it changes nothing for a regular file.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) {
    fail(errno == ENOENT ? ErrorKind::kCheckpoint : ErrorKind::kIo, "cannot open", path_, errno);
  }
  struct stat info {};
  if (::fstat(fd_, &info) != 0) fail(ErrorKind::kIo, "cannot stat", path_, errno);
  if (!S_ISREG(info.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw Error(ErrorKind::kCheckpoint, "file '" + path_ + "' is not a regular file");
  }
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
  DurableFile file((fs::path(dir) / name).string());
  if (take_from_budget(budget, text.size()) < text.size()) simulated_disk_full(file.path());
  file.write(text);
  file.commit();
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

}  // namespace zest
