// What the engine learns about a rank's gradients before it clips and steps: the sum of their
// squares (for the global norm) and how many are inf or NaN (the divergence check and the fp16
// loss scaler). The statistics live in device memory, beside the gradients, so that a CUDA
// device reads them back once per step instead of once per unit. Invariant: add_* ACCUMULATES
// into *statistics, so the update ranges of every unit sum into one result; zero it first.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "kernels/cpu_body.h"
#include "runtime/stream.h"

namespace zest {

struct GradientStatistics {
  double sum_of_squares = 0.0;   // in double, so the small terms of a large shard are not lost
  std::uint64_t non_finite = 0;  // elements that are inf or NaN
};

// Enqueues on `stream`: statistics->sum_of_squares += sum of data[i]^2 and
// statistics->non_finite += the count of inf / NaN among data[i], i < count. `data` holds fp32,
// bf16 or fp16 (other types: kUsage, on the host); `data` and `statistics` are the stream's
// device memory. The order of the additions is fixed, so the result is the same run to run.
void add_gradient_statistics(Stream& stream, const void* data, DType type, std::size_t count,
                             GradientStatistics* statistics);

namespace cpu {
void add_gradient_statistics(const void* data, DType type, std::size_t count,
                             GradientStatistics* statistics);
// The same with a chosen body (kernels/cpu_body.h; the fp32 sum runs in it, bf16 and fp16 in
// portable code); the one above runs selected_cpu_body(). Every body gives the same bits.
void add_gradient_statistics(CpuBody body, const void* data, DType type, std::size_t count,
                             GradientStatistics* statistics);
}  // namespace cpu

}  // namespace zest
