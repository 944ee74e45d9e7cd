#include "base/file_checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/printable.h"

namespace zest {
namespace {

namespace fs = std::filesystem;

const char* kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string quoted(const std::string& path) { return quoted_path(path); }

// The folder an output is created in: the path's parent, or "." for a bare name.
std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void require_writable_directory(const std::string& folder, ErrorKind kind, const std::string& what,
                                const std::string& path) {
  struct stat info {};
  if (::stat(folder.c_str(), &info) != 0) {
    const std::string reason = errno == ENOENT
                                   ? "does not exist"
                                   : std::string("cannot be read (") + std::strerror(errno) + ")";
    throw Error(kind, what + " " + quoted(path) + ": its folder " + quoted(folder) + " " + reason);
  }
  if (!S_ISDIR(info.st_mode)) {
    throw Error(kind, what + " " + quoted(path) + ": " + quoted(folder) + " is " +
                          kind_of(info.st_mode) + ", not a directory");
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw Error(kind, what + " " + quoted(path) + ": cannot write in " + quoted(folder) + " (" +
                          std::strerror(errno) + ")");
  }
}

}  // namespace

std::string file_kind(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return "missing";
  return kind_of(info.st_mode);
}

void refuse_non_regular_file(const std::string& path, ErrorKind kind, const std::string& what) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode)) return;
  throw Error(kind,
              what + " " + quoted(path) + " is " + kind_of(info.st_mode) + ", not a regular file");
}

void check_output_file(const std::string& path, ErrorKind kind, const std::string& what) {
  if (path.empty()) throw Error(kind, what + ": the path is empty");
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    throw Error(kind, what + " " + quoted(path) + " is " + kind_of(info.st_mode) +
                          "; give the path of a file to write");
  }
  require_writable_directory(folder_of(path), kind, what, path);
}

void check_output_directory(const std::string& path, ErrorKind kind, const std::string& what) {
  if (path.empty()) throw Error(kind, what + ": the path is empty");
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {
    if (!S_ISDIR(info.st_mode)) {
      throw Error(kind,
                  what + " " + quoted(path) + " is " + kind_of(info.st_mode) + ", not a directory");
    }
    if (::access(path.c_str(), W_OK | X_OK) != 0) {
      throw Error(
          kind, what + " " + quoted(path) + ": cannot write in it (" + std::strerror(errno) + ")");
    }
    return;
  }
  // Created later with its parents: the nearest ancestor that exists decides.
  fs::path ancestor = fs::path(path).lexically_normal();
  while (true) {
    const fs::path parent = ancestor.parent_path();
    if (parent.empty()) {
      ancestor = ".";
      break;
    }
    if (parent == ancestor) break;  // the root
    ancestor = parent;
    if (::stat(ancestor.c_str(), &info) == 0) break;
  }
  require_writable_directory(ancestor.string(), kind, what, path);
}

}  // namespace zest
