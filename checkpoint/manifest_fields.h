// Strict access to the fields of a manifest.json being read (checkpoint/manifest_reading.cc,
// manifest_mesh.cc; internal to checkpoint/): every failure is a kCheckpoint Error naming the
// file and the JSON path, so a bad manifest is one line that says where.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/dtype.h"

namespace zest {

class ManifestFields {
 public:
  using json = nlohmann::json;

  // A kCheckpoint Error when `value` is not an object; `path` is its JSON path ("" for the top).
  ManifestFields(const json& value, std::string source, std::string path);

  const json& at(const std::string& key) const;
  std::string path(const std::string& key) const;
  bool has(const std::string& key) const { return value_.contains(key); }
  const std::string& source() const { return source_; }

  std::string string(const std::string& key) const;
  std::int64_t integer(const std::string& key, std::int64_t min = 0,
                       std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;
  double number(const std::string& key) const;
  const json& array(const std::string& key) const;
  const json& object(const std::string& key) const;
  DType dtype(const std::string& key) const;

  [[noreturn]] void fail_key(const std::string& key, const std::string& what) const;
  [[noreturn]] void fail(const std::string& what) const;

 private:
  const json& value_;
  std::string source_;
  std::string path_;
};

// a × b, or nothing when the product does not fit 64 bits.
std::optional<std::uint64_t> checked_product(std::uint64_t a, std::uint64_t b);

}  // namespace zest
