#include "checkpoint/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/durable_file.h"
#include "base/error.h"
#include "base/file_checks.h"
#include "kernels/convert.h"
#include "checkpoint/files.h"

namespace zest {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

using json = nlohmann::json;

// The reference implementation refuses larger headers; so does zest.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void invalid(const std::string& source, const std::string& what) {
  throw Error(ErrorKind::kData, source + ": not a valid safetensors file: " + what);
}

std::uint64_t read_u64_le(const unsigned char* bytes) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = value << 8 | bytes[i];
  return value;
}

std::uint64_t json_offset(const json& value, const std::string& source, const std::string& where) {
  if (!value.is_number_unsigned() &&
      !(value.is_number_integer() && value.get<std::int64_t>() >= 0)) {
    invalid(source, where + " must hold non-negative integers");
  }
  return value.get<std::uint64_t>();
}

}  // namespace

std::uint64_t SafetensorsTensor::numel() const {
  std::uint64_t count = 1;
  for (std::int64_t d : shape) count *= static_cast<std::uint64_t>(d);
  return count;
}

std::size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  const auto found = sizes.find(dtype);
  return found == sizes.end() ? 0 : found->second;
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat16:
      return "F16";
    case DType::kFloat64:
      return "F64";
    case DType::kInt32:
      return "I32";
    case DType::kInt8:
      return "I8";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(const std::string& dtype) {
  for (DType d :
       {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64, DType::kInt32}) {
    if (dtype == safetensors_dtype_name(d)) return d;
  }
  return std::nullopt;
}

SafetensorsHeader parse_safetensors_header(std::string_view text, std::uint64_t data_bytes,
                                           const std::string& source) {
  if (text.empty() || text.front() != '{') invalid(source, "the header does not start with '{'");
  // Note: nlohmann keeps the last of duplicate keys silently; a duplicate tensor name would
  // then hide bytes that no tensor claims, so top-level keys are collected while parsing.
  std::set<std::string> keys;
  std::string duplicate;
  json header;
  try {
    header = json::parse(text.begin(), text.end(),
                         [&](int depth, json::parse_event_t event, json& parsed) {
                           if (event == json::parse_event_t::key && depth == 1) {
                             const std::string key = parsed.get<std::string>();
                             if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
                           }
                           return true;
                         });
  } catch (const json::exception& error) {
    invalid(source, std::string("the header is not well-formed JSON (") + error.what() + ")");
  }
  if (!duplicate.empty()) invalid(source, "the header names '" + duplicate + "' twice");
  if (!header.is_object()) invalid(source, "the header is not a JSON object");

  SafetensorsHeader result;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) invalid(source, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) invalid(source, "__metadata__." + key + " is not a string");
        result.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!entry.is_object()) invalid(source, where + " is not an object");
    for (const auto& [key, value] : entry.items()) {
      (void)value;
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        invalid(source, where + " has an unknown key '" + key + "'");
      }
    }
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) {
      invalid(source, where + " has no dtype string");
    }
    SafetensorsTensor tensor;
    tensor.name = name;
    tensor.dtype = entry["dtype"].get<std::string>();
    const std::size_t element = safetensors_dtype_size(tensor.dtype);
    if (element == 0) invalid(source, where + " has an unknown dtype '" + tensor.dtype + "'");
    if (!entry.contains("shape") || !entry["shape"].is_array()) {
      invalid(source, where + " has no shape array");
    }
    std::uint64_t numel = 1;
    for (const json& d : entry["shape"]) {
      const std::uint64_t size = json_offset(d, source, where + " shape");
      if (size != 0 && numel > std::numeric_limits<std::uint64_t>::max() / element / size) {
        invalid(source, where + " is too large");
      }
      numel *= size;
      tensor.shape.push_back(static_cast<std::int64_t>(size));
    }
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      invalid(source, where + " has no data_offsets [begin, end]");
    }
    tensor.begin = json_offset(entry["data_offsets"][0], source, where + " data_offsets");
    tensor.end = json_offset(entry["data_offsets"][1], source, where + " data_offsets");
    if (tensor.end < tensor.begin) invalid(source, where + " ends before it begins");
    if (tensor.end - tensor.begin != numel * element) {
      invalid(source, fmt::format("{} spans {} bytes; shape and dtype {} make {}", where,
                                  tensor.end - tensor.begin, tensor.dtype, numel * element));
    }
    result.tensors.push_back(std::move(tensor));
  }
  std::sort(result.tensors.begin(), result.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  std::uint64_t next = 0;
  for (const SafetensorsTensor& tensor : result.tensors) {
    if (tensor.begin != next) {
      invalid(source,
              fmt::format("tensor '{}' starts at byte {} of the data, not at {} ({})", tensor.name,
                          tensor.begin, next, tensor.begin < next ? "overlap" : "gap"));
    }
    next = tensor.end;
  }
  if (next != data_bytes) {
    invalid(source, fmt::format("the tensors end at byte {} of the data, which holds {}", next,
                                data_bytes));
  }
  return result;
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  refuse_non_regular_file(path_, ErrorKind::kData, "safetensors file");
  std::error_code error;
  if (!std::filesystem::is_regular_file(path_, error)) {
    throw Error(ErrorKind::kData, path_ + ": no such file");
  }
  const ReadOnlyFile file(path_);
  if (file.size() < 8) invalid(path_, "shorter than its 8-byte header length");
  unsigned char length_bytes[8];
  file.read(0, length_bytes, 8);
  const std::uint64_t length = read_u64_le(length_bytes);
  if (length > kMaxHeaderBytes || length > file.size() - 8) {
    invalid(path_,
            fmt::format("header length {} does not fit the file ({} bytes)", length, file.size()));
  }
  if (length % 8 != 0) {
    invalid(path_, fmt::format("header length {} is not a multiple of 8 (the data must start "
                               "8-byte aligned)",
                               length));
  }
  std::string text(static_cast<std::size_t>(length), '\0');
  file.read(8, text.data(), text.size());
  data_start_ = 8 + length;
  header_ = parse_safetensors_header(text, file.size() - data_start_, path_);
}

