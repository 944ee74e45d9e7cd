#include "base/strict_json.h"

#include <algorithm>
#include <functional>
#include <set>
#include <utility>
#include <vector>

#include "base/json_depth.h"

namespace zest {
namespace {

using nlohmann::json;

// Carries a fault out of nlohmann's parser callback, which can stop parsing only by throwing.
struct FaultThrown {
  JsonFault fault;
};

// Follows nlohmann's parser through objects and arrays, so that what goes wrong can be named by
// its JSON path, and stops at a key written twice in one object.
class PathTracker {
 public:
  explicit PathTracker(std::string root) : root_(std::move(root)) {}

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
          JsonFault fault;
          fault.kind = JsonFault::Kind::kDuplicateKey;
          fault.path = path();
          throw FaultThrown{std::move(fault)};
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
      text = frame.object ? join_json_path(text, frame.key)
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

  std::string root_;
  std::vector<Frame> frames_;
};

// nlohmann's out_of_range 406 says "number overflow parsing '1e400'"; the number is what matters.
std::string overflowing_number(const std::string& what) {
  const std::size_t open = what.find('\'');
  const std::size_t close = what.rfind('\'');
  if (open == std::string::npos || close <= open) return "";
  return what.substr(open + 1, close - open - 1);
}

JsonFault syntax_fault(std::string_view text, const json::parse_error& error) {
  JsonFault fault;
  fault.kind = JsonFault::Kind::kSyntax;
  fault.parser_message = error.what();
  // error.byte counts the bytes read, the offending one included: 1-based.
  const std::size_t offset =
      std::min<std::size_t>(error.byte > 0 ? error.byte - 1 : 0, text.size());
  std::size_t line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  fault.line = line;
  fault.column = offset - line_start + 1;
  // nlohmann's message is "[json.exception.parse_error.101] parse error at line L, column C:
  // <reason>"; keep the reason.
  fault.reason = fault.parser_message;
  const std::size_t at = fault.reason.find("column ");
  const std::size_t colon = fault.reason.find(": ", at == std::string::npos ? 0 : at);
  if (colon != std::string::npos) fault.reason = fault.reason.substr(colon + 2);
  return fault;
}

}  // namespace

std::variant<json, JsonFault> parse_strict_json(std::string_view text, const std::string& root) {
  if (json_nesting_depth(text) > kMaxJsonDepth) {
    JsonFault fault;
    fault.kind = JsonFault::Kind::kTooDeep;
    return fault;
  }
  PathTracker tracker(root);
  try {
    return json::parse(text, std::ref(tracker));
  } catch (FaultThrown& thrown) {
    return std::move(thrown.fault);
  } catch (const json::out_of_range& error) {
    JsonFault fault;
    fault.kind = JsonFault::Kind::kNumberOutOfRange;
    fault.path = tracker.path();
    fault.parser_message = error.what();
    fault.number = overflowing_number(fault.parser_message);
    return fault;
  } catch (const json::parse_error& error) {
    return syntax_fault(text, error);
  } catch (const json::exception& error) {
    // No other exception is known to leave the parser; should one, it is still bad text.
    JsonFault fault;
    fault.kind = JsonFault::Kind::kSyntax;
    fault.parser_message = error.what();
    fault.reason = fault.parser_message;
    return fault;
  }
}

std::string strict_json_message(const JsonFault& fault, const std::string& source) {
  switch (fault.kind) {
    case JsonFault::Kind::kTooDeep:
      return source + ": nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    case JsonFault::Kind::kDuplicateKey:
      return source + ": " + fault.path +
             ": the key appears twice in one object; write it once (a JSON reader would "
             "silently keep only one of the values)";
    case JsonFault::Kind::kNumberOutOfRange:
      return source + ": " + fault.path + ": the number " + fault.number +
             " is out of range; a JSON number here must be finite (at most about 1.8e308)";
    case JsonFault::Kind::kSyntax:
      break;
  }
  return source + ":" + std::to_string(fault.line) + ":" + std::to_string(fault.column) +
         ": not valid JSON: " + fault.reason;
}

json read_strict_json(std::string_view text, ErrorKind kind, const std::string& source) {
  auto parsed = parse_strict_json(text);
  if (auto* fault = std::get_if<JsonFault>(&parsed)) {
    throw Error(kind, strict_json_message(*fault, source));
  }
  return std::move(std::get<json>(parsed));
}

}  // namespace zest
