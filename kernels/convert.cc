#include "kernels/convert.h"

#include <cmath>

#include "base/error.h"
#include "kernels/dispatch.h"
#include "kernels/float_elements.h"

#if ZEST_HAVE_CUDA
#include <cstdint>
#include <string>

#include "base/cuda_check.h"
#include "kernels/accumulate_cuda.h"
#include "kernels/cast_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {

namespace {

using cpu::from_float;
using cpu::to_float;

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

#if ZEST_HAVE_CUDA
namespace {

// The casts the engine makes on a device (fp32 masters to bf16/fp16 compute copies and back) and
// plain copies; the CUDA side has no body for the other pairs yet.
void convert_cuda(Stream& stream, const void* source, DType source_type, void* destination,
                  DType destination_type, std::size_t count) {
  const cudaStream_t handle = cuda::stream_handle(stream, "convert");
  if (count == 0) return;
  const auto* in16 = static_cast<const std::uint16_t*>(source);
  auto* out16 = static_cast<std::uint16_t*>(destination);
  if (source_type == destination_type) {
    if (source == destination) return;
    ZEST_CUDA_CHECK(cudaMemcpyAsync(destination, source, count * dtype_size(source_type),
                                    cudaMemcpyDeviceToDevice, handle));
  } else if (source_type == DType::kFloat32 && destination_type == DType::kBFloat16) {
    cuda::cast_float_to_bfloat16(static_cast<const float*>(source), out16, count, handle);
  } else if (source_type == DType::kFloat32 && destination_type == DType::kFloat16) {
    cuda::cast_float_to_float16(static_cast<const float*>(source), out16, count, handle);
  } else if (source_type == DType::kBFloat16 && destination_type == DType::kFloat32) {
    cuda::cast_bfloat16_to_float(in16, static_cast<float*>(destination), count, handle);
  } else if (source_type == DType::kFloat16 && destination_type == DType::kFloat32) {
    cuda::cast_float16_to_float(in16, static_cast<float*>(destination), count, handle);
  } else if (source_type == DType::kBFloat16 && destination_type == DType::kFloat16) {
    cuda::cast_bfloat16_to_float16(in16, out16, count, handle);
  } else if (source_type == DType::kFloat16 && destination_type == DType::kBFloat16) {
    cuda::cast_float16_to_bfloat16(in16, out16, count, handle);
  } else {
    throw Error(ErrorKind::kUsage, std::string("convert: no CUDA body from ") +
                                       dtype_name(source_type) + " to " +
                                       dtype_name(destination_type));
  }
}

}  // namespace
#endif

void convert(Stream& stream, const void* source, DType source_type, void* destination,
             DType destination_type, std::size_t count) {
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    convert_cuda(stream, source, source_type, destination, destination_type, count);
    return;
  }
#endif
  dispatch_kernel(stream, "convert", [=] {
    cpu::convert(source, source_type, destination, destination_type, count);
  });
}

void accumulate_into(Stream& stream, void* destination, DType destination_type,
                     const void* source, DType source_type, std::size_t count) {
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    const cudaStream_t handle = cuda::stream_handle(stream, "accumulate_into");
    cuda::accumulate_into(destination, destination_type, source, source_type, count, handle);
    return;
  }
#endif
  dispatch_kernel(stream, "accumulate_into", [=] {
    cpu::accumulate_into(destination, destination_type, source, source_type, count);
  });
}

}  // namespace zest
