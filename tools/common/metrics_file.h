// zest-train's metrics file (--metrics, tools/train/metrics_log.h) read back: the records of the
// steps, of the evaluations and the run's summary, for the run report (zest-report, and
// zest-train --report, which draws from the same records). A file that a run killed mid-way left
// behind (no summary) reads as what it recorded; a file that is empty, cut off in the middle of
// a line, or not zest-train's is refused with one kData Error that names the file and the line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zest {

struct StepRecord {
  std::int64_t step = 0;
  std::optional<double> loss;  // none: a non-finite loss (written as null)
  std::optional<double> lr;
  std::optional<double> grad_norm;
  std::optional<double> step_ms;
  std::optional<double> tokens_per_s;  // the mean so far, as zest-train's progress line shows it
  std::optional<std::int64_t> tokens;  // seen up to and including this step
  std::optional<double> loss_scale;    // fp16 only
  bool skipped = false;                // fp16: the step was skipped on an overflow
  // Bytes rank 0 put on the wire in the step, inside its node and across nodes
  // (runtime/link_model.h); none in records written before zest counted them.
  std::optional<double> intra_node_bytes;
  std::optional<double> inter_node_bytes;
};

struct EvalRecord {
  std::int64_t step = 0;
  std::optional<double> val_loss;
};

struct RunRecords {
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;
  // The last summary record ({"summary": ..., "peak_bytes": ...}); none when the run did not
  // reach its end (it was killed, or is still running).
  std::optional<nlohmann::json> summary;

  // Takes one record as zest-train writes it. Throws a kData Error starting with `where` for a
  // value that is not one of zest-train's records.
  void add(const nlohmann::json& record, const std::string& where);
};

RunRecords read_metrics_file(const std::string& path);

}  // namespace zest
