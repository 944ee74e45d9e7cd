// Durable writes, in one place: a new file written front to back and fsynced (SyncedFile), and
// a file that appears whole under its final name or not at all (DurableFile: written to a
// temporary beside the target, fsynced, renamed over it, the directory fsynced). Checkpoints,
// safetensors exports, traces and the tools' outputs all write through these.
// Invariant: no half-written file ever stands under the final name, and every failure is a kIo
// Error that names the file and the OS's reason.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace zest {

// A new file (it must not exist yet), written front to back.
class SyncedFile {
 public:
  explicit SyncedFile(std::string path);  // kIo Error naming `path` when it cannot be created
  ~SyncedFile();                          // closes without syncing when finish() was not called
  SyncedFile(const SyncedFile&) = delete;
  SyncedFile& operator=(const SyncedFile&) = delete;

  void write(const void* data, std::size_t bytes);
  // fsyncs and closes; a deferred write error reported by close (NFS) fails here too.
  void finish();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// A file replaced atomically: writes go to "<dir>/.<name>.tmp-<random>"; commit() fsyncs it,
// renames it over <dir>/<name> and fsyncs <dir>. Destroyed without commit() (an error on the
// way), it removes the temporary, so a failed writer leaves no partial output behind.
class DurableFile {
 public:
  explicit DurableFile(std::string path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(const void* data, std::size_t bytes) { file_.write(data, bytes); }
  void write(std::string_view text) { file_.write(text.data(), text.size()); }
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  SyncedFile file_;  // the temporary
  bool committed_ = false;
};

// `text` as the whole of `path`, through a DurableFile.
void write_file_durably(const std::string& path, std::string_view text);

// Makes the renames inside `path` durable. File systems that cannot fsync a directory (EINVAL)
// are left as durable as they can be made.
void fsync_directory(const std::string& path);

// A short random tag for temporary names: 16 hex digits.
std::string random_tag();

}  // namespace zest
