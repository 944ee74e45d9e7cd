#include "base/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "base/error.h"

namespace zest {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int error) {
  throw Error(ErrorKind::kIo, what + " " + path + ": " + std::strerror(error));
}

std::string temporary_beside(const std::string& path) {
  const std::filesystem::path target(path);
  return (target.parent_path() / ("." + target.filename().string() + ".tmp-" + random_tag()))
      .string();
}

std::string directory_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

SyncedFile::SyncedFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create", path_, errno);
}

SyncedFile::~SyncedFile() {
  if (fd_ >= 0) ::close(fd_);
}

void SyncedFile::write(const void* data, std::size_t bytes) {
  if (fd_ < 0) throw Error(ErrorKind::kInternal, "write after finish: " + path_);
  const char* next = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t written = ::write(fd_, next, bytes);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path_, errno);
    }
    next += written;
    bytes -= static_cast<std::size_t>(written);
  }
}

void SyncedFile::finish() {
  if (::fsync(fd_) != 0) fail("cannot fsync", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  // Note: close can report a deferred write error (NFS); a durable write must not ignore it.
  if (::close(fd) != 0) fail("cannot close", path_, errno);
}

DurableFile::DurableFile(std::string path)
    : path_(std::move(path)), file_(temporary_beside(path_)) {}

DurableFile::~DurableFile() {
  if (!committed_) std::remove(file_.path().c_str());
}

void DurableFile::commit() {
  file_.finish();
  if (std::rename(file_.path().c_str(), path_.c_str()) != 0) {
    fail("cannot rename " + file_.path() + " to", path_, errno);
  }
  committed_ = true;
  fsync_directory(directory_of(path_));
}

void write_file_durably(const std::string& path, std::string_view text) {
  DurableFile file(path);
  file.write(text);
  file.commit();
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory", path, errno);
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (result != 0 && error != EINVAL) fail("cannot fsync directory", path, error);
}

std::string random_tag() {
  static thread_local std::mt19937_64 generator([] {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device() ^
           static_cast<std::uint64_t>(::getpid());
  }());
  return fmt::format("{:016x}", generator());
}

}  // namespace zest
