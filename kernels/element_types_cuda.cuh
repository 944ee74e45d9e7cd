// The storage types a kernel reads and writes, each as fp32 on the device: load() widens
// exactly, store() rounds as base/dtype.h does (round_cuda.cuh), so a CPU run and a GPU run read
// and write the same bits. with_element_type(type, kernel, body) calls body(Tag{}) with the tag
// of `type` and refuses any other type with a kUsage Error naming `kernel`. For .cu files only.
#pragma once

#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/round_cuda.cuh"

namespace zest::cuda {

struct Fp32 {
  using Storage = float;
  static __device__ __forceinline__ float load(float value) { return value; }
  static __device__ __forceinline__ float store(float value) { return value; }
};

struct Bf16 {
  using Storage = std::uint16_t;
  static __device__ __forceinline__ float load(std::uint16_t bits) {
    return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
  }
  static __device__ __forceinline__ std::uint16_t store(float value) {
    return round_to_bfloat16_bits(value);
  }
};

struct Fp16 {
  using Storage = std::uint16_t;
  static __device__ __forceinline__ float load(std::uint16_t bits) {
    return float16_bits_to_float(bits);
  }
  static __device__ __forceinline__ std::uint16_t store(float value) {
    return round_to_float16_bits(value);
  }
};

template <typename Body>
void with_element_type(DType type, const char* kernel, Body&& body) {
  switch (type) {
    case DType::kFloat32: return body(Fp32{});
    case DType::kBFloat16: return body(Bf16{});
    case DType::kFloat16: return body(Fp16{});
    default:
      throw Error(ErrorKind::kUsage, std::string(kernel) + ": " + dtype_name(type) +
                                         " is not supported (fp32, bf16, fp16)");
  }
}

}  // namespace zest::cuda
