// The file operations a checkpoint is built from, on base/durable_file.h: a shard file written
// with a running xxHash (XXH3_64) and fsynced, small files replaced atomically, directories
// published by rename, files read by offset. Every failure is an Error that names the file and
// the OS error.
// Invariant: nothing here leaves a half-written file under its final name — files are written
// under temporary names (or inside a temporary directory) and only renamed once complete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "base/durable_file.h"

namespace zest {

// Testing aid: a writer that fails with ENOSPC once this many bytes are written (by one rank, in
// one save), as a full disk would. Set per save in CheckpointOptions, or for a whole process by
// the environment variable ZEST_CHECKPOINT_FAIL_AFTER_BYTES=<bytes>.
inline constexpr const char* kCheckpointFaultVariable = "ZEST_CHECKPOINT_FAIL_AFTER_BYTES";
std::optional<std::uint64_t> checkpoint_fault_from_environment();

// What a file holds: its length and XXH3_64 of its bytes.
struct FileDigest {
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;
};

// 16 lower-case hex digits, and back (nullopt for anything else).
std::string hex_digest(std::uint64_t value);
std::optional<std::uint64_t> parse_hex_digest(const std::string& text);

// A new file (it must not exist), written front to back, hashed as it is written.
class HashingFileWriter {
 public:
  // `budget`, when given, is the bytes still allowed before a simulated ENOSPC; it is shared by
  // the files of one save and decremented as they are written.
  HashingFileWriter(std::string path, std::optional<std::uint64_t>* budget);
  ~HashingFileWriter();
  HashingFileWriter(const HashingFileWriter&) = delete;
  HashingFileWriter& operator=(const HashingFileWriter&) = delete;

  void write(const void* data, std::size_t bytes);
  void write_zeros(std::size_t bytes);
  // fsyncs and closes; returns what was written.
  FileDigest finish();
  const std::string& path() const { return file_.path(); }

 private:
  SyncedFile file_;
  std::optional<std::uint64_t>* budget_;
  void* state_ = nullptr;  // XXH3_state_t, owned
  std::uint64_t bytes_ = 0;
};

// A file opened for reading by offset.
class ReadOnlyFile {
 public:
  // kCheckpoint Error when missing, or when not a regular file (refused before it is opened: a
  // FIFO would block the open and every read, a device would never end).
  explicit ReadOnlyFile(std::string path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  std::uint64_t size() const { return size_; }
  // Reads exactly `bytes` at `offset`; a short file is a kCheckpoint Error naming it.
  void read(std::uint64_t offset, void* data, std::size_t bytes) const;
  FileDigest digest() const;  // reads the whole file
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// Writes `text` as <dir>/<name> through a DurableFile (base/durable_file.h), charged to the
// save's simulated disk `budget`.
void replace_file_atomically(const std::string& dir, const std::string& name,
                             const std::string& text, std::optional<std::uint64_t>* budget);
// The whole file as text; kCheckpoint Error naming it when missing, unreadable, or longer than
// `max_bytes` (checked before anything is allocated: a file that large is not the small text
// file a checkpoint keeps, and reading it whole could exhaust memory). `what` names the file's
// role in that message ("the latest pointer", "a manifest").
std::string read_text_file(const std::string& path, std::uint64_t max_bytes, const char* what);

// The caps: `latest` holds one directory name; a manifest lists every unit's shards, about
// 200 bytes a shard, so 64 MiB is some 300 000 shards (a 1000-unit model on 300 ranks).
inline constexpr std::uint64_t kMaxLatestBytes = 4096;
inline constexpr std::uint64_t kMaxManifestBytes = 64ull << 20;

// Moves the complete directory `from` to `to` (same parent) in one rename. When `to` exists it
// is swapped atomically (renameat2 RENAME_EXCHANGE) and the old one removed, so `to` names a
// whole directory at every moment; returns true when it replaced one.
bool publish_directory(const std::string& from, const std::string& to);
// Removes a directory tree without failing: renamed to a hidden name first, so a crash midway
// leaves no half-deleted directory under its old name. Returns false when it could not.
bool remove_directory_quietly(const std::string& path);

}  // namespace zest
