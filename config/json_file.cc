// The config file on disk and `--set` overrides: reading JSON with a line and column for a
// parse error, the JSON path for a key written twice or a number out of range, and applying
// "dotted.key=value" before validation.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "base/file_checks.h"
#include "base/json_depth.h"
#include "config/reading.h"
#include "config/train_config.h"

namespace zest {

using namespace config_reading;

namespace {

std::string errno_text() { return std::strerror(errno); }

// Follows nlohmann's parser through objects and arrays, so that what goes wrong can be named by
// its JSON path, and refuses a key written twice in one object: nlohmann keeps the last one
// silently, and the first is what a reader of the file believes is used.
class JsonPathTracker {
 public:
  // `source`: what a message names first (the file, or the --set assignment); `root`: the JSON
  // path of the parsed value inside the config ("" for a whole file).
  JsonPathTracker(std::string source, std::string root, ErrorKind kind)
      : source_(std::move(source)), root_(std::move(root)), kind_(kind) {}

  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        frames_.push_back({true, {}, {}, 0});
        break;
      case json::parse_event_t::array_start:
        frames_.push_back({false, {}, {}, 0});
        break;
      case json::parse_event_t::key: {
        Frame& frame = frames_.back();
        frame.key = parsed.get<std::string>();
        if (!frame.keys.insert(frame.key).second) {
          throw Error(kind_, source_ + ": " + path() +
                                 ": the key appears twice in one object; write it once (a JSON "
                                 "reader would silently keep only one of the values)");
        }
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        element_done();
        break;
      case json::parse_event_t::value:
        element_done();
        break;
    }
    return true;
  }

  // The JSON path being read now: "optimizer.params.lr", "model.sizes[2]".
  std::string path() const {
    std::string text = root_;
    for (const Frame& frame : frames_) {
      text = frame.object ? join_path(text, frame.key)
                          : text + "[" + std::to_string(frame.index) + "]";
    }
    return text.empty() ? "the top-level value" : text;
  }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;  // objects: the keys read so far
    std::string key;             // objects: the key whose value is being read
    std::size_t index;           // arrays: the element being read
  };

  void element_done() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
  }

  std::string source_;
  std::string root_;
  ErrorKind kind_;
  std::vector<Frame> frames_;
};

// nlohmann's out_of_range 406 says "number overflow parsing '1e400'"; the number is what matters.
std::string overflowing_number(const json::out_of_range& error) {
  const std::string what = error.what();
  const std::size_t open = what.find('\'');
  const std::size_t close = what.rfind('\'');
  if (open == std::string::npos || close <= open) return "";
  return what.substr(open + 1, close - open - 1);
}

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
  // Text that is not JSON is taken as a string, a number out of range among it (it then fails
  // the key's type check by name); a key written twice is refused.
  JsonPathTracker tracker("--set '" + key + "=...'", key, ErrorKind::kUsage);
  json value = json::parse(text, std::ref(tracker), /*allow_exceptions=*/false);
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
  // A FIFO would block the open, a device would never end, a directory fails obscurely.
  refuse_non_regular_file(path, ErrorKind::kConfig, "config file");
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
  JsonPathTracker tracker(path, "", ErrorKind::kConfig);
  try {
    return json::parse(text, std::ref(tracker));
  } catch (const json::out_of_range& range_error) {
    throw Error(ErrorKind::kConfig,
                path + ": " + tracker.path() + ": the number " + overflowing_number(range_error) +
                    " is out of range; a JSON number here must be finite (at most about 1.8e308)");
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
