#include "kernels/vector_ops.h"

#include "base/error.h"

namespace zest {

namespace cpu {

void accumulate(float* __restrict destination, const float* __restrict source, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) destination[i] += source[i];
}

double sum_of_squares(const float* data, std::size_t count) {
  double sum = 0.0;
  for (std::size_t i = 0; i < count; ++i) sum += static_cast<double>(data[i]) * data[i];
  return sum;
}

}  // namespace cpu

namespace {
void require_cpu(Stream& stream, const char* kernel) {
  if (stream.device_kind() != DeviceKind::kCpu) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": no body for this device yet");
  }
}
}  // namespace

void accumulate(Stream& stream, float* destination, const float* source, std::size_t count) {
  require_cpu(stream, "accumulate");
  stream.enqueue([=] { cpu::accumulate(destination, source, count); });
}

void add_sum_of_squares(Stream& stream, const float* data, std::size_t count, double* result) {
  require_cpu(stream, "add_sum_of_squares");
  stream.enqueue([=] { *result += cpu::sum_of_squares(data, count); });
}

}  // namespace zest
