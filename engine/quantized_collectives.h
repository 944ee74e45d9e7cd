// ZeRO++'s quantized collectives (Wang et al. 2023), built from the communicator's all_gather,
// send and receive and the int8 block kernels (kernels/quantize.h):
// - qwZ (zero_quantized_weights): stage 3's gather of a unit moves each rank's shard as int8
//   blocks with their fp32 scales and dequantizes them into the ring slot — every rank, its own
//   shard included, computes with the same dequantized parameters; a block never holds two
//   parameters (quantized_runs);
// - qgZ (zero_quantized_gradients): a unit's gradient reduce-scatter as ZeRO++'s hierarchical
//   all-to-all: int8 (or int4: zero_quantized_gradients_bits) slices to the ranks of the node,
//   summed there in fp32, the node's partial sums quantized again and sent across nodes to the
//   rank with the same place in its node, summed in fp32 by the owner. In one node it is a
//   one-hop all-to-all.
// Both own their staging buffers, allocated once (gather / buckets) from the largest unit, sized
// by the functions below, which the memory planner calls too. Invariant: every rank of the group
// calls them in the same order with the same counts (they are collectives).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "base/dtype.h"
#include "memory/allocator.h"
#include "memory/shard_layout.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/topology.h"

namespace zest {

struct EngineOptions;

// A kConfig Error naming the key for options the quantized collectives do not serve:
// zero_quantized_weights below stage 3 (nothing is gathered before each use),
// zero_quantized_gradients at stage 0 (gradients are all-reduced, not reduce-scattered), a block
// size of 0, gradient bits other than 8 or 4.
void check_quantized_collectives(const EngineOptions& options);

// qwZ's blocks in rank `rank`'s shard of a unit: a run of blocks starts at the shard's first
// element and at each parameter's first element inside the shard (the padding joins the last
// parameter's run), so a block never mixes two parameters — a LayerNorm gain of 1 beside weights
// of std 0.02 would quantize those in steps of 1/127. DeepSpeed quantizes per parameter too. Each
// run is packed on its own (kernels/quantize.h, quantized_bytes), the runs end to end.
struct QuantizedRun {
  std::size_t first = 0;   // element in the shard
  std::size_t count = 0;
  std::size_t packed = 0;  // byte offset in the rank's packed shard
};
std::vector<QuantizedRun> quantized_runs(const ShardLayout& layout, int rank, std::size_t block);
// Every rank's packed shard of `layout` takes this many bytes (the largest rank's runs, so that
// the gather moves equal counts; a shorter one's tail is zeros).
std::size_t quantized_shard_bytes(const ShardLayout& layout, std::size_t block);
// qwZ's staging buffer (category gather): every rank's packed shard of the unit that needs most.
std::size_t quantized_gather_bytes(const std::vector<ShardLayout>& layouts, std::size_t block);
// qgZ's buffers (category buckets), in the order they are allocated.
std::vector<std::size_t> quantized_reduction_bytes(std::size_t largest_shard, int world_size,
                                                   std::size_t block, int bits = 8);

class QuantizedGather {
 public:
  // Sized for every unit of `layouts` (sharded over the group that gathers them).
  QuantizedGather(Device& device, const std::vector<ShardLayout>& layouts, std::size_t block);

  // As communicator.all_gather(stream, shard, full, layout.shard_length(), dtype), through int8
  // blocks run by run (quantized_runs). `layout` is the unit's, over the communicator's ranks.
  void all_gather(Communicator& communicator, Stream& stream, const ShardLayout& layout,
                  const void* shard, void* full, DType dtype);

 private:
  Device& device_;
  std::size_t block_;
  Buffer staging_;
  std::unique_ptr<Event> staging_free_;  // the last dequantization that read staging_
};

class QuantizedReduceScatter {
 public:
  // `topology` places the group's ranks on nodes (through communicator.world_rank_of); the
  // hierarchical step is taken where each node holds the same number of consecutive ranks of the
  // group, else the whole group is one hop. Both hops send `bits` (8 or 4) a value.
  // `communicator` outlives this.
  QuantizedReduceScatter(Device& device, Communicator& communicator, const Topology& topology,
                         std::size_t largest_shard, std::size_t block, int bits = 8);
  ~QuantizedReduceScatter();
  QuantizedReduceScatter(const QuantizedReduceScatter&) = delete;
  QuantizedReduceScatter& operator=(const QuantizedReduceScatter&) = delete;

  // The mean over the group's ranks of slice `rank` of every rank's `full` (group size ×
  // shard_count elements of `type`), in fp32, into result() — valid for work enqueued on `comm`
  // after this call until the next call. Enqueued on `comm` (and on a send stream of its own).
  // The sends are labelled `label` (int8) or (int4).
  void reduce_scatter(Stream& comm, const void* full, DType type, std::size_t shard_count,
                      const char* label);
  float* result() { return result_.as<float>(); }

  int ranks_per_node() const { return per_node_; }

 private:
  Device& device_;
  Communicator& communicator_;
  std::size_t block_;
  int bits_;
  int per_node_ = 1;  // g: ranks of a node in the group; the group has n / g nodes
  std::unique_ptr<Stream> sends_;
  std::unique_ptr<Event> quantized_;   // comm: the slices to send are packed
  std::unique_ptr<Event> sends_done_;  // sends_: the previous call's sends were taken
  Buffer packed_;    // n packed slices, by destination: this call's sends (and step 2's receives)
  Buffer received_;  // n packed slices, by source: step 1's receives (and step 2's sends)
  Buffer partial_;   // fp32 shard: a node's partial sum on its way across nodes
  Buffer result_;    // fp32 shard: the mean
};

}  // namespace zest
