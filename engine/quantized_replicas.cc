#include "engine/quantized_replicas.h"

#include <algorithm>
#include <string>

#include "kernels/convert.h"
#include "kernels/quantize.h"

namespace zest {

namespace {

// The slice each replica sums: ceil(count / R) elements, the last ones shorter or empty.
std::size_t slice_length(std::size_t count, int replicas) {
  const auto r = static_cast<std::size_t>(replicas);
  return (count + r - 1) / r;
}

std::size_t slice_count(std::size_t count, std::size_t slice, int index) {
  const std::size_t first = std::min(count, static_cast<std::size_t>(index) * slice);
  return std::min(slice, count - first);
}

}  // namespace

std::vector<std::size_t> quantized_replica_bytes(std::size_t largest_shard, int replicas,
                                                 std::size_t block, int bits) {
  const std::size_t slice = slice_length(largest_shard, replicas);
  const std::size_t packed =
      static_cast<std::size_t>(replicas) * quantized_bytes(slice, block, bits);
  return {packed, packed, slice * sizeof(float)};
}

QuantizedReplicaMean::QuantizedReplicaMean(Device& device, Communicator& replicas,
                                           std::size_t largest_shard, std::size_t block,
                                           int bits)
    : device_(device), replicas_(replicas), block_(block), bits_(bits),
      sends_(device.create_stream(
          "rank " + std::to_string(replicas.world_rank_of(replicas.rank())) +
          " quantized replica sends")),
      quantized_(device.create_event()), sends_done_(device.create_event()) {
  const std::vector<std::size_t> bytes =
      quantized_replica_bytes(largest_shard, replicas.world_size(), block, bits);
  packed_ = device.allocator().allocate(bytes[0], Category::kBuckets);
  received_ = device.allocator().allocate(bytes[1], Category::kBuckets);
  sum_ = device.allocator().allocate(bytes[2], Category::kBuckets);
}

QuantizedReplicaMean::~QuantizedReplicaMean() {
  // The sends read packed_: they must have been taken before it is freed.
  try {
    sends_->synchronize();
  } catch (...) {  // a failed peer: the error has reached the caller through comm already
  }
}

// Replica j owns slice j. Sends are on a stream of their own (a send waits until its peer took
// it, and every replica sends before it receives). packed_ holds only what is sent, so the next
// call waits for those sends before packing again; received_ region `me` is never received
// into, so this rank's quantized mean goes there and the all-gather runs in place.
void QuantizedReplicaMean::mean(Stream& comm, float* data, std::size_t count, const char* label) {
  if (count == 0) return;
  const int n = replicas_.world_size();
  const int me = replicas_.rank();
  const std::size_t slice = slice_length(count, n);
  const std::size_t packed = quantized_bytes(slice, block_, bits_);
  const std::size_t mine = slice_count(count, slice, me);
  const auto region = [&](Buffer& buffer, int index) {
    return buffer.as<char>() + static_cast<std::size_t>(index) * packed;
  };
  const auto values = [&](int index) { return data + static_cast<std::size_t>(index) * slice; };
  const std::string name =
      std::string(label) + " across replicas (int" + std::to_string(bits_) + ")";

  comm.wait(*sends_done_);
  for (int j = 0; j < n; ++j) {
    const std::size_t length = slice_count(count, slice, j);
    if (j != me && length > 0) {
      quantize_blocks(comm, values(j), DType::kFloat32, length, block_, region(packed_, j), bits_);
    }
  }
  comm.record(*quantized_);
  sends_->wait(*quantized_);
  for (int t = 1; t < n; ++t) {
    const int to = (me + t) % n;
    replicas_.label_next(name.c_str());
    replicas_.send(*sends_, region(packed_, to), packed, DType::kInt8, to);
  }
  for (int t = 1; t < n; ++t) {
    const int from = (me - t + n) % n;
    replicas_.label_next(name.c_str());
    replicas_.receive(comm, region(received_, from), packed, DType::kInt8, from);
  }
  sends_->record(*sends_done_);
  float* sum = sum_.as<float>();
  if (mine > 0) {
    // Note: summed in replica order, this rank's own values at their place, so the mean does not
    // depend on which replica owns the slice.
    device_.fill_zero(comm, sum, mine * sizeof(float));
    for (int j = 0; j < n; ++j) {
      if (j == me) {
        accumulate_into(comm, sum, DType::kFloat32, values(me), DType::kFloat32, mine);
      } else {
        dequantize_accumulate(comm, region(received_, j), mine, block_, sum, bits_);
      }
    }
    scale_values(comm, sum, mine, 1.0f / static_cast<float>(n));
    quantize_blocks(comm, sum, DType::kFloat32, mine, block_, region(received_, me), bits_);
  }
  replicas_.label_next(name.c_str());
  replicas_.all_gather(comm, region(received_, me), received_.data(), packed, DType::kInt8);
  for (int j = 0; j < n; ++j) {
    const std::size_t length = slice_count(count, slice, j);
    if (length > 0) {
      dequantize_blocks(comm, region(received_, j), length, block_, values(j), DType::kFloat32,
                        bits_);
    }
  }
}

}  // namespace zest
