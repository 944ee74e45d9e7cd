// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of JSON
// ({"<name>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, padded with spaces so the data starts 8-byte aligned), then
// the tensors' raw little-endian bytes, contiguous from offset 0 of the data section. zest
// writes it to export a checkpoint's full parameters and reads it to start a model from one.
// Invariant: the reader accepts only a file that is exactly this — offsets contiguous from 0
// with no gap or overlap, byte lengths = numel × dtype size, the last tensor ending at the end
// of the file, a well-formed JSON object with no duplicate names, N a multiple of 8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"

namespace zest {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // the format's name: "F32", "BF16", "F16", "I64", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // data_offsets, relative to the start of the data section
  std::uint64_t end = 0;
  std::uint64_t numel() const;
};

// The size in bytes of one element of a safetensors dtype, or 0 for an unknown name.
std::size_t safetensors_dtype_size(const std::string& dtype);
// "F32", "BF16", "F16", "F64", "I32" for the DTypes that have one.
const char* safetensors_dtype_name(DType dtype);
// The zest DType of a safetensors dtype name, if zest has one.
std::optional<DType> dtype_from_safetensors(const std::string& dtype);

struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;  // in data order
  std::map<std::string, std::string> metadata;
};

// Validates a header's JSON text against a data section of `data_bytes`; kData Error naming
// `source` and what is wrong.
SafetensorsHeader parse_safetensors_header(std::string_view json_text, std::uint64_t data_bytes,
                                           const std::string& source);

class SafetensorsReader {
 public:
  // Opens and validates the whole file's structure (not the values).
  explicit SafetensorsReader(std::string path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const SafetensorsTensor* find(const std::string& name) const;

  // The tensor's raw bytes.
  std::vector<char> read_bytes(const SafetensorsTensor& tensor) const;
  // The tensor's values as fp32 (from F32, BF16, F16 or F64); kData Error for other dtypes or an
  // unknown name.
  std::vector<float> read_float32(const std::string& name) const;

 private:
  std::string path_;
  SafetensorsHeader header_;
  std::uint64_t data_start_ = 0;
};

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
};

// Writes `path` whole or not at all (a temporary file beside it, fsynced, renamed). `entries`
// are laid out in the order given; `fill(i, write)` must call write(data, bytes) with exactly
// entry i's bytes, in as many pieces as it likes.
using SafetensorsSink = std::function<void(const void* data, std::size_t bytes)>;
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(std::size_t, const SafetensorsSink&)>& fill);

}  // namespace zest
