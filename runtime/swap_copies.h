// Stream-ordered reads and writes of the NVMe tier (memory/swap_store.h), like every other copy:
// enqueued on a stream (on the CPU device a worker thread that runs them in order; give the
// tier a host stream of its own, Device::create_host_stream, so disk time overlaps compute and
// the host optimizer), ordered against other streams by events, and shown on the trace's "nvme"
// track (runtime/trace.h) when a recorder is given. Invariant: `host` stays valid, and is not
// touched by other streams, until an event recorded after the copy has been reached; a failed
// read or write makes the stream fail with the store's error (file and offset).
#pragma once

#include <cstddef>
#include <string>

#include "memory/swap_store.h"
#include "runtime/stream.h"
#include "runtime/trace.h"

namespace zest {

// Where a swap copy's trace slice goes; no recorder: none is recorded.
struct SwapTrace {
  TraceRecorder* recorder = nullptr;
  int rank = 0;
  std::string name;  // "read optimizer state of sub-group 3", ...
};

// `bytes` at `offset` in `region` into `host`, in `stream` order.
void enqueue_swap_read(Stream& stream, SwapStore& store, const SwapRegion& region,
                       std::size_t offset, void* host, std::size_t bytes, SwapTrace trace = {});
// `bytes` from `host` to `offset` in `region`, in `stream` order.
void enqueue_swap_write(Stream& stream, SwapStore& store, const SwapRegion& region,
                        std::size_t offset, const void* host, std::size_t bytes,
                        SwapTrace trace = {});

}  // namespace zest
