#include "tools/train/csv_monitor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "base/error.h"
#include "base/printable.h"

namespace zest {
namespace {

// Python's csv.writer ends rows with \r\n; DeepSpeed keeps that default.
constexpr std::string_view kRowEnd = "\r\n";

Error io_error(const std::string& what, const std::string& path) {
  return Error(ErrorKind::kIo, what + " CSV monitor file '" + printable(path) + "' (" +
                                   std::strerror(errno) + ")");
}

// "Train/Samples/train_loss" -> "Train_Samples_train_loss", as DeepSpeed names its files.
std::string file_name(std::string event) {
  for (char& c : event) {
    if (c == '/' || c == ' ') c = '_';
  }
  return event + ".csv";
}

std::string header_of(const std::string& event) {
  return "step," + event.substr(event.rfind('/') + 1) + std::string(kRowEnd);
}

// A value as Python's str() of a float writes it: the shortest decimal that reads back as the
// same double, "2.0" for a whole number, "nan", "inf". DeepSpeed writes tensor.item(), a float32
// widened to a Python float; the float32 values here are widened the same way, so the text is
// the same as DeepSpeed's for the same value.
std::string python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

// Where a resumed run starts writing in `text`: after the header and the rows of steps at or
// below `kept_samples`; the end of the header (or 0 without one) otherwise.
std::uint64_t resume_point(const std::string& text, const std::string& header,
                           std::int64_t kept_samples) {
  if (text.compare(0, header.size(), header) != 0) return 0;
  std::size_t at = header.size();
  while (at < text.size()) {
    const std::size_t end = text.find(kRowEnd, at);
    if (end == std::string::npos) break;  // a row cut short
    std::int64_t samples = 0;
    const auto [stop, error] = std::from_chars(text.data() + at, text.data() + end, samples);
    if (error != std::errc() || *stop != ',' || samples > kept_samples) break;
    at = end + kRowEnd.size();
  }
  return at;
}

std::mutex open_monitors_mutex;
std::set<const CsvMonitor*> open_monitors;

}  // namespace

CsvMonitor::CsvMonitor(const TrainConfig& config, std::int64_t samples_per_step)
    : folder_(folder(config.csv_monitor)), samples_per_step_(samples_per_step) {
  std::vector<std::string> events = {"Train/Samples/train_loss", "Train/Samples/lr",
                                     "Train/Samples/grad_norm"};
  if (config.engine.loss_scale.enabled) events.push_back("Train/Samples/loss_scale");
  if (config.eval_every > 0) events.push_back("Train/Samples/val_loss");
  for (const std::string& event : events) {
    files_.push_back({event, (std::filesystem::path(folder_) / file_name(event)).string()});
  }
}

std::string CsvMonitor::folder(const CsvMonitorConfig& config) {
  return (std::filesystem::path(config.output_path) / config.job_name).string();
}

CsvMonitor::~CsvMonitor() {
  if (!open_) return;
  {
    std::lock_guard lock(open_monitors_mutex);
    open_monitors.erase(this);
  }
  discard();
  for (File& file : files_) {
    if (file.fd >= 0) ::close(file.fd);
  }
}

void CsvMonitor::discard_open_monitors() {
  std::lock_guard lock(open_monitors_mutex);
  for (const CsvMonitor* monitor : open_monitors) monitor->discard();
  open_monitors.clear();
}

void CsvMonitor::discard() const {
  for (const File& file : files_) {
    if (file.fd < 0) continue;
    if (file.kept_bytes == 0) {
      ::unlink(file.path.c_str());
    } else if (::ftruncate(file.fd, static_cast<off_t>(file.kept_bytes)) != 0) {
      // Nothing more to do: the run is already failing with its own error.
    }
  }
}

void CsvMonitor::open(std::int64_t first_step) {
  std::error_code error;
  std::filesystem::create_directories(folder_, error);
  if (error) {
    throw Error(ErrorKind::kIo, "cannot create the CSV monitor folder '" + printable(folder_) +
                                    "' (" + error.message() + ")");
  }
  const std::int64_t kept_samples = (first_step - 1) * samples_per_step_;
  for (File& file : files_) {
    const int flags = O_CREAT | O_RDWR | O_APPEND | O_CLOEXEC | (first_step > 1 ? 0 : O_TRUNC);
    file.fd = ::open(file.path.c_str(), flags, 0644);
    if (file.fd < 0) throw io_error("cannot write", file.path);
    const std::string header = header_of(file.event);
    std::uint64_t keep = 0;
    if (first_step > 1) {
      std::string text;
      char chunk[1 << 16];
      for (off_t offset = 0;;) {
        const ssize_t got = ::pread(file.fd, chunk, sizeof(chunk), offset);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) throw io_error("cannot read", file.path);
        if (got == 0) break;
        text.append(chunk, static_cast<std::size_t>(got));
        offset += got;
      }
      keep = resume_point(text, header, kept_samples);
    }
    if (::ftruncate(file.fd, static_cast<off_t>(keep)) != 0) throw io_error("cannot cut", file.path);
    file.kept_bytes = keep;
    if (keep == 0 && ::write(file.fd, header.data(), header.size()) !=
                         static_cast<ssize_t>(header.size())) {
      throw io_error("cannot write", file.path);
    }
  }
  open_ = true;
  std::lock_guard lock(open_monitors_mutex);
  open_monitors.insert(this);
}

CsvMonitor::File* CsvMonitor::find(const std::string& event) {
  for (File& file : files_) {
    if (file.event == event) return &file;
  }
  return nullptr;
}

void CsvMonitor::write_row(File& file, std::int64_t step, double value) {
  // One write() per row, as the metrics log: a process that dies leaves whole rows.
  const std::string row =
      fmt::format("{},{}{}", step * samples_per_step_, python_float(value), kRowEnd);
  std::string_view left = row;
  while (!left.empty()) {
    const ssize_t wrote = ::write(file.fd, left.data(), left.size());
    if (wrote < 0) {
      if (errno == EINTR) continue;
      throw io_error("cannot write", file.path);
    }
    left.remove_prefix(static_cast<std::size_t>(wrote));
  }
}

void CsvMonitor::record_step(std::int64_t step, float loss, float lr, float grad_norm,
                             std::optional<float> loss_scale) {
  write_row(*find("Train/Samples/train_loss"), step, loss);
  write_row(*find("Train/Samples/lr"), step, lr);
  write_row(*find("Train/Samples/grad_norm"), step, grad_norm);
  if (File* file = find("Train/Samples/loss_scale"); file != nullptr && loss_scale) {
    write_row(*file, step, *loss_scale);
  }
}

void CsvMonitor::record_eval(std::int64_t step, float val_loss) {
  if (File* file = find("Train/Samples/val_loss")) write_row(*file, step, val_loss);
}

void CsvMonitor::sync() {
  for (File& file : files_) {
    if (file.fd >= 0 && ::fsync(file.fd) != 0 && errno != EINVAL && errno != EROFS) {
      throw io_error("cannot write", file.path);
    }
  }
}

void CsvMonitor::close() {
  {
    std::lock_guard lock(open_monitors_mutex);
    open_monitors.erase(this);
  }
  sync();
  open_ = false;
  for (File& file : files_) {
    const int fd = file.fd;
    file.fd = -1;
    if (fd >= 0 && ::close(fd) != 0) throw io_error("cannot write", file.path);
  }
}

}  // namespace zest
