// offload_param.device "nvme" (stage 3): a rank's parameter shards live in its swap files
// (memory/swap_store.h, under offload_param.nvme_path), one region per unit, and move through
// `buffer_count` host buffers of up to `buffer_size` elements each: a read stream brings a chunk
// of a shard into a buffer and the caller's stream copies it to the device; the caller's stream
// copies a chunk into a buffer and a write stream writes it. Units, in order, stay in host memory as
// with "cpu" while their shards fit in what is left of `max_in_cpu` elements (holds() says which
// are on NVMe).
// Owns the store, the buffers, the two I/O streams and the events between them and the caller's
// streams. Invariant: a unit's shard is read only after its last write has finished and
// written only after its last read; a buffer is refilled only after its last user has finished.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/flat_unit.h"
#include "memory/swap_store.h"
#include "runtime/swap_copies.h"
#include "runtime/world.h"

namespace zest {

// Where each unit's parameter shard lives with offload_param "nvme" and what the host holds for
// it; the engine lays the tier out by it and the planner's replay counts with it.
struct ParameterSwapLayout {
  std::vector<bool> on_nvme;              // per unit; false: kept in host memory (max_in_cpu)
  std::vector<std::size_t> region_bytes;  // per unit on NVMe: its shard rounded to whole blocks
  std::size_t chunk_bytes = 0;            // what one host buffer holds (0: no unit on NVMe)
  std::size_t buffers = 0;                // how many host buffers
  std::size_t swap_bytes() const;         // the swap files' size
  std::size_t buffer_bytes() const;       // the host buffers', each a block more for alignment
};
// `shard_lengths`: each unit's shard in elements of `element_size` bytes.
ParameterSwapLayout parameter_swap_layout(const std::vector<std::size_t>& shard_lengths,
                                          std::size_t element_size,
                                          const OffloadParamOptions& options);
// A memory table's prediction with offload_param "cpu" (every shard in host_params) moved to
// "nvme" as `layout` lays it out: the shards on NVMe leave the host, the buffers take their place.
void account_parameter_swap(MemoryPrediction& prediction, const ParameterSwapLayout& layout,
                            const std::vector<std::size_t>& shard_lengths,
                            std::size_t element_size);

class SwappedParameters {
 public:
  SwappedParameters(RankContext& context, const EngineOptions& options);
  ~SwappedParameters();  // drains the I/O streams
  SwappedParameters(const SwappedParameters&) = delete;
  SwappedParameters& operator=(const SwappedParameters&) = delete;

  // Chooses the units on NVMe (those max_in_cpu has no room left for), reserves their regions
  // and the host buffers (host tier, category params), and opens the store: the free-space
  // check, then the preallocated files (the shape-only device's store reserves only).
  void allocate(const std::vector<FlatUnit>& units);
  bool holds(const FlatUnit& unit) const { return region_of(unit) != nullptr; }

  // The unit's shard into `device` memory, in `stream` order (the read runs ahead on the read
  // stream; `stream` waits only for it before its copy).
  void fetch(const FlatUnit& unit, Stream& stream, void* device);
  // The unit's shard from `device` memory back to NVMe, copied out in `stream` order; `stream`
  // may reuse `device` after the work enqueued now.
  void store(const FlatUnit& unit, Stream& stream, const void* device);
  // The unit's shard from host memory `host`, ready once `ready` (a host-stream event) is
  // reached; `after` waits for the write before it touches `host` again.
  void store_from_host(const FlatUnit& unit, const void* host, Event& ready, Stream& after);
  // Blocking, between steps (after synchronize()): elements [first, first + count) of the
  // unit's shard to or from `host` (checkpoints, initialization; the shape-only store moves
  // nothing).
  void read(const FlatUnit& unit, std::size_t first, std::size_t count, void* host);
  void write(const FlatUnit& unit, std::size_t first, std::size_t count, const void* host);
  // StateShard::swap for the unit's "params" shard.
  std::function<void(bool, std::size_t, std::size_t, void*)> access(const FlatUnit& unit);

  void synchronize();
  std::size_t swap_bytes() const { return store_.reserved_bytes(); }
  std::size_t host_bytes() const;  // the host buffers
  const SwapStore& store() const { return store_; }

 private:
  struct StagingBuffer {
    Buffer buffer;
    char* data = nullptr;            // aligned to kSwapAlignment inside buffer
    std::unique_ptr<Event> read;     // host: the read stream filled it
    std::unique_ptr<Event> copied;   // device: the caller's stream copied in or out
    std::unique_ptr<Event> written;  // host: the write stream wrote it out
    Event* released = nullptr;       // the last of those that ends a use
  };
  const SwapRegion* region_of(const FlatUnit& unit) const;
  StagingBuffer& next_staging();
  SwapTrace trace(const char* what, const FlatUnit& unit, std::size_t offset) const;

  RankContext& context_;
  const EngineOptions& options_;
  std::size_t element_size_ = 4;
  SwapStore store_;
  std::vector<std::unique_ptr<SwapRegion>> regions_;  // per unit; null: in host memory
  std::size_t chunk_bytes_ = kSwapAlignment;          // what one buffer holds
  std::vector<StagingBuffer> staging_;
  std::size_t next_staging_ = 0;
  std::vector<std::unique_ptr<Event>> last_read_;     // per unit, by the read stream
  std::vector<std::unique_ptr<Event>> last_written_;  // per unit, by the write stream
  std::unique_ptr<Stream> reads_;  // Note: streams last, so they drain before the staging buffers go
  std::unique_ptr<Stream> writes_;
};

}  // namespace zest
