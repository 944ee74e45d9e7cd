// qgZ's hop across hybrid sharding's replicas (zero_quantized_gradients with hybrid_shard_size):
// after the shard group's quantized reduce-scatter (QuantizedReduceScatter, inside the node),
// the R ranks that hold the same shard — one per shard group, on different nodes — average it
// as ZeRO++ averages across nodes: each cuts the fp32 shard into R slices and sends slice j as
// int8 (or int4: zero_quantized_gradients_bits, as the shard group's hop) blocks to replica j
// (an all-to-all), replica j sums its slice in fp32 (its own values unquantized) and divides by
// R, and the means are quantized once more, at the same bits, and all-gathered. Every
// replica, the owner of a slice included, then dequantizes every slice from the same bytes.
// Invariant: the replicas end with the same shard to the bit, so their optimizer states never
// drift (a hybrid checkpoint hashes them against each other); every replica calls it in the same
// order with the same count (it is a collective over the replica group).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "memory/allocator.h"
#include "runtime/communicator.h"
#include "runtime/device.h"

namespace zest {

// Its buffers (category buckets), in the order they are allocated, for shards of up to
// `largest_shard` elements over `replicas` replicas, at `bits` (8 or 4) a value.
std::vector<std::size_t> quantized_replica_bytes(std::size_t largest_shard, int replicas,
                                                 std::size_t block, int bits = 8);

class QuantizedReplicaMean {
 public:
  // `replicas` (hybrid sharding's replica group) outlives this. Both exchanges send `bits`
  // (8 or 4) a value.
  QuantizedReplicaMean(Device& device, Communicator& replicas, std::size_t largest_shard,
                       std::size_t block, int bits = 8);
  ~QuantizedReplicaMean();
  QuantizedReplicaMean(const QuantizedReplicaMean&) = delete;
  QuantizedReplicaMean& operator=(const QuantizedReplicaMean&) = delete;

  // data (fp32, `count` elements, this rank's copy of the shard) <- the mean over the replicas,
  // through int8 (or int4) blocks, identical on every replica. Enqueued on `comm` (and on a send
  // stream of its own); `data` must stay alive until comm has run it. The sends are labelled
  // `label` across replicas (int8) or (int4).
  void mean(Stream& comm, float* data, std::size_t count, const char* label);

 private:
  Device& device_;
  Communicator& replicas_;
  std::size_t block_;
  int bits_;
  std::unique_ptr<Stream> sends_;
  std::unique_ptr<Event> quantized_;   // comm: the slices to send are packed
  std::unique_ptr<Event> sends_done_;  // sends_: the previous call's sends were taken
  Buffer packed_;    // R packed slices, by destination: this call's sends
  Buffer received_;  // R packed slices, by source: the all-to-all's, then the all-gather's
  Buffer sum_;       // fp32 slice: this rank's sum
};

}  // namespace zest
