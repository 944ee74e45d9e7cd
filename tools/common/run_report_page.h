// The run report: one self-contained HTML page (tools/common/html_page.h) of a training run,
// drawn from its metrics records (tools/common/metrics_file.h) and, when known, its resolved
// config and its timeline. zest-train --report and zest-report both build it here, so the page
// of a run is the same whichever wrote it. A run that ended early (killed, stopped, still going)
// shows the steps it recorded and says what it lacks.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/trace.h"
#include "tools/common/html_page.h"
#include "tools/common/metrics_file.h"

namespace zest {

struct RunReportInput {
  RunRecords records;
  std::string description;  // the line under the title: what ran, or where the records came from
  std::optional<nlohmann::json> config;  // resolved (defaults filled in); none: not given
  // Per rank, from the trace; empty with `timeline_note` saying why.
  std::vector<TraceRecorder::Overlap> overlap;
  std::string timeline_note;
  std::string ending;  // how the run ended when it did not finish ("stopped by signal 15 ...")
};

// Past this many steps a curve shows every n-th step (and the last), so that a long run's page
// stays a few hundred kilobytes and draws at once.
inline constexpr std::size_t kMaxPointsPerCurve = 4000;

HtmlPage run_report_page(const RunReportInput& input);

}  // namespace zest
