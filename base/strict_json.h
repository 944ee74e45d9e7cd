// The strict JSON reader: text to nlohmann::json, refusing what nlohmann would accept silently or
// report without a place. It refuses text nesting deeper than kMaxJsonDepth (before parsing), a
// key written twice in one object (nlohmann keeps the last; a reader of the file believes the
// first), and names a number out of range by its JSON path and a syntax error by line and
// column. Each reader (the config file, `--set`, a checkpoint manifest) chooses its error kind
// and source, and may word a fault its own way from the JsonFault.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace zest {

// "optimizer.params" + "lr" -> "optimizer.params.lr"; "" + "lr" -> "lr".
inline std::string join_json_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

// What made JSON text unacceptable.
struct JsonFault {
  enum class Kind { kTooDeep, kDuplicateKey, kNumberOutOfRange, kSyntax };
  Kind kind = Kind::kSyntax;
  // kDuplicateKey, kNumberOutOfRange: the JSON path ("model.sizes[2]", or "the top-level value").
  std::string path;
  std::string number;  // kNumberOutOfRange: the number as written ("1e400")
  // kSyntax: 1-based position of the offending byte, and the parser's reason without its
  // position ("syntax error while parsing value - ...").
  std::size_t line = 0;
  std::size_t column = 0;
  std::string reason;
  std::string parser_message;  // kSyntax, kNumberOutOfRange: nlohmann's whole message
};

// Parses `text` strictly; bad text is a JsonFault, never an exception. `root`: the JSON path of
// the value being parsed inside a larger document ("" for a whole file), so paths name where
// the value will live.
std::variant<nlohmann::json, JsonFault> parse_strict_json(std::string_view text,
                                                          const std::string& root = "");

// The standard message for `fault` in text from `source`:
//   "source: nests deeper than 512 levels"
//   "source: path: the key appears twice in one object; write it once (...)"
//   "source: path: the number 1e400 is out of range; a JSON number here must be finite (...)"
//   "source:line:column: not valid JSON: reason"
std::string strict_json_message(const JsonFault& fault, const std::string& source);

// parse_strict_json, throwing Error(kind, strict_json_message(fault, source)) for bad text.
nlohmann::json read_strict_json(std::string_view text, ErrorKind kind, const std::string& source);

}  // namespace zest
