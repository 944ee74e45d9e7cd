#include "kernels/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "base/error.h"
#include "kernels/dispatch.h"
#include "kernels/float_elements.h"

#if ZEST_HAVE_CUDA
#include "kernels/quantize_cuda.h"
#include "kernels/scale_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {

namespace {

using cpu::from_float;
using cpu::to_float;

template <typename Body>
void with_type(DType type, const char* kernel, Body&& body) {
  switch (type) {
    case DType::kFloat32: return body(float{});
    case DType::kBFloat16: return body(BFloat16{});
    case DType::kFloat16: return body(Float16{});
    default:
      throw Error(ErrorKind::kUsage, std::string(kernel) + ": " + dtype_name(type) +
                                         " is not supported (fp32, bf16, fp16)");
  }
}

void check_block(std::size_t block, const char* kernel) {
  if (block == 0) throw Error(ErrorKind::kUsage, std::string(kernel) + ": block size 0");
}

void check_bits(int bits, const char* kernel) {
  if (bits != 8 && bits != 4) {
    throw Error(ErrorKind::kUsage,
                std::string(kernel) + ": bits must be 8 or 4, got " + std::to_string(bits));
  }
}

std::size_t block_count(std::size_t count, std::size_t block) { return (count + block - 1) / block; }

// The largest level: values are quantized to [-levels, levels].
float levels_of(int bits) { return bits == 8 ? 127.0f : 7.0f; }

// Value i of a packed run (module header: one byte, or a nibble of byte i/2 in two's complement).
float value_at(const std::uint8_t* values, std::size_t i, int bits) {
  if (bits == 8) return static_cast<float>(static_cast<std::int8_t>(values[i]));
  const int nibble = (values[i / 2] >> (4 * (i % 2))) & 0xF;
  return static_cast<float>((nibble ^ 8) - 8);
}

const float* scales_of(const void* packed, std::size_t count, int bits) {
  return reinterpret_cast<const float*>(static_cast<const char*>(packed) +
                                        quantized_scales_offset(count, bits));
}

}  // namespace

std::size_t quantized_scales_offset(std::size_t count, int bits) {
  check_bits(bits, "quantized_scales_offset");
  const std::size_t value_bytes = bits == 8 ? count : (count + 1) / 2;
  return (value_bytes + 3) / 4 * 4;
}

std::size_t quantized_bytes(std::size_t count, std::size_t block, int bits) {
  check_block(block, "quantized_bytes");
  return quantized_scales_offset(count, bits) + block_count(count, block) * sizeof(float);
}

