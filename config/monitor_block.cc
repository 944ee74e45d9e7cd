// DeepSpeed's monitor keys, at the top level as DeepSpeed has them. `csv_monitor` (enabled,
// output_path, job_name) makes zest-train write DeepSpeed's CSV files (tools/train/csv_monitor.h).
// `tensorboard`, `wandb` and `comet` are accepted only disabled, with DeepSpeed's keys, so that a
// DeepSpeed config that lists them switched off still loads; switched on, each is refused with a
// line that points to what zest offers instead: the run report and the CSV monitor.
// Note: a block that is absent stays absent from the resolved config (no defaults filled in), so
// configs without one resolve as before (checkpoint manifests and --print-config keep their bytes).
#include <string>
#include <vector>

#include "config/blocks.h"

namespace zest::config_blocks {

using namespace config_reading;

namespace {

void refuse_if_enabled(Block& root, const std::string& key, std::vector<std::string> known,
                       const std::string& what) {
  json* value = root.find(key);
  if (value == nullptr) return;
  Block block(*value, key, std::move(known));
  const json* enabled = block.find("enabled");
  if (enabled == nullptr || !read_bool(*enabled, block.path("enabled"))) return;
  config_error(block.path("enabled"),
               "zest does not write " + what +
                   "; plot the run with zest-report (or zest-train --report FILE), or write "
                   "DeepSpeed's CSV files with csv_monitor.enabled");
}

}  // namespace

void parse_monitor(Block& root, TrainConfig& out) {
  if (json* value = root.find("csv_monitor")) {
    Block block(*value, "csv_monitor", {"enabled", "output_path", "job_name"});
    CsvMonitorConfig& csv = out.csv_monitor;
    csv.enabled = read_bool(block.get_or("enabled", false), block.path("enabled"));
    csv.output_path = read_string(block.get_or("output_path", ""), block.path("output_path"));
    csv.job_name = read_string(block.get_or("job_name", "DeepSpeedJobName"), block.path("job_name"));
    if (csv.job_name.empty() || csv.job_name == "." || csv.job_name == ".." ||
        csv.job_name.find('/') != std::string::npos) {
      config_error(block.path("job_name"),
                   "must name one folder (not empty, no '/', not . or ..), got \"" +
                       csv.job_name + "\"");
    }
  }
  refuse_if_enabled(root, "tensorboard", {"enabled", "output_path", "job_name"},
                    "TensorBoard event files");
  refuse_if_enabled(root, "wandb", {"enabled", "group", "team", "project"},
                    "to Weights & Biases");
  refuse_if_enabled(root, "comet",
                    {"enabled", "samples_log_interval", "project", "workspace", "api_key",
                     "experiment_name", "experiment_key", "online", "mode"},
                    "to Comet");
}

}  // namespace zest::config_blocks
