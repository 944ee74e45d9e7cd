#include "runtime/host_reduction.h"

#include <algorithm>
#include <array>

#include "base/error.h"

namespace zest {

namespace {

// Elements reduced at a time: the accumulator stays in L1, and a destination that aliases a
// source is written only after every source has been read for the block.
constexpr std::size_t kBlock = 1024;

// The 2-byte types' conversions (fp32 has a loop of its own below).
inline float load(const BFloat16* data, std::size_t i) { return static_cast<float>(data[i]); }
inline void store(BFloat16* data, std::size_t i, float value) { data[i] = BFloat16(value); }
inline float load(const Float16* data, std::size_t i) { return static_cast<float>(data[i]); }
inline void store(Float16* data, std::size_t i, float value) { data[i] = Float16(value); }

template <typename T>
void reduce_typed(const std::vector<const void*>& sources, const std::vector<void*>& destinations,
                  std::size_t begin, std::size_t length, Reduction reduction) {
  const auto world = static_cast<float>(sources.size());
  std::array<float, kBlock> accumulator;
  for (std::size_t block = 0; block < length; block += kBlock) {
    const std::size_t size = std::min(kBlock, length - block);
    const std::size_t offset = begin + block;
    for (std::size_t s = 0; s < sources.size(); ++s) {
      const T* source = static_cast<const T*>(sources[s]) + offset;
      if (reduction == Reduction::kPreDividedMean) {
        for (std::size_t i = 0; i < size; ++i) {
          float value = load(source, i) / world;
          accumulator[i] = s == 0 ? value : accumulator[i] + value;
        }
      } else {
        for (std::size_t i = 0; i < size; ++i) {
          float value = load(source, i);
          accumulator[i] = s == 0 ? value : accumulator[i] + value;
        }
      }
    }
    if (reduction == Reduction::kMean) {
      for (std::size_t i = 0; i < size; ++i) accumulator[i] /= world;
    }
    for (void* destination : destinations) {
      T* out = static_cast<T*>(destination) + offset;
      for (std::size_t i = 0; i < size; ++i) store(out, i, accumulator[i]);
    }
  }
}

// The fp32 case, the local backend's reduce-scatter of every gradient: each loop runs a whole
// block of a fixed length, which GCC vectorizes at -O2 (the generic loop above, with its
// per-element source test, ran one element at a time: 2.9 ms of a 4-rank GPT step's ~105 ms per
// rank). Each element sees the same operations in the same order as above, so the same bits.
constexpr std::size_t kLanes = 16;
static_assert(kBlock % kLanes == 0);

// Sums n elements from `offset` of every source into `accumulator` (restrict: no alias checks,
// which would keep GCC's -O2 cost model from vectorizing). Inlined where n is a constant.
[[gnu::always_inline]] inline void sum_into(const std::vector<const void*>& sources,
                                           std::size_t offset, std::size_t n, float world,
                                           Reduction reduction, float* __restrict accumulator) {
  const float* __restrict first = static_cast<const float*>(sources[0]) + offset;
  if (reduction == Reduction::kPreDividedMean) {
    for (std::size_t i = 0; i < n; ++i) accumulator[i] = first[i] / world;
    for (std::size_t s = 1; s < sources.size(); ++s) {
      const float* __restrict source = static_cast<const float*>(sources[s]) + offset;
      for (std::size_t i = 0; i < n; ++i) accumulator[i] += source[i] / world;
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) accumulator[i] = first[i];
  for (std::size_t s = 1; s < sources.size(); ++s) {
    const float* __restrict source = static_cast<const float*>(sources[s]) + offset;
    for (std::size_t i = 0; i < n; ++i) accumulator[i] += source[i];
  }
  if (reduction == Reduction::kMean) {
    for (std::size_t i = 0; i < n; ++i) accumulator[i] /= world;
  }
}

void reduce_float(const std::vector<const void*>& sources, const std::vector<void*>& destinations,
                  std::size_t begin, std::size_t length, Reduction reduction) {
  const auto world = static_cast<float>(sources.size());
  alignas(64) std::array<float, kBlock> accumulator;
  const auto store_block = [&](std::size_t offset, std::size_t size) {
    for (void* destination : destinations) {
      std::copy_n(accumulator.data(), size, static_cast<float*>(destination) + offset);
    }
  };
  std::size_t done = 0;
  for (; done + kBlock <= length; done += kBlock) {
    sum_into(sources, begin + done, kBlock, world, reduction, accumulator.data());
    store_block(begin + done, kBlock);
  }
  const std::size_t whole = done;
  for (; done + kLanes <= length; done += kLanes) {
    sum_into(sources, begin + done, kLanes, world, reduction, accumulator.data() + done - whole);
  }
  if (done < length) {
    sum_into(sources, begin + done, length - done, world, reduction,
             accumulator.data() + done - whole);
  }
  store_block(begin + whole, length - whole);
}

}  // namespace

void reduce_elements(const std::vector<const void*>& sources,
                     const std::vector<void*>& destinations, std::size_t begin,
                     std::size_t length, DType dtype, Reduction reduction) {
  switch (dtype) {
    case DType::kFloat32:
      return reduce_float(sources, destinations, begin, length, reduction);
    case DType::kBFloat16:
      return reduce_typed<BFloat16>(sources, destinations, begin, length, reduction);
    case DType::kFloat16:
      return reduce_typed<Float16>(sources, destinations, begin, length, reduction);
    default:
      throw Error(ErrorKind::kUsage, std::string("reductions support fp32, bf16 and fp16, not ") +
                                         dtype_name(dtype));
  }
}

}  // namespace zest
