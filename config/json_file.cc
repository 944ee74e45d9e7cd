// The config file on disk and `--set` overrides: reading JSON with a line and column for a
// parse error, and applying "dotted.key=value" before validation.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/json_depth.h"
#include "config/reading.h"
#include "config/train_config.h"

namespace zest {

using namespace config_reading;

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

void apply_override(json& config, const std::string& assignment) {
  const std::size_t equals = assignment.find('=');
  if (equals == std::string::npos) {
    throw Error(ErrorKind::kUsage,
                "--set '" + assignment + "': expected KEY=VALUE, e.g. zero_optimization.stage=3");
  }
  const std::string key = assignment.substr(0, equals);
  const std::string text = assignment.substr(equals + 1);

  std::vector<std::string> segments;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = key.find('.', start);
    segments.push_back(key.substr(start, dot == std::string::npos ? std::string::npos
                                                                  : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const std::string& segment : segments) {
    if (segment.empty()) {
      throw Error(ErrorKind::kUsage,
                  "--set '" + assignment + "': the key '" + key + "' has an empty part");
    }
  }

  if (json_nesting_depth(text) > kMaxJsonDepth) {
    throw Error(ErrorKind::kUsage, "--set '" + key + "=...': the value nests deeper than " +
                                       std::to_string(kMaxJsonDepth) + " levels");
  }
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;

  if (!config.is_object()) {
    throw Error(ErrorKind::kUsage, "--set '" + assignment + "': the config is " +
                                       describe(config) + ", not an object");
  }
  json* node = &config;
  std::string walked;
  for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
    walked = join_path(walked, segments[i]);
    json& child = (*node)[segments[i]];
    if (child.is_null()) child = json::object();
    if (!child.is_object()) {
      throw Error(ErrorKind::kUsage, "--set '" + assignment + "': '" + walked + "' is " +
                                         describe(child) + ", not an object");
    }
    node = &child;
  }
  (*node)[segments.back()] = std::move(value);
}

json read_json_file(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw Error(ErrorKind::kConfig, "config file '" + path + "' is a directory");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw Error(ErrorKind::kConfig,
                "config file '" + path + "': cannot open (" + errno_text() + ")");
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) {
    throw Error(ErrorKind::kConfig,
                "config file '" + path + "': cannot read (" + errno_text() + ")");
  }
  const std::string text = contents.str();
  if (json_nesting_depth(text) > kMaxJsonDepth) {
    throw Error(ErrorKind::kConfig, "config file '" + path + "': nests deeper than " +
                                        std::to_string(kMaxJsonDepth) + " levels");
  }
  try {
    return json::parse(text);
  } catch (const json::parse_error& parse_error) {
    // parse_error.byte counts the bytes read, the offending one included: 1-based.
    const std::size_t offset =
        std::min<std::size_t>(parse_error.byte > 0 ? parse_error.byte - 1 : 0, text.size());
    std::size_t line = 1;
    std::size_t line_start = 0;
    for (std::size_t i = 0; i < offset; ++i) {
      if (text[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    const std::size_t column = offset - line_start + 1;
    // nlohmann's message is "[json.exception.parse_error.101] parse error at line L, column C:
    // <reason>"; keep the reason.
    std::string reason = parse_error.what();
    const std::size_t at = reason.find("column ");
    const std::size_t colon = reason.find(": ", at == std::string::npos ? 0 : at);
    if (colon != std::string::npos) reason = reason.substr(colon + 2);
    throw Error(ErrorKind::kConfig, path + ":" + std::to_string(line) + ":" +
                                        std::to_string(column) + ": not valid JSON: " + reason);
  }
}

}  // namespace zest
