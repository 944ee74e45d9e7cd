// A file that appears whole or not at all. Writes go to "<path>.tmp"; commit() flushes, closes
// and renames it over <path>. Destroyed without commit() (an error, an exception on the way out)
// it removes the .tmp, so a failed run leaves no partial output behind.
#pragma once

#include <fstream>
#include <string>

namespace zest {

class AtomicOutputFile {
 public:
  // Throws a kIo Error naming the path when "<path>.tmp" cannot be created.
  explicit AtomicOutputFile(std::string path);
  ~AtomicOutputFile();
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  const std::string& path() const { return path_; }
  std::ostream& stream() { return file_; }
  // Throws a kIo Error naming the path when writing, flushing or renaming failed.
  void commit();

 private:
  std::string path_;
  std::string temporary_;
  std::ofstream file_;
  bool committed_ = false;
};

}  // namespace zest
