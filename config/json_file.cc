// The config file on disk and `--set` overrides: reading JSON through the strict reader
// (base/strict_json.h: a line and column for a parse error, the JSON path for a key written twice
// or a number out of range), and applying "dotted.key=value" before validation.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <variant>

#include "base/file_checks.h"
#include "base/json_depth.h"
#include "base/printable.h"
#include "base/strict_json.h"
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
  // A config is JSON, whose strings are UTF-8: a byte that is not would make the resolved config
  // unprintable (and the manifest unwritable) later, far from the --set that brought it.
  if (const auto bad = first_invalid_utf8(assignment)) {
    const bool in_value = *bad > equals;
    const std::size_t offset = in_value ? *bad - equals - 1 : *bad;
    throw Error(ErrorKind::kUsage,
                "--set '" + printable(key) + (in_value ? "=...': the value" : "': the key") +
                    " is not valid UTF-8 (byte " + std::to_string(offset) +
                    "); config keys and values, file paths among them, must be UTF-8 text");
  }

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

  // Text that is not JSON is taken as a string, a number out of range among it (it then fails
  // the key's type check by name); a key written twice is refused.
  auto parsed = parse_strict_json(text, key);
  json value;
  if (auto* fault = std::get_if<JsonFault>(&parsed)) {
    if (fault->kind == JsonFault::Kind::kTooDeep) {
      throw Error(ErrorKind::kUsage, "--set '" + key + "=...': the value nests deeper than " +
                                         std::to_string(kMaxJsonDepth) + " levels");
    }
    if (fault->kind == JsonFault::Kind::kDuplicateKey) {
      throw Error(ErrorKind::kUsage, strict_json_message(*fault, "--set '" + key + "=...'"));
    }
    value = text;
  } else {
    value = std::move(std::get<json>(parsed));
  }

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
  // A FIFO would block the open, a device would never end, a directory fails obscurely.
  refuse_non_regular_file(path, ErrorKind::kConfig, "config file");
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw Error(ErrorKind::kConfig,
                "config file " + quoted_path(path) + ": cannot open (" + errno_text() + ")");
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) {
    throw Error(ErrorKind::kConfig,
                "config file " + quoted_path(path) + ": cannot read (" + errno_text() + ")");
  }
  const std::string text = contents.str();
  auto parsed = parse_strict_json(text);
  if (const auto* fault = std::get_if<JsonFault>(&parsed)) {
    throw Error(ErrorKind::kConfig,
                fault->kind == JsonFault::Kind::kTooDeep
                    ? "config file " + quoted_path(path) + ": nests deeper than " +
                          std::to_string(kMaxJsonDepth) + " levels"
                    : strict_json_message(*fault, path));
  }
  return std::move(std::get<json>(parsed));
}

}  // namespace zest