namespace cpu {

void quantize_blocks(const void* source, DType type, std::size_t count, std::size_t block,
                     void* packed, int bits) {
  check_block(block, "quantize_blocks");
  check_bits(bits, "quantize_blocks");
  auto* values = static_cast<std::uint8_t*>(packed);
  const std::size_t value_bytes = quantized_scales_offset(count, bits);
  auto* scales = reinterpret_cast<float*>(values + value_bytes);
  const float levels = levels_of(bits);
  // The padding bytes travel on the wire too: keep them defined. At 4 bits the nibbles are
  // or-ed into zeros (a block may start inside a byte).
  std::memset(values, 0, value_bytes);
  const auto put = [&](std::size_t i, float q) {
    const int level = static_cast<int>(q);
    if (bits == 8) {
      values[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(level));
    } else {
      values[i / 2] |= static_cast<std::uint8_t>((level & 0xF) << (4 * (i % 2)));
    }
  };
  with_type(type, "quantize_blocks", [&](auto tag) {
    using T = decltype(tag);
    const T* in = static_cast<const T*>(source);
    for (std::size_t b = 0, first = 0; first < count; ++b, first += block) {
      const std::size_t last = std::min(count, first + block);
      float largest = 0.0f;
      bool finite = true;
      for (std::size_t i = first; i < last; ++i) {
        const float x = to_float(in[i]);
        finite = finite && std::isfinite(x);
        largest = std::max(largest, std::fabs(x));
      }
      if (!finite || largest == 0.0f) {
        // Note: the NaN scale makes the whole block NaN when dequantized; zeros stay zeros.
        // The values stay 0 (the memset above).
        scales[b] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      // Note: a block of subnormals would get a scale that underflows; the smallest normal
      // scale still holds every value within s/2 (the values become 0 or +-1).
      const float scale = std::max(largest / levels, FLT_MIN);
      const float inverse = 1.0f / scale;
      scales[b] = scale;
      for (std::size_t i = first; i < last; ++i) {
        put(i, std::clamp(std::nearbyint(to_float(in[i]) * inverse), -levels, levels));
      }
    }
  });
}

void dequantize_blocks(const void* packed, std::size_t count, std::size_t block,
                       void* destination, DType type, int bits) {
  check_block(block, "dequantize_blocks");
  check_bits(bits, "dequantize_blocks");
  const auto* values = static_cast<const std::uint8_t*>(packed);
  const float* scales = scales_of(packed, count, bits);
  with_type(type, "dequantize_blocks", [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(destination);
    for (std::size_t i = 0; i < count; ++i) {
      out[i] = from_float<T>(value_at(values, i, bits) * scales[i / block]);
    }
  });
}

void dequantize_accumulate(const void* packed, std::size_t count, std::size_t block,
                           float* destination, int bits) {
  check_block(block, "dequantize_accumulate");
  check_bits(bits, "dequantize_accumulate");
  const auto* values = static_cast<const std::uint8_t*>(packed);
  const float* scales = scales_of(packed, count, bits);
  for (std::size_t i = 0; i < count; ++i) {
    destination[i] += value_at(values, i, bits) * scales[i / block];
  }
}

void scale_values(float* data, std::size_t count, float factor) {
  for (std::size_t i = 0; i < count; ++i) data[i] *= factor;
}

}  // namespace cpu

void quantize_blocks(Stream& stream, const void* source, DType type, std::size_t count,
                     std::size_t block, void* packed, int bits) {
  check_block(block, "quantize_blocks");
  check_bits(bits, "quantize_blocks");
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::quantize_blocks(source, type, count, block, packed,
                          cuda::stream_handle(stream, "quantize_blocks"), bits);
    return;
  }
#endif
  dispatch_kernel(stream, "quantize_blocks",
                  [=] { cpu::quantize_blocks(source, type, count, block, packed, bits); });
}

void dequantize_blocks(Stream& stream, const void* packed, std::size_t count, std::size_t block,
                       void* destination, DType type, int bits) {
  check_block(block, "dequantize_blocks");
  check_bits(bits, "dequantize_blocks");
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::dequantize_blocks(packed, count, block, destination, type,
                            cuda::stream_handle(stream, "dequantize_blocks"), bits);
    return;
  }
#endif
  dispatch_kernel(stream, "dequantize_blocks",
                  [=] { cpu::dequantize_blocks(packed, count, block, destination, type, bits); });
}

void dequantize_accumulate(Stream& stream, const void* packed, std::size_t count,
                           std::size_t block, float* destination, int bits) {
  check_block(block, "dequantize_accumulate");
  check_bits(bits, "dequantize_accumulate");
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::dequantize_accumulate(packed, count, block, destination,
                                cuda::stream_handle(stream, "dequantize_accumulate"), bits);
    return;
  }
#endif
  dispatch_kernel(stream, "dequantize_accumulate",
                  [=] { cpu::dequantize_accumulate(packed, count, block, destination, bits); });
}

void scale_values(Stream& stream, float* data, std::size_t count, float factor) {
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::scale(data, count, factor, cuda::stream_handle(stream, "scale_values"));
    return;
  }
#endif
  dispatch_kernel(stream, "scale_values", [=] { cpu::scale_values(data, count, factor); });
}

}  // namespace zest