const SafetensorsTensor* SafetensorsReader::find(const std::string& name) const {
  for (const SafetensorsTensor& tensor : header_.tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

std::vector<char> SafetensorsReader::read_bytes(const SafetensorsTensor& tensor) const {
  std::vector<char> bytes(static_cast<std::size_t>(tensor.end - tensor.begin));
  ReadOnlyFile(path_).read(data_start_ + tensor.begin, bytes.data(), bytes.size());
  return bytes;
}

std::vector<float> SafetensorsReader::read_float32(const std::string& name) const {
  const SafetensorsTensor* tensor = find(name);
  if (tensor == nullptr) throw Error(ErrorKind::kData, path_ + ": no tensor named '" + name + "'");
  const std::vector<char> bytes = read_bytes(*tensor);
  const auto count = static_cast<std::size_t>(tensor->numel());
  std::vector<float> values(count);
  const std::optional<DType> dtype = dtype_from_safetensors(tensor->dtype);
  if (dtype == DType::kFloat64) {
    for (std::size_t i = 0; i < count; ++i) {
      double value;
      std::memcpy(&value, bytes.data() + i * sizeof value, sizeof value);
      values[i] = static_cast<float>(value);
    }
  } else if (dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16) {
    cpu::convert(bytes.data(), *dtype, values.data(), DType::kFloat32, count);
  } else {
    throw Error(ErrorKind::kData, path_ + ": tensor '" + name + "' is " + tensor->dtype +
                                      ", not a floating-point type");
  }
  return values;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(std::size_t, const SafetensorsSink&)>& fill) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<std::uint64_t> sizes;
  std::uint64_t offset = 0;
  for (const SafetensorsEntry& entry : entries) {
    std::uint64_t numel = 1;
    for (std::int64_t d : entry.shape) numel *= static_cast<std::uint64_t>(d);
    sizes.push_back(numel * dtype_size(entry.dtype));
    header[entry.name] = {{"dtype", safetensors_dtype_name(entry.dtype)},
                          {"shape", entry.shape},
                          {"data_offsets", {offset, offset + sizes.back()}}};
    offset += sizes.back();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  DurableFile file(path);
  file.write(length, sizeof length);
  file.write(text);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    std::uint64_t written = 0;
    fill(i, [&](const void* data, std::size_t bytes) {
      file.write(data, bytes);
      written += bytes;
    });
    if (written != sizes[i]) {
      throw Error(ErrorKind::kInternal, fmt::format("safetensors: '{}' got {} bytes, not {}",
                                                    entries[i].name, written, sizes[i]));
    }
  }
  file.commit();
}

}  // namespace zest
