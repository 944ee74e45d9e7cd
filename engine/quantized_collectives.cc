#include "engine/quantized_collectives.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "engine/engine.h"
#include "engine/stage_plan.h"
#include "kernels/convert.h"
#include "kernels/quantize.h"

namespace zest {

namespace {

constexpr std::size_t kLargestBlock = std::size_t{1} << 24;

// The group's ranks on nodes of g consecutive ranks each, when they are so placed; else the whole
// group counts as one node (a one-hop all-to-all). Correct either way: g only decides which
// traffic is summed before it crosses.
int ranks_per_node_of(Communicator& communicator, const Topology& topology) {
  const int n = communicator.world_size();
  std::vector<int> node(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) node[r] = topology.node_of(communicator.world_rank_of(r));
  int g = 1;
  while (g < n && node[g] == node[0]) ++g;
  if (n % g != 0) return n;
  for (int r = 0; r < n; ++r) {
    const bool same_as_first_of_run = node[r] == node[r / g * g];
    const bool new_run_new_node = r % g != 0 || r == 0 || node[r] != node[r - 1];
    if (!same_as_first_of_run || !new_run_new_node) return n;
  }
  return g;
}

}  // namespace

void check_quantized_collectives(const EngineOptions& options) {
  const StagePlan plan = StagePlan::of(options.stage);
  if (options.quantized_weights && !plan.serves(StageFeature::kQuantizedWeights)) {
    throw Error(ErrorKind::kConfig, "zero_optimization.zero_quantized_weights " +
                                        plan.refusal(StageFeature::kQuantizedWeights));
  }
  if (options.quantized_gradients && !plan.serves(StageFeature::kQuantizedGradients)) {
    throw Error(ErrorKind::kConfig, "zero_optimization.zero_quantized_gradients " +
                                        plan.refusal(StageFeature::kQuantizedGradients));
  }
  if ((options.quantized_weights || options.quantized_gradients) &&
      (options.quantization_block == 0 || options.quantization_block > kLargestBlock)) {
    throw Error(ErrorKind::kConfig, "zero_optimization.zero_quantized_block_size must be 1 to " +
                                        std::to_string(kLargestBlock) + ", got " +
                                        std::to_string(options.quantization_block));
  }
  if (options.quantized_gradients && options.quantized_gradient_bits != 8 &&
      options.quantized_gradient_bits != 4) {
    throw Error(ErrorKind::kConfig, "zero_optimization.zero_quantized_gradients_bits must be 8 or "
                                    "4, got " + std::to_string(options.quantized_gradient_bits));
  }
}

std::vector<std::size_t> quantized_reduction_bytes(std::size_t largest_shard, int world_size,
                                                   std::size_t block, int bits) {
  const std::size_t packed =
      static_cast<std::size_t>(world_size) * quantized_bytes(largest_shard, block, bits);
  return {packed, packed, largest_shard * sizeof(float), largest_shard * sizeof(float)};
}

// ---- qwZ ---------------------------------------------------------------------------------------

std::vector<QuantizedRun> quantized_runs(const ShardLayout& layout, int rank, std::size_t block) {
  const ElementRange shard = layout.shard_range(rank);
  std::vector<std::size_t> starts = {0};
  for (const ParamPlace& param : layout.params()) {  // in flat order
    if (param.offset > shard.begin && param.offset < shard.end) {
      starts.push_back(param.offset - shard.begin);
    }
  }
  std::vector<QuantizedRun> runs;
  std::size_t packed = 0;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const std::size_t end = i + 1 < starts.size() ? starts[i + 1] : shard.size();
    runs.push_back({starts[i], end - starts[i], packed});
    packed += quantized_bytes(end - starts[i], block);
  }
  return runs;
}

std::size_t quantized_shard_bytes(const ShardLayout& layout, std::size_t block) {
  std::size_t largest = 0;
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    const std::vector<QuantizedRun> runs = quantized_runs(layout, rank, block);
    largest = std::max(largest, runs.back().packed + quantized_bytes(runs.back().count, block));
  }
  return largest;
}

