#include "tools/common/metrics_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <variant>

#include <fmt/format.h>

#include "base/error.h"
#include "base/file_checks.h"
#include "base/printable.h"
#include "base/strict_json.h"

namespace zest {
namespace {

using nlohmann::json;

[[noreturn]] void data_error(const std::string& message) {
  throw Error(ErrorKind::kData, message);
}

std::optional<double> number_or_null(const json& record, const char* key, const std::string& where,
                                     bool required) {
  const auto it = record.find(key);
  if (it == record.end()) {
    if (required) data_error(where + ": the record has no \"" + key + "\"");
    return std::nullopt;
  }
  if (it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    data_error(where + ": \"" + key + "\" must be a number or null, got " +
               quoted_text(it->dump()));
  }
  return it->get<double>();
}

std::int64_t step_of(const json& record, const std::string& where) {
  const json& step = record.at("step");
  if (!step.is_number_integer() || step.get<std::int64_t>() < 1) {
    data_error(where + ": \"step\" must be an integer >= 1, got " + quoted_text(step.dump()));
  }
  return step.get<std::int64_t>();
}

}  // namespace

void RunRecords::add(const json& record, const std::string& where) {
  if (!record.is_object()) {
    data_error(where + ": not a record of zest-train's metrics (a JSON object), got " +
               quoted_text(record.dump()));
  }
  if (const auto summary_it = record.find("summary"); summary_it != record.end()) {
    if (!summary_it->is_object()) data_error(where + ": \"summary\" must be an object");
    summary = record;
    return;
  }
  if (!record.contains("step") || (!record.contains("loss") && !record.contains("val_loss"))) {
    data_error(where + ": not a record of zest-train's metrics (a step's \"step\" and \"loss\", "
                       "an evaluation's \"val_loss\", or the \"summary\"), got " +
               quoted_text(record.dump()));
  }
  if (record.contains("val_loss") && !record.contains("loss")) {
    evals.push_back({step_of(record, where), number_or_null(record, "val_loss", where, true)});
    return;
  }
  StepRecord step;
  step.step = step_of(record, where);
  step.loss = number_or_null(record, "loss", where, true);
  step.lr = number_or_null(record, "lr", where, false);
  step.grad_norm = number_or_null(record, "grad_norm", where, false);
  step.step_ms = number_or_null(record, "step_ms", where, false);
  step.tokens_per_s = number_or_null(record, "tokens_per_s", where, false);
  if (const auto tokens = record.find("tokens"); tokens != record.end()) {
    if (!tokens->is_number_integer()) {
      data_error(where + ": \"tokens\" must be an integer, got " + quoted_text(tokens->dump()));
    }
    step.tokens = tokens->get<std::int64_t>();
  }
  step.loss_scale = number_or_null(record, "loss_scale", where, false);
  step.intra_node_bytes = number_or_null(record, "intra_node_bytes", where, false);
  step.inter_node_bytes = number_or_null(record, "inter_node_bytes", where, false);
  if (const auto skipped = record.find("skipped"); skipped != record.end()) {
    if (!skipped->is_boolean()) {
      data_error(where + ": \"skipped\" must be true or false, got " +
                 quoted_text(skipped->dump()));
    }
    step.skipped = skipped->get<bool>();
  }
  steps.push_back(step);
}

RunRecords read_metrics_file(const std::string& path) {
  refuse_non_regular_file(path, ErrorKind::kData, "metrics file");
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    data_error(fmt::format("cannot read metrics file '{}' ({})", printable(path),
                           std::strerror(errno)));
  }
  std::ostringstream buffer;
  buffer << file.rdbuf();
  const std::string text = buffer.str();
  if (file.bad()) data_error("cannot read metrics file '" + printable(path) + "'");
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    data_error("metrics file '" + printable(path) +
               "' is empty: zest-train writes a record per step there (--metrics FILE), so the "
               "run it was given to stopped before its first step");
  }
  RunRecords records;
  std::size_t line_number = 0;
  std::size_t begin = 0;
  while (begin < text.size()) {
    ++line_number;
    const std::size_t newline = text.find('\n', begin);
    const bool cut = newline == std::string::npos;
    const std::string_view line =
        std::string_view(text).substr(begin, cut ? std::string::npos : newline - begin);
    begin = cut ? text.size() : newline + 1;
    const std::string where = fmt::format("{}:{}", printable(path), line_number);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto parsed = parse_strict_json(line);
    if (const JsonFault* fault = std::get_if<JsonFault>(&parsed)) {
      if (cut) {
        data_error(where + ": the last line is cut short (the file ends in the middle of a "
                           "record: truncated, or its writer was killed mid-write); remove that "
                           "line to see the records before it");
      }
      if (line_number == 1) {
        data_error("'" + printable(path) + "' is not a zest-train metrics file: line 1 is not a "
                   "JSON record (" + quoted_text(line) + "); give the file zest-train --metrics "
                   "wrote");
      }
      data_error(strict_json_message(*fault, where));
    }
    const json& record = std::get<json>(parsed);
    if (line_number == 1 && (!record.is_object() || (!record.contains("step") &&
                                                      !record.contains("summary")))) {
      data_error("'" + printable(path) + "' is not a zest-train metrics file: line 1 is " +
                 quoted_text(line) + "; give the file zest-train --metrics wrote");
    }
    records.add(record, where);
  }
  if (records.steps.empty()) {
    data_error("metrics file '" + printable(path) + "' has no step records");
  }
  return records;
}

}  // namespace zest
