#include "base/dtype.h"

#include "base/error.h"

namespace zest {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kBFloat16: return 2;
    case DType::kFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
    case DType::kInt8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "fp32";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
    case DType::kFloat64: return "fp64";
    case DType::kInt32: return "int32";
    case DType::kInt8: return "int8";
  }
  return "unknown";
}

DType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  throw Error(ErrorKind::kConfig,
              "unknown dtype '" + name + "' (allowed: fp32, bf16, fp16)");
}

}  // namespace zest
