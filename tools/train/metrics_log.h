// zest-train's --metrics file: JSON lines, one record per step and per evaluation as each
// completes, then the run's summary. It is a log, not a report written at the end: each record
// reaches the OS in one write() before training goes on, so a process that dies (SIGKILL, a
// second Ctrl-C, the OOM killer) leaves every completed step's record on disk, whole. A fresh
// run (step 1 first) starts the file afresh; a resumed run keeps the records of the steps its
// checkpoint holds, drops any later ones (a dead run's steps past its last checkpoint, which the
// resumed run trains again) and appends its own, so the file has one record per step.
// Invariant: only a process that dies in the middle of a write() can leave a partial last line,
// and the next resume drops it; a run that fails with an error takes its own records back.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace zest {

class MetricsLog {
 public:
  // Touches nothing: the file is opened by open().
  explicit MetricsLog(std::string path);
  // Opened and not closed (the run failed): removes what this run wrote — the file, unless a
  // resumed run found records to keep, which are left as they were.
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // For a run whose first step is `first_step`: 1 truncates the file; a later step keeps the
  // records of earlier steps and cuts the file before the first record of a step >= first_step
  // (or before a partial last line). Throws a kIo Error naming the path when it cannot read or
  // write the file.
  void open(std::int64_t first_step);
  bool is_open() const { return fd_ >= 0; }
  // Appends `record` as one line and returns once the OS has it (no fsync: see the .cc).
  void append(const nlohmann::ordered_json& record);
  // fsyncs what has been appended: before a checkpoint is saved, so that after a power loss the
  // log still reaches the newest checkpoint's step.
  void sync();
  // After the summary: syncs and closes; the destructor then leaves the file alone.
  void close();

  // For a process about to end at once, without destructors (the runtime ending it after a
  // stalled rank, with an error): does to every open log what its destructor would, through the
  // file descriptor only — another thread may be inside append().
  static void discard_open_logs();

  const std::string& path() const { return path_; }

 private:
  // The destructor's clean-up: removes or cuts back what this run wrote.
  void discard() const;

  std::string path_;
  int fd_ = -1;
  std::uint64_t kept_bytes_ = 0;  // what the file held from earlier runs once open() had cut it
};

}  // namespace zest
