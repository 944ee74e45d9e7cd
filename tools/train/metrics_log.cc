#include "tools/train/metrics_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"

namespace zest {
namespace {

Error io_error(const std::string& what, const std::string& path) {
  return Error(ErrorKind::kIo,
               what + " metrics file '" + path + "' (" + std::strerror(errno) + ")");
}

// The step a line's record belongs to, or nothing for a line that is not a record of a step (a
// summary, or a line that is not zest's). zest writes "step" first, so its own lines take the
// fast path; anything else is parsed in full.
std::optional<std::int64_t> step_of(std::string_view line) {
  constexpr std::string_view kPrefix = R"({"step":)";
  if (line.substr(0, kPrefix.size()) == kPrefix) {
    std::int64_t step = 0;
    const char* begin = line.data() + kPrefix.size();
    const auto [end, error] = std::from_chars(begin, line.data() + line.size(), step);
    if (error == std::errc() && end != begin && (*end == ',' || *end == '}')) return step;
  }
  const nlohmann::json value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (value.is_object()) {
    const auto it = value.find("step");
    if (it != value.end() && it->is_number_integer()) return it->get<std::int64_t>();
  }
  return std::nullopt;
}

// Where a resumed run starts writing: the end of the last whole line before the first record of
// a step >= first_step. The file is read in chunks: a long run's log can be large.
std::uint64_t resume_point(int fd, const std::string& path, std::int64_t first_step) {
  std::vector<char> chunk(1 << 20);
  std::string line;
  std::uint64_t line_start = 0;
  std::uint64_t offset = 0;
  for (;;) {
    const ssize_t got = ::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw io_error("cannot read", path);
    }
    if (got == 0) break;
    for (ssize_t i = 0; i < got; ++i) {
      if (chunk[static_cast<std::size_t>(i)] != '\n') {
        line.push_back(chunk[static_cast<std::size_t>(i)]);
        continue;
      }
      const std::optional<std::int64_t> step = step_of(line);
      if (step && *step >= first_step) return line_start;
      line_start = offset + static_cast<std::uint64_t>(i) + 1;
      line.clear();
    }
    offset += static_cast<std::uint64_t>(got);
  }
  // A last line without its newline is a record cut short by a process that died writing it.
  return line_start;
}

// The logs open now, for discard_open_logs(). A log is in it from the end of open() to the start
// of close() or its destructor, while its fd_ and kept_bytes_ do not change.
std::mutex open_logs_mutex;
std::set<const MetricsLog*> open_logs;

void forget(const MetricsLog* log) {
  std::lock_guard lock(open_logs_mutex);
  open_logs.erase(log);
}

}  // namespace

MetricsLog::MetricsLog(std::string path) : path_(std::move(path)) {}

MetricsLog::~MetricsLog() {
  if (fd_ < 0) return;
  forget(this);
  discard();
  ::close(fd_);
}

void MetricsLog::discard_open_logs() {
  std::lock_guard lock(open_logs_mutex);
  for (const MetricsLog* log : open_logs) log->discard();
  open_logs.clear();
}

void MetricsLog::discard() const {
  // Note: a run that fails with an error leaves no output of its own (the tools' rule); only a
  // process that dies cannot clean up, and then its whole records are what a user wants.
  struct stat info {};
  if (::fstat(fd_, &info) == 0 && S_ISREG(info.st_mode)) {
    if (kept_bytes_ == 0) {
      ::unlink(path_.c_str());
    } else if (::ftruncate(fd_, static_cast<off_t>(kept_bytes_)) != 0) {
      // Nothing more to do: the run is already failing with its own error.
    }
  }
}

void MetricsLog::open(std::int64_t first_step) {
  const bool resumed = first_step > 1;
  int flags = O_CREAT | O_APPEND | O_CLOEXEC;
  flags |= resumed ? O_RDWR : (O_WRONLY | O_TRUNC);
  const int fd = ::open(path_.c_str(), flags, 0644);
  if (fd < 0) throw io_error("cannot write", path_);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const Error error = io_error("cannot write", path_);
    ::close(fd);
    throw error;
  }
  fd_ = fd;
  // A pipe or a terminal (--metrics /dev/stdout) is written as it comes: nothing to keep or cut.
  if (!resumed || !S_ISREG(info.st_mode)) {
    std::lock_guard lock(open_logs_mutex);
    open_logs.insert(this);
    return;
  }
  const std::uint64_t keep = resume_point(fd_, path_, first_step);
  if (keep < static_cast<std::uint64_t>(info.st_size) &&
      ::ftruncate(fd_, static_cast<off_t>(keep)) != 0) {
    throw io_error("cannot cut", path_);
  }
  kept_bytes_ = keep;
  std::lock_guard lock(open_logs_mutex);
  open_logs.insert(this);
}

void MetricsLog::append(const nlohmann::ordered_json& record) {
  // Note: one write() of the whole line, and no fsync. Once write() returns the record is the
  // kernel's, so it survives the process however it ends; only a power loss can take it, and
  // the log is synced before each checkpoint (sync()), so what a power loss takes is never a
  // step a checkpoint has. An fsync per step would cost a disk round trip every step.
  std::string line = record.dump();
  line.push_back('\n');
  std::string_view left = line;
  while (!left.empty()) {
    const ssize_t wrote = ::write(fd_, left.data(), left.size());
    if (wrote < 0) {
      if (errno == EINTR) continue;
      throw io_error("cannot write", path_);
    }
    left.remove_prefix(static_cast<std::size_t>(wrote));
  }
}

void MetricsLog::sync() {
  // EINVAL / EROFS: a pipe or terminal, which has nothing to make durable.
  if (::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS) {
    throw io_error("cannot write", path_);
  }
}

void MetricsLog::close() {
  forget(this);
  sync();
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw io_error("cannot write", path_);
  }
  fd_ = -1;
}

}  // namespace zest
