// zest-report: the run report of a zest-train run as one self-contained HTML page, from the
// metrics file it wrote (--metrics) and, when given, its config and its trace (log.trace).
//
//   zest-report --metrics FILE [--config FILE [--set dotted.key=value ...]] [--trace FILE]
//               [--out FILE]
//
// The page (tools/common/run_report_page.h) plots the loss and validation loss against step
// and tokens seen, the learning rate, the gradient norm and clipping, the loss scale and
// skipped steps (fp16), throughput and step time, each rank's peak memory by category beside
// the planner's prediction, the share of communication hidden behind compute (from the trace),
// and the resolved config; it inlines Chart.js and opens offline. A run that was killed or is
// still running reports what it recorded. Written durably (whole or not at all) to --out, by
// default beside the metrics file with the extension .html. Errors print one line,
// "zest-report: error: <message>", and exit 2 for bad input (an empty or cut-off metrics
// file, another tool's file, a bad config), 1 for failures at run time; no page is written then.
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/file_checks.h"
#include "base/printable.h"
#include "resolve/resolved_config.h"
#include "tools/common/html_page.h"
#include "tools/common/metrics_file.h"
#include "tools/common/run_report_page.h"
#include "tools/common/tool_main.h"
#include "tools/report/trace_file.h"

namespace {

constexpr const char* kProgram = "zest-report";

std::string default_output(const std::string& metrics) {
  std::filesystem::path path(metrics);
  path.replace_extension(".html");
  return path.string();
}

int run(int argc, char** argv) {
  CLI::App app{"Draws a zest-train run as one self-contained HTML page.", kProgram};
  std::string metrics_path;
  std::string config_path;
  std::vector<std::string> overrides;
  std::string trace_path;
  std::string out_path;
  app.add_option("--metrics", metrics_path, "the metrics file zest-train --metrics wrote")
      ->required();
  auto* config = app.add_option("--config", config_path,
                                "the run's JSON config: its resolved table, the clipping "
                                "threshold and the tokens per step");
  app.add_option("--set", overrides, "an override the run was given: dotted.key=value")
      ->needs(config);
  app.add_option("--trace", trace_path,
                 "the run's Chrome trace (log.trace): communication hidden behind compute");
  app.add_option("--out", out_path, "the page to write (default: the metrics file's name, .html)");
  if (!zest::parse_command_line(app, argc, argv)) return 0;

  zest::require_html_support("zest-report");
  if (out_path.empty()) out_path = default_output(metrics_path);
  if (std::filesystem::path(out_path).lexically_normal() ==
      std::filesystem::path(metrics_path).lexically_normal()) {
    throw zest::Error(zest::ErrorKind::kUsage,
                      "--out: '" + zest::printable(out_path) + "' is the metrics file itself");
  }
  zest::check_output_file(out_path, zest::ErrorKind::kUsage, "--out");

  zest::RunReportInput input;
  input.records = zest::read_metrics_file(metrics_path);
  input.description = "from " + metrics_path;
  if (!config_path.empty()) {
    input.config = zest::load_resolved_config(config_path, overrides).json;
    input.description += " and " + config_path;
  }
  if (trace_path.empty()) {
    input.timeline_note = "No trace given (zest-report --trace FILE, the file log.trace names).";
  } else {
    input.overlap = zest::read_trace_overlap(trace_path);
    input.description += " and " + trace_path;
  }
  zest::write_html_page(out_path, zest::run_report_page(input));
  std::cout << "zest-report: wrote " << out_path << " (" << input.records.steps.size()
            << " steps)" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zest::run_tool(kProgram, [&] { return run(argc, argv); });
}