std::size_t quantized_gather_bytes(const std::vector<ShardLayout>& layouts, std::size_t block) {
  std::size_t largest = 0;
  for (const ShardLayout& layout : layouts) {
    largest = std::max(largest, static_cast<std::size_t>(layout.world_size()) *
                                    quantized_shard_bytes(layout, block));
  }
  return largest;
}

QuantizedGather::QuantizedGather(Device& device, const std::vector<ShardLayout>& layouts,
                                 std::size_t block)
    : device_(device),
      block_(block),
      staging_(device.allocator().allocate(quantized_gather_bytes(layouts, block),
                                           Category::kGather)),
      staging_free_(device.create_event()) {}

void QuantizedGather::all_gather(Communicator& communicator, Stream& stream,
                                 const ShardLayout& layout, const void* shard, void* full,
                                 DType dtype) {
  const int ranks = communicator.world_size();
  const std::size_t packed = quantized_shard_bytes(layout, block_);
  if (layout.world_size() != ranks || packed * static_cast<std::size_t>(ranks) > staging_.bytes()) {
    throw Error(ErrorKind::kInternal,
                "quantized gather of unit '" + layout.unit_name() + "': its layout over " +
                    std::to_string(layout.world_size()) + " rank(s) does not fit the group of " +
                    std::to_string(ranks) + " or the staging buffer it was sized for");
  }
  const std::size_t element = dtype_size(dtype);
  const std::size_t shard_bytes = layout.shard_length() * element;
  char* staging = staging_.as<char>();
  // The staging buffer is one for every gather: the previous one must have been read out.
  stream.wait(*staging_free_);
  char* mine = staging + static_cast<std::size_t>(communicator.rank()) * packed;
  std::size_t used = 0;
  for (const QuantizedRun& run : quantized_runs(layout, communicator.rank(), block_)) {
    quantize_blocks(stream, static_cast<const char*>(shard) + run.first * element, dtype,
                    run.count, block_, mine + run.packed);
    used = run.packed + quantized_bytes(run.count, block_);
  }
  // A rank with fewer runs than the largest: its tail travels too, so keep it defined.
  if (used < packed) device_.fill_zero(stream, mine + used, packed - used);
  communicator.all_gather(stream, mine, staging, packed, DType::kInt8);
  for (int r = 0; r < ranks; ++r) {
    char* destination = static_cast<char*>(full) + static_cast<std::size_t>(r) * shard_bytes;
    for (const QuantizedRun& run : quantized_runs(layout, r, block_)) {
      dequantize_blocks(stream, staging + static_cast<std::size_t>(r) * packed + run.packed,
                        run.count, block_, destination + run.first * element, dtype);
    }
  }
  stream.record(*staging_free_);
}

// ---- qgZ ---------------------------------------------------------------------------------------

QuantizedReduceScatter::QuantizedReduceScatter(Device& device, Communicator& communicator,
                                               const Topology& topology,
                                               std::size_t largest_shard, std::size_t block,
                                               int bits)
    : device_(device), communicator_(communicator), block_(block), bits_(bits),
      per_node_(ranks_per_node_of(communicator, topology)),
      sends_(device.create_stream("rank " + std::to_string(communicator.rank()) +
                                  " quantized gradient sends")),
      quantized_(device.create_event()), sends_done_(device.create_event()) {
  const std::vector<std::size_t> bytes =
      quantized_reduction_bytes(largest_shard, communicator.world_size(), block, bits);
  packed_ = device.allocator().allocate(bytes[0], Category::kBuckets);
  received_ = device.allocator().allocate(bytes[1], Category::kBuckets);
  partial_ = device.allocator().allocate(bytes[2], Category::kBuckets);
  result_ = device.allocator().allocate(bytes[3], Category::kBuckets);
}

QuantizedReduceScatter::~QuantizedReduceScatter() {
  // The sends read packed_ and received_: they must have been taken before those are freed.
  try {
    sends_->synchronize();
  } catch (...) {  // a failed peer: the error has reached the caller through comm already
  }
}

