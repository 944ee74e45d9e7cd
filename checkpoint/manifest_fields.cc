#include "checkpoint/manifest_fields.h"

#include <fmt/format.h>

#include "base/error.h"
#include "base/printable.h"
#include "base/strict_json.h"

namespace zest {

ManifestFields::ManifestFields(const json& value, std::string source, std::string path)
    : value_(value), source_(std::move(source)), path_(std::move(path)) {
  if (!value_.is_object()) fail("is not an object");
}

const nlohmann::json& ManifestFields::at(const std::string& key) const {
  auto found = value_.find(key);
  if (found == value_.end()) fail_key(key, "is missing");
  return *found;
}

std::string ManifestFields::path(const std::string& key) const {
  return join_json_path(path_, key);
}

std::string ManifestFields::string(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_string()) fail_key(key, "must be a string");
  return v.get<std::string>();
}

std::int64_t ManifestFields::integer(const std::string& key, std::int64_t min,
                                     std::int64_t max) const {
  const json& v = at(key);
  if (!v.is_number_integer()) fail_key(key, "must be an integer");
  // An unsigned above int64's range would wrap to a negative number in get<std::int64_t>().
  constexpr auto kLargest = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > kLargest) {
    fail_key(key, fmt::format("is {}, outside [{}, {}]", v.get<std::uint64_t>(), min, max));
  }
  const auto n = v.get<std::int64_t>();
  if (n < min || n > max) fail_key(key, fmt::format("is {}, outside [{}, {}]", n, min, max));
  return n;
}

double ManifestFields::number(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_number()) fail_key(key, "must be a number");
  return v.get<double>();
}

const nlohmann::json& ManifestFields::array(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_array()) fail_key(key, "must be an array");
  return v;
}

const nlohmann::json& ManifestFields::object(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_object()) fail_key(key, "must be an object");
  return v;
}

DType ManifestFields::dtype(const std::string& key) const {
  const std::string name = string(key);
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    if (name == dtype_name(d)) return d;
  }
  fail_key(key, "is '" + printable(name) + "', not one of fp32, bf16, fp16");
}

void ManifestFields::fail_key(const std::string& key, const std::string& what) const {
  throw Error(ErrorKind::kCheckpoint, source_ + ": " + path(key) + " " + what);
}

void ManifestFields::fail(const std::string& what) const {
  throw Error(ErrorKind::kCheckpoint,
              source_ + ": " + (path_.empty() ? std::string("the manifest") : path_) + " " + what);
}

std::optional<std::uint64_t> checked_product(std::uint64_t a, std::uint64_t b) {
  std::uint64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) return std::nullopt;
  return result;
}

}  // namespace zest
