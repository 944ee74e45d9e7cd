// Reading a JSON config with messages that name the JSON path: typed reads (an integer, a
// number, a string, a boolean) and Block, one object of the config whose unknown keys are errors
// that suggest the closest known key. Shared by the trainer's config loader and its file reading.
// Invariant: every failure is a kConfig Error whose message starts with the JSON path.
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/strict_json.h"

namespace zest::config_reading {

using nlohmann::json;

[[noreturn]] inline void config_error(const std::string& path, const std::string& message) {
  throw Error(ErrorKind::kConfig, path + ": " + message);
}

// A value as a message shows it: its JSON type and, for short scalars, the value itself.
inline std::string describe(const json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  switch (value.type()) {
    case json::value_t::string: return "string " + text;
    case json::value_t::boolean: return "boolean " + text;
    case json::value_t::null: return "null";
    case json::value_t::array: return "array " + text;
    case json::value_t::object: return "object " + text;
    default: return text;  // numbers speak for themselves
  }
}

// "a, b or c"
inline std::string one_of(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " or " : ", ";
    text += names[i];
  }
  return text;
}

inline std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known key closest to `key`, if one is close enough to be a likely typo: a different case,
// or a few edits for its length.
inline std::optional<std::string> closest_key(const std::string& key,
                                       const std::vector<std::string>& known) {
  std::optional<std::string> best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const std::string& candidate : known) {
    const std::size_t distance = edit_distance(lower(key), lower(candidate));
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  const std::size_t allowed = std::max<std::size_t>(2, key.size() / 3);
  if (best && best_distance <= allowed) return best;
  return std::nullopt;
}

inline std::string join_path(const std::string& parent, const std::string& key) {
  return join_json_path(parent, key);
}

// Float values as the shortest decimal that reads back as the same float, so that defaults in
// the resolved JSON print as 0.001 rather than 0.0010000000474974513.
inline double shortest(float value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  return std::stod(std::string(text, result.ptr));
}

// ---- typed reads ---------------------------------------------------------------------------

// An integer, or a float with an integral value (DeepSpeed configs write sizes as 5e8).
inline std::int64_t read_integer(const json& value, const std::string& path) {
  if (value.is_number_integer() && !value.is_number_unsigned()) return value.get<std::int64_t>();
  if (value.is_number_unsigned()) {
    const auto unsigned_value = value.get<std::uint64_t>();
    if (unsigned_value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      config_error(path, "must be an integer below 2^63, got " + value.dump());
    }
    return static_cast<std::int64_t>(unsigned_value);
  }
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (std::isfinite(number) && number == std::floor(number) && std::fabs(number) < 9.2e18) {
      return static_cast<std::int64_t>(number);
    }
  }
  config_error(path, "must be an integer, got " + describe(value));
}

inline std::int64_t read_integer_at_least(const json& value, const std::string& path,
                                   std::int64_t minimum) {
  const std::int64_t number = read_integer(value, path);
  if (number < minimum) {
    config_error(path, "must be an integer >= " + std::to_string(minimum) + ", got " +
                           std::to_string(number));
  }
  return number;
}

inline double read_number(const json& value, const std::string& path) {
  if (!value.is_number()) config_error(path, "must be a number, got " + describe(value));
  const double number = value.get<double>();
  if (!std::isfinite(number)) config_error(path, "must be a finite number, got " + value.dump());
  return number;
}

// A number the engine keeps as a 32-bit float (a learning rate, an epsilon, a loss scale): one
// that would become inf or 0 there is refused here, by name, instead of training on inf.
inline double read_float(const json& value, const std::string& path) {
  const double number = read_number(value, path);
  const double magnitude = std::fabs(number);
  if (magnitude > std::numeric_limits<float>::max() ||
      (magnitude > 0 && magnitude < std::numeric_limits<float>::min())) {
    config_error(path, "must fit a 32-bit float (a magnitude from 1.2e-38 to 3.4e38, or 0), got " +
                           value.dump());
  }
  return number;
}

inline bool read_bool(const json& value, const std::string& path) {
  if (!value.is_boolean()) config_error(path, "must be true or false, got " + describe(value));
  return value.get<bool>();
}

inline std::string read_string(const json& value, const std::string& path) {
  if (!value.is_string()) config_error(path, "must be a string, got " + describe(value));
  return value.get<std::string>();
}

// One JSON object of the config: its path, and the keys it allows. Constructing it checks that
// the value is an object and that every key in it is allowed, suggesting the closest allowed key
// for one that is not.
class Block {
 public:
  // `elsewhere`: keys that belong to another block, with their full path, for a hint when one
  // is written here ("stage" at the top level means zero_optimization.stage).
  Block(json& value, std::string path, std::vector<std::string> known,
        const std::vector<std::pair<std::string, std::string>>& elsewhere = {})
      : value_(value), path_(std::move(path)), known_(std::move(known)) {
    if (!value_.is_object()) {
      config_error(path_.empty() ? "config" : path_, "must be an object, got " + describe(value_));
    }
    for (const auto& item : value_.items()) {
      if (std::find(known_.begin(), known_.end(), item.key()) != known_.end()) continue;
      std::string message = "unknown key";
      auto moved = std::find_if(elsewhere.begin(), elsewhere.end(),
                                [&](const auto& entry) { return entry.first == item.key(); });
      if (moved != elsewhere.end()) {
        message += "; did you mean '" + moved->second + "'?";
      } else if (auto suggestion = closest_key(item.key(), known_)) {
        message += "; did you mean '" + join_path(path_, *suggestion) + "'?";
      } else {
        message += "; allowed here: " + one_of(known_);
      }
      config_error(join_path(path_, item.key()), message);
    }
  }

  std::string path(const std::string& key) const { return join_path(path_, key); }

  // The value of `key`, or null when absent.
  json* find(const std::string& key) {
    auto it = value_.find(key);
    return it == value_.end() ? nullptr : &*it;
  }
  // The value of `key`; a kConfig Error naming it when absent.
  json& require(const std::string& key, const std::string& what) {
    json* value = find(key);
    if (value == nullptr) config_error(path(key), "missing; " + what);
    return *value;
  }
  // The value of `key`, set to `fallback` first when absent (so the resolved JSON shows it).
  json& get_or(const std::string& key, json fallback) {
    if (!value_.contains(key)) value_[key] = std::move(fallback);
    return value_[key];
  }
  // A sub-block, created empty when absent.
  json& object_or_empty(const std::string& key) { return get_or(key, json::object()); }

 private:
  json& value_;
  std::string path_;
  std::vector<std::string> known_;
};

}  // namespace zest::config_reading
