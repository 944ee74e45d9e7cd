// The arithmetic of a reduction across ranks on host memory: elementwise over several source
// buffers, in rank order (so every rank computes bit-identical results), accumulated in float32
// whatever the storage type, and written to one or more destinations.
#pragma once

#include <cstddef>
#include <vector>

#include "base/dtype.h"
#include "runtime/communicator.h"

namespace zest {

// For each element i in [begin, begin + length): reduces sources[0][i] … sources[n-1][i] and
// writes the result to every destinations[k][i]. A destination may alias a source: each block is
// fully read before it is written. Supports fp32, bf16 and fp16; other types throw a kUsage Error.
void reduce_elements(const std::vector<const void*>& sources,
                     const std::vector<void*>& destinations, std::size_t begin,
                     std::size_t length, DType dtype, Reduction reduction);

}  // namespace zest