// Rank r = a·g + l is rank l of node a; slice s = b·g + l' of the full buffer goes to rank l' of
// node b. Step 1 (inside the node): each rank sends rank l' of its node the k slices {b·g + l'},
// packed contiguously (packed_ region l'), and sums what it receives (received_ region l'') for
// slices {b·g + l}: the node's partial sums of the slices its place owns in every node. Step 2
// (across nodes): it sends node b's partial to rank l of node b and sums the k partials of its
// own slice. Its own contributions are never quantized: they do not travel. The regions a rank
// never sends or receives in step 1 (its own, l) hold step 2's messages.
void QuantizedReduceScatter::reduce_scatter(Stream& comm, const void* full, DType type,
                                            std::size_t shard_count, const char* label) {
  const int n = communicator_.world_size();
  const int r = communicator_.rank();
  const int g = per_node_;
  const int k = n / g;
  const int a = r / g;
  const int l = r % g;
  const std::size_t packed = quantized_bytes(shard_count, block_, bits_);
  const std::size_t slice_bytes = shard_count * dtype_size(type);
  const auto slice = [&](int s) {
    return static_cast<const char*>(full) + static_cast<std::size_t>(s) * slice_bytes;
  };
  const auto slot = [&](Buffer& buffer, int region, int index) {
    return buffer.as<char>() + static_cast<std::size_t>(region * k + index) * packed;
  };
  const std::string name = std::string(label) + " (int" + std::to_string(bits_) + ")";
  float* partial = partial_.as<float>();
  float* result = result_.as<float>();

  // The previous call's sends read packed_ and received_ until their peers took them.
  comm.wait(*sends_done_);
  for (int b = 0; b < k; ++b) {
    for (int peer = 0; peer < g; ++peer) {
      if (peer != l) {
        quantize_blocks(comm, slice(b * g + peer), type, shard_count, block_,
                        slot(packed_, peer, b), bits_);
      }
    }
  }
  if (g > 1) {
    comm.record(*quantized_);
    sends_->wait(*quantized_);
    // Sends on a stream of their own: a send waits until its peer has taken it, and every rank
    // sends before it receives.
    for (int j = 1; j < g; ++j) {
      const int to = (l + j) % g;
      communicator_.label_next(name.c_str());
      communicator_.send(*sends_, slot(packed_, to, 0), k * packed, DType::kInt8, a * g + to);
    }
    for (int j = 1; j < g; ++j) {
      const int from = (l - j + g) % g;
      communicator_.label_next(name.c_str());
      communicator_.receive(comm, slot(received_, from, 0), k * packed, DType::kInt8, a * g + from);
    }
  }
  // The node's partial sums, in fp32, in the order of the node's ranks; this node's own last.
  for (int j = 1; j <= k; ++j) {
    const int b = (a + j) % k;
    float* sum = b == a ? result : partial;
    device_.fill_zero(comm, sum, shard_count * sizeof(float));
    for (int peer = 0; peer < g; ++peer) {
      if (peer == l) {
        accumulate_into(comm, sum, DType::kFloat32, slice(b * g + l), type, shard_count);
      } else {
        dequantize_accumulate(comm, slot(received_, peer, b), shard_count, block_, sum, bits_);
      }
    }
    if (b != a) {
      quantize_blocks(comm, partial, DType::kFloat32, shard_count, block_, slot(received_, l, b),
                      bits_);
    }
  }
  if (k > 1) {
    comm.record(*quantized_);
    sends_->wait(*quantized_);
    for (int j = 1; j < k; ++j) {
      const int node = (a + j) % k;
      communicator_.label_next(name.c_str());
      communicator_.send(*sends_, slot(received_, l, node), packed, DType::kInt8, node * g + l);
    }
    for (int j = 1; j < k; ++j) {
      const int node = (a - j + k) % k;
      communicator_.label_next(name.c_str());
      communicator_.receive(comm, slot(packed_, l, node), packed, DType::kInt8, node * g + l);
    }
    for (int node = 0; node < k; ++node) {
      if (node != a) {
        dequantize_accumulate(comm, slot(packed_, l, node), shard_count, block_, result, bits_);
      }
    }
  }
  sends_->record(*sends_done_);
  scale_values(comm, result, shard_count, 1.0f / static_cast<float>(n));
}

}  // namespace zest
