// DeepSpeed's CSV monitor (config `csv_monitor`): one CSV file per quantity in
// <output_path>/<job_name>/, named for DeepSpeed's event ("Train/Samples/train_loss" ->
// Train_Samples_train_loss.csv), a header "step,<last part of the name>" and one row per step,
// "<samples seen>,<value>", with Python's csv line ends (\r\n), as DeepSpeed's csvMonitor writes
// them. DeepSpeed's events: train_loss, lr and (fp16) loss_scale; zest adds grad_norm and, with
// eval_every, val_loss, in the same layout.
// Invariant: as the metrics log (tools/train/metrics_log.h): each row reaches the OS in one
// write(); a fresh run starts the files afresh, a resumed one keeps the rows its checkpoint holds;
// a run that fails with an error takes its rows back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace zest {

class CsvMonitor {
 public:
  // Quantities per `config`; a step is `samples_per_step` samples (train_batch_size).
  CsvMonitor(const TrainConfig& config, std::int64_t samples_per_step);
  // Opened and not closed (the run failed): each file back to what it held before the run.
  ~CsvMonitor();
  CsvMonitor(const CsvMonitor&) = delete;
  CsvMonitor& operator=(const CsvMonitor&) = delete;

  // The folder <output_path>/<job_name>: "output_path/job_name" ("job_name" for an empty one).
  static std::string folder(const CsvMonitorConfig& config);

  // Creates the folder and the files for a run whose first step is `first_step`. Throws a kIo
  // Error naming the file it cannot write.
  void open(std::int64_t first_step);
  // One row per quantity for `step`. A value that is absent is not written.
  void record_step(std::int64_t step, float loss, float lr, float grad_norm,
                   std::optional<float> loss_scale);
  void record_eval(std::int64_t step, float val_loss);
  void sync();
  void close();

  // As MetricsLog::discard_open_logs, for a process about to end at once.
  static void discard_open_monitors();

 private:
  struct File {
    std::string event;  // DeepSpeed's name, "Train/Samples/train_loss"
    std::string path;
    int fd = -1;
    std::uint64_t kept_bytes = 0;
  };
  File* find(const std::string& event);
  void write_row(File& file, std::int64_t step, double value);
  void discard() const;

  std::string folder_;
  std::int64_t samples_per_step_;
  std::vector<File> files_;
  bool open_ = false;
};

}  // namespace zest
