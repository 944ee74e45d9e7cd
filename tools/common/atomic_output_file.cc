#include "tools/common/atomic_output_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "base/error.h"

namespace zest {

AtomicOutputFile::AtomicOutputFile(std::string path)
    : path_(std::move(path)), temporary_(path_ + ".tmp") {
  file_.open(temporary_, std::ios::out | std::ios::trunc);
  if (!file_) {
    throw Error(ErrorKind::kIo, "cannot write '" + temporary_ + "' (" +
                                       std::strerror(errno) + ")");
  }
}

AtomicOutputFile::~AtomicOutputFile() {
  if (committed_) return;
  file_.close();
  std::remove(temporary_.c_str());
}

void AtomicOutputFile::commit() {
  file_.flush();
  const bool written = static_cast<bool>(file_);
  file_.close();
  if (!written || file_.fail()) {
    throw Error(ErrorKind::kIo, "cannot write '" + temporary_ + "' (" +
                                       std::strerror(errno) + ")");
  }
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    throw Error(ErrorKind::kIo, "cannot rename '" + temporary_ + "' to '" + path_ + "' (" +
                                       std::strerror(errno) + ")");
  }
  committed_ = true;
}

}  // namespace zest
