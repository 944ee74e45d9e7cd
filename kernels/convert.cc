#include "kernels/convert.h"

#include <cmath>

#include "base/error.h"
#include "kernels/dispatch.h"

namespace zest {

namespace {

inline float to_float(float value) { return value; }
inline float to_float(BFloat16 value) { return static_cast<float>(value); }
inline float to_float(Float16 value) { return static_cast<float>(value); }

template <typename T>
inline T from_float(float value) {
  if constexpr (std::is_same_v<T, float>) {
    return value;
  } else {
    return T(value);
  }
}

// Calls body.template operator()<T>() with T the C++ type of `type`.
template <typename Body>
void with_type(DType type, Body&& body) {
  switch (type) {
    case DType::kFloat32: return body(float{});
    case DType::kBFloat16: return body(BFloat16{});
    case DType::kFloat16: return body(Float16{});
    default:
      throw Error(ErrorKind::kUsage, std::string("conversion of ") + dtype_name(type) +
                                         " is not supported (fp32, bf16, fp16)");
  }
}

}  // namespace

namespace cpu {

void convert(const void* source, DType source_type, void* destination, DType destination_type,
             std::size_t count) {
  with_type(source_type, [&](auto source_tag) {
    using S = decltype(source_tag);
    with_type(destination_type, [&](auto destination_tag) {
      using D = decltype(destination_tag);
      const S* in = static_cast<const S*>(source);
      D* out = static_cast<D*>(destination);
      for (std::size_t i = 0; i < count; ++i) out[i] = from_float<D>(to_float(in[i]));
    });
  });
}

void accumulate_into(void* destination, DType destination_type, const void* source,
                     DType source_type, std::size_t count) {
  with_type(source_type, [&](auto source_tag) {
    using S = decltype(source_tag);
    with_type(destination_type, [&](auto destination_tag) {
      using D = decltype(destination_tag);
      const S* in = static_cast<const S*>(source);
      D* out = static_cast<D*>(destination);
      for (std::size_t i = 0; i < count; ++i) {
        out[i] = from_float<D>(to_float(out[i]) + to_float(in[i]));
      }
    });
  });
}

double sum_of_squares(const void* data, DType type, std::size_t count) {
  double sum = 0.0;
  with_type(type, [&](auto tag) {
    using T = decltype(tag);
    const T* values = static_cast<const T*>(data);
    for (std::size_t i = 0; i < count; ++i) {
      const double value = to_float(values[i]);
      sum += value * value;
    }
  });
  return sum;
}

bool has_non_finite(const void* data, DType type, std::size_t count) {
  bool found = false;
  with_type(type, [&](auto tag) {
    using T = decltype(tag);
    const T* values = static_cast<const T*>(data);
    for (std::size_t i = 0; i < count && !found; ++i) found = !std::isfinite(to_float(values[i]));
  });
  return found;
}

}  // namespace cpu

void convert(Stream& stream, const void* source, DType source_type, void* destination,
             DType destination_type, std::size_t count) {
  dispatch_kernel(stream, "convert", [=] {
    cpu::convert(source, source_type, destination, destination_type, count);
  });
}

void accumulate_into(Stream& stream, void* destination, DType destination_type,
                     const void* source, DType source_type, std::size_t count) {
  dispatch_kernel(stream, "accumulate_into", [=] {
    cpu::accumulate_into(destination, destination_type, source, source_type, count);
  });
}

}  // namespace zest
