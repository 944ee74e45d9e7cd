// offload_optimizer.device "nvme": the fp32 master and the optimizer's states of each unit's
// shard live in the rank's swap files (memory/swap_store.h), cut into sub-groups of at most
// sub_group_size elements. An update streams them through `buffer_count` host buffers: a read
// stream brings sub-group i+1 in while the host stream updates i and a write stream writes i−1
// back, so host memory holds buffer_count sub-groups, never the state. Each sub-group's tensors
// lie end to end in one region (each padded to 4096 bytes), read and written in one chunk.
// Owns the store, the host buffers, the two I/O streams and the events between them and the
// host stream. Invariant: a host buffer is refilled only after its previous sub-group was
// written back, and the host stream touches it only after its read.
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

class SwappedState {
 public:
  // The host stream is the host optimizer's (engine/host_optimizer.h), which runs the updates.
  SwappedState(RankContext& context, const EngineOptions& options, Stream& host_stream);
  ~SwappedState();  // drains the I/O streams
  SwappedState(const SwappedState&) = delete;
  SwappedState& operator=(const SwappedState&) = delete;

  // Cuts every unit's shard into sub-groups, reserves their regions and the host buffers, and
  // opens the store: the free-space check, then the preallocated files (on a device that runs
  // work; the shape-only device's store reserves only).
  void allocate(const std::vector<FlatUnit>& units, std::size_t optimizer_states);

  // Before the first step: the unit's master shard from `master` (shard_length values), its
  // states zeroed (written, unless fast_init: a preallocated file reads as zeros). Blocking.
  void initialize(const FlatUnit& unit, const float* master);

  // The work on one sub-group, enqueued by the caller on the host stream: elements [begin, end)
  // of the unit's shard, `master` and `states` pointing at element `begin` in a host buffer.
  using SubGroupWork = std::function<void(std::size_t begin, std::size_t end, float* master,
                                          const std::vector<float*>& states)>;
  // Each sub-group of `unit` in turn: read in, `work` enqueued on the host stream, written back.
  // `stall_seconds` > 0 (debug.fault "stall_nvme_write"): the write stream says so on stderr and
  // sleeps that long before the unit's first write.
  void update(const FlatUnit& unit, const SubGroupWork& work, double stall_seconds = 0.0);

  // Checkpoint access (StateShard::swap) to tensor `tensor` of the unit's state (0: master,
  // 1 + s: state s), a chunk at a time, blocking. Call between steps, after synchronize().
  std::function<void(bool, std::size_t, std::size_t, void*)> access(std::size_t unit,
                                                                    std::size_t tensor);

  // After a checkpoint load in fp32 compute: the master from the rank's loaded parameter shard
  // (`params` in device memory, at the shard's first element).
  void master_from_parameters(const FlatUnit& unit, const float* params);

  void synchronize();
  std::size_t swap_bytes() const { return store_.reserved_bytes(); }
  std::size_t host_bytes() const;  // the host buffers
  const SwapStore& store() const { return store_; }

 private:
  struct SubGroup {
    std::size_t begin = 0;  // in the unit's shard
    std::size_t end = 0;
    std::size_t stride = 0;  // bytes from one tensor to the next in the region
    SwapRegion region;
  };
  struct StagingBuffer {
    Buffer buffer;
    char* data = nullptr;  // aligned to kSwapAlignment inside buffer
    std::unique_ptr<Event> read;     // by the read stream: the sub-group is in
    std::unique_ptr<Event> updated;  // by the host stream: the update is done
    std::unique_ptr<Event> written;  // by the write stream: the staging buffer may be refilled
  };
  void write_tensor(const SubGroup& group, std::size_t tensor, const void* host);
  SwapTrace trace(const std::string& what, std::size_t unit, std::size_t group) const;

  RankContext& context_;
  const EngineOptions& options_;
  Stream& host_;
  SwapStore store_;
  std::size_t tensors_ = 1;  // master + states
  std::vector<std::vector<SubGroup>> groups_;  // per unit
  std::vector<StagingBuffer> staging_;
  std::size_t next_staging_ = 0;
  std::unique_ptr<Stream> reads_;  // Note: streams last, so they drain before the staging buffers go
  std::unique_ptr<Stream> writes_;
};

}  // namespace zest
